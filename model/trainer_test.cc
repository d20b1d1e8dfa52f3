#include "model/trainer.h"

#include <memory>

#include "gtest/gtest.h"
#include "model/test_configs.h"
#include "runtime/allocator.h"

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

// System memory with nothing to give, so the allocator reports out of memory.
class NoMemory : public SystemMemory {
 public:
  absl::StatusOr<void*> Allocate(size_t) override { return nullptr; }
  void Free(void*, size_t) override {}
  Device device() const override { return Device::Cpu(); }
  std::string name() const override { return "none"; }
};

TEST(TrainerTest, OutOfMemorySaysWhatNeedsLess) {
  CachingAllocator allocator(std::make_unique<NoMemory>(), {});
  const absl::Status oom = allocator.Allocate(1 << 20).status();
  ASSERT_EQ(oom.code(), absl::StatusCode::kResourceExhausted) << oom;

  const absl::Status launcher = ExplainOutOfMemory(oom, '-');
  EXPECT_EQ(launcher.code(), absl::StatusCode::kResourceExhausted);
  const std::string m(launcher.message());
  EXPECT_EQ(m.rfind(std::string(oom.message()), 0), 0u) << m;  // the allocator's words first
  for (const char* flag : {"--batch", "--seq-len", "--micro-batches", "--attention=flash"}) {
    EXPECT_NE(m.find(flag), std::string::npos) << flag << " in: " << m;
  }
  const std::string train(ExplainOutOfMemory(oom, '_').message());
  EXPECT_NE(train.find("--seq_len"), std::string::npos) << train;
  EXPECT_NE(train.find("--micro_batches"), std::string::npos) << train;

  // Other failures, a refused oversized coordinator message among them, pass unchanged.
  const absl::Status big = absl::ResourceExhaustedError("message of 3 MB over the 2 MB limit");
  EXPECT_EQ(ExplainOutOfMemory(big, '-'), big);
  const absl::Status other = absl::InternalError("out of memory? no: a kernel failed");
  EXPECT_EQ(ExplainOutOfMemory(other, '-'), other);
  EXPECT_TRUE(ExplainOutOfMemory(absl::OkStatus(), '-').ok());
}

}  // namespace
}  // namespace tandem
