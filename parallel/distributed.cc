#include "parallel/distributed.h"

#include <cmath>
#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "model/block.h"
#include "model/hf_gpt2.h"
#include "model/sharded_checkpoint.h"
#include "runtime/allocator.h"
#include "runtime/host_sync.h"
#include "runtime/ops.h"
#include "runtime/profiler.h"
#include "runtime/status.h"

namespace tandem {
namespace {

// How long ranks wait for the others to write their checkpoint shards (at least): the
// default timeout of torch.distributed's process groups.
constexpr absl::Duration kCheckpointWriteTimeout = absl::Minutes(30);

// The phases of a step on the compute stream (StreamTimeline kinds), and where each goes in
// StepTiming and in the trace.
enum Phase { kCompute, kExposedComm, kBubble, kOptimizer, kInput };

const char* TraceCategory(int phase) {
  switch (phase) {
    case kCompute: return "compute";
    case kOptimizer: return "optimizer";
    default: return "idle";
  }
}

void AddPhase(const StreamTimeline::Phase& p, StepTiming* t) {
  switch (p.kind) {
    case kCompute: t->compute_seconds += p.seconds; break;
    case kExposedComm: t->exposed_comm_seconds += p.seconds; break;
    case kBubble: t->bubble_seconds += p.seconds; break;
    case kOptimizer: t->optimizer_seconds += p.seconds; break;
    case kInput: t->input_seconds += p.seconds; break;
  }
}

// The schedule a pipeline of `stages` follows; model parallelism is GPipe over its one
// micro-batch.
absl::StatusOr<PipelineSchedule> StrategySchedule(const ParallelConfig& c, int stages) {
  const std::string schedule = c.strategy == StrategyKind::kModel ? "gpipe" : c.schedule;
  return MakeSchedule(schedule, stages, c.train.micro_batches,
                      c.strategy == StrategyKind::kModel ? 1 : c.virtual_stages);
}

// ZeRO-1's shards: `n` elements in `parts` contiguous parts of ceil(n / parts) (the last ones
// shorter, or empty): part r is [offsets[r], offsets[r + 1]).
std::vector<int64_t> EvenParts(int64_t n, int parts) {
  const int64_t size = (n + parts - 1) / parts;
  std::vector<int64_t> offsets;
  for (int r = 0; r <= parts; ++r) offsets.push_back(std::min(n, r * size));
  return offsets;
}

}  // namespace

absl::StatusOr<StrategyKind> ParseStrategy(absl::string_view name) {
  if (name == "data") return StrategyKind::kData;
  if (name == "model") return StrategyKind::kModel;
  if (name == "pipeline") return StrategyKind::kPipeline;
  return absl::InvalidArgumentError(
      absl::StrFormat("--strategy=%s: use data, model or pipeline", name));
}

const char* StrategyName(StrategyKind k) {
  switch (k) {
    case StrategyKind::kData: return "data";
    case StrategyKind::kModel: return "model";
    case StrategyKind::kPipeline: return "pipeline";
  }
  return "?";
}

absl::StatusOr<std::vector<BlockTime>> MeasureBlockTimes(const ModelConfig& model, Device device,
                                                         DType compute, int rows, uint64_t seed) {
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(device));
  return MeasureBlockTimes(model, device, compute, rows, seed, *s);
}

absl::StatusOr<std::unique_ptr<BlockPasses>> BlockPasses::Create(const ModelConfig& model,
                                                                 Device device, DType compute,
                                                                 int rows, uint64_t seed) {
  auto p = std::make_unique<BlockPasses>();
  for (int b = 0; b < model.num_blocks(); ++b) {
    ASSIGN_OR_RETURN(std::unique_ptr<Stage> st,
                     Stage::Create(model, b, b + 1, device, seed, compute));
    p->stages_.push_back(std::move(st));
  }
  const TokenDataset data = TokenDataset::Synthetic(int64_t{rows} * model.seq_len * 4 + 1,
                                                    model.seq_len, model.vocab, seed);
  ASSIGN_OR_RETURN(p->mb_,
                   MakeMicroBatch(data, DataOrder(data.num_samples(), seed), 0, 0, rows,
                                  model.seq_len, device, 1.0f / (rows * model.seq_len)));
  return p;
}

absl::Status BlockPasses::Run(Stream& s, StreamTimeline* timeline) {
  const int n = static_cast<int>(stages_.size());
  auto mark = [&](int kind, const char* name) {
    return timeline == nullptr ? absl::OkStatus() : timeline->Mark(kind, name);
  };
  std::vector<Tensor> outs(n + 1);
  for (int b = 0; b < n; ++b) {
    RETURN_IF_ERROR(stages_[b]->Forward(s, 0, mb_, outs[b], &outs[b + 1]));
    RETURN_IF_ERROR(mark(3 * b, "forward"));
  }
  Tensor d;
  for (int b = n - 1; b >= 0; --b) {
    Tensor dx;
    RETURN_IF_ERROR(stages_[b]->BackwardInput(s, 0, mb_, d, &dx));
    RETURN_IF_ERROR(mark(3 * b + 1, "backward input"));
    RETURN_IF_ERROR(stages_[b]->BackwardWeights(s, 0, mb_));
    RETURN_IF_ERROR(mark(3 * b + 2, "backward weights"));
    d = dx;
  }
  return s.Synchronize();
}

