// Matmul and the linear layer on CUDA, through cuBLASLt (gemm.cuh): the bias, and bias +
// GELU with the pre-activation saved, ride in the matmul's epilogue; where cuBLASLt cannot
// run an epilogue (alignment, dtype) the same result comes from a plain GEMM and the fused
// BiasAdd / BiasGelu kernels. LinearBackward: dinp by GEMM (written), dweight by GEMM with
// beta = 1 (accumulated), dbias by a column-sum kernel (accumulated).
// Legend: N = rows, C = input channels, OC = output channels.
#include "runtime/cuda/common.cuh"
#include "runtime/cuda/gemm.cuh"
#include "runtime/ops_backend.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

#include "runtime/cuda/matmul_kernels.cuh"

// ---- launchers --------------------------------------------------------------------------------

// dbias (C) += column sums of x (N, C).
template <typename E>
absl::Status ColumnSumInto(Stream& s, cudaStream_t stream, const Tensor& dbias, const E* x,
                           int64_t N, int C) {
  if (N == 0 || C == 0) return absl::OkStatus();
  const int64_t grid_x = (C + kColTile - 1) / kColTile;
  // Enough blocks for ~4 per multiprocessor, but chunks of at least 64 rows.
  int64_t grid_y = std::max<int64_t>(1, 4 * SmCount() / grid_x);
  grid_y = std::min<int64_t>({grid_y, (N + 63) / 64, 65535});
  const int64_t rows_per_chunk = (N + grid_y - 1) / grid_y;
  grid_y = (N + rows_per_chunk - 1) / rows_per_chunk;
  const dim3 grid(static_cast<unsigned int>(grid_x), static_cast<unsigned int>(grid_y));
  const dim3 block(kColTile, kRowLanes);
  Tensor scratch;
  float* acc = nullptr;
  if (grid_y > 1) {
    if (dbias.dtype() == DType::kF32) {
      acc = MutPtr<float>(dbias);
    } else {
      ASSIGN_OR_RETURN(scratch, Tensor::Empty({C}, DType::kF32, s.device()));
      RETURN_IF_ERROR(ZeroFill(scratch, s));
      acc = MutPtr<float>(scratch);
    }
  }
  RETURN_IF_ERROR(DispatchFloat("LinearBackward", dbias.dtype(), [&](auto tag) {
    using G = decltype(tag);
    ColumnSumKernel<E, G><<<grid, block, 0, stream>>>(MutPtr<G>(dbias), acc, x, N, C,
                                                      rows_per_chunk);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }));
  if (scratch.defined()) RETURN_IF_ERROR(AccumulateInto(stream, dbias, acc));
  return absl::OkStatus();
}

// out = 0 * (empty product) + beta * out, for K = 0.
absl::Status EmptyProduct(Stream& s, const Tensor& out, float beta) {
  return beta == 0.0f ? Fill(s, out, 0.0f) : Scale(s, out, beta);
}

// out (N, OC) = inp @ weight^T [+ bias] [then GELU, pre-activation to pre], trying the
// cuBLASLt epilogue first.
template <typename E>
absl::Status LinearImpl(Stream& s, const Tensor& out, const Tensor& pre, const Tensor& inp,
                        const Tensor& weight, const Tensor& bias, bool gelu) {
  // From the shapes, never from numel: with C = 0 the (N, 0) input still has N rows, and out
  // gets the bias (or zeros), as on the CPU.
  const int64_t N = inp.dim(0), C = inp.dim(1);
  const int64_t OC = weight.dim(0);
  if (N == 0 || OC == 0) return absl::OkStatus();
  // Where the un-activated product goes when the epilogue is not used.
  const Tensor& product = gelu && pre.defined() ? pre : out;
  if (C == 0) {
    RETURN_IF_ERROR(Fill(s, product, 0.0f));
  } else {
    RowMajorGemm g;
    g.m = N;
    g.n = OC;
    g.k = C;
    g.a = inp.raw();
    g.lda = C;
    g.b = weight.raw();
    g.ldb = C;
    g.transpose_b = true;  // weight is stored (OC, C)
    g.out = out.raw();
    g.ldo = OC;
    g.ab_type = g.out_type = CudaType<E>();
    g.bias = bias.defined() ? bias.raw() : nullptr;
    g.gelu = gelu;
    g.pre = gelu && pre.defined() ? pre.raw() : nullptr;
    g.ldpre = OC;
    if (g.bias != nullptr || gelu) {
      const absl::Status st = RunGemm(s, g);
      if (!absl::IsUnimplemented(st)) return st;  // done, or a real error
    }
    // Plain GEMM into `product`, then the kernels.
    g.bias = nullptr;
    g.gelu = false;
    g.pre = nullptr;
    g.out = product.raw();
    RETURN_IF_ERROR(RunGemm(s, g));
  }
  if (gelu) return BiasGeluForward(s, out, pre, product, bias);
  if (bias.defined()) return BiasAdd(s, out, bias);
  return absl::OkStatus();
}

}  // namespace

int64_t MatmulWorkspaceBytes() { return static_cast<int64_t>(kGemmWorkspaceBytes); }

