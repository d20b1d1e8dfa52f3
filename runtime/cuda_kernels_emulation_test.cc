// The CUDA backend's kernels (runtime/cuda/*_kernels.cuh), compiled for the host and run with
// CUDA's execution model emulated (runtime/cuda_emulation.h), against the CPU backend's ops
// or a plain reference: their indexing, vector paths, grid-stride loops, warp and block
// reductions, shared memory and atomics are checked on every machine, in f32, bf16 and f16.
// Each kernel runs with the launch configuration its launcher computes (or a smaller grid,
// so that grid-stride loops take several turns). The hardware and the compiler's code are
// checked by cuda_ops_test on a GPU.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/dtype.h"
#include "runtime/ops.h"
#include "runtime/status_testing.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"
#include "runtime/cuda_emulation_testing.h"
#include "runtime/cuda_emulation.h"  // last: it defines CUDA's qualifiers

namespace tandem {
namespace ops {
namespace cuda {
namespace {

using cuda_emulation::Close;
using cuda_emulation::DynamicShared;

#include "runtime/cuda/device_functions.cuh"

// Each file's kernels in a namespace of their own, as each .cu is its own translation unit.
namespace attention {
#include "runtime/cuda/attention_kernels.cuh"
}
namespace classifier {
#include "runtime/cuda/classifier_kernels.cuh"
}
namespace elementwise {
#include "runtime/cuda/elementwise_kernels.cuh"
}
namespace embedding {
#include "runtime/cuda/embedding_kernels.cuh"
}
namespace layernorm {
#include "runtime/cuda/layernorm_kernels.cuh"
}
namespace matmul {
#include "runtime/cuda/matmul_kernels.cuh"
}
namespace optimizer {
#include "runtime/cuda/optimizer_kernels.cuh"
}
namespace reduce {
#include "runtime/cuda/reduce_kernels.cuh"
}
namespace softmax {
#include "runtime/cuda/softmax_kernels.cuh"
}

// ---- host helpers ---------------------------------------------------------------------------

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

template <typename T>
std::vector<T> Stored(const std::vector<float>& f) {
  std::vector<T> v(f.size());
  for (size_t i = 0; i < f.size(); ++i) v[i] = FromF32<T>(f[i]);
  return v;
}
template <typename T>
std::vector<float> Floats(const std::vector<T>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = ToF32(v[i]);
  return f;
}
// The values as the kernel sees them once stored as T.
template <typename T>
std::vector<float> Rounded(const std::vector<float>& f) {
  return Floats(Stored<T>(f));
}

// Relative tolerance of a result stored as T (its rounding, plus f32 summation order).
template <typename T>
double Tol() {
  if (std::is_same<T, float>::value) return 2e-5;
  if (std::is_same<T, __half>::value) return 2e-3;
  return 1e-2;
}

Stream& Cpu() { return **Stream::Compute(Device::Cpu()); }
Tensor F32(const std::vector<float>& v, const Shape& shape) {
  return *Tensor::FromVector(v, shape, Device::Cpu(), DType::kF32);
}
Tensor I32(const std::vector<int32_t>& v, const Shape& shape) {
  return *Tensor::FromInts(v, shape, Device::Cpu());
}
std::vector<float> Values(const Tensor& t) { return *t.ToFloatVector(); }

// Runs a kernel launch and fails the test on any rule the kernel broke.
template <typename F>
void LaunchAndCheck(dim3 grid, dim3 block, size_t shared, F&& kernel) {
  cuda_emulation::Launch(grid, block, shared, kernel);
  const std::string error = cuda_emulation::TakeError();
  EXPECT_EQ(error, "") << "grid " << grid.x << "x" << grid.y << ", block " << block.x << "x"
                       << block.y;
}

template <typename T>
class KernelTest : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, __nv_bfloat16, __half>;
TYPED_TEST_SUITE(KernelTest, StorageTypes);

// ---- layernorm -----------------------------------------------------------------------------

template <typename T, int P, bool kResidual>
void LayerNormForwardCase(int64_t N, int C) {
  SCOPED_TRACE(::testing::Message()
               << "N=" << N << " C=" << C << " P=" << P << " residual=" << kResidual);
  const std::vector<float> a = Rounded<T>(Random(N * C, 1, 2.0f));
  const std::vector<float> b = Rounded<T>(Random(N * C, 2));
  const std::vector<float> w = Rounded<T>(Random(C, 3));
  const std::vector<float> bias = Rounded<T>(Random(C, 4));
  std::vector<T> out(N * C, FromF32<T>(NAN)), residual(N * C, FromF32<T>(NAN));
  std::vector<float> mean(N, NAN), rstd(N, NAN);
  const std::vector<T> a_s = Stored<T>(a), b_s = Stored<T>(b), w_s = Stored<T>(w),
                       bias_s = Stored<T>(bias);
  LaunchAndCheck(RowBlocks(N), kThreads, 0, [&] {
    layernorm::LayerNormForwardKernel<T, P, kResidual>(
        out.data(), mean.data(), rstd.data(), kResidual ? residual.data() : nullptr, a_s.data(),
        kResidual ? b_s.data() : nullptr, w_s.data(), bias_s.data(), N, C);
  });
  // The CPU's LayerNorm of what the kernel normalized: the input, or the rounded residual.
  std::vector<float> x = a;
  if (kResidual) {
    for (int64_t i = 0; i < N * C; ++i) x[i] = a[i] + b[i];
    x = Rounded<T>(x);
    EXPECT_TRUE(Close("residual", Floats(residual), x, 0.0));
  }
  Tensor want = F32(std::vector<float>(N * C), {N, C});
  Tensor want_mean = F32(std::vector<float>(N), {N}), want_rstd = F32(std::vector<float>(N), {N});
  ASSERT_OK(LayerNormForward(Cpu(), want, want_mean, want_rstd, F32(x, {N, C}), F32(w, {C}),
                             F32(bias, {C})));
  EXPECT_TRUE(Close("out", Floats(out), Values(want), Tol<T>()));
  EXPECT_TRUE(Close("mean", mean, Values(want_mean), 1e-5));
  EXPECT_TRUE(Close("rstd", rstd, Values(want_rstd), 1e-5));
}

TYPED_TEST(KernelTest, LayerNormForward) {
  using T = TypeParam;
  constexpr int V = Packed128<T>::size;
  // Rows that leave a block's last warps idle; C of 1, odd, one pack, several packs per lane.
  for (int C : {1, 7, 40, 64, 264}) {
    LayerNormForwardCase<T, 1, false>(13, C);
    LayerNormForwardCase<T, 1, true>(5, C);
    if (C % V == 0) {
      LayerNormForwardCase<T, V, false>(13, C);
      LayerNormForwardCase<T, V, true>(9, C);
    }
  }
}

template <typename T, int P, bool kShared>
void LayerNormBackwardCase(int64_t N, int C, unsigned int blocks) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " P=" << P
                                    << " shared=" << kShared << " blocks=" << blocks);
  const std::vector<float> x = Rounded<T>(Random(N * C, 5, 2.0f));
  const std::vector<float> w = Rounded<T>(Random(C, 6));
  const std::vector<float> g = Rounded<T>(Random(N * C, 7));
  // mean and rstd from the CPU forward.
  Tensor mean = F32(std::vector<float>(N), {N}), rstd = F32(std::vector<float>(N), {N});
  Tensor y = F32(std::vector<float>(N * C), {N, C});
  ASSERT_OK(LayerNormForward(Cpu(), y, mean, rstd, F32(x, {N, C}), F32(w, {C}),
                             F32(std::vector<float>(C), {C})));
  const std::vector<float> mean_v = Values(mean), rstd_v = Values(rstd);
  // Accumulators start non-zero: the kernel adds.
  const std::vector<float> dw0 = Random(C, 8), db0 = Random(C, 9);
  std::vector<float> dw = dw0, db = db0;
  std::vector<T> dinp(N * C, FromF32<T>(NAN));
  const std::vector<T> g_s = Stored<T>(g), x_s = Stored<T>(x), w_s = Stored<T>(w);
  LaunchAndCheck(blocks, kThreads, kShared ? 2 * C * sizeof(float) : 0, [&] {
    layernorm::LayerNormBackwardKernel<T, P, kShared>(dinp.data(), dw.data(), db.data(), g_s.data(),
                                                      x_s.data(), w_s.data(), mean_v.data(),
                                                      rstd_v.data(), N, C);
  });
  Tensor want_dinp = F32(std::vector<float>(N * C), {N, C});
  Tensor want_dw = F32(dw0, {C}), want_db = F32(db0, {C});
  ASSERT_OK(LayerNormBackward(Cpu(), want_dinp, want_dw, want_db, F32(g, {N, C}), F32(x, {N, C}),
                              F32(w, {C}), mean, rstd));
  EXPECT_TRUE(Close("dinp", Floats(dinp), Values(want_dinp), 4 * Tol<T>()));
  EXPECT_TRUE(Close("dweight", dw, Values(want_dw), 1e-4));
  EXPECT_TRUE(Close("dbias", db, Values(want_db), 1e-4));
}

TYPED_TEST(KernelTest, LayerNormBackward) {
  using T = TypeParam;
  constexpr int V = Packed128<T>::size;
  for (int C : {1, 7, 64, 264}) {
    // One block for all rows (grid-stride), and more blocks than rows need.
    for (unsigned int blocks : {1u, 3u}) {
      LayerNormBackwardCase<T, 1, true>(21, C, blocks);
      LayerNormBackwardCase<T, 1, false>(21, C, blocks);
      if (C % V == 0) {
        LayerNormBackwardCase<T, V, true>(21, C, blocks);
        LayerNormBackwardCase<T, V, false>(21, C, blocks);
      }
    }
  }
}

// ---- softmax cross-entropy and softmax ------------------------------------------------------

// Rows of Vp logits of which the first V are the vocabulary's (Vp > V: padded, as GPT-2's
// 50257 to 50304), against the CPU backend given the same V.
template <typename T, int P>
void CrossEntropyCase(int V, int Vp, bool in_place) {
  SCOPED_TRACE(::testing::Message() << "V=" << V << " Vp=" << Vp << " P=" << P
                                    << " in_place=" << in_place);
  const int N = 5;
  const std::vector<float> logits = Rounded<T>(Random(N * Vp, 10, 3.0f));
  const std::vector<int32_t> targets = {0, V - 1, -1, V / 2, 1 % V};
  std::vector<T> x = Stored<T>(logits);
  std::vector<T> separate(N * Vp, FromF32<T>(NAN));
  T* dlogits = in_place ? x.data() : separate.data();
  std::vector<float> losses(N, NAN);
  LaunchAndCheck(N, RowThreads((Vp + P - 1) / P), 0, [&] {
    classifier::CrossEntropyKernel<T, P>(losses.data(), dlogits, x.data(), targets.data(), V,
                                         Vp, 0.25f);
  });
  Tensor want_losses = F32(std::vector<float>(N), {N});
  Tensor want_d = F32(std::vector<float>(N * Vp), {N, Vp});
  ASSERT_OK(SoftmaxCrossEntropy(Cpu(), want_losses, want_d, F32(logits, {N, Vp}),
                                I32(targets, {N}), 0.25f, V));
  EXPECT_TRUE(Close("losses", losses, Values(want_losses), 1e-5));
  const std::vector<float> got_d = Floats(in_place ? x : separate);
  EXPECT_TRUE(Close("dlogits", got_d, Values(want_d), Tol<T>()));
  for (int r = 0; r < N; ++r) {
    for (int c = V; c < Vp; ++c) ASSERT_EQ(got_d[r * Vp + c], 0.0f) << "row " << r << " col " << c;
  }
}

TYPED_TEST(KernelTest, SoftmaxCrossEntropy) {
  using T = TypeParam;
  constexpr int P = Packed128<T>::size;
  for (int V : {1, 37, 64, 3000}) {
    for (bool in_place : {false, true}) {
      CrossEntropyCase<T, 1>(V, V, in_place);
      if (V % P == 0) CrossEntropyCase<T, P>(V, V, in_place);
    }
  }
}

// Padded rows: the softmax over the first V columns only, the padding's gradient 0; the
// padded width (a multiple of 64) takes the vectorized kernel whatever V is.
TYPED_TEST(KernelTest, SoftmaxCrossEntropyMasksPadding) {
  using T = TypeParam;
  constexpr int P = Packed128<T>::size;
  for (auto [V, Vp] : {std::pair{1, 64}, {37, 64}, {300, 320}}) {
    for (bool in_place : {false, true}) {
      CrossEntropyCase<T, 1>(V, Vp, in_place);
      CrossEntropyCase<T, P>(V, Vp, in_place);
    }
  }
}

// A target outside [0, V) other than -1 gives a nan loss and a zero gradient row.
TEST(KernelEmulationTest, CrossEntropyBadTargetIsNan) {
  const int V = 16;
  std::vector<float> logits = Random(2 * V, 11), d(2 * V, NAN), losses(2, 0.0f);
  const std::vector<int32_t> targets = {V, 3};
  LaunchAndCheck(2, 32, 0, [&] {
    classifier::CrossEntropyKernel<float, 1>(losses.data(), d.data(), logits.data(), targets.data(),
                                             V, V, 1.0f);
  });
  EXPECT_TRUE(std::isnan(losses[0]));
  EXPECT_TRUE(std::isfinite(losses[1]));
  for (int c = 0; c < V; ++c) EXPECT_EQ(d[c], 0.0f) << c;
}

// One rank's slice of vocabulary-parallel logits, Vl columns of which `columns` are real,
// holding tokens from `vocab_begin`: each of the three kernels against the CPU op given the
// same inputs (the max and partials as the group's reductions would leave them: here the
// slice's own, which the kernels cannot tell apart).
template <typename T, int P>
void VocabParallelCase(int Vl, int columns, int vocab_begin) {
  SCOPED_TRACE(::testing::Message() << "Vl=" << Vl << " columns=" << columns << " from "
                                    << vocab_begin << " P=" << P);
  const int N = 5;
  const std::vector<float> logits = Rounded<T>(Random(N * Vl, 14, 3.0f));
  // In the slice, before it, past it, ignored, in the slice again.
  const std::vector<int32_t> targets = {vocab_begin, std::max(0, vocab_begin - 1),
                                        vocab_begin + Vl, -1, vocab_begin + columns - 1};
  const std::vector<T> x = Stored<T>(logits);
  const int threads = RowThreads((Vl + P - 1) / P);
  std::vector<float> max(N, NAN), partials(2 * N, NAN), losses(N, NAN);
  LaunchAndCheck(N, threads, 0, [&] {
    classifier::CrossEntropyRowMaxKernel<T, P>(max.data(), x.data(), Vl, columns);
  });
  Tensor want_max = F32(std::vector<float>(N), {N});
  ASSERT_OK(CrossEntropyRowMax(Cpu(), want_max, F32(logits, {N, Vl}), columns));
  EXPECT_EQ(max, Values(want_max));
  LaunchAndCheck(N, threads, 0, [&] {
    classifier::CrossEntropyPartialsKernel<T, P>(partials.data(), x.data(), max.data(),
                                                 targets.data(), N, Vl, columns, vocab_begin);
  });
  Tensor want_partials = F32(std::vector<float>(2 * N), {2, N});
  ASSERT_OK(CrossEntropyPartials(Cpu(), want_partials, F32(logits, {N, Vl}), want_max,
                                 I32(targets, {N}), vocab_begin, columns));
  EXPECT_TRUE(Close("partials", partials, Values(want_partials), 1e-5));
  std::vector<T> d(N * Vl, FromF32<T>(NAN));
  LaunchAndCheck(N, threads, 0, [&] {
    classifier::VocabParallelCrossEntropyKernel<T, P>(losses.data(), d.data(), x.data(),
                                                      max.data(), partials.data(),
                                                      targets.data(), N, Vl, columns,
                                                      vocab_begin, 0.25f);
  });
  Tensor want_losses = F32(std::vector<float>(N), {N});
  Tensor want_d = F32(std::vector<float>(N * Vl), {N, Vl});
  ASSERT_OK(VocabParallelCrossEntropy(Cpu(), want_losses, want_d, F32(logits, {N, Vl}),
                                      want_max, F32(partials, {2, N}), I32(targets, {N}), 0.25f,
                                      vocab_begin, columns));
  // A slice of padding alone has no loss of its own (its sum is 0); only the group's has.
  if (columns > 0) EXPECT_TRUE(Close("losses", losses, Values(want_losses), 1e-5));
  EXPECT_TRUE(Close("dlogits", Floats(d), Values(want_d), Tol<T>()));
}

TYPED_TEST(KernelTest, VocabParallelCrossEntropy) {
  using T = TypeParam;
  constexpr int P = Packed128<T>::size;
  for (auto [Vl, columns, begin] : {std::tuple{16, 16, 0}, {16, 16, 16}, {64, 37, 128},
                                    {3000, 3000, 3000}, {8, 0, 64}}) {
    VocabParallelCase<T, 1>(Vl, columns, begin);
    if (Vl % P == 0) VocabParallelCase<T, P>(Vl, columns, begin);
  }
}

template <typename T, int P>
void SoftmaxCase(int64_t N, int C) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " P=" << P);
  const std::vector<float> x = Rounded<T>(Random(N * C, 12, 3.0f));
  const std::vector<float> g = Rounded<T>(Random(N * C, 13));
  const std::vector<T> x_s = Stored<T>(x);
  std::vector<T> y(N * C, FromF32<T>(NAN));
  const int threads = RowThreads((C + P - 1) / P);
  LaunchAndCheck(static_cast<unsigned int>(N), threads, 0,
                 [&] { softmax::SoftmaxForwardKernel<T, P>(y.data(), x_s.data(), C); });
  Tensor want_y = F32(std::vector<float>(N * C), {N, C});
  ASSERT_OK(SoftmaxForward(Cpu(), want_y, F32(x, {N, C})));
  EXPECT_TRUE(Close("out", Floats(y), Values(want_y), Tol<T>()));
  // Backward in place (dinp = dout), from the kernel's own stored output.
  const std::vector<float> y_f = Floats(y);
  std::vector<T> d = Stored<T>(g);
  LaunchAndCheck(static_cast<unsigned int>(N), threads, 0,
                 [&] { softmax::SoftmaxBackwardKernel<T, P>(d.data(), y.data(), d.data(), C); });
  Tensor want_d = F32(std::vector<float>(N * C), {N, C});
  ASSERT_OK(SoftmaxBackward(Cpu(), want_d, F32(y_f, {N, C}), F32(g, {N, C})));
  EXPECT_TRUE(Close("dinp", Floats(d), Values(want_d), 2 * Tol<T>()));
}

