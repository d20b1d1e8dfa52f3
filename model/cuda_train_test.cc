// Training on a CUDA device: the same model and batch in f32 on the GPU, f32 on the CPU, and
// mixed precision (bf16, and f16 with the dynamic loss scaler) on the GPU; and the memory
// check, a step's peak on the GPU's allocator against the estimate; and the backward split
// in two (input, then weight gradients) against the CPU's. Skips with the reason where no GPU
// is visible.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "model/data.h"
#include "model/memory_testing.h"
#include "model/stage.h"
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

// Backward split in two (BackwardInput of two micro-batches, then BackwardWeights of both) on
// the GPU gives the CPU's whole Backwards up to rounding (the CUDA kernels accumulate
// parameter gradients with atomics): the input gradient of a middle stage and every
// parameter's gradient, for the GPT with standard and flash attention and the MLP.
TEST_F(CudaTrainTest, BackwardSplitMatchesTheCpu) {
  ModelConfig flash = TwoLayerModel("gpt", 64, 2, 32, 128);
  flash.attention = Attention::kFlash;
  for (const ModelConfig& c :
       {TwoLayerModel("gpt", 64, 2, 32, 128), flash, TwoLayerModel("mlp", 64, 2, 32, 128)}) {
    SCOPED_TRACE(c.ToString());
    const int n = c.num_blocks();
    auto data = TokenDataset::Synthetic(4096, c.seq_len, c.vocab, 5);
    DataOrder order(data.num_samples(), 5);
    std::vector<float> grads[2], dx[2];
    for (int gpu = 0; gpu < 2; ++gpu) {
      const Device d = gpu ? Device::Cuda(0) : Device::Cpu();
      Stream& s = **Stream::Compute(d);
      // Blocks [1, n): the embedding's output comes in, its gradient goes out.
      auto st = *Stage::Create(c, 1, n, d, 7);
      std::vector<MicroBatch> mbs;
      Tensor y, g;
      for (int m = 0; m < 2; ++m) {
        mbs.push_back(
            *MakeMicroBatch(data, order, 0, 4 * m, 4, c.seq_len, d, 1.0f / (8 * c.seq_len)));
        std::vector<float> values(4 * c.seq_len * c.d_model);
        for (size_t i = 0; i < values.size(); ++i) values[i] = ((i * 37 + m) % 17) / 8.0f - 1.0f;
        const Tensor x = *Tensor::FromVector(values, {4, c.seq_len, c.d_model}, d);
        ASSERT_TRUE(st->Forward(s, m, mbs[m], x, &y).ok());
      }
      for (int m = 0; m < 2; ++m) {
        ASSERT_TRUE((gpu ? st->BackwardInput(s, m, mbs[m], Tensor(), &g)
                         : st->Backward(s, m, mbs[m], Tensor(), &g))
                        .ok());
        std::vector<float> v = *g.ToFloatVector();
        dx[gpu].insert(dx[gpu].end(), v.begin(), v.end());
      }
      for (int m = 0; gpu && m < 2; ++m) ASSERT_TRUE(st->BackwardWeights(s, m, mbs[m]).ok());
      ASSERT_TRUE(s.Synchronize().ok());
      grads[gpu] = *st->grads().flat().ToFloatVector();
    }
    for (const auto* v : {&grads, &dx}) {
      const std::vector<float>& cpu = (*v)[0];
      const std::vector<float>& gpu = (*v)[1];
      ASSERT_EQ(cpu.size(), gpu.size());
      float scale = 0;
      for (float f : cpu) scale = std::max(scale, std::fabs(f));
      ASSERT_GT(scale, 0.0f);
      for (size_t i = 0; i < cpu.size(); ++i) {
        ASSERT_NEAR(gpu[i], cpu[i], 1e-4f * scale + 1e-3f * std::fabs(cpu[i])) << i;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
