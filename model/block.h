// A model is an ordered list of blocks (embedding, layers, head); any contiguous range of
// blocks is a pipeline stage. A block is a forward/backward pair over runtime ops: the same
// code for CPU and CUDA. Activations a block keeps for backward live in a Saved per
// micro-batch, so several micro-batches can be in flight (GPipe) and each is freed as soon
// as its backward ran (1F1B).
#ifndef TANDEM_MODEL_BLOCK_H_
#define TANDEM_MODEL_BLOCK_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/config.h"
#include "model/params.h"
#include "model/tensor_parallel.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace tandem {

// The data of one micro-batch, on the stage's device.
struct MicroBatch {
  Tensor tokens;   // (B, T) i32; read by the embedding
  Tensor targets;  // (B, T) i32; read by the head
  // Gradient of the training loss with respect to one token's loss: 1 / (tokens in the
  // global batch), times the loss scale under f16. With it, summing gradients over
  // micro-batches and ranks gives exactly the gradient of the global batch's mean loss.
  float dloss_scale = 1.0f;
  // The copy that filled tokens and targets (InputPrefetcher); null when they were ready
  // when made. A stream reads them only after waiting for it.
  std::shared_ptr<Event> ready;
};

// Activations one block keeps for backward, for one micro-batch.
struct Saved {
  std::vector<Tensor> t;
};

class Block {
 public:
  virtual ~Block() = default;
  // "embed", "h3", "head".
  virtual std::string name() const = 0;
  // The parameters the block reads, in the order its ops take them: its own, named
  // "<name()>.…", and any of another block's it shares (a tied head lists "embed.wte").
  virtual std::vector<ParamSpec> Params() const = 0;
  // y = block(x). The embedding ignores x; the head's y is the per-token loss (B*T) f32.
  // `params` are the views of Params(), in order. With `saved` null the forward is an
  // evaluation's (no_grad): nothing is kept for backward and the head makes no gradient.
  virtual absl::Status Forward(Stream& s, const std::vector<Tensor>& params,
                               const MicroBatch& mb, const Tensor& x, Tensor* y,
                               Saved* saved) const = 0;
  // Backward in two parts, so that a schedule can defer the second (zero-bubble's W):
  // B: from dy (undefined for the head) computes dx (not for the embedding) and fills
  // `for_w` with what W reads: the inputs and output gradients of the linear layers (the
  // embedding's: dy; the head's: nothing, see below). W is the weight-gradient matmuls (and
  // their biases' sums), as in
  // zero-bubble's own implementation, which defers only the linear layers' weight gradients:
  // a LayerNorm's W would keep its input, output gradient and statistics for elementwise
  // work, so B ADDS the LayerNorms' parameter gradients into `grads` itself and leaves the
  // others alone. The head's B adds all of its gradients, and its W is empty: its W would
  // keep the logits' gradient, the largest stash of any block (model/blocks.cc). So with a
  // tied table, a stage holding both the head and the embedding gets Backward's bits only
  // with each W right after its B (the head's dW and the embedding's scatter-add go into
  // the same gradient); no schedule defers a W on such a stage (ZB-H1's first stage runs
  // whole backwards; interleaved 1F1B has no W).
  virtual absl::Status BackwardInput(Stream& s, const std::vector<Tensor>& params,
                                     const std::vector<Tensor>& grads, const MicroBatch& mb,
                                     const Tensor& dy, const Saved& saved, Tensor* dx,
                                     Saved* for_w) const = 0;
  // W: ADDS the other parameter gradients into `grads` (same order as params) from B's
  // `for_w`. Any number of other micro-batches' B and W may run between a micro-batch's B and its W;
  // the gradients are those of B then W, bit for bit, as long as the Bs keep their order and
  // the Ws theirs (each gradient is summed over the micro-batches in their order).
  virtual absl::Status BackwardWeights(Stream& s, const std::vector<Tensor>& params,
                                       const std::vector<Tensor>& grads, const MicroBatch& mb,
                                       const Saved& for_w) const = 0;
  // B then W: computes dx and ADDS the parameter gradients into `grads`.
  absl::Status Backward(Stream& s, const std::vector<Tensor>& params,
                        const std::vector<Tensor>& grads, const MicroBatch& mb, const Tensor& dy,
                        const Saved& saved, Tensor* dx) const;
  // The bytes Forward keeps for a micro-batch of B x T tokens computing in `compute`: its
  // output and what it saves for backward, not its input (the block before counts that).
  // Known from shapes alone, so a run's memory is checked before anything is allocated.
  virtual int64_t ActivationBytes(int64_t B, int64_t T, DType compute) const = 0;
  // The bytes a micro-batch's B keeps for its deferred W (`for_w`: the linear layers' output
  // gradients and inputs, the embedding's output gradient and tokens), counted whole even
  // where they are activations Forward kept, so as not to under-estimate a pending W.
  virtual int64_t WeightStashBytes(int64_t B, int64_t T, DType compute) const = 0;
  // The most Forward or Backward holds at once on top of the activations of the blocks up to
  // this one: the temporaries the block allocates, its input gradient included, and in
  // Backward the gradient it is given, less its output (which the next block's Backward freed
  // with the activations it saved; the head's output, the losses, stays), and the scratch its
  // ops allocate on `device`'s backend. With ActivationBytes, a lower bound of the peak.
  virtual int64_t WorkspaceBytes(int64_t B, int64_t T, DType compute, Device device) const = 0;
};

// The blocks of a GPT or an MLP for `config`, embedding first and head last; under tensor
// parallelism (tp.size > 1, a GPT only) this rank's parts of them (model/tensor_parallel.h),
// whose collectives run over tp.group.
std::vector<std::unique_ptr<Block>> BuildBlocks(const ModelConfig& config,
                                                const TensorParallel& tp = {});
// Whether a GPT of `config` splits over `size` tensor-parallel ranks: its heads, d_model and
// padded vocabulary divisible by it; one line naming what does not, and the fix.
absl::Status CheckTensorParallel(const ModelConfig& config, int size);

// The parameters a stage of blocks [begin, end) of `blocks` holds, in the order of its flat
// buffer, each once: a shared one (the tied "embed.wte") is one parameter where its owner is
// in the stage, and where only a borrower is (a pipeline's last stage), a copy that comes
// first, at offset 0. `block_params`, if given, receives for each block the indices of its
// Params() in the result.
std::vector<ParamSpec> StageParams(const std::vector<std::unique_ptr<Block>>& blocks, int begin,
                                   int end,
                                   std::vector<std::vector<size_t>>* block_params = nullptr);
// The same for a stage holding the blocks `held` (ascending; under an interleaved schedule,
// one range per model chunk), `block_params` in the order of `held`.
std::vector<ParamSpec> StageParams(const std::vector<std::unique_ptr<Block>>& blocks,
                                   const std::vector<int>& held,
                                   std::vector<std::vector<size_t>>* block_params = nullptr);

// For each of StageParams' `params` parameters (`block_params` as it returned them), the
// position in `held` of the block whose backward completes its gradient: backward runs the
// blocks last to first, so a parameter two blocks share (the tied table) is complete after
// the lower one; with `copy_first`, parameter 0 is a borrowed copy (a last stage's tied
// table), complete only once summed with its owner's after the whole backward: the first
// block's. Non-decreasing in the parameter's index.
std::vector<int> ParamOwners(const std::vector<std::vector<size_t>>& block_params, size_t params,
                             bool copy_first);

}  // namespace tandem

#endif  // TANDEM_MODEL_BLOCK_H_
