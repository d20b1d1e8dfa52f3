// Optimizer steps on CUDA over flat f32 buffers: AdamW and SGD with momentum, one pass
// each that reads params, grads and state, writes them back, and writes the bf16/f16
// copy of the new params (params_low) in the same pass. Four elements per step (16-byte
// f32 loads, 8-byte low-precision stores) when the buffers are aligned for it.
#include <cmath>

#include "runtime/cuda/common.cuh"
#include "runtime/ops_backend.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

#include "runtime/cuda/optimizer_kernels.cuh"

// ---- launchers --------------------------------------------------------------------------------

// Calls fn(L{}) for the dtype of params_low (bf16 when undefined: the pointer is then null).
template <typename Fn>
absl::Status DispatchLow(const char* op, const Tensor& params_low, Fn&& fn) {
  if (!params_low.defined() || params_low.dtype() == DType::kBF16) return fn(__nv_bfloat16{});
  if (params_low.dtype() == DType::kF16) return fn(__half{});
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: params_low %s must be bf16 or f16", op, params_low.ToString()));
}

bool VectorOk(std::initializer_list<const Tensor*> f32, const Tensor& low) {
  for (const Tensor* t : f32) {
    if (!IsAligned(t->raw(), 16)) return false;
  }
  return !low.defined() || IsAligned(low.raw(), kVec * 2);
}

}  // namespace

absl::Status AdamWUpdate(Stream& s, const Tensor& params, const Tensor& grads, const Tensor& m,
                         const Tensor& v, const AdamWConfig& c, const Tensor& params_low,
                         const Tensor& grad_scale) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  const int64_t n = params.numel();
  if (n == 0) return absl::OkStatus();
  const AdamWArgs a = AdamWArgsOf(c);
  const bool vec = VectorOk({&params, &grads, &m, &v}, params_low);
  return DispatchLow("AdamWUpdate", params_low, [&](auto tag) {
    using L = decltype(tag);
    auto kernel = vec ? AdamWKernel<L, true> : AdamWKernel<L, false>;
    kernel<<<BlocksFor(WorkItems(vec, n)), kThreads, 0, stream>>>(
        MutPtr<float>(params), Ptr<float>(grads), MutPtr<float>(m), MutPtr<float>(v),
        MutPtr<L>(params_low), n, a, Ptr<float>(grad_scale));
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

absl::Status SgdMomentumUpdate(Stream& s, const Tensor& params, const Tensor& grads,
                               const Tensor& momentum_buf, const SgdConfig& c,
                               const Tensor& params_low, const Tensor& grad_scale) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  const int64_t n = params.numel();
  if (n == 0) return absl::OkStatus();
  const SgdArgs a = SgdArgsOf(c);
  const bool vec = VectorOk({&params, &grads, &momentum_buf}, params_low);
  return DispatchLow("SgdMomentumUpdate", params_low, [&](auto tag) {
    using L = decltype(tag);
    auto kernel = vec ? SgdKernel<L, true> : SgdKernel<L, false>;
    kernel<<<BlocksFor(WorkItems(vec, n)), kThreads, 0, stream>>>(
        MutPtr<float>(params), Ptr<float>(grads), MutPtr<float>(momentum_buf),
        MutPtr<L>(params_low), n, a, Ptr<float>(grad_scale));
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
}

absl::Status GradScale(Stream& s, const Tensor& scale, const Tensor& sumsq, float unscale,
                       float clip_norm) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  GradScaleKernel<<<1, 1, 0, stream>>>(MutPtr<float>(scale), Ptr<float>(sumsq), unscale,
                                       clip_norm);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
