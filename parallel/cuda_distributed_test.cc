// The strategies' executor on a GPU, as a worker runs it: DistributedTrainer on cuda:0 with a
// real NCCL communicator (one rank, its unique id through a real coordinator), against the
// one-device Trainer on the same GPU with the same model, batch, micro-batches and seed.
// Data parallel (gradient buckets all-reduced on the communication stream, overlapped with
// backward or after it) and a one-stage pipeline (GPipe, 1F1B, recompute), in f32 and bf16,
// and a checkpoint written and resumed from on the GPU. NCCL refuses two ranks on one GPU:
// what several ranks add (sends, receives, a real reduction) is tested on CPU workers by
// parity_test, with the same executor. Skips with the reason where no GPU is visible.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "comm/nccl_testing.h"
#include "gtest/gtest.h"
#include "model/sharded_checkpoint.h"
#include "model/test_configs.h"
#include "parallel/distributed.h"
#include "runtime/host_sync.h"
#include "runtime/test_files.h"

namespace tandem {
namespace {

constexpr int kSteps = 8;

TrainConfig OnGpu(DType dtype, int micro_batches) {
  TrainConfig c = LearningConfig(kSteps);
  c.device = Device::Cuda(0);
  c.dtype = dtype;
  c.micro_batches = micro_batches;
  c.synthetic_data = true;
  c.optimizer.weight_decay = 0.05f;
  return c;
}

struct Trained {
  std::vector<float> losses;
  std::vector<float> params;  // the flat f32 master weights after the last step
};

Trained OneDevice(const TrainConfig& c) {
  Trained r;
  auto t = Trainer::Create(c);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return r;
  EXPECT_TRUE((*t)->Run([&](const StepReport& s) { r.losses.push_back(s.loss); }).ok());
  r.params = *(*t)->stage().params().flat().ToFloatVector();
  return r;
}

// Each value within `tol` of the larger magnitude of the pair (1 when both are small).
void ExpectClose(const std::vector<float>& want, const std::vector<float>& got, double tol,
                 const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  ASSERT_FALSE(want.empty()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    const double scale = std::max({1.0, std::fabs(double{want[i]}), std::fabs(double{got[i]})});
    ASSERT_LE(std::fabs(double{want[i]} - got[i]), tol * scale)
        << what << " element " << i << ": " << want[i] << " vs " << got[i];
  }
}

class CudaDistributedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    absl::StatusOr<OneRankNccl> nccl = OneRankNccl::StartUnlessFailedBefore();
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    nccl_ = std::move(*nccl);
  }

  // kSteps steps of `pc` on the GPU; the timings of the last step in *timing.
  Trained Distributed(const ParallelConfig& pc, StepTiming* timing = nullptr) {
    Trained r;
    auto t = DistributedTrainer::Create(pc, nccl_.comm.get());
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return r;
    for (int i = 0; i < kSteps; ++i) {
      absl::StatusOr<StepReport> s = (*t)->Step(timing);
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok()) return r;
      r.losses.push_back(s->loss);
    }
    r.params = *(*t)->stage().params().flat().ToFloatVector();
    return r;
  }

  OneRankNccl nccl_;
};

// The same kernels in the same order on one GPU; what differs is the gradients' trip through
// NCCL in buckets, the loss's reduction, and the order of the kernels' atomic additions (which
// differs from run to run). f32: losses and weights within 1e-4. bf16: one weight that rounds
// the other way to bf16 moves the activations by an ulp, so the losses hold to 1e-2 and the
// weights are not compared. SGD's steps are proportional to the gradients, so a gradient
// scaled or reduced wrongly shows there at once (AdamW's steps hardly change with the scale).
// `weights_tol`: 1e-3 where the micro-batches' gradients add up in another order than the
// one-device trainer's (GPipe runs their backwards last first), as parity_test allows on CPU
// under AdamW, which magnifies the rounding of near-zero gradients.
void ExpectSameTraining(const Trained& one, const Trained& many, DType dtype,
                        const std::string& what, double weights_tol = 1e-4) {
  ExpectClose(one.losses, many.losses, dtype == DType::kF32 ? 1e-4 : 1e-2, what + " losses");
  if (dtype == DType::kF32) ExpectClose(one.params, many.params, weights_tol, what + " weights");
}

TEST_F(CudaDistributedTest, DataParallelMatchesOneGpu) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const char* optimizer : {"sgd", "adamw"}) {
      for (int mbs : {1, 2}) {
        TrainConfig c = OnGpu(dtype, mbs);
        c.optimizer.kind = optimizer;
        const Trained one = OneDevice(c);
        for (bool overlap : {true, false}) {
          const std::string what =
              absl::StrFormat("data parallel, %s, %s, %d micro-batches, overlap %d",
                              DTypeName(dtype), optimizer, mbs, overlap);
          SCOPED_TRACE(what);
          ParallelConfig pc;
          pc.train = c;
          pc.strategy = StrategyKind::kData;
          pc.overlap = overlap;
          pc.bucket_bytes = 64 << 10;  // several buckets for this model's 0.5 MB of gradients
          StepTiming timing;
          const Trained many = Distributed(pc, &timing);
          ExpectSameTraining(one, many, dtype, what);
          // Every gradient went through NCCL: at least the f32 gradients' bytes.
          EXPECT_GE(timing.comm_bytes, static_cast<int64_t>(4 * one.params.size()));
          EXPECT_GT(timing.last_sequence, 0u);
        }
      }
    }
  }
}

