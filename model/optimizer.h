// Optimizers over a stage's flat buffers (AdamW with decoupled weight decay, SGD with
// momentum), the learning-rate schedule (linear warmup, then cosine decay to a floor),
// gradient clipping by global norm, and the dynamic loss scaler for f16 training.
#ifndef TANDEM_MODEL_OPTIMIZER_H_
#define TANDEM_MODEL_OPTIMIZER_H_

#include <cstdint>
#include <string>

#include <vector>

#include "absl/status/statusor.h"
#include "model/params.h"
#include "runtime/ops.h"
#include "runtime/tensor.h"

namespace tandem {

struct OptimizerConfig {
  std::string kind = "adamw";  // or "sgd"
  float lr = 1e-3f;            // peak learning rate
  float min_lr_ratio = 0.1f;   // cosine decays to lr * min_lr_ratio
  int warmup_steps = 0;
  int total_steps = 1;         // for the cosine
  float weight_decay = 0.0f;
  // Decay every parameter (biases, LayerNorm gains, position table too) instead of only the
  // 2-D weight matrices and the token embedding (DecaysByDefault in params.h).
  bool decay_all = false;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;  // AdamW
  float momentum = 0.9f;                          // SGD
  float clip_norm = 1.0f;      // clip gradients to this global L2 norm; 0 disables
  absl::Status Validate() const;
};

// Learning rate at 0-based `step`: linear warmup over warmup_steps, then cosine to the floor.
float LearningRate(const OptimizerConfig& c, int step);

class Optimizer {
 public:
  // State (f32, zero) on `device` for elements [begin, end) of `layout`'s flat buffer (all of
  // it, or a ZeRO shard); weight decay applies where DecayedRanges(layout, c.decay_all) says,
  // element by element, so a shard boundary may fall inside a parameter.
  static absl::StatusOr<Optimizer> Create(const OptimizerConfig& c, const ParamLayout& layout,
                                          int64_t begin, int64_t end, Device device);
  // State for `numel` parameters with no layout: weight decay applies to every element (as
  // torch.optim.AdamW over one parameter group).
  static absl::StatusOr<Optimizer> Create(const OptimizerConfig& c, int64_t numel,
                                          Device device);
  // One update at 0-based `step` with gradients multiplied by grad_scale first (unscaling
  // and clipping folded into one pass over memory), and by the device scalar device_scale
  // when defined (ops.h: not finite, the update is skipped). The state updated is elements
  // [state_offset, state_offset + params.numel()) of the optimizer's own (a part of a
  // ZeRO shard, updated bucket by bucket).
  // Decayed and undecayed runs of elements are updated by one call each.
  absl::Status Step(Stream& s, const Tensor& params, const Tensor& grads, int step,
                    float grad_scale, const Tensor& params_low = Tensor(),
                    const Tensor& device_scale = Tensor(), int64_t state_offset = 0);
  // The state tensors (AdamW: m, v; SGD: momentum, v undefined), for checkpoints.
  const Tensor& state0() const { return m_; }
  const Tensor& state1() const { return v_; }

 private:
  // Elements [state_offset, state_offset + n) from `first` of the tensors, with decay or not.
  absl::Status Update(Stream& s, const Tensor& params, const Tensor& grads,
                      const Tensor& params_low, const Tensor& device_scale, int64_t first,
                      int64_t state_offset, int64_t n, float lr, bool decay, int step,
                      float grad_scale);

  OptimizerConfig c_;
  Tensor m_, v_;
  std::vector<ElementRange> decayed_;  // in the state's coordinates
};

// The factor to multiply gradients by so their global L2 norm (sqrt(sum_squares)) is at
// most clip_norm; 1 when clipping is off or the norm is within bounds. (Training computes it
// on the device, ops::GradScale, with the same arithmetic.)
float ClipFactor(float sum_squares, float clip_norm);

// Dynamic loss scaling (as PyTorch's GradScaler): multiply the loss by scale(); after
// backward, if any gradient is inf/nan the step is skipped and the scale halved; after
// growth_interval clean steps in a row it doubles.
class LossScaler {
 public:
  LossScaler(bool enabled, float initial_scale = 65536.0f, int growth_interval = 2000)
      : enabled_(enabled), scale_(enabled ? initial_scale : 1.0f),
        growth_interval_(growth_interval) {}
  float scale() const { return scale_; }
  bool enabled() const { return enabled_; }
  int good_steps() const { return good_steps_; }
  // Records the outcome of a step; returns true when the optimizer step should be taken.
  bool Update(bool found_inf);
  // For checkpoints.
  void Restore(float scale, int good_steps) {
    scale_ = scale;
    good_steps_ = good_steps;
  }

 private:
  bool enabled_;
  float scale_;
  int growth_interval_;
  int good_steps_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_MODEL_OPTIMIZER_H_
