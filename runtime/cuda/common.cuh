// Shared pieces of the CUDA backend (after llm.c's llmc/cuda_common.cuh): the device-side
// helpers of device_functions.cuh (f32 <-> storage conversions, Pack<T, N> for 128-bit or
// narrower vector loads and stores, warp and block reductions, launch sizing), the block's
// dynamic shared memory, and the dtype dispatch every "any float" launcher uses.
// Internal to runtime/cuda; kernels compute in f32 whatever the storage type.
#ifndef TANDEM_RUNTIME_CUDA_COMMON_CUH_
#define TANDEM_RUNTIME_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "runtime/cuda_status.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace tandem {
namespace ops {
namespace cuda {

// The block's dynamic shared memory (the bytes given at launch), 128-byte aligned.
__device__ __forceinline__ unsigned char* DynamicShared() {
  extern __shared__ __align__(128) unsigned char dynamic_shared_bytes[];
  return dynamic_shared_bytes;
}

#include "runtime/cuda/device_functions.cuh"

// The address is a multiple of `bytes` (vector paths check their pointers with it).
inline bool IsAligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Multiprocessor count of the current device (132 on H100/H200).
inline int SmCount() {
  int device = 0;
  int sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 108;
  }
  return sms;
}

// The grid of a kernel that takes one block per row: an error past CUDA's 2^31 - 1 blocks.
inline absl::StatusOr<unsigned int> BlockPerRowGrid(const char* op, int64_t rows) {
  if (rows > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d rows exceed the 2^31 - 1 blocks of a CUDA grid", op, rows));
  }
  return static_cast<unsigned int>(rows);
}

// Makes the stream's device current and returns its cudaStream_t.
inline absl::StatusOr<cudaStream_t> Begin(Stream& s) {
  RETURN_IF_ERROR(SetCurrentDevice(s.device()));
  return static_cast<cudaStream_t>(s.native());
}

// ---- dtype dispatch ---------------------------------------------------------------------------

template <typename T>
inline const T* Ptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw()) : nullptr;
}
template <typename T>
inline T* MutPtr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw()) : nullptr;
}

inline absl::Status UnsupportedDType(const char* op, DType t) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: dtype %s is not supported on CUDA (f32, bf16, f16)", op, DTypeName(t)));
}

// All defined tensors of an op share one float dtype (ops.cc checks this; the backend
// re-checks because a mismatch would reinterpret memory).
inline absl::Status SameFloatDType(const char* op, DType want,
                                   std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->defined() && t->dtype() != want) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %s does not match dtype %s of the op's other tensors", op, t->ToString(),
          DTypeName(want)));
    }
  }
  return absl::OkStatus();
}

// cuBLAS's name for the element type.
template <typename T>
constexpr cudaDataType_t CudaType();
template <>
constexpr cudaDataType_t CudaType<float>() { return CUDA_R_32F; }
template <>
constexpr cudaDataType_t CudaType<__nv_bfloat16>() { return CUDA_R_16BF; }
template <>
constexpr cudaDataType_t CudaType<__half>() { return CUDA_R_16F; }

// grad[i] += acc[i] for a parameter gradient of any float dtype and f32 partial sums
// (defined in reduce.cu).
absl::Status AccumulateInto(cudaStream_t stream, const Tensor& grad, const float* acc);

// Calls fn(T{}) with T = float, __nv_bfloat16 or __half for `dtype`.
template <typename Fn>
absl::Status DispatchFloat(const char* op, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      return fn(float{});
    case DType::kBF16:
      return fn(__nv_bfloat16{});
    case DType::kF16:
      return fn(__half{});
    default:
      return UnsupportedDType(op, dtype);
  }
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem

#endif  // TANDEM_RUNTIME_CUDA_COMMON_CUH_
