#include "runtime/device.h"

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
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

namespace {

// The first whitespace-separated number in `path` (after `key`, when given), or -1.
int64_t ReadNumber(const char* path, absl::string_view key = "") {
  std::ifstream in(path);
  std::string word;
  while (in >> word) {
    if (!key.empty() && word != key) continue;
    if (!key.empty() && !(in >> word)) return -1;
    int64_t v;
    return absl::SimpleAtoi(word, &v) ? v : -1;
  }
  return -1;
}

}  // namespace

namespace internal {

int64_t CgroupHeadroom(const std::string& cgroup_file, const std::string& root) {
  // "hierarchy-id:controllers:path" lines: cgroup v1 names the memory controller; v2 has the
  // one line "0::path".
  std::ifstream in(cgroup_file);
  std::string line, v1, v2;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) v2 = path;
    for (absl::string_view c : absl::StrSplit(controllers, ',')) {
      if (c == "memory") v1 = path;
    }
  }
  if (v1.empty() && v2.empty()) return -1;
  const bool is_v1 = !v1.empty();
  const std::string base = is_v1 ? root + "/memory" : root;
  // The tightest of this cgroup and every one above it, counting file cache as free (the
  // kernel reclaims it before it fails an allocation); v1 says "no limit" with a huge
  // number, v2 with "max".
  int64_t headroom = -1;
  for (std::string p = is_v1 ? v1 : v2;;) {
    const std::string dir = base + (p == "/" ? "" : p);
    const int64_t limit =
        ReadNumber((dir + (is_v1 ? "/memory.limit_in_bytes" : "/memory.max")).c_str());
    const int64_t usage =
        ReadNumber((dir + (is_v1 ? "/memory.usage_in_bytes" : "/memory.current")).c_str());
    const int64_t cache =
        ReadNumber((dir + "/memory.stat").c_str(), is_v1 ? "total_cache" : "file");
    if (limit >= 0 && limit < (int64_t{1} << 60) && usage >= 0) {
      const int64_t h = std::max<int64_t>(0, limit - usage + std::max<int64_t>(0, cache));
      headroom = headroom < 0 ? h : std::min(headroom, h);
    }
    if (p == "/" || p.empty()) break;
    const size_t slash = p.rfind('/');
    p = slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash);
  }
  return headroom;
}

}  // namespace internal

int64_t AvailableMemoryBytes(Device d) {
  if (d.is_cpu()) {
    const int64_t kb = ReadNumber("/proc/meminfo", "MemAvailable:");
    const int64_t host = kb < 0 ? -1 : kb * 1024;
    const int64_t cgroup = internal::CgroupHeadroom("/proc/self/cgroup", "/sys/fs/cgroup");
    if (host < 0 || cgroup < 0) return std::max(host, cgroup);
    return std::min(host, cgroup);
  }
#if TANDEM_CUDA
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(d.index()) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  size_t free_bytes = 0, total = 0;
  const bool ok = cudaMemGetInfo(&free_bytes, &total) == cudaSuccess;
  if (!ok) cudaGetLastError();
  // Back to the caller's device only if it differs: setting a device starts its context.
  if (previous != d.index()) cudaSetDevice(previous);
  return ok ? static_cast<int64_t>(free_bytes) : -1;
#else
  return -1;
#endif
}

int64_t CudaDeviceTotalMemory(int index) {
#if TANDEM_CUDA
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return static_cast<int64_t>(p.totalGlobalMem);
#else
  (void)index;
  return -1;
#endif
}

bool CudaDeviceIdentity(int index, std::string* name, int* major, int* minor) {
#if TANDEM_CUDA
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  *name = p.name;
  *major = p.major;
  *minor = p.minor;
  return true;
#else
  (void)index, (void)name, (void)major, (void)minor;
  return false;
#endif
}

absl::Status NoCudaBackendError(Device d) {
  return absl::UnavailableError(
      absl::StrCat(d.ToString(), " requested but this build has no CUDA backend"));
}

}  // namespace tandem
