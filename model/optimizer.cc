#include "model/optimizer.h"

#include <algorithm>
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
  o.decayed_ = {{0, numel}};
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

absl::StatusOr<Optimizer> Optimizer::Create(const OptimizerConfig& c, const ParamLayout& layout,
                                            int64_t begin, int64_t end, Device device) {
  ASSIGN_OR_RETURN(Optimizer o, Create(c, end - begin, device));
  o.decayed_.clear();
  for (const ElementRange& r : DecayedRanges(layout, c.decay_all)) {
    const int64_t lo = std::max(r.begin, begin), hi = std::min(r.end, end);
    if (hi > lo) o.decayed_.push_back({lo - begin, hi - begin});
  }
  return o;
}

absl::Status Optimizer::Step(Stream& s, const Tensor& params, const Tensor& grads, int step,
                             float grad_scale, const Tensor& params_low,
                             const Tensor& device_scale, int64_t state_offset) {
  const float lr = LearningRate(c_, step);
  const int64_t end = state_offset + params.numel();
  // Runs of decayed and undecayed elements alternate; without decay one run covers them all.
  int64_t at = state_offset;
  if (c_.weight_decay == 0) {
    return Update(s, params, grads, params_low, device_scale, 0, at, end - at, lr, false, step,
                  grad_scale);
  }
  for (const ElementRange& r : decayed_) {
    if (r.end <= at) continue;
    if (at >= end) break;
    const int64_t lo = std::min(std::max(r.begin, at), end), hi = std::min(r.end, end);
    if (lo > at) {
      RETURN_IF_ERROR(Update(s, params, grads, params_low, device_scale, at - state_offset, at,
                             lo - at, lr, false, step, grad_scale));
    }
    if (hi > lo) {
      RETURN_IF_ERROR(Update(s, params, grads, params_low, device_scale, lo - state_offset, lo,
                             hi - lo, lr, true, step, grad_scale));
    }
    at = std::max(at, hi);
  }
  if (at < end) {
    RETURN_IF_ERROR(Update(s, params, grads, params_low, device_scale, at - state_offset, at,
                           end - at, lr, false, step, grad_scale));
  }
  return absl::OkStatus();
}

absl::Status Optimizer::Update(Stream& s, const Tensor& params, const Tensor& grads,
                               const Tensor& params_low, const Tensor& device_scale,
                               int64_t first, int64_t state_offset, int64_t n, float lr,
                               bool decay, int step, float grad_scale) {
  auto part = [&](const Tensor& t, int64_t offset) -> absl::StatusOr<Tensor> {
    if (!t.defined() || (offset == 0 && t.numel() == n)) return t;
    return t.View(offset, {n});
  };
  ASSIGN_OR_RETURN(Tensor p, part(params, first));
  ASSIGN_OR_RETURN(Tensor g, part(grads, first));
  ASSIGN_OR_RETURN(Tensor low, part(params_low, first));
  ASSIGN_OR_RETURN(Tensor m, part(m_, state_offset));
  ASSIGN_OR_RETURN(Tensor v, part(v_, state_offset));
  const float weight_decay = decay ? c_.weight_decay : 0.0f;
  if (c_.kind == "adamw") {
    ops::AdamWConfig a;
    a.lr = lr;
    a.beta1 = c_.beta1;
    a.beta2 = c_.beta2;
    a.eps = c_.eps;
    a.weight_decay = weight_decay;
    a.step = step + 1;
    a.grad_scale = grad_scale;
    return ops::AdamWUpdate(s, p, g, m, v, a, low, device_scale);
  }
  ops::SgdConfig g_config;
  g_config.lr = lr;
  g_config.momentum = c_.momentum;
  g_config.weight_decay = weight_decay;
  g_config.grad_scale = grad_scale;
  return ops::SgdMomentumUpdate(s, p, g, m, g_config, low, device_scale);
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
