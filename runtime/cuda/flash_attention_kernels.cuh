// The FlashAttention kernels of flash_attention.cu (see flash_attention.cuh), as text that
// flash_attention.cu includes inside tandem::ops::cuda and that
// runtime/flash_attention_emulation_test.cc includes on the host, where CUDA threads, warps
// and WMMA are emulated: the same source is checked without a GPU. The includer provides
// kWarpSize, ToF32 and FromF32, WarpSum, `wmma` (nvcuda::wmma or its emulation) and
// DynamicShared() (the block's dynamic shared memory, 128-byte aligned).
// A block takes 64 rows of one (batch, head) with 4 warps of 16 rows each; tiles of q, k, v
// and dout sit in shared memory, and each warp multiplies 16 x 16 x 16 fragments with WMMA
// (f32 accumulation). WMMA leaves the element layout of a fragment unspecified, so the
// softmax and the masking work on a warp's own f32 copy of its scores in shared memory: lane
// pairs own one row, each lane half of its columns.
// Legend: B = batch, T = sequence, C = channels, NH = heads, HS = head size, bh = b * NH + h.

constexpr int kTile = 64;   // rows of q (or keys) per block and per loaded tile
constexpr int kWarps = 4;   // each owns kRows rows of the block's tile
constexpr int kRows = 16;   // a WMMA fragment's rows
constexpr int kFlashThreads = kWarps * kWarpSize;
constexpr int kPadE = 8;    // elements of padding after each row of a 16-bit tile
constexpr int kPadF = 4;    // floats of padding after each row of an f32 tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Row strides: of score and probability rows (kTile columns).
constexpr int kLS = kTile + kPadF;
constexpr int kLP = kTile + kPadE;

template <typename E>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major>;
template <typename E>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major>;
template <typename E>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Shared memory of both directions, in bytes from the start, every part 32-byte aligned as
// WMMA loads require: four 16-bit (kTile, HS) tiles (q, k, v, dout), two rows of kTile floats
// (lse and rowdot of the query rows), then per warp two f32 (kRows, kTile) tiles (scores and
// their gradient), one f32 (kRows, HS) tile (the running output, or rows on their way out)
// and two 16-bit (kRows, kTile) tiles (probabilities and score gradients for the tensor
// cores).
template <typename E, int HS>
struct Smem {
  static_assert(HS % 16 == 0, "HS must be a multiple of 16");
  static constexpr int kLE = HS + kPadE;  // row stride of a (kTile, HS) tile
  static constexpr int kLO = HS + kPadF;  // row stride of a warp's f32 (kRows, HS) tile
  static constexpr size_t kTileBytes = size_t{kTile} * kLE * sizeof(E);
  static constexpr size_t kRowBytes = kTile * sizeof(float);
  static constexpr size_t kWarpF32 = size_t{kRows} * kLS * sizeof(float);
  static constexpr size_t kWarpOut = size_t{kRows} * kLO * sizeof(float);
  static constexpr size_t kWarpE = size_t{kRows} * kLP * sizeof(E);
  static constexpr size_t kRowsAt = 4 * kTileBytes;
  static constexpr size_t kF32At = kRowsAt + 2 * kRowBytes;
  static constexpr size_t kOutAt = kF32At + 2 * kWarps * kWarpF32;
  static constexpr size_t kEAt = kOutAt + kWarps * kWarpOut;
  static constexpr size_t kBytes = kEAt + 2 * kWarps * kWarpE;
  static_assert(kTileBytes % 32 == 0 && kRowBytes % 32 == 0 && kWarpF32 % 32 == 0 &&
                    kWarpOut % 32 == 0 && kWarpE % 32 == 0,
                "WMMA needs 32-byte alignment");

