#include "model/checkpoint.h"

#include <fstream>

#include "gtest/gtest.h"
#include "model/test_configs.h"
#include "model/trainer.h"
#include "runtime/test_files.h"

namespace tandem {
namespace {

CheckpointData Sample() {
  CheckpointData d;
  d.arrays.emplace_back("params", std::vector<float>{1.5f, -2.0f, 3.25f});
  d.arrays.emplace_back("empty", std::vector<float>{});
  d.meta["step"] = "42";
  d.meta["model"] = "gpt-tiny: x";
  return d;
}

void Spit(const std::string& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

TEST(CheckpointTest, RoundTrip) {
  const std::string path = FreshTestPath("rt.ckpt");
  ASSERT_TRUE(WriteCheckpoint(path, Sample()).ok());
  auto d = ReadCheckpoint(path);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(**d->Array("params"), (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_TRUE((*d->Array("empty"))->empty());
  EXPECT_EQ(*d->Meta("step"), "42");
  EXPECT_EQ(*d->Meta("model"), "gpt-tiny: x");
  EXPECT_FALSE(d->Meta("nope").ok());
  std::ifstream tmp(path + ".tmp");
  EXPECT_FALSE(tmp.good());  // the temporary file was renamed away
}

TEST(CheckpointTest, EveryTruncationIsRefused) {
  const std::string path = FreshTestPath("trunc.ckpt");
  ASSERT_TRUE(WriteCheckpoint(path, Sample()).ok());
  const std::string full = ReadAll(path);
  for (size_t len = 0; len < full.size(); ++len) {
    Spit(path, full.substr(0, len));
    auto d = ReadCheckpoint(path);
    ASSERT_FALSE(d.ok()) << "accepted a file cut to " << len << " bytes";
    EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  }
}

TEST(CheckpointTest, EveryBitFlipIsRefused) {
  const std::string path = FreshTestPath("flip.ckpt");
  ASSERT_TRUE(WriteCheckpoint(path, Sample()).ok());
  const std::string full = ReadAll(path);
  for (size_t i = 0; i < full.size(); ++i) {
    for (int bit : {0, 5}) {
      std::string bad = full;
      bad[i] ^= static_cast<char>(1 << bit);
      Spit(path, bad);
      auto d = ReadCheckpoint(path);
      ASSERT_FALSE(d.ok()) << "accepted a flip of bit " << bit << " of byte " << i;
      EXPECT_NE(d.status().message().find("was not loaded"), std::string::npos);
    }
  }
}

TEST(CheckpointTest, MissingFile) {
  auto d = ReadCheckpoint(FreshTestPath("never-written.ckpt"));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("cannot be opened"), std::string::npos);
}

// A run stopped after 3 steps and resumed from its checkpoint gives the uninterrupted run's
// losses and weights, bit for bit.
TEST(CheckpointTest, ResumeIsBitExact) {
  std::vector<float> straight, resumed;
  {
    auto t = *Trainer::Create(ResumableConfig());
    ASSERT_TRUE(t->Run([&](const StepReport& r) { straight.push_back(r.loss); }).ok());
  }
  const std::string path = FreshTestPath("resume.ckpt");
  {
    TrainConfig c = ResumableConfig();
    c.steps = 3;
    auto t = *Trainer::Create(c);
    ASSERT_TRUE(t->Run([&](const StepReport& r) { resumed.push_back(r.loss); }).ok());
    ASSERT_TRUE(t->SaveCheckpoint(path).ok());
  }
  TrainConfig c = ResumableConfig();
  c.resume = path;
  auto t = Trainer::Create(c);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->step(), 3);
  ASSERT_TRUE((*t)->Run([&](const StepReport& r) { resumed.push_back(r.loss); }).ok());
  ASSERT_EQ(straight.size(), resumed.size());
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(straight[i], resumed[i]) << i;
}

TEST(CheckpointTest, MismatchedModelIsRefusedBeforeLoading) {
  const std::string path = FreshTestPath("other.ckpt");
  {
    auto t = *Trainer::Create(ResumableConfig());
    ASSERT_TRUE(t->SaveCheckpoint(path).ok());
  }
  TrainConfig c = ResumableConfig();
  c.model.d_model = 64;
  c.resume = path;
  auto t = Trainer::Create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("is of model"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace tandem