TYPED_TEST(KernelTest, Softmax) {
  using T = TypeParam;
  for (int C : {1, 5, 64, 2056}) {
    SoftmaxCase<T, 1>(3, C);
    if (C % Packed128<T>::size == 0) SoftmaxCase<T, Packed128<T>::size>(3, C);
  }
}

// ---- attention's row kernels and layout changes ---------------------------------------------

template <typename E>
void CausalSoftmaxCase(int T, int64_t rows) {
  SCOPED_TRACE(::testing::Message() << "T=" << T << " rows=" << rows);
  const float scale = 0.3f;
  const std::vector<float> scores = Random(rows * T, 14, 4.0f);
  std::vector<float> att = scores, lse(rows, NAN);
  std::vector<E> low(rows * T, FromF32<E>(NAN));
  LaunchAndCheck(RowBlocks(rows), kThreads, 0, [&] {
    attention::CausalSoftmaxKernel<E>(att.data(), low.data(), lse.data(), T, rows, scale);
  });
  // Reference: row r is query position t = r % T.
  std::vector<float> want(rows * T, 0.0f), want_lse(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int t = static_cast<int>(r % T);
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j <= t; ++j) mx = std::max(mx, double{scale} * scores[r * T + j]);
    for (int j = 0; j <= t; ++j) sum += std::exp(double{scale} * scores[r * T + j] - mx);
    want_lse[r] = static_cast<float>(mx + std::log(sum));
    for (int j = 0; j <= t; ++j) {
      want[r * T + j] = static_cast<float>(std::exp(double{scale} * scores[r * T + j] - mx) / sum);
    }
  }
  EXPECT_TRUE(Close("att", att, want, 1e-5));
  EXPECT_TRUE(Close("att_low", Floats(low), Rounded<E>(att), 0.0));  // the same, rounded
  EXPECT_TRUE(Close("lse", lse, want_lse, 1e-5));

  // The probabilities again, from the raw scores and lse.
  std::vector<float> again = scores;
  LaunchAndCheck(RowBlocks(rows), kThreads, 0,
                 [&] { attention::ProbsFromLseKernel(again.data(), lse.data(), T, rows, scale); });
  EXPECT_TRUE(Close("probabilities from lse", again, want, 1e-5));

  // Backward: dpre = scale * att * (datt - sum(datt * att)) on j <= t, 0 above.
  const std::vector<float> datt = Random(rows * T, 15);
  std::vector<E> dpre(rows * T, FromF32<E>(NAN)), low2(rows * T, FromF32<E>(NAN));
  LaunchAndCheck(RowBlocks(rows), kThreads, 0, [&] {
    attention::CausalSoftmaxBackwardKernel<E>(dpre.data(), low2.data(), datt.data(), att.data(), T,
                                              rows, scale);
  });
  std::vector<float> want_d(rows * T, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const int t = static_cast<int>(r % T);
    double dot = 0;
    for (int j = 0; j <= t; ++j) dot += double{datt[r * T + j]} * att[r * T + j];
    for (int j = 0; j <= t; ++j) {
      want_d[r * T + j] = static_cast<float>(scale * att[r * T + j] * (datt[r * T + j] - dot));
    }
  }
  EXPECT_TRUE(Close("dpre", Floats(dpre), want_d, Tol<E>()));
  EXPECT_TRUE(Close("att_low (backward)", Floats(low2), Rounded<E>(att), 0.0));
}