TEST_F(CudaDistributedTest, OneStagePipelineMatchesOneGpu) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Trained one = OneDevice(OnGpu(dtype, 4));
    for (const char* schedule : {"gpipe", "1f1b"}) {
      for (bool recompute : {false, true}) {
        const std::string what = absl::StrFormat("pipeline %s, %s, recompute %d", schedule,
                                                 DTypeName(dtype), recompute);
        SCOPED_TRACE(what);
        ParallelConfig pc;
        pc.train = OnGpu(dtype, 4);
        pc.strategy = StrategyKind::kPipeline;
        pc.schedule = schedule;
        pc.recompute = recompute;
        StepTiming timing;
        const Trained many = Distributed(pc, &timing);
        ExpectSameTraining(one, many, dtype, what, std::string(schedule) == "gpipe" ? 1e-3 : 1e-4);
        EXPECT_EQ(timing.peak_in_flight, std::string(schedule) == "gpipe" ? 4 : 1);
      }
    }
  }
}

// A checkpoint written from the GPU after 3 steps, loaded by a new trainer, continues as the
// run that never stopped (in bf16 too: the low-precision copies of the loaded weights).
TEST_F(CudaDistributedTest, ResumesFromACheckpointAsIfNeverStopped) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    ParallelConfig pc;
    pc.train = OnGpu(dtype, 2);
    pc.strategy = StrategyKind::kData;
    const Trained whole = Distributed(pc);
    const std::string dir = FreshTestDir("cuda-checkpoint");
    std::string prefix;
    {
      auto t = DistributedTrainer::Create(pc, nccl_.comm.get());
      ASSERT_TRUE(t.ok()) << t.status();
      for (int i = 0; i < 3; ++i) ASSERT_TRUE((*t)->Step().ok());
      ASSERT_TRUE((*t)->SaveCheckpoint(dir).ok());
      prefix = CheckpointPrefixFor(dir, (*t)->step());
    }
    auto t = DistributedTrainer::Create(pc, nccl_.comm.get());
    ASSERT_TRUE(t.ok()) << t.status();
    absl::Status loaded = (*t)->LoadCheckpoint(prefix);
    ASSERT_TRUE(loaded.ok()) << loaded;
    ASSERT_EQ((*t)->step(), 3);
    Trained resumed;
    for (int i = 3; i < kSteps; ++i) {
      absl::StatusOr<StepReport> s = (*t)->Step();
      ASSERT_TRUE(s.ok()) << s.status();
      resumed.losses.push_back(s->loss);
    }
    resumed.params = *(*t)->stage().params().flat().ToFloatVector();
    const Trained after_3{std::vector<float>(whole.losses.begin() + 3, whole.losses.end()),
                          whole.params};
    ExpectSameTraining(after_3, resumed, dtype, "after resuming");
  }
}

// On the GPU too the host synchronizes once per read of the loss and nowhere else: every
// wait for communication is the stream's, the clipping factor is computed on the device, and
// the step's time comes from events on the compute stream.
TEST_F(CudaDistributedTest, OneHostSyncPerReadOfTheLoss) {
  for (StrategyKind kind : {StrategyKind::kData, StrategyKind::kPipeline}) {
    SCOPED_TRACE(StrategyName(kind));
    ParallelConfig pc;
    pc.train = OnGpu(DType::kBF16, 2);
    pc.strategy = kind;
    pc.schedule = "1f1b";
    auto t = DistributedTrainer::Create(pc, nccl_.comm.get());
    ASSERT_TRUE(t.ok()) << t.status();
    for (int i = 0; i < 2; ++i) ASSERT_TRUE((*t)->Step().ok());  // warm-up
    const int64_t unexpected = HostSync::UnexpectedCount();
    std::vector<int64_t> syncs;
    for (int step = 1; step <= 6; ++step) {
      ASSERT_TRUE((*t)->Issue().ok());
      if (step % 3 != 0) continue;
      auto done = (*t)->Read();
      ASSERT_TRUE(done.ok()) << done.status();
      for (const CompletedStep& c : *done) {
        syncs.push_back(c.timing.host_syncs);
        EXPECT_GT(c.timing.compute_seconds, 0);
        EXPECT_GT(c.report.seconds, c.timing.compute_seconds * 0.5);
      }
    }
    EXPECT_EQ(syncs, (std::vector<int64_t>{0, 0, 1, 0, 0, 1}));
    EXPECT_EQ(HostSync::UnexpectedCount(), unexpected);
  }
}

}  // namespace
}  // namespace tandem
