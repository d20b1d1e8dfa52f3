// The FlashAttention kernels of flash_attention.cu (see flash_attention.cuh), as text that
// flash_attention.cu includes inside tandem::ops::cuda and that
// runtime/flash_attention_emulation_test.cc includes on the host, where CUDA threads and warps
// and the tensor-core instructions are emulated: the same source is checked without a GPU.
// The includer provides kWarpSize, ToF32 and FromF32, DynamicShared() (the block's dynamic
// shared memory, 128-byte aligned), and LdMatrixX4, MmaM16N8K16 and the CpAsync functions
// (runtime/cuda/sm80.cuh).
//
// FlashAttention-2's design: a block takes 64 rows of one (batch, head) with 4 warps of 16
// rows each. Tiles of q, k, v and dout are staged in shared memory by cp.async, the next tile
// loading while the block computes on the one before; each warp multiplies with
// mma.m16n8k16 and keeps its scores, probabilities and sums in registers, in the
// accumulator layout below, so that the softmax never goes through memory. With g = lane / 4
// and t = lane % 4, an f32 accumulator tile (16 rows x 8 columns) holds (g, 2t), (g, 2t + 1),
// (g + 8, 2t), (g + 8, 2t + 1) in a lane's 4 registers; two tiles side by side (16 columns),
// rounded to 16-bit pairs, are exactly the A operand of the next product (PackA).
// Legend: B = batch, T = sequence, C = channels, NH = heads, HS = head size, bh = b * NH + h.

constexpr int kTile = 64;  // rows of q (or keys) per block and per loaded tile
constexpr int kWarps = 4;  // each owns kRows rows of the block's tile
constexpr int kRows = 16;  // an mma's rows
constexpr int kFlashThreads = kWarps * kWarpSize;
constexpr int kPadE = 8;  // elements of padding after each row of a tile, so that the 8 rows
                          // an ldmatrix reads start in 8 different 16-byte bank groups
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The row stride of a shared (kTile, HS) tile, in elements.
template <int HS>
constexpr int kRowStride = HS + kPadE;

// A block's shared memory: kTiles 16-bit (kTile, HS) tiles (q, k, v, dout, some double
// buffered), then four rows of kTile floats (lse in log2 units and rowdot of query rows).
template <typename E, int HS, int kTiles>
struct Smem {
  static_assert(HS % 16 == 0, "HS must be a multiple of 16");
  static constexpr size_t kTileBytes = size_t{kTile} * kRowStride<HS> * sizeof(E);
  static constexpr size_t kRowsAt = kTiles * kTileBytes;
  static constexpr size_t kBytes = kRowsAt + 4 * kTile * sizeof(float);
  static_assert(kTileBytes % 16 == 0, "ldmatrix and cp.async need 16-byte rows");

  unsigned char* base;
  __device__ E* tile(int i) const { return reinterpret_cast<E*>(base + i * kTileBytes); }
  __device__ float* row(int i) const {
    return reinterpret_cast<float*>(base + kRowsAt + i * kTile * sizeof(float));
  }
};
// Forward: q, k, v. Backward: the block's own two tiles, and two buffers of two others.
template <typename E, int HS>
using ForwardSmem = Smem<E, HS, 3>;
template <typename E, int HS>
using BackwardSmem = Smem<E, HS, 6>;

// Row t of one head of a token-major tensor: HS contiguous elements at base + t * stride.
template <typename P>
struct HeadRows {
  P* base;
  int64_t stride;
  __device__ P* at(int t) const { return base + t * stride; }
};

