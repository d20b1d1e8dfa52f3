#include "runtime/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace tandem {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DTypeTest, SizesNamesAndParsing) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(*ParseDType("bf16"), DType::kBF16);
  auto bad = ParseDType("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fp8"), std::string::npos);
  EXPECT_NE(bad.status().message().find("f32, bf16 or f16"), std::string::npos);
}

TEST(DTypeTest, Bf16ExactValuesRoundTrip) {
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 3.0f, 1024.0f, 0.15625f}) {
    EXPECT_EQ(Bf16ToFloat(FloatToBf16(v)), v);
  }
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 and the next bf16 (1 + 2^-7): ties go to even (1).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8))),
            1.0f + std::ldexp(1.0f, -6));
  // Just above the halfway point rounds up.
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808001u)), 0x3f81);
  // Just below rounds down.
  EXPECT_EQ(FloatToBf16(FromBits(0x3f807fffu)), 0x3f80);
}

TEST(DTypeTest, Bf16InfNanAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(inf)), inf);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-inf)), -inf);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  // A nan whose payload lives only in the low bits must not become inf.
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(0x7f800001u)))));
  // The largest float rounds up past the largest bf16: inf.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::max())), inf);
}

TEST(DTypeTest, HalfExactValuesRoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, -65504.0f, 6.103515625e-05f /* min normal */,
                  5.9604644775390625e-08f /* min subnormal */}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(v)), v) << v;
  }
  // -0 keeps its sign.
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
}

TEST(DTypeTest, HalfRoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1).
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11))),
            1.0f + std::ldexp(1.0f, -9));
  // Half the smallest subnormal is a tie between 0 and it: rounds to 0 (even).
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  // 1.5x the smallest subnormal is a tie between 1 and 2 units: rounds to 2 (even).
  EXPECT_EQ(FloatToHalf(1.5f * std::ldexp(1.0f, -24)), 0x0002);
}

TEST(DTypeTest, HalfInfNanAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(inf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-inf), 0xfc00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);  // below the halfway point to 65536: max half
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // the halfway point: ties to even, which is inf
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);
  EXPECT_EQ(HalfToFloat(0x7c00), inf);
}

// Every half value converts to float and back to the same bits (nans stay nans).
TEST(DTypeTest, HalfAllValuesRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
    }
  }
}

// Random floats: the half result is the nearest representable value (checked by
// comparing against both neighbours), so rounding is right away from the special cases.
TEST(DTypeTest, HalfIsNearest) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  for (int i = 0; i < 20000; ++i) {
    const float v = dist(rng) * std::ldexp(1.0f, -(i % 30));
    const uint16_t h = FloatToHalf(v);
    const float r = HalfToFloat(h);
    if (std::isinf(r)) {
      EXPECT_GE(std::fabs(v), 65520.0f);
      continue;
    }
    for (int delta : {-1, 1}) {
      const float n = HalfToFloat(static_cast<uint16_t>(h + delta));
      if (std::isnan(n) || std::isinf(n) || (h & 0x7fff) == 0) continue;
      EXPECT_LE(std::fabs(r - v), std::fabs(n - v)) << v;
    }
  }
}

}  // namespace
}  // namespace tandem
