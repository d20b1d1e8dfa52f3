// Causal multi-head self-attention on CUDA (after llm.c's attention_forward with cuBLAS):
// q, k, v are gathered from qkv into per-head buffers, scores and products are batched
// GEMMs over B * NH heads (gemm.cuh), and one fused kernel scales, masks and softmaxes
// each score row (one warp per row). Backward mirrors it, with a softmax-backward kernel
// restricted to the causal triangle. att (B, NH, T, T) is f32; with bf16/f16 activations a
// rounded copy of the probabilities feeds the GEMMs (they take one input dtype).
// Legend: B = batch, T = sequence, C = channels, NH = heads, hs = C / NH.
#include <cmath>
#include <type_traits>

#include "runtime/cuda/common.cuh"
#include "runtime/cuda/flash_attention.cuh"
#include "runtime/cuda/gemm.cuh"
#include "runtime/ops_backend.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

#include "runtime/cuda/attention_kernels.cuh"

// ---- launchers --------------------------------------------------------------------------------

struct Dims {
  int B, T, C, NH, hs;
  int64_t heads() const { return static_cast<int64_t>(B) * NH; }
  int64_t head_elems() const { return heads() * T * hs; }  // one (B, NH, T, hs) buffer
  int64_t att_elems() const { return heads() * T * T; }
};

Dims DimsOf(int64_t B, int64_t T, int64_t C, int num_heads) {
  Dims d;
  d.B = static_cast<int>(B);
  d.T = static_cast<int>(T);
  d.C = static_cast<int>(C);
  d.NH = num_heads;
  d.hs = num_heads > 0 ? d.C / num_heads : 0;
  return d;
}

Dims DimsOf(const Tensor& qkv, int num_heads) {
  return DimsOf(qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3, num_heads);
}

// What Forward and Backward below allocate: the (B, NH, T, hs) head buffers (3 and 7), and
// with 16-bit activations the probabilities rounded to them (forward) or those and dpre
// (backward); backward's datt is f32.
AttentionScratch StandardScratch(DType dtype, const Dims& d) {
  if (d.heads() == 0 || d.T == 0 || d.hs == 0) return {};
  const int64_t e = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t low = dtype == DType::kF32 ? 0 : e;
  return {3 * d.head_elems() * e + d.att_elems() * low,
          7 * d.head_elems() * e + d.att_elems() * (4 + 2 * low)};
}

