// FlashAttention (Dao et al., FlashAttention-2's work split) on tensor cores for the CUDA
// backend: causal self-attention over qkv (B, T, 3C) for bf16/f16 with head sizes 32, 64 and
// 128, on sm_80 and later (mma.m16n8k16, ldmatrix, cp.async). Scores and probabilities stay
// in registers, 16 rows per warp, and never reach memory; tiles of q, k, v and dout stream
// through shared memory, the next loading while the block computes; only the output and each
// row's log-sum-exp are written. Backward
// recomputes the probabilities: one kernel per key tile accumulates dk and dv, one per query
// tile dq, so no atomics and the same bits on every run.
// Host-only declarations; attention.cu takes this path where it fits and its cuBLAS path
// otherwise.
#ifndef TANDEM_RUNTIME_CUDA_FLASH_ATTENTION_CUH_
#define TANDEM_RUNTIME_CUDA_FLASH_ATTENTION_CUH_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace tandem {
namespace ops {
namespace cuda {

// Whether the tensor-core kernels take qkv (B, T, 3C) in `dtype` with `num_heads` heads on the
// current device: dtype bf16 or f16, head size 32, 64 or 128 (with shared memory for it), and
// T >= 1, B * NH >= 1, within the grid's limits.
bool FlashTensorCoresFitShape(DType dtype, int64_t B, int64_t T, int64_t C, int num_heads);
// The same for these tensors, each also 16-byte aligned.
bool FlashTensorCoresFit(const Tensor& qkv, int num_heads,
                         std::initializer_list<const Tensor*> others);

// The arguments of ops::FlashAttentionForward/Backward, checked, and fitting as above.
absl::Status FlashForwardTensorCores(cudaStream_t stream, const Tensor& out, const Tensor& lse,
                                     const Tensor& qkv, int num_heads);
absl::Status FlashBackwardTensorCores(Stream& s, cudaStream_t stream, const Tensor& dqkv,
                                      const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                      const Tensor& lse, int num_heads);

}  // namespace cuda
}  // namespace ops
}  // namespace tandem

#endif  // TANDEM_RUNTIME_CUDA_FLASH_ATTENTION_CUH_