TYPED_TEST(KernelTest, CausalSoftmax) {
  CausalSoftmaxCase<TypeParam>(1, 3);
  CausalSoftmaxCase<TypeParam>(37, 2 * 37);  // rows not a multiple of a block's 8 warps
  CausalSoftmaxCase<TypeParam>(70, 70);      // several lanes' columns per row
}

// One query over a cache: row `pos` of each head's cache gets the new k and v, and the
// output is softmax(q k^T / sqrt(hs)) v over rows 0..pos, against a double reference; rows
// after pos hold nan, so a read past pos shows.
template <typename E>
void CachedAttentionCase(int NH, int hs, int max_t, int pos) {
  SCOPED_TRACE(::testing::Message() << "NH=" << NH << " hs=" << hs << " max_t=" << max_t
                                    << " pos=" << pos);
  const int64_t C = int64_t{NH} * hs, cache = int64_t{NH} * max_t * hs;
  const std::vector<float> qkv = Rounded<E>(Random(3 * C, 17));
  std::vector<float> kc = Rounded<E>(Random(cache, 18)), vc = Rounded<E>(Random(cache, 19));
  for (int h = 0; h < NH; ++h) {
    for (int64_t i = (int64_t{h} * max_t + pos + 1) * hs; i < int64_t{h + 1} * max_t * hs; ++i) {
      kc[i] = vc[i] = NAN;
    }
  }
  const std::vector<float> kc0 = kc, vc0 = vc;
  std::vector<E> kc_s = Stored<E>(kc), vc_s = Stored<E>(vc), out(C, FromF32<E>(NAN));
  const std::vector<E> qkv_s = Stored<E>(qkv);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  LaunchAndCheck(NH, kThreads, (hs + pos + 1) * sizeof(float), [&] {
    attention::CachedAttentionKernel<E>(out.data(), kc_s.data(), vc_s.data(), qkv_s.data(), pos,
                                        max_t, NH, hs, scale);
  });
  std::vector<float> want(C);
  for (int h = 0; h < NH; ++h) {
    const int64_t row = (int64_t{h} * max_t + pos) * hs;
    for (int d = 0; d < hs; ++d) {
      kc[row + d] = qkv[C + h * hs + d];
      vc[row + d] = qkv[2 * C + h * hs + d];
    }
    std::vector<double> p(pos + 1);
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j <= pos; ++j) {
      double dot = 0;
      for (int d = 0; d < hs; ++d) dot += double{qkv[h * hs + d]} * kc[(int64_t{h} * max_t + j) * hs + d];
      p[j] = dot * scale;
      mx = std::max(mx, p[j]);
    }
    for (double& x : p) sum += (x = std::exp(x - mx));
    for (int d = 0; d < hs; ++d) {
      double acc = 0;
      for (int j = 0; j <= pos; ++j) acc += p[j] / sum * vc[(int64_t{h} * max_t + j) * hs + d];
      want[h * hs + d] = static_cast<float>(acc);
    }
  }
  EXPECT_TRUE(Close("out", Floats(out), want, Tol<E>()));
  EXPECT_TRUE(Close("k_cache", Floats(kc_s), Rounded<E>(kc), 0.0));  // the new row, exactly
  EXPECT_TRUE(Close("v_cache", Floats(vc_s), Rounded<E>(vc), 0.0));
  if (std::is_same<E, float>::value) {
    // The CPU backend's op on the same cache gives the same output.
    Tensor cpu_out = F32(std::vector<float>(C, NAN), {1, C});
    Tensor k = F32(kc0, {NH, max_t, hs}), v = F32(vc0, {NH, max_t, hs});
    ASSERT_OK(ops::CachedAttentionForward(Cpu(), cpu_out, k, v, F32(qkv, {1, 3 * C}), pos, NH));
    EXPECT_TRUE(Close("CPU op", Values(cpu_out), want, Tol<E>()));
    EXPECT_TRUE(Close("CPU op's k_cache", Values(k), kc, 0.0));
  }
}

