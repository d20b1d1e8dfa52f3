#include "parallel/gradient_sync.h"

#include <algorithm>
#include <utility>

#include "parallel/step_phases.h"
#include "runtime/ops.h"
#include "runtime/status.h"

namespace tandem {

absl::StatusOr<GradientSync> GradientSync::Create(Stage& stage, Communicator* dp,
                                                  int64_t bucket_bytes, int zero,
                                                  bool tied_table) {
  GradientSync g;
  g.dp_ = dp;
  g.stage_ = &stage;
  g.zero_ = zero;
  g.tied_table_ = tied_table;
  const int64_t numel = stage.layout().numel();
  g.shard_end_ = numel;
  if (!g.replicated()) return g;
  g.replica_ = dp->rank();
  g.shards_ = EvenShards(numel, dp->world_size());
  if (g.zero()) {
    g.shard_begin_ = g.shards_[g.replica_];
    g.shard_end_ = g.shards_[g.replica_ + 1];
  }
  // The tied table (or its copy), parameter 0 of both end stages, in a bucket of its own:
  // the last, held until the embedding group summed it (IssueReadyAt).
  g.buckets_ = PlanBuckets(stage.layout(), stage.ParamBlocks(), bucket_bytes, tied_table ? 0 : -1);
  if (g.grads_sharded()) {
    std::vector<ElementRange> segments;
    for (const Bucket& b : g.buckets_) segments.push_back({b.begin, b.end});
    RETURN_IF_ERROR(stage.SegmentGrads(std::move(segments)));
    // Every element of it is written each step: its part of each bucket's reduction.
    ASSIGN_OR_RETURN(g.grad_shard_, Tensor::Empty({g.shard_end_ - g.shard_begin_}, DType::kF32,
                                                  stage.device()));
  }
  return g;
}

absl::StatusOr<Tensor> GradientSync::ReducedGrads(int64_t begin, int64_t end) const {
  if (grads_sharded()) return grad_shard_.View(begin - shard_begin_, {end - begin});
  return stage_->grads().flat().View(begin, {end - begin});
}

std::vector<int64_t> GradientSync::BucketParts(size_t i) const {
  const Bucket& b = buckets_[i];
  std::vector<int64_t> parts;
  for (int64_t o : shards_) parts.push_back(std::clamp(o, b.begin, b.end) - b.begin);
  return parts;
}

void GradientSync::StartStep() {
  works_.clear();
  next_ = 0;
}

absl::Status GradientSync::Issue(size_t i, int64_t* comm_bytes) {
  const Bucket& b = buckets_[i];
  Tensor g;
  if (grads_sharded()) {
    // A bucket no backward wrote into this step (none here; a model could leave a parameter
    // unused) is reduced as zeros.
    ASSIGN_OR_RETURN(Stream * s, Stream::Compute(stage_->device()));
    ASSIGN_OR_RETURN(g, stage_->GradSegment(i, *s));
  } else {
    ASSIGN_OR_RETURN(g, stage_->grads().flat().View(b.begin, {b.end - b.begin}));
  }
  std::unique_ptr<Work> w;
  // The tied table's bucket (the last) is all-reduced even under ZeRO-1: a reduce-scatter
  // sums in an order that follows the parts, which differ between the first and the last
  // stage's buffers, and from three replicas on the two copies would drift apart by rounding.
  if (zero() && !IsTable(i)) {
    const std::vector<int64_t> parts = BucketParts(i);
    Tensor out;  // ZeRO-2: this rank's part of the sums, into its shard of the gradients
    const int64_t mine = parts[replica_ + 1] - parts[replica_];
    if (grads_sharded() && mine > 0) {
      ASSIGN_OR_RETURN(out, grad_shard_.View(b.begin + parts[replica_] - shard_begin_, {mine}));
    }
    ASSIGN_OR_RETURN(w, dp_->ReduceScatterParts(g, parts, out));
    // The communicator holds the bucket until its reduction ran; nothing else needs it.
    if (grads_sharded()) stage_->ReleaseGradSegment(i);
  } else {
    ASSIGN_OR_RETURN(w, dp_->AllReduce(g));
    if (grads_sharded()) table_grads_ = g;
  }
  *comm_bytes += static_cast<int64_t>(g.bytes());
  works_.push_back(std::move(w));
  return absl::OkStatus();
}

absl::Status GradientSync::IssueReadyAt(int block, int64_t* comm_bytes) {
  // Each bucket's reduction is issued once backward has issued its last gradient, and runs
  // after that work (the communicator orders it after the compute stream).
  while (next_ < buckets_.size() && buckets_[next_].ready_block >= block) {
    // The tied table's bucket (the last) waits for the embedding group's sum, after the pass.
    if (IsTable(next_)) break;
    RETURN_IF_ERROR(Issue(next_++, comm_bytes));
  }
  return absl::OkStatus();
}

absl::Status GradientSync::WaitAll(const StreamWait& wait_on, int64_t* comm_bytes) {
  while (next_ < buckets_.size()) RETURN_IF_ERROR(Issue(next_++, comm_bytes));
  // The optimizer's work waits on the stream for every bucket; the host does not.
  for (auto& w : works_) RETURN_IF_ERROR(wait_on(*w, w->description().c_str()));
  works_.clear();
  if (!table_grads_.defined()) return absl::OkStatus();
  // ZeRO-2: this rank's part of the tied table's all-reduced bucket into its shard.
  const size_t i = buckets_.size() - 1;
  const std::vector<int64_t> parts = BucketParts(i);
  const int64_t mine = parts[replica_ + 1] - parts[replica_];
  if (mine > 0) {
    ASSIGN_OR_RETURN(Stream * s, Stream::Compute(stage_->device()));
    ASSIGN_OR_RETURN(Tensor from, table_grads_.View(parts[replica_], {mine}));
    ASSIGN_OR_RETURN(Tensor to, ReducedGrads(buckets_[i].begin + parts[replica_],
                                             buckets_[i].begin + parts[replica_ + 1]));
    RETURN_IF_ERROR(Copy(to, from, *s));
  }
  table_grads_ = Tensor();
  stage_->ReleaseGradSegment(i);
  return absl::OkStatus();
}

absl::Status GradientSync::ZeroStepEnd(Stream& s, Optimizer& optimizer,
                                       const OptimizerConfig& config, float loss_scale,
                                       int step, const Tensor& grad_sumsq, const Tensor& scale,
                                       const StreamWait& wait_on, StreamTimeline& timeline,
                                       int64_t* comm_bytes) {
  Stage& stage = *stage_;
  RETURN_IF_ERROR(ops::GradScale(s, scale, grad_sumsq, 1.0f / loss_scale, config.clip_norm));
  const Tensor& params = stage.params().flat();
  std::vector<std::unique_ptr<Work>> gathers;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    // This rank's part of the bucket, updated with its part of the optimizer state; then the
    // bucket's parameters gathered from every part's owner, while the next part updates.
    const Bucket& b = buckets_[i];
    const std::vector<int64_t> parts = BucketParts(i);
    const int64_t lo = b.begin + parts[replica_], hi = b.begin + parts[replica_ + 1];
    if (hi > lo) {
      ASSIGN_OR_RETURN(Tensor pv, params.View(lo, {hi - lo}));
      ASSIGN_OR_RETURN(Tensor gv, ReducedGrads(lo, hi));
      // The 16-bit copy is refreshed whole once every part is gathered.
      RETURN_IF_ERROR(optimizer.Step(s, pv, gv, step, /*grad_scale=*/1.0f, Tensor(), scale,
                                     lo - shard_begin_));
    }
    ASSIGN_OR_RETURN(Tensor bucket, params.View(b.begin, {b.end - b.begin}));
    ASSIGN_OR_RETURN(std::unique_ptr<Work> w, dp_->AllGatherParts(bucket, parts));
    *comm_bytes += static_cast<int64_t>(bucket.bytes());
    gathers.push_back(std::move(w));
  }
  RETURN_IF_ERROR(stage.ZeroGrads(s));
  RETURN_IF_ERROR(timeline.Mark(kOptimizer, "optimizer"));
  // The next step's forward (and the 16-bit copy) wait on the stream for every parameter.
  for (auto& w : gathers) RETURN_IF_ERROR(wait_on(*w, w->description().c_str()));
  RETURN_IF_ERROR(timeline.Mark(kExposedComm, "gather parameters"));
  return stage.ParamsChanged(s);
}

}  // namespace tandem