template <typename E>
absl::Status Permute(cudaStream_t stream, bool to_heads, E* rows, E* h0, E* h1, E* h2, int S,
                     const Dims& d) {
  constexpr int V = Packed128<E>::size;
  bool vec = d.hs % V == 0 && IsAligned(rows, 16);
  for (E* h : {h0, h1, h2}) vec = vec && (h == nullptr || IsAligned(h, 16));
  const int P = vec ? V : 1;
  const unsigned int blocks = BlocksFor(d.head_elems() / P);
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kThreads, 0, stream>>>(rows, h0, h1, h2, S, d.B, d.T, d.NH, d.hs);
  };
  if (to_heads && vec) {
    launch(PermuteKernel<E, V, true>);
  } else if (to_heads) {
    launch(PermuteKernel<E, 1, true>);
  } else if (vec) {
    launch(PermuteKernel<E, V, false>);
  } else {
    launch(PermuteKernel<E, 1, false>);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// out (m, n) = op(a) @ op(b) for each of the B * NH heads, all row-major and contiguous.
absl::Status HeadGemm(Stream& s, const Dims& d, int64_t m, int64_t n, int64_t k, bool ta,
                      const void* a, bool tb, const void* b, void* out,
                      cudaDataType_t ab_type, cudaDataType_t out_type) {
  RowMajorGemm g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.transpose_a = ta;
  g.a = a;
  g.lda = ta ? m : k;  // stored (k, m) or (m, k)
  g.transpose_b = tb;
  g.b = b;
  g.ldb = tb ? k : n;  // stored (n, k) or (k, n)
  g.out = out;
  g.ldo = n;
  g.batch = static_cast<int>(d.heads());
  g.stride_a = m * k;
  g.stride_b = k * n;
  g.stride_out = m * n;
  g.ab_type = ab_type;
  g.out_type = out_type;
  return RunGemm(s, g);
}

// att gets the probabilities, lse (if not null) each row's log-sum-exp.
template <typename E>
absl::Status Forward(Stream& s, cudaStream_t stream, const Tensor& out, const Tensor& att,
                     float* lse, const Tensor& qkv, const Dims& d) {
  if (d.heads() == 0 || d.T == 0) return absl::OkStatus();
  const int64_t rows = d.heads() * d.T;
  const unsigned int row_blocks = RowBlocks(rows);
  if (d.hs == 0) {
    // Empty heads: every score is 0, so each row is uniform over its causal prefix (as on
    // the CPU); out has no elements.
    RETURN_IF_ERROR(ZeroFill(att, s));
    CausalSoftmaxKernel<E><<<row_blocks, kThreads, 0, stream>>>(MutPtr<float>(att), nullptr,
                                                                 lse, d.T, rows, 1.0f);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }
  const int64_t n = d.head_elems();
  constexpr bool kLow = !std::is_same<E, float>::value;
  ASSIGN_OR_RETURN(Tensor heads, Tensor::Empty({3, n}, qkv.dtype(), s.device()));
  E* q = MutPtr<E>(heads);
  E* k = q + n;
  E* v = k + n;
  Tensor att_low;
  if (kLow) {
    ASSIGN_OR_RETURN(att_low, Tensor::Empty({d.att_elems()}, qkv.dtype(), s.device()));
  }
  const cudaDataType_t et = CudaType<E>();
  const int T = d.T;
  const int hs = d.hs;

  RETURN_IF_ERROR(Permute<E>(stream, /*to_heads=*/true, MutPtr<E>(qkv), q, k, v, 3, d));
  // scores (T, T) = q (T, hs) @ k (T, hs)^T, f32, straight into att
  RETURN_IF_ERROR(HeadGemm(s, d, T, T, hs, false, q, true, k, att.raw(), et, CUDA_R_32F));
  CausalSoftmaxKernel<E><<<row_blocks, kThreads, 0, stream>>>(
      MutPtr<float>(att), MutPtr<E>(att_low), lse, T, rows,
      1.0f / std::sqrt(static_cast<float>(hs)));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  // y (T, hs) = att (T, T) @ v (T, hs), into q's buffer (q is no longer needed)
  const void* probs = kLow ? att_low.raw() : att.raw();
  E* y = q;
  RETURN_IF_ERROR(HeadGemm(s, d, T, hs, T, false, probs, false, v, y, et, et));
  return Permute<E>(stream, /*to_heads=*/false, MutPtr<E>(out), y, nullptr, nullptr, 1, d);
}

template <typename E>
// att holds the forward's probabilities; with lse (FlashAttention's fallback) it is scratch
// that gets them, recomputed from q, k and each row's log-sum-exp.
absl::Status Backward(Stream& s, cudaStream_t stream, const Tensor& dqkv, const Tensor& dout,
                      const Tensor& qkv, const Tensor& att, const float* lse, const Dims& d) {
  if (d.heads() == 0 || d.T == 0) return absl::OkStatus();
  if (d.hs == 0) return absl::OkStatus();  // dqkv has no elements
  const int64_t n = d.head_elems();
  constexpr bool kLow = !std::is_same<E, float>::value;
  // q, k, v, dy, dq, dk, dv: (B, NH, T, hs) each
  ASSIGN_OR_RETURN(Tensor heads, Tensor::Empty({7, n}, qkv.dtype(), s.device()));
  E* q = MutPtr<E>(heads);
  E* k = q + n;
  E* v = k + n;
  E* dy = v + n;
  E* dq = dy + n;
  E* dk = dq + n;
  E* dv = dk + n;
  // datt (B, NH, T, T) f32; with E != f32 also dpre and att rounded to E
  ASSIGN_OR_RETURN(Tensor datt, Tensor::Empty({d.att_elems()}, DType::kF32, s.device()));
  Tensor low;
  if (kLow) {
    ASSIGN_OR_RETURN(low, Tensor::Empty({2, d.att_elems()}, qkv.dtype(), s.device()));
  }
  E* dpre = kLow ? MutPtr<E>(low) : reinterpret_cast<E*>(MutPtr<float>(datt));
  E* att_low = kLow ? MutPtr<E>(low) + d.att_elems() : nullptr;
  const void* probs = kLow ? static_cast<const void*>(att_low) : att.raw();
  const cudaDataType_t et = CudaType<E>();
  const int T = d.T;
  const int hs = d.hs;
  const int64_t rows = d.heads() * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));

  RETURN_IF_ERROR(Permute<E>(stream, true, MutPtr<E>(qkv), q, k, v, 3, d));
  if (lse != nullptr) {
    // att (T, T) = q (T, hs) @ k (T, hs)^T, then exp(scale * att - lse) on the causal part
    RETURN_IF_ERROR(HeadGemm(s, d, T, T, hs, false, q, true, k, att.raw(), et, CUDA_R_32F));
    ProbsFromLseKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(MutPtr<float>(att), lse, T,
                                                                 rows, scale);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  RETURN_IF_ERROR(Permute<E>(stream, true, MutPtr<E>(dout), dy, nullptr, nullptr, 1, d));
  // datt (T, T) = dy (T, hs) @ v (T, hs)^T
  RETURN_IF_ERROR(HeadGemm(s, d, T, T, hs, false, dy, true, v, datt.raw(), et, CUDA_R_32F));
  CausalSoftmaxBackwardKernel<E><<<RowBlocks(rows), kThreads, 0, stream>>>(
      dpre, att_low, Ptr<float>(datt), Ptr<float>(att), T, rows, scale);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  // dv (T, hs) = att^T (T, T) @ dy (T, hs)
  RETURN_IF_ERROR(HeadGemm(s, d, T, hs, T, true, probs, false, dy, dv, et, et));
  // dq (T, hs) = dpre (T, T) @ k (T, hs)
  RETURN_IF_ERROR(HeadGemm(s, d, T, hs, T, false, dpre, false, k, dq, et, et));
  // dk (T, hs) = dpre^T (T, T) @ q (T, hs)
  RETURN_IF_ERROR(HeadGemm(s, d, T, hs, T, true, dpre, false, q, dk, et, et));
  return Permute<E>(stream, false, MutPtr<E>(dqkv), dq, dk, dv, 3, d);
}

}  // namespace

