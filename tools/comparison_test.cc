// Tests of the comparison report on fixture run directories written here: reading runs,
// the figures (throughput after warm-up, speed-up, step split, memory split, loss
// deviation), the recommendation rules, the step timeline cut from traces, the SVG charts
// (well-formed, a rectangle per span and rank) and the markdown, JSON and HTML writers.
#include "tools/comparison.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/test_trace.h"
#include "launcher/trace_merge.h"
#include "runtime/json.h"
#include "runtime/profiler.h"
#include "runtime/test_files.h"
#include "tools/plan.h"
#include "tools/svg.h"

namespace tandem {
namespace tools {
namespace {

using launcher::Event;
using ::testing::HasSubstr;
using ::testing::Not;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// Checks that every tag is closed in order; returns "" or the problem.
std::string XmlProblem(const std::string& xml) {
  std::vector<std::string> open;
  size_t i = 0;
  while ((i = xml.find('<', i)) != std::string::npos) {
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) return "unterminated tag";
    const std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '!' || tag[0] == '?') continue;
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) {
        return absl::StrCat("</", name, "> closes <", open.empty() ? "nothing" : open.back(), ">");
      }
      open.pop_back();
      continue;
    }
    if (tag.back() == '/') continue;
    open.push_back(tag.substr(0, tag.find_first_of(" \n")));
  }
  return open.empty() ? "" : absl::StrCat("<", open.back(), "> never closed");
}

// ---- fixtures: run directories as the launcher and workers leave them ----

struct RankSpec {
  std::vector<double> seconds;  // per step
  double compute = 0.5, exposed = 0.1, bubble = 0, optimizer = 0.05;
  int64_t peak = 100 << 20, params = 10 << 20, grads = 10 << 20, optimizer_bytes = 20 << 20;
};

struct RunSpec {
  std::string strategy = "data";
  std::string schedule = "gpipe";
  // run.json's "replicas" (its "stages" = ranks / replicas) and config "data_parallel";
  // 0: left out, as a run.json from before replicas.
  int replicas = 0;
  int zero = 0;
  std::vector<int64_t> optimizer_state_bytes;  // run.json's per rank; empty: none
  int micro_batches = 1;
  int64_t tokens_per_step = 1000;
  std::vector<double> losses;
  std::vector<RankSpec> ranks;
  bool traces = true;
  double bucket_mb = 25;
  std::string val_losses;  // run.json's "val_losses" as written; empty: none
};

// One step every 1000 us of the rank's own clock (which starts `clock` us late): forward,
// backward with an all-reduce overlapping it, the waits, the gradient norm, the loss
// reduction, the optimizer; with `zero`, ZeRO-1's all-gather of the parameters after it and
// a second optimizer span.
std::vector<TraceEvent> StepEvents(int steps, double clock, bool zero) {
  std::vector<TraceEvent> ev;
  for (int s = 0; s < steps; ++s) {
    const double t = s * 1000 - clock;
    ev.push_back(Event("forward 0", "compute", t + 10, 100, 0));
    ev.push_back(Event("backward 0", "compute", t + 120, 200, 0));
    ev.push_back(Event(absl::StrCat("all_reduce #", s, " (sum)"), "comm", t + 200, 150, -1, 1));
    ev.push_back(Event("wait for gradients", "idle", t + 330, 30));
    ev.push_back(Event("wait 1", "idle", t + 360, 5, 1));
    ev.push_back(Event("gradient norm", "optimizer", t + 366, 3));
    ev.push_back(Event("reduce loss", "idle", t + 370, 20));
    ev.push_back(Event("optimizer", "optimizer", t + 400, 50));
    if (zero) {
      ev.push_back(Event("gather parameters", "idle", t + 450, 20));
      ev.push_back(Event(absl::StrCat("all_gather_parts #", s), "comm", t + 452, 16, -1, 1));
      ev.push_back(Event("optimizer", "optimizer", t + 470, 2));
    }
  }
  return ev;
}

std::string WriteRun(const RunSpec& spec) {
  const std::string dir = FreshTestDir("run");
  mkdir((dir + "/metrics").c_str(), 0755);
  mkdir((dir + "/traces").c_str(), 0755);
  const int steps = static_cast<int>(spec.losses.size());
  std::vector<std::string> losses;
  for (double l : spec.losses) losses.push_back(absl::StrFormat("%.9g", l));
  const int workers = static_cast<int>(spec.ranks.size());
  std::string grid, layout_config;
  if (spec.replicas > 0) {
    grid = absl::StrFormat("\"replicas\": %d, \"stages\": %d, ", spec.replicas,
                           workers / spec.replicas);
    layout_config = absl::StrFormat("\"data_parallel\": %d, \"zero\": %d, ",
                                    spec.strategy == "data" ? 1 : spec.replicas, spec.zero);
  }
  std::vector<std::string> ranks;
  for (size_t r = 0; r < spec.optimizer_state_bytes.size(); ++r) {
    ranks.push_back(absl::StrFormat("{\"rank\": %d, \"optimizer_state_bytes\": %d}", r,
                                    spec.optimizer_state_bytes[r]));
  }
  std::ofstream(dir + "/run.json") << absl::StrFormat(
      "{\n  \"config\": {\"strategy\": \"%s\", \"workers\": %d, \"model\": \"gpt-tiny\", "
      "\"steps\": %d, \"batch\": 16, \"schedule\": \"%s\", \"seed\": \"1234\", %s"
      "\"bucket_mb\": %g, \"overlap\": true, \"profile\": true},\n"
      "  \"strategy\": \"%s\", \"workers\": %d, %s\"device\": \"cpu\", \"micro_batches\": %d,\n"
      "  \"exit\": \"ok\", \"losses\": [%s], %s\"tokens_per_step\": %d,\n  \"ranks\": [%s]\n}\n",
      spec.strategy, workers, steps, spec.schedule, layout_config, spec.bucket_mb, spec.strategy,
      workers, grid, spec.micro_batches, absl::StrJoin(losses, ", "),
      spec.val_losses.empty() ? "" : absl::StrCat("\"val_losses\": ", spec.val_losses, ", "),
      spec.tokens_per_step, absl::StrJoin(ranks, ", "));
  for (size_t r = 0; r < spec.ranks.size(); ++r) {
    const RankSpec& rs = spec.ranks[r];
    std::ofstream m(absl::StrFormat("%s/metrics/rank-%d.jsonl", dir, r));
    for (int s = 0; s < steps; ++s) {
      m << absl::StrFormat(
          "{\"step\": %d, \"loss\": %.9g, \"seconds\": %.6f, \"compute\": %.6f, "
          "\"exposed_comm\": %.6f, \"bubble\": %.6f, \"optimizer\": %.6f, \"comm_bytes\": 10, "
          "\"sequence\": %d, \"lr\": 0.001, \"grad_norm\": 1, \"skipped\": false, "
          "\"allocated_bytes\": 5, \"peak_bytes\": %d, \"param_bytes\": %d, \"grad_bytes\": %d, "
          "\"optimizer_bytes\": %d}\n",
          s, spec.losses[s], rs.seconds[s], rs.compute, rs.exposed, rs.bubble, rs.optimizer, s,
          rs.peak, rs.params, rs.grads, rs.optimizer_bytes);
    }
    if (spec.traces) {
      // Rank r's clock started 5 ms after rank r - 1's, on the same host.
      const std::vector<TraceEvent> events = StepEvents(steps, 5000.0 * r, spec.zero == 1);
      const TraceClock clock{"boot-x", 100000.0 + 5000.0 * r};
      std::ofstream(absl::StrFormat("%s/traces/rank-%d.json", dir, r)) << Profiler::ChromeTrace(
          {TraceProcess{static_cast<int>(r), absl::StrCat("rank ", r), &events, clock}});
    }
  }
  return dir;
}

