// CUDA and cuBLAS error codes as absl::Status, with the call, file, line and the library's own
// message (after nccl's checks.h; NCCL's are in comm/nccl_communicator.cc, so that only
// binaries with NCCL load it). Only compiled where CUDA is present.
#ifndef TANDEM_RUNTIME_CUDA_STATUS_H_
#define TANDEM_RUNTIME_CUDA_STATUS_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace tandem {

absl::Status CudaErrorStatus(cudaError_t e, const char* call, const char* file, int line);
absl::Status CublasErrorStatus(cublasStatus_t e, const char* call, const char* file, int line);

}  // namespace tandem

#define CUDA_RETURN_IF_ERROR(call)                                                       \
  do {                                                                                   \
    cudaError_t tandem_cuda_err_ = (call);                                               \
    if (tandem_cuda_err_ != cudaSuccess)                                                 \
      return ::tandem::CudaErrorStatus(tandem_cuda_err_, #call, __FILE__, __LINE__);     \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(call)                                                     \
  do {                                                                                   \
    cublasStatus_t tandem_cublas_err_ = (call);                                          \
    if (tandem_cublas_err_ != CUBLAS_STATUS_SUCCESS)                                     \
      return ::tandem::CublasErrorStatus(tandem_cublas_err_, #call, __FILE__, __LINE__); \
  } while (0)

#endif  // TANDEM_RUNTIME_CUDA_STATUS_H_
