// LayerNorm on CUDA (after llm.c's llmc/layernorm.cuh): forward, the residual add fused with
// the forward, and backward. One warp per row, warp-shuffle reductions, f32 statistics;
// rows move in 16-byte packs when C is a multiple of the pack and the pointers allow
// (Pack<T, P> with P = 16 / sizeof(T)), else one element per lane and step.
// Backward accumulates dweight/dbias per block in shared memory, then atomically into f32
// (the gradients themselves when they are f32, else a zeroed scratch added at the end).
#include "runtime/cuda/common.cuh"
#include "runtime/ops_backend.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kRowsPerBlock = kThreads / kWarpSize;

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
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
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
  extern __shared__ float smem[];  // kShared: (2 * C) = dweight partials, then dbias partials
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

// ---- launchers --------------------------------------------------------------------------------

template <typename T, bool kResidual>
absl::Status LaunchForward(cudaStream_t stream, const Tensor& out, const Tensor& mean,
                           const Tensor& rstd, const Tensor& residual, const Tensor& inp,
                           const Tensor& inp2, const Tensor& weight, const Tensor& bias) {
  const int64_t N = inp.dim(0);  // inp (N, C)
  const int C = static_cast<int>(inp.dim(1));
  if (N == 0) return absl::OkStatus();
  constexpr int V = Packed128<T>::size;
  bool vec = C % V == 0;
  for (const Tensor* t : {&out, &residual, &inp, &inp2, &weight, &bias}) {
    if (t->defined()) vec = vec && IsAligned(t->raw(), 16);
  }
  const unsigned int blocks = static_cast<unsigned int>((N + kRowsPerBlock - 1) / kRowsPerBlock);
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kThreads, 0, stream>>>(MutPtr<T>(out), MutPtr<float>(mean),
                                            MutPtr<float>(rstd), MutPtr<T>(residual),
                                            Ptr<T>(inp), Ptr<T>(inp2), Ptr<T>(weight),
                                            Ptr<T>(bias), N, C);
  };
  if (vec) {
    launch(LayerNormForwardKernel<T, V, kResidual>);
  } else {
    launch(LayerNormForwardKernel<T, 1, kResidual>);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status LaunchBackward(Stream& s, cudaStream_t stream, const Tensor& dinp,
                            const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                            const Tensor& inp, const Tensor& weight, const Tensor& mean,
                            const Tensor& rstd) {
  const int C = static_cast<int>(inp.dim(-1));
  const int64_t N = C == 0 ? 0 : inp.numel() / C;
  if (N == 0) return absl::OkStatus();

  // f32 gradients take the atomics directly; others get a zeroed f32 scratch (2 * C).
  const bool w_direct = dweight.defined() && dweight.dtype() == DType::kF32;
  const bool b_direct = dbias.defined() && dbias.dtype() == DType::kF32;
  Tensor scratch;
  float* acc_w = w_direct ? MutPtr<float>(dweight) : nullptr;
  float* acc_b = b_direct ? MutPtr<float>(dbias) : nullptr;
  if ((dweight.defined() && !w_direct) || (dbias.defined() && !b_direct)) {
    ASSIGN_OR_RETURN(scratch, Tensor::Empty({2, C}, DType::kF32, s.device()));
    RETURN_IF_ERROR(ZeroFill(scratch, s));
    if (dweight.defined() && !w_direct) acc_w = MutPtr<float>(scratch);
    if (dbias.defined() && !b_direct) acc_b = MutPtr<float>(scratch) + C;
  }

  constexpr int V = Packed128<T>::size;
  bool vec = C % V == 0;
  for (const Tensor* t : {&dinp, &dout, &inp, &weight}) {
    if (t->defined()) vec = vec && IsAligned(t->raw(), 16);
  }
  // Shared-memory partials when 2 * C floats fit (48 KiB always; more with the opt-in).
  const size_t smem = 2 * static_cast<size_t>(C) * sizeof(float);
  int device = 0, optin = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const bool shared = smem <= std::max<size_t>(48 << 10, optin);
  const int64_t row_blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  const unsigned int blocks =
      static_cast<unsigned int>(std::min<int64_t>(row_blocks, 2 * static_cast<int64_t>(SmCount())));
  auto launch = [&](auto kernel, bool use_smem) -> absl::Status {
    if (use_smem && smem > (48 << 10)) {
      CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    }
    kernel<<<blocks, kThreads, use_smem ? smem : 0, stream>>>(
        MutPtr<T>(dinp), acc_w, acc_b, Ptr<T>(dout), Ptr<T>(inp), Ptr<T>(weight),
        Ptr<float>(mean), Ptr<float>(rstd), N, C);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  };
  if (vec) {
    RETURN_IF_ERROR(shared ? launch(LayerNormBackwardKernel<T, V, true>, true)
                           : launch(LayerNormBackwardKernel<T, V, false>, false));
  } else {
    RETURN_IF_ERROR(shared ? launch(LayerNormBackwardKernel<T, 1, true>, true)
                           : launch(LayerNormBackwardKernel<T, 1, false>, false));
  }
  if (dweight.defined() && !w_direct) RETURN_IF_ERROR(AccumulateInto(stream, dweight, acc_w));
  if (dbias.defined() && !b_direct) RETURN_IF_ERROR(AccumulateInto(stream, dbias, acc_b));
  return absl::OkStatus();  // scratch returns to the cache; later users are stream-ordered
}

}  // namespace

absl::Status LayerNormForward(Stream& s, const Tensor& out, const Tensor& mean,
                              const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("LayerNormForward", inp.dtype(), {&out, &weight, &bias}));
  return DispatchFloat("LayerNormForward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return LaunchForward<T, false>(stream, out, mean, rstd, Tensor(), inp, Tensor(), weight,
                                   bias);
  });
}

absl::Status ResidualLayerNormForward(Stream& s, const Tensor& residual, const Tensor& out,
                                      const Tensor& mean, const Tensor& rstd, const Tensor& a,
                                      const Tensor& b, const Tensor& weight, const Tensor& bias) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("ResidualLayerNormForward", a.dtype(),
                                 {&residual, &out, &b, &weight, &bias}));
  return DispatchFloat("ResidualLayerNormForward", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return LaunchForward<T, true>(stream, out, mean, rstd, residual, a, b, weight, bias);
  });
}

absl::Status LayerNormBackward(Stream& s, const Tensor& dinp, const Tensor& dweight,
                               const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  // dweight and dbias may be f32 with lower-precision activations (f32 gradient buffers).
  RETURN_IF_ERROR(SameFloatDType("LayerNormBackward", inp.dtype(), {&dinp, &dout, &weight}));
  return DispatchFloat("LayerNormBackward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return LaunchBackward<T>(s, stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  });
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
