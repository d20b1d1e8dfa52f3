// The kernels of optimizer.cu, whose launchers stay there: text included inside
// tandem::ops::cuda by optimizer.cu and, on the host with CUDA's execution model emulated
// (runtime/cuda_emulation.h), by runtime/cuda_kernels_emulation_test.cc, so the same
// source is checked without a GPU. The includer provides device_functions.cuh first, and
// runtime/ops.h and <cmath>.

constexpr int kVec = 4;

struct AdamWArgs {
  float lr, beta1, beta2, eps, grad_scale;
  float decay;                               // lr * weight_decay
  float bias_correction1, bias_correction2;  // 1 - beta^step
};

struct SgdArgs {
  float lr, momentum, weight_decay, grad_scale;
};

// The kernels' arguments from the ops' configurations (the bias corrections on the host).
inline AdamWArgs AdamWArgsOf(const AdamWConfig& c) {
  AdamWArgs a;
  a.lr = c.lr;
  a.beta1 = c.beta1;
  a.beta2 = c.beta2;
  a.eps = c.eps;
  a.grad_scale = c.grad_scale;
  a.decay = c.lr * c.weight_decay;
  a.bias_correction1 = 1.0f - std::pow(c.beta1, static_cast<float>(c.step));
  a.bias_correction2 = 1.0f - std::pow(c.beta2, static_cast<float>(c.step));
  return a;
}
inline SgdArgs SgdArgsOf(const SgdConfig& c) {
  return {c.lr, c.momentum, c.weight_decay, c.grad_scale};
}

// Threads a launch needs: one per pack of kVec and per element of the tail, whichever is more.
inline int64_t WorkItems(bool vec, int64_t n) {
  return vec ? std::max<int64_t>(n / kVec, n % kVec) : n;
}

__device__ __forceinline__ float AdamWStep(const AdamWArgs& a, float p, float g, float* m,
                                           float* v) {
  g *= a.grad_scale;
  *m = a.beta1 * *m + (1.0f - a.beta1) * g;
  *v = a.beta2 * *v + (1.0f - a.beta2) * g * g;
  const float m_hat = *m / a.bias_correction1;
  const float v_hat = *v / a.bias_correction2;
  // Decoupled weight decay, in the CPU backend's order of operations.
  return p - (a.lr * (m_hat / (sqrtf(v_hat) + a.eps)) + a.decay * p);
}

__device__ __forceinline__ float SgdStep(const SgdArgs& a, float p, float g, float* buf) {
  *buf = a.momentum * *buf + (g * a.grad_scale + a.weight_decay * p);
  return p - a.lr * *buf;
}

// True when x is neither infinite nor nan (x - x is nan for both).
__device__ __forceinline__ bool IsFinite(float x) { return x - x == 0.0f; }

// The device scale of an update (GradScale's), read by every thread: multiplies the
// gradients; not finite, the update is skipped. The CPU backend's arithmetic: 1 * scale.
__device__ __forceinline__ bool ApplyDeviceScale(const float* scale, float* grad_scale) {
  if (scale == nullptr) return true;
  const float s = *scale;
  if (!IsFinite(s)) return false;
  *grad_scale *= s;
  return true;
}

// ---- kernels ----------------------------------------------------------------------------------

// scale (1) = unscale * the clipping factor of sqrt(sumsq * unscale^2), or nan when that is
// not finite; one thread, in the CPU backend's order of operations.
__global__ void GradScaleKernel(float* scale, const float* sumsq, float unscale,
                                float clip_norm) {
  const float norm_sq = *sumsq * unscale * unscale;
  float out = NAN;
  if (IsFinite(norm_sq)) {
    const float norm = sqrtf(norm_sq);
    const float clip = clip_norm > 0 && norm > clip_norm ? clip_norm / (norm + 1e-6f) : 1.0f;
    out = unscale * clip;
  }
  *scale = out;
}

// params, grads, m, v: (n) f32; low: (n) bf16/f16 or null; scale: (1) f32 or null
template <typename L, bool kVector>
__global__ void AdamWKernel(float* params, const float* grads, float* m, float* v, L* low,
                            int64_t n, AdamWArgs a, const float* scale) {
  if (!ApplyDeviceScale(scale, &a.grad_scale)) return;
  ForEachPack<kVec>(n, kVector, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    using F = Pack<float, W>;
    F ps = F::Load(params + i);
    const F gs = F::Load(grads + i);
    F ms = F::Load(m + i);
    F vs = F::Load(v + i);
    Pack<L, W> ls;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      ps[j] = AdamWStep(a, ps[j], gs[j], &ms[j], &vs[j]);
      ls[j] = FromF32<L>(ps[j]);
    }
    ps.Store(params + i);
    ms.Store(m + i);
    vs.Store(v + i);
    if (low != nullptr) ls.Store(low + i);
  });
}

// params, grads, buf: (n) f32; low: (n) bf16/f16 or null; scale: (1) f32 or null
template <typename L, bool kVector>
__global__ void SgdKernel(float* params, const float* grads, float* buf, L* low, int64_t n,
                          SgdArgs a, const float* scale) {
  if (!ApplyDeviceScale(scale, &a.grad_scale)) return;
  ForEachPack<kVec>(n, kVector, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    using F = Pack<float, W>;
    F ps = F::Load(params + i);
    const F gs = F::Load(grads + i);
    F bs = F::Load(buf + i);
    Pack<L, W> ls;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      ps[j] = SgdStep(a, ps[j], gs[j], &bs[j]);
      ls[j] = FromF32<L>(ps[j]);
    }
    ps.Store(params + i);
    bs.Store(buf + i);
    if (low != nullptr) ls.Store(low + i);
  });
}