// One (b, h) of the token-major tensors: row t of head h of section `sec` (0 q, 1 k, 2 v) of
// qkv (B, T, 3C) or dqkv, and of out, dout (B, T, C).
struct HeadIndex {
  int T, NH, HS;
  int bh;
  // The (b, h) of this block of a FlashAttention grid: blockIdx.x.
  static __device__ HeadIndex OfBlock(int T, int NH, int HS) {
    return {T, NH, HS, static_cast<int>(blockIdx.x)};
  }
  __device__ int64_t C() const { return static_cast<int64_t>(NH) * HS; }
  __device__ int64_t Qkv(int sec, int t) const {
    const int b = bh / NH, h = bh % NH;
    return (static_cast<int64_t>(b) * T + t) * 3 * C() + sec * C() + static_cast<int64_t>(h) * HS;
  }
  __device__ int64_t Out(int t) const {
    const int b = bh / NH, h = bh % NH;
    return (static_cast<int64_t>(b) * T + t) * C() + static_cast<int64_t>(h) * HS;
  }
  template <typename P>
  __device__ HeadRows<P> QkvRows(P* qkv, int sec) const {
    return {qkv + Qkv(sec, 0), 3 * C()};
  }
  template <typename P>
  __device__ HeadRows<P> OutRows(P* out) const {
    return {out + Out(0), C()};
  }
};

// Starts copying rows [r0, r0 + kTile) of a head into a shared (kTile, HS) tile, 16 bytes per
// thread and cp.async, in the calling threads' open groups; rows at or past T become zeros
// (so products with them stay finite).
template <typename E, int HS>
__device__ void LoadTile(E* dst, HeadRows<const E> src, int r0, int T) {
  constexpr int kChunks = HS * sizeof(E) / 16;  // 16-byte moves per row
  constexpr int kPer = 16 / sizeof(E);
  for (int i = threadIdx.x; i < kTile * kChunks; i += blockDim.x) {
    const int r = i / kChunks;
    const int c = (i % kChunks) * kPer;
    const bool in = r0 + r < T;
    CpAsync16(dst + r * kRowStride<HS> + c, (in ? src.at(r0 + r) : src.base) + c, in);
  }
}

// Two f32 values as a 16-bit pair (lo in the low half), an mma operand register.
template <typename E>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  const E e[2] = {FromF32<E>(lo), FromF32<E>(hi)};
  uint32_t r;
  memcpy(&r, e, sizeof(r));
  return r;
}

// The A operand (16 x 16) of columns 16 s .. 16 s + 15 of f32 accumulator tiles acc[2 s] and
// acc[2 s + 1], rounded to E.
template <typename E>
__device__ __forceinline__ void PackA(uint32_t (&a)[4], const float (&lo)[4],
                                      const float (&hi)[4]) {
  a[0] = PackPair<E>(lo[0], lo[1]);
  a[1] = PackPair<E>(lo[2], lo[3]);
  a[2] = PackPair<E>(hi[0], hi[1]);
  a[3] = PackPair<E>(hi[2], hi[3]);
}

// The A operand: rows r0.., columns c0.. (16 x 16) of a shared tile with row stride ld.
template <typename E>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const E* tile, int ld, int r0, int c0) {
  const int lane = threadIdx.x % kWarpSize;
  LdMatrixX4<false>(a, tile + (r0 + lane % 16) * ld + c0 + (lane / 16) * 8);
}

// The calling warp's 16 rows of a shared (kTile, HS) tile as HS / 16 A operands.
template <typename E, int HS>
__device__ __forceinline__ void LoadWarpRows(uint32_t (&a)[HS / 16][4], const E* tile) {
  const int warp = threadIdx.x / kWarpSize;
  for (int ks = 0; ks < HS / 16; ++ks) LoadA(a[ks], tile, kRowStride<HS>, warp * kRows, ks * 16);
}

// The B operands of two 8-column tiles, b = tile^T: b[k][n] = tile[n0 + n][k0 + k] for
// k < 16, n < 16 (scores against the keys of k_s, say). b[0], b[1] are columns n0..n0 + 7;
// b[2], b[3] columns n0 + 8...
template <typename E>
__device__ __forceinline__ void LoadBTransposed(uint32_t (&b)[4], const E* tile, int ld, int n0,
                                                int k0) {
  const int lane = threadIdx.x % kWarpSize, m = lane / 8;
  LdMatrixX4<false>(b, tile + (n0 + (m / 2) * 8 + lane % 8) * ld + k0 + (m % 2) * 8);
}