absl::Status Matmul(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b,
                    bool transpose_a, bool transpose_b, float alpha, float beta) {
  RETURN_IF_ERROR(SetCurrentDevice(s.device()));
  RETURN_IF_ERROR(SameFloatDType("Matmul", a.dtype(), {&b}));
  if (out.dtype() != a.dtype() && out.dtype() != DType::kF32) {
    RETURN_IF_ERROR(SameFloatDType("Matmul", a.dtype(), {&out}));
  }
  const int64_t M = out.dim(0);
  const int64_t N = out.dim(1);
  const int64_t K = transpose_a ? a.dim(0) : a.dim(1);
  if (M == 0 || N == 0) return absl::OkStatus();
  if (K == 0) return EmptyProduct(s, out, beta);
  return DispatchFloat("Matmul", a.dtype(), [&](auto tag) {
    using E = decltype(tag);
    RowMajorGemm g;
    g.m = M;
    g.n = N;
    g.k = K;
    g.transpose_a = transpose_a;
    g.a = a.raw();
    g.lda = a.dim(1);
    g.transpose_b = transpose_b;
    g.b = b.raw();
    g.ldb = b.dim(1);
    g.out = out.raw();
    g.ldo = N;
    g.ab_type = CudaType<E>();
    g.out_type = out.dtype() == DType::kF32 ? CUDA_R_32F : CudaType<E>();
    g.alpha = alpha;
    g.beta = beta;
    return RunGemm(s, g);
  });
}

absl::Status LinearForward(Stream& s, const Tensor& out, const Tensor& inp, const Tensor& weight,
                           const Tensor& bias) {
  RETURN_IF_ERROR(SetCurrentDevice(s.device()));
  RETURN_IF_ERROR(SameFloatDType("LinearForward", inp.dtype(), {&out, &weight, &bias}));
  return DispatchFloat("LinearForward", inp.dtype(), [&](auto tag) {
    return LinearImpl<decltype(tag)>(s, out, Tensor(), inp, weight, bias, /*gelu=*/false);
  });
}

absl::Status LinearGeluForward(Stream& s, const Tensor& out, const Tensor& pre,
                               const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  RETURN_IF_ERROR(SetCurrentDevice(s.device()));
  RETURN_IF_ERROR(SameFloatDType("LinearGeluForward", inp.dtype(), {&out, &pre, &weight, &bias}));
  return DispatchFloat("LinearGeluForward", inp.dtype(), [&](auto tag) {
    return LinearImpl<decltype(tag)>(s, out, pre, inp, weight, bias, /*gelu=*/true);
  });
}

absl::Status LinearBackward(Stream& s, const Tensor& dinp, const Tensor& dweight,
                            const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                            const Tensor& weight) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  // dweight and dbias may be f32 gradient buffers under lower-precision activations.
  RETURN_IF_ERROR(SameFloatDType("LinearBackward", dout.dtype(), {&dinp, &inp, &weight}));
  if (dweight.defined() && dweight.dtype() != DType::kF32) {
    RETURN_IF_ERROR(SameFloatDType("LinearBackward", dout.dtype(), {&dweight}));
  }
  const int64_t OC = weight.dim(0);
  const int64_t C = weight.dim(1);
  const int64_t N = inp.dim(0);  // not dout.numel() / OC: with OC = 0, dinp still gets zeros
  return DispatchFloat("LinearBackward", dout.dtype(), [&](auto tag) -> absl::Status {
    using E = decltype(tag);
    // dinp (N, C) = dout (N, OC) @ weight (OC, C)
    if (dinp.defined() && N > 0 && C > 0) {
      if (OC == 0) {
        RETURN_IF_ERROR(Fill(s, dinp, 0.0f));
      } else {
        RowMajorGemm g;
        g.m = N;
        g.n = C;
        g.k = OC;
        g.a = dout.raw();
        g.lda = OC;
        g.b = weight.raw();
        g.ldb = C;
        g.out = dinp.raw();
        g.ldo = C;
        g.ab_type = g.out_type = CudaType<E>();
        RETURN_IF_ERROR(RunGemm(s, g));
      }
    }
    // dweight (OC, C) += dout^T (OC, N) @ inp (N, C); dout is stored (N, OC) = (k, m).
    if (dweight.defined() && N > 0 && OC > 0 && C > 0) {
      RowMajorGemm g;
      g.m = OC;
      g.n = C;
      g.k = N;
      g.transpose_a = true;
      g.a = dout.raw();
      g.lda = OC;
      g.b = inp.raw();
      g.ldb = C;
      g.out = dweight.raw();
      g.ldo = C;
      g.ab_type = CudaType<E>();
      g.out_type = dweight.dtype() == DType::kF32 ? CUDA_R_32F : CudaType<E>();
      g.beta = 1.0f;
      RETURN_IF_ERROR(RunGemm(s, g));
    }
    if (dbias.defined()) {
      RETURN_IF_ERROR(ColumnSumInto<E>(s, stream, dbias, Ptr<E>(dout), N, static_cast<int>(OC)));
    }
    return absl::OkStatus();
  });
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
