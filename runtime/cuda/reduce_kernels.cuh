// The kernels of reduce.cu, whose launchers stay there: text included inside
// tandem::ops::cuda by reduce.cu and, on the host with CUDA's execution model emulated
// (runtime/cuda_emulation.h), by runtime/cuda_kernels_emulation_test.cc, so the same
// source is checked without a GPU. The includer provides device_functions.cuh first.

// ---- kernels ----------------------------------------------------------------------------------

// *out += sum of x (or of x^2 with kSquares); *out is f32.
// x: (n)
template <typename T, int P, bool kSquares>
__global__ void SumKernel(float* out, const T* x, int64_t n) {
  float acc = 0.0f;
  ForEachPack<P>(n, true, [&](auto w, int64_t i) {
    using Vec = Pack<T, decltype(w)::value>;
    const Vec v = Vec::Load(x + i);
#pragma unroll
    for (int j = 0; j < Vec::size; ++j) {
      const float f = ToF32(v[j]);
      acc += kSquares ? f * f : f;
    }
  });
  acc = BlockSum(acc);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

// dst[i] += src[i], in dst's dtype.
// dst, src: (n)
template <typename G>
__global__ void AccumulateKernel(G* dst, const float* src, int64_t n) {
  for (int64_t i = GridThread(); i < n; i += GridThreads()) {
    dst[i] = FromF32<G>(ToF32(dst[i]) + src[i]);
  }
}
