// The device-side helpers of the CUDA backend, as text that common.cuh includes inside
// tandem::ops::cuda and that runtime/cuda_kernels_emulation_test.cc includes on the host
// (runtime/cuda_emulation.h emulates CUDA's threads, warps and shared memory there): f32 <->
// storage conversions, Pack<T, N> vector loads and stores, warp and block reductions, online
// softmax statistics, GELU and launch sizing. The includer provides CUDA's types and
// intrinsics (cuda_bf16.h, cuda_fp16.h), <algorithm>, <cstdint> and <cstring>.

constexpr int kWarpSize = 32;

// ---- element conversions (round to nearest even, like the host's dtype.h) ----------------

template <typename T>
__device__ __forceinline__ float ToF32(T x);
template <>
__device__ __forceinline__ float ToF32<float>(float x) { return x; }
template <>
__device__ __forceinline__ float ToF32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float ToF32<__half>(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T FromF32(float x);
template <>
__device__ __forceinline__ float FromF32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromF32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromF32<__half>(float x) { return __float2half_rn(x); }

// ---- packed vector loads and stores ---------------------------------------------------------

template <int kBytes>
struct BitsOf;
template <>
struct BitsOf<16> { using type = int4; };
template <>
struct BitsOf<8> { using type = uint2; };
template <>
struct BitsOf<4> { using type = unsigned int; };
template <>
struct BitsOf<2> { using type = unsigned short; };

// N elements of T moved with one load or store instruction of sizeof(T) * N bytes; the
// address must be aligned to that size (callers check with IsAligned before choosing a
// vector path).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  using Bits = typename BitsOf<sizeof(T) * N>::type;
  static constexpr int size = N;
  T v[N];

  __device__ __forceinline__ T& operator[](int i) { return v[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }
  __device__ __forceinline__ static Pack Load(const T* p) {
    const Bits bits = *reinterpret_cast<const Bits*>(p);
    Pack r;
    memcpy(&r, &bits, sizeof(bits));
    return r;
  }
  __device__ __forceinline__ void Store(T* p) const {
    Bits bits;
    memcpy(&bits, this, sizeof(bits));
    *reinterpret_cast<Bits*>(p) = bits;
  }
};

// 16 bytes: 4 floats or 8 bf16/f16 values.
template <typename T>
using Packed128 = Pack<T, 16 / sizeof(T)>;


// ---- reductions -------------------------------------------------------------------------------

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block; every thread gets the result. blockDim.x must be a multiple of 32
// (at most 1024), and every thread of the block must call it (it synchronizes).
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float partial[kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = WarpSum(v);
  __syncthreads();  // a previous call may still be reading `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0.0f;
  return WarpSum(v);
}

// Online softmax statistics: running max `m` and sum of exp(x - m). A nan never becomes the
// max (comparisons with it are false) but makes the sum nan, and the sum stays nan through
// every rescaling (an empty side is skipped by its sum, 0, never by its max): a row with a
// nan gives nan everywhere, as on the CPU.
struct MaxSum {
  float m;
  float s;
};
__device__ __forceinline__ MaxSum MaxSumEmpty() { return {-INFINITY, 0.0f}; }
__device__ __forceinline__ MaxSum MaxSumAdd(MaxSum a, float x) {
  if (x == -INFINITY) return a;  // contributes exp(-inf) = 0; avoids inf - inf
  if (x > a.m) {
    const float s = (a.s == 0.0f ? 0.0f : a.s * expf(a.m - x)) + 1.0f;
    return {x, s};
  }
  return {a.m, a.s + expf(x - a.m)};
}
__device__ __forceinline__ MaxSum MaxSumMerge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, a.s + b.s};  // both empty, or a nan with nothing else
  const float sa = a.s == 0.0f ? 0.0f : a.s * expf(a.m - m);
  const float sb = b.s == 0.0f ? 0.0f : b.s * expf(b.m - m);
  return {m, sa + sb};
}
__device__ __forceinline__ MaxSum WarpMaxSum(MaxSum v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = MaxSumMerge(v, other);
  }
  return v;
}
// The block-wide merge; same calling rules as BlockSum.
__device__ __forceinline__ MaxSum BlockMaxSum(MaxSum v) {
  __shared__ float part_m[kWarpSize];
  __shared__ float part_s[kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = WarpMaxSum(v);
  __syncthreads();
  if (lane == 0) {
    part_m[warp] = v.m;
    part_s[warp] = v.s;
  }
  __syncthreads();
  v = lane < warps ? MaxSum{part_m[lane], part_s[lane]} : MaxSumEmpty();
  return WarpMaxSum(v);
}
// The max and sum of exp(x - max) of row[0, valid), the block walking row[0, n) P elements a
// thread and step (n % P == 0, row aligned for Pack<T, P>) and leaving out the elements from
// `valid` on (a padded row's tail); same calling rules as BlockSum.
template <typename T, int P>
__device__ __forceinline__ MaxSum BlockRowMaxSum(const T* row, int n, int valid) {
  MaxSum ms = MaxSumEmpty();
  for (int c = threadIdx.x * P; c < n; c += blockDim.x * P) {
    const Pack<T, P> v = Pack<T, P>::Load(row + c);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (c + j < valid) ms = MaxSumAdd(ms, ToF32(v[j]));
    }
  }
  return BlockMaxSum(ms);
}
// The same over the whole row[0, n).
template <typename T, int P>
__device__ __forceinline__ MaxSum BlockRowMaxSum(const T* row, int n) {
  return BlockRowMaxSum<T, P>(row, n, n);
}

