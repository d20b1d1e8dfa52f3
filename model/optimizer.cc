#include "model/optimizer.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "runtime/status.h"

namespace tandem {

absl::Status OptimizerConfig::Validate() const {
  if (kind != "adamw" && kind != "sgd") {
    return absl::InvalidArgumentError(
        absl::StrFormat("--optimizer=%s: use adamw or sgd", kind));
  }
  if (!(lr > 0) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(absl::StrFormat("--lr=%g: must be a positive number", lr));
  }
  if (warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--warmup=%d: must be 0 or more", warmup_steps));
  }
  if (!(weight_decay >= 0) || !std::isfinite(weight_decay)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--weight-decay=%g: must be a number, 0 or more", weight_decay));
  }
  if (!(clip_norm >= 0) || !std::isfinite(clip_norm)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--clip-norm=%g: must be a number, 0 (off) or more", clip_norm));
  }
  return absl::OkStatus();
}

float LearningRate(const OptimizerConfig& c, int step) {
  if (step < c.warmup_steps) return c.lr * (step + 1) / c.warmup_steps;
  const int decay_steps = std::max(1, c.total_steps - c.warmup_steps);
  const float progress = std::min(1.0f, float(step - c.warmup_steps) / decay_steps);
  const float min_lr = c.lr * c.min_lr_ratio;
  return min_lr + 0.5f * (c.lr - min_lr) * (1.0f + std::cos(3.14159265358979f * progress));
}

absl::StatusOr<Optimizer> Optimizer::Create(const OptimizerConfig& c, int64_t numel,
                                            Device device) {
  RETURN_IF_ERROR(c.Validate());
  Optimizer o;
  o.c_ = c;
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(device));
  ASSIGN_OR_RETURN(o.m_, Tensor::Empty({numel}, DType::kF32, device));
  RETURN_IF_ERROR(ZeroFill(o.m_, *s));
  if (c.kind == "adamw") {
    ASSIGN_OR_RETURN(o.v_, Tensor::Empty({numel}, DType::kF32, device));
    RETURN_IF_ERROR(ZeroFill(o.v_, *s));
  }
  RETURN_IF_ERROR(s->Synchronize());
  return o;
}

absl::Status Optimizer::Step(Stream& s, const Tensor& params, const Tensor& grads, int step,
                             float grad_scale, const Tensor& params_low,
                             const Tensor& device_scale, int64_t state_offset) {
  const float lr = LearningRate(c_, step);
  Tensor m = m_, v = v_;
  if (state_offset != 0 || params.numel() != m_.numel()) {
    ASSIGN_OR_RETURN(m, m_.View(state_offset, {params.numel()}));
    if (v_.defined()) {
      ASSIGN_OR_RETURN(v, v_.View(state_offset, {params.numel()}));
    }
  }
  if (c_.kind == "adamw") {
    ops::AdamWConfig a;
    a.lr = lr;
    a.beta1 = c_.beta1;
    a.beta2 = c_.beta2;
    a.eps = c_.eps;
    a.weight_decay = c_.weight_decay;
    a.step = step + 1;
    a.grad_scale = grad_scale;
    return ops::AdamWUpdate(s, params, grads, m, v, a, params_low, device_scale);
  }
  ops::SgdConfig g;
  g.lr = lr;
  g.momentum = c_.momentum;
  g.weight_decay = c_.weight_decay;
  g.grad_scale = grad_scale;
  return ops::SgdMomentumUpdate(s, params, grads, m, g, params_low, device_scale);
}

float ClipFactor(float sum_squares, float clip_norm) {
  if (clip_norm <= 0) return 1.0f;
  const float norm = std::sqrt(sum_squares);
  return norm > clip_norm ? clip_norm / (norm + 1e-6f) : 1.0f;
}

bool LossScaler::Update(bool found_inf) {
  if (!enabled_) return !found_inf;
  if (found_inf) {
    scale_ *= 0.5f;
    good_steps_ = 0;
    return false;
  }
  if (++good_steps_ >= growth_interval_) {
    scale_ *= 2.0f;
    good_steps_ = 0;
  }
  return true;
}

}  // namespace tandem
