#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "model/test_configs.h"
#include "runtime/files.h"
#include "runtime/test_files.h"

namespace tandem {
namespace {

// ZB-H1 on 2 stages, M = 4: stage 1 runs F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3. With A a
// micro-batch's activations and S a pending W's stash (S < A), it holds A, S, A+S, 2S, S, A+S,
// 2S, S, A+S, 2S, S, 0 after each action: at most A + S, where the two peaks added (one in
// flight, two pending) would say A + 2S. Its transfers (RA0 F0 B0 SG0 RA1 F1 B1 SG1 RA2 W0
// F2 ..., SG and RA each a group of its own) add a boundary tensor b for a receive until its
// forward reads it, and for a send until a forward waits on a later receive: after RA2 it
// holds 2S + 2b (SG1's gradient and RA2's buffer beside two stashes), its most beside the
// schedule's A + S. And a B's temporaries next to the stashes of the blocks it ran: here a
// whole backward's, as stage 1's B runs its head (whose B keeps nothing for its W) before its
// one layer.
TEST(PlannerTest, ZeroBubbleMemoryWalkedByHand) {
  ParallelConfig pc;
  pc.train.model = TwoLayerModel("gpt", 16, 2, 8, 32);  // d_model 16, seq 8, vocab 32
  pc.train.batch = 8;
  pc.train.micro_batches = 4;
  pc.strategy = StrategyKind::kPipeline;
  pc.schedule = "zb-h1";
  const JobLayout layout = *ResolveLayout(pc, 2);
  const StageBounds& bounds = layout.bounds;
  const std::vector<MemoryNeed>& need = layout.memory;
  const TrainConfig& t = pc.train;
  const int64_t rows = 2;
  auto estimate = [&](int in_flight, int pending) {
    return EstimateStageMemory(t.model, bounds[1], bounds[2], rows, in_flight,
                               /*recompute=*/false, t.dtype, t.optimizer.kind, t.device,
                               pending);
  };
  const int64_t A = estimate(1, 0).activations, S = estimate(0, 1).activations;
  const int64_t sent = rows * t.model.seq_len * t.model.d_model * 4;  // f32
  ASSERT_LT(S, A);
  ASSERT_GT(A + S, 2 * S + 2 * sent);  // so the peak is the schedule's, after each F
  EXPECT_EQ(need[1].activations, A + S);
  EXPECT_EQ(need[1].workspace, estimate(1, 0).workspace);
  EXPECT_EQ(need[1].in_flight, 1);
  EXPECT_EQ(need[1].pending_weights, 2);
}

// Qi et al.'s claim in bytes, as the memory check walks the schedules: no ZB-H1 stage needs
// more than 1F1B's largest where the stages hold alike (gpt-tiny on 2 and 4 stages, 4 and 2
// layers each; a model whose head outweighs a layer, a vocabulary of 4096 against d_model 32,
// on 3 and 4 stages), at every M, fewer micro-batches than stages too; and at one
// micro-batch whatever the split. The head's W stays in its B (model/blocks.cc): deferred,
// its stash of the logits' gradient put the second model's last stage at up to 3.9 times
// 1F1B's largest, and every one-micro-batch case over it. Where the split is uneven the
// claim does not hold and is not asserted: gpt-tiny on 3 stages (a later stage holding 3
// layers with its pending Ws, 1F1B's first 2 layers: 1.36 times from M = 3), the second
// model on 2 (its last stage's logits beside its layer's pending stashes: 1.11 times).
TEST(PlannerTest, ZeroBubbleH1NeedsNoMoreThanOneFOneBsLargestStage) {
  const ModelConfig tiny, heavy = TwoLayerModel("gpt", 32, 4, 16, 4096);
  struct Case {
    const ModelConfig& model;
    int stages, most_micro_batches;
  };
  for (const Case& c : {Case{tiny, 2, 4}, Case{tiny, 4, 8}, Case{tiny, 3, 1}, Case{heavy, 3, 6},
                        Case{heavy, 4, 8}, Case{heavy, 2, 1}}) {
    const int K = c.stages;
    for (int M = 1; M <= c.most_micro_batches; ++M) {
      auto largest = [&](const char* schedule) {
        ParallelConfig pc;
        pc.train.model = c.model;
        pc.train.batch = 2 * M;
        pc.train.micro_batches = M;
        pc.strategy = StrategyKind::kPipeline;
        pc.schedule = schedule;
        const std::vector<MemoryNeed> needs = ResolveLayout(pc, K)->memory;
        int64_t most = 0;
        for (const MemoryNeed& n : needs) most = std::max(most, n.activations + n.workspace);
        return most;
      };
      EXPECT_LE(largest("zb-h1"), largest("1f1b"))
          << c.model.ToString() << " K=" << K << " M=" << M;
    }
  }
}

TEST(PlannerTest, FitLinkRecoversKnownParameters) {
  const double alpha = 5e-6, bandwidth = 12e9;
  std::vector<LinkSample> exact, noisy;
  int k = 0;
  for (double n = 4096; n <= 64 << 20; n *= 4, ++k) {
    const double t = alpha + n / bandwidth;
    exact.push_back({n, t});
    // +-1%, alternating, so the noise has no trend.
    noisy.push_back({n, t * (k % 2 ? 1.01 : 0.99)});
  }
  LinkModel l = *FitLink(exact);
  EXPECT_NEAR(l.latency_s, alpha, 1e-12);
  EXPECT_NEAR(l.bytes_per_s / bandwidth, 1.0, 1e-9);
  l = *FitLink(noisy);
  EXPECT_NEAR(l.bytes_per_s / bandwidth, 1.0, 0.02);
}

TEST(PlannerTest, FitLinkToRingRecoversTheLink) {
  // alpha 2 us, 20 GB/s; a collective of n bytes over p ranks in `steps` ring steps of n/p.
  const double alpha = 2e-6, bandwidth = 20e9;
  for (int ranks : {2, 4, 8}) {
    for (int steps : {2 * (ranks - 1), ranks - 1}) {
      std::vector<LinkSample> samples;
      for (double n = 65536; n <= 16 << 20; n *= 2) {
        samples.push_back({n, steps * (alpha + n / ranks / bandwidth)});
      }
      const LinkModel l = *FitLinkToRing(samples, ranks, steps);
      EXPECT_NEAR(l.latency_s, alpha, 1e-12) << ranks << " " << steps;
      EXPECT_NEAR(l.bytes_per_s / bandwidth, 1.0, 1e-9) << ranks << " " << steps;
    }
  }
  EXPECT_FALSE(FitLinkToRing({{1024, 1e-5}, {2048, 2e-5}}, 1, 1).ok());
}

TEST(PlannerTest, ReduceScatterAndAllGatherTakeTheirOwnPairs) {
  LinkModel l{3e-6, 450e9};
  l.reduce_scatter = {10e-6, 100e9};
  const double n = 1 << 30;
  // p-1 = 7 steps of n/8 at the reduce-scatter's own pair; the all-gather without one, at the
  // link's; the all-reduce always at the link's.
  EXPECT_DOUBLE_EQ(l.ReduceScatter(n, 8), 7 * (10e-6 + n / 8 / 100e9));
  EXPECT_DOUBLE_EQ(l.AllGather(n, 8), 7 * (3e-6 + n / 8 / 450e9));
  EXPECT_DOUBLE_EQ(l.AllReduce(n, 8), 14 * (3e-6 + n / 8 / 450e9));
  EXPECT_EQ(l.ReduceScatter(n, 1), 0);
  l.all_gather = {1e-6, 200e9};
  EXPECT_DOUBLE_EQ(l.AllGather(n, 8), 7 * (1e-6 + n / 8 / 200e9));
  EXPECT_EQ(l.ToString(),
            "450 GB/s, 3 us; reduce-scatter 100 GB/s, 10 us; all-gather 200 GB/s, 1 us");
}

TEST(PlannerTest, FitLinkRefusesWhatFitsNoLink) {
  EXPECT_FALSE(FitLink({{1024, 1e-5}}).ok());
  EXPECT_FALSE(FitLink({{1024, 1e-5}, {1024, 2e-5}}).ok());
  const absl::Status s = FitLink({{1024, 1e-3}, {1 << 20, 1e-5}}).status();
  EXPECT_TRUE(absl::StrContains(s.message(), "do not grow")) << s;
}

TEST(PlannerTest, ParseLinkAndRingCosts) {
  const LinkModel l = *ParseLink("450,3");
  EXPECT_DOUBLE_EQ(l.bytes_per_s, 450e9);
  EXPECT_DOUBLE_EQ(l.latency_s, 3e-6);
  // Ring all-reduce of n bytes over p ranks: 2(p-1) steps of n/p bytes (Patarasuk & Yuan).
  const double n = 1 << 30;
  EXPECT_DOUBLE_EQ(l.AllReduce(n, 8), 14 * (3e-6 + n / 8 / 450e9));
  EXPECT_DOUBLE_EQ(l.ReduceScatter(n, 8), 7 * (3e-6 + n / 8 / 450e9));
  EXPECT_DOUBLE_EQ(l.AllGather(n, 8), l.ReduceScatter(n, 8));
  EXPECT_EQ(l.AllReduce(n, 1), 0);
  EXPECT_EQ(l.handover_s, 0);
  // A third figure: the handover a pipeline's transfer on its critical path takes, in us.
  const LinkModel h = *ParseLink("50,5,20");
  EXPECT_DOUBLE_EQ(h.bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(h.latency_s, 5e-6);
  EXPECT_DOUBLE_EQ(h.handover_s, 20e-6);
  for (const char* bad : {"450", "450,", "-1,3", "0,3", "fast,3", "450,3,", "450,3,-1",
                          "450,3,1,2", "450,3,soon"}) {
    const absl::Status s = ParseLink(bad).status();
    EXPECT_TRUE(absl::StrContains(s.message(), "bandwidth_GBps,latency_us[,handover_us]"))
        << bad << ": " << s;
    EXPECT_EQ(s.message().find('\n'), std::string::npos);
  }
}

// A 2-layer GPT (4 blocks) whose every block takes forward 1 s, B 1 s and W 1 s for 2 rows,
// the optimizer 1 us per parameter, on a link of no latency and 1 GB/s.
PlanRequest Request(int gpus, int batch) {
  PlanRequest r;
  r.base.train.model = TwoLayerModel("gpt", 32, 2, 16, 256);
  r.base.train.batch = batch;
  r.gpus = gpus;
  r.profile.model = r.base.train.model.ToString();
  r.profile.rows = 2;
  r.profile.optimizer_per_param = 1e-6;
  for (const char* name : {"embed", "h0", "h1", "head"}) r.profile.blocks.push_back({name, 1, 1, 1});
  r.link = {0, 1e9};
  return r;
}

TEST(PlannerTest, DataParallelStepByHand) {
  const PlanRequest r = Request(2, 4);  // 2 rows per replica: the profile's
  Layout l;
  l.data_parallel = 2;
  l.bucket_bytes = int64_t{1} << 40;  // one bucket
  const Prediction p = *Predict(r, l);
  const double params = r.base.train.model.num_params();
  // Compute: 4 blocks x 3 s. The one bucket is full at the backward's end: all of its ring
  // all-reduce (2 steps of half the gradients' bytes at 1 GB/s) is exposed.
  EXPECT_DOUBLE_EQ(p.compute_s, 12);
  EXPECT_NEAR(p.exposed_comm_s, 2 * (4 * params / 2) / 1e9, 1e-12);
  EXPECT_NEAR(p.optimizer_s, params * 1e-6, 1e-12);
  EXPECT_NEAR(p.step_s, 12 + p.exposed_comm_s + p.optimizer_s, 1e-12);
  EXPECT_EQ(p.bubble_s, 0);

  // ZeRO-1: the reduce-scatter (1 step of half), the optimizer on half the parameters, then
  // the all-gather of the updated half.
  l.zero = 1;
  const Prediction z = *Predict(r, l);
  EXPECT_NEAR(z.exposed_comm_s, (4 * params / 2) / 1e9, 1e-12);
  EXPECT_NEAR(z.optimizer_s, params / 2 * 1e-6 + (4 * params / 2) / 1e9, 1e-12);
  EXPECT_LT(z.memory_bytes, p.memory_bytes);
}

// T=2 over both ranks, by hand: each block's work halved, and each collective a ring over 2
// ranks at 1 GB/s without latency: an all-reduce of n bytes 2 steps of n/2, an all-gather or a
// reduce-scatter 1 step of n/2. A micro-batch's activations: 2 rows x 16 x 32 f32 = 4096 bytes.
TEST(PlannerTest, TensorParallelStepByHand) {
  const PlanRequest r = Request(2, 2);  // 2 rows: the profile's
  Layout l;
  l.tensor_parallel = 2;
  const Prediction p = *Predict(r, l);
  const double n = 4096, ar = 2 * (n / 2) / 1e9, half = (n / 2) / 1e9;
  // The head's two small all-reduces: the rows' maxima (4 bytes a row) and their sums of exp
  // and target logits (8), 32 rows.
  const double head_small = 2 * (32 * 4 / 2.0) / 1e9 + 2 * (32 * 8 / 2.0) / 1e9;
  // The embedding's sum, 4 in each of the 2 layers, the head's input gradient.
  EXPECT_NEAR(p.tensor_comm_s, (1 + 2 * 4 + 1) * ar + head_small, 1e-15);
  EXPECT_NEAR(p.compute_s, 4 * 3 / 2.0, 1e-12);
  TensorParallel tp;
  tp.size = 2;
  int64_t params = 0;  // one rank's: its parts of the blocks
  for (const ParamSpec& s : StageParams(BuildBlocks(r.base.train.model, tp), 0, 4)) {
    params += s.shape.numel();
  }
  EXPECT_LT(params, r.base.train.model.num_params());
  EXPECT_NEAR(p.optimizer_s, params * 1e-6, 1e-12);
  EXPECT_NEAR(p.step_s, p.compute_s + p.tensor_comm_s + p.optimizer_s, 1e-12);
  EXPECT_EQ(l.Name(), "t2 data D=1");
  EXPECT_NE(std::find(l.LauncherFlags().begin(), l.LauncherFlags().end(), "--tensor-parallel=2"),
            l.LauncherFlags().end());
  // Sequence parallelism: the embedding's reduce-scatter and its B's all-gather; in each
  // layer an all-gather and a reduce-scatter a region in forward, 4 all-gathers and 2
  // reduce-scatters in B; the head's gather, its two small sums and its reduce-scatter.
  l.sequence_parallel = true;
  const Prediction sp = *Predict(r, l);
  // (and in each layer's B the LayerNorms' sum: 4 x 32 f32, an all-reduce of 512 bytes)
  const double ln = 2 * (512 / 2.0) / 1e9;
  EXPECT_NEAR(sp.tensor_comm_s,
              2 * half + 2 * (4 * half + 6 * half + ln) + 2 * half + head_small, 1e-15);
  // CPU workers: each of the 12 collectives the stream waits for (the embedding's, 4 in each
  // layer, the head's 3) also takes the link's handover.
  PlanRequest slow = r;
  slow.link.handover_s = 1e-4;
  l.sequence_parallel = false;
  EXPECT_NEAR(Predict(slow, l)->tensor_comm_s, p.tensor_comm_s + 12 * 1e-4, 1e-12);
  // A request whose heads T does not divide has no such layout.
  PlanRequest three = Request(3, 3);
  l = Layout();
  l.tensor_parallel = 3;
  EXPECT_FALSE(Predict(three, l).ok());
}

TEST(PlannerTest, BlockTimesAtOtherRows) {
  BlockProfile p;
  p.rows = 4;
  p.blocks = {{"embed", 4, 8, 2}};
  // One row count: proportional to the rows.
  EXPECT_DOUBLE_EQ(p.BlocksAt(2)[0].forward, 2);
  EXPECT_DOUBLE_EQ(p.BlocksAt(8)[0].backward, 16);
  // Timed at 1, 2 and 4 rows: those times where measured, the line through the nearest two
  // between and beyond them.
  p.more_rows[1] = {{"embed", 1.5, 3, 0.5}};
  p.more_rows[2] = {{"embed", 2.5, 5, 1}};
  EXPECT_DOUBLE_EQ(p.BlocksAt(2)[0].forward, 2.5);
  EXPECT_DOUBLE_EQ(p.BlocksAt(1)[0].weight, 0.5);
  EXPECT_DOUBLE_EQ(p.BlocksAt(4)[0].backward, 8);
  // 3 rows: halfway from 2 to 4 rows.
  EXPECT_DOUBLE_EQ(p.BlocksAt(3)[0].forward, 3.25);
  EXPECT_DOUBLE_EQ(p.BlocksAt(3)[0].backward, 6.5);
  // 8 rows: along 2 -> 4 rows (forward +1.5 s, B +3 s, W +1 s) twice more.
  EXPECT_DOUBLE_EQ(p.BlocksAt(8)[0].forward, 7);
  EXPECT_DOUBLE_EQ(p.BlocksAt(8)[0].backward, 14);
  EXPECT_DOUBLE_EQ(p.BlocksAt(8)[0].weight, 4);
  // Below 1 row along 1 -> 2 rows: forward 1.5 - 1 x 0.5 at half a row; never below 0.
  EXPECT_DOUBLE_EQ(p.BlocksAt(0.5)[0].forward, 1);
  // From 0.5 s at 1 row to 2.5 s at 2: 0.5 - 0.9 x 2 at 0.1 rows is below 0.
  p.more_rows[1] = {{"embed", 0.5, 3, 0.5}};
  EXPECT_DOUBLE_EQ(p.BlocksAt(0.1)[0].forward, 0);
}

TEST(PlannerTest, MicroBatchRowsOfTheLayouts) {
  // 2 ranks, batch 16: replicas of 8 (data) or 16 rows (one pipeline), in M micro-batches;
  // the data-parallel replica's 8 first, then the others from the largest (the model-parallel
  // split's one micro-batch of 16) down.
  EXPECT_EQ(MicroBatchRows(16, 2), (std::vector<int>{8, 16, 4, 2, 1}));
  EXPECT_EQ(MicroBatchRows(16, 4), (std::vector<int>{4, 16, 8, 2, 1}));
  // 4 ranks, batch 12: replicas of 3 (D = 4), 6 (D = 2) or 12 rows (4 stages: 4 rows in
  // M = 3).
  EXPECT_EQ(MicroBatchRows(12, 4), (std::vector<int>{3, 12, 6, 4, 2, 1}));
  // Batch 2: one row a replica of 4, or 4 stages over 2 rows in 1 micro-batch or 2.
  EXPECT_EQ(MicroBatchRows(2, 4), (std::vector<int>{1, 2}));
  // 2 ranks, batch 34: replicas of 17 (M = 1 or 17) or one of 34, whose pipelines run at most
  // M = 8K = 16 micro-batches: 2 rows (M = 17) no layout runs.
  EXPECT_EQ(MicroBatchRows(34, 2), (std::vector<int>{17, 34, 1}));
}

TEST(PlannerTest, SmallMicroBatchesAndTheStepOverheadByHand) {
  PlanRequest r = Request(2, 4);  // 2 rows per replica
  r.profile.optimizer_per_param = 0;
  r.link = {0, 1e30};  // communication takes no time
  // A micro-batch of 1 row takes 0.75 of 2 rows' time, not half.
  r.profile.more_rows[1] = std::vector<BlockTime>(4, {"", 0.75, 0.75, 0.75});
  r.profile.step_overhead = 0.5;
  Layout l;
  l.data_parallel = 2;
  const Prediction one = *Predict(r, l);
  // M = 1: 4 blocks x 3 s, then the step overhead.
  EXPECT_DOUBLE_EQ(one.compute_s, 12);
  EXPECT_DOUBLE_EQ(one.optimizer_s, 0.5);
  EXPECT_DOUBLE_EQ(one.step_s, 12.5);
  // M = 2 micro-batches of 1 row: 2 x 4 blocks x 2.25 s, then the overhead once.
  l.micro_batches = 2;
  const Prediction two = *Predict(r, l);
  EXPECT_DOUBLE_EQ(two.compute_s, 18);
  EXPECT_DOUBLE_EQ(two.step_s, 18.5);
  // Two stages of 2 blocks, 8 rows in 4 micro-batches of 2 under GPipe: (M + K - 1) x 6 s,
  // then the stage's share of the overhead by its parameters.
  r = Request(2, 8);
  r.profile.optimizer_per_param = 0;
  r.link = {0, 1e30};
  r.profile.step_overhead = 0.5;
  l = Layout();
  l.strategy = StrategyKind::kPipeline;
  l.stages = 2;
  l.schedule = "gpipe";
  l.micro_batches = 4;
  l.balance = "2,2";
  const Prediction p = *Predict(r, l);
  // A layer of C = 32 channels: 12 C^2 + 13 C = 12704 parameters. Stage 0: the token and
  // position tables (256 x 32 + 16 x 32 = 8704) and h0, 21408; stage 1: h1 and the head (its
  // norm, 64, and matrix, 8192), 20960; 42368 in all. Stage 0's share is the larger.
  ASSERT_EQ(r.base.train.model.num_params(), 42368);
  EXPECT_NEAR(p.optimizer_s, 0.5 * 21408 / 42368, 1e-12);
  EXPECT_NEAR(p.step_s, 30 + p.optimizer_s, 1e-9);
}

TEST(PlannerTest, GpipeBubbleByHand) {
  PlanRequest r = Request(2, 8);
  r.profile.optimizer_per_param = 0;
  r.link = {0, 1e30};  // transfers take no time
  Layout l;
  l.strategy = StrategyKind::kPipeline;
  l.stages = 2;
  l.schedule = "gpipe";
  l.micro_batches = 4;  // 2 rows each: the profile's
  l.balance = "2,2";
  const Prediction p = *Predict(r, l);
  // Each stage: F = 2 s, backward (B + W) = 4 s, for each of M = 4 micro-batches. GPipe's step
  // is (M + K - 1)(F + B + W) = 5 x 6 s, of which (K - 1)/(M + K - 1) = 1/5 is bubble.
  EXPECT_NEAR(p.step_s, 30, 1e-9);
  EXPECT_NEAR(p.compute_s, 24, 1e-9);
  EXPECT_NEAR(p.bubble_s, 6, 1e-9);
  // Recomputing adds a forward to every backward: 5 x 8 s.
  l.recompute = true;
  EXPECT_NEAR(Predict(r, l)->step_s, 40, 1e-9);
  // One micro-batch of 8 rows (each block's part 4 s): stage 0's F (8 s), the activation's
  // handover, stage 1's F and backward (8 + 16 s), the gradient's handover, stage 0's backward
  // (16 s): 48 s and two handovers of 0.5 s.
  l.recompute = false;
  l.micro_batches = 1;
  r.link.handover_s = 0.5;
  EXPECT_NEAR(Predict(r, l)->step_s, 49, 1e-9);
  EXPECT_EQ(r.link.ToString(), "1e+21 GB/s, 0 us, handover 5e+05 us");
}

// Interleaved on the same 4 blocks: 2 chunks of one block a stage (F = 1 s, backward 2 s),
// global stage g on stage g mod 2. Narayanan et al.'s step: (vM + K - 1) chunk-steps of 3 s =
// 9 x 3 s, of which (K - 1)/(vM + K - 1) = 1/9 is bubble.
TEST(PlannerTest, InterleavedBubbleByHand) {
  PlanRequest r = Request(2, 8);
  r.profile.optimizer_per_param = 0;
  r.link = {0, 1e30};
  Layout l;
  l.strategy = StrategyKind::kPipeline;
  l.stages = 2;
  l.schedule = "interleaved";
  l.virtual_stages = 2;
  l.micro_batches = 4;
  l.balance = "1,1,1,1";
  const Prediction p = *Predict(r, l);
  EXPECT_NEAR(p.step_s, 27, 1e-9);
  EXPECT_NEAR(p.compute_s, 24, 1e-9);
  EXPECT_NEAR(p.bubble_s, 3, 1e-9);
  EXPECT_EQ(l.Name(), "d1k2 interleaved v=2 M=4");
  const std::vector<std::string> flags = l.LauncherFlags();
  EXPECT_NE(std::find(flags.begin(), flags.end(), "--virtual-stages=2"), flags.end());
  // The plan offers it beside the other schedules.
  const Plan plan = *MakePlan(r);
  EXPECT_TRUE(std::any_of(plan.ranked.begin(), plan.ranked.end(), [](const Prediction& x) {
    return x.layout.schedule == "interleaved" && x.layout.virtual_stages == 2;
  }));
}

TEST(PlannerTest, CoresSharedByWorkers) {
  PlanRequest r = Request(4, 8);
  r.profile.optimizer_per_param = 0;
  r.link = {0, 1e30};
  r.host_cores = 2;
  Layout l;
  l.data_parallel = 4;
  // Each of 4 workers computes 12 s; on 2 cores the step takes 4 x 12 / 2 s.
  const Prediction p = *Predict(r, l);
  EXPECT_NEAR(p.step_s, 24, 1e-9);
  EXPECT_NEAR(p.sharing_s, 12, 1e-9);
  EXPECT_TRUE(absl::StrContains(p.Reason(), "waiting for a core")) << p.Reason();
}

TEST(PlannerTest, StepWaitsForTheSlowestWorker) {
  PlanRequest r = Request(4, 8);
  r.profile.optimizer_per_param = 0;
  r.link = {0, 1e30};
  r.host_cores = 2;
  r.profile.finish_spread = 0.125;
  r.profile.spread_threads = 4;
  Layout l;
  l.data_parallel = 4;
  // Each worker computes 12 s at half speed, 24 s; the last finishes 1/8 of that later.
  const Prediction p = *Predict(r, l);
  EXPECT_NEAR(p.spread_s, 3, 1e-9);
  EXPECT_NEAR(p.step_s, 27, 1e-9);
  // One worker waits for no other.
  PlanRequest one = Request(1, 8);
  one.profile.optimizer_per_param = 0;
  one.profile.finish_spread = 0.125;
  one.profile.spread_threads = 4;
  EXPECT_EQ(Predict(one, Layout{})->spread_s, 0);
}

TEST(PlannerTest, FinishSpreadIsMeasuredAgainstPerfectSharing) {
  // 4 threads of 40 ms of CPU each on 2 cores: shared perfectly, all end at 80 ms.
  const std::vector<double> cpu = {0.040, 0.040, 0.040, 0.040};
  // One kept a core to itself and ended at 40 ms, the rest by 80: no later than perfect
  // sharing, though 14% after the threads' mean end (70 ms).
  EXPECT_NEAR(FinishBehindSharing({0.040, 0.080, 0.080, 0.080}, cpu, 2), 0, 1e-12);
  // The last ended at 90 ms: 1/8 behind.
  EXPECT_NEAR(FinishBehindSharing({0.078, 0.080, 0.082, 0.090}, cpu, 2), 0.125, 1e-12);
  // Fewer threads than cores: perfect sharing is the longest thread's own time (50 ms).
  EXPECT_NEAR(FinishBehindSharing({0.045, 0.060}, {0.040, 0.050}, 4), 0.2, 1e-12);
  // Unequal work on 2 cores: 30 + 50 + 40 ms of CPU is 60 ms shared; the last at 66 ms.
  EXPECT_NEAR(FinishBehindSharing({0.050, 0.066, 0.060}, {0.030, 0.050, 0.040}, 2), 0.1, 1e-12);
  EXPECT_EQ(FinishBehindSharing({}, {}, 2), 0);
  EXPECT_EQ(FinishBehindSharing({0.090}, {0.040, 0.040}, 2), 0);  // lists that do not pair
}

TEST(PlannerTest, CoresSharedAtTheStepsEndToo) {
  PlanRequest r = Request(4, 8);
  r.link = {0, 1e30};  // the all-reduce takes no time
  r.host_cores = 2;
  Layout l;
  l.data_parallel = 4;
  // 4 workers each compute 12 s, then each its optimizer step over every parameter
  // (1 us each), all at once on 2 cores: each at half speed throughout.
  const double optimizer = r.base.train.model.num_params() * 1e-6;
  const Prediction p = *Predict(r, l);
  EXPECT_NEAR(p.step_s, 2 * (12 + optimizer), 1e-9);
  EXPECT_NEAR(p.sharing_s, 12 + optimizer, 1e-9);
}

// GPipe on 2 stages of F = 1 s and a whole backward of 1 s, M = 2 micro-batches, transfers
// free. With a core each: stage 0 runs F0 [0, 1], F1 [1, 2]; stage 1 F0 [1, 2], F1 [2, 3],
// B1 [3, 4], B0 [4, 5]; stage 0 B1 [4, 5], B0 [5, 6]: 6 s.
PlanRequest TwoStageGpipe(int gpus, int host_cores, Layout* l) {
  PlanRequest r = Request(gpus, 4 * gpus / 2);  // 2 rows a micro-batch: the profile's
  for (BlockTime& t : r.profile.blocks) t = {t.name, 0.5, 0.5, 0};
  r.profile.optimizer_per_param = 0;
  r.link = {0, 1e30};
  r.host_cores = host_cores;
  l->strategy = StrategyKind::kPipeline;
  l->data_parallel = gpus / 2;
  l->stages = 2;
  l->schedule = "gpipe";
  l->micro_batches = 2;
  l->balance = "2,2";
  return r;
}

TEST(PlannerTest, PipelineStagesShareTheCoresByHand) {
  Layout l;
  EXPECT_NEAR(Predict(TwoStageGpipe(2, 2, &l), l)->step_s, 6, 1e-9);
  // One core: whenever both stages compute (F1 beside F0 from 1 s, B0 beside B1 from 4 s)
  // each goes at half speed: F0 [0, 1]; F1 and stage 1's F0 [1, 3]; F1 [3, 4]; B1 [4, 5];
  // stage 1's B0 and stage 0's B1 [5, 7]; B0 [7, 8]: all 8 s of work one after another.
  Prediction p = *Predict(TwoStageGpipe(2, 1, &l), l);
  EXPECT_NEAR(p.step_s, 8, 1e-9);
  EXPECT_NEAR(p.sharing_s, 2, 1e-9);
  // 2 replicas on 3 cores: 1.5 cores a replica, so two stages computing at once go at 0.75:
  // F0 [0, 1]; F1 and F0 [1, 1 + 4/3]; F1 [7/3, 10/3]; B1 [10/3, 13/3]; B0 and B1
  // [13/3, 17/3]; B0 [17/3, 20/3]. All ranks' work over the cores (16 s / 3) and the step
  // with a core each (6 s) are both shorter.
  p = *Predict(TwoStageGpipe(4, 3, &l), l);
  EXPECT_NEAR(p.step_s, 20.0 / 3, 1e-9);
  EXPECT_NEAR(p.sharing_s, 20.0 / 3 - 6, 1e-9);
}

// The handover on shared cores (TwoStageGpipe's schedule: F = B = 1 s, M = 2, transfers
// free): each transfer takes it after both its ends were posted, holding no core meanwhile.
TEST(PlannerTest, HandoversOnSharedCoresByHand) {
  const PipelineSchedule s = *MakeSchedule("gpipe", 2, 2);
  ScheduleDurations d = ScheduleDurations::Uniform(2, 1, {1, 1, 0});
  EXPECT_NEAR(SharedCoresStep(s, d, 1), 8, 1e-9);  // PipelineStagesShareTheCoresByHand's
  EXPECT_NEAR(SharedCoresStep(s, d, 2), 6, 1e-9);
  d.handover = 0.5;
  // A core each: stage 0's F0 [0, 1], F1 [1, 2]; the activations at 1.5 and 2.5: stage 1's
  // F0 [1.5, 2.5], F1 [2.5, 3.5], B1 [3.5, 4.5], B0 [4.5, 5.5]; the gradients at 5 and 6:
  // stage 0's B1 [5, 6], B0 [6, 7]. Two handovers on the critical path.
  EXPECT_NEAR(SharedCoresStep(s, d, 2), 7, 1e-9);
  // One core: F0 [0, 1]; the activation at 1.5, so F1 runs alone until then and beside stage
  // 1's F0 after: F1 [1, 2.5], F0 [1.5, 3]; the next activation at 3: F1 [3, 4], B1 [4, 5];
  // its gradient at 5.5: stage 1's B0 [5, 6.5] beside stage 0's B1 [5.5, 7]; the last
  // gradient at 7: B0 [7, 8]. The other stage had the core to itself during each handover.
  EXPECT_NEAR(SharedCoresStep(s, d, 1), 8, 1e-9);
  // Handover 2 s on one core: stage 0's F0 [0, 1] and F1 [1, 2] alone; the activations at 3
  // and 4, so stage 1's F0 [3, 4], F1 [4, 5], B1 [5, 6], B0 [6, 7] alone; the gradients at 8
  // and 9: stage 0's B1 [8, 9], B0 [9, 10].
  d.handover = 2;
  EXPECT_NEAR(SharedCoresStep(s, d, 1), 10, 1e-9);
}

// A stage waiting on its neighbour takes its waiting share of a computing stage's turn
// (TwoStageGpipe's schedule, one core, share 0.5): F0 alone beside the waiting stage 1 at
// 1 / 1.5 [0, 1.5]; F1 and stage 1's F0 at 1/2 [1.5, 3.5]; stage 1's F1 [3.5, 5] and B1
// [5, 6.5] beside stage 0 waiting; stage 1's B0 and stage 0's B1 at 1/2 [6.5, 8.5]; stage 1
// done (no longer waiting), B0 alone [8.5, 9.5]. With share 1 the waits cost as much as
// compute: F0 [0, 2], both [2, 4], F1 [4, 6], B1 [6, 8], both [8, 10], B0 [10, 11].
TEST(PlannerTest, WaitingStagesTakeTheirShareByHand) {
  const PipelineSchedule s = *MakeSchedule("gpipe", 2, 2);
  const ScheduleDurations d = ScheduleDurations::Uniform(2, 1, {1, 1, 0});
  EXPECT_NEAR(SharedCoresStep(s, d, 1, 0), 8, 1e-9);
  EXPECT_NEAR(SharedCoresStep(s, d, 1, 0.5), 9.5, 1e-9);
  EXPECT_NEAR(SharedCoresStep(s, d, 1, 1), 11, 1e-9);
  // A core each: a waiting stage never crowds the one computing.
  EXPECT_NEAR(SharedCoresStep(s, d, 2, 1), 6, 1e-9);
}

// The fit recovers a waiting share the step was predicted with, and keeps to 0 and 1.
TEST(PlannerTest, FitWaitingShareRecoversAKnownShare) {
  Layout l;
  PlanRequest r = TwoStageGpipe(2, 1, &l);
  for (double w : {0.1, 0.37, 0.8}) {
    r.waiting_share = w;
    const double step = Predict(r, l)->step_s;
    r.waiting_share = 0;
    EXPECT_NEAR(*FitWaitingShare(r, l, step), w, 1e-3) << w;
  }
  EXPECT_EQ(*FitWaitingShare(r, l, 1), 0);    // faster than even no share predicts
  EXPECT_EQ(*FitWaitingShare(r, l, 100), 1);  // slower than even a whole turn
  r.waiting_share = 0.5;
  EXPECT_NEAR(Predict(r, l)->step_s, 9.5, 1e-9);  // WaitingStagesTakeTheirShareByHand's
}

// The layout the share is fitted to: 1F1B over the most stages, M nearest 2K, neither ZeRO-1
// nor recomputation; none where nothing is a pipeline.
TEST(PlannerTest, WaitingShareProbeWaitsTheMost) {
  const std::optional<Layout> probe = WaitingShareProbe(*MakePlan(Request(4, 16)));
  ASSERT_TRUE(probe.has_value());
  EXPECT_EQ(probe->Name(), "d1k4 1f1b M=8");
  EXPECT_FALSE(WaitingShareProbe(*MakePlan(Request(1, 16))).has_value());
}

// What a check may not run once the share is fitted on d1k4 1f1b M=8: the layout itself and
// every other of its shape d1k4, each saying what it differs in; other shapes are free.
TEST(PlannerTest, HeldOutReasonNamesTheFitsShape) {
  Layout fitted;
  fitted.strategy = StrategyKind::kPipeline;
  fitted.stages = 4;
  fitted.schedule = "1f1b";
  fitted.micro_batches = 8;
  EXPECT_EQ(HeldOutReason(fitted, fitted), "the waiting share was fitted on it");
  Layout gpipe = fitted;
  gpipe.schedule = "gpipe";
  gpipe.micro_batches = 4;
  EXPECT_EQ(HeldOutReason(fitted, gpipe),
            "its shape d1k4 is the one the waiting share was fitted on (d1k4 1f1b M=8); it "
            "differs from it only in schedule and micro-batches");
  Layout recompute = fitted;
  recompute.recompute = true;
  EXPECT_EQ(HeldOutReason(fitted, recompute),
            "its shape d1k4 is the one the waiting share was fitted on (d1k4 1f1b M=8); it "
            "differs from it only in recomputation");
  Layout model = fitted;
  model.strategy = StrategyKind::kModel;
  model.schedule = "";
  model.micro_batches = 1;
  model.recompute = true;
  EXPECT_TRUE(absl::EndsWith(HeldOutReason(fitted, model),
                             "only in schedule, micro-batches and recomputation"))
      << HeldOutReason(fitted, model);
  Layout hybrid = fitted;
  hybrid.data_parallel = 2;
  hybrid.stages = 2;
  EXPECT_EQ(HeldOutReason(fitted, hybrid), "");
  Layout data;
  data.data_parallel = 4;
  EXPECT_EQ(HeldOutReason(fitted, data), "");
}

TEST(PlannerTest, PlanKeepsToTheMemoryLimit) {
  PlanRequest r = Request(4, 16);
  const Plan all = *MakePlan(r);
  ASSERT_FALSE(all.ranked.empty());
  int64_t least = all.ranked[0].memory_bytes, most = least;
  for (const Prediction& p : all.ranked) {
    least = std::min(least, p.memory_bytes);
    most = std::max(most, p.memory_bytes);
  }
  ASSERT_LT(least, most);
  for (size_t i = 1; i < all.ranked.size(); ++i) {
    EXPECT_LE(all.ranked[i - 1].step_s, all.ranked[i].step_s * (1 + 1e-9));  // ties to rounding
  }
  EXPECT_EQ(all.best_pure.count("data parallel"), 1u);
  EXPECT_EQ(all.best_pure.count("pipeline"), 1u);

  r.device_memory = (least + most) / 2;
  const Plan some = *MakePlan(r);
  EXPECT_EQ(some.considered, all.considered);
  EXPECT_LT(some.ranked.size(), all.ranked.size());
  for (const Prediction& p : some.ranked) EXPECT_LE(p.memory_bytes, r.device_memory);
  int dropped = 0;
  for (const auto& [reason, n] : some.dropped) {
    if (absl::StrContains(reason, "needs more than the device's")) dropped += n;
  }
  EXPECT_EQ(dropped + some.ranked.size(), all.ranked.size());

  r.device_memory = 1024;
  const absl::Status none = MakePlan(r).status();
  EXPECT_TRUE(absl::StrContains(none.message(), "no layout of 4 ranks fits")) << none;
  EXPECT_EQ(none.message().find('\n'), std::string::npos);
}

TEST(PlannerTest, RefusesAProfileOfAnotherModel) {
  PlanRequest r = Request(2, 4);
  r.profile.model = "gpt2-small: ...";
  const absl::Status s = MakePlan(r).status();
  EXPECT_TRUE(absl::StrContains(s.message(), "block times are for")) << s;
}

TEST(PlannerTest, BlockProfileFileRoundTrip) {
  const PlanRequest r = Request(2, 4);
  const std::string path = FreshTestPath("profile.json");
  ASSERT_TRUE(WriteBlockProfile(r.profile, path).ok());
  const BlockProfile p = *ReadBlockProfile(path);
  EXPECT_EQ(p.model, r.profile.model);
  EXPECT_EQ(p.rows, 2);
  ASSERT_EQ(p.blocks.size(), 4u);
  EXPECT_EQ(p.blocks[3].name, "head");
  EXPECT_EQ(p.blocks[3].weight, 1);
  EXPECT_EQ(p.optimizer_per_param, 1e-6);
  EXPECT_TRUE(p.more_rows.empty());
  EXPECT_EQ(p.step_overhead, 0);
  EXPECT_EQ(p.peers, 0);  // a file that does not say was timed alone

  // Times at more row counts, the step overhead and the threads computing beside the timing
  // travel too.
  BlockProfile more = r.profile;
  more.more_rows[1] = std::vector<BlockTime>(4, {"x", 0.75, 0.5, 0.25});
  more.step_overhead = 0.125;
  more.peers = 1;
  more.finish_spread = 0.0625;
  more.spread_threads = 4;
  ASSERT_TRUE(WriteBlockProfile(more, path).ok());
  const BlockProfile q = *ReadBlockProfile(path);
  EXPECT_EQ(q.peers, 1);
  EXPECT_EQ(q.finish_spread, 0.0625);
  EXPECT_EQ(q.spread_threads, 4);
  ASSERT_EQ(q.more_rows.count(1), 1u);
  ASSERT_EQ(q.more_rows.at(1).size(), 4u);
  EXPECT_EQ(q.more_rows.at(1)[2].backward, 0.5);
  EXPECT_EQ(q.step_overhead, 0.125);
  EXPECT_EQ(q.BlocksAt(1)[3].weight, 0.25);

  // A spread without the threads it was timed over is refused, saying what is missing.
  std::string text = *ReadWholeFile(path);
  const std::string threads = "\"finish_spread_threads\": 4";
  ASSERT_NE(text.find(threads), std::string::npos) << text;
  text.replace(text.find(threads), threads.size(), "\"finish_spread_threads\": 0");
  ASSERT_TRUE(WriteFileAtomically(path, text).ok());
  const absl::StatusOr<BlockProfile> bad = ReadBlockProfile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "finish_spread_threads"))
      << bad.status();
}

TEST(PlannerTest, BlockTimesDerivedFromFlops) {
  // d_model C = 32, seq T = 16, vocab V = 256; 2 rows: 32 tokens, at 1 TFLOP/s and 1 TB/s.
  const ModelConfig m = TwoLayerModel("gpt", 32, 2, 16, 256);
  const BlockProfile p = *DeriveBlockProfile(m, DType::kF32, 2, 1, 1.0, 1);
  ASSERT_EQ(p.blocks.size(), 4u);
  // A layer a token: forward 24 C^2 + 4 T C = 24576 + 2048 FLOPs, B 24576 + 4096, W 24576.
  EXPECT_DOUBLE_EQ(p.blocks[1].forward, 851968e-12);
  EXPECT_DOUBLE_EQ(p.blocks[1].backward, 917504e-12);
  EXPECT_DOUBLE_EQ(p.blocks[1].weight, 786432e-12);
  // The head: 2 C V = 16384 FLOPs a token forward, twice that in B (its dx and its dW), no W.
  EXPECT_DOUBLE_EQ(p.blocks[3].forward, 524288e-12);
  EXPECT_DOUBLE_EQ(p.blocks[3].backward, 2 * 524288e-12);
  EXPECT_DOUBLE_EQ(p.blocks[3].weight, 0);
  // Half the MFU, twice the time.
  EXPECT_DOUBLE_EQ(DeriveBlockProfile(m, DType::kF32, 2, 1, 0.5, 1)->blocks[2].forward,
                   2 * 851968e-12);
  EXPECT_DOUBLE_EQ(p.optimizer_per_param, 28e-12);
  EXPECT_TRUE(absl::StrContains(p.source, "not measured")) << p.source;
  EXPECT_FALSE(DeriveBlockProfile(m, DType::kF32, 2, 1, 1.5, 1).ok());
}

TEST(PlannerTest, MeasuredProfileHasEveryBlock) {
  const ModelConfig m = TwoLayerModel("gpt", 32, 2, 16, 256);
  const BlockProfile p =
      *MeasureBlockProfile(m, Device::Cpu(), DType::kF32, {2, 1}, "adamw", 1);
  EXPECT_EQ(p.rows, 2);
  ASSERT_EQ(p.blocks.size(), 4u);
  ASSERT_EQ(p.more_rows.count(1), 1u);
  EXPECT_EQ(p.more_rows.at(1).size(), 4u);
  EXPECT_GE(p.step_overhead, 0);
  for (const BlockTime& t : p.blocks) {
    EXPECT_GT(t.forward, 0) << t.name;
    EXPECT_GT(t.backward, 0) << t.name;
  }
  EXPECT_GT(p.blocks[1].weight, 0);  // a layer's matmuls have weight gradients
  EXPECT_GT(p.optimizer_per_param, 0);
  EXPECT_EQ(p.peers, 0);

  // Beside a thread computing the same blocks, with the finish spread of two threads.
  const BlockProfile q = *MeasureBlockProfile(m, Device::Cpu(), DType::kF32, {2, 1}, "adamw", 1,
                                              /*peers=*/1, /*crowd=*/2);
  EXPECT_EQ(q.peers, 1);
  ASSERT_EQ(q.more_rows.count(1), 1u);
  for (const BlockTime& t : q.blocks) EXPECT_GT(t.forward, 0) << t.name;
  EXPECT_TRUE(absl::StrContains(q.source, "beside 1 threads")) << q.source;
  EXPECT_FALSE(MeasureBlockProfile(m, Device::Cpu(), DType::kF32, {2}, "adamw", 1, -1).ok());
  EXPECT_EQ(p.finish_spread, 0);  // not asked for
  EXPECT_EQ(p.spread_threads, 0);
  EXPECT_EQ(q.spread_threads, 2);
  EXPECT_GE(q.finish_spread, 0);
  EXPECT_FALSE(
      MeasureBlockProfile(m, Device::Cpu(), DType::kF32, {2}, "adamw", 1, 1, /*crowd=*/1).ok());
}

}  // namespace
}  // namespace tandem
