#include "parallel/layout.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/block.h"
#include "model/stage.h"
#include "parallel/buckets.h"
#include "parallel/stage_replay.h"
#include "runtime/format.h"
#include "runtime/status.h"

namespace tandem {
namespace {

// The schedule a pipeline of `stages` follows; model parallelism is GPipe over its one
// micro-batch.
absl::StatusOr<PipelineSchedule> StrategySchedule(const ParallelConfig& c, int stages) {
  const std::string schedule = c.strategy == StrategyKind::kModel ? "gpipe" : c.schedule;
  return MakeSchedule(schedule, stages, c.train.micro_batches,
                      c.strategy == StrategyKind::kModel ? 1 : c.virtual_stages);
}

// Data parallelism: every worker an equal share of every micro-batch.
absl::Status CheckDataParallel(const ParallelConfig& c, int world) {
  const TrainConfig& t = c.train;
  if (t.batch % (world * t.micro_batches) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--batch=%d is not divisible by %d workers x %d micro-batch%s; data parallelism "
        "gives every worker an equal share of every micro-batch: use a --batch that is a "
        "multiple of %d",
        t.batch, world, t.micro_batches, t.micro_batches == 1 ? "" : "es",
        world * t.micro_batches));
  }
  if (c.bucket_bytes < 1) return absl::InvalidArgumentError("--bucket-mb must be positive");
  return absl::OkStatus();
}

// A pipeline (or model parallelism) of D replicas on `grid`.
absl::Status CheckPipeline(const ParallelConfig& c, const ProcessGrid& grid) {
  const TrainConfig& t = c.train;
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
  if (grid.stages == 1 && grid.replicas > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--strategy=%s with --data-parallel=%d on %d workers leaves one stage: every replica "
        "would hold the whole model; use --strategy=data, or --data-parallel=D with D < %d",
        StrategyName(c.strategy), grid.replicas, grid.ranks(), grid.ranks()));
  }
  if (c.zero >= 1 && grid.replicas < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--zero=%d with --strategy=%s and --data-parallel=1: ZeRO-%d shards the %s over "
        "data-parallel replicas; add --data-parallel=D (D >= 2 dividing --gpus) or use "
        "--strategy=data",
        c.zero, StrategyName(c.strategy), c.zero,
        c.zero == 1 ? "optimizer state" : "optimizer state and the gradients"));
  }
  if (grid.replicas > 1 && c.bucket_bytes < 1) {
    return absl::InvalidArgumentError("--bucket-mb must be positive");
  }
  const int v = c.strategy == StrategyKind::kModel ? 1 : c.virtual_stages;
  if (v < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--virtual-stages=%d: use 1, or 2 or more with --schedule=interleaved", v));
  }
  const int blocks = t.model.num_blocks();
  if (v > 1 && grid.stages * v > blocks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d stages x %d virtual stages need %d model chunks of at least one block, but the "
        "model has %d blocks: use fewer stages or virtual stages",
        grid.stages, v, grid.stages * v, blocks));
  }
  return absl::OkStatus();
}

// This rank's tensor parallelism for shapes alone (the memory estimate, the description): the
// parts' sizes, the same on every tensor rank; no group.
TensorParallel ShapeOnly(const ParallelConfig& c) {
  TensorParallel tp;
  tp.size = c.tensor_parallel;
  tp.sequence = c.sequence_parallel;
  return tp;
}

// The model split into `stages` global stages (K x v) as --balance says.
absl::StatusOr<StageBounds> SplitStages(const ParallelConfig& c, int stages,
                                        const LayoutInputs& in) {
  const ModelConfig& model = c.train.model;
  if (c.balance == "params") {
    std::vector<double> cost;
    for (const auto& b : BuildBlocks(model)) {
      double n = 0;
      for (const ParamSpec& p : b->Params()) n += p.shape.numel();
      cost.push_back(n);
    }
    return BalancedPartition(cost, stages);
  }
  if (c.balance == "time") {
    if (in.block_seconds == nullptr) {
      return absl::InvalidArgumentError(
          "--balance=time needs each block's measured time (TimeBlocks): the launcher times "
          "them once and hands the workers explicit sizes; give sizes such as 3,3,2 here");
    }
    if (static_cast<int>(in.block_seconds->size()) != model.num_blocks()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--balance=time: %d block times for a model of %d blocks",
          in.block_seconds->size(), model.num_blocks()));
    }
    return BalancedPartition(*in.block_seconds, stages);
  }
  return ExplicitPartition(c.balance, model.num_blocks(), stages);
}

