#include "model/trainer.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

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

// A small MLP's training, `steps` steps of batch 4.
TrainConfig SmallMlp(int steps) {
  TrainConfig c;
  c.model = *ModelPreset("mlp");
  c.model.n_layer = 2;
  c.model.d_model = 32;
  c.model.seq_len = 16;
  c.batch = 4;
  c.steps = steps;
  return c;
}

TEST(TrainerTest, SameSeedSameBits) {
  const TrainConfig c = SmallMlp(3);
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

TEST(TrainerTest, ADivergedRunStopsWithTheStepAndTheFix) {
  TrainConfig c = SmallMlp(10);
  c.optimizer.lr = 1e10f;  // the first update makes every weight huge
  c.optimizer.warmup_steps = 0;
  c.optimizer.clip_norm = 0;
  std::vector<float> losses;
  const absl::Status s =
      (*Trainer::Create(c))->Run([&](const StepReport& r) { losses.push_back(r.loss); });
  ASSERT_FALSE(s.ok());
  ASSERT_GE(losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(losses.front()));
  EXPECT_FALSE(std::isfinite(losses.back()));
  EXPECT_NE(s.message().find(absl::StrCat("step ", losses.size(), ": the loss is ")),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("training diverged"), std::string::npos);
  EXPECT_NE(s.message().find("lower --lr"), std::string::npos);
}

TEST(TrainerTest, OnlyF16sLossScalerSkipsANonFiniteStepAndGoesOn) {
  StepReport r;
  r.step = 4;
  r.loss = std::numeric_limits<float>::infinity();
  r.skipped = true;
  EXPECT_TRUE(CheckNotDiverged(r, DType::kF16).ok());
  EXPECT_EQ(CheckNotDiverged(r, DType::kBF16).message(),
            "step 5: the loss is infinite: training diverged (learning rate 0); lower --lr and "
            "start again, or resume from a checkpoint older than step 4");
  r.loss_scale = kMinLossScale / 2;  // some 40 skips in a row: no recovering
  EXPECT_NE(CheckNotDiverged(r, DType::kF16)
                .message()
                .find("the loss scale fell to 2.98023e-08, every step skipped: training diverged"),
            std::string::npos);
  r.loss_scale = 1;
  r.skipped = false;
  EXPECT_FALSE(CheckNotDiverged(r, DType::kF16).ok());
  r.loss = 2;
  EXPECT_TRUE(CheckNotDiverged(r, DType::kF32).ok());
}

}  // namespace
}  // namespace tandem
