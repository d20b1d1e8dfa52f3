// What a stage must hold during a training step, known from shapes before anything is
// allocated, so that a run that cannot fit is refused with the figures instead of failing
// (or being killed) part way into its first step.
#ifndef TANDEM_MODEL_MEMORY_H_
#define TANDEM_MODEL_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace tandem {

// A lower bound: the model state, the activations kept for backward and the most the blocks'
// temporaries and their ops' scratch add to them at any moment; communication buffers, the
// first step's matmul algorithm trials and the allocator's rounding come on top.
struct MemoryNeed {
  int64_t params = 0;       // f32 master weights, and their 16-bit copy under bf16/f16
  int64_t grads = 0;        // f32
  int64_t optimizer = 0;    // AdamW: two f32 moments; SGD: one f32 momentum
  int64_t activations = 0;  // kept for backward by the micro-batches held at once
  int64_t workspace = 0;    // temporaries and op scratch on top of the activations, at peak
  int in_flight = 1;        // micro-batches whose activations are held at once
  int pending_weights = 0;  // micro-batches whose deferred W (zero-bubble) is pending at once
  int64_t total() const { return params + grads + optimizer + activations + workspace; }
  // Adds another worker's need on the same memory: all of it, temporaries too (each worker's
  // caching allocator keeps what it took at its peak, and replicas peak at the same time);
  // in_flight is the most of the two.
  MemoryNeed& operator+=(const MemoryNeed& o);
};

// Blocks [begin, end) of `model` trained on `device` on micro-batches of `rows` samples
// computing in `compute` with `optimizer` ("adamw" or "sgd"), `in_flight` micro-batches held
// at once (with `recompute`, their inputs and one micro-batch's activations), and what
// `pending_weights` micro-batches' deferred Ws keep (Block::WeightStashBytes), added to the
// activations (and with any, a B keeps its later blocks' stashes while it runs the earlier
// ones, which the temporaries count). The device decides the ops' scratch. Under tensor
// parallelism (tp.size > 1; its group unused), what one rank holds of it.
MemoryNeed EstimateStageMemory(const ModelConfig& model, int begin, int end, int64_t rows,
                               int in_flight, bool recompute, DType compute,
                               absl::string_view optimizer, Device device,
                               int pending_weights = 0, const TensorParallel& tp = {});

// OK when `need` fits in `available` bytes (or available is unknown, < 0); otherwise
// ResourceExhausted, one line: "not enough memory for <who>: at least ... is needed (...) and
// <where> has ... available".
absl::Status CheckMemory(const MemoryNeed& need, int64_t available, absl::string_view who,
                         absl::string_view where);

// A step's need, checked against what its device had before anything was allocated.
struct MemoryCheck {
  MemoryNeed need;
  Device device = Device::Cpu();
  int64_t available = -1;  // -1: unknown
};

// CheckMemory against what `device` can still allocate (AllocatableBytes).
absl::StatusOr<MemoryCheck> CheckDeviceMemory(const MemoryNeed& need, Device device,
                                              absl::string_view who);

// "at least 26 MB (model state 6.7 MB, activations 18 MB, temporaries 1.1 MB); cpu had 22.1 GB
// available", for logs.
std::string DescribeMemory(const MemoryCheck& m);

// `s` with what lowers a step's memory appended when it says memory ran short (CheckMemory's
// refusal, the allocator's "out of memory", CUDA's cudaErrorMemoryAllocation); any other
// status as it is. `dash` spells the binary's flags: '-' (launcher) or '_' (examples/train).
absl::Status ExplainOutOfMemory(const absl::Status& s, char dash);

}  // namespace tandem

#endif  // TANDEM_MODEL_MEMORY_H_
