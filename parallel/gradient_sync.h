// Gradient synchronization among a stage's data-parallel replicas (after PyTorch DDP's
// reducer, and DeepSpeed's ZeRO stage 1): the stage's flat gradient buffer in buckets
// (parallel/buckets.h), each bucket's reduction issued as soon as backward has written its
// last gradient and run on the communicator while backward goes on, and the stream made to
// wait for them all before the optimizer.
//   - Without ZeRO: each bucket is all-reduced (summed: the loss is already scaled by the
//     global token count).
//   - ZeRO-1: each replica keeps the optimizer state of one contiguous shard of the buffer
//     (EvenShards); buckets are reduce-scattered to the shards, each replica updates its
//     part of each bucket, and the bucket's parameters are all-gathered as soon as its part
//     is updated.
//   - ZeRO-2: as ZeRO-1, and the rank keeps only its shard of the gradients. The stage's
//     gradients are one allocation per bucket (Stage::SegmentGrads), made when backward first
//     writes into the bucket; each is reduce-scattered into the rank's shard (out of place)
//     and given back as soon as that is issued: the communicator holds it until the reduction
//     ran (stream-ordered), and nothing else does. Gradient accumulation is Megatron's:
//     a step's micro-batches accumulate into the buckets, reduced once, after the last
//     micro-batch's backward (not DeepSpeed's reduction per micro-batch): the same traffic as
//     ZeRO-1, and the full gradients live only between a bucket's first write in a step and
//     its reduction.
//   - With tied embeddings across stages the table's bucket is the last, issued only after
//     the embedding group summed the table's gradient (and all-reduced even under ZeRO-1, so
//     the first and last stage's copies stay equal bit for bit).
// Every wait is the stream's; the host never blocks here.
#ifndef TANDEM_PARALLEL_GRADIENT_SYNC_H_
#define TANDEM_PARALLEL_GRADIENT_SYNC_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "model/optimizer.h"
#include "model/stage.h"
#include "parallel/buckets.h"
#include "runtime/timeline.h"

namespace tandem {

class GradientSync {
 public:
  // The stream waits for `w` (with the trainer's place and step in an error).
  using StreamWait = std::function<absl::Status(Work& w, const char* what)>;

  GradientSync() = default;
  // `dp`: the stage's data-parallel group (null or of one rank: nothing to synchronize);
  // `zero`: the ZeRO level, 0 to 2; `tied_table`: the stage holds the tied table or its copy,
  // which the embedding group sums first. Plans the buckets of `stage` of about
  // `bucket_bytes`; under ZeRO-2 segments the stage's gradients by them.
  static absl::StatusOr<GradientSync> Create(Stage& stage, Communicator* dp,
                                             int64_t bucket_bytes, int zero, bool tied_table);

  // Whether there are replicas to synchronize with, whether the optimizer state is sharded
  // over them (ZeRO-1 and up), and whether the gradients are (ZeRO-2).
  bool replicated() const { return dp_ != nullptr && dp_->world_size() > 1; }
  bool zero() const { return zero_ >= 1 && replicated(); }
  bool grads_sharded() const { return zero_ >= 2 && replicated(); }
  // This rank's shard of the stage's flat buffer (the whole buffer without ZeRO-1), and every
  // replica's: shard r is [shards()[r], shards()[r + 1]).
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_end() const { return shard_end_; }
  const std::vector<int64_t>& shards() const { return shards_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // After WaitAll: the reduced gradients of elements [begin, end) of the stage's flat buffer,
  // within this rank's shard (under ZeRO-2 its own shard buffer, else the stage's gradients).
  absl::StatusOr<Tensor> ReducedGrads(int64_t begin, int64_t end) const;

  // A new step: no bucket issued yet.
  void StartStep();
  // Issues every bucket whose last block is `block` or later (backward runs last to first),
  // but the tied table's. Adds the bytes to *comm_bytes.
  absl::Status IssueReadyAt(int block, int64_t* comm_bytes);
  // Issues the buckets not issued yet, then the stream waits for every one.
  absl::Status WaitAll(const StreamWait& wait_on, int64_t* comm_bytes);
  // ZeRO-1's step end on stream `s`: the gradients' factor `scale` computed from their squared
  // norm (unscaling by `loss_scale`, clipping), this rank's part of each bucket updated by
  // `optimizer`, each bucket all-gathered as soon as its part is, the gradients zeroed, and
  // the stream waiting for the gathers; the timeline marks the optimizer and the gather.
  absl::Status ZeroStepEnd(Stream& s, Optimizer& optimizer,
                           const OptimizerConfig& config, float loss_scale, int step,
                           const Tensor& grad_sumsq, const Tensor& scale,
                           const StreamWait& wait_on, StreamTimeline& timeline,
                           int64_t* comm_bytes);

 private:
  // Each replica's part of bucket `i`, relative to the bucket.
  std::vector<int64_t> BucketParts(size_t i) const;
  absl::Status Issue(size_t i, int64_t* comm_bytes);
  // Whether bucket `i` is the tied table's, held for the embedding group and all-reduced.
  bool IsTable(size_t i) const { return tied_table_ && i + 1 == buckets_.size(); }

  Communicator* dp_ = nullptr;
  Stage* stage_ = nullptr;
  int zero_ = 0;
  bool tied_table_ = false;
  // ZeRO-2: this rank's shard of the reduced gradients, and the tied table's bucket between
  // its all-reduce and the copy of this rank's part of it into the shard.
  Tensor grad_shard_;
  Tensor table_grads_;
  int replica_ = 0;
  std::vector<int64_t> shards_;
  int64_t shard_begin_ = 0, shard_end_ = 0;
  std::vector<Bucket> buckets_;
  // The step being issued: its bucket reductions and the next bucket to issue.
  std::vector<std::unique_ptr<Work>> works_;
  size_t next_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_PARALLEL_GRADIENT_SYNC_H_