absl::StatusOr<std::vector<BlockTime>> MeasureBlockTimes(const ModelConfig& model, Device device,
                                                         DType compute, int rows, uint64_t seed,
                                                         Stream& stream) {
  const int n = model.num_blocks();
  // One single-block stage per block, chained, so each block is timed on its own.
  ASSIGN_OR_RETURN(std::unique_ptr<BlockPasses> passes,
                   BlockPasses::Create(model, device, compute, rows, seed));
  constexpr int kRuns = 4;  // the first is a warm-up
  // runs[3 * b + part]: block b's forward (part 0), B (1) and W (2), one entry per run.
  std::vector<std::vector<double>> runs(3 * n);
  for (int r = 0; r < kRuns; ++r) {
    // Each part between events on the stream: the device's time.
    ASSIGN_OR_RETURN(StreamTimeline timeline, StreamTimeline::Start(stream));
    RETURN_IF_ERROR(passes->Run(stream, &timeline));
    ASSIGN_OR_RETURN(std::vector<StreamTimeline::Phase> phases, timeline.Phases());
    for (std::vector<double>& v : runs) v.push_back(0);
    for (const StreamTimeline::Phase& p : phases) runs[p.kind].back() += p.seconds;
  }
  auto median = [&](int k) {
    std::vector<double> v(runs[k].begin() + 1, runs[k].end());
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const std::vector<std::unique_ptr<Block>> blocks = BuildBlocks(model);
  std::vector<BlockTime> times(n);
  for (int b = 0; b < n; ++b) {
    times[b] = {blocks[b]->name(), median(3 * b), median(3 * b + 1), median(3 * b + 2)};
  }
  return times;
}

absl::StatusOr<std::vector<double>> MeasureBlockSeconds(const ModelConfig& model, Device device,
                                                        DType compute, int rows, uint64_t seed) {
  ASSIGN_OR_RETURN(std::vector<BlockTime> times,
                   MeasureBlockTimes(model, device, compute, rows, seed));
  std::vector<double> seconds;
  for (const BlockTime& t : times) seconds.push_back(t.total());
  return seconds;
}

absl::StatusOr<std::vector<double>> TimeBlocks(const ParallelConfig& c) {
  const TrainConfig& t = c.train;
  RETURN_IF_ERROR(t.Validate());
  ASSIGN_OR_RETURN(
      std::vector<double> seconds,
      MeasureBlockSeconds(t.model, t.device, t.dtype, t.batch / t.micro_batches, t.seed));
  // The process that timed may live on beside the workers: it keeps nothing cached.
  ASSIGN_OR_RETURN(Allocator * allocator, GetAllocator(t.device));
  allocator->EmptyCache();
  return seconds;
}

absl::StatusOr<std::string> BalancedSizes(const std::vector<double>& seconds, int world) {
  ASSIGN_OR_RETURN(StageBounds b, BalancedPartition(seconds, world));
  std::string sizes;
  for (int s = 0; s < world; ++s) absl::StrAppend(&sizes, s ? "," : "", b[s + 1] - b[s]);
  return sizes;
}

absl::StatusOr<std::string> ResolveBalance(const ParallelConfig& c, int world) {
  if (c.balance != "time" || c.strategy == StrategyKind::kData) return c.balance;
  ASSIGN_OR_RETURN(std::vector<double> seconds, TimeBlocks(c));
  return BalancedSizes(seconds, world);
}

absl::StatusOr<ProcessGrid> GridOf(const ParallelConfig& c, int world) {
  if (c.strategy == StrategyKind::kData) return ProcessGrid::Make(world, world);
  return ProcessGrid::Make(world, c.data_parallel);
}

absl::StatusOr<StageBounds> PlanStages(const ParallelConfig& c, int world,
                                       const PipelineSchedule* schedule) {
  const TrainConfig& t = c.train;
  RETURN_IF_ERROR(t.Validate());
  const int blocks = t.model.num_blocks();
  if (c.zero != 0 && c.zero != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--zero=%d: use 0 (every replica keeps the whole optimizer state) or 1 (ZeRO-1: each "
        "keeps its shard)",
        c.zero));
  }
  if (c.strategy == StrategyKind::kData) {
    if (t.batch % (world * t.micro_batches) != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--batch=%d is not divisible by %d workers x %d micro-batch%s; data parallelism "
          "gives every worker an equal share of every micro-batch: use a --batch that is a "
          "multiple of %d",
          t.batch, world, t.micro_batches, t.micro_batches == 1 ? "" : "es",
          world * t.micro_batches));
    }
    if (c.bucket_bytes < 1) {
      return absl::InvalidArgumentError("--bucket-mb must be positive");
    }
    return StageBounds{0, blocks};
  }
  ASSIGN_OR_RETURN(ProcessGrid grid, GridOf(c, world));
  const int stages = grid.stages;
  if (c.strategy == StrategyKind::kModel && t.micro_batches != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--micro-batches=%d with --strategy=model: model parallelism runs one batch at a "
        "time; use --strategy=pipeline for micro-batches",
        t.micro_batches));
  }
  if (t.batch % (grid.replicas * t.micro_batches) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--batch=%d is not divisible by %d replicas x %d micro-batch%s: each of the "
        "--data-parallel=%d replicas takes an equal share of the batch in micro-batches; use "
        "a --batch that is a multiple of %d",
        t.batch, grid.replicas, t.micro_batches, t.micro_batches == 1 ? "" : "es",
        grid.replicas, grid.replicas * t.micro_batches));
  }
  if (c.zero == 1 && grid.replicas < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--zero=1 with --strategy=%s and --data-parallel=1: ZeRO-1 shards the optimizer "
        "state over data-parallel replicas; add --data-parallel=D (D >= 2 dividing --gpus) or "
        "use --strategy=data",
        StrategyName(c.strategy)));
  }
  if (grid.replicas > 1 && c.bucket_bytes < 1) {
    return absl::InvalidArgumentError("--bucket-mb must be positive");
  }
  // The model is split into K x v global stages (v model chunks a stage when interleaved).
  const int v = c.strategy == StrategyKind::kModel ? 1 : c.virtual_stages;
  if (v < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--virtual-stages=%d: use 1, or 2 or more with --schedule=interleaved", v));
  }
  if (v > 1 && stages * v > blocks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d stages x %d virtual stages need %d model chunks of at least one block, but the "
        "model has %d blocks: use fewer stages or virtual stages",
        stages, v, stages * v, blocks));
  }
  StageBounds bounds;
  if (c.balance == "params") {
    std::vector<double> cost;
    for (const auto& b : BuildBlocks(t.model)) {
      double n = 0;
      for (const ParamSpec& p : b->Params()) n += p.shape.numel();
      cost.push_back(n);
    }
    ASSIGN_OR_RETURN(bounds, BalancedPartition(cost, stages * v));
  } else if (c.balance == "time") {
    ASSIGN_OR_RETURN(std::string sizes, ResolveBalance(c, stages * v));
    ASSIGN_OR_RETURN(bounds, ExplicitPartition(sizes, blocks, stages * v));
  } else {
    ASSIGN_OR_RETURN(bounds, ExplicitPartition(c.balance, blocks, stages * v));
  }
  if (schedule == nullptr) {
    ASSIGN_OR_RETURN(PipelineSchedule s, StrategySchedule(c, stages));
    RETURN_IF_ERROR(ValidateSchedule(s));
  }
  return bounds;
}

namespace {

// RankMemoryNeeds for a stage under schedule `s`: its chunks' model state summed (one chunk
// but under the interleaved schedule: global stages stage, stage + K, ...), and the
// activations at the schedule's moment of most: each micro-batch a chunk holds from its F to
// its B keeps that chunk's activations (under recomputation its input, plus one
// micro-batch's activations of the largest chunk during a backward), and from a B to its
// deferred W what the W reads (Block::WeightStashBytes). A B frees each block's activations
// as it builds that block's stash, about their size or less, so the moments between actions
// are the peaks; what a B holds on top (its temporaries, beside the stashes of the blocks it
// already ran) is the workspace's. The sends not yet given back count at each moment too.
MemoryNeed ScheduledStageMemory(const ParallelConfig& c, const StageBounds& bounds,
                                const PipelineSchedule& s,
                                const std::vector<std::vector<int>>& groups, int stage,
                                int64_t rows) {
  const TrainConfig& t = c.train;
  const int64_t boundary = rows * t.model.seq_len * t.model.d_model *
                           static_cast<int64_t>(DTypeSize(t.dtype));
  const std::vector<bool> deferred = DeferredWeights(s, stage);
  const bool defers = std::find(deferred.begin(), deferred.end(), true) != deferred.end();
  MemoryNeed n;
  std::vector<int64_t> held(s.chunks), stash(s.chunks);
  int64_t recomputed = 0;
  for (int chunk = 0; chunk < s.chunks; ++chunk) {
    const int g = GlobalStage(stage, chunk, s.stages);
    auto estimate = [&](int in_flight, int pending_weights) {
      return EstimateStageMemory(t.model, bounds[g], bounds[g + 1], rows, in_flight,
                                 /*recompute=*/false, t.dtype, t.optimizer.kind, t.device,
                                 pending_weights);
    };
    const MemoryNeed one = estimate(1, 0);
    n.params += one.params;
    n.grads += one.grads;
    n.optimizer += one.optimizer;
    // A B that defers its W keeps the later blocks' stashes while it runs the earlier ones.
    const int64_t workspace = defers ? estimate(1, 1).workspace : one.workspace;
    n.workspace = std::max(n.workspace, workspace);
    // What a chunk after the first keeps of its input, per micro-batch.
    const int64_t input = bounds[g] > 0 ? boundary : 0;
    held[chunk] = c.recompute ? input : one.activations;
    stash[chunk] = estimate(0, 1).activations;
    recomputed = std::max(recomputed, one.activations - input);
  }
  // The transfers' buffers held at once, as the trainer keeps them (PipelinePass): each
  // exchange group keeps its sent tensors from its issue until the stream waits on a receive
  // of it or of a later group (the communicator finishes them in order), or at the step's end;
  // a receive's tensor is there from its issue until the forward or backward that reads it.
  const std::vector<Action>& actions = s.actions[stage];
  const std::vector<int> group_of = GroupOfActions(groups, actions.size());
  std::vector<int> sends(groups.size(), 0);  // per group
  // The group of the receive each forward (false) or backward (true) of a micro-batch on a
  // chunk waits on.
  std::map<std::pair<bool, int>, int> received_in;
  int held_sends = 0, waited = 0;  // groups [0, waited) given back
  int received = 0;                 // receives issued and not yet read
  std::vector<int> now(s.chunks, 0), pending(s.chunks, 0);
  int64_t peak = 0;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int k = a.chunk * s.micro_batches + a.micro_batch;
    if (a.type == ActionType::kSendActivation || a.type == ActionType::kSendGradient) {
      ++sends[group_of[i]];
      ++held_sends;
    }
    if (a.type == ActionType::kRecvActivation || a.type == ActionType::kRecvGradient) {
      received_in[{a.type == ActionType::kRecvGradient, k}] = group_of[i];
      ++received;
    }
    if (a.type == ActionType::kForward || a.type == ActionType::kBackward) {
      const auto r = received_in.find({a.type == ActionType::kBackward, k});
      if (r != received_in.end()) --received;
      for (; r != received_in.end() && waited <= r->second; ++waited) held_sends -= sends[waited];
    }
    if (a.type == ActionType::kForward) ++now[a.chunk];
    if (a.type == ActionType::kBackward) {
      --now[a.chunk];
      if (deferred[a.chunk * s.micro_batches + a.micro_batch]) ++pending[a.chunk];
    }
    if (a.type == ActionType::kWeightGradient) --pending[a.chunk];
    int64_t bytes = (held_sends + received) * boundary;
    for (int chunk = 0; chunk < s.chunks; ++chunk) {
      bytes += now[chunk] * held[chunk] + pending[chunk] * stash[chunk];
    }
    peak = std::max(peak, bytes);
  }
  n.activations = peak + (c.recompute ? recomputed : 0);
  n.in_flight = PeakInFlight(s, stage);
  n.pending_weights = PeakPendingWeights(s, stage);
  return n;
}

}  // namespace