// The same, b = tile: b[k][n] = tile[k0 + k][n0 + n] (probabilities times v_s, say).
template <typename E>
__device__ __forceinline__ void LoadB(uint32_t (&b)[4], const E* tile, int ld, int k0, int n0) {
  const int lane = threadIdx.x % kWarpSize, m = lane / 8;
  LdMatrixX4<true>(b, tile + (k0 + (m % 2) * 8 + lane % 8) * ld + n0 + (m / 2) * 8);
}

// The accumulator tiles lo, hi (16 x 16) += a (16 x HS, HS / 16 A operands) @ tile^T where
// `tile` holds the 16 rows n0.. of the other operand (scores and their gradients).
template <typename E, int HS>
__device__ __forceinline__ void RowsTimesRowsT(float (&lo)[4], float (&hi)[4],
                                               const uint32_t (&a)[HS / 16][4], const E* tile,
                                               int n0) {
  for (int ks = 0; ks < HS / 16; ++ks) {
    uint32_t b[4];
    LoadBTransposed(b, tile, kRowStride<HS>, n0, ks * 16);
    MmaM16N8K16<E>(lo, a[ks], b[0], b[1]);
    MmaM16N8K16<E>(hi, a[ks], b[2], b[3]);
  }
}

// acc (16 x HS, HS / 8 tiles) += a (16 x 16) @ rows k0..k0 + 15 of `tile` (16 x HS).
template <typename E, int HS>
__device__ __forceinline__ void AccumulateTimesRows(float (&acc)[HS / 8][4], const uint32_t (&a)[4],
                                                    const E* tile, int k0) {
  for (int n2 = 0; n2 < HS / 16; ++n2) {
    uint32_t b[4];
    LoadB(b, tile, kRowStride<HS>, k0, n2 * 16);
    MmaM16N8K16<E>(acc[2 * n2], a, b[0], b[1]);
    MmaM16N8K16<E>(acc[2 * n2 + 1], a, b[2], b[3]);
  }
}

// Writes a warp's 16 x HS accumulators, times scale_g (rows g) and scale_g8 (rows g + 8), to
// rows row0.. of a head (skipping rows at or past T): through `stage`, the
// warp's 16 rows of a shared tile, so that the global stores are 16-byte moves.
template <typename E, int HS>
__device__ void StoreRows(HeadRows<E> dst, int row0, int T, const float (&acc)[HS / 8][4],
                          float scale_g, float scale_g8, E* stage) {
  constexpr int kLE = kRowStride<HS>;
  constexpr int kChunks = HS * sizeof(E) / 16;
  constexpr int kPer = 16 / sizeof(E);
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  __syncwarp();  // the warp is done reading its rows of the tile
  for (int n = 0; n < HS / 8; ++n) {
    *reinterpret_cast<uint32_t*>(stage + g * kLE + 8 * n + 2 * t) =
        PackPair<E>(acc[n][0] * scale_g, acc[n][1] * scale_g);
    *reinterpret_cast<uint32_t*>(stage + (g + 8) * kLE + 8 * n + 2 * t) =
        PackPair<E>(acc[n][2] * scale_g8, acc[n][3] * scale_g8);
  }
  __syncwarp();
  for (int i = lane; i < kRows * kChunks; i += kWarpSize) {
    const int r = i / kChunks, c = (i % kChunks) * kPer;
    if (row0 + r < T) {
      *reinterpret_cast<int4*>(dst.at(row0 + r) + c) =
          *reinterpret_cast<const int4*>(stage + r * kLE + c);
    }
  }
}

// ---- forward ----------------------------------------------------------------------------------

