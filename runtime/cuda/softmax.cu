// Row softmax on CUDA, forward and backward: one block per row (32 to 1024 threads, as the
// row needs), online max/sum in one pass, then the write pass; 16-byte packs when C is a
// multiple of the pack and the pointers are aligned. f32 math.
#include "runtime/cuda/common.cuh"
#include "runtime/ops_backend.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

#include "runtime/cuda/softmax_kernels.cuh"

// ---- launchers --------------------------------------------------------------------------------

template <typename T>
absl::Status LaunchSoftmax(cudaStream_t stream, bool backward, const Tensor& out,
                           const Tensor& in0, const Tensor& in1) {
  const int C = static_cast<int>(out.dim(-1));
  const int64_t N = C == 0 ? 0 : out.numel() / C;
  if (N == 0) return absl::OkStatus();
  constexpr int V = Packed128<T>::size;
  const bool vec = C % V == 0 && IsAligned(out.raw(), 16) && IsAligned(in0.raw(), 16) &&
                   (!in1.defined() || IsAligned(in1.raw(), 16));
  const int P = vec ? V : 1;
  const int threads = RowThreads((C + P - 1) / P);
  ASSIGN_OR_RETURN(const unsigned int blocks,
                   BlockPerRowGrid(backward ? "SoftmaxBackward" : "SoftmaxForward", N));
  if (backward) {
    auto kernel = vec ? SoftmaxBackwardKernel<T, V> : SoftmaxBackwardKernel<T, 1>;
    kernel<<<blocks, threads, 0, stream>>>(MutPtr<T>(out), Ptr<T>(in0), Ptr<T>(in1), C);
  } else {
    auto kernel = vec ? SoftmaxForwardKernel<T, V> : SoftmaxForwardKernel<T, 1>;
    kernel<<<blocks, threads, 0, stream>>>(MutPtr<T>(out), Ptr<T>(in0), C);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status SoftmaxForward(Stream& s, const Tensor& out, const Tensor& inp) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("SoftmaxForward", out.dtype(), {&inp}));
  return DispatchFloat("SoftmaxForward", out.dtype(), [&](auto tag) {
    return LaunchSoftmax<decltype(tag)>(stream, /*backward=*/false, out, inp, Tensor());
  });
}

absl::Status SoftmaxBackward(Stream& s, const Tensor& dinp, const Tensor& out,
                             const Tensor& dout) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("SoftmaxBackward", dinp.dtype(), {&out, &dout}));
  return DispatchFloat("SoftmaxBackward", dinp.dtype(), [&](auto tag) {
    return LaunchSoftmax<decltype(tag)>(stream, /*backward=*/true, dinp, out, dout);
  });
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
