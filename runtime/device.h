// Where a tensor lives and work runs: the CPU, or CUDA device i.
#ifndef TANDEM_RUNTIME_DEVICE_H_
#define TANDEM_RUNTIME_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

enum class DeviceType { kCpu, kCuda };

class Device {
 public:
  static Device Cpu() { return Device(DeviceType::kCpu, 0); }
  static Device Cuda(int index) { return Device(DeviceType::kCuda, index); }

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == DeviceType::kCpu; }
  bool is_cuda() const { return type_ == DeviceType::kCuda; }
  // "cpu" or "cuda:1".
  std::string ToString() const;

  bool operator==(const Device& o) const { return type_ == o.type_ && index_ == o.index_; }
  bool operator!=(const Device& o) const { return !(*this == o); }

 private:
  Device(DeviceType t, int i) : type_(t), index_(i) {}
  DeviceType type_;
  int index_;
};

// True when this binary was built with the CUDA backend.
bool BuiltWithCuda();

// Number of usable CUDA devices; 0 when built without CUDA, when no driver is installed,
// or when the driver is older than the runtime. `why_none`, if given, receives the reason
// when the answer is 0 (for the one-line notice a program prints before falling back).
int CudaDeviceCount(std::string* why_none = nullptr);

// Parses "cpu", "cuda" (device 0) or "cuda:N".
absl::StatusOr<Device> ParseDevice(absl::string_view text);

// Makes `d` the calling thread's current device (a no-op for the CPU).
absl::Status SetCurrentDevice(Device d);

// Bytes that can still be allocated on `d`, or -1 when unknown. The CPU: MemAvailable of
// /proc/meminfo, or less where a cgroup (a container, a batch job) limits this process;
// CUDA: the device's free memory (cudaMemGetInfo).
int64_t AvailableMemoryBytes(Device d);

namespace internal {
// What the memory cgroups of this process still let it allocate, or -1 when none limits it:
// the tightest of its cgroup (named in `cgroup_file`, /proc/self/cgroup) and those above it,
// in the hierarchy mounted at `root` (/sys/fs/cgroup; v1's memory controller under
// root/memory), counting their file cache as free.
int64_t CgroupHeadroom(const std::string& cgroup_file, const std::string& root);
}  // namespace internal

// The total memory of CUDA device `index` in bytes (a query that creates no context), or -1
// when unknown.
int64_t CudaDeviceTotalMemory(int index);

// The name and compute capability of CUDA device `index` (cudaGetDeviceProperties: "NVIDIA
// H100 80GB HBM3", 9, 0); false when unknown.
bool CudaDeviceIdentity(int index, std::string* name, int* major, int* minor);

// Unavailable: "<d> requested but this build has no CUDA backend".
absl::Status NoCudaBackendError(Device d);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DEVICE_H_
