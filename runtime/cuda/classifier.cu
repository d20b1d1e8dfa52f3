// Softmax cross-entropy fused with its backward on CUDA (after llm.c's fused_classifier):
// one block per row reads the logits once for the online max/sum, writes the loss, then
// (when dlogits is given) reads them again to write (softmax - onehot) * dloss_scale.
// dlogits may be the logits tensor itself: every read of a row happens before its writes.
// Legend: N = rows, V = vocabulary.
#include "runtime/cuda/common.cuh"
#include "runtime/ops_backend.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

// ---- kernels ----------------------------------------------------------------------------------

// Block r handles row r. A target of -1 is ignored (loss 0, gradient 0); any other target
// outside [0, V) gives a nan loss and a zero gradient, so bad data cannot pass unnoticed.
// losses: (N) f32; dlogits: (N, V) or null; logits: (N, V); targets: (N) i32
template <typename T, int P>
__global__ void CrossEntropyKernel(float* losses, T* dlogits, const T* logits,
                                   const int32_t* targets, int V, float dloss_scale) {
  using Vec = Pack<T, P>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * V;
  const int target = targets[blockIdx.x];
  const bool valid = target >= 0 && target < V;
  // Read before the block synchronizes in BlockMaxSum, i.e. before any dlogits write.
  const float target_logit = valid ? ToF32(logits[base + target]) : 0.0f;

  MaxSum ms = MaxSumEmpty();
  for (int c = threadIdx.x * P; c < V; c += blockDim.x * P) {
    const Vec v = Vec::Load(logits + base + c);
#pragma unroll
    for (int j = 0; j < P; ++j) ms = MaxSumAdd(ms, ToF32(v[j]));
  }
  ms = BlockMaxSum(ms);
  if (threadIdx.x == 0) {
    losses[blockIdx.x] = valid ? logf(ms.s) + ms.m - target_logit : (target == -1 ? 0.0f : NAN);
  }
  if (dlogits == nullptr) return;
  const float inv = 1.0f / ms.s;
  for (int c = threadIdx.x * P; c < V; c += blockDim.x * P) {
    const Vec v = Vec::Load(logits + base + c);
    Vec d;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float p = expf(ToF32(v[j]) - ms.m) * inv;
      const float onehot = c + j == target ? 1.0f : 0.0f;
      d[j] = FromF32<T>(valid ? (p - onehot) * dloss_scale : 0.0f);
    }
    d.Store(dlogits + base + c);
  }
}

// ---- launcher ---------------------------------------------------------------------------------

template <typename T>
absl::Status LaunchCrossEntropy(cudaStream_t stream, const Tensor& losses, const Tensor& dlogits,
                                const Tensor& logits, const Tensor& targets, float dloss_scale) {
  const int V = static_cast<int>(logits.dim(-1));
  const int64_t N = targets.numel();
  if (N == 0) return absl::OkStatus();
  constexpr int kVec = Packed128<T>::size;
  const bool vec = V % kVec == 0 && IsAligned(logits.raw(), 16) &&
                   (!dlogits.defined() || IsAligned(dlogits.raw(), 16));
  const int P = vec ? kVec : 1;
  int threads = kWarpSize;
  while (threads < (V + P - 1) / P && threads < 1024) threads *= 2;
  auto kernel = vec ? CrossEntropyKernel<T, kVec> : CrossEntropyKernel<T, 1>;
  kernel<<<static_cast<unsigned int>(N), threads, 0, stream>>>(
      MutPtr<float>(losses), MutPtr<T>(dlogits), Ptr<T>(logits), Ptr<int32_t>(targets), V,
      dloss_scale);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status SoftmaxCrossEntropy(Stream& s, const Tensor& losses, const Tensor& dlogits,
                                 const Tensor& logits, const Tensor& targets,
                                 float dloss_scale) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("SoftmaxCrossEntropy", logits.dtype(), {&dlogits}));
  return DispatchFloat("SoftmaxCrossEntropy", logits.dtype(), [&](auto tag) {
    return LaunchCrossEntropy<decltype(tag)>(stream, losses, dlogits, logits, targets,
                                             dloss_scale);
  });
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
