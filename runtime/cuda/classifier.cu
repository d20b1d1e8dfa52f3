// Softmax cross-entropy fused with its backward on CUDA (after llm.c's fused_classifier):
// one block per row reads the logits once for the online max/sum, writes the loss, then
// (when dlogits is given) reads them again to write (softmax - onehot) * dloss_scale.
// dlogits may be the logits tensor itself: every read of a row happens before its writes.
// Legend: N = rows, V = vocabulary, Vp = logits per row (V padded).
#include "runtime/cuda/common.cuh"
#include "runtime/ops_backend.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

#include "runtime/cuda/classifier_kernels.cuh"

// ---- launcher ---------------------------------------------------------------------------------

template <typename T>
absl::Status LaunchCrossEntropy(cudaStream_t stream, const Tensor& losses, const Tensor& dlogits,
                                const Tensor& logits, const Tensor& targets, float dloss_scale,
                                int64_t vocab) {
  const int Vp = static_cast<int>(logits.dim(-1));
  const int64_t N = targets.numel();
  if (N == 0) return absl::OkStatus();
  constexpr int kVec = Packed128<T>::size;
  const bool vec = Vp % kVec == 0 && IsAligned(logits.raw(), 16) &&
                   (!dlogits.defined() || IsAligned(dlogits.raw(), 16));
  const int P = vec ? kVec : 1;
  const int threads = RowThreads((Vp + P - 1) / P);
  auto kernel = vec ? CrossEntropyKernel<T, kVec> : CrossEntropyKernel<T, 1>;
  ASSIGN_OR_RETURN(const unsigned int blocks, BlockPerRowGrid("SoftmaxCrossEntropy", N));
  kernel<<<blocks, threads, 0, stream>>>(
      MutPtr<float>(losses), MutPtr<T>(dlogits), Ptr<T>(logits), Ptr<int32_t>(targets),
      static_cast<int>(vocab), Vp, dloss_scale);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status SoftmaxCrossEntropy(Stream& s, const Tensor& losses, const Tensor& dlogits,
                                 const Tensor& logits, const Tensor& targets,
                                 float dloss_scale, int64_t vocab) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("SoftmaxCrossEntropy", logits.dtype(), {&dlogits}));
  return DispatchFloat("SoftmaxCrossEntropy", logits.dtype(), [&](auto tag) {
    return LaunchCrossEntropy<decltype(tag)>(stream, losses, dlogits, logits, targets,
                                             dloss_scale, vocab);
  });
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
