// A stage: a contiguous range of the model's blocks on one device, with its parameters and
// gradients in flat buffers and the activations of every micro-batch in flight. One worker
// training alone holds one stage with every block; a pipeline holds one per rank. Under an
// interleaved schedule a stage holds several model chunks, each a range of blocks (global
// stages g, g + K, ... of a K-stage pipeline), in one set of flat buffers; every call that
// runs blocks names its chunk (0 where there is one), and each chunk keeps its own
// micro-batches' activations.
#ifndef TANDEM_MODEL_STAGE_H_
#define TANDEM_MODEL_STAGE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/block.h"
#include "model/config.h"
#include "model/params.h"

namespace tandem {

// What a stage holding the blocks `chunks` (ranges [begin, end), ascending) of `blocks`
// lays out, without allocating anything: the blocks it holds in order, its parameters in the
// order of its flat buffer (StageParams) with each held block's parameter indices, whether
// parameter 0 is a copy of the tied table (a last stage without the embedding), and for each
// parameter the held block whose backward completes its gradient (ParamOwners). What
// Stage::Create builds, and what gradient buckets are planned from.
struct StageParamPlan {
  std::vector<int> held;
  std::vector<ParamSpec> specs;
  std::vector<std::vector<size_t>> block_params;
  bool embedding_copy = false;
  std::vector<int> owners;
};
StageParamPlan PlanStageParams(const ModelConfig& config,
                               const std::vector<std::unique_ptr<Block>>& blocks,
                               const std::vector<std::pair<int, int>>& chunks);

class Stage {
 public:
  // Blocks [begin, end) of the model; parameters initialized from `seed` (the same values
  // whatever the split), gradients zero. With a 16-bit `compute` dtype (mixed precision, as
  // autocast: CUDA only) the blocks run on a bf16/f16 copy of the f32 master parameters,
  // activations are 16-bit, and statistics, losses and gradients stay f32.
  static absl::StatusOr<std::unique_ptr<Stage>> Create(const ModelConfig& config, int begin,
                                                       int end, Device device, uint64_t seed,
                                                       DType compute = DType::kF32);
  // Several model chunks: `chunks` ranges [begin, end) of blocks, ascending, not empty, not
  // overlapping. Under tensor parallelism (tp.size > 1) the stage holds this rank's parts of
  // the blocks, initialized as the parts of the whole model's values.
  static absl::StatusOr<std::unique_ptr<Stage>> Create(
      const ModelConfig& config, const std::vector<std::pair<int, int>>& chunks, Device device,
      uint64_t seed, DType compute = DType::kF32, const TensorParallel& tp = {});

