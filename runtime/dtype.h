// Element types and the host-side conversions between f32 and the 16-bit formats.
// bf16 and f16 are stored as raw uint16_t bits; conversions round to nearest even and keep
// inf and nan (a nan stays a nan), matching CUDA's __float2bfloat16_rn / __float2half_rn.
#ifndef TANDEM_RUNTIME_DTYPE_H_
#define TANDEM_RUNTIME_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32 };

// Bytes per element.
size_t DTypeSize(DType t);
// "f32", "bf16", "f16", "i32".
const char* DTypeName(DType t);
// Parses a name as DTypeName prints it; the error lists the accepted names.
absl::StatusOr<DType> ParseDType(absl::string_view name);

uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DTYPE_H_