std::vector<double> StepHandovers(const PipelineSchedule& s,
                                  const std::vector<std::vector<StepTiming::ActionTimes>>& times) {
  const int K = s.stages;
  // Per stage, each compute action's index among its compute actions, by (type, chunk,
  // micro-batch).
  std::vector<std::map<std::tuple<ActionType, int, int>, size_t>> index(K);
  for (int st = 0; st < K; ++st) {
    for (const Action& a : s.actions[st]) {
      if (!a.is_compute()) continue;
      index[st].emplace(std::make_tuple(a.type, a.chunk, a.micro_batch), index[st].size());
    }
  }
  auto at = [&](int st, size_t i) -> const StepTiming::ActionTimes* {
    return st < static_cast<int>(times.size()) && i < times[st].size() ? &times[st][i] : nullptr;
  };
  std::vector<double> seconds;
  for (int st = 0; st < K; ++st) {
    for (const auto& [key, i] : index[st]) {
      const auto [type, chunk, mb] = key;
      const StepTiming::ActionTimes* r = at(st, i);
      if (r == nullptr || r->wait_us < 0) continue;
      // The sender: the global stage before (an activation) or after (a gradient).
      const int from = GlobalStage(st, chunk, K) + (type == ActionType::kForward ? -1 : 1);
      if (from < 0 || from >= K * s.chunks) continue;
      const StagePlace p = PlaceStage(from, K);
      const auto j = index[p.stage].find(std::make_tuple(type, p.chunk, mb));
      if (j == index[p.stage].end()) continue;
      const StepTiming::ActionTimes* sender = at(p.stage, j->second);
      if (sender == nullptr || r->wait_us > sender->end_us) continue;
      seconds.push_back(1e-6 * (r->resumed_us - sender->end_us));
    }
  }
  return seconds;
}

absl::StatusOr<std::vector<MemoryNeed>> RankMemoryNeeds(const ParallelConfig& c,
                                                        const StageBounds& bounds, int world_size,
                                                        const PipelineSchedule* schedule) {
  const TrainConfig& t = c.train;
  ASSIGN_OR_RETURN(ProcessGrid grid, GridOf(c, world_size));
  // Under ZeRO-1 a rank keeps the optimizer state of its shard, ceil(numel / D) elements.
  auto shard_optimizer = [&](MemoryNeed* n) {
    if (c.zero != 1) return;
    const int64_t numel = n->grads / 4;  // f32 gradients
    const int64_t per_element = numel > 0 ? n->optimizer / numel : 0;
    n->optimizer = (numel + grid.replicas - 1) / grid.replicas * per_element;
  };
  if (c.strategy == StrategyKind::kData) {
    // Every rank: the whole model, its share of the batch, one micro-batch after another.
    MemoryNeed n =
        EstimateStageMemory(t.model, 0, bounds.back(), t.batch / world_size / t.micro_batches,
                            /*in_flight=*/1, c.recompute, t.dtype, t.optimizer.kind, t.device);
    shard_optimizer(&n);
    return std::vector<MemoryNeed>(world_size, n);
  }
  PipelineSchedule made;
  if (schedule == nullptr) {
    ASSIGN_OR_RETURN(made, StrategySchedule(c, grid.stages));
    schedule = &made;
  }
  const PipelineSchedule& s = *schedule;
  const int64_t rows = t.batch / grid.replicas / t.micro_batches;
  // Each stage's need once: its D replicas need the same.
  const std::vector<std::vector<std::vector<int>>> groups = ExchangeGroups(s);
  std::vector<MemoryNeed> per_stage;
  for (int stage = 0; stage < grid.stages; ++stage) {
    per_stage.push_back(ScheduledStageMemory(c, bounds, s, groups[stage], stage, rows));
    shard_optimizer(&per_stage.back());
  }
  std::vector<MemoryNeed> needs;
  for (int r = 0; r < world_size; ++r) needs.push_back(per_stage[grid.StageOf(r)]);
  return needs;
}

absl::StatusOr<std::unique_ptr<DistributedTrainer>> DistributedTrainer::Create(
    const ParallelConfig& c, Communicator* comm) {
  ASSIGN_OR_RETURN(StageBounds bounds, PlanStages(c, comm->world_size()));
  if (comm->device() != c.train.device) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the communicator is on %s but training on %s", comm->device().ToString(),
        c.train.device.ToString()));
  }
  const int rank = comm->rank();
  ASSIGN_OR_RETURN(ProcessGrid grid, GridOf(c, comm->world_size()));
  ASSIGN_OR_RETURN(std::vector<MemoryNeed> needs, RankMemoryNeeds(c, bounds, comm->world_size()));
  ASSIGN_OR_RETURN(MemoryCheck memory,
                   CheckDeviceMemory(needs[rank], c.train.device,
                                     absl::StrFormat("rank %d's training step", rank)));
  ASSIGN_OR_RETURN(TokenDataset data, LoadDataset(c.train));
  std::unique_ptr<DistributedTrainer> t(new DistributedTrainer(c, comm, std::move(data)));
  t->bounds_ = bounds;
  t->memory_ = memory;
  t->grid_ = grid;
  t->replica_ = grid.ReplicaOf(rank);
  t->stage_index_ = grid.StageOf(rank);
  // The groups, split from the job's communicator in the same order on every rank: a
  // stage's replicas ranked by replica, a replica's stages by stage.
  std::vector<int> peers, stages;
  for (int d = 0; d < grid.replicas; ++d) peers.push_back(grid.RankOf(d, t->stage_index_));
  for (int k = 0; k < grid.stages; ++k) stages.push_back(grid.RankOf(t->replica_, k));
  if (grid.stages == 1) {
    t->dp_ = comm;
  } else if (grid.replicas > 1) {
    ASSIGN_OR_RETURN(t->dp_owned_,
                     comm->Split(t->stage_index_, t->replica_,
                                 absl::StrFormat("the data-parallel group of stage %d",
                                                 t->stage_index_),
                                 peers));
    t->dp_ = t->dp_owned_.get();
  }
  if (grid.replicas == 1) {
    t->pp_ = comm;
  } else if (grid.stages > 1) {
    ASSIGN_OR_RETURN(t->pp_owned_,
                     comm->Split(t->replica_, t->stage_index_,
                                 absl::StrFormat("the pipeline of replica %d", t->replica_),
                                 stages));
    t->pp_ = t->pp_owned_.get();
  }
  if (c.train.model.tie_embeddings && grid.stages > 1) {
    // The embedding group of each replica: its first and last stage, which hold the tied
    // table and its copy (Megatron's embedding group). Every rank takes part in the split;
    // a middle stage's group is itself alone, and unused.
    const bool end_stage = t->stage_index_ == 0 || t->stage_index_ == grid.stages - 1;
    std::vector<int> members = {grid.RankOf(t->replica_, 0),
                                grid.RankOf(t->replica_, grid.stages - 1)};
    if (!end_stage) members = {rank};
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> group,
                     comm->Split(end_stage ? t->replica_ : grid.replicas + rank, t->stage_index_,
                                 absl::StrFormat("the embedding group of replica %d", t->replica_),
                                 members));
    if (end_stage) t->embed_ = std::move(group);
  }
  ASSIGN_OR_RETURN(t->stage_, Stage::Create(c.train.model, t->ChunkRanges(t->stage_index_),
                                            c.train.device, c.train.seed, c.train.dtype));
  // --init-from: every rank takes its stage's parameters from the file, by name.
  if (!c.train.init_from.empty()) {
    RETURN_IF_ERROR(InitFromSafetensors(c.train.init_from, *t->stage_));
  }
  t->stage_->set_recompute(c.recompute);
  const int64_t numel = t->stage_->layout().numel();
  t->shard_begin_ = 0;
  t->shard_end_ = numel;
  if (t->zero()) {
    const std::vector<int64_t> shards = t->ShardOffsets();
    t->shard_begin_ = shards[t->replica_];
    t->shard_end_ = shards[t->replica_ + 1];
  }
  ASSIGN_OR_RETURN(t->optimizer_,
                   Optimizer::Create(c.train.optimizer, t->stage_->layout(), t->shard_begin_,
                                     t->shard_end_, c.train.device));
  ASSIGN_OR_RETURN(t->input_, InputPrefetcher::Create(c.train.device));
  ASSIGN_OR_RETURN(t->val_, LoadValidation(c.train, t->data_));
  if (t->replicated()) {
    // The tied table (or its copy), parameter 0 of both end stages, in a bucket of its own:
    // the last, held until the embedding group summed it (IssueBucketsReadyAt).
    t->buckets_ = PlanBuckets(t->stage_->layout(), t->stage_->ParamBlocks(), c.bucket_bytes,
                              t->embed_ != nullptr ? 0 : -1);
    // Every replica starts from the first replica's weights.
    ASSIGN_OR_RETURN(auto w, t->dp_->Broadcast(t->stage_->params().flat()));
    RETURN_IF_ERROR(t->Wait(*w, "the broadcast of the first replica's parameters"));
    ASSIGN_OR_RETURN(Stream * s, Stream::Compute(c.train.device));
    RETURN_IF_ERROR(t->stage_->ParamsChanged(*s));
  }
  if (c.strategy != StrategyKind::kData) {
    ASSIGN_OR_RETURN(t->schedule_, StrategySchedule(c, grid.stages));
    t->exchange_groups_ = ExchangeGroups(t->schedule_)[t->stage_index_];
    RETURN_IF_ERROR(t->ConnectNeighbours());
  }
  if (!c.train.resume.empty()) {
    return absl::InvalidArgumentError(
        "resume a distributed run with LoadCheckpoint(prefix), not TrainConfig::resume");
  }
  return t;
}