// grid (B * NH, ceil(T / kTile)); block y = 0 takes the last query tile (the longest rows).
// A lane's rows are query = q0 + 16 warp + g and query + 8. As in FlashAttention-2, the values
// of key tile kt load while the scores and softmax run, and key tile kt + 1 loads while the
// probabilities meet the values, so that one tile each of k and v suffices.
template <typename E, int HS>
__global__ void __launch_bounds__(kFlashThreads)
    FlashForwardKernel(E* out, float* lse, const E* qkv, int T, int NH, float scale) {
  const ForwardSmem<E, HS> sm{DynamicShared()};
  constexpr int kLE = kRowStride<HS>;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const HeadIndex hi = HeadIndex::OfBlock(T, NH, HS);
  const int tiles = (T + kTile - 1) / kTile;
  const int qt = tiles - 1 - static_cast<int>(blockIdx.y);
  const int q0 = qt * kTile;
  E* q_s = sm.tile(0);
  E* k_s = sm.tile(1);
  E* v_s = sm.tile(2);
  LoadTile<E, HS>(q_s, hi.QkvRows(qkv, 0), q0, T);
  LoadTile<E, HS>(k_s, hi.QkvRows(qkv, 1), 0, T);
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncthreads();
  uint32_t qa[HS / 16][4];  // the warp's 16 query rows as A operands
  LoadWarpRows<E, HS>(qa, q_s);

  const float scale_log2 = scale * kLog2e;  // scores in log2 units: exp2 is one instruction
  const int query = q0 + warp * kRows + g;
  float o[HS / 8][4] = {};              // the running output, unnormalized
  float m[2] = {-INFINITY, -INFINITY};  // running max of rows g, g + 8 (log2 units)
  float l[2] = {0.0f, 0.0f};            // this lane's part of the running sum of exp2(s - m)
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    // On the diagonal tile, key chunks past the warp's rows are masked whole: skipped.
    const bool diagonal = kt == qt;
    const int chunks = diagonal ? warp + 1 : kTile / 16;
    if (kt > 0) {
      CpAsyncWait<0>();
      __syncthreads();  // k tile kt is in, and every warp is done with value tile kt - 1
    }
    LoadTile<E, HS>(v_s, hi.QkvRows(qkv, 2), k0, T);
    CpAsyncCommit();
    float s[kTile / 8][4] = {};
    // (Constant bounds, with the chunk count as a condition, keep s in registers.)
#pragma unroll
    for (int c = 0; c < kTile / 16; ++c) {
      if (c < chunks) RowsTimesRowsT<E, HS>(s[2 * c], s[2 * c + 1], qa, k_s, c * 16);
    }
    float mx[2] = {-INFINITY, -INFINITY};
    for (int n = 0; n < kTile / 8; ++n) {
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + 8 * n + 2 * t + e % 2;
        float x = s[n][e] * scale_log2;
        if (diagonal && key > query + 8 * (e / 2)) x = -INFINITY;  // keys past T are too
        s[n][e] = x;
        mx[e / 2] = fmaxf(mx[e / 2], x);
      }
    }
    float corr[2];
    for (int h = 0; h < 2; ++h) {
      // The quad (4 lanes) that shares a row; key k0 <= query is in every row, so m_new is
      // finite and exp2(-inf) = 0 rescales the empty start.
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m[h], mx[h]);
      corr[h] = exp2f(m[h] - m_new);
      m[h] = m_new;
      l[h] *= corr[h];
    }
    for (int n = 0; n < kTile / 8; ++n) {
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - m[e / 2]);
        l[e / 2] += s[n][e];
      }
    }
    for (int n = 0; n < HS / 8; ++n) {
      for (int e = 0; e < 4; ++e) o[n][e] *= corr[e / 2];
    }
    CpAsyncWait<0>();
    __syncthreads();  // value tile kt is in, and every warp is done with k tile kt
    if (kt < qt) {
      LoadTile<E, HS>(k_s, hi.QkvRows(qkv, 1), k0 + kTile, T);
      CpAsyncCommit();
    }
