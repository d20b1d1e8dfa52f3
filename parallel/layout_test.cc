#include "parallel/layout.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "model/stage.h"
#include "model/test_configs.h"
#include "parallel/buckets.h"
#include "runtime/format.h"

namespace tandem {
namespace {

// A 4-layer GPT (6 blocks: embed, h0-h3, head), batch 8 in 4 micro-batches.
ParallelConfig SmallPipeline(int data_parallel, const std::string& schedule) {
  ParallelConfig c;
  c.train.model = TwoLayerModel("gpt", 16, 2, 8, 32);
  c.train.model.n_layer = 4;
  c.train.batch = 8;
  c.train.micro_batches = 4;
  c.strategy = StrategyKind::kPipeline;
  c.schedule = schedule;
  c.data_parallel = data_parallel;
  c.bucket_bytes = 2048;  // several buckets on so small a model
  return c;
}

TEST(LayoutTest, ResolvesTheGridStagesScheduleAndMemoryOnce) {
  const ParallelConfig c = SmallPipeline(2, "1f1b");
  const absl::StatusOr<JobLayout> l = ResolveLayout(c, 4);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->grid.replicas, 2);
  EXPECT_EQ(l->grid.stages, 2);
  ASSERT_EQ(l->bounds.size(), 3u);
  EXPECT_EQ(l->bounds.front(), 0);
  EXPECT_EQ(l->bounds.back(), 6);
  EXPECT_EQ(l->StageSizes(), absl::StrCat(l->bounds[1], ",", 6 - l->bounds[1]));
  ASSERT_TRUE(l->pipelined());
  EXPECT_EQ(l->schedule.stages, 2);
  EXPECT_EQ(l->schedule.micro_batches, 4);
  EXPECT_EQ(l->exchange_groups.size(), 2u);
  ASSERT_EQ(l->memory.size(), 4u);
  // A stage's two replicas need the same; the two stages hold different blocks.
  EXPECT_EQ(l->memory[0].total(), l->memory[1].total());
  EXPECT_EQ(l->memory[2].total(), l->memory[3].total());
  EXPECT_GT(l->memory[0].params, 0);
  // Rank order: replicas fastest.
  EXPECT_EQ(l->grid.StageOf(1), 0);
  EXPECT_EQ(l->grid.StageOf(2), 1);
}

TEST(LayoutTest, DataParallelIsOneStageOfEveryBlock) {
  ParallelConfig c = SmallPipeline(1, "gpipe");
  c.strategy = StrategyKind::kData;
  const absl::StatusOr<JobLayout> l = ResolveLayout(c, 2);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->pipelined());
  EXPECT_EQ(l->grid.replicas, 2);
  EXPECT_EQ(l->grid.stages, 1);
  EXPECT_EQ(l->bounds, (StageBounds{0, 6}));
  EXPECT_EQ(l->BlockRange(0), std::make_pair(0, 6));
}

TEST(LayoutTest, InterleavedChunksLoopOverTheStages) {
  ParallelConfig c = SmallPipeline(1, "interleaved");
  c.virtual_stages = 2;
  c.balance = "1,2,1,2";
  const absl::StatusOr<JobLayout> l = ResolveLayout(c, 2);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->ChunkRanges(0), (std::vector<std::pair<int, int>>{{0, 1}, {3, 4}}));
  EXPECT_EQ(l->ChunkRanges(1), (std::vector<std::pair<int, int>>{{1, 3}, {4, 6}}));
  EXPECT_EQ(l->BlockRange(1), std::make_pair(1, 6));
}

TEST(LayoutTest, BalanceByTimeTakesTheTimesAsAnInput) {
  ParallelConfig c = SmallPipeline(1, "gpipe");
  c.balance = "time";
  // Nothing is timed inside: without the blocks' times the layout is refused, in one line.
  const absl::StatusOr<JobLayout> none = ResolveLayout(c, 2);
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::StrContains(none.status().message(), "--balance=time needs"))
      << none.status();
  // The head costs as much as the rest together: it gets a stage of its own.
  const std::vector<double> seconds = {1, 1, 1, 1, 1, 5};
  LayoutInputs in;
  in.block_seconds = &seconds;
  const absl::StatusOr<JobLayout> l = ResolveLayout(c, 2, in);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->StageSizes(), "5,1");
  const std::vector<double> wrong = {1, 2};
  in.block_seconds = &wrong;
  EXPECT_FALSE(ResolveLayout(c, 2, in).ok());
}

