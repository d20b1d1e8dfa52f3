// Tests of the progress line's format, its computation from metrics, and its display on a
// terminal (rewritten in place) and elsewhere (periodic lines).
#include "launcher/progress.h"

#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace launcher {
namespace {

using ::testing::HasSubstr;

TEST(FormatProgress, TheLine) {
  ProgressState s;
  s.step = 12;
  s.total = 300;
  s.has_loss = true;
  s.loss = 3.12341;
  s.tokens_per_second = 48000.4;
  s.peak_bytes = int64_t{512} << 20;
  s.eta_seconds = 42;
  EXPECT_EQ(FormatProgress(s), "step 12/300  loss 3.1234  48,000 tok/s  peak 512 MB  ETA 0:42");
}

TEST(FormatProgress, ValidationLossFollowsTheLoss) {
  ProgressState s;
  s.step = 100;
  s.total = 300;
  s.has_loss = true;
  s.loss = 3.12341;
  s.has_val_loss = true;
  s.val_loss = 2.34567;
  EXPECT_EQ(FormatProgress(s), "step 100/300  loss 3.1234  val 2.3457  - tok/s  peak -  ETA -");
}

TEST(FormatProgress, UnknownsAreDashes) {
  ProgressState s;
  s.total = 300;
  EXPECT_EQ(FormatProgress(s), "step 0/300  loss -  - tok/s  peak -  ETA -");
}

StepRecord Rec(int step, double loss, double seconds, int64_t peak) {
  StepRecord r;
  r.step = step;
  r.loss = loss;
  r.seconds = seconds;
  r.peak_bytes = peak;
  return r;
}

// Rank 0's latest validation loss stays on the line through the steps without one.
TEST(ComputeProgress, LatestValidationLoss) {
  std::vector<StepRecord> rank0 = {Rec(0, 5, 1, 1), Rec(1, 4, 1, 1), Rec(2, 3.5, 1, 1),
                                   Rec(3, 3.25, 1, 1)};
  rank0[1].val_loss = 4.5;
  std::vector<StepRecord> rank1 = rank0;
  rank1[3].val_loss = 99;  // only rank 0's counts
  EXPECT_FALSE(ComputeProgress({{rank0[0]}, {}}, 10, 1).has_val_loss);
  const ProgressState s = ComputeProgress({rank0, rank1}, 10, 1);
  EXPECT_TRUE(s.has_val_loss);
  EXPECT_DOUBLE_EQ(s.val_loss, 4.5);
  EXPECT_THAT(FormatProgress(s), HasSubstr("loss 3.2500  val 4.5000  "));
}

TEST(ComputeProgress, FromRecords) {
  // Rank 0 is at step 4 (0-based 3); rank 1's peak is the larger; the slowest rank sets the
  // step time after the two warm-up steps: 0.5 s, so 256 tokens / 0.5 s and 96 steps left.
  const std::vector<std::vector<StepRecord>> ranks = {
      {Rec(0, 5, 3, 100), Rec(1, 4, 3, 100), Rec(2, 3.5, 0.25, 100), Rec(3, 3.25, 0.25, 100)},
      {Rec(0, 5, 3, 300), Rec(1, 4, 3, 300), Rec(2, 3.5, 0.5, 300), Rec(3, 3.25, 0.5, 300)},
  };
  const ProgressState s = ComputeProgress(ranks, 100, 256);
  EXPECT_EQ(s.step, 4);
  EXPECT_EQ(s.total, 100);
  EXPECT_TRUE(s.has_loss);
  EXPECT_DOUBLE_EQ(s.loss, 3.25);
  EXPECT_EQ(s.peak_bytes, 300);
  EXPECT_DOUBLE_EQ(s.tokens_per_second, 512);
  EXPECT_DOUBLE_EQ(s.eta_seconds, 48);
  // The tracker's average is run.json's.
  ProgressTracker t(2, 100, 256);
  for (int r = 0; r < 2; ++r) {
    for (const StepRecord& x : ranks[r]) t.Add(r, x);
  }
  EXPECT_DOUBLE_EQ(t.MeanStepSeconds(), MeanStepSeconds(ranks));
  // Ranks that take turns waiting for each other: the slowest rank's mean, as run.json's.
  const std::vector<std::vector<StepRecord>> turns = {
      {Rec(0, 5, 9, 1), Rec(1, 5, 9, 1), Rec(2, 5, 1, 1), Rec(3, 5, 3, 1), Rec(4, 5, 1, 1)},
      {Rec(0, 5, 9, 1), Rec(1, 5, 9, 1), Rec(2, 5, 3, 1), Rec(3, 5, 1, 1), Rec(4, 5, 3.5, 1)},
  };
  ProgressTracker u(2, 100, 256);
  for (size_t step = 0; step < turns[0].size(); ++step) {
    for (int r = 0; r < 2; ++r) u.Add(r, turns[r][step]);
  }
  EXPECT_DOUBLE_EQ(u.MeanStepSeconds(), 2.5);  // rank 1's (3 + 1 + 3.5) / 3
  EXPECT_DOUBLE_EQ(u.MeanStepSeconds(), MeanStepSeconds(turns));
  const ProgressState none = ComputeProgress({{}, {}}, 100, 256);
  EXPECT_EQ(none.step, 0);
  EXPECT_FALSE(none.has_loss);
  EXPECT_EQ(none.eta_seconds, -1);
}

// Everything written to a temporary FILE.
std::string Contents(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  return out;
}

TEST(ProgressDisplay, TerminalRewritesOneLine) {
  FILE* f = std::tmpfile();
  ProgressDisplay d(f, /*terminal=*/true);
  const absl::Time t = absl::FromUnixSeconds(1000);
  d.Update("step 1/3", t);
  d.Update("step 1/3", t);  // unchanged: nothing written
  d.Update("step 2/3", t);
  d.Print(f, "a message");
  d.Finish("step 3/3");
  EXPECT_EQ(Contents(f),
            "\r\033[Kstep 1/3\r\033[Kstep 2/3\r\033[Ka message\nstep 2/3\r\033[Kstep 3/3\n");
  std::fclose(f);
}

TEST(ProgressDisplay, ElsewherePeriodicLines) {
  FILE* f = std::tmpfile();
  ProgressDisplay d(f, /*terminal=*/false, absl::Seconds(5));
  const absl::Time t = absl::FromUnixSeconds(1000);
  d.Update("step 1/9", t);
  d.Update("step 2/9", t + absl::Seconds(1));  // too soon
  d.Update("step 3/9", t + absl::Seconds(5));
  d.Print(f, "a message\n");
  d.Update("step 3/9", t + absl::Seconds(11));  // same line again: not repeated
  d.Finish("step 9/9");
  EXPECT_EQ(Contents(f), "step 1/9\nstep 3/9\na message\nstep 9/9\n");
  std::fclose(f);
}

TEST(ProgressDisplay, FinishDoesNotRepeatTheLastLine) {
  FILE* f = std::tmpfile();
  ProgressDisplay d(f, /*terminal=*/false);
  d.Update("step 5/5", absl::FromUnixSeconds(1000));
  d.Finish("step 5/5");
  EXPECT_EQ(Contents(f), "step 5/5\n");
  std::fclose(f);
}

TEST(ProgressTracker, InAHybridGridThePeakNamesItsRanksPlace) {
  ProcessGrid grid;
  grid.replicas = 2;
  grid.stages = 2;
  ProgressTracker t(4, 10, 1000, grid);
  for (int r = 0; r < 4; ++r) t.Add(r, Rec(0, 2.5, 1.0, r == 2 ? 300 << 20 : 200 << 20));
  EXPECT_EQ(t.State().peak_where, "rank 2 (replica 0, stage 1)");
  EXPECT_THAT(FormatProgress(t.State()), HasSubstr("peak 300 MB on rank 2 (replica 0, stage 1)"));
  ProgressTracker plain(4, 10, 1000);  // data parallel or one pipeline: the rank says it all
  for (int r = 0; r < 4; ++r) plain.Add(r, Rec(0, 2.5, 1.0, 100));
  EXPECT_EQ(plain.State().peak_where, "");
}

}  // namespace
}  // namespace launcher
}  // namespace tandem