// What a stage needs under schedule `s`: its chunks' model state summed (one chunk
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
  const int64_t boundary = ShapeOnly(c).RowsHeld(rows * t.model.seq_len) * t.model.d_model *
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
                                 pending_weights, ShapeOnly(c));
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
  // The moment the stage holds most, replayed as the executor runs the row (stage_replay.h):
  // each transfer's tensor, a boundary's bytes, from its group's posting until the stream
  // waits on it (a send) or the action that reads it (a receive); each chunk's activations
  // from a forward to its backward, and a deferred W's stash from its B to the W. Measured
  // at each action's end and each group's posting.
  int transfers = 0;
  std::vector<int> now(s.chunks, 0), pending(s.chunks, 0);
  int64_t peak = 0;
  for (const ReplayEvent& e : ReplayStage(s, groups, stage)) {
    const int step = e.kind == ReplayKind::kAcquire ? 1 : e.kind == ReplayKind::kRelease ? -1 : 0;
    switch (e.buffer) {
      case ReplayBuffer::kReceived:
      case ReplayBuffer::kSent: transfers += step; break;
      case ReplayBuffer::kActivations: now[e.chunk] += step; break;
      case ReplayBuffer::kStash: pending[e.chunk] += step; break;
      case ReplayBuffer::kNone: break;
    }
    if (e.kind != ReplayKind::kActionEnd && e.kind != ReplayKind::kGroupPosted) continue;
    int64_t bytes = transfers * boundary;
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

// Each rank's need: the data-parallel replica's, or its stage's under the schedule (a stage's
// D replicas need the same). Under ZeRO-1 a rank keeps the optimizer state of its shard,
// ceil(numel / D) elements; under ZeRO-2 the gradients of its shard too (what it holds
// between steps; a step's buckets come and go during backward, counted as none, as the
// estimate is a lower bound).
std::vector<MemoryNeed> RankMemory(const ParallelConfig& c, const JobLayout& l, int world) {
  const TrainConfig& t = c.train;
  auto shard_optimizer = [&](MemoryNeed* n) {
    if (c.zero < 1) return;
    const int64_t numel = n->grads / 4;  // f32 gradients
    const int64_t per_element = numel > 0 ? n->optimizer / numel : 0;
    const int64_t shard = (numel + l.grid.replicas - 1) / l.grid.replicas;
    n->optimizer = shard * per_element;
    if (c.zero >= 2) n->grads = 4 * shard;
  };
  if (!l.pipelined()) {
    // Every rank: the whole model (its tensor-parallel part), its replica's share of the
    // batch, one micro-batch after another.
    MemoryNeed n = EstimateStageMemory(
        t.model, 0, l.bounds.back(), t.batch / l.grid.replicas / t.micro_batches,
        /*in_flight=*/1, c.recompute, t.dtype, t.optimizer.kind, t.device,
        /*pending_weights=*/0, ShapeOnly(c));
    shard_optimizer(&n);
    return std::vector<MemoryNeed>(world, n);
  }
  const int64_t rows = t.batch / l.grid.replicas / t.micro_batches;
  std::vector<MemoryNeed> per_stage;
  for (int stage = 0; stage < l.grid.stages; ++stage) {
    per_stage.push_back(
        ScheduledStageMemory(c, l.bounds, l.schedule, l.exchange_groups[stage], stage, rows));
    shard_optimizer(&per_stage.back());
  }
  std::vector<MemoryNeed> needs;
  for (int r = 0; r < world; ++r) needs.push_back(per_stage[l.grid.StageOf(r)]);
  return needs;
}

// "blocks 2-4 (h1, h2, h3)", or with chunks "blocks 1 (h0) and 5 (h4)".
std::string DescribeBlocks(const std::vector<std::unique_ptr<Block>>& blocks,
                           const std::vector<std::pair<int, int>>& chunks) {
  std::vector<std::string> parts;
  for (const auto& [begin, end] : chunks) {
    std::vector<std::string> names;
    for (int b = begin; b < end; ++b) names.push_back(blocks[b]->name());
    parts.push_back(absl::StrFormat("%s (%s)",
                                    end - begin == 1 ? absl::StrCat(begin)
                                                     : absl::StrCat(begin, "-", end - 1),
                                    absl::StrJoin(names, ", ")));
  }
  return absl::StrCat(chunks.size() == 1 && chunks[0].second - chunks[0].first == 1 ? "block "
                                                                                      : "blocks ",
                      absl::StrJoin(parts, " and "));
}

// The gradient buckets of rank `rank`'s stage, one line each, as the trainer plans and issues
// them (Stage::ParamBlocks, PlanBuckets, GradientSync): under ZeRO-1 with the rank's shard.
std::vector<std::string> DescribeBuckets(const ParallelConfig& c, const JobLayout& l,
                                         const std::vector<std::unique_ptr<Block>>& blocks,
                                         int rank) {
  const int stage = l.grid.StageOf(rank);
  const StageParamPlan plan = PlanStageParams(c.train.model, blocks, l.ChunkRanges(stage));
  const std::vector<int>& held_blocks = plan.held;
  const ParamLayout params(plan.specs);
  // The trainer's embedding group: the tied table's end stages, which hold it (or its copy)
  // in a bucket of its own.
  const bool tied = c.train.model.tie_embeddings && l.grid.stages > 1;
  const bool first = held_blocks.front() == 0;
  const bool last = held_blocks.back() == static_cast<int>(blocks.size()) - 1;
  const std::vector<Bucket> buckets =
      PlanBuckets(params, plan.owners, c.bucket_bytes, tied && (first || last) ? 0 : -1);
  const bool zero = c.zero >= 1;
  const bool table = tied && (first || last);  // the last bucket, held for the embedding group
  std::vector<std::string> lines;
  lines.push_back(absl::StrFormat(
      "%d gradient bucket%s of about %s, %s among %s %s%s", buckets.size(),
      buckets.size() == 1 ? "" : "s", FormatBytes(c.bucket_bytes),
      zero ? "reduce-scattered" : "all-reduced",
      l.pipelined() ? absl::StrFormat("the stage's %d replicas", l.grid.replicas)
                    : absl::StrFormat("the %d data-parallel ranks", l.grid.replicas),
      !c.overlap                          ? "after the pass (--no-overlap)"
      : l.pipelined()                     ? "during the last action writing the gradients"
      : c.train.micro_batches > 1         ? "during the last micro-batch's backward"
                                          : "during backward",
      c.zero >= 2 ? " into the rank's shard and freed, then its shard updated and all-gathered"
      : zero      ? ", then its shard updated and all-gathered"
                  : ""));
  const auto& e = params.entries();
  for (size_t i = 0; i < buckets.size(); ++i) {
    const Bucket& b = buckets[i];
    const bool held = table && i + 1 == buckets.size();
    lines.push_back(absl::StrFormat(
        "  bucket %d: %s, %s .. %s (%d parameter%s), %s", i, FormatBytes(4 * (b.end - b.begin)),
        e[b.last_param].spec.name, e[b.first_param].spec.name, b.last_param - b.first_param + 1,
        b.last_param == b.first_param ? "" : "s",
        held ? absl::StrCat("after the pass, once the embedding group summed the tied table",
                            zero ? " (all-reduced, so both copies stay equal)" : "")
             : absl::StrCat("after ", blocks[held_blocks[b.ready_block]]->name(), "'s backward")));
  }
  if (zero) {
    const std::vector<int64_t> shards = EvenShards(params.numel(), l.grid.replicas);
    const int r = l.grid.ReplicaOf(rank);
    lines.push_back(absl::StrFormat(
        "ZeRO-%d: its optimizer state%s is elements [%d, %d) of the stage's %d (shard %d of %d)",
        c.zero, c.zero >= 2 ? " and gradients" : "", shards[r], shards[r + 1], params.numel(), r,
        l.grid.replicas));
  }
  return lines;
}

// What `n` holds: "at least 31.2 MB: parameters 4 MB, gradients 4 MB, ...".
std::string DescribeMemory(const MemoryNeed& n, bool pipelined) {
  std::string s = absl::StrFormat(
      "at least %s: parameters %s, gradients %s, optimizer state %s, activations %s, "
      "temporaries %s",
      FormatBytes(n.total()), FormatBytes(n.params), FormatBytes(n.grads),
      FormatBytes(n.optimizer), FormatBytes(n.activations), FormatBytes(n.workspace));
  if (pipelined) {
    absl::StrAppendFormat(&s, " (%d micro-batch%s held at once", n.in_flight,
                          n.in_flight == 1 ? "" : "es");
    if (n.pending_weights > 0) {
      absl::StrAppendFormat(&s, ", %d deferred W%s", n.pending_weights,
                            n.pending_weights == 1 ? "" : "s");
    }
    s += ")";
  }
  return s;
}

// A stage's row of the schedule, its actions' texts wrapped into lines of about `width`.
std::vector<std::string> ScheduleRow(const PipelineSchedule& s, int stage, size_t width) {
  std::vector<std::string> lines(1);
  for (const Action& a : s.actions[stage]) {
    const std::string text = ActionText(stage, a);
    if (!lines.back().empty() && lines.back().size() + 1 + text.size() > width) lines.emplace_back();
    absl::StrAppend(&lines.back(), lines.back().empty() ? "" : " ", text);
  }
  return lines;
}

}  // namespace