RankSpec Rank(std::vector<double> seconds) {
  RankSpec r;
  r.seconds = std::move(seconds);
  return r;
}

Entry Ran(const std::string& name, const std::string& label, const std::string& dir) {
  Entry e;
  e.name = name;
  e.label = label;
  absl::StatusOr<RunData> run = ReadRun(dir);
  EXPECT_TRUE(run.ok()) << run.status();
  if (run.ok()) {
    e.ran = true;
    e.run = *run;
  }
  return e;
}

// ---- reading ----

TEST(ReadRunTest, ReadsRunJsonMetricsAndAlignedTraces) {
  RunSpec spec;
  spec.losses = {5, 4, 3};
  spec.ranks = {Rank({1, 1, 1}), Rank({1, 1, 1})};
  const std::string dir = WriteRun(spec);
  absl::StatusOr<RunData> run = ReadRun(dir);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->strategy, "data");
  EXPECT_EQ(run->workers, 2);
  EXPECT_EQ(run->steps, 3);
  EXPECT_EQ(run->batch, 16);
  EXPECT_EQ(run->seed, "1234");
  EXPECT_EQ(run->device, "cpu");
  EXPECT_EQ(run->tokens_per_step, 1000);
  EXPECT_EQ(run->losses, (std::vector<double>{5, 4, 3}));
  ASSERT_EQ(run->ranks.size(), 2u);
  EXPECT_EQ(run->ranks[1].size(), 3u);
  EXPECT_EQ(run->ranks[1][2].step, 2);
  EXPECT_EQ(run->ranks[1][2].grad_bytes, 10 << 20);
  // A run.json from before replicas: data parallel's every worker a replica, no ZeRO; the
  // optimizer state from the metrics lines.
  EXPECT_EQ(run->grid.replicas, 2);
  EXPECT_EQ(run->grid.stages, 1);
  EXPECT_EQ(run->zero, 0);
  EXPECT_EQ(run->optimizer_state_bytes,
            (std::vector<int64_t>{spec.ranks[0].optimizer_bytes, spec.ranks[1].optimizer_bytes}));
  ASSERT_EQ(run->traces.size(), 2u);
  // Rank 1's clock started 5000 us later; after alignment its first forward is rank 0's.
  EXPECT_DOUBLE_EQ(run->traces[1].events[0].start_us, run->traces[0].events[0].start_us);

  EXPECT_FALSE(ReadRun(dir + "/nothing").ok());
  std::ofstream(dir + "/metrics/rank-1.jsonl") << "{\"step\": 0, broken\n";
  EXPECT_FALSE(ReadRun(dir).ok());
}

TEST(ReadRunTest, ReadsAHybridLayoutAndEachRanksOptimizerState) {
  RunSpec spec;
  spec.strategy = "pipeline";
  spec.schedule = "1f1b";
  spec.replicas = 2;
  spec.zero = 1;
  spec.losses = {5, 4, 3};
  spec.ranks = {Rank({1, 1, 1}), Rank({1, 1, 1}), Rank({1, 1, 1}), Rank({1, 1, 1})};
  // run.json's figures, not the metrics lines' (20 MB each), are the ones read.
  spec.optimizer_state_bytes = {3 << 20, 4 << 20, 5 << 20, 6 << 20};
  const std::string dir = WriteRun(spec);
  absl::StatusOr<RunData> run = ReadRun(dir);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->grid.replicas, 2);
  EXPECT_EQ(run->grid.stages, 2);
  EXPECT_EQ(run->data_parallel, 2);
  EXPECT_EQ(run->zero, 1);
  EXPECT_EQ(run->optimizer_state_bytes, spec.optimizer_state_bytes);

  Entry e;
  e.ran = true;
  e.run = *run;
  const Figures f = ComputeFigures(e, nullptr);
  EXPECT_EQ(f.strategy, "pipeline");
  EXPECT_EQ(f.schedule, "1f1b");
  EXPECT_EQ(f.replicas, 2);
  EXPECT_EQ(f.stages, 2);
  EXPECT_EQ(f.zero, 1);
  EXPECT_EQ(Layout(f), "2 x 2, ZeRO-1");
  EXPECT_EQ(f.optimizer_bytes, 6 << 20);
  ASSERT_EQ(f.ranks.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(f.ranks[r].replica, r % 2) << r;  // rank = stage x D + replica
    EXPECT_EQ(f.ranks[r].stage, r / 2) << r;
    EXPECT_EQ(f.ranks[r].optimizer_bytes, spec.optimizer_state_bytes[r]) << r;
  }

  // An older pipeline run.json: one pipeline of every worker.
  spec.replicas = 0;
  absl::StatusOr<RunData> old = ReadRun(WriteRun(spec));
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->grid.replicas, 1);
  EXPECT_EQ(old->grid.stages, 4);
  // A layout that is not the run's workers.
  spec.replicas = 3;
  EXPECT_FALSE(ReadRun(WriteRun(spec)).ok());
}

// ---- figures ----

TEST(FiguresTest, ThroughputSpeedupStepSplitMemoryAndLoss) {
  RunSpec base;
  base.losses = {5, 4, 3, 2};
  base.ranks = {Rank({9, 9, 2, 2})};  // warm-up steps left out: 2 s per step
  RunSpec data;
  data.losses = {5, 4.001, 3, 1.997};
  // The slowest rank's mean: rank 1's, 1.25 s (the slowest of each step would make it 1.5).
  data.ranks = {Rank({9, 9, 1, 1}), Rank({9, 9, 0.5, 2})};
  data.ranks[1].peak = 30 << 20;  // below params + grads + optimizer: no activations
  const Entry b = Ran("baseline", "one worker", WriteRun(base));
  const Entry d = Ran("data", "data parallel", WriteRun(data));

  const Figures fb = ComputeFigures(b, &b);
  EXPECT_DOUBLE_EQ(fb.step_seconds, 2);
  EXPECT_DOUBLE_EQ(fb.tokens_per_second, 500);
  EXPECT_DOUBLE_EQ(fb.speedup, 1);
  EXPECT_DOUBLE_EQ(fb.max_loss_deviation, 0);

  const Figures f = ComputeFigures(d, &b);
  EXPECT_EQ(f.workers, 2);
  EXPECT_EQ(f.steps, 4);
  EXPECT_DOUBLE_EQ(f.step_seconds, 1.25);
  EXPECT_DOUBLE_EQ(f.tokens_per_second, 800);
  EXPECT_NEAR(f.step_variation, 0.6, 1e-12);  // rank 1's 0.5 and 2 around 1.25
  EXPECT_DOUBLE_EQ(fb.step_variation, 0);
  EXPECT_DOUBLE_EQ(f.speedup, 1.6);
  EXPECT_DOUBLE_EQ(f.efficiency, 0.8);
  EXPECT_NEAR(f.max_loss_deviation, 0.003, 1e-12);
  EXPECT_DOUBLE_EQ(f.final_loss, 1.997);
  ASSERT_EQ(f.ranks.size(), 2u);
  const RankFigures& r0 = f.ranks[0];
  EXPECT_DOUBLE_EQ(r0.step_seconds, 1);
  EXPECT_DOUBLE_EQ(r0.compute_seconds, 0.5);
  EXPECT_DOUBLE_EQ(r0.exposed_comm_seconds, 0.1);
  EXPECT_DOUBLE_EQ(r0.optimizer_seconds, 0.05);
  EXPECT_NEAR(r0.other_seconds, 0.35, 1e-12);
  EXPECT_EQ(r0.peak_bytes, 100 << 20);
  EXPECT_EQ(r0.activation_bytes, 60 << 20);   // 100 - 10 - 10 - 20
  EXPECT_EQ(f.ranks[1].activation_bytes, 0);  // clamped
  EXPECT_EQ(f.peak_bytes, 100 << 20);
  EXPECT_EQ(f.activation_bytes, 60 << 20);
  EXPECT_DOUBLE_EQ(f.compute_seconds, 0.5);

  const Figures alone = ComputeFigures(d, nullptr);
  EXPECT_TRUE(std::isnan(alone.speedup));
  EXPECT_TRUE(std::isnan(alone.max_loss_deviation));

  Entry failed;
  failed.name = "model";
  failed.label = "model parallel";
  failed.error = "--micro-batches=4 with --strategy=model: ...";
  const Figures ff = ComputeFigures(failed, &b);
  EXPECT_FALSE(ff.ran);
  EXPECT_EQ(ff.error, failed.error);
}

