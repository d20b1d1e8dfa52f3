// FlashAttention on tensor cores (see flash_attention.cuh): the kernels, in
// flash_attention_kernels.cuh, and their launchers.
#include <cmath>
#include <type_traits>

#include "runtime/cuda/common.cuh"
#include "runtime/cuda/flash_attention.cuh"
#include "runtime/cuda/sm80.cuh"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

#include "runtime/cuda/flash_attention_kernels.cuh"

// ---- launchers --------------------------------------------------------------------------------

struct Launch {
  int B, T, NH, HS;
  dim3 grid() const {
    return dim3(static_cast<unsigned int>(B * NH),
                static_cast<unsigned int>((T + kTile - 1) / kTile));
  }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(HS)); }
};

Launch LaunchOf(const Tensor& qkv, int num_heads) {
  const int C = static_cast<int>(qkv.dim(2) / 3);
  return {static_cast<int>(qkv.dim(0)), static_cast<int>(qkv.dim(1)), num_heads, C / num_heads};
}

// Runs kernel on `grid` with kBytes of dynamic shared memory (its Smem's; above the default
// 48 KB the kernel must opt in first).
template <size_t kBytes, typename Kernel, typename... Args>
absl::Status Run(cudaStream_t stream, const Launch& l, Kernel kernel, Args... args) {
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(kBytes)));
  kernel<<<l.grid(), kFlashThreads, kBytes, stream>>>(args...);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// Calls fn(E{}, std::integral_constant<int, HS>{}) for the 16-bit dtype and head size.
template <typename Fn>
absl::Status DispatchTensorCores(DType dtype, int hs, Fn&& fn) {
  auto by_size = [&](auto tag) -> absl::Status {
    switch (hs) {
      case 32:
        return fn(tag, std::integral_constant<int, 32>{});
      case 64:
        return fn(tag, std::integral_constant<int, 64>{});
      case 128:
        return fn(tag, std::integral_constant<int, 128>{});
      default:
        return absl::InternalError(
            absl::StrFormat("FlashAttention: head size %d has no kernel", hs));
    }
  };
  if (dtype == DType::kBF16) return by_size(__nv_bfloat16{});
  if (dtype == DType::kF16) return by_size(__half{});
  return UnsupportedDType("FlashAttention on tensor cores", dtype);
}

}  // namespace

bool FlashTensorCoresFitShape(DType dtype, int64_t B, int64_t T, int64_t C, int num_heads) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) return false;
  // Grid x = B * NH, y = query or key tiles (at most 65535); RowDotKernel's blocks, a warp per
  // row of B * NH * T, within a grid's x. Checked in int64 before Launch narrows to int.
  if (T < 1 || B < 1 || num_heads < 1 || B * num_heads > INT32_MAX) return false;
  if ((T + kTile - 1) / kTile > 65535 || 3 * C > INT32_MAX) return false;
  if (B * num_heads * T / kRowsPerBlock >= INT32_MAX) return false;
  // A kernel for the head size, and the backward's shared memory per block (the larger: 31 KB,
  // 55 KB, 103 KB for head sizes 32, 64, 128) within what the device gives a block (99 KB on
  // sm_86 and sm_89, which then take the cuBLAS path at head size 128; more on sm_80, sm_90).
  size_t bytes = 0;
  const int hs = static_cast<int>(C / num_heads);
  const absl::Status has_kernel = DispatchTensorCores(dtype, hs, [&](auto tag, auto size) {
    bytes = BackwardSmem<decltype(tag), decltype(size)::value>::kBytes;
    return absl::OkStatus();
  });
  if (!has_kernel.ok() || int64_t{hs} * num_heads != C) return false;
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return bytes <= static_cast<size_t>(optin);
}

bool FlashTensorCoresFit(const Tensor& qkv, int num_heads,
                         std::initializer_list<const Tensor*> others) {
  if (!IsAligned(qkv.raw(), 16)) return false;
  for (const Tensor* t : others) {
    if (!IsAligned(t->raw(), 16)) return false;
  }
  return FlashTensorCoresFitShape(qkv.dtype(), qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3, num_heads);
}

absl::Status FlashForwardTensorCores(cudaStream_t stream, const Tensor& out, const Tensor& lse,
                                     const Tensor& qkv, int num_heads) {
  const Launch l = LaunchOf(qkv, num_heads);
  return DispatchTensorCores(qkv.dtype(), l.HS, [&](auto tag, auto hs) {
    using E = decltype(tag);
    constexpr int HS = decltype(hs)::value;
    return Run<ForwardSmem<E, HS>::kBytes>(stream, l, FlashForwardKernel<E, HS>, MutPtr<E>(out),
                                           MutPtr<float>(lse), Ptr<E>(qkv), l.T, l.NH, l.scale());
  });
}

absl::Status FlashBackwardTensorCores(Stream& s, cudaStream_t stream, const Tensor& dqkv,
                                      const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                      const Tensor& lse, int num_heads) {
  const Launch l = LaunchOf(qkv, num_heads);
  const int64_t rows = static_cast<int64_t>(l.B) * l.NH * l.T;
  ASSIGN_OR_RETURN(Tensor rowdot, Tensor::Empty({rows}, DType::kF32, s.device()));
  return DispatchTensorCores(qkv.dtype(), l.HS, [&](auto tag, auto hs) -> absl::Status {
    using E = decltype(tag);
    constexpr int HS = decltype(hs)::value;
    RowDotKernel<E><<<RowBlocks(rows), kThreads, 0, stream>>>(MutPtr<float>(rowdot), Ptr<E>(dout),
                                                              Ptr<E>(out), l.T, l.NH, l.HS, rows);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    const absl::Status kv = Run<BackwardSmem<E, HS>::kBytes>(
        stream, l, FlashBackwardKvKernel<E, HS>, MutPtr<E>(dqkv), Ptr<E>(qkv), Ptr<E>(dout),
        Ptr<float>(lse), Ptr<float>(rowdot), l.T, l.NH, l.scale());
    if (!kv.ok()) return kv;
    return Run<BackwardSmem<E, HS>::kBytes>(stream, l, FlashBackwardQKernel<E, HS>, MutPtr<E>(dqkv),
                                            Ptr<E>(qkv), Ptr<E>(dout), Ptr<float>(lse),
                                            Ptr<float>(rowdot), l.T, l.NH, l.scale());
  });
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
