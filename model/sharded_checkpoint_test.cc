// Name-addressed checkpoints in one process: a whole-model checkpoint split into 4 stage
// shards, those loaded as 2 stages and as one, every value landing where its name says; a
// run continued from the round trip equal to the uninterrupted one bit for bit; the newest
// complete checkpoint found past an incomplete one; missing, corrupt and foreign shards
// refused with their names.
#include "model/sharded_checkpoint.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/test_configs.h"
#include "model/trainer.h"
#include "runtime/test_files.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// One stage with its own optimizer, as a pipeline rank holds it.
struct Part {
  std::unique_ptr<Stage> stage;
  Optimizer optimizer;
  LossScaler scaler{false};
  int step = 0;
};

Part MakePart(const TrainConfig& c, int begin, int end) {
  Part p;
  p.stage = *Stage::Create(c.model, begin, end, c.device, /*seed=*/999);  // not the trained
  p.optimizer = *Optimizer::Create(c.optimizer, p.stage->layout().numel(), c.device);
  return p;
}

// Every array of a file, by parameter name: name -> {params, m, v} values.
std::map<std::string, std::vector<std::vector<float>>> ByName(const std::string& path) {
  CheckpointData d = *ReadCheckpoint(path);
  std::map<std::string, std::vector<std::vector<float>>> out;
  const std::vector<ShardParam> layout = *ParseShardLayout(*d.Meta("layout"));
  for (const ShardParam& p : layout) {
    for (const char* a : {"params", "optimizer.0", "optimizer.1"}) {
      const std::vector<float>& v = **d.Array(a);
      out[p.name].emplace_back(v.begin() + p.offset, v.begin() + p.offset + p.numel);
    }
  }
  return out;
}

// Saves parts as the shards of one checkpoint with its manifest, as a pipeline does.
void SaveParts(const TrainConfig& c, std::vector<Part>& parts, const std::string& dir, int step) {
  Manifest m;
  m.step = step;
  m.strategy = "pipeline";
  m.world_size = static_cast<int>(parts.size());
  m.model = c.model.ToString();
  m.optimizer = c.optimizer.kind;
  m.batch = c.batch;
  m.seed = c.seed;
  const std::string prefix = CheckpointPrefixFor(dir, step);
  for (size_t r = 0; r < parts.size(); ++r) {
    ShardRecord s;
    s.file = absl::StrFormat("step-%06d.stage-%d.ckpt", step, r);
    s.block_begin = parts[r].stage->begin();
    s.block_end = parts[r].stage->end();
    CheckpointFileInfo info;
    ASSERT_TRUE(SaveTrainingState(dir + "/" + s.file, c, *parts[r].stage, parts[r].optimizer,
                                  parts[r].scaler, parts[r].step, {}, &info)
                    .ok());
    s.bytes = info.bytes;
    s.checksum = info.checksum;
    m.shards.push_back(s);
  }
  ASSERT_TRUE(WriteManifest(prefix, m).ok());
}

// A 3-step trained model saved whole, in `dir`/whole.ckpt.
std::string TrainedWhole(const std::string& dir) {
  TrainConfig c = ResumableConfig();
  c.steps = 3;
  auto t = *Trainer::Create(c);
  EXPECT_TRUE(t->Run(nullptr).ok());
  const std::string path = dir + "/whole.ckpt";
  EXPECT_TRUE(t->SaveCheckpoint(path).ok());
  return path;
}

TEST(ShardedCheckpoint, LayoutRoundTrip) {
  const TrainConfig c = ResumableConfig();
  auto st = *Stage::Create(c.model, 1, 3, c.device, 1);
  auto parsed = ParseShardLayout(FormatShardLayout(st->layout()));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), st->layout().entries().size());
  for (size_t i = 0; i < parsed->size(); ++i) {
    EXPECT_EQ((*parsed)[i].name, st->layout().entries()[i].spec.name);
    EXPECT_EQ((*parsed)[i].offset, st->layout().entries()[i].offset);
  }
  EXPECT_FALSE(ParseShardLayout("a:1").ok());
  EXPECT_EQ(CheckpointStep("/x/step-000012.stage-3.ckpt"), 12);
  EXPECT_EQ(CheckpointStep("step-000004.manifest"), 4);
  EXPECT_EQ(CheckpointStep("/x/step-000004"), 4);
  EXPECT_EQ(CheckpointStep("/x/weights.bin"), -1);
}