// Figures made by hand for the rules, on 4 workers; the layout from the name, as compare
// names its runs ("d2k2-1f1b": 2 replicas x 2-stage 1F1B).
Figures Fig(const std::string& name, const std::string& label, double tps, int64_t peak_mb,
            int64_t act_mb, double speedup) {
  Figures f;
  f.name = name;
  f.label = label;
  f.ran = true;
  f.workers = 4;
  if (name == "baseline" || absl::StartsWith(name, "data")) {
    f.strategy = "data";
    f.replicas = name == "baseline" ? 1 : 4;
    f.zero = name == "data-zero1" ? 1 : 0;
  } else if (name == "model") {
    f.strategy = "model";
    f.stages = 4;
  } else {
    f.strategy = "pipeline";
    f.schedule = "gpipe";
    for (const char* other : {"1f1b", "zb-h1"}) {
      if (absl::EndsWith(name, other)) f.schedule = other;
    }
    f.replicas = absl::StartsWith(name, "d2k2") ? 2 : 1;
    f.stages = 4 / f.replicas;
  }
  f.steps = 20;
  f.tokens_per_second = tps;
  f.step_seconds = 1;
  f.peak_bytes = peak_mb << 20;
  f.activation_bytes = act_mb << 20;
  f.speedup = speedup;
  f.efficiency = speedup / 4;
  f.max_loss_deviation = 1e-6;
  f.final_loss = 3;
  return f;
}

TEST(RecommendTest, FastestLeastMemoryAndTheirReasons) {
  std::vector<Figures> f = {
      Fig("baseline", "one worker", 1000, 100, 60, 1),
      Fig("data", "data parallel", 3000, 100, 60, 3),
      Fig("model", "model parallel", 1200, 40, 30, 1.2),
      Fig("gpipe", "pipeline GPipe", 2500, 60, 45, 2.5),
      Fig("1f1b", "pipeline 1F1B", 2700, 30, 15, 2.7),
  };
  f[3].bubble_seconds = 0.5;  // half its step
  f[3].step_variation = 0.5;  // a busy host
  f[4].max_loss_deviation = 0;
  Figures failed;
  failed.name = "x";
  failed.label = "strategy x";
  failed.error = "refused: too many workers\nsecond line";
  f.push_back(failed);
  const std::vector<std::string> summary = Recommend(&f, /*host_cores=*/2);
  EXPECT_THAT(f[0].recommendation, HasSubstr("reference"));
  EXPECT_EQ(f[1].recommendation, "fastest: 3.00x one worker's speed, 75% scaling efficiency");
  EXPECT_THAT(f[4].recommendation,
              HasSubstr("least memory per rank: 3.33x less peak memory per rank than data "
                        "parallel (30.0 MB vs 100 MB) at 0.90x its speed"));
  EXPECT_THAT(f[4].recommendation,
              HasSubstr("vs GPipe: 3.00x less activation memory at 1.08x its speed"));
  EXPECT_THAT(f[3].recommendation, HasSubstr("saves memory"));
  EXPECT_THAT(f[3].recommendation, HasSubstr("the bubble is 50% of its step"));
  EXPECT_THAT(f[3].recommendation, HasSubstr("its step times varied 50% around their mean"));
  EXPECT_EQ(f[5].recommendation, "could not run: refused: too many workers");

  const std::string all = absl::StrJoin(summary, "\n");
  EXPECT_THAT(all, HasSubstr("Fastest: data parallel, 3,000 tokens/s, 3.00x one worker (75% "
                             "scaling efficiency over 4 workers)."));
  EXPECT_THAT(all, HasSubstr("Least memory per rank: pipeline 1F1B, 30.0 MB peak"));
  EXPECT_THAT(all, HasSubstr("Recommendation: data parallel; pipeline 1F1B when memory per "
                             "device is the limit."));
  EXPECT_THAT(all, HasSubstr("Losses: every strategy within 1e-06"));
  EXPECT_THAT(all, HasSubstr("Host: 4 workers shared 2 CPU cores"));
  EXPECT_THAT(all, HasSubstr("Noisy timings: step times varied around their mean (pipeline "
                             "GPipe 50%)"));
  EXPECT_THAT(all, HasSubstr("strategy x could not run: refused: too many workers"));
}

// "1.44x" for a / b, as the report writes ratios below 10.
std::string X(double a, double b) { return absl::StrFormat("%.2fx", a / b); }

TEST(RecommendTest, PicksAHybridLayoutAndStatesZeroOnesSaving) {
  std::vector<Figures> f = {
      Fig("baseline", "one worker", 1000, 100, 60, 1),
      Fig("data", "data parallel", 3000, 100, 50, 3),
      Fig("data-zero1", "data parallel, ZeRO-1", 2800, 70, 50, 2.8),
      Fig("model", "model parallel", 1200, 40, 30, 1.2),
      Fig("gpipe", "pipeline GPipe", 2500, 60, 45, 2.5),
      Fig("1f1b", "pipeline 1F1B", 2700, 50, 15, 2.7),
      Fig("d2k2-gpipe", "2 replicas x 2-stage GPipe", 3600, 80, 40, 3.6),
      Fig("d2k2-1f1b", "2 replicas x 2-stage 1F1B", 3400, 25, 20, 3.4),
  };
  f[1].optimizer_bytes = int64_t{40} << 20;  // every rank all of it
  f[2].optimizer_bytes = int64_t{10} << 20;  // a quarter each
  const std::vector<std::string> summary = Recommend(&f, /*host_cores=*/8);
  const std::string all = absl::StrJoin(summary, "\n");

  EXPECT_THAT(all, HasSubstr("Fastest: 2 replicas x 2-stage GPipe, 3,600 tokens/s"));
  EXPECT_THAT(all, HasSubstr("Least memory per rank: 2 replicas x 2-stage 1F1B, 25.0 MB peak"));
  EXPECT_THAT(all, HasSubstr("Recommendation: 2 replicas x 2-stage GPipe; 2 replicas x 2-stage "
                             "1F1B when memory per device is the limit."));
  EXPECT_THAT(all, HasSubstr(absl::StrCat(
                       "ZeRO-1: 10.0 MB of optimizer state on its largest rank against data "
                       "parallel's 40.0 MB (",
                       X(40, 10),
                       " less, each rank keeping 1/4 of it); peak memory per rank "
                       "70.0 MB against 100 MB, at ",
                       X(2800, 3000), " its speed.")));

  EXPECT_THAT(f[6].recommendation, testing::StartsWith("fastest: "));
  EXPECT_THAT(f[6].recommendation,
              HasSubstr(absl::StrCat("vs pipeline GPipe: ", X(3600, 2500), " its speed with ",
                                     X(80, 60), " its peak memory per rank")));
  EXPECT_THAT(f[7].recommendation, testing::StartsWith("least memory per rank: "));
  EXPECT_THAT(f[7].recommendation,
              HasSubstr(absl::StrCat("vs GPipe: ", X(40, 20), " less activation memory at ",
                                     X(3400, 3600), " its speed")));
  EXPECT_THAT(f[7].recommendation,
              HasSubstr(absl::StrCat("vs pipeline 1F1B: ", X(3400, 2700), " its speed with ",
                                     X(25, 50), " its peak memory per rank")));
  EXPECT_THAT(f[2].recommendation,
              HasSubstr(absl::StrCat("vs data parallel: ", X(40, 10),
                                     " less optimizer state per rank (10.0 MB vs 40.0 MB) at ",
                                     X(2800, 3000), " its speed")));
  // Plain 1F1B's comparison is with plain GPipe, not the hybrid layout's.
  EXPECT_THAT(f[5].recommendation,
              HasSubstr(absl::StrCat("vs GPipe: ", X(45, 15), " less activation memory at ",
                                     X(2700, 2500), " its speed")));

  // ZeRO-1 with the least peak memory per rank is the one named for it.
  f[2].peak_bytes = int64_t{20} << 20;
  const std::string again = absl::StrJoin(Recommend(&f, 8), "\n");
  EXPECT_THAT(again, HasSubstr("Least memory per rank: data parallel, ZeRO-1, 20.0 MB peak"));
  EXPECT_THAT(f[2].recommendation, testing::StartsWith("least memory per rank: "));
}

