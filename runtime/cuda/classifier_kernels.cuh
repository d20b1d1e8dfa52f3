// The kernels of classifier.cu, whose launchers stay there: text included inside
// tandem::ops::cuda by classifier.cu and, on the host with CUDA's execution model emulated
// (runtime/cuda_emulation.h), by runtime/cuda_kernels_emulation_test.cc, so the same
// source is checked without a GPU. The includer provides device_functions.cuh first.

// ---- kernels ----------------------------------------------------------------------------------

// Block r handles row r. A target of -1 is ignored (loss 0, gradient 0); any other target
// outside [0, V) gives a nan loss and a zero gradient, so bad data cannot pass unnoticed.
// A row holds Vp logits, the first V the vocabulary's (llm.c's V and Vp): the softmax runs
// over those, and the padded columns [V, Vp) get a zero gradient.
// losses: (N) f32; dlogits: (N, Vp) or null; logits: (N, Vp); targets: (N) i32
template <typename T, int P>
__global__ void CrossEntropyKernel(float* losses, T* dlogits, const T* logits,
                                   const int32_t* targets, int V, int Vp, float dloss_scale) {
  using Vec = Pack<T, P>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * Vp;
  const int target = targets[blockIdx.x];
  const bool valid = target >= 0 && target < V;
  // Read before the block synchronizes in BlockRowMaxSum, i.e. before any dlogits write.
  const float target_logit = valid ? ToF32(logits[base + target]) : 0.0f;

  const MaxSum ms = BlockRowMaxSum<T, P>(logits + base, Vp, V);
  if (threadIdx.x == 0) {
    losses[blockIdx.x] = valid ? logf(ms.s) + ms.m - target_logit : (target == -1 ? 0.0f : NAN);
  }
  if (dlogits == nullptr) return;
  const float inv = 1.0f / ms.s;
  for (int c = threadIdx.x * P; c < Vp; c += blockDim.x * P) {
    const Vec v = Vec::Load(logits + base + c);
    Vec d;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float p = expf(ToF32(v[j]) - ms.m) * inv;
      const float onehot = c + j == target ? 1.0f : 0.0f;
      d[j] = FromF32<T>(valid && c + j < V ? (p - onehot) * dloss_scale : 0.0f);
    }
    d.Store(dlogits + base + c);
  }
}

// ---- vocabulary-parallel cross-entropy (ops.h: CrossEntropyRowMax and after) ------------------
// Block r handles row r of a rank's slice of the logits: Vl columns, of which the first
// `columns` are real; the slice holds tokens [vocab_begin, vocab_begin + Vl).

// max[r] = the row's largest real logit (-inf with none).
// max: (N) f32; logits: (N, Vl)
template <typename T, int P>
__global__ void CrossEntropyRowMaxKernel(float* max, const T* logits, int Vl, int columns) {
  const MaxSum ms = BlockRowMaxSum<T, P>(logits + static_cast<int64_t>(blockIdx.x) * Vl, Vl,
                                         columns);
  if (threadIdx.x == 0) max[blockIdx.x] = ms.m;
}

// partials[0][r] = sum of exp(logit - max[r]) over the real columns; partials[1][r] = the
// target's logit where the target is in the slice, else 0.
// partials: (2, N) f32; logits: (N, Vl); max: (N) f32; targets: (N) i32
template <typename T, int P>
__global__ void CrossEntropyPartialsKernel(float* partials, const T* logits, const float* max,
                                           const int32_t* targets, int64_t N, int Vl,
                                           int columns, int vocab_begin) {
  using Vec = Pack<T, P>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * Vl;
  const float m = max[blockIdx.x];
  float sum = 0.0f;
  for (int c = threadIdx.x * P; c < Vl; c += blockDim.x * P) {
    const Vec v = Vec::Load(logits + base + c);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (c + j < columns) sum += expf(ToF32(v[j]) - m);
    }
  }
  sum = BlockSum(sum);
  if (threadIdx.x != 0) return;
  const int col = targets[blockIdx.x] - vocab_begin;
  partials[blockIdx.x] = sum;
  partials[N + blockIdx.x] =
      targets[blockIdx.x] >= 0 && col >= 0 && col < columns ? ToF32(logits[base + col]) : 0.0f;
}

// losses[r] = log(sum) + max - target's logit; dlogits (may be logits) = (softmax - onehot) *
// dloss_scale over the real columns, 0 over the padding; a target of -1: loss 0, gradient 0.
template <typename T, int P>
__global__ void VocabParallelCrossEntropyKernel(float* losses, T* dlogits, const T* logits,
                                                const float* max, const float* partials,
                                                const int32_t* targets, int64_t N, int Vl,
                                                int columns, int vocab_begin,
                                                float dloss_scale) {
  using Vec = Pack<T, P>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * Vl;
  const int target = targets[blockIdx.x];
  const float m = max[blockIdx.x], s = partials[blockIdx.x];
  if (threadIdx.x == 0) {
    losses[blockIdx.x] = target >= 0 ? logf(s) + m - partials[N + blockIdx.x] : 0.0f;
  }
  if (dlogits == nullptr) return;
  const float inv = 1.0f / s;
  const int col = target - vocab_begin;
  for (int c = threadIdx.x * P; c < Vl; c += blockDim.x * P) {
    const Vec v = Vec::Load(logits + base + c);
    Vec d;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float p = expf(ToF32(v[j]) - m) * inv;
      const float onehot = c + j == col ? 1.0f : 0.0f;
      d[j] = FromF32<T>(target >= 0 && c + j < columns ? (p - onehot) * dloss_scale : 0.0f);
    }
    d.Store(dlogits + base + c);
  }
}
