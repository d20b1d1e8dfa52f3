// The orderings the GPU depends on, proved on CPU workers (run under mpirun by
// ordering_test.sh: OrderingTest on 3 ranks, OrderingOnTwoRanksTest on 2 and
// OrderingOnFourRanksTest on 4): with asynchronous CPU streams the host queues a step's work and
// returns, each rank's streams and communication thread run it in the order events impose,
// and TANDEM_CPU_STREAM_JITTER_US delays every item of work by a random time. A missing event
// (the communication thread not waiting for the compute stream, a forward not waiting for
// its receive, memory reused too early) then changes the numbers. Each case's losses are
// written, as bits, to --losses_out; the script compares the asynchronous runs' (with and
// without jitter) with the immediate one's (where work runs as it is issued, so no ordering
// can be missing). Here
// each case is also held to one worker within the parity tolerance, and every strategy to
// one host synchronization per read of the loss.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "absl/strings/str_format.h"
#include "comm/mpi_test_main.h"
#include "gtest/gtest.h"
#include "model/sharded_checkpoint.h"
#include "parallel/distributed.h"
#include "parallel/parity_testing.h"
#include "runtime/files.h"
#include "runtime/host_sync.h"

namespace tandem {
namespace {

Communicator* comm = nullptr;
std::string losses_out;   // --losses_out=FILE
std::string scratch_dir;  // for the resume case's checkpoint

TrainConfig Base(int micro_batches) {
  TrainConfig c;
  c.model = *ModelPreset("gpt");
  c.model.n_layer = 4;
  c.model.d_model = 16;
  c.model.n_head = 2;
  c.model.seq_len = 8;
  c.batch = 24;
  c.micro_batches = micro_batches;
  c.steps = 10;
  c.optimizer.lr = 1e-2f;
  c.optimizer.warmup_steps = 2;
  c.optimizer.total_steps = c.steps;
  c.optimizer.weight_decay = 0.05f;
  c.seed = 7;
  return c;
}

std::vector<float> OneWorker(TrainConfig c) {
  c.micro_batches = 1;
  auto t = *Trainer::Create(c);
  std::vector<float> losses;
  EXPECT_TRUE(t->Run([&](const StepReport& r) { losses.push_back(r.loss); }).ok());
  return losses;
}

// Steps [from, to) of a trainer, reading every `read_every` steps (and at the end).
std::vector<float> Train(DistributedTrainer& t, int to, int read_every = 1) {
  std::vector<float> losses;
  while (t.step() < to) {
    EXPECT_TRUE(t.Issue().ok());
    if (t.step() % read_every != 0 && t.step() != to) continue;
    auto done = t.Read();
    EXPECT_TRUE(done.ok()) << done.status();
    if (!done.ok()) return losses;
    for (const CompletedStep& c : *done) losses.push_back(c.report.loss);
  }
  return losses;
}

// The bits of every case's losses, in case order, for the script's comparison.
std::map<std::string, std::vector<float>>& Recorded() {
  static auto* r = new std::map<std::string, std::vector<float>>();
  return *r;
}

void Record(const std::string& name, const std::vector<float>& losses) {
  Recorded()[name] = losses;
}

void ExpectNearOneWorker(const std::vector<float>& want, const std::vector<float>& got,
                         const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-7)
        << what << " step " << i << " on rank " << comm->rank();
  }
}

// The bucket size that cuts the model's gradients into `n` buckets.
int64_t BucketBytesFor(const ModelConfig& model, int n) {
  auto stage = *Stage::Create(model, 0, model.num_blocks(), Device::Cpu(), 1);
  for (int64_t bytes = 64; bytes <= (1 << 20); bytes += 64) {
    const size_t got = PlanBuckets(stage->layout(), stage->ParamBlocks(), bytes).size();
    if (got == static_cast<size_t>(n)) return bytes;
  }
  return -1;
}