// ZB-H1 is set against 1F1B of the same layout (the schedule it reorders), and a hybrid
// ZB-H1 layout against the one ZB-H1 pipeline too.
TEST(RecommendTest, SetsZeroBubbleAgainstOneFOneB) {
  std::vector<Figures> f = {
      Fig("baseline", "one worker", 1000, 100, 60, 1),
      Fig("1f1b", "pipeline 1F1B", 2700, 50, 15, 2.7),
      Fig("zb-h1", "pipeline ZB-H1", 2900, 55, 18, 2.9),
      Fig("d2k2-1f1b", "2 replicas x 2-stage 1F1B", 3400, 25, 20, 3.4),
      Fig("d2k2-zb-h1", "2 replicas x 2-stage ZB-H1", 3500, 28, 22, 3.5),
  };
  Recommend(&f, /*host_cores=*/8);
  EXPECT_THAT(f[2].recommendation,
              HasSubstr(absl::StrCat("vs 1F1B: ", X(2900, 2700), " its speed with ", X(18, 15),
                                     " its activation memory")));
  EXPECT_THAT(f[4].recommendation,
              HasSubstr(absl::StrCat("vs 1F1B: ", X(3500, 3400), " its speed with ", X(22, 20),
                                     " its activation memory")));
  EXPECT_THAT(f[4].recommendation,
              HasSubstr(absl::StrCat("vs pipeline ZB-H1: ", X(3500, 2900), " its speed with ",
                                     X(28, 55), " its peak memory per rank")));
}

// run.json's validation losses: the last one per run, in the figures and one summary line,
// only for the runs that evaluated one.
TEST(RecommendTest, FinalValidationLossPerRun) {
  RunSpec base, data;
  base.losses = data.losses = {3, 2.5};
  base.ranks = {Rank({1, 1})};
  data.ranks = {Rank({1, 1}), Rank({1, 1})};
  base.val_losses = "[[1, 2.75], [2, 2.25]]";
  const Entry b = Ran("baseline", "one worker", WriteRun(base));
  const Entry d = Ran("data", "data parallel", WriteRun(data));
  ASSERT_EQ(b.run.val_losses.size(), 2u);
  EXPECT_EQ(b.run.val_losses[0], (std::pair<int, double>{1, 2.75}));
  std::vector<Figures> f = {ComputeFigures(b, &b), ComputeFigures(d, &b)};
  EXPECT_EQ(f[0].final_val_step, 2);
  EXPECT_DOUBLE_EQ(f[0].final_val_loss, 2.25);
  EXPECT_EQ(f[1].final_val_step, 0);
  const std::string all = absl::StrJoin(Recommend(&f, /*host_cores=*/8), "\n");
  EXPECT_THAT(all, HasSubstr("Final validation loss: one worker 2.2500 (after step 2)."));
  f[0].final_val_step = 0;
  EXPECT_THAT(absl::StrJoin(Recommend(&f, 8), "\n"), Not(HasSubstr("validation")));
}

TEST(RecommendTest, CallsOutLossesAndASlowerThanOneWorkerHost) {
  std::vector<Figures> f = {
      Fig("baseline", "one worker", 1000, 100, 60, 1),
      Fig("data", "data parallel", 800, 100, 60, 0.8),
      Fig("model", "model parallel", 700, 100, 60, 0.7),
  };
  f[2].max_loss_deviation = 0.01;  // beyond 1e-4 of a loss of 3
  const std::vector<std::string> summary = Recommend(&f, /*host_cores=*/8);
  const std::string all = absl::StrJoin(summary, "\n");
  EXPECT_THAT(all, HasSubstr("on this host one worker is fastest"));
  EXPECT_THAT(all, HasSubstr("Losses differ from one worker's beyond 0.0001 relative: model "
                             "parallel (0.01)"));
  EXPECT_THAT(all, Not(HasSubstr("Host:")));
  EXPECT_THAT(all, Not(HasSubstr("Noisy")));
  EXPECT_THAT(f[2].recommendation, HasSubstr("check first: its losses differ from one worker's"));
  EXPECT_THAT(f[2].recommendation,
              HasSubstr("0.88x data parallel's speed with 1.00x its peak memory per rank"));
  EXPECT_THAT(f[1].recommendation,
              HasSubstr("fastest, and the least memory per rank: 0.80x one worker's speed"));
  EXPECT_THAT(all, HasSubstr("Least memory per rank: data parallel as well"));
}

// ---- timelines ----

TEST(TimelineTest, CutsOneStepFromEveryRankOnOneClock) {
  RunSpec spec;
  spec.losses = {5, 4, 3};
  spec.ranks = {Rank({1, 1, 1}), Rank({1, 1, 1})};
  absl::StatusOr<RunData> run = ReadRun(WriteRun(spec));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(TimelineStep(*run), 1);
  absl::StatusOr<GanttSpec> g = StepTimeline(*run, 1, "t");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->rows, (std::vector<std::string>{"rank 0", "rank 1"}));
  // Step 1 runs from the end of step 0's optimizer (450 us) to the end of its own (1450 us).
  EXPECT_NEAR(g->end_ms, 1.0, 1e-9);
  std::map<int, int> per_row;
  int comm = 0;
  for (const GanttSpan& s : g->spans) {
    per_row[s.row]++;
    if (s.comm_lane) {
      ++comm;
      EXPECT_EQ(s.kind, SpanKind::kComm);
      EXPECT_NEAR(s.start_ms, 0.75, 1e-9);  // 1200 us - 450 us: during backward
    }
    if (s.kind == SpanKind::kForward) {
      EXPECT_NEAR(s.start_ms, 0.56, 1e-9);
      EXPECT_EQ(s.text, "0");
    }
  }
  // Forward, backward, all-reduce, 3 waits, gradient norm, optimizer.
  EXPECT_EQ(per_row[0], 8);
  EXPECT_EQ(per_row[1], 8);
  EXPECT_EQ(comm, 2);
  std::map<SpanKind, int> kinds;
  for (const GanttSpan& s : g->spans) kinds[s.kind]++;
  EXPECT_EQ(kinds[SpanKind::kExposedComm], 4);  // wait for gradients, reduce loss
  EXPECT_EQ(kinds[SpanKind::kBubble], 2);       // wait 1
  EXPECT_EQ(kinds[SpanKind::kOptimizer], 4);    // gradient norm, optimizer
  // On a pipeline the loss reduction is where the stages wait for the last one: bubble.
  RunSpec pipeline = spec;
  pipeline.strategy = "pipeline";
  absl::StatusOr<RunData> piped = ReadRun(WriteRun(pipeline));
  ASSERT_TRUE(piped.ok()) << piped.status();
  absl::StatusOr<GanttSpec> pg = StepTimeline(*piped, 1, "t");
  ASSERT_TRUE(pg.ok()) << pg.status();
  std::map<SpanKind, int> pipeline_kinds;
  for (const GanttSpan& s : pg->spans) pipeline_kinds[s.kind]++;
  EXPECT_EQ(pipeline_kinds[SpanKind::kExposedComm], 2);  // wait for gradients
  EXPECT_EQ(pipeline_kinds[SpanKind::kBubble], 4);       // wait 1, reduce loss

  EXPECT_FALSE(StepTimeline(*run, 3, "t").ok());  // only 3 steps
  RunSpec plain = spec;
  plain.traces = false;
  absl::StatusOr<RunData> untraced = ReadRun(WriteRun(plain));
  ASSERT_TRUE(untraced.ok());
  EXPECT_FALSE(StepTimeline(*untraced, 1, "t").ok());
}

