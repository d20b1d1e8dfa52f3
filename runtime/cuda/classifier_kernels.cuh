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
