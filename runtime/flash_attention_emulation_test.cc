// The FlashAttention tensor-core kernels (runtime/cuda/flash_attention_kernels.cuh), compiled
// for the host and run with CUDA's execution model emulated: one std::thread per CUDA thread,
// barriers for __syncthreads and __syncwarp, shuffles through memory, and WMMA fragments as
// 16 x 16 matrices with the documented load, store and multiply semantics (checking each
// pointer's 32-byte alignment, ldm, and that it stays inside shared memory). Shared memory
// and outputs start as NaN, so an element read before it is written, or never written, shows.
// The results are compared with attention computed in double from its definition. This
// checks the kernels' indexing, masking, tiling and synchronization on every machine; the
// hardware itself (and the compiler's code) is checked by cuda_ops_test on a GPU.
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/dtype.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

// ---- the emulated device ------------------------------------------------------------------

constexpr int kWarpSize = 32;

// A reusable barrier for n threads.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

struct Dim3 {
  unsigned int x = 0, y = 0, z = 0;
};
thread_local Dim3 threadIdx;
thread_local Dim3 blockIdx;
Dim3 blockDim;

// The block being run (blocks run one after another).
struct Block {
  std::vector<unsigned char> memory;
  unsigned char* shared = nullptr;  // 128-byte aligned, inside memory
  size_t shared_bytes = 0;
  std::unique_ptr<Barrier> all;
  std::vector<std::unique_ptr<Barrier>> warps;
  std::vector<float> shuffle;  // one slot per thread
};
Block* g_block = nullptr;

std::mutex g_error_mu;
std::string g_error;  // the first rule a kernel broke
void Fail(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_error_mu);
  if (g_error.empty()) g_error = what;
}

unsigned char* DynamicShared() { return g_block->shared; }
void __syncthreads() { g_block->all->Wait(); }
void __syncwarp(unsigned int = 0xffffffffu) { g_block->warps[threadIdx.x / kWarpSize]->Wait(); }
float __shfl_xor_sync(unsigned int, float v, int mask) {
  g_block->shuffle[threadIdx.x] = v;
  __syncwarp();
  const int lane = threadIdx.x % kWarpSize;
  const float r = g_block->shuffle[threadIdx.x - lane + (lane ^ mask)];
  __syncwarp();
  return r;
}
float WarpSum(float v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct int4 {
  int x, y, z, w;
};
int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

// 16-bit storage types with the host's rounding (runtime/dtype.h).
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};
template <typename T>
float ToF32(T x);
template <>
float ToF32<Bf16>(Bf16 x) {
  return Bf16ToFloat(x.bits);
}
template <>
float ToF32<F16>(F16 x) {
  return HalfToFloat(x.bits);
}
template <typename T>
T FromF32(float x);
template <>
Bf16 FromF32<Bf16>(float x) {
  return {FloatToBf16(x)};
}
template <>
F16 FromF32<F16>(float x) {
  return {FloatToHalf(x)};
}

// WMMA's 16 x 16 x 16 fragments: the whole matrix in every lane.
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  float x[16][16];
};
using Acc = fragment<accumulator, 16, 16, 16, float>;

void CheckPointer(const void* p, unsigned int ldm, size_t element, unsigned int ldm_multiple) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  const uintptr_t base = reinterpret_cast<uintptr_t>(g_block->shared);
  if (at % 32 != 0) Fail("WMMA pointer not 32-byte aligned");
  if (ldm % ldm_multiple != 0) Fail("WMMA ldm " + std::to_string(ldm) + " not allowed");
  if (at < base || at + (15 * ldm + 16) * element > base + g_block->shared_bytes) {
    Fail("WMMA access outside shared memory");
  }
}
template <typename Use, typename T, typename L>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned int ldm) {
  CheckPointer(p, ldm, sizeof(T), 8);
  const bool rows = std::is_same<L, row_major>::value;
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) f.x[i][j] = ToF32(rows ? p[i * ldm + j] : p[j * ldm + i]);
  }
}
void load_matrix_sync(Acc& f, const float* p, unsigned int ldm, layout_t l) {
  CheckPointer(p, ldm, sizeof(float), 4);
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) f.x[i][j] = l == mem_row_major ? p[i * ldm + j] : p[j * ldm + i];
  }
}
// Every lane arrives, then each stores its share of the elements, as on hardware.
void store_matrix_sync(float* p, const Acc& f, unsigned int ldm, layout_t l) {
  CheckPointer(p, ldm, sizeof(float), 4);
  __syncwarp();
  for (int e = threadIdx.x % kWarpSize; e < 256; e += kWarpSize) {
    const int i = e / 16, j = e % 16;
    (l == mem_row_major ? p[i * ldm + j] : p[j * ldm + i]) = f.x[i][j];
  }
}
template <typename F>
void fill_fragment(F& f, float v) {
  for (auto& row : f.x) {
    for (float& e : row) e = v;
  }
}
template <typename A, typename B>
void mma_sync(Acc& d, const A& a, const B& b, const Acc& c) {
  Acc r;
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      float sum = c.x[i][j];
      for (int k = 0; k < 16; ++k) sum += a.x[i][k] * b.x[k][j];
      r.x[i][j] = sum;
    }
  }
  d = r;
}
}  // namespace wmma