  unsigned char* base;
  __device__ E* tile(int i) const { return reinterpret_cast<E*>(base + i * kTileBytes); }
  __device__ float* row(int i) const {
    return reinterpret_cast<float*>(base + kRowsAt + i * kRowBytes);
  }
  __device__ float* f32(int warp, int i) const {
    return reinterpret_cast<float*>(base + kF32At + (2 * warp + i) * kWarpF32);
  }
  __device__ float* out(int warp) const {
    return reinterpret_cast<float*>(base + kOutAt + warp * kWarpOut);
  }
  __device__ E* low(int warp, int i) const {
    return reinterpret_cast<E*>(base + kEAt + (2 * warp + i) * kWarpE);
  }
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
};

// Rows [r0, r0 + kTile) of a head matrix (row t at src + at(t), HS contiguous elements) into
// a (kTile, HS) shared tile; rows at or past T become zeros (so masked products stay finite).
template <typename E, int HS, typename At>
__device__ void LoadTile(E* dst, const E* src, At at, int r0, int T) {
  constexpr int kChunks = HS * sizeof(E) / 16;  // 16-byte moves per row
  constexpr int kPer = 16 / sizeof(E);
  for (int i = threadIdx.x; i < kTile * kChunks; i += blockDim.x) {
    const int r = i / kChunks;
    const int c = (i % kChunks) * kPer;
    int4 v = make_int4(0, 0, 0, 0);
    if (r0 + r < T) v = *reinterpret_cast<const int4*>(src + at(r0 + r) + c);
    *reinterpret_cast<int4*>(dst + r * Smem<E, HS>::kLE + c) = v;
  }
}

// out_f32 (kRows, kTile) = a (kRows, HS) @ b (kTile, HS)^T, both shared 16-bit tiles with row
// stride lda / ldb; out with row stride kLS.
template <typename E, int HS>
__device__ void RowsTimesTileT(float* out, const E* a, int lda, const E* b, int ldb) {
  for (int nt = 0; nt < kTile / 16; ++nt) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int ks = 0; ks < HS / 16; ++ks) {
      FragA<E> fa;
      FragBCol<E> fb;  // b^T (HS, kTile) is b read column-major
      wmma::load_matrix_sync(fa, a + ks * 16, lda);
      wmma::load_matrix_sync(fb, b + nt * 16 * ldb + ks * 16, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + nt * 16, acc, kLS, wmma::mem_row_major);
  }
}

// acc[dt] (kRows, 16 columns dt) += p (kRows, kTile, stride kLP) @ b (kTile, HS, stride ldb).
template <typename E, int HS>
__device__ void AccumulateRowsTimesTile(FragAcc (&acc)[HS / 16], const E* p, const E* b,
                                        int ldb) {
  for (int dt = 0; dt < HS / 16; ++dt) {
    for (int ks = 0; ks < kTile / 16; ++ks) {
      FragA<E> fa;
      FragBRow<E> fb;
      wmma::load_matrix_sync(fa, p + ks * 16, kLP);
      wmma::load_matrix_sync(fb, b + ks * 16 * ldb + dt * 16, ldb);
      wmma::mma_sync(acc[dt], fa, fb, acc[dt]);
    }
  }
}

// Writes a warp's (kRows, HS) fragments to rows row0.. of a head matrix (skipping rows at or
// past T), through the warp's f32 staging tile.
template <typename E, int HS, typename At>
__device__ void StoreRows(E* dst, At at, int row0, int T, FragAcc (&acc)[HS / 16],
                          float* stage) {
  constexpr int kLO = Smem<E, HS>::kLO;
  const int lane = threadIdx.x % kWarpSize;
  __syncwarp();
  for (int dt = 0; dt < HS / 16; ++dt) {
    wmma::store_matrix_sync(stage + dt * 16, acc[dt], kLO, wmma::mem_row_major);
  }
  __syncwarp();
  const int r = lane / 2, half = lane % 2;
  if (row0 + r < T) {
    E* d = dst + at(row0 + r) + half * (HS / 2);
    const float* src = stage + r * kLO + half * (HS / 2);
    for (int c = 0; c < HS / 2; ++c) d[c] = FromF32<E>(src[c]);
  }
}

