// The kernels of softmax.cu, whose launchers stay there: text included inside
// tandem::ops::cuda by softmax.cu and, on the host with CUDA's execution model emulated
// (runtime/cuda_emulation.h), by runtime/cuda_kernels_emulation_test.cc, so the same
// source is checked without a GPU. The includer provides device_functions.cuh first.

// ---- kernels ----------------------------------------------------------------------------------

// out[r, :] = exp(inp[r, :] - max) / sum(exp(inp[r, :] - max)); block r does row r.
// out, inp: (N, C)
template <typename T, int P>
__global__ void SoftmaxForwardKernel(T* out, const T* inp, int C) {
  using Vec = Pack<T, P>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * C;
  const MaxSum ms = BlockRowMaxSum<T, P>(inp + base, C);
  const float inv = 1.0f / ms.s;
  for (int c = threadIdx.x * P; c < C; c += blockDim.x * P) {
    const Vec v = Vec::Load(inp + base + c);
    Vec o;
#pragma unroll
    for (int j = 0; j < P; ++j) o[j] = FromF32<T>(expf(ToF32(v[j]) - ms.m) * inv);
    o.Store(out + base + c);
  }
}

// dinp = out * (dout - sum(dout * out)) per row; dinp may be dout (read before written).
// dinp, out, dout: (N, C)
template <typename T, int P>
__global__ void SoftmaxBackwardKernel(T* dinp, const T* out, const T* dout, int C) {
  using Vec = Pack<T, P>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * C;
  float dot = 0.0f;
  for (int c = threadIdx.x * P; c < C; c += blockDim.x * P) {
    const Vec y = Vec::Load(out + base + c);
    const Vec g = Vec::Load(dout + base + c);
#pragma unroll
    for (int j = 0; j < P; ++j) dot += ToF32(y[j]) * ToF32(g[j]);
  }
  dot = BlockSum(dot);
  for (int c = threadIdx.x * P; c < C; c += blockDim.x * P) {
    const Vec y = Vec::Load(out + base + c);
    const Vec g = Vec::Load(dout + base + c);
    Vec d;
#pragma unroll
    for (int j = 0; j < P; ++j) d[j] = FromF32<T>(ToF32(y[j]) * (ToF32(g[j]) - dot));
    d.Store(dinp + base + c);
  }
}
