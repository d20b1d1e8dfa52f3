// Run under mpirun on 3, 4 and 6 ranks (hybrid_test_np3, _np4, _np6): replicas of a pipeline
// (D x K, parallel/grid.h; GPipe, 1F1B, ZB-H1 and interleaved) and ZeRO-1 against one worker on the same
// global batch and seed, losses within 1e-5 relative and weights within 1e-4; and a resume
// across layouts, from a D=2 x K=2 checkpoint (with ZeRO-1 and without) into data
// parallelism on one worker and the reverse; and the validation loss of each layout.
#include <algorithm>
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

// Tied embeddings on D x K: each replica's first and last stage sum the table's gradients
// (its embedding group) before the data-parallel reduction; with ZeRO-1 too.
TEST(HybridTest, TiedEmbeddingsWithReplicasOfAPipeline) {
  const std::vector<int> layouts = HybridReplicas();
  if (layouts.empty()) GTEST_SKIP() << "no D x K layout with D, K >= 2 on " << comm->world_size();
  for (int d : layouts) {
    for (int zero : {0, 1}) {
      ParallelConfig pc = Hybrid("adamw", d, "1f1b", zero);
      pc.train.model.tie_embeddings = true;
      CheckParity(pc, comm,
                  absl::StrFormat("tied D=%d x K=%d zero=%d", d, comm->world_size() / d, zero),
                  kWeightTolerance);
    }
  }
}

// Interleaved 1F1B (2 model chunks a stage) inside D x K, with M = 2K micro-batches, with
// ZeRO-1 and without, untied and tied; and its checkpoint resumed on one worker and the
// reverse (each rank's shard holds two chunks' blocks).
TEST(HybridTest, InterleavedReplicasOfAPipeline) {
  const std::vector<int> layouts = HybridReplicas();
  if (layouts.empty()) GTEST_SKIP() << "no D x K layout with D, K >= 2 on " << comm->world_size();
  for (int d : layouts) {
    const int K = comm->world_size() / d;
    for (int zero : {0, 1}) {
      for (bool tied : {false, true}) {
        ParallelConfig pc = Hybrid("adamw", d, "interleaved", zero);
        pc.virtual_stages = 2;
        pc.train.micro_batches = 2 * K;
        pc.train.model.n_layer = std::max(pc.train.model.n_layer, 2 * K - 2);
        pc.train.model.tie_embeddings = tied;
        CheckParity(pc, comm,
                    absl::StrFormat("interleaved D=%d x K=%d v=2 zero=%d tied=%d", d, K, zero,
                                    tied),
                    kWeightTolerance);
      }
    }
  }
  if (comm->world_size() != 4) return;
  ParallelConfig one;
  one.train = ParityConfig(ModelKind::kGpt, 1, "adamw", kSteps);
  one.strategy = StrategyKind::kData;
  ParallelConfig grid = Hybrid("adamw", 2, "interleaved", 1);
  grid.virtual_stages = 2;
  CheckResume(grid, one, comm, kWeightTolerance, "interleaved D=2 x K=2 into one worker");
  CheckResume(one, grid, comm, kWeightTolerance, "one worker into interleaved D=2 x K=2");
}

TEST(HybridTest, ResumeAcrossLayouts) {
  if (comm->world_size() != 4) GTEST_SKIP() << "D=2 x K=2 takes 4 ranks";
  for (const std::string& opt : kOptimizers) {
    for (int zero : {0, 1}) {
      ParallelConfig one;
      one.train = ParityConfig(ModelKind::kGpt, 1, opt, kSteps);
      one.strategy = StrategyKind::kData;
      const ParallelConfig grid = Hybrid(opt, 2, "1f1b", zero);
      CheckResume(grid, one, comm, kWeightTolerance,
                  absl::StrFormat("D=2 x K=2 zero=%d into one worker", zero));
      CheckResume(one, grid, comm, kWeightTolerance,
                  absl::StrFormat("one worker into D=2 x K=2 zero=%d", zero));
    }
  }
  // Tied: the checkpoint holds the table once; the last stages fill their copies from it.
  ParallelConfig one;
  one.train = ParityConfig(ModelKind::kGpt, 1, "adamw", kSteps);
  one.train.model.tie_embeddings = true;
  one.strategy = StrategyKind::kData;
  ParallelConfig grid = Hybrid("adamw", 2, "1f1b", 1);
  grid.train.model.tie_embeddings = true;
  CheckResume(grid, one, comm, kWeightTolerance, "tied D=2 x K=2 zero=1 into one worker");
  CheckResume(one, grid, comm, kWeightTolerance, "tied one worker into D=2 x K=2 zero=1");
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::RunMpiTests(argc, argv, &tandem::comm); }