TEST(TimelineTest, AZeroOneStepEndsAfterItsAllGather) {
  RunSpec spec;
  spec.replicas = 2;
  spec.zero = 1;
  spec.losses = {5, 4, 3};
  spec.ranks = {Rank({1, 1, 1}), Rank({1, 1, 1})};
  absl::StatusOr<RunData> run = ReadRun(WriteRun(spec));
  ASSERT_TRUE(run.ok()) << run.status();
  absl::StatusOr<GanttSpec> g = StepTimeline(*run, 1, "t");
  ASSERT_TRUE(g.ok()) << g.status();
  // Step 1 runs from the end of step 0's second optimizer span (472 us) to its own (1472 us).
  EXPECT_NEAR(g->end_ms, 1.0, 1e-9);
  std::map<SpanKind, int> kinds;
  for (const GanttSpan& s : g->spans) {
    kinds[s.kind]++;
    if (s.kind == SpanKind::kForward) {
      EXPECT_NEAR(s.start_ms, 1.010 - 0.472, 1e-9);
    }
  }
  EXPECT_EQ(kinds[SpanKind::kOptimizer], 6);    // gradient norm and 2 optimizer spans a rank
  EXPECT_EQ(kinds[SpanKind::kExposedComm], 6);  // and gather parameters
  EXPECT_EQ(kinds[SpanKind::kComm], 4);         // all-reduce, all-gather
}

// ---- SVG ----

TEST(SvgTest, GanttIsWellFormedWithARectanglePerSpan) {
  GanttSpec g;
  g.title = "pipeline <1F1B> & more";
  g.rows = {"rank 0", "rank 1", "rank 2"};
  for (int r = 0; r < 3; ++r) {
    g.spans.push_back({r, false, 0.0 + r, 1.0 + r, SpanKind::kForward, "0", "f"});
    g.spans.push_back({r, false, 2.0 + r, 4.0 + r, SpanKind::kBackward, "0", "b"});
    g.spans.push_back({r, true, 2.5 + r, 3.0 + r, SpanKind::kComm, "", "all_reduce #1"});
  }
  g.spans.push_back({7, false, 0, 1, SpanKind::kForward, "", ""});  // no such row: left out
  const std::string svg = GanttSvg(g);
  EXPECT_EQ(XmlProblem(svg), "");
  EXPECT_EQ(Count(svg, "<svg"), 1);
  EXPECT_THAT(svg, HasSubstr("pipeline &lt;1F1B&gt; &amp; more"));
  // Background + 2 lane backgrounds per row + 3 spans per row + legend squares (3 kinds).
  EXPECT_EQ(Count(svg, "<rect"), 1 + 3 * 2 + 9 + 3);
  for (int r = 0; r < 3; ++r) EXPECT_THAT(svg, HasSubstr(absl::StrCat(">rank ", r, "<")));
  EXPECT_THAT(svg, HasSubstr(SpanKindColor(SpanKind::kComm)));
  EXPECT_THAT(svg, HasSubstr(SpanKindName(SpanKind::kBackward)));
  EXPECT_THAT(svg, HasSubstr("time in the step (ms)"));
  EXPECT_THAT(svg, HasSubstr("<title>all_reduce #1</title>"));
}

