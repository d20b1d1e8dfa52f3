#include "runtime/device_peak.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace tandem {
namespace {

struct Entry {
  const char* name_has;  // a part of the CUDA device name (first match wins: specific first)
  int major, minor;      // the compute capability it must have
  DevicePeak peak;
};

// Dense (no sparsity) datasheet peaks in TFLOP/s: bf16, f16 on tensor cores; plain FP32.
constexpr Entry kPeaks[] = {
    {"GH200", 9, 0, {"GH200", 989, 989, 67}},
    {"H200 NVL", 9, 0, {"H200 NVL", 835, 835, 60}},
    {"H200", 9, 0, {"H200 SXM", 989, 989, 67}},
    {"H100 NVL", 9, 0, {"H100 NVL", 835, 835, 60}},
    {"H100 PCIe", 9, 0, {"H100 PCIe", 756, 756, 51}},
    {"H100", 9, 0, {"H100 SXM", 989, 989, 67}},
    {"A100", 8, 0, {"A100", 312, 312, 19.5}},
    {"A30", 8, 0, {"A30", 165, 165, 10.3}},
    {"L40S", 8, 9, {"L40S", 362, 362, 91.6}},
    {"L40", 8, 9, {"L40", 181, 181, 90.5}},
    {"L4", 8, 9, {"L4", 121, 121, 30.3}},
    {"A10G", 8, 6, {"A10G", 0, 0, 0}},  // no public dense peak: unknown rather than A10's
    {"A10", 8, 6, {"A10", 125, 125, 31.2}},
    {"V100-PCIE", 7, 0, {"V100 PCIe", 0, 112, 14}},
    {"V100", 7, 0, {"V100 SXM2", 0, 125, 15.7}},
    {"T4", 7, 5, {"T4", 0, 65, 8.1}},
};

// Whether `word` stands in `name` as a whole word: not inside a longer one ("T4" is not in
// "T400", "H200" not in "GH200", "V100" not in "V100S").
bool HasWord(absl::string_view name, absl::string_view word) {
  for (size_t at = name.find(word); at != absl::string_view::npos;
       at = name.find(word, at + 1)) {
    const size_t end = at + word.size();
    if ((at == 0 || !absl::ascii_isalnum(name[at - 1])) &&
        (end == name.size() || !absl::ascii_isalnum(name[end]))) {
      return true;
    }
  }
  return false;
}

}  // namespace

double DevicePeak::TflopsFor(DType dtype) const {
  switch (dtype) {
    case DType::kBF16: return bf16_tflops;
    case DType::kF16: return f16_tflops;
    default: return f32_tflops;
  }
}

std::optional<DevicePeak> FindDevicePeak(absl::string_view name, int major, int minor) {
  for (const Entry& e : kPeaks) {
    if (!HasWord(name, e.name_has)) continue;
    if (e.major != major || e.minor != minor) return std::nullopt;
    return e.peak;
  }
  return std::nullopt;
}

std::string DescribeMfu(double matmul_params, double tokens_per_second, DType dtype,
                        absl::string_view name, int major, int minor) {
  const std::optional<DevicePeak> peak = FindDevicePeak(name, major, minor);
  const double tflops = peak ? peak->TflopsFor(dtype) : 0;
  if (tflops <= 0) {
    return absl::StrFormat("MFU unknown: no %s peak known for %s (compute capability %d.%d)",
                           DTypeName(dtype), name, major, minor);
  }
  return absl::StrFormat(
      "MFU %.1f%% (6 x %.0f matmul parameters x tokens/s over %g TFLOP/s, the dense %s peak of "
      "the %s)",
      100.0 * 6 * matmul_params * tokens_per_second / (tflops * 1e12), matmul_params, tflops,
      DTypeName(dtype), peak->model);
}

}  // namespace tandem
