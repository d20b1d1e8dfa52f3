// DistributedTrainer's checkpoints: each stage's shard written by its first replica (the
// optimizer state gathered whole under ZeRO-1), every rank's outcome, size and checksum
// gathered, and rank 0's manifest written last; loading takes each rank's part by name,
// whatever strategy and world size wrote it (model/sharded_checkpoint.h).
#include "parallel/distributed.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/sharded_checkpoint.h"
#include "runtime/host_sync.h"
#include "runtime/status.h"

namespace tandem {
namespace {

// How long ranks wait for the others to write their checkpoint shards (at least): the
// default timeout of torch.distributed's process groups.
constexpr absl::Duration kCheckpointWriteTimeout = absl::Minutes(30);

}  // namespace

std::string DistributedTrainer::ShardName(const std::string& prefix, int stage) const {
  if (layout_.grid.stages == 1) return prefix + ".ckpt";
  return absl::StrFormat("%s.stage-%d.ckpt", prefix, stage);
}

absl::StatusOr<std::vector<Tensor>> DistributedTrainer::GatherOptimizerState() {
  std::vector<Tensor> state = {optimizer_.state0()};
  if (optimizer_.state1().defined()) state.push_back(optimizer_.state1());
  if (!zero()) return state;
  // Each shard into its place in a whole-stage tensor, then every shard from its owner.
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(c_.train.device));
  const std::vector<int64_t>& shards = sync_.shards();
  std::vector<std::unique_ptr<Work>> works;
  for (Tensor& t : state) {
    ASSIGN_OR_RETURN(Tensor whole, Tensor::Empty({stage_->layout().numel()}, DType::kF32,
                                                 c_.train.device));
    const int64_t begin = sync_.shard_begin(), end = sync_.shard_end();
    if (end > begin) {
      ASSIGN_OR_RETURN(Tensor mine, whole.View(begin, {end - begin}));
      RETURN_IF_ERROR(Copy(mine, t, *s));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Work> w, groups_.dp->AllGatherParts(whole, shards));
    works.push_back(std::move(w));
    t = whole;
  }
  for (auto& w : works) {
    RETURN_IF_ERROR(Wait(*w, "the optimizer state's shards", kCheckpointWriteTimeout));
  }
  return state;
}

absl::StatusOr<std::vector<Tensor>> DistributedTrainer::GatherTensorParallel(
    const std::vector<Tensor>& arrays, std::unique_ptr<ParamLayout>* whole) {
  const ParamLayout& mine = stage_->layout();
  const int T = layout_.grid.tensors;
  std::vector<ParamSpec> specs;
  for (const ParamEntry& e : mine.entries()) specs.push_back(WholeSpec(e.spec));
  *whole = std::make_unique<ParamLayout>(specs);
  std::vector<Tensor> out;
  for (const Tensor& a : arrays) {
    ASSIGN_OR_RETURN(Tensor all, Tensor::Empty({T * a.numel()}, DType::kF32, a.device()));
    ASSIGN_OR_RETURN(std::unique_ptr<Work> w, groups_.tp->AllGather(all, a));
    RETURN_IF_ERROR(Wait(*w, "the tensor-parallel parts of the checkpoint",
                         kCheckpointWriteTimeout));
    ASSIGN_OR_RETURN(std::vector<float> parts, all.ToFloatVector());
    std::vector<float> host((*whole)->numel());
    for (size_t i = 0; i < mine.entries().size(); ++i) {
      const ParamEntry& e = mine.entries()[i];
      float* dst = host.data() + (*whole)->entries()[i].offset;
      // A replicated parameter is the same on every rank: the first rank's.
      for (int r = 0; r < (e.spec.shard.split() ? T : 1); ++r) {
        ParamSpec part = e.spec;
        part.shard.index = r;
        InsertShard(part, parts.data() + r * a.numel() + e.offset, dst);
      }
    }
    ASSIGN_OR_RETURN(Tensor t, Tensor::FromVector(host, {(*whole)->numel()}));
    out.push_back(std::move(t));
  }
  return out;
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
  // A checkpoint holds the whole optimizer state whatever the sharding (ZeRO-1 gathers it),
  // and whole tensors (tensor parallelism gathers them to the group's first rank).
  const bool writes = replica_ == 0 && tensor_ == 0;
  const std::string prefix = CheckpointPrefixFor(dir, step_);
  const std::string path = ShardName(prefix, stage_index_);
  absl::Status saved = absl::OkStatus();
  CheckpointFileInfo info;
  absl::StatusOr<std::vector<Tensor>> state = GatherOptimizerState();
  if (!state.ok()) saved = state.status();
  // The arrays the file holds: the stage's, or under tensor parallelism the whole tensors.
  std::vector<Tensor> arrays = {stage_->params().flat()};
  if (saved.ok()) arrays.insert(arrays.end(), state->begin(), state->end());
  const ParamLayout* layout = &stage_->layout();
  int64_t skip = stage_->embedding_copy_numel();
  std::unique_ptr<ParamLayout> whole;
  if (tensor_group_ != nullptr && saved.ok()) {
    absl::StatusOr<std::vector<Tensor>> gathered = GatherTensorParallel(arrays, &whole);
    if (gathered.ok()) {
      arrays = std::move(*gathered);
      layout = whole.get();
      if (skip > 0) skip = whole->entries().front().spec.shape.numel();
    } else {
      saved = gathered.status();
    }
  }
  if (writes && saved.ok()) {
    const std::map<std::string, std::string> extra = {
        {"strategy", StrategyName(c_.strategy)},
        {"world_size", absl::StrCat(world)},
        {"data_parallel", absl::StrCat(layout_.grid.replicas)},
        {"tensor_parallel", absl::StrCat(layout_.grid.tensors)},
        {"zero", absl::StrCat(c_.zero)},
        {"rank", absl::StrCat(rank)},
        {"stage", absl::StrCat(stage_index_)}};
    const std::vector<Tensor> optimizer_state(arrays.begin() + 1, arrays.end());
    const auto [begin, end] = layout_.BlockRange(stage_index_);
    saved = SaveTrainingState(path, c_.train, *layout, begin, end, skip, arrays[0],
                              optimizer_state, scaler_, step_, extra, &info);
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
      s.file = ShardName(CheckpointName(step_), layout_.grid.StageOf(r));
      std::tie(s.block_begin, s.block_end) = layout_.BlockRange(layout_.grid.StageOf(r));
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
                                  StateRange{sync_.shard_begin(), sync_.shard_end()});
}

}  // namespace tandem
