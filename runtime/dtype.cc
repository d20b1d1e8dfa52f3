#include "runtime/dtype.h"

#include <cstring>

#include "absl/strings/str_format.h"

namespace tandem {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    if (name == DTypeName(t)) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown dtype '%s': use f32, bf16 or f16", name));
}

uint16_t FloatToBf16(float f) {
  uint32_t u = Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet nan
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

float Bf16ToFloat(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

// After F. Giesen's float_to_half_fast3_rtne: exact round-to-nearest-even, subnormals
// through a float addition that lets the FPU do the rounding.
uint16_t FloatToHalf(float f) {
  uint32_t x = Bits(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint16_t out;
  if (x >= (127u + 16u) << 23) {  // >= 65536, inf or nan
    out = x > (255u << 23) ? 0x7e00 : 0x7c00;
  } else if (x < (113u << 23)) {  // below the smallest normal half: subnormal or zero
    const uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    out = static_cast<uint16_t>(Bits(FromBits(x) + FromBits(magic)) - magic);
  } else {
    const uint32_t mant_odd = (x >> 13) & 1u;
    x += ((15u - 127u) << 23) + 0xfffu;
    x += mant_odd;
    out = static_cast<uint16_t>(x >> 13);
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;  // mant * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return FromBits(sign | 0x7f800000u | (mant << 13));
  return FromBits(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace tandem
