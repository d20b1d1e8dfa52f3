#include "model/trainer.h"

#include <cmath>
#include <limits>
#include <optional>
#include <utility>

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

// --val-fraction: training never draws a held-out sample, validation takes exactly them, in
// order; the validation loss is the mean token loss of the held-out tail's first batches,
// computed here through the training forward on those samples by index; evaluating changes no
// training bit.
TEST(TrainerTest, ValidationOnAHeldOutTail) {
  TrainConfig c = SmallMlp(5);
  c.val_fraction = 0.25;
  c.eval_every = 2;
  c.eval_batches = 3;
  absl::StatusOr<TokenDataset> loaded = LoadDataset(c);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const TokenDataset& data = *loaded;
  const int64_t n = data.num_samples();
  const int64_t kept = TrainingSamples(c, data);
  EXPECT_EQ(kept, n - static_cast<int64_t>(0.25 * n));
  const DataOrder train(kept, c.seed);
  for (int64_t p = 0; p < 3 * n; ++p) ASSERT_LT(train.SampleAt(p), kept) << p;
  absl::StatusOr<std::optional<ValidationSet>> got = LoadValidation(c, data);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  const ValidationSet* val = &**got;
  EXPECT_EQ(val->num_samples, n - kept);
  EXPECT_EQ(val->batches, 3);
  for (int64_t p = 0; p < 12; ++p) EXPECT_EQ(val->order.SampleAt(p), kept + p);

  std::vector<float> losses, plain;
  std::vector<std::pair<int, float>> vals;
  auto t = Trainer::Create(c);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Run([&](const StepReport& r) {
                 losses.push_back(r.loss);
                 if (r.val_loss) vals.push_back({r.step + 1, *r.val_loss});
               }).ok());
  TrainConfig no_eval = c;
  no_eval.eval_every = 0;
  ASSERT_TRUE((*Trainer::Create(no_eval))->Run([&](const StepReport& r) {
                 plain.push_back(r.loss);
                 EXPECT_FALSE(r.val_loss.has_value());
               }).ok());
  EXPECT_EQ(losses, plain);  // bit for bit
  ASSERT_EQ(vals.size(), 3u);  // after steps 2, 4 and the last, 5
  EXPECT_EQ(vals[0].first, 2);
  EXPECT_EQ(vals[2].first, 5);
  // The final weights' loss on samples kept .. kept + 12, by the training forward.
  Stage& st = const_cast<Stage&>((*t)->stage());
  Stream& s = **Stream::Compute(Device::Cpu());
  double sum = 0;
  const DataOrder in_order = DataOrder::InOrder(kept, n - kept);
  for (int b = 0; b < 3; ++b) {
    absl::StatusOr<MicroBatch> mb = MakeMicroBatch(data, in_order, b * c.batch, 0, c.batch,
                                                   c.model.seq_len, Device::Cpu(), 1.0f);
    ASSERT_TRUE(mb.ok()) << mb.status();
    Tensor l;
    ASSERT_TRUE(st.Forward(s, 100, *mb, Tensor(), &l).ok());
    st.DropActivations();
    const std::vector<float> values = *l.ToFloatVector();
    for (float v : values) sum += v;
  }
  const double want = sum / (3 * c.batch * c.model.seq_len);
  EXPECT_NEAR(vals[2].second, want, 1e-5 * want);
  EXPECT_NE(vals[0].second, vals[2].second);
}

// The validation settings refused before training, each saying what to change.
TEST(TrainerTest, ValidationSettings) {
  auto refused = [](const TrainConfig& c, const std::string& words) {
    const absl::Status s = Trainer::Create(c).status();
    EXPECT_NE(s.message().find(words), absl::string_view::npos) << s;
  };
  TrainConfig c = SmallMlp(2);
  c.eval_every = 1;
  refused(c, "--eval-every=1 without validation data");
  c.val_fraction = 1.5;
  refused(c, "--val-fraction=1.5: must be above 0 and below 1");
  c.val_fraction = 0.1;
  c.val_data = "/nonexistent/val.bin";
  refused(c, "give one");
  c.val_fraction = 0;
  refused(c, "/nonexistent/val.bin");
  // A held-out tail smaller than one batch.
  c.val_data.clear();
  c.val_fraction = 1e-6;
  refused(c, "fewer than one batch (--batch=4)");
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
