// The layout of a job, resolved once: from the parallel configuration and the world size, the
// process grid (parallel/grid.h), the block bounds of every stage and model chunk, the
// schedule with its exchange groups, and what each rank must hold during a step; or one clear
// error naming the flag to change. The launcher's check, the planner and every worker's
// DistributedTrainer::Create resolve it the same way, so all agree on who runs what (as
// torchtitan's ParallelDims is validated and built once, and Megatron-LM's process groups in
// one initialize_model_parallel).
//
// Nothing here runs a model: --balance=time takes the blocks' measured times as an input
// (TimeBlocks in parallel/distributed.h measures them; the launcher does so once, before any
// worker starts, and hands the workers explicit stage sizes).
#ifndef TANDEM_PARALLEL_LAYOUT_H_
#define TANDEM_PARALLEL_LAYOUT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "model/memory.h"
#include "model/trainer.h"
#include "parallel/grid.h"
#include "parallel/partition.h"
#include "parallel/schedule.h"

namespace tandem {

enum class StrategyKind { kData, kModel, kPipeline };
absl::StatusOr<StrategyKind> ParseStrategy(absl::string_view name);
const char* StrategyName(StrategyKind k);

struct ParallelConfig {
  TrainConfig train;
  StrategyKind strategy = StrategyKind::kData;
  std::string schedule = "gpipe";    // pipeline: gpipe, 1f1b, zb-h1 or interleaved
  int virtual_stages = 1;            // interleaved: model chunks v per stage (v x K in all)
  std::string balance = "params";    // pipeline: params, time, or explicit sizes "3,3,2"
  int data_parallel = 1;             // pipeline and model: replicas D (T x D x stages = world)
  int tensor_parallel = 1;           // T: ranks each stage's blocks are split over (a GPT)
  bool sequence_parallel = false;    // T >= 2: the residual stream's rows split over them too
  int zero = 0;                      // 1: ZeRO-1, optimizer state sharded over the replicas
  int64_t bucket_bytes = 25 << 20;   // data parallel
  bool overlap = true;               // data parallel: all-reduce during backward
  bool recompute = false;            // keep only stage inputs; recompute forward in backward
  absl::Duration timeout = absl::Minutes(5);  // any one wait for communication
};

struct JobLayout {
  ProcessGrid grid;
  // The model's K x v global stages, [bounds[g], bounds[g + 1]) blocks each; {0, blocks}
  // under data parallelism. Global stage g runs on stage g mod K as its chunk g div K.
  StageBounds bounds;
  // Pipeline and model parallel: the schedule every replica runs, validated, and each stage's
  // exchange groups (ExchangeGroups). Empty under data parallelism.
  PipelineSchedule schedule;
  std::vector<std::vector<std::vector<int>>> exchange_groups;
  // What each rank must hold during a step (model/memory.h): its stage's model state (under
  // ZeRO-1 its shard of the optimizer state), the activations of as many micro-batches as
  // its schedule holds at once, the transfers' buffers it keeps, and what its deferred Ws
  // (zb-h1) hold.
  std::vector<MemoryNeed> memory;

  bool pipelined() const { return !schedule.actions.empty(); }
  // Each model chunk of stage `stage`, [begin, end) blocks (one, but for interleaved
  // schedules); and from its first chunk's first block to its last chunk's end.
  std::vector<std::pair<int, int>> ChunkRanges(int stage) const;
  std::pair<int, int> BlockRange(int stage) const;
  // The stage sizes in blocks, "3,3,2": an explicit --balance that gives these bounds.
  std::string StageSizes() const;
};

// What ResolveLayout may be given besides the configuration.
struct LayoutInputs {
  // --balance=time: each block's forward and backward seconds on one micro-batch
  // (TimeBlocks), which the stages balance. Required for --balance=time, unused otherwise.
  const std::vector<double>* block_seconds = nullptr;
  // A pipeline's schedule, already made and validated (the planner makes each once for many
  // layouts); made here when null.
  const PipelineSchedule* schedule = nullptr;
};

// The layout of `c` over `world` ranks: checks that the strategy fits the model and world size
// (batch divisible, stages no more than blocks, the schedule valid, ZeRO-1 with replicas to
// shard over), then builds it.
absl::StatusOr<JobLayout> ResolveLayout(const ParallelConfig& c, int world,
                                        const LayoutInputs& in = {});

// What runs on each rank, as `launcher --check --explain` prints it: its place in the grid, its
// blocks, its gradient buckets (under ZeRO-1 with its shard), what it must hold, and its row
// of the schedule. The same buckets and shards as the trainer's, made from the same functions.
std::string ExplainLayout(const ParallelConfig& c, const JobLayout& l);

// Explicit stage sizes ("3,3,2") that balance the per-block `seconds` over `stages` stages.
absl::StatusOr<std::string> BalancedSizes(const std::vector<double>& seconds, int stages);

}  // namespace tandem

#endif  // TANDEM_PARALLEL_LAYOUT_H_