std::vector<int64_t> DistributedTrainer::ShardOffsets() const {
  return EvenParts(stage_->layout().numel(), grid_.replicas);
}

std::vector<int64_t> DistributedTrainer::BucketParts(size_t i) const {
  const Bucket& b = buckets_[i];
  std::vector<int64_t> parts;
  for (int64_t o : ShardOffsets()) parts.push_back(std::clamp(o, b.begin, b.end) - b.begin);
  return parts;
}

absl::Status DistributedTrainer::ConnectNeighbours() {
  const int rank = pp_->rank(), world = pp_->world_size();
  if (world == 1) return absl::OkStatus();
  const TrainConfig& tc = c_.train;
  const Shape activation{tc.batch / grid_.replicas / tc.micro_batches, tc.model.seq_len,
                         tc.model.d_model};
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(tc.device));
  std::vector<PeerTransfer> group;
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(activation, tc.dtype, tc.device));
  RETURN_IF_ERROR(ZeroFill(out, *s));
  // Under an interleaved schedule the last stage also sends to the first (each chunk's end
  // goes on to the next chunk), so the stages form a ring.
  std::set<int> peers;
  for (int peer : {rank - 1, rank + 1}) {
    if (schedule_.chunks > 1) peer = (peer + world) % world;
    if (peer >= 0 && peer < world) peers.insert(peer);
  }
  for (int peer : peers) {
    ASSIGN_OR_RETURN(Tensor in, Tensor::Empty(activation, tc.dtype, tc.device));
    group.push_back(PeerTransfer::Send(out, peer));
    group.push_back(PeerTransfer::Recv(in, peer));
  }
  // The transfers' tensors stay referenced by the work until it completes.
  ASSIGN_OR_RETURN(std::unique_ptr<Work> w, pp_->SendRecv(group));
  return Wait(*w, "the first exchange with the neighbouring stages");
}

absl::Status DistributedTrainer::Wait(Work& w, const char* what, absl::Duration timeout) {
  absl::Status s = w.Wait(timeout);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrFormat("%s, step %d, waiting for %s: %s", Where(),
                                                step_, what, s.message()));
}

absl::Status DistributedTrainer::WaitOn(Work& w, Stream& s, const char* what) {
  absl::Status st = w.WaitOn(s, c_.timeout);
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrFormat("%s, step %d, waiting for %s: %s", Where(),
                                                 step_, what, st.message()));
}

absl::StatusOr<MicroBatch> DistributedTrainer::LoadMicroBatch(int64_t row_begin, int64_t rows) {
  const TrainConfig& t = c_.train;
  return input_->Load(data_, order_, int64_t{step_} * t.batch, row_begin, rows, t.model.seq_len,
                      scaler_.scale() / static_cast<float>(int64_t{t.batch} * t.model.seq_len));
}

absl::Status DistributedTrainer::IssueBucket(size_t i, Pending* p) {
  const Bucket& b = buckets_[i];
  ASSIGN_OR_RETURN(Tensor g, stage_->grads().flat().View(b.begin, {b.end - b.begin}));
  std::unique_ptr<Work> w;
  // The tied table's bucket (the last) is all-reduced even under ZeRO-1: a reduce-scatter
  // sums in an order that follows the parts, which differ between the first and the last
  // stage's buffers, and from three replicas on the two copies would drift apart by rounding.
  const bool table = embed_ != nullptr && i + 1 == buckets_.size();
  if (zero() && !table) {
    ASSIGN_OR_RETURN(w, dp_->ReduceScatterParts(g, BucketParts(i)));
  } else {
    ASSIGN_OR_RETURN(w, dp_->AllReduce(g));
  }
  p->timing.comm_bytes += static_cast<int64_t>(g.bytes());
  bucket_works_.push_back(std::move(w));
  return absl::OkStatus();
}

absl::Status DistributedTrainer::IssueBucketsReadyAt(int block, Pending* p) {
  // Each bucket's reduction is issued once backward has issued its last gradient, and runs
  // after that work (the communicator orders it after the compute stream).
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].ready_block >= block) {
    // The tied table's bucket (the last) waits for ReduceEmbeddingGrads, after the pass.
    if (embed_ != nullptr && next_bucket_ + 1 == buckets_.size()) break;
    RETURN_IF_ERROR(IssueBucket(next_bucket_++, p));
  }
  return absl::OkStatus();
}

absl::Status DistributedTrainer::ReduceEmbeddingGrads(Stream& s, Pending* p) {
  if (embed_ == nullptr) return absl::OkStatus();
  // The table is parameter 0 of both stages' buffers (StageParams puts the copy first).
  const ParamEntry& table = stage_->layout().entries().front();
  ASSIGN_OR_RETURN(Tensor g, stage_->grads().flat().View(0, {table.spec.shape.numel()}));
  // Two addends: each rank's sum is the same bits. The data-parallel reduction of the
  // table's bucket, then the norm and the optimizer, wait for it on the stream.
  ASSIGN_OR_RETURN(std::unique_ptr<Work> w, embed_->AllReduce(g));
  p->timing.comm_bytes += static_cast<int64_t>(g.bytes());
  RETURN_IF_ERROR(WaitOn(*w, s, "the sum of the tied embedding's gradients"));
  return p->timeline->Mark(kExposedComm, "sum tied embedding");
}

absl::Status DistributedTrainer::WaitForBuckets(Stream& s, Pending* p) {
  while (next_bucket_ < buckets_.size()) RETURN_IF_ERROR(IssueBucket(next_bucket_++, p));
  // The optimizer's work waits on the stream for every bucket; the host does not.
  for (auto& w : bucket_works_) RETURN_IF_ERROR(WaitOn(*w, s, w->description().c_str()));
  bucket_works_.clear();
  return p->timeline->Mark(kExposedComm, "wait for gradients");
}