TEST(SvgTest, BarChartsAreWellFormed) {
  BarChartSpec b;
  b.title = "Throughput";
  b.unit = "tokens/s";
  b.bars = {{"one worker", 1000, "", ""}, {"data \"parallel\"", 3000, "3,000 (3.00x)", "#123456"}};
  const std::string bars = BarChartSvg(b);
  EXPECT_EQ(XmlProblem(bars), "");
  EXPECT_THAT(bars, HasSubstr("data &quot;parallel&quot;"));
  EXPECT_THAT(bars, HasSubstr("3,000 (3.00x)"));
  EXPECT_THAT(bars, HasSubstr("1,000 tokens/s"));
  EXPECT_THAT(bars, HasSubstr("#123456"));

  StackedBarChartSpec s;
  s.title = "Memory";
  s.unit = "MB";
  s.series = {{"parameters", "#111111"}, {"activations", "#222222"}};
  s.groups = {{"data parallel", {{"r0", {1, 2}}, {"r1", {1, 2}}}},
              {"pipeline", {{"r0", {0.5, 0}}, {"r1", {0.5, 1}}}}};
  const std::string stacked = StackedBarChartSvg(s);
  EXPECT_EQ(XmlProblem(stacked), "");
  // Background + 2 legend squares + the non-zero segments (2 + 2 + 1 + 2).
  EXPECT_EQ(Count(stacked, "<rect"), 1 + 2 + 7);
  EXPECT_EQ(Count(stacked, ">r0<"), 2);
  EXPECT_THAT(stacked, HasSubstr(">pipeline<"));

  EXPECT_DOUBLE_EQ(NiceStep(100, 5), 20);
  EXPECT_DOUBLE_EQ(NiceStep(7, 10), 1);
  EXPECT_NEAR(NiceStep(0.3, 5), 0.1, 1e-12);
  EXPECT_NEAR(NiceStep(0.3, 6), 0.05, 1e-12);
  EXPECT_DOUBLE_EQ(NiceStep(0, 5), 1);
  EXPECT_EQ(XmlEscape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
}

TEST(SvgTest, LongGroupLabelsGoOnTwoLinesAndWidenTheChart) {
  StackedBarChartSpec s;
  s.title = "Memory";
  s.unit = "MB";
  s.series = {{"parameters", "#111111"}};
  for (int g = 0; g < 12; ++g) {
    s.groups.push_back({absl::StrCat(g, " replicas x 2-stage GPipe"), {{"r0", {1}}}});
  }
  const std::string svg = StackedBarChartSvg(s);
  EXPECT_EQ(XmlProblem(svg), "");
  EXPECT_THAT(svg, HasSubstr(">11 replicas x<"));
  EXPECT_THAT(svg, HasSubstr(">2-stage GPipe<"));
  EXPECT_THAT(svg, Not(HasSubstr(">11 replicas x 2-stage GPipe<")));
  // 12 one-bar groups, each as wide as "2-stage GPipe" in bold: wider than the 960 asked for.
  EXPECT_THAT(svg, Not(HasSubstr("width=\"960\"")));
  s.groups.resize(2);  // room enough: one line each, the width asked for
  const std::string roomy = StackedBarChartSvg(s);
  EXPECT_THAT(roomy, HasSubstr(">1 replicas x 2-stage GPipe<"));
  EXPECT_THAT(roomy, HasSubstr("width=\"960\""));

  GanttSpec g;
  g.title = "hybrid";
  g.rows = {"rank 0 (0, 0)", "rank 1 (1, 0)"};
  g.spans.push_back({1, false, 0, 1, SpanKind::kForward, "", ""});
  const std::string gantt = GanttSvg(g);
  EXPECT_EQ(XmlProblem(gantt), "");
  // The row labels end left of the plot, at a positive x: none is cut off.
  const size_t label = gantt.find(">rank 1 (1, 0)<");
  ASSERT_NE(label, std::string::npos);
  const size_t x = gantt.rfind("<text x=\"", label);
  EXPECT_GT(std::stod(gantt.substr(x + 9)), 13 * 7.0);
}

// ---- the report ----

std::vector<Entry> FiveEntries() {
  RunSpec base;
  base.losses = {5, 4, 3, 2};
  base.ranks = {Rank({2, 2, 2, 2})};
  RunSpec data = base;
  data.ranks = {Rank({1, 1, 1, 1}), Rank({1, 1, 1, 1})};
  RunSpec gpipe = data;
  gpipe.strategy = "pipeline";
  gpipe.micro_batches = 8;
  for (RankSpec& r : gpipe.ranks) {
    r.peak = 50 << 20;
    r.params = r.grads = 5 << 20;
    r.optimizer_bytes = 10 << 20;
    r.bubble = 0.4;
  }
  RunSpec onef1b = gpipe;
  onef1b.schedule = "1f1b";
  for (RankSpec& r : onef1b.ranks) r.peak = 30 << 20;
  Entry model;
  model.name = "model";
  model.label = "model parallel";
  model.error = "--micro-batches=2 with --strategy=model: model parallelism runs one batch";
  return {Ran("baseline", "one worker", WriteRun(base)),
          Ran("data", "data parallel", WriteRun(data)), model,
          Ran("gpipe", "pipeline GPipe", WriteRun(gpipe)),
          Ran("1f1b", "pipeline 1F1B", WriteRun(onef1b))};
}

TEST(ReportTest, BuildsChartsTimelinesAndWritesEveryFile) {
  const Report r = BuildReport(FiveEntries(), 2, 2, "compare --gpus=2", "2025-01-01 00:00:00 UTC");
  EXPECT_EQ(r.model, "gpt-tiny");
  EXPECT_EQ(r.gpus, 2);
  EXPECT_EQ(r.batch, 16);
  EXPECT_EQ(r.steps, 4);
  ASSERT_EQ(r.figures.size(), 5u);
  ASSERT_EQ(r.charts.size(), 3u);
  EXPECT_EQ(r.timelines.size(), 4u);  // every strategy that ran
  for (const Chart& c : r.charts) EXPECT_EQ(XmlProblem(c.svg), "") << c.file;
  for (const Chart& c : r.timelines) EXPECT_EQ(XmlProblem(c.svg), "") << c.file;
  EXPECT_THAT(r.timelines[1].caption, HasSubstr("fit in one bucket of --bucket-mb=25"));
  EXPECT_THAT(r.timelines[2].caption, HasSubstr("8 micro-batches through 2 stages, GPipe"));
  EXPECT_THAT(r.timelines[3].caption, HasSubstr("1F1B"));
  // The memory chart has a bar per rank per strategy that ran: 1 + 2 + 2 + 2.
  EXPECT_EQ(Count(r.charts[2].svg, ">r0<"), 4);
  EXPECT_EQ(Count(r.charts[2].svg, ">r1<"), 3);

  const std::string md = MarkdownReport(r);
  EXPECT_THAT(md, HasSubstr("# Strategy comparison: gpt-tiny on 2 workers"));
  EXPECT_THAT(md, HasSubstr("| data parallel | 2 | 2 x 1 | 1 | 1,000 | 2.00x | 100% | 1000 ms |"));
  EXPECT_THAT(md, HasSubstr("| model parallel | - |"));
  EXPECT_THAT(md, HasSubstr("could not run: --micro-batches=2 with --strategy=model"));
  EXPECT_THAT(md, HasSubstr("![Throughput (tokens/s, higher is better)](throughput.svg)"));
  EXPECT_THAT(md, HasSubstr("](timeline-1f1b.svg)"));
  EXPECT_THAT(md,
              HasSubstr("| pipeline 1F1B | 1 | (0, 1) | 1000 ms | 500 ms | 100 ms | 400 ms | 50.0 "
                        "ms |"));
  EXPECT_THAT(md, HasSubstr("30.0 MB | 5.0 MB | 5.0 MB | 10.0 MB | 10.0 MB |"));
  EXPECT_THAT(md, HasSubstr("- Recommendation: data parallel; pipeline 1F1B when memory"));

  absl::StatusOr<Json> json = ParseJson(JsonReport(r));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(StringOr(*json, "model", ""), "gpt-tiny");
  const Json& strategies = (*json)["strategies"];
  ASSERT_TRUE(strategies.is_array());
  ASSERT_EQ(strategies.size(), 5u);
  const Json& d = strategies[1];
  EXPECT_EQ(StringOr(d, "name", ""), "data");
  EXPECT_DOUBLE_EQ(NumberOr(d, "tokens_per_second", 0), 1000);
  EXPECT_DOUBLE_EQ(NumberOr(d, "speedup", 0), 2);
  EXPECT_DOUBLE_EQ(NumberOr(d, "scaling_efficiency", 0), 1);
  EXPECT_EQ(d["ranks"].size(), 2u);
  EXPECT_DOUBLE_EQ(NumberOr(d["ranks"][0], "activation_bytes", 0), 60 << 20);
  EXPECT_EQ(StringOr(d, "timeline", ""), "timeline-data.svg");
  EXPECT_EQ(NumberOr(strategies[2], "ran", 1), 0);
  EXPECT_THAT(StringOr(strategies[2], "error", ""), HasSubstr("--micro-batches=2"));
  EXPECT_GE((*json)["summary"].size(), 3u);

  const std::string html = HtmlReport(r);
  EXPECT_EQ(Count(html, "<svg"), 3 + 4);
  EXPECT_EQ(Count(html, "</svg>"), 3 + 4);
  EXPECT_EQ(Count(html, "<figcaption>"), 3);  // the baseline's timeline has none
  EXPECT_THAT(html, HasSubstr("<!DOCTYPE html>"));
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("src=")));
  EXPECT_THAT(html, Not(HasSubstr("<link")));

  const std::string out = FreshTestDir("report");
  ASSERT_TRUE(WriteReport(r, out).ok());
  for (const char* f :
       {"report.md", "report.json", "report.html", "throughput.svg", "step-time.svg", "memory.svg",
        "timeline-baseline.svg", "timeline-data.svg", "timeline-gpipe.svg", "timeline-1f1b.svg"}) {
    EXPECT_FALSE(ReadAll(absl::StrCat(out, "/", f)).empty()) << f;
  }
  EXPECT_FALSE(WriteReport(r, out + "/missing/dir").ok());
}

// The fill of the throughput bar whose tooltip begins with `label`; "" when none.
std::string BarFill(const std::string& svg, const std::string& label) {
  const size_t title = svg.find(absl::StrCat("<title>", label, ": "));
  if (title == std::string::npos) return "";
  const size_t fill = svg.rfind("fill=\"", title);
  return svg.substr(fill + 6, 7);
}

