// Run under mpirun on 3, 4 and 6 ranks (hybrid_test_np3, _np4, _np6): replicas of a pipeline
// (D x K, parallel/grid.h; GPipe, 1F1B and ZB-H1) and ZeRO-1 against one worker on the same
// global batch and seed, losses within 1e-5 relative and weights within 1e-4; and a resume
// across layouts, from a D=2 x K=2 checkpoint (with ZeRO-1 and without) into data
// parallelism on one worker and the reverse; and the validation loss of each layout.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_format.h"
#include "comm/mpi_test_main.h"
#include "gtest/gtest.h"
#include "parallel/parity_testing.h"

namespace tandem {
namespace {

Communicator* comm = nullptr;
constexpr int kSteps = 12;
const std::vector<std::string> kOptimizers = {"sgd", "adamw"};
constexpr double kWeightTolerance = 1e-4;  // absolute

// D x K layouts of this world with D and K of 2 or more.
std::vector<int> HybridReplicas() {
  std::vector<int> d;
  const int world = comm->world_size();
  for (int r = 2; r <= world / 2; ++r) {
    if (world % r == 0) d.push_back(r);
  }
  return d;
}

ParallelConfig Hybrid(const std::string& optimizer, int replicas, const char* schedule,
                      int zero) {
  ParallelConfig pc;
  pc.train = ParityConfig(ModelKind::kGpt, 4, optimizer, kSteps);
  pc.strategy = StrategyKind::kPipeline;
  pc.schedule = schedule;
  pc.data_parallel = replicas;
  pc.zero = zero;
  pc.bucket_bytes = 2048;  // several buckets per stage even for this small model
  return pc;
}

TEST(HybridTest, ReplicasOfAPipeline) {
  const std::vector<int> layouts = HybridReplicas();
  if (layouts.empty()) GTEST_SKIP() << "no D x K layout with D, K >= 2 on " << comm->world_size();
  for (const std::string& opt : kOptimizers) {
    for (int d : layouts) {
      for (const char* schedule : {"gpipe", "1f1b", "zb-h1"}) {
        CheckParity(Hybrid(opt, d, schedule, 0), comm,
                    absl::StrFormat("D=%d x K=%d %s", d, comm->world_size() / d, schedule),
                    kWeightTolerance);
      }
    }
  }
}

// The validation loss of D replicas of a K-stage pipeline (each replica's last stage sums
// its share) is one worker's within 1e-5 relative; evaluating changes no training bit.
TEST(HybridTest, ValidationLoss) {
  const std::vector<int> layouts = HybridReplicas();
  if (layouts.empty()) GTEST_SKIP() << "no D x K layout with D, K >= 2 on " << comm->world_size();
  ParallelConfig pc = Hybrid("adamw", 0, "1f1b", 0);
  pc.train.steps = pc.train.optimizer.total_steps = 3;
  pc.train.val_fraction = 0.25;
  pc.train.eval_every = 2;
  pc.train.eval_batches = 2;
  const Validated one = TrainOneWorkerValidated(pc.train);
  ASSERT_EQ(one.val.size(), 2u);
  for (int d : layouts) {
    pc.data_parallel = d;
    CheckValidationParity(one, pc, comm,
                          absl::StrFormat("D=%d x K=%d 1f1b", d, comm->world_size() / d));
  }
}

TEST(HybridTest, ZeroOneWithReplicasOfAPipeline) {
  const std::vector<int> layouts = HybridReplicas();
  if (layouts.empty()) GTEST_SKIP() << "no D x K layout with D, K >= 2 on " << comm->world_size();
  for (const std::string& opt : kOptimizers) {
    for (int d : layouts) {
      for (const char* schedule : {"1f1b", "zb-h1"}) {
        CheckParity(Hybrid(opt, d, schedule, 1), comm,
                    absl::StrFormat("ZeRO-1 D=%d x K=%d %s", d, comm->world_size() / d, schedule),
                    kWeightTolerance);
      }
    }
  }
}

TEST(HybridTest, ZeroOneWithDataParallelism) {
  if (comm->world_size() < 2) GTEST_SKIP() << "ZeRO-1 shards over 2 replicas or more";
  for (const std::string& opt : kOptimizers) {
    for (bool overlap : {true, false}) {
      ParallelConfig pc;
      pc.train = ParityConfig(ModelKind::kGpt, 2, opt, kSteps);
      pc.strategy = StrategyKind::kData;
      pc.zero = 1;
      pc.overlap = overlap;
      pc.bucket_bytes = 2048;
      CheckParity(pc, comm, absl::StrFormat("ZeRO-1 data overlap=%d", overlap),
                  kWeightTolerance);
    }
  }
}

// Half the steps in one layout, a checkpoint, the other half in another: the losses and
// weights of one worker's uninterrupted run.
void CheckResume(const ParallelConfig& first, const ParallelConfig& second,
                 const std::string& name) {
  SCOPED_TRACE(name);
  const int rank = comm->rank();
  const Trained whole = TrainOneWorker(first.train);
  // One rank alone is data parallelism on one worker.
  auto alone = comm->Split(rank, 0, "this rank alone", {rank});
  ASSERT_TRUE(alone.ok()) << alone.status();
  auto run = [&](const ParallelConfig& pc, const std::string& resume, const std::string& save) {
    const bool one = pc.strategy == StrategyKind::kData && pc.data_parallel == 1 &&
                     pc.zero == 0;
    if (one && rank != 0) return Trained{};
    return TrainDistributed(pc, one ? alone->get() : comm, kSteps / 2, resume, save);
  };
  static int runs = 0;  // the same directory on every rank (TEST_TMPDIR is shared)
  const std::string save = absl::StrFormat("%s/resume-%d", std::getenv("TEST_TMPDIR"), ++runs);
  if (rank == 0) ASSERT_TRUE(std::filesystem::create_directories(save));
  {
    auto made = comm->Barrier();
    ASSERT_TRUE(made.ok() && (*made)->Wait(absl::Minutes(2)).ok());
  }
  run(first, "", save);
  auto barrier = comm->Barrier();
  ASSERT_TRUE(barrier.ok() && (*barrier)->Wait(absl::Minutes(2)).ok());
  const Trained resumed =
      run(second, absl::StrFormat("%s/step-%06d", save, kSteps / 2), "");
  if (resumed.losses.empty()) return;  // a rank outside the one-worker run
  ExpectClose(std::vector<float>(whole.losses.begin() + kSteps / 2, whole.losses.end()),
              resumed.losses, name + " losses", 0, rank);
  ExpectSameWeights(whole, resumed, name, kWeightTolerance, rank, /*absolute=*/true);
}

TEST(HybridTest, ResumeAcrossLayouts) {
  if (comm->world_size() != 4) GTEST_SKIP() << "D=2 x K=2 takes 4 ranks";
  for (const std::string& opt : kOptimizers) {
    for (int zero : {0, 1}) {
      ParallelConfig one;
      one.train = ParityConfig(ModelKind::kGpt, 1, opt, kSteps);
      one.strategy = StrategyKind::kData;
      const ParallelConfig grid = Hybrid(opt, 2, "1f1b", zero);
      CheckResume(grid, one, absl::StrFormat("D=2 x K=2 zero=%d into one worker", zero));
      CheckResume(one, grid, absl::StrFormat("one worker into D=2 x K=2 zero=%d", zero));
    }
  }
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::RunMpiTests(argc, argv, &tandem::comm); }
