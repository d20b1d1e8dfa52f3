// The kernels of attention.cu, whose launchers stay there: text included inside
// tandem::ops::cuda by attention.cu and, on the host with CUDA's execution model emulated
// (runtime/cuda_emulation.h), by runtime/cuda_kernels_emulation_test.cc, so the same
// source is checked without a GPU. The includer provides device_functions.cuh first.

// ---- kernels ----------------------------------------------------------------------------------

// Moves S sections between the token-major layout rows (B, T, S * C), section s at columns
// [s * C, (s + 1) * C) with head h at [h * hs, (h + 1) * hs), and head-major buffers
// heads[s] (B, NH, T, hs); kToHeads gathers, else scatters. P elements move per step
// (hs % P == 0, so a pack never crosses a head).
template <typename E, int P, bool kToHeads>
__global__ void PermuteKernel(E* rows, E* h0, E* h1, E* h2, int S, int B, int T, int NH,
                              int hs) {
  using Vec = Pack<E, P>;
  const int64_t C = static_cast<int64_t>(NH) * hs;
  const int64_t total = static_cast<int64_t>(B) * NH * T * hs;  // per section
  for (int64_t p = GridThread(); p < total / P; p += GridThreads()) {
    const int64_t idx = p * P;  // into heads[s], (b, h, t, d)
    const int d = static_cast<int>(idx % hs);
    int64_t r = idx / hs;
    const int t = static_cast<int>(r % T);
    r /= T;
    const int h = static_cast<int>(r % NH);
    const int64_t b = r / NH;
    const int64_t row_idx = (b * T + t) * (S * C) + static_cast<int64_t>(h) * hs + d;
    for (int s = 0; s < S; ++s) {
      E* head = s == 0 ? h0 : (s == 1 ? h1 : h2);
      if (kToHeads) {
        Vec::Load(rows + row_idx + s * C).Store(head + idx);
      } else {
        Vec::Load(head + idx).Store(rows + row_idx + s * C);
      }
    }
  }
}

// In place on raw scores att[row, :] (row = (b, h, t)): att[j] = softmax_j(scale * att[j])
// over j <= t and 0 for j > t; att_low (if not null) gets the same values rounded to E, lse
// (if not null) each row's log-sum-exp of scale * att.
// att: (rows, T) f32; att_low: (rows, T); lse: (rows) f32
template <typename E>
__global__ void CausalSoftmaxKernel(float* att, E* att_low, float* lse, int T, int64_t rows,
                                    float scale) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = WarpRow();
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  float* a = att + row * T;
  MaxSum ms = MaxSumEmpty();
  for (int j = lane; j <= t; j += kWarpSize) ms = MaxSumAdd(ms, scale * a[j]);
  ms = WarpMaxSum(ms);
  if (lse != nullptr && lane == 0) lse[row] = ms.m + logf(ms.s);
  const float inv = 1.0f / ms.s;
  for (int j = lane; j < T; j += kWarpSize) {
    const float p = j <= t ? expf(scale * a[j] - ms.m) * inv : 0.0f;
    a[j] = p;
    if (att_low != nullptr) att_low[row * T + j] = FromF32<E>(p);
  }
}

// In place on raw scores att[row, :]: att[j] = exp(scale * att[j] - lse[row]) for j <= t, else
// 0: the probabilities of the forward, recomputed from its log-sum-exp.
// att: (rows, T) f32; lse: (rows) f32
__global__ void ProbsFromLseKernel(float* att, const float* lse, int T, int64_t rows,
                                   float scale) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = WarpRow();
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  float* a = att + row * T;
  const float l = lse[row];
  for (int j = lane; j < T; j += kWarpSize) a[j] = j <= t ? expf(scale * a[j] - l) : 0.0f;
}

// dpre[row, j] = scale * att[j] * (datt[j] - sum_{i <= t} att[i] datt[i]) for j <= t, else 0
// (the gradient with respect to the unscaled scores). dpre may be datt itself. att_low (if
// not null) gets att rounded to E, zeros above the diagonal.
// dpre, att_low: (rows, T); datt, att: (rows, T) f32
template <typename E>
__global__ void CausalSoftmaxBackwardKernel(E* dpre, E* att_low, const float* datt,
                                            const float* att, int T, int64_t rows, float scale) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = WarpRow();
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  const float* a = att + row * T;
  const float* g = datt + row * T;
  float dot = 0.0f;
  for (int j = lane; j <= t; j += kWarpSize) dot += a[j] * g[j];
  dot = WarpSum(dot);  // every lane has read its g[j] before any lane writes dpre below
  for (int j = lane; j < T; j += kWarpSize) {
    const bool causal = j <= t;
    const float aj = causal ? a[j] : 0.0f;
    const float d = causal ? scale * aj * (g[j] - dot) : 0.0f;
    dpre[row * T + j] = FromF32<E>(d);
    if (att_low != nullptr) att_low[row * T + j] = FromF32<E>(aj);
  }
}

// One query over a key/value cache (generation), one block per head: the head's k and v of
// qkv are written to cache row `pos`, then the block's threads score keys 0..pos (a thread a
// key), merge the softmax statistics across the block, and each thread sums one output
// dimension over the keys. Dynamic shared memory: hs floats of q, then pos + 1 probabilities.
// out: (C); k_cache, v_cache: (NH, max_t, hs); qkv: (3C) = [q | k | v]
template <typename E>
__global__ void CachedAttentionKernel(E* out, E* k_cache, E* v_cache, const E* qkv, int pos,
                                      int max_t, int NH, int hs, float scale) {
  float* q = reinterpret_cast<float*>(DynamicShared());  // (hs)
  float* p = q + hs;                                     // (pos + 1)
  const int h = blockIdx.x;
  const int64_t C = static_cast<int64_t>(NH) * hs;
  E* kc = k_cache + static_cast<int64_t>(h) * max_t * hs;
  E* vc = v_cache + static_cast<int64_t>(h) * max_t * hs;
  const E* qh = qkv + static_cast<int64_t>(h) * hs;
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    kc[static_cast<int64_t>(pos) * hs + d] = qh[C + d];
    vc[static_cast<int64_t>(pos) * hs + d] = qh[2 * C + d];
    q[d] = ToF32(qh[d]);
  }
  __syncthreads();  // the new row and q are read by every thread below
  MaxSum ms = MaxSumEmpty();
  for (int j = threadIdx.x; j <= pos; j += blockDim.x) {
    const E* k = kc + static_cast<int64_t>(j) * hs;
    float dot = 0.0f;
    for (int d = 0; d < hs; ++d) dot += q[d] * ToF32(k[d]);
    p[j] = scale * dot;
    ms = MaxSumAdd(ms, p[j]);
  }
  ms = BlockMaxSum(ms);  // synchronizes: every score is written
  const float inv = 1.0f / ms.s;
  for (int j = threadIdx.x; j <= pos; j += blockDim.x) p[j] = expf(p[j] - ms.m) * inv;
  __syncthreads();
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j <= pos; ++j) acc += p[j] * ToF32(vc[static_cast<int64_t>(j) * hs + d]);
    out[static_cast<int64_t>(h) * hs + d] = FromF32<E>(acc);
  }
}