// ---- GELU, tanh approximation (GPT-2) ---------------------------------------------------------

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

__device__ __forceinline__ float Gelu(float x) {
  const float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + cube)));
}
// d GELU(x) / dx.
__device__ __forceinline__ float GeluGrad(float x) {
  const float cube = 0.044715f * x * x * x;
  const float t = tanhf(kGeluScale * (x + cube));
  const float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

// ---- launch sizing ----------------------------------------------------------------------------

constexpr int kThreads = 256;
// Grid-stride kernels never need more blocks than this to fill an H100/H200.
constexpr int64_t kMaxBlocks = 1 << 16;

inline unsigned int BlocksFor(int64_t work_items, int threads = kThreads) {
  const int64_t blocks = (work_items + threads - 1) / threads;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(blocks, kMaxBlocks)));
}

// ---- grid-stride loops -----------------------------------------------------------------------

// The calling thread's index in a 1-D grid, and the grid's threads: a grid-stride loop's start
// and step.
__device__ __forceinline__ int64_t GridThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// A pack width as a type, so that one body serves packs and single elements.
template <int W>
struct Width {
  static constexpr int value = W;
};

// Calls fn(Width<W>{}, i) for elements [i, i + W) of [0, n) over the grid's threads: with vec,
// packs of W = kVec up to n / kVec * kVec, then single elements (W = 1) for the rest; without,
// single elements throughout.
template <int kVec, typename Fn>
__device__ __forceinline__ void ForEachPack(int64_t n, bool vec, Fn&& fn) {
  int64_t tail = 0;
  if (vec) {
    for (int64_t p = GridThread(); p < n / kVec; p += GridThreads()) fn(Width<kVec>{}, p * kVec);
    tail = n / kVec * kVec;
  }
  for (int64_t i = tail + GridThread(); i < n; i += GridThreads()) fn(Width<1>{}, i);
}

// Kernels that give each row to one warp run kThreads per block, kRowsPerBlock rows each.
constexpr int kRowsPerBlock = kThreads / kWarpSize;

// The row the calling warp owns.
__device__ __forceinline__ int64_t WarpRow() {
  return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
}

// Blocks for `rows` rows, one warp each (no grid-stride loop).
inline unsigned int RowBlocks(int64_t rows) {
  return static_cast<unsigned int>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// Threads of a kernel that gives each row a block walking `units` packs: a power of two in
// [32, 1024].
inline int RowThreads(int64_t units) {
  int t = kWarpSize;
  while (t < units && t < 1024) t *= 2;
  return t;
}
