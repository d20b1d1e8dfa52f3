// Row-major (batched) GEMM on cuBLASLt for the CUDA backend, with an algorithm cache: the
// first call for a shape asks the heuristic for up to 8 algorithms, times them on the
// stream and keeps the fastest (like cuDNN's benchmark mode); later calls reuse it.
// Host-only declarations, so tests compiled by the C++ compiler may include this header.
#ifndef TANDEM_RUNTIME_CUDA_GEMM_CUH_
#define TANDEM_RUNTIME_CUDA_GEMM_CUH_

#include <cstddef>
#include <cstdint>

#include <library_types.h>

#include "absl/status/status.h"
#include "runtime/stream.h"

namespace tandem {
namespace ops {
namespace cuda {

// cuBLASLt's workspace, allocated once per device and stream (from the device's allocator)
// and kept.
constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

// out (m, n) = alpha * op(a) @ op(b) + beta * out for each of `batch` matrices, all
// row-major: op(a) is (m, k), stored as (m, k) or, with transpose_a, (k, m); op(b) is (k, n),
// stored as (k, n) or (n, k). ld* are row strides in elements, stride_* batch strides.
// f32 accumulation (CUBLAS_COMPUTE_32F; f32 inputs may opt in to TF32 by setting the
// environment variable TANDEM_CUBLAS_TF32=1 before the first matmul).
struct RowMajorGemm {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false;
  bool transpose_b = false;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* out = nullptr;
  int64_t ldo = 0;
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_out = 0;
  cudaDataType_t ab_type = CUDA_R_32F;   // of a and b
  cudaDataType_t out_type = CUDA_R_32F;  // of out (f32 or ab_type)
  float alpha = 1.0f;
  float beta = 0.0f;
  // Epilogue (batch == 1 only), applied after alpha/beta: out[i, j] += bias[j] (bias (n),
  // out_type), then with `gelu` out = GELU_tanh(out), the value before GELU going to `pre`
  // (m, n) with row stride ldpre when pre is given.
  const void* bias = nullptr;
  bool gelu = false;
  void* pre = nullptr;
  int64_t ldpre = 0;
};

// Runs `g` on the stream, making the stream's device current. An epilogue cuBLASLt cannot
// run for this shape or alignment returns kUnimplemented (out and pre may then hold
// anything), so the caller can write them with a plain GEMM + kernels; without an epilogue,
// shapes cuBLASLt declines go to cuBLAS.
absl::Status RunGemm(Stream& s, const RowMajorGemm& g);

// Entries in the algorithm cache (for tests: a second call with the same shape must not
// add one).
size_t CublasLtCacheSizeForTesting();

}  // namespace cuda
}  // namespace ops
}  // namespace tandem

#endif  // TANDEM_RUNTIME_CUDA_GEMM_CUH_
