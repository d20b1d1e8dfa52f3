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

// ---- kernels ----------------------------------------------------------------------------------

// *out += sum of x (or of x^2 with kSquares); *out is f32.
// x: (n)
template <typename T, int P, bool kSquares>
__global__ void SumKernel(float* out, const T* x, int64_t n) {
  using Vec = Pack<T, P>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float acc = 0.0f;
  const int64_t packs = n / P;
  for (int64_t p = tid; p < packs; p += stride) {
    const Vec v = Vec::Load(x + p * P);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float f = ToF32(v[j]);
      acc += kSquares ? f * f : f;
    }
  }
  for (int64_t i = packs * P + tid; i < n; i += stride) {
    const float f = ToF32(x[i]);
    acc += kSquares ? f * f : f;
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

// dst[i] += src[i], in dst's dtype.
// dst, src: (n)
template <typename G>
__global__ void AccumulateKernel(G* dst, const float* src, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = FromF32<G>(ToF32(dst[i]) + src[i]);
  }
}

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