TYPED_TEST(KernelTest, CachedAttention) {
  CachedAttentionCase<TypeParam>(1, 4, 3, 0);     // the first token: one key
  CachedAttentionCase<TypeParam>(3, 16, 40, 17);  // rows after pos are never read
  CachedAttentionCase<TypeParam>(2, 32, 300, 299);  // more keys than a block's threads
}

template <typename E, int P>
void PermuteCase(int S, int B, int T, int NH, int hs) {
  SCOPED_TRACE(::testing::Message() << "S=" << S << " B=" << B << " T=" << T << " NH=" << NH
                                    << " hs=" << hs << " P=" << P);
  const int64_t C = static_cast<int64_t>(NH) * hs, per = int64_t{B} * NH * T * hs;
  const std::vector<E> rows = Stored<E>(Random(B * T * S * C, 16));
  std::vector<std::vector<E>> heads(3, std::vector<E>(per, FromF32<E>(NAN)));
  const unsigned int blocks = 2;  // grid-stride
  LaunchAndCheck(blocks, kThreads, 0, [&] {
    attention::PermuteKernel<E, P, true>(const_cast<E*>(rows.data()), heads[0].data(),
                                         heads[1].data(), heads[2].data(), S, B, T, NH, hs);
  });
  for (int s = 0; s < S; ++s) {
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        for (int t = 0; t < T; ++t) {
          for (int d = 0; d < hs; ++d) {
            const float got = ToF32(heads[s][((int64_t{b} * NH + h) * T + t) * hs + d]);
            const float want = ToF32(rows[(int64_t{b} * T + t) * S * C + s * C + h * hs + d]);
            ASSERT_EQ(got, want) << s << " " << b << " " << h << " " << t << " " << d;
          }
        }
      }
    }
  }
  std::vector<E> back(rows.size(), FromF32<E>(NAN));
  LaunchAndCheck(blocks, kThreads, 0, [&] {
    attention::PermuteKernel<E, P, false>(back.data(), heads[0].data(), heads[1].data(),
                                          heads[2].data(), S, B, T, NH, hs);
  });
  EXPECT_TRUE(Close("scattered back", Floats(back), Floats(rows), 0.0));
}

