// LayerNorm on CUDA (after llm.c's llmc/layernorm.cuh): forward, the residual add fused with
// the forward, and backward. One warp per row, warp-shuffle reductions, f32 statistics;
// rows move in 16-byte packs when C is a multiple of the pack and the pointers allow
// (Pack<T, P> with P = 16 / sizeof(T)), else one element per lane and step.
// Backward accumulates dweight/dbias per block in shared memory, then atomically into f32
// (the gradients themselves when they are f32, else a zeroed scratch added at the end).
#include "runtime/cuda/common.cuh"
#include "runtime/ops_backend.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

#include "runtime/cuda/layernorm_kernels.cuh"

// ---- launchers --------------------------------------------------------------------------------

template <typename T, bool kResidual>
absl::Status LaunchForward(cudaStream_t stream, const Tensor& out, const Tensor& mean,
                           const Tensor& rstd, const Tensor& residual, const Tensor& inp,
                           const Tensor& inp2, const Tensor& weight, const Tensor& bias) {
  const int64_t N = inp.dim(0);  // inp (N, C)
  const int C = static_cast<int>(inp.dim(1));
  if (N == 0) return absl::OkStatus();
  constexpr int V = Packed128<T>::size;
  bool vec = C % V == 0;
  for (const Tensor* t : {&out, &residual, &inp, &inp2, &weight, &bias}) {
    if (t->defined()) vec = vec && IsAligned(t->raw(), 16);
  }
  const unsigned int blocks = RowBlocks(N);
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kThreads, 0, stream>>>(MutPtr<T>(out), MutPtr<float>(mean),
                                            MutPtr<float>(rstd), MutPtr<T>(residual),
                                            Ptr<T>(inp), Ptr<T>(inp2), Ptr<T>(weight),
                                            Ptr<T>(bias), N, C);
  };
  if (vec) {
    launch(LayerNormForwardKernel<T, V, kResidual>);
  } else {
    launch(LayerNormForwardKernel<T, 1, kResidual>);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status LaunchBackward(Stream& s, cudaStream_t stream, const Tensor& dinp,
                            const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                            const Tensor& inp, const Tensor& weight, const Tensor& mean,
                            const Tensor& rstd) {
  const int C = static_cast<int>(inp.dim(-1));
  const int64_t N = C == 0 ? 0 : inp.numel() / C;
  if (N == 0) return absl::OkStatus();

  // f32 gradients take the atomics directly; others get a zeroed f32 scratch (2 * C).
  const bool w_direct = dweight.defined() && dweight.dtype() == DType::kF32;
  const bool b_direct = dbias.defined() && dbias.dtype() == DType::kF32;
  Tensor scratch;
  float* acc_w = w_direct ? MutPtr<float>(dweight) : nullptr;
  float* acc_b = b_direct ? MutPtr<float>(dbias) : nullptr;
  if ((dweight.defined() && !w_direct) || (dbias.defined() && !b_direct)) {
    ASSIGN_OR_RETURN(scratch, Tensor::Empty({2, C}, DType::kF32, s.device()));
    RETURN_IF_ERROR(ZeroFill(scratch, s));
    if (dweight.defined() && !w_direct) acc_w = MutPtr<float>(scratch);
    if (dbias.defined() && !b_direct) acc_b = MutPtr<float>(scratch) + C;
  }

  constexpr int V = Packed128<T>::size;
  bool vec = C % V == 0;
  for (const Tensor* t : {&dinp, &dout, &inp, &weight}) {
    if (t->defined()) vec = vec && IsAligned(t->raw(), 16);
  }
  // Shared-memory partials when 2 * C floats fit (48 KiB always; more with the opt-in).
  const size_t smem = 2 * static_cast<size_t>(C) * sizeof(float);
  int device = 0, optin = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const bool shared = smem <= std::max<size_t>(48 << 10, optin);
  const int64_t row_blocks = RowBlocks(N);
  const unsigned int blocks =
      static_cast<unsigned int>(std::min<int64_t>(row_blocks, 2 * static_cast<int64_t>(SmCount())));
  auto launch = [&](auto kernel, bool use_smem) -> absl::Status {
    if (use_smem && smem > (48 << 10)) {
      CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    }
    kernel<<<blocks, kThreads, use_smem ? smem : 0, stream>>>(
        MutPtr<T>(dinp), acc_w, acc_b, Ptr<T>(dout), Ptr<T>(inp), Ptr<T>(weight),
        Ptr<float>(mean), Ptr<float>(rstd), N, C);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  };
  if (vec) {
    RETURN_IF_ERROR(shared ? launch(LayerNormBackwardKernel<T, V, true>, true)
                           : launch(LayerNormBackwardKernel<T, V, false>, false));
  } else {
    RETURN_IF_ERROR(shared ? launch(LayerNormBackwardKernel<T, 1, true>, true)
                           : launch(LayerNormBackwardKernel<T, 1, false>, false));
  }
  if (dweight.defined() && !w_direct) RETURN_IF_ERROR(AccumulateInto(stream, dweight, acc_w));
  if (dbias.defined() && !b_direct) RETURN_IF_ERROR(AccumulateInto(stream, dbias, acc_b));
  return absl::OkStatus();  // scratch returns to the cache; later users are stream-ordered
}

}  // namespace

absl::Status LayerNormForward(Stream& s, const Tensor& out, const Tensor& mean,
                              const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("LayerNormForward", inp.dtype(), {&out, &weight, &bias}));
  return DispatchFloat("LayerNormForward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return LaunchForward<T, false>(stream, out, mean, rstd, Tensor(), inp, Tensor(), weight,
                                   bias);
  });
}

absl::Status ResidualLayerNormForward(Stream& s, const Tensor& residual, const Tensor& out,
                                      const Tensor& mean, const Tensor& rstd, const Tensor& a,
                                      const Tensor& b, const Tensor& weight, const Tensor& bias) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("ResidualLayerNormForward", a.dtype(),
                                 {&residual, &out, &b, &weight, &bias}));
  return DispatchFloat("ResidualLayerNormForward", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return LaunchForward<T, true>(stream, out, mean, rstd, residual, a, b, weight, bias);
  });
}

absl::Status LayerNormBackward(Stream& s, const Tensor& dinp, const Tensor& dweight,
                               const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  // dweight and dbias may be f32 with lower-precision activations (f32 gradient buffers).
  RETURN_IF_ERROR(SameFloatDType("LayerNormBackward", inp.dtype(), {&dinp, &dout, &weight}));
  return DispatchFloat("LayerNormBackward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return LaunchBackward<T>(s, stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  });
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