absl::Status DistributedTrainer::ZeroStepEnd(Stream& s, const Tensor& grad_sumsq,
                                             const Tensor& scale, Pending* p) {
  const TrainConfig& tc = c_.train;
  RETURN_IF_ERROR(
      ops::GradScale(s, scale, grad_sumsq, 1.0f / scaler_.scale(), tc.optimizer.clip_norm));
  const Tensor& params = stage_->params().flat();
  const Tensor& grads = stage_->grads().flat();
  std::vector<std::unique_ptr<Work>> gathers;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    // This rank's part of the bucket, updated with its part of the optimizer state; then the
    // bucket's parameters gathered from every part's owner, while the next part updates.
    const Bucket& b = buckets_[i];
    const std::vector<int64_t> parts = BucketParts(i);
    const int64_t lo = b.begin + parts[replica_], hi = b.begin + parts[replica_ + 1];
    if (hi > lo) {
      ASSIGN_OR_RETURN(Tensor pv, params.View(lo, {hi - lo}));
      ASSIGN_OR_RETURN(Tensor gv, grads.View(lo, {hi - lo}));
      // The 16-bit copy is refreshed whole once every part is gathered.
      RETURN_IF_ERROR(optimizer_.Step(s, pv, gv, step_, /*grad_scale=*/1.0f, Tensor(), scale,
                                      lo - shard_begin_));
    }
    ASSIGN_OR_RETURN(Tensor bucket, params.View(b.begin, {b.end - b.begin}));
    ASSIGN_OR_RETURN(std::unique_ptr<Work> w, dp_->AllGatherParts(bucket, parts));
    p->timing.comm_bytes += static_cast<int64_t>(bucket.bytes());
    gathers.push_back(std::move(w));
  }
  RETURN_IF_ERROR(stage_->ZeroGrads(s));
  RETURN_IF_ERROR(p->timeline->Mark(kOptimizer, "optimizer"));
  // The next step's forward (and the 16-bit copy) wait on the stream for every parameter.
  for (auto& w : gathers) RETURN_IF_ERROR(WaitOn(*w, s, w->description().c_str()));
  RETURN_IF_ERROR(p->timeline->Mark(kExposedComm, "gather parameters"));
  return stage_->ParamsChanged(s);
}

std::string DistributedTrainer::Where() const {
  const int rank = comm_->rank();
  if (grid_.replicas == 1 || grid_.stages == 1) return absl::StrCat("rank ", rank);
  return absl::StrCat("rank ", rank, " ", grid_.Place(rank));
}

std::vector<Communicator*> DistributedTrainer::Comms() const {
  std::vector<Communicator*> comms = {comm_};
  for (const auto& c : {dp_owned_.get(), pp_owned_.get(), embed_.get()}) {
    if (c != nullptr) comms.push_back(c);
  }
  return comms;
}

absl::Status DistributedTrainer::DataParallelPass(Stream& s, Tensor* loss_sum, Pending* p) {
  const TrainConfig& tc = c_.train;
  StreamTimeline& timeline = *p->timeline;
  const int64_t share = tc.batch / grid_.replicas;
  const int64_t rows = share / tc.micro_batches;
  ASSIGN_OR_RETURN(Tensor scratch, Tensor::Empty({1}, DType::kF32, tc.device));
  auto load = [&](int m) { return LoadMicroBatch(replica_ * share + m * rows, rows); };
  ASSIGN_OR_RETURN(MicroBatch next_mb, load(0));
  for (int m = 0; m < tc.micro_batches; ++m) {
    MicroBatch mb = std::move(next_mb);
    // The next micro-batch's copy runs while this one computes.
    if (m + 1 < tc.micro_batches) {
      ASSIGN_OR_RETURN(next_mb, load(m + 1));
    }
    const bool last = m == tc.micro_batches - 1;
    RETURN_IF_ERROR(InputPrefetcher::WaitFor(s, mb));
    RETURN_IF_ERROR(timeline.Mark(kInput, absl::StrCat("input ", m), m));
    Tensor losses, dx;
    RETURN_IF_ERROR(stage_->Forward(s, m, mb, Tensor(), &losses));
    RETURN_IF_ERROR(AccumulateLoss(s, *loss_sum, losses, scratch));
    RETURN_IF_ERROR(timeline.Mark(kCompute, absl::StrCat("forward ", m), m));
    // Gradient accumulation communicates only after the last micro-batch's gradients.
    auto block_done = [&](int block) -> absl::Status {
      if (!last || !c_.overlap || !replicated()) return absl::OkStatus();
      return IssueBucketsReadyAt(block, p);
    };
    RETURN_IF_ERROR(stage_->Backward(s, m, mb, Tensor(), &dx, block_done));
    RETURN_IF_ERROR(timeline.Mark(kCompute, absl::StrCat("backward ", m), m));
  }
  if (!replicated()) return absl::OkStatus();
  return WaitForBuckets(s, p);
}

