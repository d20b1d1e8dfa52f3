// Run under mpirun on 2, 3 and 4 ranks (sharded_test_np2, _np3, _np4): ZeRO-2 (gradients and
// optimizer state sharded over the replicas) against one worker on the same global batch and
// seed, losses within 1e-5 relative and weights within 1e-4: data parallel with and without
// overlap, with gradient accumulation, recompute and tied embeddings, and D=2 x K=2 (4 ranks);
// resumes across ZeRO levels and strategies; and each rank's model state, measured by its
// allocator, against the textbook formula (3 ranks: uneven shards).
#include <cstdlib>
#include <string>

#include "absl/strings/str_format.h"
#include "comm/mpi_test_main.h"
#include "gtest/gtest.h"
#include "parallel/parity_testing.h"
#include "runtime/allocator.h"
#include "runtime/stream.h"

namespace tandem {
namespace {

Communicator* comm = nullptr;
constexpr int kSteps = 12;
constexpr double kWeightTolerance = 1e-4;  // absolute

ParallelConfig Data(const std::string& optimizer, int micro_batches, int zero) {
  ParallelConfig pc;
  pc.train = ParityConfig(ModelKind::kGpt, micro_batches, optimizer, kSteps);
  pc.strategy = StrategyKind::kData;
  pc.data_parallel = comm->world_size();
  pc.zero = zero;
  pc.bucket_bytes = 2048;  // several buckets even for this small model
  return pc;
}

ParallelConfig Grid(int zero, const char* schedule) {
  ParallelConfig pc = Data("adamw", 4, zero);
  pc.strategy = StrategyKind::kPipeline;
  pc.schedule = schedule;
  pc.data_parallel = 2;
  return pc;
}

TEST(ShardedTest, ZeroTwoDataParallel) {
  for (const std::string& opt : {"sgd", "adamw"}) {
    for (int m : {1, 2}) {
      for (bool overlap : {true, false}) {
        ParallelConfig pc = Data(opt, m, 2);
        pc.overlap = overlap;
        CheckParity(pc, comm,
                    absl::StrFormat("ZeRO-2 data %s M=%d overlap=%d", opt, m, overlap),
                    kWeightTolerance);
      }
    }
  }
}

TEST(ShardedTest, ZeroTwoWithRecomputeAndTiedEmbeddings) {
  ParallelConfig pc = Data("adamw", 2, 2);
  pc.recompute = true;
  CheckParity(pc, comm, "ZeRO-2 data recompute", kWeightTolerance);
  pc.recompute = false;
  pc.train.model.tie_embeddings = true;
  CheckParity(pc, comm, "ZeRO-2 data tied", kWeightTolerance);
}

// D=2 x K=2: each stage's gradients sharded over its two replicas; tied, the table's bucket is
// summed over the embedding group, all-reduced, and its part kept.
TEST(ShardedTest, ZeroTwoWithReplicasOfAPipeline) {
  if (comm->world_size() != 4) GTEST_SKIP() << "D=2 x K=2 takes 4 ranks";
  for (const char* schedule : {"1f1b", "zb-h1"}) {
    for (bool tied : {false, true}) {
      ParallelConfig pc = Grid(2, schedule);
      pc.train.model.tie_embeddings = tied;
      CheckParity(pc, comm, absl::StrFormat("ZeRO-2 D=2 x K=2 %s tied=%d", schedule, tied),
                  kWeightTolerance);
    }
  }
  ParallelConfig pc = Grid(2, "interleaved");
  pc.virtual_stages = 2;
  CheckParity(pc, comm, "ZeRO-2 D=2 x K=2 interleaved v=2", kWeightTolerance);
}

// A checkpoint holds whole tensors by name whatever wrote it: ZeRO-2 resumes as one worker,
// as a pipeline, as ZeRO-1 and the reverse.
TEST(ShardedTest, ResumeAcrossZeroLevelsAndStrategies) {
  ParallelConfig one;
  one.train = ParityConfig(ModelKind::kGpt, 1, "adamw", kSteps);
  one.strategy = StrategyKind::kData;
  const ParallelConfig zero2 = Data("adamw", 2, 2);
  ParallelConfig pipeline = Data("adamw", 4, 0);
  pipeline.strategy = StrategyKind::kPipeline;
  pipeline.schedule = "1f1b";
  pipeline.data_parallel = 1;
  const ParallelConfig zero1 = Data("adamw", 1, 1);
  CheckResume(zero2, one, comm, kWeightTolerance, "ZeRO-2 data into one worker");
  CheckResume(one, zero2, comm, kWeightTolerance, "one worker into ZeRO-2 data");
  CheckResume(zero2, pipeline, comm, kWeightTolerance, "ZeRO-2 data into a pipeline");
  CheckResume(pipeline, zero2, comm, kWeightTolerance, "a pipeline into ZeRO-2 data");
  CheckResume(zero2, zero1, comm, kWeightTolerance, "ZeRO-2 into ZeRO-1");
  CheckResume(zero1, zero2, comm, kWeightTolerance, "ZeRO-1 into ZeRO-2");
  if (comm->world_size() != 4) return;
  CheckResume(Grid(2, "1f1b"), zero1, comm, kWeightTolerance, "ZeRO-2 D=2 x K=2 into ZeRO-1");
  CheckResume(zero1, Grid(2, "1f1b"), comm, kWeightTolerance, "ZeRO-1 into ZeRO-2 D=2 x K=2");
}

// Bytes the CPU allocator hands out now (its requests, so not what its cache happens to hold).
int64_t RequestedBytes() {
  Allocator* a = *GetAllocator(Device::Cpu());
  EXPECT_TRUE((*Stream::Compute(Device::Cpu()))->Synchronize().ok());
  return a->stats().requested_bytes;
}

// Model state per rank for f32 AdamW with P parameters on N ranks, between steps: 16P
// replicated, 4P + 4P + 8P/N under ZeRO-1, 4P + 12P/N under ZeRO-2 (shards of ceil(P/N)).
// The memory estimate gives it, and the allocator measures it within 3%: on top of the model
// state, only the step's few scalars and the next step's input stay allocated.
TEST(ShardedTest, ModelStateMeasuredAgainstItsFormula) {
  const int n = comm->world_size();
  for (int zero : {0, 1, 2}) {
    ParallelConfig pc = Data("adamw", 1, zero);
    pc.train.model.d_model = 64;
    pc.train.model.n_head = 4;
    pc.train.model.n_layer = 2;
    pc.train.steps = pc.train.optimizer.total_steps = 2;
    pc.bucket_bytes = 64 << 10;
    const int64_t before = RequestedBytes();
    auto t = DistributedTrainer::Create(pc, comm);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int step = 0; step < 2; ++step) ASSERT_TRUE((*t)->Step().ok());
    const int64_t measured = RequestedBytes() - before;
    const int64_t p = (*t)->stage().layout().numel();
    const int64_t shard = (p + n - 1) / n;
    const int64_t formula = zero == 0   ? 16 * p
                            : zero == 1 ? 8 * p + 8 * shard
                                        : 4 * p + 12 * shard;
    const MemoryNeed& need = (*t)->memory().need;
    const std::string what =
        absl::StrFormat("rank %d, ZeRO-%d, N=%d, P=%d", comm->rank(), zero, n, p);
    EXPECT_EQ(need.params + need.grads + need.optimizer, formula) << what;
    EXPECT_NEAR(static_cast<double>(measured), static_cast<double>(formula), 0.03 * formula)
        << what << ": the allocator holds " << measured << " bytes";
    if (comm->rank() == 0) {
      std::printf("%s: model state %lld bytes by the formula, %lld measured (%+.2f%%)\n",
                  what.c_str(), static_cast<long long>(formula),
                  static_cast<long long>(measured), 100.0 * (measured - formula) / formula);
    }
  }
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::RunMpiTests(argc, argv, &tandem::comm); }