TYPED_TEST(KernelTest, Permute) {
  using E = TypeParam;
  constexpr int V = Packed128<E>::size;
  PermuteCase<E, 1>(3, 2, 5, 3, 3);
  PermuteCase<E, 1>(1, 1, 7, 2, 16);
  PermuteCase<E, V>(3, 2, 9, 2, 16);
  PermuteCase<E, V>(1, 2, 33, 4, 32);
}

// ---- embedding ------------------------------------------------------------------------------

// The table's V rows are tokens [vocab_begin, vocab_begin + V) of a `vocab`-token vocabulary
// (a vocabulary-parallel slice; the whole table by default).
template <typename T, int P>
void EmbeddingCase(int B, int seq, int C, int V, int vocab_begin = 0, int vocab = -1) {
  SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << seq << " C=" << C << " P=" << P
                                    << " slice from " << vocab_begin);
  if (vocab == -1) vocab = V;
  const int64_t rows = int64_t{B} * seq;
  const std::vector<float> wte = Rounded<T>(Random(V * C, 17));
  const std::vector<float> wpe = Rounded<T>(Random((seq + 2) * C, 18));  // maxT > T
  std::vector<int32_t> tokens(rows);
  for (int64_t r = 0; r < rows; ++r) tokens[r] = static_cast<int32_t>((r * 7 + 3) % vocab);
  const std::vector<T> wte_s = Stored<T>(wte), wpe_s = Stored<T>(wpe);
  std::vector<T> out(rows * C, FromF32<T>(NAN));
  const unsigned int blocks = BlocksFor(rows * C / P);
  LaunchAndCheck(blocks, kThreads, 0, [&] {
    embedding::EmbeddingForwardKernel<T, P>(out.data(), tokens.data(), wte_s.data(), wpe_s.data(),
                                            rows, seq, C, V, vocab_begin);
  });
  Tensor want = F32(std::vector<float>(rows * C), {B, seq, C});
  ASSERT_OK(EmbeddingForward(Cpu(), want, I32(tokens, {B, seq}), F32(wte, {V, C}),
                             F32(wpe, {seq + 2, C}), vocab_begin, vocab));
  EXPECT_TRUE(Close("out", Floats(out), Values(want), Tol<T>()));

  const std::vector<float> g = Rounded<T>(Random(rows * C, 19));
  const std::vector<T> g_s = Stored<T>(g);
  const std::vector<float> dwte0 = Random(V * C, 20), dwpe0 = Random((seq + 2) * C, 21);
  std::vector<float> dwte = dwte0, dwpe = dwpe0;
  LaunchAndCheck(2, kThreads, 0, [&] {  // two blocks: grid-stride
    embedding::WteBackwardKernel<T, P>(dwte.data(), g_s.data(), tokens.data(), rows, C, V,
                                       vocab_begin);
  });
  LaunchAndCheck(BlocksFor(int64_t{seq} * C), kThreads, 0,
                 [&] { embedding::WpeBackwardKernel<T>(dwpe.data(), g_s.data(), B, seq, C); });
  Tensor want_dwte = F32(dwte0, {V, C}), want_dwpe = F32(dwpe0, {seq + 2, C});
  ASSERT_OK(
      EmbeddingBackward(Cpu(), want_dwte, want_dwpe, F32(g, {B, seq, C}), I32(tokens, {B, seq}),
                        vocab_begin, vocab));
  EXPECT_TRUE(Close("dwte", dwte, Values(want_dwte), 1e-5));
  EXPECT_TRUE(Close("dwpe", dwpe, Values(want_dwpe), 1e-5));
}

