#include "runtime/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "runtime/status.h"

#if TANDEM_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_status.h"
#endif

namespace tandem {

std::string Device::ToString() const {
  return is_cpu() ? "cpu" : absl::StrCat("cuda:", index_);
}

bool BuiltWithCuda() { return TANDEM_CUDA != 0; }

int CudaDeviceCount(std::string* why_none) {
#if TANDEM_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why_none) *why_none = cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky error so later calls are not blamed
    return 0;
  }
  if (n == 0 && why_none) *why_none = "no CUDA device visible";
  return n;
#else
  if (why_none) *why_none = "this build has no CUDA backend (CUDA was not found at build time)";
  return 0;
#endif
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  if (text == "cpu") return Device::Cpu();
  if (text == "cuda") return Device::Cuda(0);
  int index;
  if (absl::StartsWith(text, "cuda:") && absl::SimpleAtoi(text.substr(5), &index) && index >= 0) {
    return Device::Cuda(index);
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown device '%s': use cpu, cuda or cuda:N", text));
}

absl::Status SetCurrentDevice(Device d) {
  if (d.is_cpu()) return absl::OkStatus();
#if TANDEM_CUDA
  CUDA_RETURN_IF_ERROR(cudaSetDevice(d.index()));
  return absl::OkStatus();
#else
  return NoCudaBackendError(d);
#endif
}

absl::Status NoCudaBackendError(Device d) {
  return absl::UnavailableError(
      absl::StrCat(d.ToString(), " requested but this build has no CUDA backend"));
}

}  // namespace tandem