std::string ExplainLayout(const ParallelConfig& c, const JobLayout& l) {
  const TrainConfig& t = c.train;
  const std::vector<std::unique_ptr<Block>> blocks = BuildBlocks(t.model, ShapeOnly(c));
  const int world = l.grid.ranks();
  std::string out;
  if (l.pipelined()) {
    absl::StrAppendFormat(
        &out,
        "layout: %d rank%s, %d replica%s x %d stage%s; schedule %s, %d micro-batch%s of %d "
        "rows%s\n",
        world, world == 1 ? "" : "s", l.grid.replicas, l.grid.replicas == 1 ? "" : "s",
        l.grid.stages, l.grid.stages == 1 ? "" : "s",
        c.strategy == StrategyKind::kModel ? "gpipe (model parallel)" : c.schedule,
        t.micro_batches, t.micro_batches == 1 ? "" : "es",
        t.batch / l.grid.replicas / t.micro_batches,
        l.schedule.chunks > 1 ? absl::StrFormat(", %d model chunks a stage", l.schedule.chunks)
                              : "");
  } else {
    absl::StrAppendFormat(&out, "layout: %d rank%s, data parallel; %d micro-batch%s of %d rows\n",
                          world, world == 1 ? "" : "s", t.micro_batches,
                          t.micro_batches == 1 ? "" : "es",
                          t.batch / l.grid.replicas / t.micro_batches);
  }
  if (l.grid.tensors > 1) {
    absl::StrAppendFormat(
        &out,
        "tensor parallel: %d ranks a stage (neighbouring ranks), each %d of the %d heads, %d of "
        "the MLP's %d channels and %d of the %d-token vocabulary\n",
        l.grid.tensors, t.model.n_head / l.grid.tensors, t.model.n_head,
        4 * t.model.d_model / l.grid.tensors, 4 * t.model.d_model,
        t.model.vocab / l.grid.tensors, t.model.vocab);
  }
  for (int r = 0; r < world; ++r) {
    const int stage = l.grid.StageOf(r);
    absl::StrAppendFormat(&out, "rank %d %s: %s\n", r,
                          l.grid.tensors > 1 ? l.grid.Place(r)
                                             : absl::StrFormat("(replica %d, stage %d)",
                                                               l.grid.ReplicaOf(r), stage),
                          DescribeBlocks(blocks, l.ChunkRanges(stage)));
    if (l.grid.replicas > 1) {
      for (const std::string& line : DescribeBuckets(c, l, blocks, r)) {
        absl::StrAppend(&out, "  ", line, "\n");
      }
    }
    absl::StrAppend(&out, "  memory: ", DescribeMemory(l.memory[r], l.pipelined()), "\n");
    if (l.pipelined()) {
      const std::vector<std::string> row = ScheduleRow(l.schedule, stage, 88);
      for (size_t i = 0; i < row.size(); ++i) {
        absl::StrAppend(&out, i == 0 ? "  schedule: " : "            ", row[i], "\n");
      }
    }
  }
  return out;
}

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

