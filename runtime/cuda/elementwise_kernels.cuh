// The kernels of elementwise.cu, whose launchers stay there: text included inside
// tandem::ops::cuda by elementwise.cu and, on the host with CUDA's execution model emulated
// (runtime/cuda_emulation.h), by runtime/cuda_kernels_emulation_test.cc, so the same
// source is checked without a GPU. The includer provides device_functions.cuh first.

// ---- kernels ----------------------------------------------------------------------------------

struct GeluOp {
  __device__ float operator()(float x, float) const { return Gelu(x); }
};
struct GeluBackwardOp {  // (inp, dout)
  __device__ float operator()(float x, float g) const { return g * GeluGrad(x); }
};
struct ReluOp {  // a nan stays a nan (the CPU backend's rule), so overflow checks see it
  __device__ float operator()(float x, float) const { return x < 0.0f ? 0.0f : x; }
};
struct ReluBackwardOp {  // (out, dout)
  __device__ float operator()(float y, float g) const { return y > 0.0f ? g : 0.0f; }
};
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct AxpyOp {  // (y, x)
  float alpha;
  __device__ float operator()(float y, float x) const { return y + alpha * x; }
};
struct ScaleOp {
  float alpha;
  __device__ float operator()(float x, float) const { return alpha * x; }
};
struct FillOp {
  float value;
  __device__ float operator()(float, float) const { return value; }
};

// out[i] = op(in0[i], in1[i]) for i < n, reading the first kInputs inputs.
// out, in0, in1: (n)
template <typename T, int kInputs, typename Op>
__global__ void MapKernel(T* out, const T* in0, const T* in1, int64_t n, bool vec, Op op) {
  using P = Packed128<T>;
  constexpr int V = P::size;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if (vec) {
    const int64_t packs = n / V;
    for (int64_t p = tid; p < packs; p += stride) {
      P a, b, o;
      if constexpr (kInputs >= 1) a = P::Load(in0 + p * V);
      if constexpr (kInputs >= 2) b = P::Load(in1 + p * V);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float x0 = 0.0f, x1 = 0.0f;
        if constexpr (kInputs >= 1) x0 = ToF32(a[j]);
        if constexpr (kInputs >= 2) x1 = ToF32(b[j]);
        o[j] = FromF32<T>(op(x0, x1));
      }
      o.Store(out + p * V);
    }
    tail = packs * V;
  }
  for (int64_t i = tail + tid; i < n; i += stride) {
    float x0 = 0.0f, x1 = 0.0f;
    if constexpr (kInputs >= 1) x0 = ToF32(in0[i]);
    if constexpr (kInputs >= 2) x1 = ToF32(in1[i]);
    out[i] = FromF32<T>(op(x0, x1));
  }
}

// x[r, c] += bias[c]. With vec, C % V == 0, so a pack never crosses a row and its bias
// slice starts at a multiple of V.
// x: (N, C) flattened to n = N * C; bias: (C)
template <typename T>
__global__ void BiasAddKernel(T* x, const T* bias, int64_t n, int64_t C, bool vec) {
  using P = Packed128<T>;
  constexpr int V = P::size;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    for (int64_t p = tid; p < n / V; p += stride) {
      P xs = P::Load(x + p * V);
      const P bs = P::Load(bias + (p * V) % C);
#pragma unroll
      for (int j = 0; j < V; ++j) xs[j] = FromF32<T>(ToF32(xs[j]) + ToF32(bs[j]));
      xs.Store(x + p * V);
    }
    return;  // n = N * C is a multiple of V: no tail
  }
  for (int64_t i = tid; i < n; i += stride) x[i] = FromF32<T>(ToF32(x[i]) + ToF32(bias[i % C]));
}

// pre = x + bias (row-broadcast), out = GELU(pre); pre and bias may be null. The GELU is
// taken of the f32 sum, before pre is rounded to T.
// out, pre, x: (N, C) flattened to n; bias: (C)
template <typename T>
__global__ void BiasGeluKernel(T* out, T* pre, const T* x, const T* bias, int64_t n, int64_t C,
                               bool vec) {
  using P = Packed128<T>;
  constexpr int V = P::size;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    for (int64_t p = tid; p < n / V; p += stride) {
      const P xs = P::Load(x + p * V);
      P bs;
      if (bias != nullptr) bs = P::Load(bias + (p * V) % C);
      P ps, os;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float v = ToF32(xs[j]) + (bias != nullptr ? ToF32(bs[j]) : 0.0f);
        ps[j] = FromF32<T>(v);
        os[j] = FromF32<T>(Gelu(v));
      }
      if (pre != nullptr) ps.Store(pre + p * V);
      os.Store(out + p * V);
    }
    return;
  }
  for (int64_t i = tid; i < n; i += stride) {
    const float v = ToF32(x[i]) + (bias != nullptr ? ToF32(bias[i % C]) : 0.0f);
    if (pre != nullptr) pre[i] = FromF32<T>(v);
    out[i] = FromF32<T>(Gelu(v));
  }
}

// out[i] = convert(in[i]), four elements per step when both sides are aligned to 4 elements.
// out, in: (n)
template <typename In, typename Out>
__global__ void CastKernel(Out* out, const In* in, int64_t n, bool vec) {
  constexpr int V = 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if (vec) {
    for (int64_t p = tid; p < n / V; p += stride) {
      const Pack<In, V> a = Pack<In, V>::Load(in + p * V);
      Pack<Out, V> o;
#pragma unroll
      for (int j = 0; j < V; ++j) o[j] = FromF32<Out>(ToF32(a[j]));
      o.Store(out + p * V);
    }
    tail = n / V * V;
  }
  for (int64_t i = tail + tid; i < n; i += stride) out[i] = FromF32<Out>(ToF32(in[i]));
}
