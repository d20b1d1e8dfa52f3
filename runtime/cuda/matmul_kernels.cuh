// The kernels of matmul.cu, whose launchers stay there: text included inside
// tandem::ops::cuda by matmul.cu and, on the host with CUDA's execution model emulated
// (runtime/cuda_emulation.h), by runtime/cuda_kernels_emulation_test.cc, so the same
// source is checked without a GPU. The includer provides device_functions.cuh first.

// ---- kernels ----------------------------------------------------------------------------------

constexpr int kColTile = 32;  // columns per block (one warp reads 32 consecutive columns)
constexpr int kRowLanes = 8;  // rows read at once per block

// dst[c] += sum over rows [blockIdx.y * rows_per_chunk, +rows_per_chunk) of x[r, c]. With a
// single chunk the block adds into dst itself (deterministic, any dtype); with several, the
// chunks' sums go by atomicAdd into the f32 `acc`.
// dst: (C) or null; acc: (C) f32 or null; x: (N, C)
template <typename E, typename G>
__global__ void ColumnSumKernel(G* dst, float* acc, const E* x, int64_t N, int C,
                                int64_t rows_per_chunk) {
  __shared__ float part[kRowLanes][kColTile + 1];
  const int c = blockIdx.x * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(N, r0 + rows_per_chunk);
  float sum = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) sum += ToF32(x[r * C + c]);
  }
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowLanes; ++i) total += part[i][threadIdx.x];
    if (acc != nullptr) {
      atomicAdd(&acc[c], total);
    } else {
      dst[c] = FromF32<G>(ToF32(dst[c]) + total);
    }
  }
}