TEST(OrderingTest, DataParallelWithThirteenBuckets) {
  ParallelConfig pc;
  pc.train = Base(2);
  pc.strategy = StrategyKind::kData;
  // The first depth whose gradients some bucket size cuts into exactly 13 buckets.
  for (int layers = 3; layers <= 8; ++layers) {
    pc.train.model.n_layer = layers;
    pc.bucket_bytes = BucketBytesFor(pc.train.model, 13);
    if (pc.bucket_bytes > 0) break;
  }
  ASSERT_GT(pc.bucket_bytes, 0) << "no depth and bucket size give 13 buckets";
  auto t = *DistributedTrainer::Create(pc, comm);
  const std::vector<float> losses = Train(*t, pc.train.steps);
  ExpectNearOneWorker(OneWorker(pc.train), losses, "data parallel");
  Record("data parallel, 13 buckets", losses);
}

// A pipeline over every rank under `schedule`, in `micro_batches` micro-batches.
ParallelConfig Pipeline(const std::string& schedule, int micro_batches) {
  ParallelConfig pc;
  pc.train = Base(micro_batches);
  pc.strategy = StrategyKind::kPipeline;
  pc.schedule = schedule;
  return pc;
}

void PipelineCase(const std::string& schedule, bool recompute) {
  ParallelConfig pc = Pipeline(schedule, 6);
  pc.recompute = recompute;
  auto t = *DistributedTrainer::Create(pc, comm);
  const std::vector<float> losses = Train(*t, pc.train.steps);
  const std::string name =
      absl::StrFormat("%s, 3 stages, 6 micro-batches%s", schedule, recompute ? ", recompute" : "");
  ExpectNearOneWorker(OneWorker(pc.train), losses, name);
  Record(name, losses);
}

TEST(OrderingTest, GpipeAndOneFOneB) {
  PipelineCase("gpipe", false);
  PipelineCase("1f1b", false);
}

TEST(OrderingTest, Recompute) {
  PipelineCase("gpipe", true);
  PipelineCase("1f1b", true);
}

// Skips a case unless the run has `world` ranks.
#define REQUIRE_WORLD(world)                                                            \
  if (comm->world_size() != (world)) {                                                  \
    GTEST_SKIP() << "takes " << (world) << " ranks, not " << comm->world_size();        \
  }

TEST(OrderingTest, ZeroBubbleH1) {
  REQUIRE_WORLD(3);
  // B and W apart: each deferred W reads the activations and output gradient B left.
  PipelineCase("zb-h1", false);
}

// The trainer of `pc` for 6 steps read every third (the host two steps ahead of the
// device), against one worker; its losses recorded as `name`. Returns the trained stage.
Trained ShortCase(ParallelConfig pc, const std::string& name) {
  pc.train.steps = pc.train.optimizer.total_steps = 6;
  auto t = DistributedTrainer::Create(pc, comm);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  const std::vector<float> losses = Train(**t, pc.train.steps, 3);
  ExpectNearOneWorker(OneWorker(pc.train), losses, name);
  Record(name, losses);
  return Collect((*t)->stage(), losses);
}

// Validation between steps, issued behind steps not read yet: its forward must wait for
// those steps' updates, and the next step's for its forward. Its losses (and the training's,
// which evaluating leaves alone) against one worker, both recorded.
void EvaluationCase(ParallelConfig pc, const std::string& name) {
  pc.train.steps = pc.train.optimizer.total_steps = 6;
  pc.train.val_fraction = 0.25;
  pc.train.eval_every = 2;
  pc.train.eval_batches = 2;
  const Validated one = TrainOneWorkerValidated(pc.train);
  auto t = DistributedTrainer::Create(pc, comm);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<float> losses, val;
  while ((*t)->step() < pc.train.steps) {
    ASSERT_TRUE((*t)->Issue().ok());
    if (pc.train.EvalDue((*t)->step())) {
      auto v = (*t)->Evaluate();
      ASSERT_TRUE(v.ok()) << v.status();
      val.push_back(*v);
    }
    if ((*t)->step() % 3 != 0) continue;
    auto done = (*t)->Read();
    ASSERT_TRUE(done.ok()) << done.status();
    for (const CompletedStep& c : *done) losses.push_back(c.report.loss);
  }
  ExpectNearOneWorker(one.losses, losses, name);
  std::vector<float> want;
  for (const auto& [steps, loss] : one.val) want.push_back(loss);
  ExpectNearOneWorker(want, val, name + " validation");
  Record(name, losses);
  Record(name + ", validation", val);
}

