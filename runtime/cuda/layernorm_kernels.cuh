// The kernels of layernorm.cu, whose launchers stay there: text included inside
// tandem::ops::cuda by layernorm.cu and, on the host with CUDA's execution model emulated
// (runtime/cuda_emulation.h), by runtime/cuda_kernels_emulation_test.cc, so the same
// source is checked without a GPU. The includer provides device_functions.cuh first.

constexpr float kEps = 1e-5f;

// ---- kernels ----------------------------------------------------------------------------------

// One warp per row. Without kResidual: x = inp. With kResidual: x = inp + inp2, rounded to T
// and written to `residual` before it is normalized (so the result equals a separate add
// followed by LayerNorm of the stored residual).
// out, residual, inp, inp2: (N, C); mean, rstd: (N) or null; weight: (C); bias: (C) or null
template <typename T, int P, bool kResidual>
__global__ void LayerNormForwardKernel(T* out, float* mean, float* rstd, T* residual,
                                       const T* inp, const T* inp2, const T* weight,
                                       const T* bias, int64_t N, int C) {
  using Vec = Pack<T, P>;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = WarpRow();
  if (row >= N) return;  // whole warps leave together; no block-level sync below
  const int64_t base = row * C;
  // The row being normalized: the input, or the residual this warp writes in pass 1.
  const T* x = kResidual ? residual + base : inp + base;

  float sum = 0.0f;
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    Vec v;
    if constexpr (kResidual) {
      const Vec a = Vec::Load(inp + base + c);
      const Vec b = Vec::Load(inp2 + base + c);
#pragma unroll
      for (int j = 0; j < P; ++j) v[j] = FromF32<T>(ToF32(a[j]) + ToF32(b[j]));
      v.Store(residual + base + c);
    } else {
      v = Vec::Load(x + c);
    }
#pragma unroll
    for (int j = 0; j < P; ++j) sum += ToF32(v[j]);
  }
  // C = 0 gives mean 0 and rstd 1/sqrt(eps), as on the CPU (C is the same for the warp).
  const float m = C > 0 ? WarpSum(sum) / C : 0.0f;

  float var = 0.0f;
  for (int c = lane * P; c < C; c += kWarpSize * P) {
    const Vec v = Vec::Load(x + c);  // the same lane wrote these in pass 1: visible
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float d = ToF32(v[j]) - m;
      var += d * d;
    }
  }
  const float r = 1.0f / sqrtf((C > 0 ? WarpSum(var) / C : 0.0f) + kEps);
  if (lane == 0) {
    if (mean != nullptr) mean[row] = m;
    if (rstd != nullptr) rstd[row] = r;
  }

  for (int c = lane * P; c < C; c += kWarpSize * P) {
    const Vec v = Vec::Load(x + c);
    const Vec w = Vec::Load(weight + c);
    Vec b;
    if (bias != nullptr) b = Vec::Load(bias + c);
    Vec o;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float y = (ToF32(v[j]) - m) * r * ToF32(w[j]) + (bias != nullptr ? ToF32(b[j]) : 0.0f);
      o[j] = FromF32<T>(y);
    }
    o.Store(out + base + c);
  }
}

// Rows are spread over the grid's warps (grid-stride). Per row, with norm = (x - mean) * rstd
// and g = dout: dinp = (w g - mean(w g) - norm * mean(w g norm)) * rstd. dweight += g * norm
// and dbias += g are summed per block in shared memory (kShared), else added straight to the
// f32 accumulators.
// dinp, dout, inp: (N, C); weight: (C); mean, rstd: (N); acc_w, acc_b: (C) f32 or null
template <typename T, int P, bool kShared>
__global__ void LayerNormBackwardKernel(T* dinp, float* acc_w, float* acc_b, const T* dout,
                                        const T* inp, const T* weight, const float* mean,
                                        const float* rstd, int64_t N, int C) {
  using Vec = Pack<T, P>;
  // kShared: (2 * C) = dweight partials, then dbias partials
  float* smem = reinterpret_cast<float*>(DynamicShared());
  const bool want_w = acc_w != nullptr;
  const bool want_b = acc_b != nullptr;
  float* sum_w = kShared ? smem : acc_w;
  float* sum_b = kShared ? smem + C : acc_b;
  if constexpr (kShared) {
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) smem[i] = 0.0f;
    __syncthreads();
  }
  const int lane = threadIdx.x % kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / kWarpSize; row < N;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    const int64_t base = row * C;
    const float m = mean[row];
    const float r = rstd[row];
    float mean_wg = 0.0f, mean_wgn = 0.0f;
    for (int c = lane * P; c < C; c += kWarpSize * P) {
      const Vec g = Vec::Load(dout + base + c);
      const Vec x = Vec::Load(inp + base + c);
      const Vec w = Vec::Load(weight + c);
#pragma unroll
      for (int j = 0; j < P; ++j) {
        const float wg = ToF32(w[j]) * ToF32(g[j]);
        mean_wg += wg;
        mean_wgn += wg * (ToF32(x[j]) - m) * r;
      }
    }
    mean_wg = WarpSum(mean_wg) / C;
    mean_wgn = WarpSum(mean_wgn) / C;
    for (int c = lane * P; c < C; c += kWarpSize * P) {
      const Vec g = Vec::Load(dout + base + c);
      const Vec x = Vec::Load(inp + base + c);
      const Vec w = Vec::Load(weight + c);
      Vec d;
#pragma unroll
      for (int j = 0; j < P; ++j) {
        const float gj = ToF32(g[j]);
        const float norm = (ToF32(x[j]) - m) * r;
        d[j] = FromF32<T>((ToF32(w[j]) * gj - mean_wg - norm * mean_wgn) * r);
        if (want_w) atomicAdd(&sum_w[c + j], gj * norm);
        if (want_b) atomicAdd(&sum_b[c + j], gj);
      }
      if (dinp != nullptr) d.Store(dinp + base + c);
    }
  }
  if constexpr (kShared) {
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
      if (want_w) atomicAdd(&acc_w[i], sum_w[i]);
      if (want_b) atomicAdd(&acc_b[i], sum_b[i]);
    }
  }
}