absl::Status AttentionForward(Stream& s, const Tensor& out, const Tensor& att, const Tensor& qkv,
                              int num_heads) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("AttentionForward", qkv.dtype(), {&out}));
  const Dims d = DimsOf(qkv, num_heads);
  return DispatchFloat("AttentionForward", qkv.dtype(), [&](auto tag) {
    return Forward<decltype(tag)>(s, stream, out, att, nullptr, qkv, d);
  });
}

absl::Status AttentionBackward(Stream& s, const Tensor& dqkv, const Tensor& dout,
                               const Tensor& qkv, const Tensor& att, int num_heads) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("AttentionBackward", qkv.dtype(), {&dqkv, &dout}));
  const Dims d = DimsOf(qkv, num_heads);
  return DispatchFloat("AttentionBackward", qkv.dtype(), [&](auto tag) {
    return Backward<decltype(tag)>(s, stream, dqkv, dout, qkv, att, nullptr, d);
  });
}

// One block per head over its cache rows 0..pos; the probabilities live in shared memory
// (the opt-in maximum allows about 56 000 positions on an H100).
absl::Status CachedAttentionForward(Stream& s, const Tensor& out, const Tensor& k_cache,
                                    const Tensor& v_cache, const Tensor& qkv, int64_t pos,
                                    int num_heads) {
  constexpr const char* kOp = "CachedAttentionForward";
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType(kOp, qkv.dtype(), {&out, &k_cache, &v_cache}));
  const int hs = static_cast<int>(k_cache.dim(2)), max_t = static_cast<int>(k_cache.dim(1));
  const size_t smem = (static_cast<size_t>(hs) + pos + 1) * sizeof(float);
  int device = 0, optin = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (smem > std::max<size_t>(48 << 10, optin)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d cached positions need %d bytes of shared memory, more than this GPU's %d", kOp,
        pos + 1, smem, optin));
  }
  const float scale = hs > 0 ? 1.0f / std::sqrt(static_cast<float>(hs)) : 1.0f;
  return DispatchFloat(kOp, qkv.dtype(), [&](auto tag) -> absl::Status {
    using E = decltype(tag);
    auto kernel = CachedAttentionKernel<E>;
    if (smem > (48 << 10)) {
      CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    }
    kernel<<<num_heads, kThreads, smem, stream>>>(MutPtr<E>(out), MutPtr<E>(k_cache),
                                                  MutPtr<E>(v_cache), Ptr<E>(qkv),
                                                  static_cast<int>(pos), max_t, num_heads, hs,
                                                  scale);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

// The scratch of the ops below: FlashAttention's follows from the path it takes.
AttentionScratch AttentionScratchBytes(DType dtype, int64_t B, int64_t T, int64_t C, int num_heads,
                                       bool flash) {
  const Dims d = DimsOf(B, T, C, num_heads);
  if (!flash) return StandardScratch(dtype, d);
  // The tensor cores' backward keeps a row dot per query row; the cuBLAS path gets the
  // probabilities in an f32 temporary.
  if (FlashTensorCoresFitShape(dtype, B, T, C, num_heads)) return {0, d.heads() * d.T * 4};
  AttentionScratch s = StandardScratch(dtype, d);
  s.forward += d.att_elems() * 4;
  s.backward += d.att_elems() * 4;
  return s;
}

// FlashAttention: on tensor cores where the kernels fit (flash_attention.cu); elsewhere (f32,
// other head sizes) the path above with the probabilities in a temporary, so the contract,
// lse and O(T) saved memory per head, holds for every dtype and shape.
absl::Status FlashAttentionForward(Stream& s, const Tensor& out, const Tensor& lse,
                                   const Tensor& qkv, int num_heads) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("FlashAttentionForward", qkv.dtype(), {&out}));
  if (FlashTensorCoresFit(qkv, num_heads, {&out})) {
    return FlashForwardTensorCores(stream, out, lse, qkv, num_heads);
  }
  const Dims d = DimsOf(qkv, num_heads);
  ASSIGN_OR_RETURN(Tensor att, Tensor::Empty({d.att_elems()}, DType::kF32, s.device()));
  return DispatchFloat("FlashAttentionForward", qkv.dtype(), [&](auto tag) {
    return Forward<decltype(tag)>(s, stream, out, att, MutPtr<float>(lse), qkv, d);
  });
}

absl::Status FlashAttentionBackward(Stream& s, const Tensor& dqkv, const Tensor& dout,
                                    const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                    int num_heads) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(
      SameFloatDType("FlashAttentionBackward", qkv.dtype(), {&dqkv, &dout, &out}));
  if (FlashTensorCoresFit(qkv, num_heads, {&dqkv, &dout, &out})) {
    return FlashBackwardTensorCores(s, stream, dqkv, dout, qkv, out, lse, num_heads);
  }
  const Dims d = DimsOf(qkv, num_heads);
  ASSIGN_OR_RETURN(Tensor att, Tensor::Empty({d.att_elems()}, DType::kF32, s.device()));
  return DispatchFloat("FlashAttentionBackward", qkv.dtype(), [&](auto tag) {
    return Backward<decltype(tag)>(s, stream, dqkv, dout, qkv, att, Ptr<float>(lse), d);
  });
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