// Whole -> 4 stages -> 2 stages -> whole: every parameter and optimizer moment lands where
// its name says, bit for bit.
TEST(ShardedCheckpoint, ReshardsAcrossStageCounts) {
  const std::string dir = FreshTestDir("reshard");
  const std::string whole = TrainedWhole(dir);
  const auto truth = ByName(whole);
  const TrainConfig c = ResumableConfig();

  std::vector<Part> four;
  for (int b = 0; b < 4; ++b) {
    four.push_back(MakePart(c, b, b + 1));
    absl::Status s = LoadTrainingState(whole, c, *four.back().stage, &four.back().optimizer,
                                       &four.back().scaler, &four.back().step);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(four.back().step, 3);
  }
  SaveParts(c, four, dir, 3);
  const std::string prefix = CheckpointPrefixFor(dir, 3);
  auto m = ReadManifest(prefix);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->shards.size(), 4u);
  EXPECT_TRUE(VerifyCheckpoint(prefix, *m).ok());

  std::vector<Part> two;
  two.push_back(MakePart(c, 0, 2));
  two.push_back(MakePart(c, 2, 4));
  for (Part& p : two) {
    absl::Status s =
        LoadShardedTrainingState(prefix, c, *p.stage, &p.optimizer, &p.scaler, &p.step);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(p.step, 3);
  }
  const std::string two_dir = FreshTestDir("reshard-two");
  SaveParts(c, two, two_dir, 3);
  Part one = MakePart(c, 0, 4);
  absl::Status s = LoadShardedTrainingState(CheckpointPrefixFor(two_dir, 3), c, *one.stage,
                                            &one.optimizer, &one.scaler, &one.step);
  ASSERT_TRUE(s.ok()) << s;
  const std::string again = dir + "/again.ckpt";
  ASSERT_TRUE(SaveTrainingState(again, c, *one.stage, one.optimizer, one.scaler, one.step).ok());
  EXPECT_EQ(ByName(again), truth);
}

// Tied, a checkpoint holds the table once: a last stage's shard leaves its copy out, and a
// last stage loads its copy (weights and moments) from the shard holding the embedding.
TEST(ShardedCheckpoint, TiedTableIsHeldOnce) {
  const std::string dir = FreshTestDir("tied");
  TrainConfig c = ResumableConfig();
  c.model.tie_embeddings = true;
  c.steps = 3;
  auto t = *Trainer::Create(c);
  ASSERT_TRUE(t->Run(nullptr).ok());
  const std::string whole = dir + "/whole.ckpt";
  ASSERT_TRUE(t->SaveCheckpoint(whole).ok());
  const auto truth = ByName(whole);
  ASSERT_EQ(truth.count("embed.wte"), 1u);
  EXPECT_EQ(truth.count("head.weight"), 0u);
  const int n = c.model.num_blocks();
  std::vector<Part> parts;
  parts.push_back(MakePart(c, 0, 1));
  parts.push_back(MakePart(c, 1, n));
  for (Part& p : parts) {
    ASSERT_TRUE(LoadTrainingState(whole, c, *p.stage, &p.optimizer, &p.scaler, &p.step).ok());
  }
  SaveParts(c, parts, dir, 3);
  const std::string prefix = CheckpointPrefixFor(dir, 3);
  const auto first = ByName(dir + "/step-000003.stage-0.ckpt");
  const auto last = ByName(dir + "/step-000003.stage-1.ckpt");
  EXPECT_EQ(first.at("embed.wte"), truth.at("embed.wte"));
  EXPECT_EQ(last.count("embed.wte"), 0u);
  EXPECT_EQ(last.size() + first.size(), truth.size());
  // A fresh last stage fills its copy from the first stage's shard.
  Part fresh = MakePart(c, 1, n);
  ASSERT_TRUE(
      LoadShardedTrainingState(prefix, c, *fresh.stage, &fresh.optimizer, &fresh.scaler,
                               &fresh.step)
          .ok());
  const int64_t table = int64_t{c.model.vocab} * c.model.d_model;
  ASSERT_EQ(fresh.stage->embedding_copy_numel(), table);
  const std::vector<Tensor> state = {fresh.stage->params().flat(), fresh.optimizer.state0(),
                                     fresh.optimizer.state1()};
  for (size_t a = 0; a < state.size(); ++a) {
    const std::vector<float> v = *state[a].ToFloatVector();
    EXPECT_EQ(std::vector<float>(v.begin(), v.begin() + table), truth.at("embed.wte")[a]) << a;
  }
  // And the shards load back into one stage, as they were.
  Part one = MakePart(c, 0, n);
  ASSERT_TRUE(
      LoadShardedTrainingState(prefix, c, *one.stage, &one.optimizer, &one.scaler, &one.step)
          .ok());
  const std::string again = dir + "/again.ckpt";
  ASSERT_TRUE(SaveTrainingState(again, c, *one.stage, one.optimizer, one.scaler, one.step).ok());
  EXPECT_EQ(ByName(again), truth);
}

