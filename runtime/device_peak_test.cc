// The peak table against the vendors' datasheets (dense, no sparsity), and MFU's arithmetic.
#include "runtime/device_peak.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

TEST(DevicePeak, KnownGpusByNameAndComputeCapability) {
  // cudaGetDeviceProperties' names of these GPUs.
  std::optional<DevicePeak> p = FindDevicePeak("NVIDIA H200", 9, 0);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->TflopsFor(DType::kBF16), 989);  // 1979 with sparsity
  EXPECT_EQ(p->TflopsFor(DType::kF32), 67);
  p = FindDevicePeak("NVIDIA H100 PCIe", 9, 0);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->TflopsFor(DType::kBF16), 756);
  p = FindDevicePeak("NVIDIA H100 80GB HBM3", 9, 0);
  ASSERT_TRUE(p.has_value());
  EXPECT_STREQ(p->model, "H100 SXM");
  p = FindDevicePeak("NVIDIA A100-SXM4-80GB", 8, 0);  // not the A10 its name contains
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->TflopsFor(DType::kF16), 312);
  EXPECT_EQ(p->TflopsFor(DType::kF32), 19.5);
  p = FindDevicePeak("NVIDIA L40S", 8, 9);  // not the L4
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->TflopsFor(DType::kBF16), 362);
  p = FindDevicePeak("NVIDIA L4", 8, 9);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->TflopsFor(DType::kBF16), 121);
  p = FindDevicePeak("NVIDIA GH200 480GB", 9, 0);  // not the H200
  ASSERT_TRUE(p.has_value());
  EXPECT_STREQ(p->model, "GH200");
  p = FindDevicePeak("Tesla V100-SXM2-16GB", 7, 0);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->TflopsFor(DType::kBF16), 0);  // no bf16 tensor cores
}

TEST(DevicePeak, UnknownGpusAndMismatchesHaveNoPeak) {
  EXPECT_FALSE(FindDevicePeak("NVIDIA GeForce RTX 4090", 8, 9).has_value());
  EXPECT_FALSE(FindDevicePeak("NVIDIA H100 80GB HBM3", 8, 0).has_value());  // name and sm disagree
  EXPECT_FALSE(FindDevicePeak("", 0, 0).has_value());
  // Names that hold a known one inside a longer word.
  EXPECT_FALSE(FindDevicePeak("NVIDIA T400", 7, 5).has_value());
  EXPECT_FALSE(FindDevicePeak("Tesla V100S-PCIE-32GB", 7, 0).has_value());
}

TEST(DevicePeak, Mfu) {
  // 85M matmul parameters at 1e5 tokens/s: 6 x 85e6 x 1e5 = 51 TFLOP/s of 989: 5.2%.
  EXPECT_EQ(DescribeMfu(85e6, 1e5, DType::kBF16, "NVIDIA H200", 9, 0),
            "MFU 5.2% (6 x 85000000 matmul parameters x tokens/s over 989 TFLOP/s, the dense "
            "bf16 peak of the H200 SXM)");
  EXPECT_THAT(DescribeMfu(85e6, 1e5, DType::kBF16, "NVIDIA GeForce RTX 4090", 8, 9),
              HasSubstr("MFU unknown: no bf16 peak known for NVIDIA GeForce RTX 4090 (compute "
                        "capability 8.9)"));
  EXPECT_THAT(DescribeMfu(85e6, 1e5, DType::kBF16, "Tesla T4", 7, 5), HasSubstr("MFU unknown"));
}

}  // namespace
}  // namespace tandem