TEST(OrderingTest, EvaluationBetweenSteps) {
  REQUIRE_WORLD(3);
  EvaluationCase(Pipeline("1f1b", 6), "1f1b, 3 stages, evaluated every 2 steps");
  ParallelConfig data;
  data.train = Base(2);
  data.strategy = StrategyKind::kData;
  data.bucket_bytes = 2048;
  EvaluationCase(data, "data parallel, evaluated every 2 steps");
}

// Interleaved 1F1B: K=2 stages of v=2 chunks each, M=4; each activation goes around the ring
// of stages twice.
TEST(OrderingOnTwoRanksTest, Interleaved) {
  REQUIRE_WORLD(2);
  ParallelConfig pc = Pipeline("interleaved", 4);
  pc.virtual_stages = 2;
  ShortCase(pc, "interleaved, 2 stages x 2 chunks, 4 micro-batches");
}

// Tied embeddings over a 2-stage pipeline: the first and last stage sum the table's
// gradients before either updates it, and their copies stay the same bits.
TEST(OrderingOnTwoRanksTest, TiedEmbeddings) {
  REQUIRE_WORLD(2);
  ParallelConfig pc = Pipeline("1f1b", 4);
  pc.train.model.tie_embeddings = true;
  const Trained got = ShortCase(pc, "1f1b tied embeddings, 2 stages, 4 micro-batches");
  ExpectTiedCopiesEqual(pc, comm, got);
}

// Tensor parallelism over both ranks: every block's collectives on the stream between its
// matmuls, with the data-parallel strategy's step around them.
TEST(OrderingOnTwoRanksTest, TensorParallel) {
  REQUIRE_WORLD(2);
  ParallelConfig pc;
  pc.train = Base(2);
  pc.train.model.n_head = 4;
  pc.strategy = StrategyKind::kData;
  pc.tensor_parallel = 2;
  ShortCase(pc, "data, T=2, 2 micro-batches");
  pc.sequence_parallel = true;
  ShortCase(pc, "data, T=2 sequence parallel, 2 micro-batches");
}

// T=2 x K=2 under ZB-H1: the collectives of each B inside the schedule's transfers.
TEST(OrderingOnFourRanksTest, TensorParallelPipeline) {
  REQUIRE_WORLD(4);
  ParallelConfig pc = Pipeline("zb-h1", 4);
  pc.train.model.n_head = 4;
  pc.tensor_parallel = 2;
  ShortCase(pc, "zb-h1, T=2 x K=2, 4 micro-batches");
}

// D=2 replicas of a K=2 pipeline under ZeRO-1: each stage's gradients reduced over its
// replicas in buckets, each replica updating its shard and gathering the other's.
TEST(OrderingOnFourRanksTest, ZeroOneOnReplicasOfAPipeline) {
  REQUIRE_WORLD(4);
  for (const char* schedule : {"1f1b", "zb-h1"}) {
    ParallelConfig pc = Pipeline(schedule, 4);
    pc.data_parallel = 2;
    pc.zero = 1;
    pc.bucket_bytes = 2048;  // several buckets per stage
    ShortCase(pc, absl::StrFormat("%s ZeRO-1, D=2 x K=2, 4 micro-batches", schedule));
  }
}