TYPED_TEST(KernelTest, Embedding) {
  using T = TypeParam;
  constexpr int V = Packed128<T>::size;
  EmbeddingCase<T, 1>(2, 5, 3, 11);
  EmbeddingCase<T, 1>(3, 7, 16, 5);  // tokens repeat: atomics add
  EmbeddingCase<T, V>(3, 7, 16, 5);
  EmbeddingCase<T, V>(2, 40, 64, 300);
  EmbeddingCase<T, 1>(2, 5, 3, 4, 4, 11);   // the middle of three slices
  EmbeddingCase<T, V>(2, 40, 64, 150, 150, 300);  // the last of two
}

// ---- elementwise ----------------------------------------------------------------------------

template <typename T>
void ElementwiseCase(int64_t N, int64_t C) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C);
  const int64_t n = N * C;
  constexpr int V = Packed128<T>::size;
  const std::vector<float> x = Rounded<T>(Random(n, 22, 2.0f));
  const std::vector<float> g = Rounded<T>(Random(n, 23));
  const std::vector<float> bias = Rounded<T>(Random(C, 24));
  const std::vector<T> x_s = Stored<T>(x), g_s = Stored<T>(g), bias_s = Stored<T>(bias);
  for (bool vec : {false, true}) {
    if (vec && C % V != 0) continue;
    SCOPED_TRACE(vec ? "vector path" : "scalar path");
    const unsigned int blocks = 2;  // grid-stride
    // GELU and its backward through MapKernel.
    std::vector<T> y(n, FromF32<T>(NAN)), d(n, FromF32<T>(NAN));
    LaunchAndCheck(blocks, kThreads, 0, [&] {
      elementwise::MapKernel<T, 1, elementwise::GeluOp>(y.data(), x_s.data(), nullptr, n, vec,
                                                        elementwise::GeluOp{});
    });
    LaunchAndCheck(blocks, kThreads, 0, [&] {
      elementwise::MapKernel<T, 2, elementwise::GeluBackwardOp>(d.data(), x_s.data(), g_s.data(), n,
                                                                vec, elementwise::GeluBackwardOp{});
    });
    Tensor want_y = F32(std::vector<float>(n), {N, C}), want_d = F32(std::vector<float>(n), {N, C});
    ASSERT_OK(GeluForward(Cpu(), want_y, F32(x, {N, C})));
    ASSERT_OK(GeluBackward(Cpu(), want_d, F32(x, {N, C}), F32(g, {N, C})));
    EXPECT_TRUE(Close("gelu", Floats(y), Values(want_y), Tol<T>()));
    EXPECT_TRUE(Close("gelu backward", Floats(d), Values(want_d), Tol<T>()));

    // Bias add, and bias add fused with GELU (pre kept).
    std::vector<T> xb = x_s;
    LaunchAndCheck(blocks, kThreads, 0,
                   [&] { elementwise::BiasAddKernel<T>(xb.data(), bias_s.data(), n, C, vec); });
    Tensor want_xb = F32(x, {N, C});
    ASSERT_OK(BiasAdd(Cpu(), want_xb, F32(bias, {C})));
    EXPECT_TRUE(Close("bias add", Floats(xb), Values(want_xb), Tol<T>()));
    std::vector<T> out(n, FromF32<T>(NAN)), pre(n, FromF32<T>(NAN));
    LaunchAndCheck(blocks, kThreads, 0, [&] {
      elementwise::BiasGeluKernel<T>(out.data(), pre.data(), x_s.data(), bias_s.data(), n, C, vec);
    });
    Tensor want_out = F32(std::vector<float>(n), {N, C}),
           want_pre = F32(std::vector<float>(n), {N, C});
    ASSERT_OK(BiasGeluForward(Cpu(), want_out, want_pre, F32(x, {N, C}), F32(bias, {C})));
    EXPECT_TRUE(Close("bias gelu", Floats(out), Values(want_out), Tol<T>()));
    EXPECT_TRUE(Close("bias gelu pre", Floats(pre), Values(want_pre), Tol<T>()));
  }
}