#pragma unroll
    for (int c = 0; c < kTile / 16; ++c) {  // o += p @ v
      if (c >= chunks) continue;
      uint32_t pa[4];
      PackA<E>(pa, s[2 * c], s[2 * c + 1]);
      AccumulateTimesRows<E, HS>(o, pa, v_s, c * 16);
    }
  }
  float inv[2];
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    inv[h] = 1.0f / l[h];
    if (t == 0 && query + 8 * h < T) {
      lse[static_cast<int64_t>(hi.bh) * T + query + 8 * h] = (m[h] + log2f(l[h])) * kLn2;
    }
  }
  StoreRows<E, HS>(hi.OutRows(out), q0 + warp * kRows, T, o, inv[0], inv[1],
                   q_s + warp * kRows * kLE);
}

// ---- backward --------------------------------------------------------------------------------

// rowdot[bh, t] = sum over d of dout[b, t, h, d] * out[b, t, h, d] (f32): FlashAttention's D,
// which equals sum_j p[t, j] * dp[t, j]. One warp per row; rows = B * NH * T.
template <typename E>
__global__ void RowDotKernel(float* rowdot, const E* dout, const E* out, int T, int NH, int HS,
                             int64_t rows) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = WarpRow();
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  const HeadIndex hi{T, NH, HS, static_cast<int>(row / T)};
  const E* d = dout + hi.Out(t);
  const E* o = out + hi.Out(t);
  float acc = 0.0f;
  for (int c = lane; c < HS; c += kWarpSize) acc += ToF32(d[c]) * ToF32(o[c]);
  acc = WarpSum(acc);
  if (lane == 0) rowdot[row] = acc;
}

// The lse (in log2 units) and rowdot of query row q0 + threadIdx.x, for threads below kTile:
// read into registers ahead of time (Read), then stored in shared rows (Write). Rows at or
// past T get lse = +inf, so that their probabilities are exp2(-inf) = 0.
struct RowStats {
  float lse2 = INFINITY, dot = 0.0f;
  static __device__ RowStats Read(const float* lse, const float* rowdot, const HeadIndex& hi,
                                  int q0, int T) {
    RowStats r;
    const int i = static_cast<int>(threadIdx.x);
    if (i < kTile && q0 + i < T) {
      const int64_t at = static_cast<int64_t>(hi.bh) * T + q0 + i;
      r.lse2 = lse[at] * kLog2e;
      r.dot = rowdot[at];
    }
    return r;
  }
  __device__ void Write(float* lse_s, float* dot_s) const {
    if (threadIdx.x < kTile) {
      lse_s[threadIdx.x] = lse2;
      dot_s[threadIdx.x] = dot;
    }
  }
};
static_assert(kFlashThreads >= kTile, "a thread per row of statistics");

// The probability and score gradient of one element from its score s and probability
// gradient dp: p = exp2(s scale log2(e) - lse2) (0 where masked), ds = p (dp - rowdot) scale.
__device__ __forceinline__ float ProbAndGrad(bool masked, float s, float dp, float lse2, float dot,
                                             float scale_log2, float scale, float* ds) {
  const float p = masked ? 0.0f : exp2f(s * scale_log2 - lse2);
  *ds = p * (dp - dot) * scale;
  return p;
}