  // Whether the stage holds the model's first block (the embedding) and its last (the head).
  bool is_first() const { return begin() == 0; }
  bool is_last() const { return end() == config_.num_blocks(); }
  // The first block of the first chunk and the end of the last one.
  int begin() const { return chunks_.front().first; }
  int end() const { return chunks_.back().second; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  const std::vector<std::pair<int, int>>& chunks() const { return chunks_; }
  // Whether chunk c starts the model (takes tokens) or ends it (gives losses).
  bool chunk_is_first(int c) const { return chunks_[c].first == 0; }
  bool chunk_is_last(int c) const { return chunks_[c].second == config_.num_blocks(); }
  Device device() const { return device_; }
  const ModelConfig& config() const { return config_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  // What crosses a stage boundary for a micro-batch of `rows` samples: (rows, T, C), or under
  // sequence parallelism this rank's rows of it, (rows x T / size, 1, C).
  Shape BoundaryShape(int64_t rows) const;
  const ParamLayout& layout() const { return *layout_; }
  const FlatBuffer& params() const { return params_; }
  // The 16-bit copy the blocks compute with; undefined in f32.
  const Tensor& params_low() const { return params_low_.flat(); }
  // Refreshes the 16-bit copy after the f32 parameters changed outside the optimizer
  // (broadcast, checkpoint load); a no-op in f32.
  absl::Status ParamsChanged(Stream& s);
  const FlatBuffer& grads() const { return grads_; }
  // ZeRO-2: the gradients in segments (FlatBuffer::CreateSegmented), the whole buffer given
  // back; a segment is allocated (zeroed) when backward first writes into it, or GradSegment
  // asks for it, and given back by ReleaseGradSegment.
  absl::Status SegmentGrads(std::vector<ElementRange> segments);
  // Segment k's gradients (allocated if they are not), and parameter i's. Once segment k was
  // given back in a step, asking for it again before ZeroGrads is an error (FailedPrecondition):
  // a gradient written after its bucket was reduced would be lost.
  absl::StatusOr<Tensor> GradSegment(size_t k, Stream& s);
  absl::StatusOr<Tensor> Grad(size_t i, Stream& s);
  void ReleaseGradSegment(size_t k);

  // Runs micro-batch `id` forward through the stage's blocks. x is the previous stage's
  // output (undefined for the first stage); y is this stage's output, or for the last stage
  // the per-token losses (B*T) f32. Activations are kept until Backward(id).
  absl::Status Forward(Stream& s, int id, const MicroBatch& mb, const Tensor& x, Tensor* y,
                       int chunk = 0);
  // An evaluation's forward (no_grad): x and y as Forward's, but nothing is kept for
  // backward (each block's temporaries go as soon as it is done), the head makes no gradient,
  // and the micro-batches in flight are not touched.
  absl::Status Evaluate(Stream& s, const MicroBatch& mb, const Tensor& x, Tensor* y,
                        int chunk = 0);
  // From dy (undefined for the last stage) adds this micro-batch's parameter gradients and
  // returns dx for the previous stage (undefined for the first); frees its activations.
  // `block_done(b)`, if given, runs as soon as block b's gradients are written (blocks go
  // from last to first): data parallelism starts a bucket's all-reduce there.
  absl::Status Backward(Stream& s, int id, const MicroBatch& mb, const Tensor& dy, Tensor* dx,
                        const std::function<absl::Status(int)>& block_done = nullptr,
                        int chunk = 0);
  // Backward in two parts (a schedule's B and W): BackwardInput returns dx as Backward does,
  // adds the LayerNorms' and the head's parameter gradients (Block::BackwardInput) and frees
  // the activations, keeping for BackwardWeights(id) only what the other linear layers' weight
  // gradients need; BackwardWeights adds those, calling `block_done` as Backward does. Other
  // micro-batches may run in between; with the Bs and the Ws each in the order the Backwards
  // would have run, the gradients are Backward's, bit for bit (but for a tied table on a stage
  // with both the head and the embedding: see Block::BackwardInput).
  absl::Status BackwardInput(Stream& s, int id, const MicroBatch& mb, const Tensor& dy,
                             Tensor* dx, int chunk = 0);
  absl::Status BackwardWeights(Stream& s, int id, const MicroBatch& mb,
                               const std::function<absl::Status(int)>& block_done = nullptr,
                               int chunk = 0);
  // Number of micro-batches whose BackwardInput ran and BackwardWeights not yet.
  int weights_pending() const { return static_cast<int>(for_w_.size()); }
  // Number of blocks in the stage (over its chunks, in order), and for each parameter the
  // block (stage-relative, the index block_done receives) after
  // whose backward its gradient is complete: its owner's, for the tied table shared by
  // embedding and head the embedding's, for the last stage's copy of it the stage's first
  // block (its gradient is summed with the first stage's after the stage's backward).
  // Non-decreasing in the parameter's index.
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  std::vector<int> ParamBlocks() const;
  // With tied embeddings, on a last stage without the embedding: the elements at the start of
  // the flat buffers that are the copy of "embed.wte" the head reads (its gradient is the
  // head's share only, until summed with the first stage's); 0 on every other stage.
  int64_t embedding_copy_numel() const { return embedding_copy_numel_; }
  // Forgets every micro-batch's activations (e.g. after an evaluation forward).
  void DropActivations() {
    saved_.clear();
    inputs_.clear();
    for_w_.clear();
  }
  // Number of micro-batches whose activations are held now (over all chunks: a micro-batch
  // counts once in each chunk holding it), and the most held at once since the last
  // ResetPeakInFlight.
  int in_flight() const { return static_cast<int>(saved_.size()); }
  int peak_in_flight() const { return peak_in_flight_; }
  void ResetPeakInFlight() { peak_in_flight_ = in_flight(); }

  // Zeroes the gradients; segmented, gives every segment back.
  absl::Status ZeroGrads(Stream& s);

  // Re-materialization (GPipe's): Forward keeps only the stage's input for each micro-batch
  // and Backward runs the forward again before it, trading compute for activation memory.
  void set_recompute(bool on) { recompute_ = on; }

 private:
  Stage(const ModelConfig& c, std::vector<std::pair<int, int>> chunks, Device d)
      : config_(c), chunks_(std::move(chunks)), device_(d) {}
  ModelConfig config_;
  std::vector<std::pair<int, int>> chunks_;
  Device device_;
  TensorParallel tp_;
  std::vector<std::unique_ptr<Block>> blocks_;           // the stage's blocks only, in order
  std::vector<int> chunk_start_;                         // chunk c: blocks_[start[c], start[c+1])
  std::vector<std::vector<size_t>> block_params_;        // per block: indices into layout
  std::unique_ptr<ParamLayout> layout_;
  FlatBuffer params_, grads_, params_low_;
  DType compute_ = DType::kF32;
  const Tensor& compute_param(size_t i) const {
    return compute_ == DType::kF32 ? params_.view(i) : params_low_.view(i);
  }
  using Key = std::pair<int, int>;                       // (chunk, micro-batch id)
  std::map<Key, std::vector<Saved>> saved_;              // per block of the chunk
  std::map<Key, Tensor> inputs_;                         // under recompute: x
  std::map<Key, std::vector<Saved>> for_w_;              // after B: per block, for W
  bool recompute_ = false;
  int peak_in_flight_ = 0;
  int64_t embedding_copy_numel_ = 0;
  std::vector<bool> grad_segment_reduced_;  // segmented: given back this step
  std::vector<Tensor> BlockParams(int b) const;
  // Block b's parameters' gradients; segmented, their segments allocated first.
  absl::StatusOr<std::vector<Tensor>> BlockGrads(Stream& s, int b);
  // "stage [2, 4)", or with chunks "stage [0, 2) [4, 6)", and " chunk 1" where it has several.
  std::string Name(int chunk = -1) const;
  absl::Status CheckChunk(int chunk) const;
  absl::Status RunForward(Stream& s, int chunk, const MicroBatch& mb, const Tensor& x,
                          std::vector<Saved>* saved, Tensor* y);
  // Backward's blocks of chunk `chunk`, last to first: each block's B then W, or with `for_w`
  // its B only, keeping what its W needs in (*for_w)[b - start].
  absl::Status RunBackward(Stream& s, int chunk, int id, const MicroBatch& mb, const Tensor& dy,
                           Tensor* dx, std::vector<Saved>* for_w,
                           const std::function<absl::Status(int)>& block_done);
};

}  // namespace tandem

#endif  // TANDEM_MODEL_STAGE_H_