TYPED_TEST(KernelTest, Elementwise) {
  ElementwiseCase<TypeParam>(1, 1);
  ElementwiseCase<TypeParam>(3, 7);
  ElementwiseCase<TypeParam>(5, 64);
  ElementwiseCase<TypeParam>(37, 40);  // more elements than the grid's threads
}

TEST(KernelEmulationTest, Cast) {
  for (int64_t n : {1, 7, 8, 4099}) {
    for (bool vec : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " vec=" << vec);
      const std::vector<float> x = Random(n, 25, 100.0f);
      std::vector<__nv_bfloat16> low(n, FromF32<__nv_bfloat16>(NAN));
      std::vector<float> back(n, NAN);
      LaunchAndCheck(2, kThreads, 0, [&] {
        elementwise::CastKernel<float, __nv_bfloat16>(low.data(), x.data(), n, vec);
      });
      LaunchAndCheck(2, kThreads, 0, [&] {
        elementwise::CastKernel<__nv_bfloat16, float>(back.data(), low.data(), n, vec);
      });
      EXPECT_TRUE(Close("to bf16", Floats(low), Rounded<__nv_bfloat16>(x), 0.0));
      EXPECT_TRUE(Close("back to f32", back, Rounded<__nv_bfloat16>(x), 0.0));
    }
  }
}

// ---- reductions and column sums -------------------------------------------------------------

template <typename T, int P, bool kSquares>
void SumCase(int64_t n, unsigned int blocks) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " P=" << P << " squares=" << kSquares);
  const std::vector<float> x = Rounded<T>(Random(n, 26));
  const std::vector<T> x_s = Stored<T>(x);
  float out = 1.5f;  // the kernel adds
  LaunchAndCheck(blocks, kThreads, 0,
                 [&] { reduce::SumKernel<T, P, kSquares>(&out, x_s.data(), n); });
  double want = 1.5;
  for (float v : x) want += kSquares ? double{v} * v : v;
  EXPECT_NEAR(out, want, 1e-5 * (std::fabs(want) + std::sqrt(double(n))));
}

TYPED_TEST(KernelTest, Sum) {
  using T = TypeParam;
  constexpr int V = Packed128<T>::size;
  for (int64_t n : {1, 7, 1000, 4099}) {
    SumCase<T, 1, false>(n, 3);
    SumCase<T, 1, true>(n, 3);
    SumCase<T, V, false>(n, 3);  // the tail past the last whole pack too
    SumCase<T, V, true>(n, 1);
  }
  // A nan anywhere reaches the sum (loss scaling looks for it).
  std::vector<T> x = Stored<T>(Random(300, 27));
  x[123] = FromF32<T>(NAN);
  float out = 0.0f;
  LaunchAndCheck(2, kThreads, 0, [&] { reduce::SumKernel<T, 1, true>(&out, x.data(), 300); });
  EXPECT_TRUE(std::isnan(out));
}

template <typename E, typename G>
void ColumnSumCase(int64_t N, int C, int64_t rows_per_chunk) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " chunk=" << rows_per_chunk);
  const std::vector<float> x = Rounded<E>(Random(N * C, 28));
  const std::vector<E> x_s = Stored<E>(x);
  const std::vector<float> dst0 = Rounded<G>(Random(C, 29));
  std::vector<G> dst = Stored<G>(dst0);
  const unsigned int gx = (C + matmul::kColTile - 1) / matmul::kColTile;
  const unsigned int gy = static_cast<unsigned int>((N + rows_per_chunk - 1) / rows_per_chunk);
  std::vector<float> acc(C, 0.0f);
  LaunchAndCheck(dim3(gx, gy), dim3(matmul::kColTile, matmul::kRowLanes), 0, [&] {
    matmul::ColumnSumKernel<E, G>(dst.data(), gy > 1 ? acc.data() : nullptr, x_s.data(), N, C,
                                  rows_per_chunk);
  });
  // Several chunks sum into acc, which AccumulateKernel then adds into dst.
  if (gy > 1) {
    LaunchAndCheck(1, kThreads, 0, [&] { reduce::AccumulateKernel<G>(dst.data(), acc.data(), C); });
  }
  std::vector<float> want(C);
  for (int c = 0; c < C; ++c) {
    double s = dst0[c];
    for (int64_t r = 0; r < N; ++r) s += x[r * C + c];
    want[c] = static_cast<float>(s);
  }
  EXPECT_TRUE(Close("dbias", Floats(dst), want, Tol<G>() + 1e-5));
}

TYPED_TEST(KernelTest, ColumnSum) {
  using E = TypeParam;
  ColumnSumCase<E, E>(1, 1, 1);
  ColumnSumCase<E, E>(70, 33, 70);  // one chunk: straight into dst
  ColumnSumCase<E, E>(70, 33, 16);  // five chunks through the f32 accumulator
  ColumnSumCase<E, float>(100, 64, 64);
}

// ---- optimizers -----------------------------------------------------------------------------