// dk and dv of one key tile: grid (B * NH, ceil(T / kTile)); block y = 0 takes key tile 0
// (which every query tile sees: the most work). Each warp owns 16 keys (its lanes' rows key
// and key + 8) and walks the query tiles from the diagonal on, 16 queries at a time, with
// scores and probabilities transposed (keys as rows). The q and dout tiles are double
// buffered: the next pair loads while the block computes on this one.
template <typename E, int HS>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardKvKernel(E* dqkv, const E* qkv, const E* dout, const float* lse,
                          const float* rowdot, int T, int NH, float scale) {
  const BackwardSmem<E, HS> sm{DynamicShared()};
  constexpr int kLE = kRowStride<HS>;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const HeadIndex hi = HeadIndex::OfBlock(T, NH, HS);
  const int tiles = (T + kTile - 1) / kTile;
  const int kt = static_cast<int>(blockIdx.y);
  const int k0 = kt * kTile;
  E* k_s = sm.tile(0);
  E* v_s = sm.tile(1);
  auto q_s = [&](int buf) { return sm.tile(2 + buf); };
  auto do_s = [&](int buf) { return sm.tile(4 + buf); };
  LoadTile<E, HS>(k_s, hi.QkvRows(qkv, 1), k0, T);
  LoadTile<E, HS>(v_s, hi.QkvRows(qkv, 2), k0, T);
  LoadTile<E, HS>(q_s(0), hi.QkvRows(qkv, 0), k0, T);  // the first query tile is the diagonal
  LoadTile<E, HS>(do_s(0), hi.OutRows(dout), k0, T);
  CpAsyncCommit();
  RowStats::Read(lse, rowdot, hi, k0, T).Write(sm.row(0), sm.row(2));
  CpAsyncWait<0>();
  __syncthreads();
  uint32_t ka[HS / 16][4], va[HS / 16][4];  // the warp's 16 keys (and values) as A operands
  LoadWarpRows<E, HS>(ka, k_s);
  LoadWarpRows<E, HS>(va, v_s);
  const float scale_log2 = scale * kLog2e;
  const int key = k0 + warp * kRows + g;
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  for (int qt = kt; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    const bool diagonal = qt == kt;
    const int buf = (qt - kt) % 2;
    const bool next = qt + 1 < tiles;
    if (next) {  // into the other buffers, which every warp left at the end of the last turn
      LoadTile<E, HS>(q_s(1 - buf), hi.QkvRows(qkv, 0), q0 + kTile, T);
      LoadTile<E, HS>(do_s(1 - buf), hi.OutRows(dout), q0 + kTile, T);
    }
    CpAsyncCommit();
    const RowStats stats = next ? RowStats::Read(lse, rowdot, hi, q0 + kTile, T) : RowStats{};
    CpAsyncWait<1>();
    __syncthreads();  // this turn's tiles and row statistics are in
    const E* qb = q_s(buf);
    const E* dob = do_s(buf);
    const float* lse_s = sm.row(buf);
    const float* dot_s = sm.row(2 + buf);
    // On the diagonal tile, query chunks before the warp's keys are masked whole: skipped.
    for (int c = diagonal ? warp : 0; c < kTile / 16; ++c) {
      float st[2][4] = {}, dpt[2][4] = {};  // scores^T and d(probabilities)^T, 16 x 16
      RowsTimesRowsT<E, HS>(st[0], st[1], ka, qb, c * 16);
      RowsTimesRowsT<E, HS>(dpt[0], dpt[1], va, dob, c * 16);
      float pt[2][4], dst[2][4];
      for (int n = 0; n < 2; ++n) {
        for (int e = 0; e < 4; ++e) {
          const int col = c * 16 + 8 * n + 2 * t + e % 2;  // the query's row in the tile
          const bool masked = diagonal && q0 + col < key + 8 * (e / 2);
          pt[n][e] = ProbAndGrad(masked, st[n][e], dpt[n][e], lse_s[col], dot_s[col], scale_log2,
                                 scale, &dst[n][e]);
        }
      }
      uint32_t a[4];
      PackA<E>(a, pt[0], pt[1]);
      AccumulateTimesRows<E, HS>(dv, a, dob, c * 16);  // dv += p^T @ dout
      PackA<E>(a, dst[0], dst[1]);
      AccumulateTimesRows<E, HS>(dk, a, qb, c * 16);  // dk += ds^T @ q
    }
    if (next) stats.Write(sm.row(1 - buf), sm.row(3 - buf));
    __syncthreads();  // every warp is done with this turn's buffers before the next refills them
  }
  const int row0 = k0 + warp * kRows;
  StoreRows<E, HS>(hi.QkvRows(dqkv, 1), row0, T, dk, 1.0f, 1.0f, k_s + warp * kRows * kLE);
  StoreRows<E, HS>(hi.QkvRows(dqkv, 2), row0, T, dv, 1.0f, 1.0f, v_s + warp * kRows * kLE);
}

