#include "model/memory.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "model/block.h"
#include "runtime/allocator.h"
#include "runtime/format.h"
#include "runtime/ops.h"
#include "runtime/status.h"

namespace tandem {

MemoryNeed& MemoryNeed::operator+=(const MemoryNeed& o) {
  params += o.params;
  grads += o.grads;
  optimizer += o.optimizer;
  activations += o.activations;
  workspace += o.workspace;
  in_flight = std::max(in_flight, o.in_flight);
  pending_weights = std::max(pending_weights, o.pending_weights);
  return *this;
}

MemoryNeed EstimateStageMemory(const ModelConfig& model, int begin, int end, int64_t rows,
                               int in_flight, bool recompute, DType compute,
                               absl::string_view optimizer, Device device,
                               int pending_weights, const TensorParallel& tp) {
  // Under tensor parallelism one rank's parts of the blocks (every rank's are the same size).
  const std::vector<std::unique_ptr<Block>> blocks = BuildBlocks(model, tp);
  // What crosses a stage boundary for a micro-batch: (rows, T, C) in the compute dtype, under
  // sequence parallelism this rank's rows of it.
  const int64_t boundary = tp.RowsHeld(rows * model.seq_len) * model.d_model *
                           static_cast<int64_t>(DTypeSize(compute));
  // A stage that ends before the head sends its output on and keeps none of it; in backward
  // its last block is given the gradient of that output (so nothing is replaced by it).
  const bool sends = end < model.num_blocks();
  int64_t numel = 0, activations = 0, workspace = 0, after = 0, stash = 0;
  // Backward frees each block's activations once it ran, and forward has not made the later
  // blocks' yet: a block's temporaries come on top of the activations of the blocks up to it.
  // A B whose W is deferred (pending_weights > 0) frees only what the later blocks' stashes
  // do not keep.
  for (int b = end - 1; b >= begin; --b) {
    const bool last_sent = sends && b == end - 1;
    const int64_t kept =
        blocks[b]->ActivationBytes(rows, model.seq_len, compute) - (last_sent ? boundary : 0);
    const int64_t temporaries = blocks[b]->WorkspaceBytes(rows, model.seq_len, compute, device) +
                                (last_sent ? boundary : 0);
    const int64_t stashed = blocks[b]->WeightStashBytes(rows, model.seq_len, compute);
    workspace = std::max(workspace, temporaries - after);
    after += pending_weights > 0 ? std::max<int64_t>(0, kept - stashed) : kept;
    activations += kept;
    stash += stashed;
  }
  // The stage's parameters each once; a last stage's copy of the tied table counts.
  for (const ParamSpec& p : StageParams(blocks, begin, end)) numel += p.shape.numel();
  MemoryNeed n;
  n.params =
      numel * 4 + (compute == DType::kF32 ? 0 : numel * static_cast<int64_t>(DTypeSize(compute)));
  n.grads = numel * 4;
  n.optimizer = numel * 4 * (optimizer == "adamw" ? 2 : 1);
  // A stage after the first also holds the input it received for each micro-batch (its
  // first block saves it; ActivationBytes counts it with the block before).
  const int64_t input = begin > 0 ? boundary : 0;
  n.in_flight = in_flight;
  // Recomputing keeps only the inputs, and one micro-batch's activations during its backward.
  n.activations = in_flight * input + (recompute ? 1 : in_flight) * activations +
                  int64_t{pending_weights} * stash;
  n.pending_weights = pending_weights;
  // The matmuls' workspace stays allocated from the first step on.
  n.workspace = workspace + ops::MatmulWorkspaceBytes(device);
  return n;
}

absl::Status CheckMemory(const MemoryNeed& need, int64_t available, absl::string_view who,
                         absl::string_view where) {
  if (available < 0 || need.total() <= available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "not enough memory for %s: at least %s is needed (parameters %s, gradients %s, "
      "optimizer state %s, activations %s for %d micro-batch%s held at once, temporaries %s) "
      "and %s has %s available",
      who, FormatBytes(need.total()), FormatBytes(need.params), FormatBytes(need.grads),
      FormatBytes(need.optimizer), FormatBytes(need.activations), need.in_flight,
      need.in_flight == 1 ? "" : "es", FormatBytes(need.workspace), where, FormatBytes(available)));
}

absl::StatusOr<MemoryCheck> CheckDeviceMemory(const MemoryNeed& need, Device device,
                                              absl::string_view who) {
  const MemoryCheck m{need, device, AllocatableBytes(device)};
  RETURN_IF_ERROR(CheckMemory(need, m.available, who, device.ToString()));
  return m;
}

std::string DescribeMemory(const MemoryCheck& m) {
  const MemoryNeed& n = m.need;
  return absl::StrFormat(
      "at least %s (model state %s, activations %s, temporaries %s); %s had %s available",
      FormatBytes(n.total()), FormatBytes(n.params + n.grads + n.optimizer),
      FormatBytes(n.activations), FormatBytes(n.workspace), m.device.ToString(),
      FormatBytes(m.available));
}

absl::Status ExplainOutOfMemory(const absl::Status& s, char dash) {
  if (s.code() != absl::StatusCode::kResourceExhausted ||
      !(absl::StrContains(s.message(), "out of memory") ||
        absl::StartsWith(s.message(), "not enough memory") ||
        absl::StrContains(s.message(), "cudaErrorMemoryAllocation"))) {
    return s;
  }
  // The launcher's pipelines hold several micro-batches at once; examples/train, one.
  const char* pipeline =
      dash == '-' ? " (a GPipe pipeline holds them all: there --schedule=1f1b or --recompute)" : "";
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s. To need less memory: a smaller --batch or --seq%clen, more --micro%cbatches (the "
      "same batch in smaller pieces)%s, or --attention=flash (no T x T probabilities kept)",
      s.message(), dash, dash, pipeline));
}

}  // namespace tandem
