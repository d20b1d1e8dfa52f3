// Reductions on CUDA: Sum and SumSquaresAccumulate into one f32 value (grid-stride block
// reductions over 16-byte packs, one atomicAdd per block), and AccumulateInto, which adds
// f32 partial sums into a parameter gradient of any float dtype. Non-finite values
// propagate through the sums (loss scaling looks for them).
#include "runtime/cuda/common.cuh"
#include "runtime/ops_backend.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

#include "runtime/cuda/reduce_kernels.cuh"

// ---- launchers --------------------------------------------------------------------------------

template <bool kSquares>
absl::Status LaunchSum(const char* name, cudaStream_t stream, const Tensor& out, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return absl::OkStatus();
  return DispatchFloat(name, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = Packed128<T>::size;
    const bool vec = IsAligned(x.raw(), 16);
    const int64_t work = vec ? std::max<int64_t>(n / V, n % V) : n;
    // A few blocks per multiprocessor: enough to saturate memory, few atomics on *out.
    const unsigned int blocks =
        std::min<unsigned int>(BlocksFor(work), static_cast<unsigned int>(4 * SmCount()));
    if (vec) {
      SumKernel<T, V, kSquares><<<blocks, kThreads, 0, stream>>>(MutPtr<float>(out),
                                                                 Ptr<T>(x), n);
    } else {
      SumKernel<T, 1, kSquares><<<blocks, kThreads, 0, stream>>>(MutPtr<float>(out),
                                                                 Ptr<T>(x), n);
    }
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

}  // namespace

absl::Status AccumulateInto(cudaStream_t stream, const Tensor& grad, const float* acc) {
  const int64_t n = grad.numel();
  if (n == 0) return absl::OkStatus();
  return DispatchFloat("AccumulateInto", grad.dtype(), [&](auto tag) {
    using G = decltype(tag);
    AccumulateKernel<G><<<BlocksFor(n), kThreads, 0, stream>>>(MutPtr<G>(grad), acc, n);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

absl::Status Sum(Stream& s, const Tensor& out, const Tensor& x) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out.raw(), 0, sizeof(float), stream));
  return LaunchSum<false>("Sum", stream, out, x);
}

absl::Status SumSquaresAccumulate(Stream& s, const Tensor& out, const Tensor& x) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  return LaunchSum<true>("SumSquaresAccumulate", stream, out, x);
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
