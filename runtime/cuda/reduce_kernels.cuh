// The kernels of reduce.cu, whose launchers stay there: text included inside
// tandem::ops::cuda by reduce.cu and, on the host with CUDA's execution model emulated
// (runtime/cuda_emulation.h), by runtime/cuda_kernels_emulation_test.cc, so the same
// source is checked without a GPU. The includer provides device_functions.cuh first.

// ---- kernels ----------------------------------------------------------------------------------

// *out += sum of x (or of x^2 with kSquares); *out is f32.
// x: (n)
template <typename T, int P, bool kSquares>
__global__ void SumKernel(float* out, const T* x, int64_t n) {
  using Vec = Pack<T, P>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float acc = 0.0f;
  const int64_t packs = n / P;
  for (int64_t p = tid; p < packs; p += stride) {
    const Vec v = Vec::Load(x + p * P);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float f = ToF32(v[j]);
      acc += kSquares ? f * f : f;
    }
  }
  for (int64_t i = packs * P + tid; i < n; i += stride) {
    const float f = ToF32(x[i]);
    acc += kSquares ? f * f : f;
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

// dst[i] += src[i], in dst's dtype.
// dst, src: (n)
template <typename G>
__global__ void AccumulateKernel(G* dst, const float* src, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = FromF32<G>(ToF32(dst[i]) + src[i]);
  }
}
