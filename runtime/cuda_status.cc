#include "runtime/cuda_status.h"

#include "absl/strings/str_format.h"

namespace tandem {

absl::Status CudaErrorStatus(cudaError_t e, const char* call, const char* file, int line) {
  const std::string msg = absl::StrFormat("%s:%d: %s failed: %s (%s)", file, line, call,
                                          cudaGetErrorString(e), cudaGetErrorName(e));
  return e == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(msg)
                                        : absl::InternalError(msg);
}

absl::Status CublasErrorStatus(cublasStatus_t e, const char* call, const char* file, int line) {
  return absl::InternalError(absl::StrFormat("%s:%d: %s failed: %s (%s)", file, line, call,
                                             cublasGetStatusString(e), cublasGetStatusName(e)));
}

}  // namespace tandem