absl::Status DistributedTrainer::PipelinePass(Stream& s, Tensor* loss_sum, Pending* p) {
  const TrainConfig& tc = c_.train;
  StepTiming* t = &p->timing;
  StreamTimeline& timeline = *p->timeline;
  const int rank = pp_->rank();  // this replica's stage
  const int M = tc.micro_batches;
  // This replica's share of the batch, in M micro-batches.
  const int64_t share = tc.batch / grid_.replicas;
  const int64_t rows = share / M, T = tc.model.seq_len, C = tc.model.d_model;
  const std::vector<Action>& actions = schedule_.actions[rank];
  const int K = schedule_.stages, V = schedule_.chunks;
  // Micro-batch m on chunk c: the key of its tensors and transfers.
  auto key = [M](const Action& a) { return a.chunk * M + a.micro_batch; };
  // The micro-batches whose backward this stage splits: a B with a W for the same
  // micro-batch and chunk computes the input gradient (and the LayerNorms' and the head's
  // parameter gradients), and the W adds the other linear layers' weight gradients.
  const std::vector<bool> split = DeferredWeights(schedule_, rank);
  // Each chunk's last action writing parameter gradients (a whole backward or a W: under
  // GPipe and 1F1B the last micro-batch's backward, under ZB-H1 the stage's last W)
  // completes them: the data-parallel buckets of its blocks go out during it. And the last
  // action reading each micro-batch's tokens, after which they go.
  std::vector<size_t> last_gradient_of(V, 0), last_use(M, 0);
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.type == ActionType::kWeightGradient ||
        (a.type == ActionType::kBackward && !split[key(a)])) {
      last_gradient_of[a.chunk] = i;
    }
    if (a.is_compute()) last_use[a.micro_batch] = i;
  }
  auto buckets_from = [&](size_t i) {
    std::function<absl::Status(int)> block_done;
    const bool last = std::find(last_gradient_of.begin(), last_gradient_of.end(), i) !=
                      last_gradient_of.end();
    if (last && c_.overlap && replicated()) {
      block_done = [this, p](int block) { return IssueBucketsReadyAt(block, p); };
    }
    return block_done;
  };
  std::map<int, Tensor> outputs, input_grads, act_in, grad_in;
  // The step's exchange groups in issue order; a receive's, by its key, as an index into it.
  std::vector<std::unique_ptr<Work>> all;
  std::map<int, size_t> act_ready, grad_ready;
  std::map<int, MicroBatch> batches;
  Tensor scratch;  // the last stage sums its losses here
  if (stage_->is_last()) {
    ASSIGN_OR_RETURN(scratch, Tensor::Empty({1}, DType::kF32, tc.device));
  }
  // Micro-batch m's tokens and targets, their copy queued on first use.
  auto batch = [&](int m) -> absl::StatusOr<MicroBatch*> {
    auto it = batches.find(m);
    if (it == batches.end()) {
      ASSIGN_OR_RETURN(MicroBatch mb, LoadMicroBatch(replica_ * share + m * rows, rows));
      it = batches.emplace(m, std::move(mb)).first;
    }
    return &it->second;
  };
  // The next compute action's micro-batch after action i, loaded ahead of it.
  auto prefetch_after = [&](size_t i) -> absl::Status {
    for (size_t j = i + 1; j < actions.size(); ++j) {
      if (actions[j].type == ActionType::kForward || actions[j].type == ActionType::kBackward) {
        return batch(actions[j].micro_batch).status();
      }
    }
    return absl::OkStatus();
  };
  // all[0, waited) are groups the stream waited on: their tensors went back to the allocator.
  size_t waited = 0;
  // The stream waits for micro-batch m's receive, a phase of bubble of its own. The
  // communicator runs its operations in issue order, so every group issued before that
  // receive's has finished too: the stream waits on them as well (at no cost), which lets the
  // groups of sends alone, that nothing else waits on, give their tensors back now rather
  // than at the step's end (a middle stage of 4 kept every one of its 2M sends).
  auto wait_for = [&](std::map<int, size_t>& ready, const Action& a,
                      const char* what) -> absl::Status {
    auto it = ready.find(key(a));
    if (it == ready.end()) return absl::OkStatus();
    for (; waited <= it->second; ++waited) {
      const bool own = waited == it->second;
      RETURN_IF_ERROR(
          WaitOn(*all[waited], s, own ? what : all[waited]->description().c_str()));
    }
    ready.erase(it);
    return timeline.Mark(kBubble, absl::StrCat("wait ", a.micro_batch), a.micro_batch);
  };
  // The neighbours, around the ring under an interleaved schedule (a chunk's end goes on to
  // the next chunk's start, from the last stage to the first).
  const int next = (rank + 1) % K, prev = (rank + K - 1) % K;
  // One of this stage's exchange groups (ExchangeGroups: both neighbours group the same
  // transfers alike) as one SendRecv; its receives become ready together.
  auto issue_group = [&](const std::vector<int>& indices) -> absl::Status {
    std::vector<PeerTransfer> group;
    std::vector<std::pair<std::map<int, size_t>*, int>> receives;
    for (int k : indices) {
      const int m = key(actions[k]);
      switch (actions[k].type) {
        case ActionType::kSendActivation:
          group.push_back(PeerTransfer::Send(outputs[m], next));
          outputs.erase(m);
          break;
        case ActionType::kSendGradient:
          group.push_back(PeerTransfer::Send(input_grads[m], prev));
          input_grads.erase(m);
          break;
        case ActionType::kRecvActivation: {
          ASSIGN_OR_RETURN(act_in[m], Tensor::Empty({rows, T, C}, tc.dtype, tc.device));
          group.push_back(PeerTransfer::Recv(act_in[m], prev));
          receives.push_back({&act_ready, m});
          break;
        }
        default: {  // kRecvGradient
          ASSIGN_OR_RETURN(grad_in[m], Tensor::Empty({rows, T, C}, tc.dtype, tc.device));
          group.push_back(PeerTransfer::Recv(grad_in[m], next));
          receives.push_back({&grad_ready, m});
          break;
        }
      }
      t->comm_bytes += static_cast<int64_t>(group.back().tensor.bytes());
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Work> w, pp_->SendRecv(group));
    for (auto& [ready, m] : receives) (*ready)[m] = all.size();
    all.push_back(std::move(w));
    return absl::OkStatus();
  };
  size_t next_group = 0;
  for (size_t i = 0; i < actions.size();) {
    const Action& a = actions[i];
    if (a.is_communication()) {
      // Every group of this run of transfers, then on to the next compute action.
      while (i < actions.size() && actions[i].is_communication()) ++i;
      while (next_group < exchange_groups_.size() &&
             exchange_groups_[next_group].front() < static_cast<int>(i)) {
        RETURN_IF_ERROR(issue_group(exchange_groups_[next_group++]));
      }
      continue;
    }
    const int m = a.micro_batch, c = a.chunk, k = key(a);
    // "forward 3", and with several chunks "forward 3 chunk 1".
    const std::string on = V == 1 ? absl::StrCat(m) : absl::StrCat(m, " chunk ", c);
    if (a.type == ActionType::kForward) {
      RETURN_IF_ERROR(wait_for(act_ready, a, "an activation from the previous stage"));
      ASSIGN_OR_RETURN(MicroBatch * mb, batch(m));
      RETURN_IF_ERROR(prefetch_after(i));
      RETURN_IF_ERROR(InputPrefetcher::WaitFor(s, *mb));
      RETURN_IF_ERROR(timeline.Mark(kInput, absl::StrCat("input ", on), m));
      Tensor y;
      RETURN_IF_ERROR(stage_->Forward(s, m, *mb, act_in[k], &y, c));
      act_in.erase(k);
      if (stage_->chunk_is_last(c)) {
        RETURN_IF_ERROR(AccumulateLoss(s, *loss_sum, y, scratch));
      } else {
        outputs[k] = y;
      }
      RETURN_IF_ERROR(timeline.Mark(kCompute, absl::StrCat("forward ", on), m));
      p->computed.push_back(a);
    } else if (a.type == ActionType::kBackward) {
      RETURN_IF_ERROR(wait_for(grad_ready, a, "a gradient from the next stage"));
      ASSIGN_OR_RETURN(MicroBatch * mb, batch(m));
      RETURN_IF_ERROR(prefetch_after(i));
      Tensor dx;
      if (split[k]) {
        // The input gradient (and the LayerNorms' and head's gradients); what the W reads
        // stays with the stage (and the micro-batch's tokens here) until it runs.
        RETURN_IF_ERROR(stage_->BackwardInput(s, m, *mb, grad_in[k], &dx, c));
      } else {
        RETURN_IF_ERROR(stage_->Backward(s, m, *mb, grad_in[k], &dx, buckets_from(i), c));
      }
      grad_in.erase(k);
      if (!stage_->chunk_is_first(c)) input_grads[k] = dx;
      RETURN_IF_ERROR(timeline.Mark(kCompute, absl::StrCat("backward ", on), m));
      p->computed.push_back(a);
    } else if (a.type == ActionType::kWeightGradient) {
      ASSIGN_OR_RETURN(MicroBatch * mb, batch(m));
      RETURN_IF_ERROR(stage_->BackwardWeights(s, m, *mb, buckets_from(i), c));
      RETURN_IF_ERROR(timeline.Mark(kCompute, absl::StrCat("backward weights ", on), m));
      p->computed.push_back(a);
    }
    if (a.is_compute() && i == last_use[m]) batches.erase(m);
    ++i;  // the optimizer step is the caller's
  }
  // Every transfer finished before the step's end on the stream: waiting for a neighbour's
  // last gradient or for the sends to be taken is the pipeline's bubble too.
  for (; waited < all.size(); ++waited) {
    RETURN_IF_ERROR(WaitOn(*all[waited], s, all[waited]->description().c_str()));
  }
  RETURN_IF_ERROR(timeline.Mark(kBubble, "wait for transfers"));
  // After every send: the last stage's stream must not wait for the first stage's backward
  // before the gradients that backward needs went out.
  RETURN_IF_ERROR(ReduceEmbeddingGrads(s, p));
  if (!replicated()) return absl::OkStatus();
  return WaitForBuckets(s, p);
}

