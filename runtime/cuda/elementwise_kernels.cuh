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
  ForEachPack<Packed128<T>::size>(n, vec, [&](auto w, int64_t i) {
    using P = Pack<T, decltype(w)::value>;
    P a, b, o;
    if constexpr (kInputs >= 1) a = P::Load(in0 + i);
    if constexpr (kInputs >= 2) b = P::Load(in1 + i);
#pragma unroll
    for (int j = 0; j < P::size; ++j) {
      float x0 = 0.0f, x1 = 0.0f;
      if constexpr (kInputs >= 1) x0 = ToF32(a[j]);
      if constexpr (kInputs >= 2) x1 = ToF32(b[j]);
      o[j] = FromF32<T>(op(x0, x1));
    }
    o.Store(out + i);
  });
}

// x[r, c] += bias[c]. With vec, C is a multiple of the 16-byte pack, so a pack never crosses a
// row and its bias slice starts at a multiple of the pack.
// x: (N, C) flattened to n = N * C; bias: (C)
template <typename T>
__global__ void BiasAddKernel(T* x, const T* bias, int64_t n, int64_t C, bool vec) {
  ForEachPack<Packed128<T>::size>(n, vec, [&](auto w, int64_t i) {
    using P = Pack<T, decltype(w)::value>;
    P xs = P::Load(x + i);
    const P bs = P::Load(bias + i % C);
#pragma unroll
    for (int j = 0; j < P::size; ++j) xs[j] = FromF32<T>(ToF32(xs[j]) + ToF32(bs[j]));
    xs.Store(x + i);
  });
}

// pre = x + bias (row-broadcast), out = GELU(pre); pre and bias may be null. The GELU is
// taken of the f32 sum, before pre is rounded to T.
// out, pre, x: (N, C) flattened to n; bias: (C)
template <typename T>
__global__ void BiasGeluKernel(T* out, T* pre, const T* x, const T* bias, int64_t n, int64_t C,
                               bool vec) {
  ForEachPack<Packed128<T>::size>(n, vec, [&](auto w, int64_t i) {
    using P = Pack<T, decltype(w)::value>;
    const P xs = P::Load(x + i);
    P bs;
    if (bias != nullptr) bs = P::Load(bias + i % C);
    P ps, os;
#pragma unroll
    for (int j = 0; j < P::size; ++j) {
      const float v = ToF32(xs[j]) + (bias != nullptr ? ToF32(bs[j]) : 0.0f);
      ps[j] = FromF32<T>(v);
      os[j] = FromF32<T>(Gelu(v));
    }
    if (pre != nullptr) ps.Store(pre + i);
    os.Store(out + i);
  });
}

// out[i] = convert(in[i]), four elements per step when both sides are aligned to 4 elements.
// out, in: (n)
template <typename In, typename Out>
__global__ void CastKernel(Out* out, const In* in, int64_t n, bool vec) {
  ForEachPack<4>(n, vec, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    const Pack<In, W> a = Pack<In, W>::Load(in + i);
    Pack<Out, W> o;
#pragma unroll
    for (int j = 0; j < W; ++j) o[j] = FromF32<Out>(ToF32(a[j]));
    o.Store(out + i);
  });
}