TEST(LayoutTest, RefusesWhatDoesNotFitInOneLine) {
  ParallelConfig c = SmallPipeline(3, "1f1b");
  const absl::StatusOr<JobLayout> l = ResolveLayout(c, 4);  // 3 replicas of 4 ranks
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(std::string(l.status().message()).find('\n'), std::string::npos) << l.status();
  c = SmallPipeline(1, "1f1b");
  c.zero = 1;  // nothing to shard over
  EXPECT_TRUE(absl::StrContains(ResolveLayout(c, 2).status().message(), "--zero=1"));
  // Replicas of a one-stage "pipeline": data parallelism, which says so.
  c = SmallPipeline(2, "1f1b");
  EXPECT_TRUE(absl::StrContains(ResolveLayout(c, 2).status().message(), "use --strategy=data"))
      << ResolveLayout(c, 2).status();
}

// The explanation's buckets are the trainer's: a real Stage of each rank's blocks, planned as
// DistributedTrainer::Create plans them, gives the same buckets, names and sizes.
TEST(LayoutTest, ExplainSaysWhatEachRankRuns) {
  ParallelConfig c = SmallPipeline(2, "zb-h1");
  c.train.model.tie_embeddings = true;
  c.zero = 1;
  const absl::StatusOr<JobLayout> l = ResolveLayout(c, 4);
  ASSERT_TRUE(l.ok()) << l.status();
  const std::string text = ExplainLayout(c, *l);
  std::vector<std::string> ranks;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "rank ")) ranks.emplace_back(line);
  }
  ASSERT_EQ(ranks.size(), 4u) << text;
  for (int r = 0; r < 4; ++r) {
    const int stage = l->grid.StageOf(r);
    EXPECT_TRUE(absl::StartsWith(
        ranks[r], absl::StrFormat("rank %d (replica %d, stage %d): ", r, r % 2, stage)))
        << ranks[r];
    const auto [begin, end] = l->BlockRange(stage);
    auto stage_or = Stage::Create(c.train.model, begin, end, Device::Cpu(), 1, DType::kF32);
    ASSERT_TRUE(stage_or.ok()) << stage_or.status();
    const Stage& st = **stage_or;
    const bool tied_end = begin == 0 || end == c.train.model.num_blocks();
    const std::vector<Bucket> buckets =
        PlanBuckets(st.layout(), st.ParamBlocks(), c.bucket_bytes, tied_end ? 0 : -1);
    EXPECT_TRUE(absl::StrContains(text, absl::StrFormat("%d gradient buckets", buckets.size())))
        << text;
    for (size_t i = 0; i < buckets.size(); ++i) {
      const auto& e = st.layout().entries();
      EXPECT_TRUE(absl::StrContains(
          text, absl::StrFormat("bucket %d: %s, %s .. %s", i,
                                FormatBytes(4 * (buckets[i].end - buckets[i].begin)),
                                e[buckets[i].last_param].spec.name,
                                e[buckets[i].first_param].spec.name)))
          << "rank " << r << " bucket " << i << "\n"
          << text;
    }
    // The shard: ceil(numel / 2) elements for replica 0.
    const int64_t numel = st.layout().numel();
    const int64_t half = (numel + 1) / 2;
    EXPECT_TRUE(absl::StrContains(
        text, r % 2 == 0 ? absl::StrFormat("elements [0, %d) of the stage's %d", half, numel)
                         : absl::StrFormat("elements [%d, %d) of the stage's %d", half, numel,
                                           numel)))
        << text;
  }
  // Each stage's row of the schedule, in its actions' own texts.
  for (int stage = 0; stage < 2; ++stage) {
    std::string row;
    for (const Action& a : l->schedule.actions[stage]) {
      absl::StrAppend(&row, row.empty() ? "" : " ", ActionText(stage, a));
    }
    std::string printed;
    bool in_stage = false;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (absl::StartsWith(line, "rank ")) {
        if (!printed.empty()) break;
        in_stage = absl::StrContains(line, absl::StrFormat("stage %d)", stage));
      }
      if (!in_stage) continue;
      absl::string_view rest = line;
      if (absl::ConsumePrefix(&rest, "  schedule: ") ||
          (!printed.empty() && absl::ConsumePrefix(&rest, "            "))) {
        absl::StrAppend(&printed, printed.empty() ? "" : " ", rest);
      }
    }
    EXPECT_EQ(printed, row) << text;
  }
  EXPECT_TRUE(absl::StrContains(text, "deferred Ws")) << text;
}

}  // namespace
}  // namespace tandem