TEST(ReportTest, ShowsHybridLayoutsAndZeroOne) {
  RunSpec base;
  base.losses = {5, 4, 3, 2};
  base.ranks = {Rank({2, 2, 2, 2})};
  RunSpec data = base;
  data.replicas = 4;
  data.ranks.assign(4, Rank({1, 1, 1, 1}));
  RunSpec zero = data;
  zero.zero = 1;
  zero.optimizer_state_bytes.assign(4, 5 << 20);
  RunSpec hybrid = data;
  hybrid.strategy = "pipeline";
  hybrid.schedule = "1f1b";
  hybrid.replicas = 2;
  hybrid.micro_batches = 4;
  Report r = BuildReport(
      {Ran("baseline", "one worker", WriteRun(base)), Ran("data", "data parallel", WriteRun(data)),
       Ran("data-zero1", "data parallel, ZeRO-1", WriteRun(zero)),
       Ran("d2k2-1f1b", "2 replicas x 2-stage 1F1B", WriteRun(hybrid))},
      4, 2, "compare --gpus=4", "2025-01-01 00:00:00 UTC");
  r.run_notes = {"a note on the runs"};
  ASSERT_EQ(r.figures.size(), 4u);

  const std::string md = MarkdownReport(r);
  EXPECT_THAT(md, HasSubstr("| data parallel, ZeRO-1 | 4 | 4 x 1, ZeRO-1 | 1 |"));
  EXPECT_THAT(md, HasSubstr("| 2 replicas x 2-stage 1F1B | 4 | 2 x 2 | 4 |"));
  // The optimizer state column: the largest rank's, 20 MB in the metrics, 5 MB in run.json.
  EXPECT_THAT(md, HasSubstr("| 100 MB | 5.0 MB | 2.0000 |"));
  EXPECT_THAT(md, HasSubstr("| 100 MB | 20.0 MB | 2.0000 |"));
  // Rank 2 is stage 1's first replica, rank 1 stage 0's second.
  EXPECT_THAT(md, HasSubstr("| 2 replicas x 2-stage 1F1B | 2 | (0, 1) |"));
  EXPECT_THAT(md, HasSubstr("| 2 replicas x 2-stage 1F1B | 1 | (1, 0) |"));
  EXPECT_THAT(md, HasSubstr("\n- a note on the runs\n"));
  EXPECT_THAT(md, HasSubstr("](timeline-d2k2-1f1b.svg)"));
  EXPECT_THAT(md, HasSubstr("ZeRO-1: 5.0 MB of optimizer state on its largest rank against data "
                            "parallel's 20.0 MB"));

  const std::string html = HtmlReport(r);
  EXPECT_THAT(html, HasSubstr("<td class=\"n\">2 x 2</td>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"n\">4 x 1, ZeRO-1</td>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"n\">(0, 1)</td>"));
  EXPECT_THAT(html, HasSubstr("<li>a note on the runs</li>"));

  absl::StatusOr<Json> json = ParseJson(JsonReport(r));
  ASSERT_TRUE(json.ok()) << json.status();
  const Json& strategies = (*json)["strategies"];
  ASSERT_EQ(strategies.size(), 4u);
  EXPECT_EQ(NumberOr(strategies[2], "zero", 0), 1);
  EXPECT_EQ(NumberOr(strategies[2], "replicas", 0), 4);
  EXPECT_EQ(NumberOr(strategies[2], "optimizer_state_bytes", 0), 5 << 20);
  EXPECT_EQ(NumberOr(strategies[3], "replicas", 0), 2);
  EXPECT_EQ(NumberOr(strategies[3], "stages", 0), 2);
  EXPECT_EQ(NumberOr(strategies[3]["ranks"][2], "replica", -1), 0);
  EXPECT_EQ(NumberOr(strategies[3]["ranks"][2], "stage", -1), 1);
  EXPECT_EQ((*json)["run_notes"][0].get<std::string>(), "a note on the runs");

  // A timeline per run; the hybrid one's rows say each rank's (replica, stage).
  ASSERT_EQ(r.timelines.size(), 4u);
  const Chart& zero_timeline = r.timelines[2];
  EXPECT_THAT(zero_timeline.caption, HasSubstr("ZeRO-1: each rank keeps 1/4 of the optimizer"));
  const Chart& hybrid_timeline = r.timelines[3];
  EXPECT_EQ(hybrid_timeline.file, "timeline-d2k2-1f1b.svg");
  for (const char* row :
       {">rank 0 (0, 0)<", ">rank 1 (1, 0)<", ">rank 2 (0, 1)<", ">rank 3 (1, 1)<"}) {
    EXPECT_THAT(hybrid_timeline.svg, HasSubstr(row));
  }
  EXPECT_EQ(XmlProblem(hybrid_timeline.svg), "");
  EXPECT_THAT(hybrid_timeline.caption,
              HasSubstr("2 replicas of a 2-stage pipeline, 4 micro-batches per replica, 1F1B "
                        "schedule; rows are rank (replica, stage)"));

  // Every run its own colour in the charts.
  std::set<std::string> fills;
  for (const Figures& f : r.figures) {
    const std::string fill = BarFill(r.charts[0].svg, f.label);
    EXPECT_EQ(fill.size(), 7u) << f.label;
    fills.insert(fill);
  }
  EXPECT_EQ(fills.size(), r.figures.size());
  EXPECT_THAT(r.charts[2].svg, HasSubstr(">2 replicas x 2-stage 1F1B<"));
}

TEST(ReportTest, NoRunCompleted) {
  std::vector<Entry> entries(2);
  entries[0].name = "baseline";
  entries[0].label = "one worker";
  entries[1].name = "data";
  entries[1].label = "data parallel";
  for (Entry& e : entries) e.error = "the job failed (rank 0 failed (signal 9 SIGKILL))";
  const Report r = BuildReport(entries, 4, 2, "compare --gpus=4", "2025-01-01 00:00:00 UTC");
  EXPECT_EQ(r.gpus, 4);
  EXPECT_EQ(ReportTitle(r), "Strategy comparison on 4 workers: no run completed");
  const std::string md = MarkdownReport(r);
  EXPECT_THAT(md, HasSubstr("# Strategy comparison on 4 workers: no run completed\n"));
  EXPECT_THAT(md, HasSubstr("No run completed; each run's message is below."));
  EXPECT_THAT(md, HasSubstr("could not run: the job failed (rank 0 failed (signal 9 SIGKILL))"));
  EXPECT_THAT(HtmlReport(r), HasSubstr("<h1>Strategy comparison on 4 workers: no run completed"));
}

TEST(FormatTest, Units) {
  EXPECT_EQ(Bytes(512 << 10), "512 KB");
  EXPECT_EQ(Bytes(int64_t{3} << 20), "3.0 MB");
  EXPECT_EQ(Bytes(int64_t{300} << 20), "300 MB");
  EXPECT_EQ(Bytes(int64_t{3} << 30), "3.00 GB");
  EXPECT_EQ(Ratio(1.7), "1.70x");
  EXPECT_EQ(Ratio(12), "12x");
  EXPECT_EQ(Ratio(std::nan("")), "-");
  EXPECT_EQ(Percent(0.456), "46%");
  EXPECT_EQ(Millis(0.0123), "12.3 ms");
  EXPECT_EQ(Millis(0.00123), "1.23 ms");
  EXPECT_EQ(Millis(0.5), "500 ms");
  EXPECT_EQ(Thousands(1234567), "1,234,567");
}

// The planner's check: a layout's measured step is its fastest run's (a slower one met the
// host's other work), its peak the largest run's; a run that did not complete is reported.
TEST(PlanCheckTest, FastestRunAndLargestPeak) {
  Prediction p;
  p.step_s = 0.0788;
  p.memory_bytes = 1000;
  auto run = [](double step, int64_t peak) {
    Figures f;
    f.ran = true;
    f.step_seconds = step;
    f.peak_bytes = peak;
    return f;
  };
  Figures failed;
  failed.error = "rank 1 exited with code 3";
  const std::vector<PlanCheck> checks =
      CheckPlan({p, p}, {{run(0.1332, 1100), run(0.0802, 900)}, {run(0.08, 1000), failed}});
  ASSERT_EQ(checks.size(), 2u);
  EXPECT_TRUE(checks[0].measured.ran);
  EXPECT_DOUBLE_EQ(checks[0].measured.step_seconds, 0.0802);
  EXPECT_EQ(checks[0].step_runs, (std::vector<double>{0.1332, 0.0802}));
  EXPECT_NEAR(checks[0].step_error, -0.01746, 1e-5);  // 78.8 ms against 80.2
  // Two runs: the median their mean, 106.7 ms; 78.8 ms against it -26.1%; the runs 53.0 ms
  // apart, 49.7% of it.
  EXPECT_NEAR(checks[0].median_step, 0.1067, 1e-12);
  EXPECT_NEAR(checks[0].median_error, -0.26148, 1e-5);
  EXPECT_NEAR(checks[0].spread, 0.49672, 1e-5);
  EXPECT_EQ(checks[0].measured.peak_bytes, 1100);     // the slower run's, the larger
  EXPECT_NEAR(checks[0].memory_error, -0.09091, 1e-5);
  EXPECT_FALSE(checks[1].measured.ran);
  EXPECT_EQ(checks[1].measured.error, "rank 1 exited with code 3");
  EXPECT_THAT(CheckTable(checks), HasSubstr("a run failed: rank 1 exited with code 3"));
  EXPECT_THAT(CheckTable(checks), HasSubstr("| 78.8 ms | 80.2 ms | 106.7 ms | 49.7% |"));
  EXPECT_THAT(CheckVerdict(checks)[0],
              HasSubstr("1.7% against the fastest run (target 15%): met; 26.1% against the "
                        "median run: missed; the runs of a layout spread up to 49.7%"));

  // Three runs: the median the middle one, 90 ms; 78.8 ms against it -12.4%, the runs
  // (110 - 80) / 90 = 33.3% apart.
  const std::vector<PlanCheck> three =
      CheckPlan({p}, {{run(0.110, 1000), run(0.080, 1000), run(0.090, 1000)}});
  ASSERT_EQ(three.size(), 1u);
  EXPECT_DOUBLE_EQ(three[0].median_step, 0.090);
  EXPECT_NEAR(three[0].median_error, -0.12444, 1e-5);
  EXPECT_NEAR(three[0].spread, 0.33333, 1e-5);
  EXPECT_NEAR(three[0].step_error, -0.015, 1e-12);
}

