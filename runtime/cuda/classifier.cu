// Softmax cross-entropy fused with its backward on CUDA (after llm.c's fused_classifier):
// one block per row reads the logits once for the online max/sum, writes the loss, then
// (when dlogits is given) reads them again to write (softmax - onehot) * dloss_scale.
// dlogits may be the logits tensor itself: every read of a row happens before its writes.
// Legend: N = rows, V = vocabulary, Vp = logits per row (V padded).
#include <initializer_list>
#include <utility>

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

// The pack width and threads of a block-per-row kernel over rows of Vl elements.
template <typename T>
std::pair<int, int> RowLaunch(int Vl, std::initializer_list<const Tensor*> rows) {
  constexpr int kVec = Packed128<T>::size;
  bool vec = Vl % kVec == 0;
  for (const Tensor* t : rows) vec = vec && (!t->defined() || IsAligned(t->raw(), 16));
  const int P = vec ? kVec : 1;
  return {P, RowThreads((Vl + P - 1) / P)};
}

}  // namespace

absl::Status CrossEntropyRowMax(Stream& s, const Tensor& max, const Tensor& logits,
                                int64_t columns) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  const int64_t N = logits.dim(0);
  if (N == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const unsigned int blocks, BlockPerRowGrid("CrossEntropyRowMax", N));
  return DispatchFloat("CrossEntropyRowMax", logits.dtype(), [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    const int Vl = static_cast<int>(logits.dim(1));
    const auto [P, threads] = RowLaunch<T>(Vl, {&logits});
    auto kernel = P > 1 ? CrossEntropyRowMaxKernel<T, Packed128<T>::size>
                        : CrossEntropyRowMaxKernel<T, 1>;
    kernel<<<blocks, threads, 0, stream>>>(MutPtr<float>(max), Ptr<T>(logits), Vl,
                                           static_cast<int>(columns));
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

absl::Status CrossEntropyPartials(Stream& s, const Tensor& partials, const Tensor& logits,
                                  const Tensor& max, const Tensor& targets, int64_t vocab_begin,
                                  int64_t columns) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  const int64_t N = logits.dim(0);
  if (N == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const unsigned int blocks, BlockPerRowGrid("CrossEntropyPartials", N));
  return DispatchFloat("CrossEntropyPartials", logits.dtype(), [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    const int Vl = static_cast<int>(logits.dim(1));
    const auto [P, threads] = RowLaunch<T>(Vl, {&logits});
    auto kernel = P > 1 ? CrossEntropyPartialsKernel<T, Packed128<T>::size>
                        : CrossEntropyPartialsKernel<T, 1>;
    kernel<<<blocks, threads, 0, stream>>>(MutPtr<float>(partials), Ptr<T>(logits),
                                           Ptr<float>(max), Ptr<int32_t>(targets), N, Vl,
                                           static_cast<int>(columns),
                                           static_cast<int>(vocab_begin));
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

absl::Status VocabParallelCrossEntropy(Stream& s, const Tensor& losses, const Tensor& dlogits,
                                       const Tensor& logits, const Tensor& max,
                                       const Tensor& partials, const Tensor& targets,
                                       float dloss_scale, int64_t vocab_begin, int64_t columns) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("VocabParallelCrossEntropy", logits.dtype(), {&dlogits}));
  const int64_t N = logits.dim(0);
  if (N == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const unsigned int blocks, BlockPerRowGrid("VocabParallelCrossEntropy", N));
  return DispatchFloat("VocabParallelCrossEntropy", logits.dtype(), [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    const int Vl = static_cast<int>(logits.dim(1));
    const auto [P, threads] = RowLaunch<T>(Vl, {&logits, &dlogits});
    auto kernel = P > 1 ? VocabParallelCrossEntropyKernel<T, Packed128<T>::size>
                        : VocabParallelCrossEntropyKernel<T, 1>;
    kernel<<<blocks, threads, 0, stream>>>(
        MutPtr<float>(losses), MutPtr<T>(dlogits), Ptr<T>(logits), Ptr<float>(max),
        Ptr<float>(partials), Ptr<int32_t>(targets), N, Vl, static_cast<int>(columns),
        static_cast<int>(vocab_begin), dloss_scale);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

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
