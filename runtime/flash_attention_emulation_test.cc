// The FlashAttention tensor-core kernels (runtime/cuda/flash_attention_kernels.cuh), compiled
// for the host and run with CUDA's execution model emulated (runtime/cuda_emulation.h: one
// std::thread per CUDA thread, barriers for __syncthreads and __syncwarp, shuffles through
// memory, and ldmatrix and mma.m16n8k16 with the register layouts PTX documents, each
// ldmatrix row address checked for alignment and for staying inside shared memory). Shared
// memory and outputs start as NaN, so an element read before it is written, or never
// written, shows. The results are compared with attention
// computed in double from its definition. This checks the kernels' indexing, masking,
// tiling and synchronization on every machine; the hardware itself (and the compiler's
// code) is checked by cuda_ops_test on a GPU.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cuda_emulation_testing.h"
#include "runtime/cuda_emulation.h"  // last: it defines CUDA's qualifiers

namespace tandem {
namespace ops {
namespace cuda {
namespace {

using cuda_emulation::Close;
using cuda_emulation::DynamicShared;

#include "runtime/cuda/device_functions.cuh"

using Bf16 = __nv_bfloat16;
using F16 = __half;

#include "runtime/cuda/flash_attention_kernels.cuh"

// ---- the check ------------------------------------------------------------------------------

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
  cuda_emulation::TakeError();
  const dim3 grid{static_cast<unsigned int>(B * NH), tiles, 1};
  cuda_emulation::Launch(grid, kFlashThreads, ForwardSmem<E, HS>::kBytes, [&] {
    FlashForwardKernel<E, HS>(out.data(), lse.data(), qkv.data(), T, NH, scale);
  });
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
  cuda_emulation::Launch(RowBlocks(rows), kThreads, 0, [&] {
    RowDotKernel<E>(rowdot.data(), dout.data(), out.data(), T, NH, HS, rows);
  });
  cuda_emulation::Launch(grid, kFlashThreads, BackwardSmem<E, HS>::kBytes, [&] {
    FlashBackwardKvKernel<E, HS>(dqkv.data(), qkv.data(), dout.data(), lse.data(), rowdot.data(), T,
                                 NH, scale);
  });
  cuda_emulation::Launch(grid, kFlashThreads, BackwardSmem<E, HS>::kBytes, [&] {
    FlashBackwardQKernel<E, HS>(dqkv.data(), qkv.data(), dout.data(), lse.data(), rowdot.data(), T,
                                NH, scale);
  });
  EXPECT_EQ(cuda_emulation::TakeError(), "");

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
  Check<F16, 32>(1, 65, 2, 4e-3, 8e-3);
  Check<F16, 64>(1, 129, 1, 4e-3, 8e-3);
  Check<F16, 128>(1, 70, 1, 4e-3, 8e-3);
  // 5 tiles, so the double buffers turn several times; in f16, whose tolerance is tight.
  Check<F16, 64>(1, 300, 1, 4e-3, 8e-3);
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace tandem
