// Elementwise ops on CUDA: GELU and ReLU (forward, backward), bias add, fused bias + GELU,
// add, axpy, scale, fill and dtype casts. Grid-stride kernels that move 16 bytes per load
// and store (Packed128) when every pointer is 16-byte aligned, with a scalar tail for the
// last numel % (16 / sizeof(T)) elements; otherwise one element per step. f32 math.
// Output and input may be the same tensor: each element is read before it is written by
// the same thread.
#include "runtime/cuda/common.cuh"
#include "runtime/ops_backend.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

#include "runtime/cuda/elementwise_kernels.cuh"

// ---- launchers --------------------------------------------------------------------------------

template <typename T, int kInputs, typename Op>
absl::Status LaunchMap(cudaStream_t stream, T* out, const T* in0, const T* in1, int64_t n,
                       Op op) {
  if (n == 0) return absl::OkStatus();
  constexpr int V = Packed128<T>::size;
  const bool vec = IsAligned(out, 16) && (kInputs < 1 || IsAligned(in0, 16)) &&
                   (kInputs < 2 || IsAligned(in1, 16));
  const int64_t work = vec ? std::max<int64_t>(n / V, n % V) : n;
  MapKernel<T, kInputs, Op><<<BlocksFor(work), kThreads, 0, stream>>>(out, in0, in1, n, vec, op);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// Runs a map op with kInputs of (in0, in1) over tensors of out's dtype.
template <int kInputs, typename Op>
absl::Status Map(const char* name, Stream& s, const Tensor& out, const Tensor& in0,
                 const Tensor& in1, Op op) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType(name, out.dtype(), {&in0, &in1}));
  return DispatchFloat(name, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return LaunchMap<T, kInputs>(stream, MutPtr<T>(out), Ptr<T>(in0), Ptr<T>(in1), out.numel(),
                                 op);
  });
}

template <typename In>
absl::Status LaunchCast(cudaStream_t stream, const Tensor& out, const Tensor& in) {
  return DispatchFloat("Cast", out.dtype(), [&](auto tag) {
    using Out = decltype(tag);
    const int64_t n = in.numel();
    const bool vec = IsAligned(in.raw(), 4 * sizeof(In)) && IsAligned(out.raw(), 4 * sizeof(Out));
    const int64_t work = vec ? std::max<int64_t>(n / 4, n % 4) : n;
    CastKernel<In, Out><<<BlocksFor(work), kThreads, 0, stream>>>(MutPtr<Out>(out), Ptr<In>(in),
                                                                   n, vec);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

}  // namespace

absl::Status GeluForward(Stream& s, const Tensor& out, const Tensor& inp) {
  return Map<1>("GeluForward", s, out, inp, Tensor(), GeluOp{});
}

absl::Status GeluBackward(Stream& s, const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  return Map<2>("GeluBackward", s, dinp, inp, dout, GeluBackwardOp{});
}

absl::Status ReluForward(Stream& s, const Tensor& out, const Tensor& inp) {
  return Map<1>("ReluForward", s, out, inp, Tensor(), ReluOp{});
}

absl::Status ReluBackward(Stream& s, const Tensor& dinp, const Tensor& out, const Tensor& dout) {
  return Map<2>("ReluBackward", s, dinp, out, dout, ReluBackwardOp{});
}

absl::Status Add(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b) {
  return Map<2>("Add", s, out, a, b, AddOp{});
}

absl::Status Axpy(Stream& s, const Tensor& y, float alpha, const Tensor& x) {
  return Map<2>("Axpy", s, y, y, x, AxpyOp{alpha});
}

absl::Status Scale(Stream& s, const Tensor& x, float alpha) {
  return Map<1>("Scale", s, x, x, Tensor(), ScaleOp{alpha});
}

absl::Status Fill(Stream& s, const Tensor& x, float value) {
  return Map<0>("Fill", s, x, Tensor(), Tensor(), FillOp{value});
}

absl::Status BiasAdd(Stream& s, const Tensor& x, const Tensor& bias) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("BiasAdd", x.dtype(), {&bias}));
  const int64_t n = x.numel();
  const int64_t C = bias.numel();
  if (n == 0 || C == 0) return absl::OkStatus();
  return DispatchFloat("BiasAdd", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = Packed128<T>::size;
    const bool vec = C % V == 0 && IsAligned(x.raw(), 16) && IsAligned(bias.raw(), 16);
    BiasAddKernel<T><<<BlocksFor(vec ? n / V : n), kThreads, 0, stream>>>(
        MutPtr<T>(x), Ptr<T>(bias), n, C, vec);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

absl::Status BiasGeluForward(Stream& s, const Tensor& out, const Tensor& pre, const Tensor& x,
                             const Tensor& bias) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("BiasGeluForward", out.dtype(), {&pre, &x, &bias}));
  const int64_t n = out.numel();
  if (n == 0) return absl::OkStatus();
  const int64_t C = bias.defined() ? bias.numel() : (x.rank() > 0 ? x.dim(-1) : 1);
  if (C == 0) return absl::OkStatus();
  return DispatchFloat("BiasGeluForward", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = Packed128<T>::size;
    const bool vec = C % V == 0 && IsAligned(out.raw(), 16) && IsAligned(x.raw(), 16) &&
                     (!pre.defined() || IsAligned(pre.raw(), 16)) &&
                     (!bias.defined() || IsAligned(bias.raw(), 16));
    BiasGeluKernel<T><<<BlocksFor(vec ? n / V : n), kThreads, 0, stream>>>(
        MutPtr<T>(out), MutPtr<T>(pre), Ptr<T>(x), Ptr<T>(bias), n, C, vec);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

absl::Status Cast(Stream& s, const Tensor& out, const Tensor& in) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  if (in.numel() == 0) return absl::OkStatus();
  if (out.dtype() == in.dtype()) {
    if (out.raw() == in.raw()) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out.raw(), in.raw(), in.bytes(), cudaMemcpyDeviceToDevice, stream));
    return absl::OkStatus();
  }
  return DispatchFloat("Cast", in.dtype(), [&](auto tag) {
    using In = decltype(tag);
    return LaunchCast<In>(stream, out, in);
  });
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