// dq of one query tile: grid (B * NH, ceil(T / kTile)); block y = 0 takes the last query
// tile. Each warp owns 16 query rows (its lanes' rows query and query + 8) and walks the key
// tiles up to the diagonal, 16 keys at a time. The k and v tiles are double buffered: the
// next pair loads while the block computes on this one.
template <typename E, int HS>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardQKernel(E* dqkv, const E* qkv, const E* dout, const float* lse,
                         const float* rowdot, int T, int NH, float scale) {
  const BackwardSmem<E, HS> sm{DynamicShared()};
  constexpr int kLE = kRowStride<HS>;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const HeadIndex hi = HeadIndex::OfBlock(T, NH, HS);
  const int tiles = (T + kTile - 1) / kTile;
  const int qt = tiles - 1 - static_cast<int>(blockIdx.y);
  const int q0 = qt * kTile;
  E* q_s = sm.tile(0);
  E* do_s = sm.tile(1);
  auto k_s = [&](int buf) { return sm.tile(2 + buf); };
  auto v_s = [&](int buf) { return sm.tile(4 + buf); };
  LoadTile<E, HS>(q_s, hi.QkvRows(qkv, 0), q0, T);
  LoadTile<E, HS>(do_s, hi.OutRows(dout), q0, T);
  LoadTile<E, HS>(k_s(0), hi.QkvRows(qkv, 1), 0, T);
  LoadTile<E, HS>(v_s(0), hi.QkvRows(qkv, 2), 0, T);
  CpAsyncCommit();
  RowStats::Read(lse, rowdot, hi, q0, T).Write(sm.row(0), sm.row(1));
  CpAsyncWait<0>();
  __syncthreads();
  uint32_t qa[HS / 16][4], doa[HS / 16][4];  // the warp's 16 rows of q and dout
  LoadWarpRows<E, HS>(qa, q_s);
  LoadWarpRows<E, HS>(doa, do_s);
  const int rr = warp * kRows + g;  // the lane's first row in the tile
  const float lse2[2] = {sm.row(0)[rr], sm.row(0)[rr + 8]};
  const float dot[2] = {sm.row(1)[rr], sm.row(1)[rr + 8]};
  const float scale_log2 = scale * kLog2e;
  const int query = q0 + rr;
  float dq[HS / 8][4] = {};
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    const bool diagonal = kt == qt;
    const int buf = kt % 2;
    if (kt < qt) {  // into the other buffers, which every warp left at the end of the last turn
      LoadTile<E, HS>(k_s(1 - buf), hi.QkvRows(qkv, 1), k0 + kTile, T);
      LoadTile<E, HS>(v_s(1 - buf), hi.QkvRows(qkv, 2), k0 + kTile, T);
    }
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();  // this turn's k and v tiles are in
    const E* kb = k_s(buf);
    const E* vb = v_s(buf);
    // On the diagonal tile, key chunks past the warp's rows are masked whole: skipped.
    const int chunks = diagonal ? warp + 1 : kTile / 16;
    for (int c = 0; c < chunks; ++c) {
      float s[2][4] = {}, dp[2][4] = {};
      RowsTimesRowsT<E, HS>(s[0], s[1], qa, kb, c * 16);
      RowsTimesRowsT<E, HS>(dp[0], dp[1], doa, vb, c * 16);
      float ds[2][4];
      for (int n = 0; n < 2; ++n) {
        for (int e = 0; e < 4; ++e) {
          const int k = k0 + c * 16 + 8 * n + 2 * t + e % 2;
          const bool masked = diagonal && k > query + 8 * (e / 2);
          ProbAndGrad(masked, s[n][e], dp[n][e], lse2[e / 2], dot[e / 2], scale_log2, scale,
                      &ds[n][e]);
        }
      }
      uint32_t a[4];
      PackA<E>(a, ds[0], ds[1]);
      AccumulateTimesRows<E, HS>(dq, a, kb, c * 16);  // dq += ds @ k
    }
    __syncthreads();  // every warp is done with this turn's buffers before the next refills them
  }
  StoreRows<E, HS>(hi.QkvRows(dqkv, 0), q0 + warp * kRows, T, dq, 1.0f, 1.0f,
                   q_s + warp * kRows * kLE);
}
