#include "model/trainer.h"

#include "gtest/gtest.h"
#include "model/test_configs.h"

namespace tandem {
namespace {

TEST(TrainerTest, LossFallsOnTheDefaultCorpus) {
  auto t = Trainer::Create(LearningConfig(40));
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<float> losses;
  ASSERT_TRUE((*t)->Run([&](const StepReport& r) { losses.push_back(r.loss); }).ok());
  EXPECT_NEAR(losses.front(), std::log(256.0f), 0.3f);  // uniform guess over bytes at start
  float tail = 0;
  for (int i = 30; i < 40; ++i) tail += losses[i] / 10;
  EXPECT_LT(tail, 3.5f);
}

TEST(TrainerTest, SameSeedSameBits) {
  TrainConfig c;
  c.model = *ModelPreset("mlp");
  c.model.n_layer = 2;
  c.model.d_model = 32;
  c.model.seq_len = 16;
  c.batch = 4;
  c.steps = 3;
  std::vector<float> a, b;
  ASSERT_TRUE((*Trainer::Create(c))->Run([&](const StepReport& r) { a.push_back(r.loss); }).ok());
  ASSERT_TRUE((*Trainer::Create(c))->Run([&](const StepReport& r) { b.push_back(r.loss); }).ok());
  EXPECT_EQ(a, b);
}

TEST(TrainerTest, LowPrecisionOnTheCpuIsRefused) {
  TrainConfig c;
  c.dtype = DType::kBF16;
  auto t = Trainer::Create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("the CPU computes in f32"), std::string::npos);
}

TEST(TrainerTest, MicroBatchesMustDivideTheBatch) {
  TrainConfig c;
  c.batch = 10;
  c.micro_batches = 4;
  auto t = Trainer::Create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("--micro-batches=4 must divide --batch=10"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
