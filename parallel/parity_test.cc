// Run under mpirun with 1 to 4 ranks (parity_test_np1 to _np4, through comm/mpirun_test.sh):
// every strategy, schedule and micro-batch count that fits the world size trains a small model
// for a number of steps and must give the losses and weights of one worker on the same global
// batch and seed, the losses within 1e-5 relative (docs/DESIGN.md, invariant 1).
#include <map>

#include "absl/strings/str_format.h"
#include "comm/mpi_test_main.h"
#include "gtest/gtest.h"
#include "parallel/parity_testing.h"

namespace tandem {
namespace {

Communicator* comm = nullptr;
constexpr int kSteps = 20;

TrainConfig Base(ModelKind kind, int micro_batches, const std::string& optimizer) {
  return ParityConfig(kind, micro_batches, optimizer, kSteps);
}

void Check(const ParallelConfig& pc, const std::string& name) { CheckParity(pc, comm, name); }

const std::vector<std::string> kOptimizers = {"sgd", "adamw"};

TEST(ParityTest, DataParallel) {
  for (const std::string& opt : kOptimizers)
  for (ModelKind kind : {ModelKind::kGpt, ModelKind::kMlp}) {
    for (int mbs : {1, 2}) {
      for (bool overlap : {true, false}) {
        ParallelConfig pc;
        pc.train = Base(kind, mbs, opt);
        pc.strategy = StrategyKind::kData;
        pc.overlap = overlap;
        pc.bucket_bytes = 4096;  // several buckets even for this small model
        Check(pc, absl::StrFormat("data %s mb=%d overlap=%d",
                                  kind == ModelKind::kGpt ? "gpt" : "mlp", mbs, overlap));
      }
    }
  }
}

TEST(ParityTest, ModelAndPipelineParallel) {
  for (const std::string& opt : kOptimizers)
  for (ModelKind kind : {ModelKind::kGpt, ModelKind::kMlp}) {
    ParallelConfig model;
    model.train = Base(kind, 1, opt);
    model.strategy = StrategyKind::kModel;
    for (bool recompute : {false, true}) {
      model.recompute = recompute;
      Check(model, absl::StrFormat("model recompute=%d", recompute));
      for (const char* schedule : {"gpipe", "1f1b"}) {
        for (int mbs : {1, 4, 8}) {
          ParallelConfig pc;
          pc.train = Base(kind, mbs, opt);
          pc.strategy = StrategyKind::kPipeline;
          pc.schedule = schedule;
          pc.recompute = recompute;
          Check(pc, absl::StrFormat("pipeline %s M=%d recompute=%d", schedule, mbs, recompute));
        }
      }
    }
  }
}

// 1F1B holds at most min(K - stage, M) micro-batches of activations on a stage where GPipe
// holds all M, and the allocator's peak shows it on every stage that keeps activations for
// backward (here every stage but the first, which holds the embedding alone: its sends keep
// every micro-batch's output until the step's end under both schedules).
TEST(ParityTest, OneFOneBHoldsFewerActivations) {
  const int K = comm->world_size();
  if (K < 2) GTEST_SKIP() << "a pipeline needs 2 ranks or more";
  std::map<std::string, std::pair<int, int64_t>> seen;  // schedule -> (in flight, peak bytes)
  for (const char* schedule : {"gpipe", "1f1b"}) {
    ParallelConfig pc;
    pc.train = Base(ModelKind::kGpt, 8, "adamw");
    pc.strategy = StrategyKind::kPipeline;
    pc.schedule = schedule;
    auto t = *DistributedTrainer::Create(pc, comm);
    Allocator* cpu = *GetAllocator(Device::Cpu());
    ASSERT_TRUE(t->Step().ok());  // the first step warms the allocator's cache
    cpu->ResetPeak();
    const int64_t base = cpu->stats().allocated_bytes;
    StepTiming timing;
    ASSERT_TRUE(t->Step(&timing).ok());
    seen[schedule] = {timing.peak_in_flight, cpu->stats().peak_allocated_bytes - base};
  }
  const int stage = comm->rank();
  EXPECT_EQ(seen["gpipe"].first, 8) << "stage " << stage;
  EXPECT_EQ(seen["1f1b"].first, std::min(K - stage, 8)) << "stage " << stage;
  ParallelConfig pc;
  pc.train = Base(ModelKind::kGpt, 8, "adamw");
  pc.strategy = StrategyKind::kPipeline;
  const StageBounds bounds = *PlanStages(pc, K);
  const MemoryNeed one = EstimateStageMemory(pc.train.model, bounds[stage], bounds[stage + 1], 3,
                                             /*in_flight=*/1, false, DType::kF32, "adamw",
                                             Device::Cpu());
  if (one.activations > 0) {
    EXPECT_LT(seen["1f1b"].second, seen["gpipe"].second) << "stage " << stage;
  }
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::RunMpiTests(argc, argv, &tandem::comm); }