#define __global__
#define __device__
#define __forceinline__
#define __launch_bounds__(n)
#include "runtime/cuda/flash_attention_kernels.cuh"
#undef __global__
#undef __device__
#undef __forceinline__
#undef __launch_bounds__

// Runs kernel() as a grid of (gx, gy) blocks of `threads` threads with `shared` bytes of
// dynamic shared memory, which starts as NaN.
void Launch(unsigned int gx, unsigned int gy, int threads, size_t shared,
            const std::function<void()>& kernel) {
  blockDim = {static_cast<unsigned int>(threads), 1, 1};
  for (unsigned int y = 0; y < gy; ++y) {
    for (unsigned int x = 0; x < gx; ++x) {
      Block b;
      b.memory.assign(shared + 128, 0xff);
      const uintptr_t at = reinterpret_cast<uintptr_t>(b.memory.data());
      b.shared = b.memory.data() + (128 - at % 128) % 128;
      b.shared_bytes = shared;
      b.all = std::make_unique<Barrier>(threads);
      for (int w = 0; w < threads / kWarpSize; ++w) {
        b.warps.push_back(std::make_unique<Barrier>(kWarpSize));
      }
      b.shuffle.resize(threads);
      g_block = &b;
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          threadIdx = {static_cast<unsigned int>(t), 0, 0};
          blockIdx = {x, y, 0};
          kernel();
        });
      }
      for (std::thread& t : ts) t.join();
      g_block = nullptr;
    }
  }
}

// ---- the check ------------------------------------------------------------------------------

