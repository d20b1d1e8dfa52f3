// Token + position embedding on CUDA. Forward gathers rows of wte (and wpe) in 16-byte
// packs when C allows; backward scatters dout into dwte with atomicAdd (f32; the order of
// additions, and so the last bits, may vary between runs) and sums dout over the batch
// into dwpe with one thread per (t, c), deterministically.
// Legend: B = batch, T = sequence, C = channels, V = vocabulary.
#include "runtime/cuda/common.cuh"
#include "runtime/ops_backend.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

#include "runtime/cuda/embedding_kernels.cuh"

// ---- launchers --------------------------------------------------------------------------------

struct Sizes {
  int64_t rows;  // B * T
  int B, seq, C, V;
};

Sizes SizesOf(const Tensor& tokens, const Tensor& table) {
  Sizes z;
  z.seq = tokens.rank() > 0 ? static_cast<int>(tokens.dim(-1)) : 1;
  z.rows = tokens.numel();
  z.B = z.seq == 0 ? 0 : static_cast<int>(z.rows / z.seq);
  z.C = static_cast<int>(table.dim(1));
  z.V = static_cast<int>(table.dim(0));
  return z;
}

template <typename T>
absl::Status LaunchForward(cudaStream_t stream, const Tensor& out, const Tensor& tokens,
                           const Tensor& wte, const Tensor& wpe, int64_t vocab_begin) {
  const Sizes z = SizesOf(tokens, wte);
  if (z.rows == 0 || z.C == 0) return absl::OkStatus();
  constexpr int kVec = Packed128<T>::size;
  const bool vec = z.C % kVec == 0 && IsAligned(out.raw(), 16) && IsAligned(wte.raw(), 16) &&
                   (!wpe.defined() || IsAligned(wpe.raw(), 16));
  const int P = vec ? kVec : 1;
  auto kernel = vec ? EmbeddingForwardKernel<T, kVec> : EmbeddingForwardKernel<T, 1>;
  kernel<<<BlocksFor(z.rows * z.C / P), kThreads, 0, stream>>>(
      MutPtr<T>(out), Ptr<int32_t>(tokens), Ptr<T>(wte), Ptr<T>(wpe), z.rows, z.seq, z.C, z.V,
      static_cast<int>(vocab_begin));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status LaunchBackward(cudaStream_t stream, const Tensor& dwte, const Tensor& dwpe,
                            const Tensor& dout, const Tensor& tokens, int64_t vocab_begin) {
  const Tensor& table = dwte.defined() ? dwte : dwpe;
  if (!table.defined()) return absl::OkStatus();
  const Sizes z = SizesOf(tokens, table);
  if (z.rows == 0 || z.C == 0) return absl::OkStatus();
  if (dwte.defined()) {
    constexpr int kVec = Packed128<T>::size;
    const bool vec = z.C % kVec == 0 && IsAligned(dout.raw(), 16);
    const int P = vec ? kVec : 1;
    auto kernel = vec ? WteBackwardKernel<T, kVec> : WteBackwardKernel<T, 1>;
    kernel<<<BlocksFor(z.rows * z.C / P), kThreads, 0, stream>>>(
        MutPtr<float>(dwte), Ptr<T>(dout), Ptr<int32_t>(tokens), z.rows, z.C, z.V,
        static_cast<int>(vocab_begin));
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  if (dwpe.defined()) {
    WpeBackwardKernel<T><<<BlocksFor(static_cast<int64_t>(z.seq) * z.C), kThreads, 0, stream>>>(
        MutPtr<float>(dwpe), Ptr<T>(dout), z.B, z.seq, z.C);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

absl::Status CheckF32(const char* op, const Tensor& t) {
  if (!t.defined() || t.dtype() == DType::kF32) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: gradient %s must be f32 (atomic accumulation)", op, t.ToString()));
}

}  // namespace

absl::Status EmbeddingForward(Stream& s, const Tensor& out, const Tensor& tokens,
                              const Tensor& wte, const Tensor& wpe, int64_t vocab_begin,
                              int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(SameFloatDType("EmbeddingForward", out.dtype(), {&wte, &wpe}));
  return DispatchFloat("EmbeddingForward", out.dtype(), [&](auto tag) {
    return LaunchForward<decltype(tag)>(stream, out, tokens, wte, wpe, vocab_begin);
  });
}

absl::Status EmbeddingBackward(Stream& s, const Tensor& dwte, const Tensor& dwpe,
                               const Tensor& dout, const Tensor& tokens, int64_t vocab_begin,
                               int64_t) {
  ASSIGN_OR_RETURN(cudaStream_t stream, Begin(s));
  RETURN_IF_ERROR(CheckF32("EmbeddingBackward", dwte));
  RETURN_IF_ERROR(CheckF32("EmbeddingBackward", dwpe));
  return DispatchFloat("EmbeddingBackward", dout.dtype(), [&](auto tag) {
    return LaunchBackward<decltype(tag)>(stream, dwte, dwpe, dout, tokens, vocab_begin);
  });
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
