// The dense peak arithmetic rate of a GPU, from its name and compute capability, for the
// model FLOPs utilization (MFU) a run reports: 6 x matmul parameters x tokens/s over the peak
// of the dtype the matmuls run in. The figures are the vendors' datasheet peaks without
// structured sparsity; a GPU not in the table, or whose name and compute capability do not
// agree with its entry, has an unknown peak.
#ifndef TANDEM_RUNTIME_DEVICE_PEAK_H_
#define TANDEM_RUNTIME_DEVICE_PEAK_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "runtime/dtype.h"

namespace tandem {

struct DevicePeak {
  const char* model;  // "H100 SXM"
  double bf16_tflops;  // tensor cores, dense; 0: the GPU has no such tensor-core path
  double f16_tflops;
  double f32_tflops;   // plain FP32 (no TF32)
  // The peak for matmuls computing in `dtype`; 0 where the GPU has none.
  double TflopsFor(DType dtype) const;
};

// The entry for the GPU cudaGetDeviceProperties calls `name` ("NVIDIA H100 80GB HBM3") with
// compute capability major.minor, or nothing when unknown.
std::optional<DevicePeak> FindDevicePeak(absl::string_view name, int major, int minor);

// "MFU 41.2% (6 x 85M matmul parameters x tokens/s over 989 TFLOP/s, the dense bf16 peak of
// an H100 SXM)", or "MFU unknown: no peak known for <name> (compute capability 8.9) in bf16".
std::string DescribeMfu(double matmul_params, double tokens_per_second, DType dtype,
                        absl::string_view name, int major, int minor);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DEVICE_PEAK_H_