// Every element within tol * (|want| + rms(want)) of attention computed in double.
::testing::AssertionResult Close(const char* what, const std::vector<float>& got,
                                 const std::vector<double>& want, double tol) {
  double sq = 0;
  for (double w : want) sq += w * w;
  const double rms = std::sqrt(sq / want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= tol * (std::fabs(want[i]) + rms))) {  // a nan fails too
      return ::testing::AssertionFailure() << what << " element " << i << ": got " << got[i]
                                           << ", want " << want[i] << " (rms " << rms << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename E, int HS>
void Check(int B, int T, int NH, double tol, double grad_tol) {
  SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " NH=" << NH << " HS=" << HS);
  const int64_t C = static_cast<int64_t>(NH) * HS;
  std::mt19937 gen(B * 1000 + T * 10 + NH + HS);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<E> qkv(B * T * 3 * C), dout(B * T * C);
  for (E& x : qkv) x = FromF32<E>(normal(gen));
  for (E& x : dout) x = FromF32<E>(normal(gen));
  const E nan = FromF32<E>(NAN);
  std::vector<E> out(B * T * C, nan), dqkv(qkv.size(), nan);
  std::vector<float> lse(B * NH * T, NAN), rowdot(B * NH * T, NAN);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const unsigned int tiles = (T + kTile - 1) / kTile;
  const size_t bytes = Smem<E, HS>::kBytes;
  g_error.clear();
  Launch(B * NH, tiles, kFlashThreads, bytes,
         [&] { FlashForwardKernel<E, HS>(out.data(), lse.data(), qkv.data(), T, NH, scale); });
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
  Launch(static_cast<unsigned int>((rows + 7) / 8), 1, 8 * kWarpSize, 0,
         [&] { RowDotKernel<E>(rowdot.data(), dout.data(), out.data(), T, NH, HS, rows); });
  Launch(B * NH, tiles, kFlashThreads, bytes, [&] {
    FlashBackwardKvKernel<E, HS>(dqkv.data(), qkv.data(), dout.data(), lse.data(), rowdot.data(), T,
                                 NH, scale);
  });
  Launch(B * NH, tiles, kFlashThreads, bytes, [&] {
    FlashBackwardQKernel<E, HS>(dqkv.data(), qkv.data(), dout.data(), lse.data(), rowdot.data(), T,
                                NH, scale);
  });
  EXPECT_EQ(g_error, "");

  // Attention by its definition, in double, from the same rounded inputs.
  std::vector<double> want_out(out.size()), want_lse(lse.size()), want_d(dqkv.size());
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      auto at = [&](int sec, int t, int d) { return (b * T + t) * 3 * C + sec * C + h * HS + d; };
      auto x = [&](int sec, int t, int d) {
        return static_cast<double>(ToF32(qkv[at(sec, t, d)]));
      };
      auto g = [&](int t, int d) {
        return static_cast<double>(ToF32(dout[(b * T + t) * C + h * HS + d]));
      };
      std::vector<double> p(T * T, 0.0), ds(T * T, 0.0);
      for (int t = 0; t < T; ++t) {
        double mx = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          double dot = 0;
          for (int d = 0; d < HS; ++d) dot += x(0, t, d) * x(1, j, d);
          p[t * T + j] = dot * scale;
          mx = std::max(mx, p[t * T + j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; ++j) sum += std::exp(p[t * T + j] - mx);
        const double l = mx + std::log(sum);
        want_lse[(b * NH + h) * T + t] = l;
        for (int j = 0; j <= t; ++j) p[t * T + j] = std::exp(p[t * T + j] - l);
        for (int d = 0; d < HS; ++d) {
          double o = 0;
          for (int j = 0; j <= t; ++j) o += p[t * T + j] * x(2, j, d);
          want_out[(b * T + t) * C + h * HS + d] = o;
        }
        std::vector<double> dp(t + 1);
        double rowsum = 0;
        for (int j = 0; j <= t; ++j) {
          dp[j] = 0;
          for (int d = 0; d < HS; ++d) dp[j] += g(t, d) * x(2, j, d);
          rowsum += dp[j] * p[t * T + j];
        }
        for (int j = 0; j <= t; ++j) ds[t * T + j] = p[t * T + j] * (dp[j] - rowsum) * scale;
      }
      for (int t = 0; t < T; ++t) {
        for (int d = 0; d < HS; ++d) {
          double dq = 0, dk = 0, dv = 0;
          for (int j = 0; j < T; ++j) {
            dq += ds[t * T + j] * x(1, j, d);
            dk += ds[j * T + t] * x(0, j, d);
            dv += p[j * T + t] * g(j, d);
          }
          want_d[at(0, t, d)] = dq;
          want_d[at(1, t, d)] = dk;
          want_d[at(2, t, d)] = dv;
        }
      }
    }
  }
  auto floats = [](const std::vector<E>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = ToF32(v[i]);
    return f;
  };
  EXPECT_TRUE(Close("lse", lse, want_lse, 1e-5));
  EXPECT_TRUE(Close("out", floats(out), want_out, tol));
  EXPECT_TRUE(Close("dqkv", floats(dqkv), want_d, grad_tol));
}

// The probabilities and score gradients are rounded to the input type before the tensor
// cores: bf16 keeps 8 bits of mantissa, and the score gradients p * (dp - rowdot) lose more
// to cancellation, hence 2e-2 for out and 5e-2 for the gradients; f16 keeps 11 bits. (A
// masking or tiling error is off by the size of the values.)
TEST(FlashAttentionEmulationTest, OneTile) {
  Check<Bf16, 32>(1, 1, 1, 2e-2, 5e-2);   // a single row
  Check<Bf16, 64>(1, 64, 1, 2e-2, 5e-2);  // exactly one tile
}

TEST(FlashAttentionEmulationTest, PartialAndSeveralTiles) {
  Check<Bf16, 32>(2, 100, 2, 2e-2, 5e-2);
  Check<Bf16, 64>(1, 130, 2, 2e-2, 5e-2);
  Check<Bf16, 128>(1, 70, 1, 2e-2, 5e-2);
  Check<F16, 64>(1, 129, 1, 4e-3, 8e-3);
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace tandem