std::vector<std::pair<int, int>> JobLayout::ChunkRanges(int stage) const {
  std::vector<std::pair<int, int>> chunks;
  for (int g = stage; g + 1 < static_cast<int>(bounds.size()); g += grid.stages) {
    chunks.push_back({bounds[g], bounds[g + 1]});
  }
  return chunks;
}

std::pair<int, int> JobLayout::BlockRange(int stage) const {
  const std::vector<std::pair<int, int>> chunks = ChunkRanges(stage);
  return {chunks.front().first, chunks.back().second};
}

std::string JobLayout::StageSizes() const { return PartitionSizes(bounds); }

namespace {

// Sequence parallelism splits each micro-batch's rows (samples x sequence) over the T ranks.
absl::Status CheckSequenceParallel(const ParallelConfig& c, int world) {
  const TrainConfig& t = c.train;
  if (c.tensor_parallel < 2) {
    return absl::InvalidArgumentError(
        "--sequence-parallel needs --tensor-parallel=T with T >= 2: it splits the rows between "
        "the tensor-parallel regions over those T ranks");
  }
  const int replicas = c.strategy == StrategyKind::kData ? world / c.tensor_parallel
                                                         : c.data_parallel;
  const int64_t rows = int64_t{t.batch} / std::max(1, replicas) / std::max(1, t.micro_batches) *
                       t.model.seq_len;
  if (rows % c.tensor_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--sequence-parallel with --tensor-parallel=%d: a micro-batch's %d rows (samples x "
        "--seq-len) do not split evenly over the %d ranks; use a --seq-len or --batch that "
        "makes them a multiple of %d",
        c.tensor_parallel, rows, c.tensor_parallel, c.tensor_parallel));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobLayout> ResolveLayout(const ParallelConfig& c, int world,
                                        const LayoutInputs& in) {
  RETURN_IF_ERROR(c.train.Validate());
  if (c.zero < 0 || c.zero > 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--zero=%d: use 0 (every replica keeps the whole optimizer state), 1 (ZeRO-1: each "
        "keeps its shard of it) or 2 (ZeRO-2: its shard of the gradients too)",
        c.zero));
  }
  const int tp = c.tensor_parallel;
  RETURN_IF_ERROR(ProcessGrid::Make(world, 1, tp).status());  // T divides the world
  RETURN_IF_ERROR(CheckTensorParallel(c.train.model, tp));
  if (c.sequence_parallel) RETURN_IF_ERROR(CheckSequenceParallel(c, world));
  JobLayout l;
  if (c.strategy == StrategyKind::kData) {
    RETURN_IF_ERROR(CheckDataParallel(c, world / tp));
    ASSIGN_OR_RETURN(l.grid, ProcessGrid::Make(world, world / tp, tp));
    l.bounds = {0, c.train.model.num_blocks()};
  } else {
    ASSIGN_OR_RETURN(l.grid, ProcessGrid::Make(world, c.data_parallel, tp));
    RETURN_IF_ERROR(CheckPipeline(c, l.grid));
    const int v = c.strategy == StrategyKind::kModel ? 1 : c.virtual_stages;
    ASSIGN_OR_RETURN(l.bounds, SplitStages(c, l.grid.stages * v, in));
    if (in.schedule != nullptr) {
      const PipelineSchedule& given = *in.schedule;
      if (given.stages != l.grid.stages || given.micro_batches != c.train.micro_batches ||
          given.chunks != v) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "a schedule of %d stages, %d micro-batches and %d chunks for a layout of %d, %d "
            "and %d",
            given.stages, given.micro_batches, given.chunks, l.grid.stages,
            c.train.micro_batches, v));
      }
      l.schedule = given;
    } else {
      ASSIGN_OR_RETURN(l.schedule, StrategySchedule(c, l.grid.stages));
      RETURN_IF_ERROR(ValidateSchedule(l.schedule));
    }
    l.exchange_groups = ExchangeGroups(l.schedule);
  }
  l.memory = RankMemory(c, l, world);
  return l;
}

absl::StatusOr<std::string> BalancedSizes(const std::vector<double>& seconds, int stages) {
  ASSIGN_OR_RETURN(StageBounds b, BalancedPartition(seconds, stages));
  return PartitionSizes(b);
}

}  // namespace tandem