absl::Status DistributedTrainer::Issue(const std::function<bool()>& stop_requested) {
  const int64_t syncs_before = HostSync::Count();
  const TrainConfig& tc = c_.train;
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(tc.device));
  Pending p;
  p.report.step = step_;
  p.report.lr = LearningRate(tc.optimizer, step_);
  for (Communicator* c : Comms()) p.first_sequences.push_back(c->last_issued_sequence());
  bucket_works_.clear();
  next_bucket_ = 0;
  ASSIGN_OR_RETURN(StreamTimeline timeline, StreamTimeline::Start(*s));
  p.timeline = std::make_unique<StreamTimeline>(std::move(timeline));
  stage_->ResetPeakInFlight();
  // [0]: this rank's summed token losses, [1]: its share of the squared gradient norm,
  // [2]: 1 if this rank asks to stop after this step (summed: any rank's wish counts),
  // [3]: the gradients' factor (unscaling and clipping), computed on the device.
  ASSIGN_OR_RETURN(Tensor buffer, Tensor::Empty({4}, DType::kF32, tc.device));
  RETURN_IF_ERROR(ZeroFill(buffer, *s));
  ASSIGN_OR_RETURN(p.reduced, buffer.View(0, {3}));
  ASSIGN_OR_RETURN(Tensor loss_sum, buffer.View(0, {1}));
  ASSIGN_OR_RETURN(Tensor sumsq, buffer.View(1, {1}));
  ASSIGN_OR_RETURN(Tensor scale, buffer.View(3, {1}));
  if (c_.strategy == StrategyKind::kData) {
    RETURN_IF_ERROR(DataParallelPass(*s, &loss_sum, &p));
  } else {
    RETURN_IF_ERROR(PipelinePass(*s, &loss_sum, &p));
  }
  // The norm counts the tied table once: the first stage's, not the last stage's copy (the
  // first elements of its buffer).
  const int64_t copy = stage_->embedding_copy_numel();
  if (zero()) {
    // Each rank holds the reduced gradients of its shard only; the shards' sums of squares
    // add up to the stage's.
    const int64_t begin = std::max(shard_begin_, copy);
    if (shard_end_ > begin) {
      ASSIGN_OR_RETURN(Tensor owned,
                       stage_->grads().flat().View(begin, {shard_end_ - begin}));
      RETURN_IF_ERROR(ops::SumSquaresAccumulate(*s, sumsq, owned));
    }
  } else {
    const Tensor& grads = stage_->grads().flat();
    ASSIGN_OR_RETURN(Tensor counted, grads.View(copy, {grads.numel() - copy}));
    RETURN_IF_ERROR(ops::SumSquaresAccumulate(*s, sumsq, counted));
    if (replicated()) {
      // The stage's gradients are the same on each of its D ranks after the all-reduce, and
      // so is their norm; reducing it too would only add rounding. Each takes a 1/D share.
      RETURN_IF_ERROR(ops::Scale(*s, sumsq, 1.0f / grid_.replicas));
    }
  }
  if (stop_requested && stop_requested()) {
    ASSIGN_OR_RETURN(Tensor flag, buffer.View(2, {1}));
    RETURN_IF_ERROR(ops::Fill(*s, flag, 1.0f));
  }
  RETURN_IF_ERROR(p.timeline->Mark(kOptimizer, "gradient norm"));
  {
    ASSIGN_OR_RETURN(auto w, comm_->AllReduce(p.reduced));
    RETURN_IF_ERROR(WaitOn(*w, *s, "the reduction of the step's loss and gradient norm"));
  }
  // On a pipeline, this is where the stages that finished first wait for the last one (its
  // three numbers take microseconds): the bubble's end, as a schedule's makespan counts it.
  RETURN_IF_ERROR(p.timeline->Mark(grid_.stages > 1 ? kBubble : kExposedComm, "reduce loss"));
  if (zero()) {
    RETURN_IF_ERROR(ZeroStepEnd(*s, sumsq, scale, &p));
  } else {
    RETURN_IF_ERROR(
        IssueStepEnd(*s, tc, *stage_, optimizer_, scaler_.scale(), step_, sumsq, scale));
  }
  // The values the host reads, in memory it reads without another copy.
  ASSIGN_OR_RETURN(p.host, Tensor::Empty({3}, DType::kF32, Device::Cpu(), HostMemoryKind::kPinned));
  RETURN_IF_ERROR(Copy(p.host, p.reduced, *s));
  RETURN_IF_ERROR(p.timeline->Mark(kOptimizer, "optimizer"));
  for (Communicator* c : Comms()) p.last_sequences.push_back(c->last_issued_sequence());
  p.timing.last_sequence = comm_->last_issued_sequence();
  p.timing.peak_in_flight = stage_->peak_in_flight();
  p.timing.host_syncs = HostSync::Count() - syncs_before;
  pending_.push_back(std::move(p));
  ++step_;
  // f16's loss scale for the next step depends on this step's verdict.
  if (scaler_.enabled()) RETURN_IF_ERROR(ReadPending());
  return absl::OkStatus();
}

absl::StatusOr<float> DistributedTrainer::Evaluate() {
  if (!val_) return absl::FailedPreconditionError("no validation data to evaluate on");
  const TrainConfig& tc = c_.train;
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(tc.device));
  ASSIGN_OR_RETURN(Tensor loss_sum, Tensor::Empty({1}, DType::kF32, tc.device));
  ASSIGN_OR_RETURN(Tensor scratch, Tensor::Empty({1}, DType::kF32, tc.device));
  RETURN_IF_ERROR(ZeroFill(loss_sum, *s));
  // The training's micro-batch size, whose activations were checked to fit.
  const int64_t share = tc.batch / grid_.replicas;
  const int64_t rows = share / tc.micro_batches, T = tc.model.seq_len, C = tc.model.d_model;
  const int rank = grid_.stages > 1 ? pp_->rank() : 0;
  // Sends in flight, each holding its activation: at most a step's micro-batches (GPipe's
  // most), so a validation holds no more than the training.
  std::deque<std::unique_ptr<Work>> sends;
  RETURN_IF_ERROR(ForEachValidationMicroBatch(
      tc, *val_, *input_, replica_ * share, share, rows,
      [&](const MicroBatch& mb) -> absl::Status {
        // Each of the stage's chunks in turn (interleaved: around the ring of stages).
        const int K = grid_.stages, chunks = stage_->num_chunks();
        for (int c = 0; c < chunks; ++c) {
          Tensor x;
          if (!stage_->chunk_is_first(c)) {
            ASSIGN_OR_RETURN(x, Tensor::Empty({rows, T, C}, tc.dtype, tc.device));
            ASSIGN_OR_RETURN(std::unique_ptr<Work> w, pp_->Recv(x, (rank + K - 1) % K));
            RETURN_IF_ERROR(
                WaitOn(*w, *s, "an activation from the previous stage (validation)"));
          }
          RETURN_IF_ERROR(InputPrefetcher::WaitFor(*s, mb));
          Tensor y;
          RETURN_IF_ERROR(stage_->Evaluate(*s, mb, x, &y, c));
          if (stage_->chunk_is_last(c)) {
            RETURN_IF_ERROR(AccumulateLoss(*s, loss_sum, y, scratch));
            continue;
          }
          ASSIGN_OR_RETURN(std::unique_ptr<Work> w, pp_->Send(y, (rank + 1) % K));
          sends.push_back(std::move(w));
          if (static_cast<int>(sends.size()) <= tc.micro_batches * chunks) continue;
          RETURN_IF_ERROR(WaitOn(*sends.front(), *s, "an activation's send (validation)"));
          sends.pop_front();
        }
        return absl::OkStatus();
      }));
  for (auto& w : sends) {
    RETURN_IF_ERROR(WaitOn(*w, *s, "an activation's send to the next stage (validation)"));
  }
  // Only last stages hold losses (the others add 0): one sum over the job reaches every rank.
  ASSIGN_OR_RETURN(std::unique_ptr<Work> w, comm_->AllReduce(loss_sum));
  RETURN_IF_ERROR(WaitOn(*w, *s, "the reduction of the validation loss"));
  std::vector<float> v;
  {
    ExpectedHostSync reading;
    absl::StatusOr<std::vector<float>> read = loss_sum.ToFloatVector();
    if (!read.ok()) {
      return absl::Status(read.status().code(),
                          absl::StrFormat("%s, validation after step %d: %s", Where(), step_,
                                          read.status().message()));
    }
    v = *read;
  }
  return ValidationLoss(tc, *val_, v[0]);
}

absl::Status DistributedTrainer::ReadPending() {
  if (pending_.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(c_.train.device));
  const int64_t syncs_before = HostSync::Count();
  {
    // The one host synchronization: every pending step's values, and its events, are final.
    ExpectedHostSync reading;
    absl::Status st = s->Synchronize();
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrFormat("%s, steps %d-%d: %s", Where(),
                                                     pending_.front().report.step + 1,
                                                     pending_.back().report.step + 1,
                                                     st.message()));
    }
  }
  pending_.back().timing.host_syncs += HostSync::Count() - syncs_before;
  for (Pending& p : pending_) {
    const float* v = p.host.data<float>();
    CompletedStep done;
    done.report = ReportStep(c_.train, scaler_, p.report.step, v[0], v[1]);
    done.timing = p.timing;
    if (v[2] > 0.5f) stop_agreed_ = true;
    ASSIGN_OR_RETURN(std::vector<StreamTimeline::Phase> phases, p.timeline->Phases());
    size_t computed = 0;
    double input = 0;  // the input wait before the next compute action
    StepTiming::ActionTimes times;  // the next compute action's
    for (const StreamTimeline::Phase& phase : phases) {
      AddPhase(phase, &done.timing);
      if (phase.kind == kInput) input += phase.seconds;
      if (phase.kind == kBubble && phase.micro_batch >= 0) {  // its receive's wait
        times.wait_us = phase.start_us;
        times.resumed_us = phase.start_us + phase.seconds * 1e6;
      }
      if (phase.kind == kCompute && computed < p.computed.size()) {
        done.timing.action_seconds.push_back({p.computed[computed++], input + phase.seconds});
        times.end_us = phase.start_us + phase.seconds * 1e6;
        done.timing.action_times.push_back(times);
        input = 0;
        times = {};
      }
      if (Profiler::enabled()) {
        TraceEvent e;
        e.name = phase.name;
        e.category = TraceCategory(phase.kind);
        e.start_us = phase.start_us;
        e.duration_us = phase.seconds * 1e6;
        e.micro_batch = phase.micro_batch;
        Profiler::RecordEvent(std::move(e));
      }
    }
    // The stream's time from where the step's work began to its end.
    ASSIGN_OR_RETURN(float ms, p.timeline->end().ElapsedMsSince(p.timeline->start()));
    done.report.seconds = ms * 1e-3;
    const std::vector<Communicator*> comms = Comms();
    for (size_t i = 0; i < comms.size(); ++i) {
      done.timing.comm_seconds += comms[i]->busy_seconds_through(p.last_sequences[i]) -
                                  comms[i]->busy_seconds_through(p.first_sequences[i]);
    }
    read_.push_back(std::move(done));
  }
  pending_.clear();
  Profiler::Collect();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CompletedStep>> DistributedTrainer::Read() {
  RETURN_IF_ERROR(ReadPending());
  std::vector<CompletedStep> out;
  out.swap(read_);
  return out;
}