// ---- forward ----------------------------------------------------------------------------------

// grid (B * NH, ceil(T / kTile)); block y = 0 takes the last query tile (the longest rows).
template <typename E, int HS>
__global__ void __launch_bounds__(kFlashThreads)
    FlashForwardKernel(E* out, float* lse, const E* qkv, int T, int NH, float scale) {
  const Smem<E, HS> sm{DynamicShared()};
  constexpr int kLE = Smem<E, HS>::kLE;
  constexpr int kLO = Smem<E, HS>::kLO;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const HeadIndex hi = HeadIndex::OfBlock(T, NH, HS);
  const int tiles = (T + kTile - 1) / kTile;
  const int qt = tiles - 1 - static_cast<int>(blockIdx.y);
  const int q0 = qt * kTile;
  E* q_s = sm.tile(0);
  E* k_s = sm.tile(1);
  E* v_s = sm.tile(2);
  float* s_w = sm.f32(warp, 0);  // the warp's scores
  E* p_w = sm.low(warp, 0);       // and probabilities
  float* o = sm.out(warp);        // its running output (kRows, HS)
  LoadTile<E, HS>(q_s, qkv, [&](int t) { return hi.Qkv(0, t); }, q0, T);
  for (int i = lane; i < kRows * kLO; i += kWarpSize) o[i] = 0.0f;

  const float scale_log2 = scale * kLog2e;  // scores in log2 units: exp2 is one instruction
  const int r = lane / 2, half = lane % 2;
  const int tq = q0 + warp * kRows + r;  // this lane's query row
  float m = -INFINITY;                   // running max of the row (log2 units)
  float l = 0.0f;                        // running sum of exp2(score - m)
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous k and v tiles
    LoadTile<E, HS>(k_s, qkv, [&](int t) { return hi.Qkv(1, t); }, k0, T);
    LoadTile<E, HS>(v_s, qkv, [&](int t) { return hi.Qkv(2, t); }, k0, T);
    __syncthreads();
    RowsTimesTileT<E, HS>(s_w, q_s + warp * kRows * kLE, kLE, k_s, kLE);
    __syncwarp();
    float* srow = s_w + r * kLS + half * (kTile / 2);
    float mx = -INFINITY;
    for (int c = 0; c < kTile / 2; ++c) {
      const int key = k0 + half * (kTile / 2) + c;
      const float x = key <= tq && key < T ? srow[c] * scale_log2 : -INFINITY;
      srow[c] = x;
      mx = fmaxf(mx, x);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float corr = m == -INFINITY ? 0.0f : exp2f(m - m_new);
    E* prow = p_w + r * kLP + half * (kTile / 2);
    float sum = 0.0f;
    for (int c = 0; c < kTile / 2; ++c) {
      const float p = srow[c] == -INFINITY ? 0.0f : exp2f(srow[c] - m_new);
      prow[c] = FromF32<E>(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = m_new;
    float* orow = o + r * kLO + half * (HS / 2);
    for (int c = 0; c < HS / 2; ++c) orow[c] *= corr;
    __syncwarp();
    for (int dt = 0; dt < HS / 16; ++dt) {
      FragAcc acc;
      wmma::load_matrix_sync(acc, o + dt * 16, kLO, wmma::mem_row_major);
      for (int ks = 0; ks < kTile / 16; ++ks) {
        FragA<E> fa;
        FragBRow<E> fb;
        wmma::load_matrix_sync(fa, p_w + ks * 16, kLP);
        wmma::load_matrix_sync(fb, v_s + ks * 16 * kLE + dt * 16, kLE);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(o + dt * 16, acc, kLO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (tq < T) {
    const float inv = 1.0f / l;
    E* dst = out + hi.Out(tq) + half * (HS / 2);
    const float* src = o + r * kLO + half * (HS / 2);
    for (int c = 0; c < HS / 2; ++c) dst[c] = FromF32<E>(src[c] * inv);
    if (half == 0) lse[static_cast<int64_t>(hi.bh) * T + tq] = (m + log2f(l)) * kLn2;
  }
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

// Loads lse and rowdot of query rows q0.. into the block's two shared rows (0 past T).
__device__ void LoadRowStats(float* lse_s, float* dot_s, const float* lse, const float* rowdot,
                             int64_t bh, int q0, int T) {
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    const bool in = q0 + i < T;
    lse_s[i] = in ? lse[bh * T + q0 + i] : 0.0f;
    dot_s[i] = in ? rowdot[bh * T + q0 + i] : 0.0f;
  }
}

// The score gradient of one element: p = exp(scale * s - lse) where `in` (causal and inside
// T), ds = p * (dp - rowdot) * scale. Returns p; ds through *ds.
__device__ __forceinline__ float ProbAndGrad(bool in, float s, float dp, float lse, float dot,
                                             float scale, float* ds) {
  const float p = in ? exp2f((s * scale - lse) * kLog2e) : 0.0f;
  *ds = p * (dp - dot) * scale;
  return p;
}

// dk and dv of one key tile: grid (B * NH, ceil(T / kTile)); block y = 0 takes key tile 0
// (which every query tile sees: the most work). Each warp owns 16 keys and walks the query
// tiles from the diagonal on, with scores and probabilities transposed (keys as rows).
template <typename E, int HS>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardKvKernel(E* dqkv, const E* qkv, const E* dout, const float* lse,
                          const float* rowdot, int T, int NH, float scale) {
  const Smem<E, HS> sm{DynamicShared()};
  constexpr int kLE = Smem<E, HS>::kLE;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const HeadIndex hi = HeadIndex::OfBlock(T, NH, HS);
  const int tiles = (T + kTile - 1) / kTile;
  const int kt = static_cast<int>(blockIdx.y);
  const int k0 = kt * kTile;
  E* k_s = sm.tile(0);
  E* v_s = sm.tile(1);
  E* q_s = sm.tile(2);
  E* do_s = sm.tile(3);
  float* lse_s = sm.row(0);
  float* dot_s = sm.row(1);
  float* st_w = sm.f32(warp, 0);   // scores^T (keys, queries)
  float* dpt_w = sm.f32(warp, 1);  // d(probabilities)^T
  E* pt_w = sm.low(warp, 0);
  E* dst_w = sm.low(warp, 1);
  LoadTile<E, HS>(k_s, qkv, [&](int t) { return hi.Qkv(1, t); }, k0, T);
  LoadTile<E, HS>(v_s, qkv, [&](int t) { return hi.Qkv(2, t); }, k0, T);
  FragAcc dk[HS / 16], dv[HS / 16];
  for (int dt = 0; dt < HS / 16; ++dt) {
    wmma::fill_fragment(dk[dt], 0.0f);
    wmma::fill_fragment(dv[dt], 0.0f);
  }
  const int r = lane / 2, half = lane % 2;
  const int key = k0 + warp * kRows + r;  // this lane's key row
  for (int qt = kt; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();  // every warp is done with the previous q, dout and row tiles
    LoadTile<E, HS>(q_s, qkv, [&](int t) { return hi.Qkv(0, t); }, q0, T);
    LoadTile<E, HS>(do_s, dout, [&](int t) { return hi.Out(t); }, q0, T);
    LoadRowStats(lse_s, dot_s, lse, rowdot, hi.bh, q0, T);
    __syncthreads();
    RowsTimesTileT<E, HS>(st_w, k_s + warp * kRows * kLE, kLE, q_s, kLE);
    RowsTimesTileT<E, HS>(dpt_w, v_s + warp * kRows * kLE, kLE, do_s, kLE);
    __syncwarp();
    for (int c = half * (kTile / 2); c < (half + 1) * (kTile / 2); ++c) {
      const int query = q0 + c;
      float ds;
      const float p = ProbAndGrad(query >= key && query < T, st_w[r * kLS + c],
                                  dpt_w[r * kLS + c], lse_s[c], dot_s[c], scale, &ds);
      pt_w[r * kLP + c] = FromF32<E>(p);
      dst_w[r * kLP + c] = FromF32<E>(ds);
    }
    __syncwarp();
    AccumulateRowsTimesTile<E, HS>(dv, pt_w, do_s, kLE);  // dv += p^T @ dout
    AccumulateRowsTimesTile<E, HS>(dk, dst_w, q_s, kLE);  // dk += ds^T @ q
  }
  const int row0 = k0 + warp * kRows;
  StoreRows<E, HS>(dqkv, [&](int t) { return hi.Qkv(1, t); }, row0, T, dk, sm.out(warp));
  StoreRows<E, HS>(dqkv, [&](int t) { return hi.Qkv(2, t); }, row0, T, dv, sm.out(warp));
}

// dq of one query tile: grid (B * NH, ceil(T / kTile)); block y = 0 takes the last query
// tile. Each warp owns 16 query rows and walks the key tiles up to the diagonal.
template <typename E, int HS>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardQKernel(E* dqkv, const E* qkv, const E* dout, const float* lse,
                         const float* rowdot, int T, int NH, float scale) {
  const Smem<E, HS> sm{DynamicShared()};
  constexpr int kLE = Smem<E, HS>::kLE;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const HeadIndex hi = HeadIndex::OfBlock(T, NH, HS);
  const int tiles = (T + kTile - 1) / kTile;
  const int qt = tiles - 1 - static_cast<int>(blockIdx.y);
  const int q0 = qt * kTile;
  E* q_s = sm.tile(0);
  E* do_s = sm.tile(1);
  E* k_s = sm.tile(2);
  E* v_s = sm.tile(3);
  float* lse_s = sm.row(0);
  float* dot_s = sm.row(1);
  float* s_w = sm.f32(warp, 0);
  float* dp_w = sm.f32(warp, 1);
  E* ds_w = sm.low(warp, 0);
  LoadTile<E, HS>(q_s, qkv, [&](int t) { return hi.Qkv(0, t); }, q0, T);
  LoadTile<E, HS>(do_s, dout, [&](int t) { return hi.Out(t); }, q0, T);
  LoadRowStats(lse_s, dot_s, lse, rowdot, hi.bh, q0, T);
  FragAcc dq[HS / 16];
  for (int dt = 0; dt < HS / 16; ++dt) wmma::fill_fragment(dq[dt], 0.0f);
  const int r = lane / 2, half = lane % 2;
  const int rr = warp * kRows + r;  // this lane's row within the tile
  const int query = q0 + rr;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous k and v tiles (and, the first
                      // time, the q, dout and row tiles are complete)
    LoadTile<E, HS>(k_s, qkv, [&](int t) { return hi.Qkv(1, t); }, k0, T);
    LoadTile<E, HS>(v_s, qkv, [&](int t) { return hi.Qkv(2, t); }, k0, T);
    __syncthreads();
    RowsTimesTileT<E, HS>(s_w, q_s + warp * kRows * kLE, kLE, k_s, kLE);
    RowsTimesTileT<E, HS>(dp_w, do_s + warp * kRows * kLE, kLE, v_s, kLE);
    __syncwarp();
    for (int c = half * (kTile / 2); c < (half + 1) * (kTile / 2); ++c) {
      const int key = k0 + c;
      float ds;
      ProbAndGrad(key <= query && query < T, s_w[r * kLS + c], dp_w[r * kLS + c], lse_s[rr],
                  dot_s[rr], scale, &ds);
      ds_w[r * kLP + c] = FromF32<E>(ds);
    }
    __syncwarp();
    AccumulateRowsTimesTile<E, HS>(dq, ds_w, k_s, kLE);  // dq += ds @ k
  }
  StoreRows<E, HS>(dqkv, [&](int t) { return hi.Qkv(0, t); }, q0 + warp * kRows, T, dq,
                   sm.out(warp));
}