// A run stopped at step 5 and resumed from its checkpoint gives the losses of a run never
// stopped, bit for bit.
TEST(OrderingTest, Resume) {
  const ParallelConfig pc = Pipeline("1f1b", 6);
  std::vector<float> whole, resumed;
  {
    auto t = *DistributedTrainer::Create(pc, comm);
    whole = Train(*t, pc.train.steps);
  }
  const std::string dir = scratch_dir + "/resume";
  ASSERT_TRUE(MakeDirs(dir).ok()) << dir;
  {
    auto t = *DistributedTrainer::Create(pc, comm);
    resumed = Train(*t, 5);
    ASSERT_TRUE(t->SaveCheckpoint(dir).ok());
  }
  auto t = *DistributedTrainer::Create(pc, comm);
  ASSERT_TRUE(t->LoadCheckpoint(CheckpointPrefixFor(dir, 5)).ok());
  const std::vector<float> rest = Train(*t, pc.train.steps);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  ASSERT_EQ(resumed.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(std::memcmp(&resumed[i], &whole[i], sizeof(float)), 0)
        << "step " << i << ": " << resumed[i] << " vs " << whole[i];
  }
  Record("1f1b resumed at step 5", resumed);
}

// A steady step synchronizes the host once when the loss is read every step, and once per
// read when it is read every third step; none of those syncs is unexpected (all are the loss
// reads), for every strategy.
TEST(OrderingTest, OneHostSyncPerReadOfTheLoss) {
  if (!(*Stream::Compute(Device::Cpu()))->async()) {
    GTEST_SKIP() << "immediate CPU streams run every wait for communication on the host";
  }
  for (StrategyKind kind : {StrategyKind::kData, StrategyKind::kPipeline, StrategyKind::kModel}) {
    for (const char* schedule : {"gpipe", "1f1b"}) {
      if (kind != StrategyKind::kPipeline && std::string(schedule) == "1f1b") continue;
      SCOPED_TRACE(absl::StrFormat("%s %s", StrategyName(kind), schedule));
      ParallelConfig pc;
      pc.train = Base(kind == StrategyKind::kModel ? 1 : kind == StrategyKind::kData ? 2 : 6);
      pc.train.steps = 14;
      pc.strategy = kind;
      pc.schedule = schedule;
      auto t = *DistributedTrainer::Create(pc, comm);
      Train(*t, 2);  // warm-up
      const int64_t unexpected = HostSync::UnexpectedCount();
      std::vector<int64_t> syncs;
      for (int read_every : {1, 3}) {
        const int64_t before = HostSync::Count();
        int steps = 0;
        while (steps < 6) {
          ASSERT_TRUE(t->Issue().ok());
          if (++steps % read_every != 0) continue;
          auto done = t->Read();
          ASSERT_TRUE(done.ok()) << done.status();
          for (const CompletedStep& c : *done) syncs.push_back(c.timing.host_syncs);
        }
        EXPECT_EQ(HostSync::Count() - before, 6 / read_every) << "read every " << read_every;
      }
      EXPECT_EQ(syncs, (std::vector<int64_t>{1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 1}));
      EXPECT_EQ(HostSync::UnexpectedCount(), unexpected);
    }
  }
}

// Writes every case's losses, as bits, to --losses_out.
void WriteLosses() {
  if (comm->rank() != 0 || losses_out.empty()) return;
  std::ofstream out(losses_out);
  for (const auto& [name, losses] : Recorded()) {
    out << name << ":";
    for (float l : losses) {
      uint32_t bits;
      std::memcpy(&bits, &l, sizeof(bits));
      out << absl::StrFormat(" %08x", bits);
    }
    out << "\n";
  }
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--losses_out=", 0) == 0) tandem::losses_out = a.substr(13);
    if (a.rfind("--scratch_dir=", 0) == 0) tandem::scratch_dir = a.substr(14);
  }
  if (tandem::scratch_dir.empty()) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    tandem::scratch_dir = tmp ? tmp : "/tmp";
  }
  return tandem::RunMpiTests(argc, argv, &tandem::comm, tandem::WriteLosses);
}