absl::StatusOr<StepReport> DistributedTrainer::Step(StepTiming* timing,
                                                    const std::function<bool()>& stop_requested) {
  RETURN_IF_ERROR(Issue(stop_requested));
  ASSIGN_OR_RETURN(std::vector<CompletedStep> done, Read());
  if (done.empty()) return absl::InternalError("a step issued but not read");
  if (timing != nullptr) *timing = done.back().timing;
  return done.back().report;
}

std::pair<int, int> DistributedTrainer::BlockRange(int stage) const {
  const std::vector<std::pair<int, int>> chunks = ChunkRanges(stage);
  return {chunks.front().first, chunks.back().second};
}

std::vector<std::pair<int, int>> DistributedTrainer::ChunkRanges(int stage) const {
  // bounds_ splits the model into K x v global stages; global stage g runs on stage g mod K.
  const int K = c_.strategy == StrategyKind::kData ? 1 : grid_.stages;
  std::vector<std::pair<int, int>> chunks;
  for (int g = stage; g + 1 < static_cast<int>(bounds_.size()); g += K) {
    chunks.push_back({bounds_[g], bounds_[g + 1]});
  }
  return chunks;
}

std::string DistributedTrainer::ShardName(const std::string& prefix, int stage) const {
  if (grid_.stages == 1) return prefix + ".ckpt";
  return absl::StrFormat("%s.stage-%d.ckpt", prefix, stage);
}

absl::StatusOr<std::vector<Tensor>> DistributedTrainer::GatherOptimizerState() {
  std::vector<Tensor> state = {optimizer_.state0()};
  if (optimizer_.state1().defined()) state.push_back(optimizer_.state1());
  if (!zero()) return state;
  // Each shard into its place in a whole-stage tensor, then every shard from its owner.
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(c_.train.device));
  const std::vector<int64_t> shards = ShardOffsets();
  std::vector<std::unique_ptr<Work>> works;
  for (Tensor& t : state) {
    ASSIGN_OR_RETURN(Tensor whole, Tensor::Empty({stage_->layout().numel()}, DType::kF32,
                                                 c_.train.device));
    if (shard_end_ > shard_begin_) {
      ASSIGN_OR_RETURN(Tensor mine, whole.View(shard_begin_, {shard_end_ - shard_begin_}));
      RETURN_IF_ERROR(Copy(mine, t, *s));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Work> w, dp_->AllGatherParts(whole, shards));
    works.push_back(std::move(w));
    t = whole;
  }
  for (auto& w : works) {
    RETURN_IF_ERROR(Wait(*w, "the optimizer state's shards", kCheckpointWriteTimeout));
  }
  return state;
}

absl::Status DistributedTrainer::SaveCheckpoint(const std::string& dir) {
  if (!pending_.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint at step %d with %d steps not read: Read() them first (their losses decide "
        "whether the weights are worth keeping)",
        step_, pending_.size()));
  }
  // Reading the weights and waiting for the other ranks' shards: the synchronizations a
  // checkpoint must make.
  ExpectedHostSync checkpoint;
  const int rank = comm_->rank(), world = comm_->world_size();
  // One file per stage, written by its first replica: the replicas' weights are the same.
  // A checkpoint holds the whole optimizer state whatever the sharding (ZeRO-1 gathers it).
  const bool writes = replica_ == 0;
  const std::string prefix = CheckpointPrefixFor(dir, step_);
  const std::string path = ShardName(prefix, stage_index_);
  absl::Status saved = absl::OkStatus();
  CheckpointFileInfo info;
  absl::StatusOr<std::vector<Tensor>> state = GatherOptimizerState();
  if (!state.ok()) saved = state.status();
  if (writes && saved.ok()) {
    const std::map<std::string, std::string> extra = {
        {"strategy", StrategyName(c_.strategy)},
        {"world_size", absl::StrCat(world)},
        {"data_parallel", absl::StrCat(grid_.replicas)},
        {"zero", absl::StrCat(c_.zero)},
        {"rank", absl::StrCat(rank)},
        {"stage", absl::StrCat(stage_index_)}};
    saved = SaveTrainingState(path, c_.train, *stage_, *state, scaler_, step_, extra, &info);
  }
  // Every rank's outcome, size and checksum: {state (1 written, 0 none, -1 failed),
  // bytes low, bytes high, checksum low, checksum high} as 32-bit integers.
  constexpr int kFields = 5;
  const uint64_t bytes = static_cast<uint64_t>(info.bytes);
  const std::vector<int32_t> mine = {
      !saved.ok() ? -1 : (writes ? 1 : 0), static_cast<int32_t>(bytes & 0xffffffffu),
      static_cast<int32_t>(bytes >> 32), static_cast<int32_t>(info.checksum & 0xffffffffu),
      static_cast<int32_t>(info.checksum >> 32)};
  ASSIGN_OR_RETURN(Tensor in, Tensor::FromInts(mine, {kFields}, c_.train.device));
  ASSIGN_OR_RETURN(Tensor all, Tensor::Empty({int64_t{kFields} * world}, DType::kI32,
                                             c_.train.device));
  {
    // Ranks that write nothing wait here while the others write: as long as writing takes
    // (a large model on a network file system can take minutes), not one collective's timeout.
    ASSIGN_OR_RETURN(auto w, comm_->AllGather(all, in));
    RETURN_IF_ERROR(
        Wait(*w, "every rank's checkpoint shard", std::max(c_.timeout, kCheckpointWriteTimeout)));
  }
  if (!saved.ok()) return saved;
  ASSIGN_OR_RETURN(std::vector<int32_t> v, all.ToIntVector());
  for (int r = 0; r < world; ++r) {
    if (v[r * kFields] < 0) {
      return absl::InternalError(absl::StrFormat(
          "step %d: rank %d could not write its checkpoint shard (see its log); no manifest "
          "written",
          step_, r));
    }
  }
  absl::Status manifest = absl::OkStatus();
  if (rank == 0) {
    Manifest m;
    for (int r = 0; r < world; ++r) {
      const int32_t* f = v.data() + r * kFields;
      if (f[0] == 0) continue;
      ShardRecord s;
      s.file = ShardName(CheckpointName(step_), grid_.StageOf(r));
      std::tie(s.block_begin, s.block_end) = BlockRange(grid_.StageOf(r));
      s.bytes = static_cast<int64_t>(static_cast<uint32_t>(f[1]) |
                                     (static_cast<uint64_t>(static_cast<uint32_t>(f[2])) << 32));
      s.checksum = static_cast<uint32_t>(f[3]) |
                   (static_cast<uint64_t>(static_cast<uint32_t>(f[4])) << 32);
      m.shards.push_back(s);
    }
    m.step = step_;
    m.strategy = StrategyName(c_.strategy);
    m.world_size = world;
    m.model = c_.train.model.ToString();
    m.optimizer = c_.train.optimizer.kind;
    m.batch = c_.train.batch;
    m.seed = c_.train.seed;
    manifest = WriteManifest(prefix, m);
  }
  // Nobody goes on (or exits, when preempted) before the manifest is written.
  ASSIGN_OR_RETURN(auto w, comm_->Barrier());
  RETURN_IF_ERROR(Wait(*w, "the checkpoint's manifest"));
  return manifest;
}

absl::Status DistributedTrainer::LoadCheckpoint(const std::string& prefix) {
  if (!pending_.empty()) {
    return absl::FailedPreconditionError("checkpoint loaded with steps not read: Read() first");
  }
  // Under ZeRO-1 this rank takes its shard of the (whole) optimizer state.
  return LoadShardedTrainingState(prefix, c_.train, *stage_, &optimizer_, &scaler_, &step_,
                                  StateRange{shard_begin_, shard_end_});
}

}  // namespace tandem
