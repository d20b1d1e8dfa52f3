// Training on a CUDA device: the same model and batch in f32 on the GPU, f32 on the CPU, and
// mixed precision (bf16, and f16 with the dynamic loss scaler) on the GPU; and the memory
// check, a step's peak on the GPU's allocator against the estimate. Skips with the reason
// where no GPU is visible.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "model/memory_testing.h"
#include "model/test_configs.h"
#include "model/trainer.h"

namespace tandem {
namespace {

TrainConfig Small(Device d, DType t) {
  TrainConfig c = LearningConfig(30);
  c.device = d;
  c.dtype = t;
  return c;
}

std::vector<float> Losses(const TrainConfig& c) {
  auto t = Trainer::Create(c);
  EXPECT_TRUE(t.ok()) << t.status();
  std::vector<float> out;
  if (!t.ok()) return out;
  absl::Status s = (*t)->Run([&](const StepReport& r) { out.push_back(r.loss); });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

class CudaTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

TEST_F(CudaTrainTest, F32MatchesTheCpu) {
  std::vector<float> cpu = Losses(Small(Device::Cpu(), DType::kF32));
  std::vector<float> gpu = Losses(Small(Device::Cuda(0), DType::kF32));
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-3 * cpu[i]) << i;
}

TEST_F(CudaTrainTest, MixedPrecisionTracksF32) {
  std::vector<float> f32 = Losses(Small(Device::Cuda(0), DType::kF32));
  for (DType t : {DType::kBF16, DType::kF16}) {
    std::vector<float> low = Losses(Small(Device::Cuda(0), t));
    ASSERT_EQ(low.size(), f32.size()) << DTypeName(t);
    EXPECT_NEAR(low.front(), f32.front(), 0.02 * f32.front()) << DTypeName(t);
    EXPECT_NEAR(low.back(), f32.back(), 0.05 * f32.back()) << DTypeName(t);
    EXPECT_LT(low.back(), low.front() - 0.5f) << DTypeName(t) << " did not learn";
  }
}

// Flash attention in bf16 with head size 32 (the tensor-core kernels) trains as standard
// attention does.
TEST_F(CudaTrainTest, FlashAttentionTracksStandard) {
  TrainConfig c = Small(Device::Cuda(0), DType::kBF16);
  c.model.n_head = 2;  // d_model 64: head size 32
  std::vector<float> standard = Losses(c);
  c.model.attention = Attention::kFlash;
  std::vector<float> flash = Losses(c);
  ASSERT_EQ(flash.size(), standard.size());
  EXPECT_NEAR(flash.front(), standard.front(), 0.01 * standard.front());
  EXPECT_NEAR(flash.back(), standard.back(), 0.05 * standard.back());
  EXPECT_LT(flash.back(), flash.front() - 0.5f) << "flash attention did not learn";
}

// The memory check on the GPU: a step's peak on the device's allocator against the estimate,
// as memory_test checks it on the CPU, with the CUDA ops' scratch: standard and flash attention
// in f32 and bf16 (head size 64: the tensor cores in bf16, the cuBLAS path in f32), the whole
// model and a middle stage, one micro-batch and two.
TEST_F(CudaTrainTest, PeakOfAStepMatchesTheEstimate) {
  ModelConfig c = TwoLayerModel("gpt", 128, 2, 64, 256);
  const int n = c.num_blocks();
  for (Attention a : {Attention::kStandard, Attention::kFlash}) {
    c.attention = a;
    for (DType t : {DType::kF32, DType::kBF16}) {
      for (const auto& [begin, end] : std::vector<std::pair<int, int>>{{0, n}, {1, 3}}) {
        for (int M : {1, 2}) {
          SCOPED_TRACE(std::string(AttentionName(a)) + " " + DTypeName(t) + " blocks " +
                       std::to_string(begin) + " to " + std::to_string(end) + ", " +
                       std::to_string(M) + " micro-batches");
          ExpectPeakOfAStepMatchesTheEstimate(c, begin, end, /*B=*/8, M, Device::Cuda(0), t);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem
