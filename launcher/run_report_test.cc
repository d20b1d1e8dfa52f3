// Tests of following and reading metrics files, per-rank totals and throughput, run.json's
// content and escaping, the atomic write and the summary table, whose final line names who
// aborted the job.
#include "launcher/run_report.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/process.h"
#include "runtime/files.h"
#include "runtime/json.h"
#include "runtime/test_files.h"

namespace tandem {
namespace launcher {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

StepRecord Rec(int step, double loss, double seconds, int64_t peak = 0) {
  StepRecord r;
  r.step = step;
  r.loss = loss;
  r.seconds = seconds;
  r.compute = seconds / 2;
  r.comm = seconds / 2;
  r.exposed_comm = seconds / 4;
  r.bubble = seconds / 8;
  r.comm_bytes = 1000;
  r.peak_bytes = peak;
  r.param_bytes = peak / 8;
  r.grad_bytes = peak / 8;
  r.optimizer_bytes = peak / 4;
  r.peak_in_flight = 3;
  return r;
}

TEST(MetricsTail, CompleteLinesOnly) {
  const std::string path = FreshTestPath("rank-0.jsonl");
  MetricsTail tail(path);
  EXPECT_TRUE(tail.ReadNew().empty());  // no file yet
  std::ofstream out(path);
  out << "{\"step\": 0, \"loss\": 5, \"seconds\": 1}\n{\"step\": 1, \"lo" << std::flush;
  std::vector<StepRecord> got = tail.ReadNew();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].step, 0);
  out << "ss\": 4, \"seconds\": 1}\nbroken\n" << std::flush;
  std::vector<std::string> errors;
  got = tail.ReadNew(&errors);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].step, 1);
  EXPECT_DOUBLE_EQ(got[0].loss, 4);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], HasSubstr(path));
  EXPECT_TRUE(tail.ReadNew().empty());
}

TEST(ReadMetricsFile, LastRecordOfAStepWins) {
  const std::string path = FreshTestPath("rank-1.jsonl");
  std::ofstream(path) << "{\"step\": 0, \"loss\": 5, \"seconds\": 1}\n"
                      << "{\"step\": 1, \"loss\": 4, \"seconds\": 1}\n"
                      << "{\"step\": 1, \"loss\": 3, \"seconds\": 1}\n"
                      << "{\"step\": 2, \"loss\": 2, \"seconds\": 1}\n";
  const std::vector<StepRecord> r = ReadMetricsFile(path);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_DOUBLE_EQ(r[1].loss, 3);
}

TEST(RunJson, ANullLossIsNoLoss) {
  // A diverged step: the worker writes its nan loss and norm as JSON's null.
  const absl::StatusOr<StepRecord> r =
      ParseMetricsLine("{\"step\": 2, \"loss\": null, \"seconds\": 0.1, \"grad_norm\": null}");
  ASSERT_TRUE(r.ok()) << r.status();
  RunRecord run;
  run.ranks = {{*r}};
  EXPECT_THAT(RunJson(run), HasSubstr("\"losses\": [null]"));
  EXPECT_THAT(SummaryTable(run), HasSubstr("final loss  nan (diverged)"));
}

TEST(TruncateMetricsFile, KeepsTheStepsBeforeTheResumedOne) {
  const std::string path = FreshTestPath("rank-0.jsonl");
  std::ofstream(path) << "{\"step\": 0, \"loss\": 5, \"seconds\": 1}\n"
                      << "{\"step\": 1, \"loss\": 4, \"seconds\": 1}\n"
                      << "{\"step\": 2, \"loss\": 3, \"seconds\": 1}\n"
                      << "{\"step\": 1, \"loss\": 2, \"seconds\": 1}\n"
                      << "{\"step\": 3, \"lo";  // cut short by a kill
  ASSERT_TRUE(TruncateMetricsFile(path, 2).ok());
  EXPECT_EQ(ReadAll(path),
            "{\"step\": 0, \"loss\": 5, \"seconds\": 1}\n"
            "{\"step\": 1, \"loss\": 4, \"seconds\": 1}\n"
            "{\"step\": 1, \"loss\": 2, \"seconds\": 1}\n");
  const std::string missing = FreshTestPath("rank-1.jsonl");
  ASSERT_TRUE(TruncateMetricsFile(missing, 2).ok());
  EXPECT_FALSE(PathExists(missing));
}

TEST(Throughput, SlowestRankFirstStepsLeftOut) {
  // Steps 0 and 1 are slow warm-up; then rank 1 is the slower one at 0.2 s.
  std::vector<std::vector<StepRecord>> ranks = {
      {Rec(0, 5, 9), Rec(1, 4, 9), Rec(2, 3, 0.1), Rec(3, 2, 0.1)},
      {Rec(0, 5, 9), Rec(1, 4, 9), Rec(2, 3, 0.2), Rec(3, 2, 0.2)},
  };
  EXPECT_DOUBLE_EQ(MeanStepSeconds(ranks), 0.2);
  EXPECT_DOUBLE_EQ(TokensPerSecond(ranks, 1000), 5000);
  // A step not every rank reported yet is left out.
  ranks[0].push_back(Rec(4, 1, 5));
  EXPECT_DOUBLE_EQ(MeanStepSeconds(ranks), 0.2);
  // With two steps or fewer, all of them count.
  EXPECT_DOUBLE_EQ(MeanStepSeconds({{Rec(0, 1, 1), Rec(1, 1, 3)}}), 2);
  EXPECT_EQ(MeanStepSeconds({}), 0);
  EXPECT_EQ(TokensPerSecond({{}}, 100), 0);
}

TEST(Throughput, RanksThatTakeTurnsWaitingAreNotAddedUpAsSlowestInEveryStep) {
  // Each rank waits for the other every second step: each takes 2 s a step on average, and
  // the job 2 s a step; the slowest of each step would say 3.
  const std::vector<std::vector<StepRecord>> ranks = {
      {Rec(0, 5, 9), Rec(1, 5, 9), Rec(2, 5, 1), Rec(3, 5, 3), Rec(4, 5, 1), Rec(5, 5, 3)},
      {Rec(0, 5, 9), Rec(1, 5, 9), Rec(2, 5, 3), Rec(3, 5, 1), Rec(4, 5, 3), Rec(5, 5, 1.5)},
  };
  EXPECT_DOUBLE_EQ(MeanStepSeconds(ranks), 2.125);  // rank 1's (3 + 1 + 3 + 1.5) / 4
  EXPECT_THAT(CountedStepSeconds(ranks), testing::ElementsAre(3, 1, 3, 1.5));
}

TEST(Totals, SumsAndPeak) {
  const RankTotals t = Totals(1, {Rec(0, 5, 1, 100), Rec(1, 4, 2, 300), Rec(2, 3, 1, 200)});
  EXPECT_EQ(t.rank, 1);
  EXPECT_EQ(t.steps, 3);
  EXPECT_DOUBLE_EQ(t.compute_seconds, 2);
  EXPECT_DOUBLE_EQ(t.exposed_comm_seconds, 1);
  EXPECT_DOUBLE_EQ(t.bubble_seconds, 0.5);
  EXPECT_EQ(t.comm_bytes, 3000);
  EXPECT_EQ(t.peak_memory_bytes, 300);
}

// The bubble is a share of the step's pipeline, the gradient norm and optimizer step aside.
TEST(Totals, BubbleFractionLeavesTheOptimizerOut) {
  RankTotals t;
  t.step_seconds = 1;
  t.optimizer_seconds = 0.2;
  t.bubble_seconds = 0.2;
  EXPECT_DOUBLE_EQ(t.bubble_fraction(), 0.25);
  EXPECT_DOUBLE_EQ(RankTotals{}.bubble_fraction(), 0);
}

RunRecord Sample() {
  RunRecord r;
  r.job.strategy = "pipeline";
  r.job.workers = 2;
  r.job.batch = 8;
  r.job.steps = 5;
  r.job.run_dir = "/runs/a \"quoted\"\nname";
  r.seq_len = 16;
  r.wall_seconds = 12.25;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<StepRecord> steps;
    for (int s = 0; s < 5; ++s) steps.push_back(Rec(s, 5 - 0.5 * s, 0.01 * (rank + 1), 1 << 20));
    r.ranks.push_back(steps);
  }
  return r;
}

// The keys of the top-level "config" object in run.json.
std::set<std::string> ConfigKeys(const std::string& json) {
  std::set<std::string> keys;
  const size_t begin = json.find("\"config\": {");
  const size_t end = json.find('}', begin);
  for (absl::string_view line : absl::StrSplit(json.substr(begin, end - begin), '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!absl::StartsWith(line, "\"") || absl::StartsWith(line, "\"config\"")) continue;
    keys.insert(std::string(line.substr(1, line.find('"', 1) - 1)));
  }
  return keys;
}

// Evaluated steps' validation losses, as [steps trained, loss], each float in full; none
// without them. The summary names the last one.
TEST(RunJson, ValidationLosses) {
  RunRecord run = Sample();
  EXPECT_THAT(RunJson(run), Not(HasSubstr("val_losses")));
  EXPECT_THAT(SummaryTable(run), Not(HasSubstr("val loss")));
  run.ranks[0][1].val_loss = 4.25;
  run.ranks[0][4].val_loss = 5.48474979f;
  run.ranks[1][2].val_loss = 1;  // rank 0's are the job's
  const std::string json = RunJson(run);
  EXPECT_THAT(json, HasSubstr("\"val_losses\": [[2, 4.25], [5, 5.48475]]"));
  absl::StatusOr<Json> back = ParseJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(static_cast<float>((*back)["val_losses"][1][1].get<double>()), 5.48474979f);
  EXPECT_THAT(SummaryTable(run), HasSubstr("val loss    5.4847 (after step 5)"));
}

TEST(RunJson, Content) {
  const std::string json = RunJson(Sample());
  EXPECT_THAT(json, HasSubstr("\"losses\": [5, 4.5, 4, 3.5, 3]"));
  EXPECT_THAT(json, HasSubstr("\"strategy\": \"pipeline\""));
  EXPECT_THAT(json, HasSubstr("\"workers\": 2"));
  EXPECT_THAT(json, HasSubstr("\"exit\": \"ok\""));
  EXPECT_THAT(json, HasSubstr("\"tokens_per_second\": 6400"));  // 128 tokens / 0.02 s
  EXPECT_THAT(json, HasSubstr("\"step_seconds_mean\": 0.02"));
  EXPECT_THAT(json, HasSubstr("\"wall_seconds\": 12.25"));
  EXPECT_THAT(json, HasSubstr("\"peak_memory_bytes\": 1048576"));
  EXPECT_THAT(json, HasSubstr("\"compute_seconds\": 0.025"));               // rank 0
  EXPECT_THAT(json, HasSubstr("\"exposed_communication_seconds\": 0.0125"));
  EXPECT_THAT(json, HasSubstr("\"bubble_seconds\": 0.00625"));
  // Rank 0: busy 0.025 s of communication, 0.0125 s of it exposed: half hidden.
  EXPECT_THAT(json, HasSubstr("\"communication_seconds\": 0.025"));
  EXPECT_THAT(json, HasSubstr("\"hidden_communication_share\": 0.5"));
  EXPECT_THAT(json, HasSubstr("\"bubble_fraction\": 0.125"));            // 1/8 of each step
  EXPECT_THAT(json, HasSubstr("\"bubble_fraction_measured\": 0.125"));
  EXPECT_THAT(json, HasSubstr("\"bubble_fraction_gpipe\": 0.111111111"));  // K=2, M=8
  EXPECT_THAT(json, HasSubstr("\"peak_activation_bytes\": 524288"));      // half the peak
  EXPECT_THAT(json, HasSubstr("\"peak_micro_batches_in_flight\": 3"));
  EXPECT_THAT(json, HasSubstr("\"communication_bytes\": 5000"));
  EXPECT_THAT(json, HasSubstr("\"rank\": 1"));
  // Strings are escaped.
  EXPECT_THAT(json, HasSubstr("\"run_dir\": \"/runs/a \\\"quoted\\\"\\nname\""));
}

// Two replicas of a two-stage pipeline: each rank's place in Megatron's order, the optimizer
// state each keeps, and GPipe's bubble for the K = 2 stages (not the 4 ranks).
TEST(RunJson, HybridRanksSayTheirPlace) {
  RunRecord r = Sample();
  r.job.workers = 4;
  r.job.data_parallel = 2;
  r.job.zero = 1;
  r.ranks.push_back(r.ranks[0]);
  r.ranks.push_back(r.ranks[1]);
  for (int rank = 0; rank < 4; ++rank) {
    for (StepRecord& s : r.ranks[rank]) s.optimizer_bytes = 1000 * (rank + 1);
  }
  const std::string json = RunJson(r);
  EXPECT_THAT(json, HasSubstr("\"replicas\": 2,\n  \"stages\": 2,\n"));
  EXPECT_THAT(json, HasSubstr("\"data_parallel\": 2"));
  EXPECT_THAT(json, HasSubstr("\"zero\": 1"));
  EXPECT_THAT(json, HasSubstr("\"rank\": 2,\n      \"replica\": 0,\n      \"stage\": 1,"));
  EXPECT_THAT(json, HasSubstr("\"rank\": 3,\n      \"replica\": 1,\n      \"stage\": 1,"));
  EXPECT_THAT(json, HasSubstr("\"optimizer_state_bytes\": 3000"));
  // Each replica's 4 samples in 4 x 2 stages micro-batches at most: M = 4; (2-1)/(4+2-1).
  EXPECT_THAT(json, HasSubstr("\"micro_batches\": 4"));
  EXPECT_THAT(json, HasSubstr("\"bubble_fraction_gpipe\": 0.2,"));
  const std::string table = SummaryTable(r);
  EXPECT_THAT(table, HasSubstr("rank  replica stage"));
  EXPECT_THAT(table, ContainsRegex("\n3 +1 +1 +5 "));
  EXPECT_THAT(table, HasSubstr("GPipe's (K-1)/(M+K-1) = 0.200"));
}

TEST(RunJson, LayoutTheShellTestsRead) {
  RunRecord r = Sample();
  r.ranks[0][1].loss = 5.48474979f;
  const std::string json = RunJson(r);
  // One member a line; the losses on one line, each float in full; the ranks' objects open.
  EXPECT_TRUE(absl::StartsWith(json, "{\n  \"config\": {\n    \"strategy\": \"pipeline\",\n    \""))
      << json;
  EXPECT_THAT(json, HasSubstr("\n  \"losses\": [5, 5.48475, 4, 3.5, 3],\n"));
  EXPECT_THAT(json, HasSubstr("\n  \"ranks\": [{\n      \"rank\": 0,\n"));
  EXPECT_THAT(json, HasSubstr("\n      \"host_syncs_per_step\": 0\n    }, {\n      \"rank\": 1,"));
  EXPECT_TRUE(absl::EndsWith(json, "\n    }]\n}\n")) << json;
  // What it says reads back.
  absl::StatusOr<Json> back = ParseJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(static_cast<float>((*back)["losses"][1].get<double>()), 5.48474979f);
  EXPECT_EQ(StringOr((*back)["config"], "run_dir", ""), r.job.run_dir);
}

TEST(RunJson, OneDevicesWholeStepsOnly) {
  // examples/train measures whole steps: no split of their time to report.
  RunRecord r = Sample();
  r.ranks.resize(1);
  for (StepRecord& s : r.ranks[0]) s.breakdown = false;
  const std::string json = RunJson(r);
  EXPECT_THAT(json, HasSubstr("\"step_seconds_mean\": 0.01,"));
  EXPECT_THAT(json, HasSubstr("\"host_syncs_per_step\": 0"));
  for (const char* key : {"compute_seconds", "busy_seconds", "bubble_seconds", "idle_seconds"}) {
    EXPECT_THAT(json, Not(HasSubstr(key))) << key;
  }
}

TEST(RunJson, AResumedRunsFiguresAreOfItsOwnSteps) {
  // Steps 0-4 of an earlier run into this directory (at 0.01 and 0.02 s), then this one's,
  // resumed at step 5, at 1 s a step with no bubble.
  RunRecord r = Sample();
  r.job.steps = 8;
  r.first_step = 5;
  for (auto& steps : r.ranks) {
    for (int s = 5; s < 8; ++s) {
      steps.push_back(Rec(s, 1, 1, 2 << 20));
      steps.back().bubble = 0;
    }
  }
  const std::string json = RunJson(r);
  EXPECT_THAT(json, HasSubstr("\"first_step\": 0"));
  EXPECT_THAT(json, HasSubstr("\"figures_from_step\": 5"));
  EXPECT_THAT(json, HasSubstr("\"losses\": [5, 4.5, 4, 3.5, 3, 1, 1, 1]"));
  EXPECT_THAT(json, HasSubstr("\"step_seconds_mean\": 1,"));
  EXPECT_THAT(json, HasSubstr("\"bubble_fraction_measured\": 0,"));
  EXPECT_THAT(json, HasSubstr("\"compute_seconds\": 1.5,"));  // 3 steps of 0.5 s
  EXPECT_THAT(SummaryTable(r), HasSubstr("steps       8/8"));
  // Only this run's steps, in a directory of its own.
  for (auto& steps : r.ranks) steps.erase(steps.begin(), steps.begin() + 5);
  EXPECT_THAT(RunJson(r), HasSubstr("\"first_step\": 5"));
}

TEST(RunJson, ConfigHoldsEveryJobConfigField) {
  std::set<std::string> text_keys;
  for (absl::string_view line : absl::StrSplit(JobConfig().ToText(), '\n', absl::SkipEmpty())) {
    text_keys.insert(std::string(line.substr(0, line.find('='))));
  }
  EXPECT_EQ(ConfigKeys(RunJson(Sample())), text_keys);
}

TEST(RunJson, Failure) {
  RunRecord r = Sample();
  r.exit = "rank 1 failed (signal 9 SIGKILL)";
  r.failed_rank = 1;
  r.failure = "signal 9 SIGKILL";
  r.ranks[0].resize(2);
  const std::string json = RunJson(r);
  EXPECT_THAT(json, HasSubstr("\"exit\": \"rank 1 failed (signal 9 SIGKILL)\""));
  EXPECT_THAT(json, HasSubstr("\"failed_rank\": 1"));
  EXPECT_THAT(json, HasSubstr("\"losses\": [5, 4.5]"));
  EXPECT_THAT(json, HasSubstr("\"steps_completed\": 2"));
}

// The final line (the summary's result, run.json's exit and abort_reason) names who aborted
// the job, as the coordinator phrases it, and why.
TEST(SummaryTable, TheFinalLineNamesWhoAbortedTheJob) {
  const std::string mpirun_output =
      "mpirun noticed that process rank 0 with PID 0 on node vm exited on signal 15 "
      "(Terminated).\n";
  const std::optional<ExitStatus> mpirun = ExitStatus{true, 0, 15};
  struct Case {
    std::string abort_reason;
    std::string result;
    int failed_rank;
  };
  for (const Case& c : std::vector<Case>{
           {"rank 1 aborted the job: step 5: the loss is nan: training diverged",
            "rank 1 aborted the job: step 5: the loss is nan: training diverged", 1},
           {"the launcher aborted the job: watchdog: rank 1 hung: no heartbeat for 61s",
            "the launcher aborted the job: watchdog: rank 1 hung: no heartbeat for 61s", 1},
           {"the launcher aborted the job: the workers did not checkpoint and exit within 60 s "
            "of SIGTERM",
            "the launcher aborted the job: the workers did not checkpoint and exit within 60 s "
            "of SIGTERM",
            -1},
       }) {
    RunRecord r = Sample();
    const Failure f = IdentifyFailure(mpirun_output, c.abort_reason, mpirun, true);
    r.exit = FailureLine(f, c.abort_reason, mpirun);
    r.failed_rank = f.rank;
    r.failure = f.how;
    r.abort_reason = c.abort_reason;
    EXPECT_THAT(SummaryTable(r), HasSubstr(absl::StrCat("\nresult      ", c.result, "\n")));
    const std::string json = RunJson(r);
    EXPECT_THAT(json, HasSubstr(absl::StrCat("\"exit\": \"", c.result, "\"")));
    EXPECT_THAT(json, HasSubstr(absl::StrCat("\"abort_reason\": \"", c.abort_reason, "\"")));
    if (c.failed_rank >= 0) {
      EXPECT_THAT(json, HasSubstr(absl::StrCat("\"failed_rank\": ", c.failed_rank)));
    } else {
      EXPECT_THAT(json, Not(HasSubstr("failed_rank"))) << c.result;
    }
  }
  // An interrupted job's final line is the launcher's abort.
  RunRecord r = Sample();
  r.exit = r.abort_reason = "the launcher aborted the job: interrupted (SIGINT)";
  EXPECT_THAT(SummaryTable(r),
              HasSubstr("\nresult      the launcher aborted the job: interrupted (SIGINT)\n"));
}

TEST(WriteFileAtomically, WritesAndLeavesNoTemporary) {
  const std::string dir = FreshTestPath("atomic");
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  ASSERT_TRUE(WriteFileAtomically(dir + "/run.json", "first").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/run.json", "second").ok());
  EXPECT_EQ(ReadAll(dir + "/run.json"), "second");
  EXPECT_EQ(std::system(("test $(ls " + dir + " | wc -l) -eq 1").c_str()), 0);
  EXPECT_FALSE(WriteFileAtomically("/nonexistent/dir/run.json", "x").ok());
}

TEST(SummaryTable, RowsAndTotals) {
  const std::string t = SummaryTable(Sample());
  EXPECT_THAT(t, HasSubstr("compute s"));
  EXPECT_THAT(t, HasSubstr("peak memory"));
  EXPECT_THAT(t, HasSubstr("\n0 "));
  EXPECT_THAT(t, HasSubstr("\n1 "));
  EXPECT_THAT(t, HasSubstr("1.0 MB"));
  EXPECT_THAT(t, HasSubstr("final loss  3.0000"));
  EXPECT_THAT(t, HasSubstr("throughput  6,400 tok/s"));
  EXPECT_THAT(t, HasSubstr("wall time   0:12"));
  EXPECT_THAT(t, HasSubstr("run dir     /runs/a"));
  EXPECT_THAT(t, HasSubstr("steps       5/5"));
}

TEST(Formats, NumbersBytesDurations) {
  EXPECT_EQ(FormatThousands(48000), "48,000");
  EXPECT_EQ(FormatThousands(999), "999");
  EXPECT_EQ(FormatThousands(1234567.6), "1,234,568");
  EXPECT_EQ(FormatThousands(0), "0");
  EXPECT_EQ(FormatBytes(512 << 20), "512 MB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 19), "1.5 MB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 29), "1.5 GB");
  EXPECT_EQ(FormatBytes(-1), "-");
  EXPECT_EQ(FormatDuration(42), "0:42");
  EXPECT_EQ(FormatDuration(725), "12:05");
  EXPECT_EQ(FormatDuration(3723), "1:02:03");
  EXPECT_EQ(FormatDuration(-1), "-");
}

}  // namespace
}  // namespace launcher
}  // namespace tandem