template <typename L, bool kVector>
void OptimizerCase(int64_t n) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " vector=" << kVector);
  const std::vector<float> p0 = Random(n, 30), g = Random(n, 31), m0 = Random(n, 32, 0.1f);
  std::vector<float> v0 = Random(n, 33, 0.1f);
  for (float& x : v0) x = std::fabs(x);
  AdamWConfig c;
  c.lr = 1e-2f;
  c.weight_decay = 0.1f;
  c.step = 3;
  c.grad_scale = 0.5f;
  const optimizer::AdamWArgs a = optimizer::AdamWArgsOf(c);
  std::vector<float> p = p0, m = m0, v = v0;
  std::vector<L> low(n, FromF32<L>(NAN));
  const int64_t work = optimizer::WorkItems(kVector, n);
  LaunchAndCheck(std::min(BlocksFor(work), 2u), kThreads, 0, [&] {
    optimizer::AdamWKernel<L, kVector>(p.data(), g.data(), m.data(), v.data(), low.data(), n, a,
                                       nullptr);
  });
  Tensor want_p = F32(p0, {n}), want_m = F32(m0, {n}), want_v = F32(v0, {n});
  ASSERT_OK(AdamWUpdate(Cpu(), want_p, F32(g, {n}), want_m, want_v, c));
  EXPECT_TRUE(Close("adamw params", p, Values(want_p), 1e-6));
  EXPECT_TRUE(Close("adamw m", m, Values(want_m), 1e-6));
  EXPECT_TRUE(Close("adamw v", v, Values(want_v), 1e-6));
  EXPECT_TRUE(Close("adamw low copy", Floats(low), Rounded<L>(p), 0.0));

  SgdConfig sc;
  sc.lr = 0.05f;
  sc.weight_decay = 0.01f;
  sc.grad_scale = 2.0f;
  const optimizer::SgdArgs sa = optimizer::SgdArgsOf(sc);
  std::vector<float> q = p0, buf = m0;
  LaunchAndCheck(std::min(BlocksFor(work), 2u), kThreads, 0, [&] {
    optimizer::SgdKernel<L, kVector>(q.data(), g.data(), buf.data(), low.data(), n, sa, nullptr);
  });
  Tensor want_q = F32(p0, {n}), want_buf = F32(m0, {n});
  ASSERT_OK(SgdMomentumUpdate(Cpu(), want_q, F32(g, {n}), want_buf, sc));
  EXPECT_TRUE(Close("sgd params", q, Values(want_q), 1e-6));
  EXPECT_TRUE(Close("sgd momentum", buf, Values(want_buf), 1e-6));
  EXPECT_TRUE(Close("sgd low copy", Floats(low), Rounded<L>(q), 0.0));
}

// The device scale (GradScale's factor, read by every thread): the CPU backend's update given
// the same scale on the device, and a scale that is not finite leaves everything unchanged.
template <typename L>
void DeviceScaleCase(int64_t n) {
  SCOPED_TRACE(::testing::Message() << "n=" << n);
  const std::vector<float> p0 = Random(n, 40), g = Random(n, 41), m0 = Random(n, 42, 0.1f);
  std::vector<float> v0 = Random(n, 43, 0.1f);
  for (float& x : v0) x = std::fabs(x);
  AdamWConfig c;
  c.weight_decay = 0.1f;
  c.step = 2;
  const optimizer::AdamWArgs a = optimizer::AdamWArgsOf(c);
  const int64_t work = optimizer::WorkItems(true, n);
  for (float scale : {0.37f, NAN, INFINITY}) {
    std::vector<float> p = p0, m = m0, v = v0;
    std::vector<L> low(n, FromF32<L>(0.0f));
    const float device_scale = scale;
    LaunchAndCheck(std::min(BlocksFor(work), 2u), kThreads, 0, [&] {
      optimizer::AdamWKernel<L, true>(p.data(), g.data(), m.data(), v.data(), low.data(), n, a,
                                      &device_scale);
    });
    Tensor want_p = F32(p0, {n}), want_m = F32(m0, {n}), want_v = F32(v0, {n});
    ASSERT_OK(AdamWUpdate(Cpu(), want_p, F32(g, {n}), want_m, want_v, c, Tensor(),
                          F32({scale}, {1})));
    EXPECT_TRUE(Close("adamw params", p, Values(want_p), 1e-6)) << scale;
    EXPECT_TRUE(Close("adamw m", m, Values(want_m), 1e-6)) << scale;
    if (!std::isfinite(scale)) EXPECT_EQ(p, p0) << "a skipped update wrote";
    std::vector<float> q = p0, buf = m0;
    SgdConfig sc;
    const optimizer::SgdArgs sa = optimizer::SgdArgsOf(sc);
    LaunchAndCheck(std::min(BlocksFor(work), 2u), kThreads, 0, [&] {
      optimizer::SgdKernel<L, true>(q.data(), g.data(), buf.data(), low.data(), n, sa,
                                    &device_scale);
    });
    Tensor want_q = F32(p0, {n}), want_buf = F32(m0, {n});
    ASSERT_OK(SgdMomentumUpdate(Cpu(), want_q, F32(g, {n}), want_buf, sc, Tensor(),
                                F32({scale}, {1})));
    EXPECT_TRUE(Close("sgd params", q, Values(want_q), 1e-6)) << scale;
    if (!std::isfinite(scale)) EXPECT_EQ(q, p0) << "a skipped update wrote";
  }
}

// GradScaleKernel gives the CPU backend's bits: the same operations in the same order.
TEST(KernelEmulationTest, GradScaleIsTheCpuBackends) {
  // 3e38 * 3 * 3 overflows: nan, the update skipped.
  for (float sumsq : {0.0f, 0.3f, 4.0f, 123.0f, 1e30f, 3e38f, NAN, INFINITY}) {
    for (float unscale : {1.0f, 1.0f / 1024, 3.0f}) {
      for (float clip : {0.0f, 1.0f, 2.5f}) {
        float got = -1;
        const float in = sumsq;
        LaunchAndCheck(1, 1, 0, [&] { optimizer::GradScaleKernel(&got, &in, unscale, clip); });
        Tensor want = F32({0.0f}, {1});
        ASSERT_OK(GradScale(Cpu(), want, F32({sumsq}, {1}), unscale, clip));
        const float w = Values(want)[0];
        if (std::isnan(w)) {
          EXPECT_TRUE(std::isnan(got)) << sumsq << " " << unscale << " " << clip;
        } else {
          EXPECT_EQ(got, w) << sumsq << " " << unscale << " " << clip;
        }
      }
    }
  }
}

TEST(KernelEmulationTest, DeviceScale) {
  for (int64_t n : {1, 8, 4099}) {
    DeviceScaleCase<__nv_bfloat16>(n);
    DeviceScaleCase<__half>(n);
  }
}

TEST(KernelEmulationTest, Optimizers) {
  for (int64_t n : {1, 5, 8, 1027, 4099}) {
    OptimizerCase<__nv_bfloat16, false>(n);
    OptimizerCase<__nv_bfloat16, true>(n);
    OptimizerCase<__half, true>(n);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace tandem