// A run continued from a checkpoint that went through 4 stages and back equals the
// uninterrupted run, bit for bit.
TEST(ShardedCheckpoint, ContinuingAfterReshardingIsBitExact) {
  std::vector<float> straight, resumed;
  {
    auto t = *Trainer::Create(ResumableConfig());
    ASSERT_TRUE(t->Run([&](const StepReport& r) { straight.push_back(r.loss); }).ok());
  }
  const std::string dir = FreshTestDir("continue");
  {
    TrainConfig c = ResumableConfig();
    c.steps = 3;
    auto t = *Trainer::Create(c);
    ASSERT_TRUE(t->Run([&](const StepReport& r) { resumed.push_back(r.loss); }).ok());
    ASSERT_TRUE(t->SaveCheckpoint(dir + "/whole.ckpt").ok());
  }
  const TrainConfig c = ResumableConfig();
  std::vector<Part> four;
  for (int b = 0; b < 4; ++b) {
    four.push_back(MakePart(c, b, b + 1));
    ASSERT_TRUE(LoadTrainingState(dir + "/whole.ckpt", c, *four.back().stage,
                                  &four.back().optimizer, &four.back().scaler, &four.back().step)
                    .ok());
  }
  SaveParts(c, four, dir, 3);
  // The one-worker trainer reads a single file: assemble one from the shards.
  Part one = MakePart(c, 0, 4);
  ASSERT_TRUE(LoadShardedTrainingState(CheckpointPrefixFor(dir, 3), c, *one.stage,
                                       &one.optimizer, &one.scaler, &one.step)
                  .ok());
  ASSERT_TRUE(
      SaveTrainingState(dir + "/joined.ckpt", c, *one.stage, one.optimizer, one.scaler, one.step)
          .ok());
  TrainConfig rc = ResumableConfig();
  rc.resume = dir + "/joined.ckpt";
  auto t = Trainer::Create(rc);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Run([&](const StepReport& r) { resumed.push_back(r.loss); }).ok());
  ASSERT_EQ(straight.size(), resumed.size());
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(straight[i], resumed[i]) << i;
}

class DamagedShards : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("damaged");
    const std::string whole = TrainedWhole(dir_);
    c_ = ResumableConfig();
    for (int step : {3, 5}) {
      std::vector<Part> parts;
      parts.push_back(MakePart(c_, 0, 2));
      parts.push_back(MakePart(c_, 2, 4));
      for (Part& p : parts) {
        ASSERT_TRUE(
            LoadTrainingState(whole, c_, *p.stage, &p.optimizer, &p.scaler, &p.step).ok());
        p.step = step;
      }
      SaveParts(c_, parts, dir_, step);
    }
  }
  absl::Status Load(int step) {
    Part p = MakePart(c_, 0, 4);
    return LoadShardedTrainingState(CheckpointPrefixFor(dir_, step), c_, *p.stage,
                                    &p.optimizer, &p.scaler, &p.step);
  }
  std::string Shard(int step, int stage) {
    return absl::StrFormat("%s/step-%06d.stage-%d.ckpt", dir_, step, stage);
  }
  std::string dir_;
  TrainConfig c_;
};

TEST_F(DamagedShards, NewestCompleteIsFound) {
  auto latest = FindLatestCheckpoint(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, CheckpointPrefixFor(dir_, 5));
  EXPECT_TRUE(Load(5).ok());
}

TEST_F(DamagedShards, MissingShardIsRefusedByName) {
  ASSERT_EQ(std::remove(Shard(5, 1).c_str()), 0);
  absl::Status s = Load(5);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr(Shard(5, 1) + " is missing"));
  std::vector<std::string> passed;
  auto latest = FindLatestCheckpoint(dir_, &passed);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, CheckpointPrefixFor(dir_, 3));
  ASSERT_EQ(passed.size(), 1u);
  EXPECT_THAT(passed[0], HasSubstr(Shard(5, 1)));
}

TEST_F(DamagedShards, CorruptShardIsRefusedByName) {
  std::string bytes = ReadAll(Shard(5, 0));
  bytes[bytes.size() / 2] ^= 0x10;  // the trailer (size, checksum) stays as listed
  std::ofstream(Shard(5, 0), std::ios::binary | std::ios::trunc) << bytes;
  absl::Status s = Load(5);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr(Shard(5, 0)));
  EXPECT_THAT(std::string(s.message()), HasSubstr("checksum mismatch"));
  EXPECT_EQ(*FindLatestCheckpoint(dir_), CheckpointPrefixFor(dir_, 3));
}

TEST_F(DamagedShards, ShardOfAnotherSaveIsRefused) {
  // Step 3's stage-1 shard put where step 5's was: whole, but not the one listed.
  ASSERT_EQ(std::rename(Shard(3, 1).c_str(), Shard(5, 1).c_str()), 0);
  absl::Status s = Load(5);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr(Shard(5, 1) + " is not the one"));
}

TEST_F(DamagedShards, ManifestMissingABlockIsIncomplete) {
  auto m = ReadManifest(CheckpointPrefixFor(dir_, 5));
  ASSERT_TRUE(m.ok());
  m->shards.pop_back();
  ASSERT_TRUE(WriteManifest(CheckpointPrefixFor(dir_, 5), *m).ok());
  absl::Status s = VerifyCheckpoint(CheckpointPrefixFor(dir_, 5), *m);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("hold blocks 0-2 of the model's 4"));
  absl::Status l = Load(5);  // the whole model needs the missing blocks' parameters
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(std::string(l.message()), HasSubstr("holds no parameter"));
}

TEST_F(DamagedShards, OtherModelIsRefusedBeforeLoading) {
  c_.model.d_model = 64;
  absl::Status s = Load(5);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("is of model"));
}

}  // namespace
}  // namespace tandem
