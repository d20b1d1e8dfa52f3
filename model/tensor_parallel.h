// Tensor parallelism inside a block (Megatron-LM's, megatron/core/tensor_parallel): the ranks
// of a tensor-parallel group each hold a slice of a block's weight matrices and compute their
// part of its output, and the group's collectives, stream-ordered, join the parts.
//   attention: the fused QKV projection column-parallel (each rank its heads), the output
//     projection row-parallel: the partial outputs all-reduced in forward, and the input's
//     gradient (the LayerNorm's output) all-reduced in backward;
//   MLP: fc column-parallel, proj row-parallel, the same two all-reduces;
//   token embedding vocabulary-parallel: each rank a slice of the table's rows, the looked-up
//     rows all-reduced (a token outside the slice gives zeros); the head and cross-entropy
//     vocabulary-parallel: each rank its slice of the logits, the rows' max and sum-exp
//     all-reduced, the full logits never gathered; its input's gradient all-reduced;
//   LayerNorms, biases after a row-parallel matmul and the position table are replicated:
//     their inputs and gradients are the same on every rank of the group, so their gradients
//     need no reduction (Megatron without sequence parallelism); with it (`sequence`) each
//     rank's LayerNorms see its rows alone, and B sums their gradients over the group.
// The B/W split of the zero-bubble schedules keeps the collectives in B: W is each rank's
// weight gradients alone.
#ifndef TANDEM_MODEL_TENSOR_PARALLEL_H_
#define TANDEM_MODEL_TENSOR_PARALLEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace tandem {

// The collectives a block issues over its tensor-parallel group, in place on `t`, ordered on
// the stream `s`: they run after the work issued to `s` before them, and work issued to `s`
// after them waits for them, without the host waiting. `what` names the collective in errors.
class TensorGroup {
 public:
  virtual ~TensorGroup() = default;
  virtual absl::Status AllReduceSum(Stream& s, const Tensor& t, const char* what) = 0;
  virtual absl::Status AllReduceMax(Stream& s, const Tensor& t, const char* what) = 0;
  // Sequence parallelism: `all` (T x mine's elements) receives every rank's `mine`, in rank
  // order; and `mine` receives this rank's block of the sum over ranks of `all`.
  virtual absl::Status AllGather(Stream& s, const Tensor& all, const Tensor& mine,
                                 const char* what) = 0;
  virtual absl::Status ReduceScatterSum(Stream& s, const Tensor& mine, const Tensor& all,
                                        const char* what) = 0;
};

// This rank's place in its tensor-parallel group. `group` may be null where nothing runs
// (the memory estimate, the planner): the blocks' shapes need only size and rank.
struct TensorParallel {
  int size = 1;  // T
  int rank = 0;
  TensorGroup* group = nullptr;
  // Sequence parallelism (size > 1): between the tensor-parallel regions each rank holds
  // 1 / size of the rows of the residual stream; the LayerNorms run on them, and each region's
  // all-reduce becomes an all-gather before it and a reduce-scatter after it.
  bool sequence = false;
  bool enabled() const { return size > 1; }
  // Whether the residual stream's rows are split (sequence parallelism), and of its n rows
  // those this rank holds.
  bool splits_rows() const { return enabled() && sequence; }
  int64_t RowsHeld(int64_t n) const { return splits_rows() ? n / size : n; }
};

}  // namespace tandem

#endif  // TANDEM_MODEL_TENSOR_PARALLEL_H_