// The layouts checked: the top 3 and the best pure strategy they leave out: data parallel
// where none of them is, else the pipeline over every rank.
TEST(PlanCheckTest, LayoutsToCheckTakeAPipelineBesideDataParallel) {
  auto layout = [](StrategyKind kind, int replicas, int micro_batches) {
    Prediction p;
    p.layout.strategy = kind;
    p.layout.data_parallel = replicas;
    p.layout.stages = kind == StrategyKind::kData ? 1 : 4 / replicas;
    p.layout.schedule = kind == StrategyKind::kPipeline ? "1f1b" : "";
    p.layout.micro_batches = micro_batches;
    return p;
  };
  Plan plan;
  plan.ranked = {layout(StrategyKind::kData, 4, 1), layout(StrategyKind::kData, 4, 2),
                 layout(StrategyKind::kData, 4, 4), layout(StrategyKind::kPipeline, 1, 8),
                 layout(StrategyKind::kPipeline, 2, 2)};
  plan.best_pure = {{"data parallel", 0}, {"pipeline", 3}};
  auto names = [](const std::vector<Prediction>& ps) {
    std::vector<std::string> out;
    for (const Prediction& p : ps) out.push_back(p.layout.Name());
    return out;
  };
  EXPECT_THAT(names(LayoutsToCheck(plan, std::nullopt).checked),
              testing::ElementsAre("data D=4 bucket 25 MB", "data D=4 M=2 bucket 25 MB",
                                   "data D=4 M=4 bucket 25 MB", "d1k4 1f1b M=8"));
  // Data parallel and a 2 x 2 pipeline among the top 3: the pipeline over every rank beside.
  std::swap(plan.ranked[2], plan.ranked[4]);
  EXPECT_THAT(names(LayoutsToCheck(plan, std::nullopt).checked),
              testing::ElementsAre("data D=4 bucket 25 MB", "data D=4 M=2 bucket 25 MB",
                                   "d2k2 1f1b M=2 bucket 25 MB", "d1k4 1f1b M=8"));
  // No data parallel among them: the best data parallel beside them.
  plan.ranked = {layout(StrategyKind::kPipeline, 1, 8), layout(StrategyKind::kPipeline, 2, 2),
                 layout(StrategyKind::kPipeline, 2, 4), layout(StrategyKind::kData, 4, 1)};
  plan.best_pure = {{"data parallel", 3}, {"pipeline", 0}};
  EXPECT_THAT(names(LayoutsToCheck(plan, std::nullopt).checked),
              testing::ElementsAre("d1k4 1f1b M=8", "d2k2 1f1b M=2 bucket 25 MB",
                                   "d2k2 1f1b M=4 bucket 25 MB", "data D=4 bucket 25 MB"));
}

// The waiting share fitted on d1k4 1f1b M=8: no layout of its shape d1k4 is checked, whatever
// its schedule or micro-batches; the check takes the best of the others, and names the ones
// it held out and why.
TEST(PlanCheckTest, LayoutsToCheckHoldOutTheWaitingSharesFit) {
  auto layout = [](StrategyKind kind, int replicas, const std::string& schedule,
                   int micro_batches) {
    Prediction p;
    p.layout.strategy = kind;
    p.layout.data_parallel = replicas;
    p.layout.stages = kind == StrategyKind::kData ? 1 : 4 / replicas;
    p.layout.schedule = schedule;
    p.layout.micro_batches = micro_batches;
    return p;
  };
  Plan plan;
  plan.ranked = {layout(StrategyKind::kPipeline, 1, "1f1b", 8),
                 layout(StrategyKind::kPipeline, 1, "gpipe", 4),
                 layout(StrategyKind::kData, 4, "", 1),
                 layout(StrategyKind::kPipeline, 2, "1f1b", 2),
                 layout(StrategyKind::kPipeline, 1, "zb-h1", 8),
                 layout(StrategyKind::kData, 4, "", 2)};
  plan.best_pure = {{"pipeline", 0}, {"data parallel", 2}};
  auto names = [](const std::vector<Prediction>& ps) {
    std::vector<std::string> out;
    for (const Prediction& p : ps) out.push_back(p.layout.Name());
    return out;
  };
  // Nothing fitted: the top 3 (data parallel among them) and the pipeline over every rank.
  const CheckSelection all = LayoutsToCheck(plan, std::nullopt);
  EXPECT_THAT(names(all.checked),
              testing::ElementsAre("d1k4 1f1b M=8", "d1k4 gpipe M=4", "data D=4 bucket 25 MB"));
  EXPECT_TRUE(all.held_out.empty());

  const CheckSelection held = LayoutsToCheck(plan, plan.ranked[0].layout);
  EXPECT_THAT(names(held.checked),
              testing::ElementsAre("data D=4 bucket 25 MB", "d2k2 1f1b M=2 bucket 25 MB",
                                   "data D=4 M=2 bucket 25 MB"));
  EXPECT_THAT(held.held_out,
              testing::ElementsAre(
                  "d1k4 1f1b M=8 (ranked 1): the waiting share was fitted on it",
                  "d1k4 gpipe M=4 (ranked 2): its shape d1k4 is the one the waiting share was "
                  "fitted on (d1k4 1f1b M=8); it differs from it only in schedule and "
                  "micro-batches"));
  const std::vector<std::string> verdict = CheckVerdict({}, held.held_out);
  EXPECT_THAT(verdict, testing::Contains(HasSubstr(
                           "Held out of the check: d1k4 1f1b M=8 (ranked 1): the waiting share")));

  // Without data parallel in the top 3 of the others, its best beside them.
  plan.ranked = {layout(StrategyKind::kPipeline, 1, "1f1b", 8),
                 layout(StrategyKind::kPipeline, 2, "1f1b", 2),
                 layout(StrategyKind::kPipeline, 2, "gpipe", 4),
                 layout(StrategyKind::kPipeline, 1, "1f1b", 4),
                 layout(StrategyKind::kPipeline, 2, "1f1b", 4),
                 layout(StrategyKind::kData, 4, "", 1)};
  EXPECT_THAT(names(LayoutsToCheck(plan, plan.ranked[0].layout).checked),
              testing::ElementsAre("d2k2 1f1b M=2 bucket 25 MB", "d2k2 gpipe M=4 bucket 25 MB",
                                   "d2k2 1f1b M=4 bucket 25 MB", "data D=4 bucket 25 MB"));
}

}  // namespace
}  // namespace tools
}  // namespace tandem
