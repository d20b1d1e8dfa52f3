// The CUDA backend of ops.h against the CPU one: every op runs on both devices from the same
// random values and the results are compared with a per-op tolerance; f32 everywhere, and
// bf16/f16 for the "any float" ops (the CPU reference then computes in f32 from the values
// already rounded to the low precision). Odd sizes reach the kernels' scalar tail paths,
// multiples of 8 their vector paths, one GPT-like shape (N = 512, C = 768) the sizes
// training runs at. Compiles in every build; skips with the reason where no GPU is visible.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/ops.h"
#include "runtime/status_testing.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

#if TANDEM_CUDA
#include "runtime/cuda/gemm.cuh"
#endif

namespace tandem {
namespace ops {
namespace {

using Vec = std::vector<float>;

std::mt19937& Gen() {
  static std::mt19937 gen(20240611);
  return gen;
}

Vec RandVec(int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  Vec v(n);
  for (float& x : v) x = u(Gen());
  return v;
}

std::vector<int32_t> RandInts(int64_t n, int32_t lo, int32_t hi) {  // [lo, hi)
  std::uniform_int_distribution<int32_t> u(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = u(Gen());
  return v;
}

// The value x takes once stored as t.
float RoundTo(DType t, float x) {
  switch (t) {
    case DType::kBF16:
      return Bf16ToFloat(FloatToBf16(x));
    case DType::kF16:
      return HalfToFloat(FloatToHalf(x));
    default:
      return x;
  }
}

// Tolerance relative to the compared values' scale (see Close).
double Tol(DType t) {
  switch (t) {
    case DType::kBF16:
      return 1.5e-2;
    case DType::kF16:
      return 2e-3;
    default:
      return 1e-4;
  }
}

Device Gpu() { return Device::Cuda(0); }
Stream& CpuStream() { return *Stream::Compute(Device::Cpu()).value(); }
Stream& GpuStream() { return *Stream::Compute(Gpu()).value(); }

// One tensor as each backend holds it: f32 on the CPU, `t` on the GPU, the same values.
struct Pair {
  Tensor cpu;
  Tensor gpu;
};

Pair Make(const Vec& values, const Shape& shape, DType t) {
  Vec rounded(values.size());
  for (size_t i = 0; i < values.size(); ++i) rounded[i] = RoundTo(t, values[i]);
  return {Tensor::FromVector(rounded, shape).value(),
          Tensor::FromVector(rounded, shape, Gpu(), t).value()};
}
Pair Random(const Shape& shape, DType t, float lo = -1.0f, float hi = 1.0f) {
  return Make(RandVec(shape.numel(), lo, hi), shape, t);
}
// An output the op must overwrite completely: unwritten elements keep 777 and fail Close.
Pair Output(const Shape& shape, DType t) { return Make(Vec(shape.numel(), 777.0f), shape, t); }
Pair Ints(const std::vector<int32_t>& v, const Shape& shape) {
  return {Tensor::FromInts(v, shape).value(), Tensor::FromInts(v, shape, Gpu()).value()};
}
// Elements [offset, offset + numel) of p seen as `shape`, on both sides: with offset 1 the
// GPU pointer is no longer 16-byte aligned, which sends kernels down their scalar paths.
Pair View(const Pair& p, int64_t offset, const Shape& shape) {
  return {p.cpu.View(offset, shape).value(), p.gpu.View(offset, shape).value()};
}
// The CPU side's current values, as a new pair rounded to t.
Pair CpuValues(const Pair& p, DType t) {
  return Make(p.cpu.ToFloatVector().value(), p.cpu.shape(), t);
}

struct CpuSide {
  const Tensor& operator()(const Pair& p) const { return p.cpu; }
};
struct GpuSide {
  const Tensor& operator()(const Pair& p) const { return p.gpu; }
};

// Runs fn(stream, at) on the CPU and then on the GPU; at(pair) is that side's tensor.
template <typename Fn>
::testing::AssertionResult Both(Fn fn) {
  absl::Status st = fn(CpuStream(), CpuSide{});
  if (!st.ok()) return ::testing::AssertionFailure() << "cpu: " << st;
  st = fn(GpuStream(), GpuSide{});
  if (!st.ok()) return ::testing::AssertionFailure() << "cuda: " << st;
  return ::testing::AssertionSuccess();
}

// Every element of the GPU result within tol * (|want| + rms(want)) of the CPU's: relative
// where values are large, and relative to the tensor's scale where they are near zero.
::testing::AssertionResult Close(const Pair& p, double tol) {
  const Vec want = p.cpu.ToFloatVector().value();
  const Vec got = p.gpu.ToFloatVector().value();
  if (want.size() != got.size()) {
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  }
  double sq = 0.0;
  for (float w : want) sq += static_cast<double>(w) * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(sq / want.size());
  int64_t misses = 0;
  double worst = 0.0;
  std::string first;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double bound = tol * (std::fabs(want[i]) + rms);
    if (!(err <= bound)) {  // a nan fails too
      if (misses++ == 0) {
        first = "element " + std::to_string(i) + ": cuda " + std::to_string(got[i]) +
                ", cpu " + std::to_string(want[i]) + ", allowed error " + std::to_string(bound);
      }
      worst = std::max(worst, err);
    }
  }
  if (misses == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << misses << " of " << want.size() << " elements differ ("
                                       << p.gpu.ToString() << ", rms " << rms << ", worst error "
                                       << worst << "); first: " << first;
}

std::string Name(const Shape& s) { return s.ToString(); }

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    const int devices = CudaDeviceCount(&why);  // why says so too when built without CUDA
    if (!BuiltWithCuda() || devices == 0) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

// The "any float" ops, once per dtype.
class CudaOpsDTypeTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    std::string why;
    const int devices = CudaDeviceCount(&why);  // why says so too when built without CUDA
    if (!BuiltWithCuda() || devices == 0) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

INSTANTIATE_TEST_SUITE_P(Floats, CudaOpsDTypeTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// ---- matmul and linear ----------------------------------------------------------------------

struct MatmulCase {
  int64_t m, n, k;
};

TEST_P(CudaOpsDTypeTest, MatmulAllTransposesAndBetas) {
  const DType t = GetParam();
  for (const MatmulCase& c : {MatmulCase{7, 13, 5}, MatmulCase{64, 32, 48},
                              MatmulCase{512, 768, 768}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f}) {
          SCOPED_TRACE(::testing::Message() << "m=" << c.m << " n=" << c.n << " k=" << c.k
                                            << " ta=" << ta << " tb=" << tb << " beta=" << beta);
          Pair a = Random(ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, t);
          Pair b = Random(tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, t);
          Pair out = beta == 0.0f ? Output({c.m, c.n}, t) : Random({c.m, c.n}, t);
          ASSERT_TRUE(Both([&](Stream& s, auto at) {
            return Matmul(s, at(out), at(a), at(b), ta, tb, 0.5f, beta);
          }));
          EXPECT_TRUE(Close(out, Tol(t)));
        }
      }
    }
  }
}

TEST_P(CudaOpsDTypeTest, MatmulOnUnalignedViews) {
  // Views one element into their buffers: cuBLASLt must be told the real alignment (or
  // the plain cuBLAS fallback must take the shape).
  const DType t = GetParam();
  Pair a_buf = Random({33 * 24 + 1}, t);
  Pair b_buf = Random({24 * 40 + 1}, t);
  Pair out_buf = Random({33 * 40 + 1}, t);
  Pair a = View(a_buf, 1, {33, 24});
  Pair b = View(b_buf, 1, {24, 40});
  Pair out = View(out_buf, 1, {33, 40});
  ASSERT_TRUE(Both([&](Stream& s, auto at) {
    return Matmul(s, at(out), at(a), at(b), false, false, 1.0f, 1.0f);
  }));
  EXPECT_TRUE(Close(out, Tol(t)));
}

struct LinearCase {
  int64_t n, c, oc;
};

TEST_P(CudaOpsDTypeTest, LinearForwardWithAndWithoutBias) {
  const DType t = GetParam();
  // C = 0: out is the bias (or zeros), from an empty product.
  for (const LinearCase& c : {LinearCase{7, 13, 5}, LinearCase{64, 48, 32},
                              LinearCase{512, 768, 2304}, LinearCase{7, 0, 5}}) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "N=" << c.n << " C=" << c.c << " OC=" << c.oc
                                        << " bias=" << with_bias);
      Pair inp = Random({c.n, c.c}, t);
      Pair weight = Random({c.oc, c.c}, t, -0.1f, 0.1f);
      Pair bias = with_bias ? Random({c.oc}, t) : Pair{};
      Pair out = Output({c.n, c.oc}, t);
      ASSERT_TRUE(Both([&](Stream& s, auto at) {
        return LinearForward(s, at(out), at(inp), at(weight), at(bias));
      }));
      EXPECT_TRUE(Close(out, Tol(t)));
    }
  }
}

TEST_P(CudaOpsDTypeTest, LinearGeluForwardKeepsPreActivation) {
  // OC = 5 cannot use cuBLASLt's GELU epilogue (aux ld must be a multiple of 8): the
  // matmul + BiasGelu fallback runs; the others may use the epilogue. cuBLASLt's GELU may
  // use a faster tanh than the CPU's, hence the wider f32 tolerance for out.
  const DType t = GetParam();
  for (const LinearCase& c : {LinearCase{7, 13, 5}, LinearCase{64, 48, 32},
                              LinearCase{512, 768, 3072}, LinearCase{7, 0, 5}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.n << " C=" << c.c << " OC=" << c.oc);
    Pair inp = Random({c.n, c.c}, t);
    Pair weight = Random({c.oc, c.c}, t, -0.1f, 0.1f);
    Pair bias = Random({c.oc}, t);
    Pair out = Output({c.n, c.oc}, t);
    Pair pre = Output({c.n, c.oc}, t);
    ASSERT_TRUE(Both([&](Stream& s, auto at) {
      return LinearGeluForward(s, at(out), at(pre), at(inp), at(weight), at(bias));
    }));
    EXPECT_TRUE(Close(pre, Tol(t)));
    EXPECT_TRUE(Close(out, std::max(Tol(t), 1e-3)));
  }
}

// A bias one element past an aligned address (a view into a flat parameter buffer): the
// matmul's bias epilogue is not used for it, the plain matmul and bias kernels are.
TEST_P(CudaOpsDTypeTest, LinearWithUnalignedBias) {
  const DType t = GetParam();
  const int64_t n = 64, c = 48, oc = 32;
  Pair inp = Random({n, c}, t);
  Pair weight = Random({oc, c}, t, -0.1f, 0.1f);
  Pair bias = View(Random({oc + 1}, t), 1, {oc});
  Pair out = Output({n, oc}, t);
  ASSERT_TRUE(Both([&](Stream& s, auto at) {
    return LinearForward(s, at(out), at(inp), at(weight), at(bias));
  }));
  EXPECT_TRUE(Close(out, Tol(t)));
  Pair gelu = Output({n, oc}, t);
  Pair pre = Output({n, oc}, t);
  ASSERT_TRUE(Both([&](Stream& s, auto at) {
    return LinearGeluForward(s, at(gelu), at(pre), at(inp), at(weight), at(bias));
  }));
  EXPECT_TRUE(Close(pre, Tol(t)));
  EXPECT_TRUE(Close(gelu, std::max(Tol(t), 1e-3)));
}

TEST_P(CudaOpsDTypeTest, LinearBackwardAccumulatesParameterGradients) {
  const DType t = GetParam();
  // OC = 0: dinp is written with zeros, from an empty product.
  for (const LinearCase& c : {LinearCase{7, 13, 5}, LinearCase{64, 48, 32},
                              LinearCase{512, 768, 768}, LinearCase{7, 13, 0}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.n << " C=" << c.c << " OC=" << c.oc);
    Pair dout = Random({c.n, c.oc}, t);
    Pair inp = Random({c.n, c.c}, t);
    Pair weight = Random({c.oc, c.c}, t);
    Pair dinp = Output({c.n, c.c}, t);
    // f32 parameter gradients that already hold a micro-batch's worth.
    Pair dweight = Random({c.oc, c.c}, DType::kF32);
    Pair dbias = Random({c.oc}, DType::kF32);
    for (int round = 0; round < 2; ++round) {
      ASSERT_TRUE(Both([&](Stream& s, auto at) {
        return LinearBackward(s, at(dinp), at(dweight), at(dbias), at(dout), at(inp),
                              at(weight));
      }));
    }
    EXPECT_TRUE(Close(dinp, Tol(t)));
    EXPECT_TRUE(Close(dweight, Tol(t)));
    EXPECT_TRUE(Close(dbias, Tol(t)));
    // Without dinp and dbias.
    ASSERT_TRUE(Both([&](Stream& s, auto at) {
      return LinearBackward(s, Tensor(), at(dweight), Tensor(), at(dout), at(inp), at(weight));
    }));
    EXPECT_TRUE(Close(dweight, Tol(t)));
  }
}

#if TANDEM_CUDA
TEST_F(CudaOpsTest, MatmulAlgorithmIsChosenOncePerShape) {
  Pair a = Random({37, 29}, DType::kF32);
  Pair b = Random({29, 41}, DType::kF32);
  Pair out = Output({37, 41}, DType::kF32);
  const size_t before = cuda::CublasLtCacheSizeForTesting();
  ASSERT_OK(Matmul(GpuStream(), out.gpu, a.gpu, b.gpu, false, false));
  const size_t after_first = cuda::CublasLtCacheSizeForTesting();
  EXPECT_EQ(after_first, before + 1);
  ASSERT_OK(Matmul(GpuStream(), out.gpu, a.gpu, b.gpu, false, false));
  EXPECT_EQ(cuda::CublasLtCacheSizeForTesting(), after_first) << "second call missed the cache";
  ASSERT_OK(Matmul(CpuStream(), out.cpu, a.cpu, b.cpu, false, false));
  EXPECT_TRUE(Close(out, Tol(DType::kF32)));  // the cached algorithm computes the same
  // Same shape, fresh buffers (also 256-byte aligned): still a hit.
  Pair a2 = Random({37, 29}, DType::kF32);
  ASSERT_OK(Matmul(GpuStream(), out.gpu, a2.gpu, b.gpu, false, false));
  EXPECT_EQ(cuda::CublasLtCacheSizeForTesting(), after_first);
  // Another shape is another entry.
  Pair b2 = Random({29, 43}, DType::kF32);
  Pair out2 = Output({37, 43}, DType::kF32);
  ASSERT_OK(Matmul(GpuStream(), out2.gpu, a.gpu, b2.gpu, false, false));
  EXPECT_EQ(cuda::CublasLtCacheSizeForTesting(), after_first + 1);
}
#endif

// ---- elementwise ----------------------------------------------------------------------------

// Odd (scalar tails), multiple of 8 (vector paths), GPT-like.
const std::vector<Shape>& ElementwiseShapes() {
  static const std::vector<Shape> shapes = {{7, 13}, {64, 64}, {512, 768}};
  return shapes;
}

TEST_P(CudaOpsDTypeTest, GeluForwardBackwardAndInPlace) {
  const DType t = GetParam();
  for (const Shape& shape : ElementwiseShapes()) {
    SCOPED_TRACE(Name(shape));
    Pair x = Random(shape, t, -4.0f, 4.0f);
    Pair dout = Random(shape, t);
    Pair out = Output(shape, t);
    Pair dinp = Output(shape, t);
    ASSERT_TRUE(Both([&](Stream& s, auto at) { return GeluForward(s, at(out), at(x)); }));
    EXPECT_TRUE(Close(out, Tol(t)));
    ASSERT_TRUE(
        Both([&](Stream& s, auto at) { return GeluBackward(s, at(dinp), at(x), at(dout)); }));
    EXPECT_TRUE(Close(dinp, Tol(t)));
    ASSERT_TRUE(Both([&](Stream& s, auto at) { return GeluForward(s, at(x), at(x)); }));
    EXPECT_TRUE(Close(x, Tol(t)));
  }
}

TEST_P(CudaOpsDTypeTest, ReluForwardBackward) {
  const DType t = GetParam();
  for (const Shape& shape : ElementwiseShapes()) {
    SCOPED_TRACE(Name(shape));
    Pair x = Random(shape, t);
    Pair out = Output(shape, t);
    ASSERT_TRUE(Both([&](Stream& s, auto at) { return ReluForward(s, at(out), at(x)); }));
    EXPECT_TRUE(Close(out, 0.0));
    Pair dout = Random(shape, t);
    Pair dinp = Output(shape, t);
    ASSERT_TRUE(
        Both([&](Stream& s, auto at) { return ReluBackward(s, at(dinp), at(out), at(dout)); }));
    EXPECT_TRUE(Close(dinp, 0.0));
  }
}

TEST_P(CudaOpsDTypeTest, BiasAddAndBiasGelu) {
  const DType t = GetParam();
  for (const Shape& shape : ElementwiseShapes()) {
    SCOPED_TRACE(Name(shape));
    Pair x = Random(shape, t, -3.0f, 3.0f);
    Pair bias = Random({shape.dim(1)}, t);
    Pair out = Output(shape, t);
    Pair pre = Output(shape, t);
    ASSERT_TRUE(Both(
        [&](Stream& s, auto at) { return BiasGeluForward(s, at(out), at(pre), at(x), at(bias)); }));
    EXPECT_TRUE(Close(pre, Tol(t)));
    EXPECT_TRUE(Close(out, Tol(t)));
    Pair out2 = Output(shape, t);
    ASSERT_TRUE(Both([&](Stream& s, auto at) {
      return BiasGeluForward(s, at(out2), Tensor(), at(x), at(bias));
    }));
    EXPECT_TRUE(Close(out2, Tol(t)));
    ASSERT_TRUE(Both([&](Stream& s, auto at) { return BiasAdd(s, at(x), at(bias)); }));
    EXPECT_TRUE(Close(x, Tol(t)));
  }
}

TEST_P(CudaOpsDTypeTest, AddAxpyScaleFill) {
  const DType t = GetParam();
  for (const Shape& shape : ElementwiseShapes()) {
    SCOPED_TRACE(Name(shape));
    Pair a = Random(shape, t);
    Pair b = Random(shape, t);
    Pair out = Output(shape, t);
    ASSERT_TRUE(Both([&](Stream& s, auto at) { return Add(s, at(out), at(a), at(b)); }));
    EXPECT_TRUE(Close(out, Tol(t)));
    ASSERT_TRUE(Both([&](Stream& s, auto at) { return Axpy(s, at(a), 0.75f, at(b)); }));
    EXPECT_TRUE(Close(a, Tol(t)));
    ASSERT_TRUE(Both([&](Stream& s, auto at) { return Scale(s, at(b), -1.5f); }));
    EXPECT_TRUE(Close(b, Tol(t)));
    ASSERT_TRUE(Both([&](Stream& s, auto at) { return Fill(s, at(out), 0.37f); }));
    EXPECT_TRUE(Close(out, Tol(t)));  // the CPU holds 0.37 in f32, the GPU rounded to t
  }
}

TEST_P(CudaOpsDTypeTest, ElementwiseOnUnalignedViews) {
  const DType t = GetParam();
  const int64_t n = 4096;
  Pair a_buf = Random({n + 1}, t);
  Pair b_buf = Random({n + 1}, t);
  Pair out_buf = Output({n + 1}, t);
  Pair a = View(a_buf, 1, {64, 64});
  Pair b = View(b_buf, 1, {64, 64});
  Pair out = View(out_buf, 1, {64, 64});
  ASSERT_TRUE(Both([&](Stream& s, auto at) { return Add(s, at(out), at(a), at(b)); }));
  EXPECT_TRUE(Close(out, Tol(t)));
  ASSERT_TRUE(Both([&](Stream& s, auto at) { return GeluForward(s, at(out), at(a)); }));
  EXPECT_TRUE(Close(out, Tol(t)));
  Pair bias = View(b_buf, 1, {64});
  ASSERT_TRUE(Both([&](Stream& s, auto at) { return BiasAdd(s, at(a), at(bias)); }));
  EXPECT_TRUE(Close(a, Tol(t)));
}

TEST_F(CudaOpsTest, CastBetweenAllFloatTypes) {
  const DType types[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (DType from : types) {
    for (DType to : types) {
      for (int64_t n : {int64_t{91}, int64_t{4096}, int64_t{512 * 768}}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(from) << " -> " << DTypeName(to) << " n="
                                          << n);
        Vec v = RandVec(n, -100.0f, 100.0f);
        for (float& x : v) x = RoundTo(from, x);
        // The CPU holds 16-bit tensors for Cast: compare the bits' values exactly.
        Tensor in_cpu = Tensor::FromVector(v, {n}, Device::Cpu(), from).value();
        Tensor in_gpu = Tensor::FromVector(v, {n}, Gpu(), from).value();
        Tensor out_cpu = Tensor::Empty({n}, to, Device::Cpu()).value();
        Tensor out_gpu = Tensor::Empty({n}, to, Gpu()).value();
        ASSERT_OK(Cast(CpuStream(), out_cpu, in_cpu));
        ASSERT_OK(Cast(GpuStream(), out_gpu, in_gpu));
        EXPECT_EQ(out_gpu.ToFloatVector().value(), out_cpu.ToFloatVector().value());
      }
    }
  }
}

// ---- normalization and softmax ----------------------------------------------------------------

// Odd C, vector-friendly C, GPT-like, and a C whose shared-memory partials in backward need
// more than 48 KiB.
const std::vector<Shape>& RowShapes() {
  static const std::vector<Shape> shapes = {{7, 13}, {8, 64}, {512, 768}, {3, 8200}};
  return shapes;
}

TEST_P(CudaOpsDTypeTest, LayerNormForwardBackward) {
  const DType t = GetParam();
  for (const Shape& shape : RowShapes()) {
    SCOPED_TRACE(Name(shape));
    const int64_t n = shape.dim(0), c = shape.dim(1);
    Pair inp = Random(shape, t, -2.0f, 3.0f);
    Pair weight = Random({c}, t, 0.5f, 1.5f);
    Pair bias = Random({c}, t);
    Pair out = Output(shape, t);
    Pair mean = Output({n}, DType::kF32);
    Pair rstd = Output({n}, DType::kF32);
    ASSERT_TRUE(Both([&](Stream& s, auto at) {
      return LayerNormForward(s, at(out), at(mean), at(rstd), at(inp), at(weight), at(bias));
    }));
    EXPECT_TRUE(Close(out, Tol(t)));
    EXPECT_TRUE(Close(mean, Tol(t)));
    EXPECT_TRUE(Close(rstd, Tol(t)));

    // Backward from the same statistics on both sides.
    Pair stats_mean = CpuValues(mean, DType::kF32);
    Pair stats_rstd = CpuValues(rstd, DType::kF32);
    Pair dout = Random(shape, t);
    Pair dinp = Output(shape, t);
    Pair dweight = Random({c}, DType::kF32);
    Pair dbias = Random({c}, DType::kF32);
    for (int round = 0; round < 2; ++round) {
      ASSERT_TRUE(Both([&](Stream& s, auto at) {
        return LayerNormBackward(s, at(dinp), at(dweight), at(dbias), at(dout), at(inp),
                                 at(weight), at(stats_mean), at(stats_rstd));
      }));
    }
    EXPECT_TRUE(Close(dinp, Tol(t)));
    EXPECT_TRUE(Close(dweight, Tol(t)));
    EXPECT_TRUE(Close(dbias, Tol(t)));
  }
}

TEST_P(CudaOpsDTypeTest, ResidualLayerNormForward) {
  const DType t = GetParam();
  for (const Shape& shape : RowShapes()) {
    SCOPED_TRACE(Name(shape));
    const int64_t n = shape.dim(0), c = shape.dim(1);
    Pair a = Random(shape, t, -2.0f, 2.0f);
    Pair b = Random(shape, t);
    Pair weight = Random({c}, t, 0.5f, 1.5f);
    Pair bias = Random({c}, t);
    Pair residual = Output(shape, t);
    Pair out = Output(shape, t);
    Pair mean = Output({n}, DType::kF32);
    Pair rstd = Output({n}, DType::kF32);
    ASSERT_TRUE(Both([&](Stream& s, auto at) {
      return ResidualLayerNormForward(s, at(residual), at(out), at(mean), at(rstd), at(a), at(b),
                                      at(weight), at(bias));
    }));
    EXPECT_TRUE(Close(residual, Tol(t)));
    // The GPU normalizes the residual as stored (rounded to t): so does the reference.
    Pair stored = CpuValues(residual, t);
    ASSERT_OK(LayerNormForward(CpuStream(), out.cpu, mean.cpu, rstd.cpu, stored.cpu, weight.cpu,
                               bias.cpu));
    EXPECT_TRUE(Close(out, Tol(t)));
    EXPECT_TRUE(Close(mean, Tol(t)));
    EXPECT_TRUE(Close(rstd, Tol(t)));
  }
}

TEST_P(CudaOpsDTypeTest, SoftmaxForwardBackward) {
  const DType t = GetParam();
  for (const Shape& shape : {Shape{7, 13}, Shape{8, 64}, Shape{512, 768}, Shape{3, 5000}}) {
    SCOPED_TRACE(Name(shape));
    Pair inp = Random(shape, t, -5.0f, 5.0f);
    Pair out = Output(shape, t);
    ASSERT_TRUE(Both([&](Stream& s, auto at) { return SoftmaxForward(s, at(out), at(inp)); }));
    EXPECT_TRUE(Close(out, Tol(t)));
    Pair probs = CpuValues(out, t);
    Pair dout = Random(shape, t);
    Pair dinp = Output(shape, t);
    ASSERT_TRUE(Both([&](Stream& s, auto at) {
      return SoftmaxBackward(s, at(dinp), at(probs), at(dout));
    }));
    EXPECT_TRUE(Close(dinp, Tol(t)));
  }
}

// A nan in a row makes the whole row nan, as on the CPU (the max skips it, the sum does not).
TEST_P(CudaOpsDTypeTest, SoftmaxRowWithNanIsNan) {
  const DType t = GetParam();
  for (int64_t c : {int64_t{13}, int64_t{5000}}) {
    Vec v = RandVec(2 * c, -5.0f, 5.0f);
    v[c / 2] = NAN;  // row 0 only; row 1 stays finite
    Pair inp = Make(v, {2, c}, t);
    Pair out = Output({2, c}, t);
    ASSERT_TRUE(Both([&](Stream& s, auto at) { return SoftmaxForward(s, at(out), at(inp)); }));
    const Vec cpu = out.cpu.ToFloatVector().value();
    const Vec gpu = out.gpu.ToFloatVector().value();
    for (int64_t j = 0; j < c; ++j) {
      ASSERT_TRUE(std::isnan(cpu[j])) << j;
      ASSERT_TRUE(std::isnan(gpu[j])) << "C=" << c << " element " << j;
    }
    for (int64_t j = c; j < 2 * c; ++j) ASSERT_FALSE(std::isnan(gpu[j])) << j;
  }
}

// ---- attention --------------------------------------------------------------------------------

struct AttentionCase {
  int64_t b, t, c, nh;
};

const std::vector<AttentionCase>& AttentionCases() {
  // Odd T with hs = 4; hs = 16; one head block of T = 64; GPT-2 small's heads at T = 256.
  static const std::vector<AttentionCase> cases = {
      {2, 7, 12, 3}, {2, 16, 64, 4}, {1, 64, 48, 3}, {2, 256, 768, 12}};
  return cases;
}

TEST_P(CudaOpsDTypeTest, AttentionForward) {
  // Low precision: the probabilities are rounded to t before att @ v on the GPU.
  const DType t = GetParam();
  for (const AttentionCase& c : AttentionCases()) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.b << " T=" << c.t << " C=" << c.c
                                      << " NH=" << c.nh);
    Pair qkv = Random({c.b, c.t, 3 * c.c}, t);
    Pair out = Output({c.b, c.t, c.c}, t);
    Pair att = Output({c.b, c.nh, c.t, c.t}, DType::kF32);
    ASSERT_TRUE(Both([&](Stream& s, auto at) {
      return AttentionForward(s, at(out), at(att), at(qkv), static_cast<int>(c.nh));
    }));
    EXPECT_TRUE(Close(att, Tol(t)));
    EXPECT_TRUE(Close(out, 2 * Tol(t)));
  }
}

TEST_P(CudaOpsDTypeTest, AttentionBackward) {
  const DType t = GetParam();
  for (const AttentionCase& c : AttentionCases()) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.b << " T=" << c.t << " C=" << c.c
                                      << " NH=" << c.nh);
    const int nh = static_cast<int>(c.nh);
    Pair qkv = Random({c.b, c.t, 3 * c.c}, t);
    Pair out = Output({c.b, c.t, c.c}, DType::kF32);
    Pair att_cpu = Output({c.b, c.nh, c.t, c.t}, DType::kF32);
    ASSERT_OK(AttentionForward(CpuStream(), out.cpu, att_cpu.cpu, qkv.cpu, nh));
    Pair att = CpuValues(att_cpu, DType::kF32);  // the same probabilities on both sides
    Pair dout = Random({c.b, c.t, c.c}, t);
    Pair dqkv = Output({c.b, c.t, 3 * c.c}, t);
    ASSERT_TRUE(Both([&](Stream& s, auto at) {
      return AttentionBackward(s, at(dqkv), at(dout), at(qkv), at(att), nh);
    }));
    EXPECT_TRUE(Close(dqkv, 3 * Tol(t)));
  }
}

// Generation's attention of one query over a cache: the kernel against the CPU loops, with
// pos at the first row, inside, and at the last row of caches up to GPT-2 small's.
TEST_P(CudaOpsDTypeTest, CachedAttentionForward) {
  const DType t = GetParam();
  struct Case {
    int64_t nh, hs, max_t, pos;
  };
  for (const Case& c : {Case{1, 4, 3, 0}, Case{3, 16, 40, 17}, Case{12, 64, 1024, 1023}}) {
    SCOPED_TRACE(::testing::Message() << "NH=" << c.nh << " hs=" << c.hs << " maxT=" << c.max_t
                                      << " pos=" << c.pos);
    const int64_t C = c.nh * c.hs;
    Pair qkv = Random({1, 3 * C}, t);
    Pair k = Random({c.nh, c.max_t, c.hs}, t);
    Pair v = Random({c.nh, c.max_t, c.hs}, t);
    Pair out = Output({1, C}, t);
    ASSERT_TRUE(Both([&](Stream& s, auto at) {
      return CachedAttentionForward(s, at(out), at(k), at(v), at(qkv), c.pos,
                                    static_cast<int>(c.nh));
    }));
    EXPECT_TRUE(Close(out, 2 * Tol(t)));
    EXPECT_TRUE(Close(k, 0.0));  // the new row, exactly; the others untouched
    EXPECT_TRUE(Close(v, 0.0));
  }
}

// FlashAttention: head sizes 32, 64 and 128 in bf16/f16 run on tensor cores (odd T leaves
// partial 64-row tiles; T = 256 takes several), the others (hs 4 and 48, and f32) the
// cuBLAS path with a temporary; the CPU is the reference for both. Empty heads (C = 0: every
// row uniform) and an empty batch too.
const std::vector<AttentionCase>& FlashCases() {
  static const std::vector<AttentionCase> cases = {
      {2, 7, 12, 3}, {1, 1, 64, 1}, {1, 100, 96, 3}, {2, 256, 768, 12}, {1, 130, 256, 2},
      {1, 70, 96, 2}, {2, 5, 0, 1},  {0, 3, 64, 1}};
  return cases;
}

TEST_P(CudaOpsDTypeTest, FlashAttentionForward) {
  const DType t = GetParam();
  for (const AttentionCase& c : FlashCases()) {
    for (int64_t offset : {0, 1}) {  // offset 1: not 16-byte aligned, so never tensor cores
      SCOPED_TRACE(::testing::Message() << "B=" << c.b << " T=" << c.t << " C=" << c.c
                                        << " NH=" << c.nh << " offset=" << offset);
      const Shape shape{c.b, c.t, 3 * c.c};
      Pair qkv = View(Random({shape.numel() + offset}, t), offset, shape);
      Pair out = Output({c.b, c.t, c.c}, t);
      Pair lse = Output({c.b, c.nh, c.t}, DType::kF32);
      ASSERT_TRUE(Both([&](Stream& s, auto at) {
        return FlashAttentionForward(s, at(out), at(lse), at(qkv), static_cast<int>(c.nh));
      }));
      EXPECT_TRUE(Close(lse, Tol(t)));
      EXPECT_TRUE(Close(out, 2 * Tol(t)));
    }
  }
}

TEST_P(CudaOpsDTypeTest, FlashAttentionBackward) {
  const DType t = GetParam();
  for (const AttentionCase& c : FlashCases()) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.b << " T=" << c.t << " C=" << c.c
                                      << " NH=" << c.nh);
    const int nh = static_cast<int>(c.nh);
    Pair qkv = Random({c.b, c.t, 3 * c.c}, t);
    Pair out_cpu = Output({c.b, c.t, c.c}, DType::kF32);
    Pair lse_cpu = Output({c.b, c.nh, c.t}, DType::kF32);
    ASSERT_OK(FlashAttentionForward(CpuStream(), out_cpu.cpu, lse_cpu.cpu, qkv.cpu, nh));
    Pair out = CpuValues(out_cpu, t);  // the same forward results on both sides
    Pair lse = CpuValues(lse_cpu, DType::kF32);
    Pair dout = Random({c.b, c.t, c.c}, t);
    Pair dqkv = Output({c.b, c.t, 3 * c.c}, t);
    ASSERT_TRUE(Both([&](Stream& s, auto at) {
      return FlashAttentionBackward(s, at(dqkv), at(dout), at(qkv), at(out), at(lse), nh);
    }));
    EXPECT_TRUE(Close(dqkv, 3 * Tol(t)));
  }
}

// Each attention op's scratch on the GPU, measured as on the CPU (ops_test): the allocator's
// peak during the call above what was live before it, against AttentionScratchBytes, within
// the rounding of the op's requests (at most 4). Each op runs once first, so that what the
// matmuls allocate once (cuBLASLt's workspace, algorithm trials) is behind it. Head size 64
// (tensor cores for bf16/f16) and 24 (the cuBLAS path for every dtype).
TEST_P(CudaOpsDTypeTest, AttentionScratchIsWhatTheOpsAllocate) {
  const DType t = GetParam();
  Allocator& alloc = **GetAllocator(Gpu());
  auto scratch_of = [&](const std::function<absl::Status()>& op) {
    auto run = [&] {
      EXPECT_TRUE(op().ok());
      EXPECT_TRUE(GpuStream().Synchronize().ok());
    };
    run();
    return PeakAllocatedDuring(alloc, run, /*fresh=*/true);
  };
  auto expect_near = [](int64_t measured, int64_t want) {
    EXPECT_GE(measured, want);
    EXPECT_LE(measured, want + 4 * static_cast<int64_t>(CachingAllocator::kRoundBytes));
  };
  for (const AttentionCase& c : {AttentionCase{2, 64, 128, 2}, AttentionCase{2, 40, 96, 4}}) {
    SCOPED_TRACE(::testing::Message()
                 << "B=" << c.b << " T=" << c.t << " C=" << c.c << " NH=" << c.nh);
    const int nh = static_cast<int>(c.nh);
    Pair qkv = Random({c.b, c.t, 3 * c.c}, t), out = Output({c.b, c.t, c.c}, t);
    Pair dqkv = Output(qkv.gpu.shape(), t), dout = Random({c.b, c.t, c.c}, t);
    Pair att = Output({c.b, c.nh, c.t, c.t}, DType::kF32),
         lse = Output({c.b, c.nh, c.t}, DType::kF32);
    const AttentionScratch standard = AttentionScratchBytes(Gpu(), t, c.b, c.t, c.c, nh, false);
    const AttentionScratch flash = AttentionScratchBytes(Gpu(), t, c.b, c.t, c.c, nh, true);
    EXPECT_GT(standard.forward, 0);
    EXPECT_GT(flash.backward, 0);
    Stream& s = GpuStream();
    expect_near(scratch_of([&] { return AttentionForward(s, out.gpu, att.gpu, qkv.gpu, nh); }),
                standard.forward);
    expect_near(
        scratch_of([&] { return AttentionBackward(s, dqkv.gpu, dout.gpu, qkv.gpu, att.gpu, nh); }),
        standard.backward);
    expect_near(scratch_of([&] { return FlashAttentionForward(s, out.gpu, lse.gpu, qkv.gpu, nh); }),
                flash.forward);
    expect_near(scratch_of([&] {
                  return FlashAttentionBackward(s, dqkv.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu,
                                                nh);
                }),
                flash.backward);
  }
  EXPECT_GT(MatmulWorkspaceBytes(Gpu()), 0);
}

// ---- embedding and loss ---------------------------------------------------------------------

struct EmbeddingCase {
  int64_t b, t, c, v, max_t;
};

TEST_P(CudaOpsDTypeTest, EmbeddingForwardBackward) {
  const DType t = GetParam();
  for (const EmbeddingCase& c : {EmbeddingCase{2, 7, 13, 11, 9}, EmbeddingCase{4, 64, 64, 100, 64},
                                 EmbeddingCase{4, 128, 768, 1000, 256}}) {
    for (bool with_wpe : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "B=" << c.b << " T=" << c.t << " C=" << c.c
                                        << " V=" << c.v << " wpe=" << with_wpe);
      // Few distinct ids, so rows of dwte collect several rows of dout.
      Pair tokens = Ints(RandInts(c.b * c.t, 0, static_cast<int32_t>(c.v)), {c.b, c.t});
      Pair wte = Random({c.v, c.c}, t);
      Pair wpe = with_wpe ? Random({c.max_t, c.c}, t) : Pair{};
      Pair out = Output({c.b, c.t, c.c}, t);
      ASSERT_TRUE(Both([&](Stream& s, auto at) {
        return EmbeddingForward(s, at(out), at(tokens), at(wte), at(wpe));
      }));
      EXPECT_TRUE(Close(out, Tol(t)));

      Pair dout = Random({c.b, c.t, c.c}, t);
      Pair dwte = Random({c.v, c.c}, DType::kF32);
      Pair dwpe = with_wpe ? Random({c.max_t, c.c}, DType::kF32) : Pair{};
      for (int round = 0; round < 2; ++round) {
        ASSERT_TRUE(Both([&](Stream& s, auto at) {
          return EmbeddingBackward(s, at(dwte), at(dwpe), at(dout), at(tokens));
        }));
      }
      EXPECT_TRUE(Close(dwte, Tol(t)));
      if (with_wpe) {
        EXPECT_TRUE(Close(dwpe, Tol(t)));
      }
    }
  }
}

TEST_P(CudaOpsDTypeTest, SoftmaxCrossEntropyWithIgnoredTargets) {
  const DType t = GetParam();
  for (const Shape& shape : {Shape{7, 13}, Shape{64, 1000}, Shape{16, 50257}}) {
    for (bool with_grad : {true, false}) {
      SCOPED_TRACE(::testing::Message() << Name(shape) << " dlogits=" << with_grad);
      const int64_t n = shape.dim(0), v = shape.dim(1);
      std::vector<int32_t> ids = RandInts(n, 0, static_cast<int32_t>(v));
      ids[n / 2] = -1;  // ignored: loss 0, gradient 0
      Pair targets = Ints(ids, {n});
      Pair logits = Random(shape, t, -4.0f, 4.0f);
      Pair losses = Output({n}, DType::kF32);
      Pair dlogits = with_grad ? Output(shape, t) : Pair{};
      const float scale = 1.0f / static_cast<float>(n);
      ASSERT_TRUE(Both([&](Stream& s, auto at) {
        return SoftmaxCrossEntropy(s, at(losses), at(dlogits), at(logits), at(targets), scale);
      }));
      EXPECT_TRUE(Close(losses, Tol(t)));
      if (with_grad) {
        EXPECT_TRUE(Close(dlogits, Tol(t)));
      }
    }
  }
}

TEST_P(CudaOpsDTypeTest, SoftmaxCrossEntropyInPlaceGradient) {
  // On CUDA dlogits may be the logits tensor itself (as llm.c's fused classifier writes
  // it); the CPU reference writes a separate tensor.
  const DType t = GetParam();
  const Shape shape{32, 1024};
  Pair targets = Ints(RandInts(32, 0, 1024), {32});
  Pair logits = Random(shape, t, -4.0f, 4.0f);
  Pair losses = Output({32}, DType::kF32);
  Tensor dlogits_cpu = Tensor::Empty(shape, DType::kF32, Device::Cpu()).value();
  ASSERT_OK(SoftmaxCrossEntropy(CpuStream(), losses.cpu, dlogits_cpu, logits.cpu, targets.cpu,
                                1.0f));
  ASSERT_OK(SoftmaxCrossEntropy(GpuStream(), losses.gpu, logits.gpu, logits.gpu, targets.gpu,
                                1.0f));
  EXPECT_TRUE(Close(losses, Tol(t)));
  EXPECT_TRUE(Close(Pair{dlogits_cpu, logits.gpu}, Tol(t)));
}

// ---- reductions -------------------------------------------------------------------------------

TEST_P(CudaOpsDTypeTest, SumAndSumSquaresAccumulate) {
  const DType t = GetParam();
  for (int64_t n : {int64_t{91}, int64_t{4096}, int64_t{1} << 20}) {
    for (int64_t offset : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " offset=" << offset);
      Pair buf = Random({n + offset}, t);
      Pair x = View(buf, offset, {n});
      double abs_sum = 0.0, sq_sum = 0.0;
      const Vec values = x.cpu.ToFloatVector().value();
      for (float v : values) {
        abs_sum += std::fabs(v);
        sq_sum += static_cast<double>(v) * v;
      }
      Pair sum = Output({1}, DType::kF32);
      ASSERT_TRUE(Both([&](Stream& s, auto at) { return Sum(s, at(sum), at(x)); }));
      // Relative to the sum of magnitudes: a sum of random signs may cancel to near 0.
      const double tol = 1e-5;
      EXPECT_NEAR(sum.gpu.ToFloatVector().value()[0], sum.cpu.ToFloatVector().value()[0],
                  tol * abs_sum);
      Pair sq = Make({2.5f}, {1}, DType::kF32);
      for (int round = 0; round < 2; ++round) {
        ASSERT_TRUE(
            Both([&](Stream& s, auto at) { return SumSquaresAccumulate(s, at(sq), at(x)); }));
      }
      EXPECT_NEAR(sq.gpu.ToFloatVector().value()[0], sq.cpu.ToFloatVector().value()[0],
                  tol * (2 * sq_sum + 2.5));
    }
  }
}

TEST_F(CudaOpsTest, SumSquaresPropagatesNonFinite) {
  Pair x = Make({1.0f, INFINITY, 2.0f, 3.0f, 4.0f}, {5}, DType::kF32);
  Pair sq = Make({0.0f}, {1}, DType::kF32);
  ASSERT_OK(SumSquaresAccumulate(GpuStream(), sq.gpu, x.gpu));
  EXPECT_TRUE(std::isinf(sq.gpu.ToFloatVector().value()[0]));
  Pair y = Make({1.0f, NAN, 2.0f}, {3}, DType::kF32);
  ASSERT_OK(SumSquaresAccumulate(GpuStream(), sq.gpu, y.gpu));
  EXPECT_TRUE(std::isnan(sq.gpu.ToFloatVector().value()[0]));
}

// ---- optimizers -------------------------------------------------------------------------------

struct OptimizerCase {
  int64_t n;
  int64_t offset;  // 1: views off 16-byte alignment (scalar path)
};

const std::vector<OptimizerCase>& OptimizerCases() {
  static const std::vector<OptimizerCase> cases = {{91, 0}, {4099, 0}, {1 << 16, 0}, {4099, 1}};
  return cases;
}

// Optimizer state buffers (f32), and params_low in `low` (undefined for f32).
struct OptimizerBuffers {
  Pair params, grads, m, v, low;
};

OptimizerBuffers MakeBuffers(const OptimizerCase& c, DType low) {
  const Shape whole{c.n + c.offset};
  const Shape shape{c.n};
  OptimizerBuffers b;
  b.params = View(Random(whole, DType::kF32), c.offset, shape);
  b.grads = View(Random(whole, DType::kF32), c.offset, shape);
  b.m = View(Random(whole, DType::kF32, -0.1f, 0.1f), c.offset, shape);
  b.v = View(Random(whole, DType::kF32, 0.0f, 0.01f), c.offset, shape);
  if (low != DType::kF32) {
    // The CPU side holds the 16-bit copy too (ops.cc allows it for params_low).
    Tensor cpu = Tensor::Empty(whole, low, Device::Cpu()).value();
    Tensor gpu = Tensor::Empty(whole, low, Gpu()).value();
    b.low = View(Pair{cpu, gpu}, c.offset, shape);
  }
  return b;
}

TEST_P(CudaOpsDTypeTest, AdamWUpdateWritesLowPrecisionCopy) {
  // The parameter is the dtype of params_low here (f32: none).
  const DType low = GetParam();
  for (const OptimizerCase& c : OptimizerCases()) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " offset=" << c.offset);
    OptimizerBuffers b = MakeBuffers(c, low);
    AdamWConfig config;
    config.lr = 1e-2f;
    config.weight_decay = 0.1f;
    config.grad_scale = 0.5f;
    for (int step = 1; step <= 3; ++step) {
      config.step = step;
      ASSERT_TRUE(Both([&](Stream& s, auto at) {
        return AdamWUpdate(s, at(b.params), at(b.grads), at(b.m), at(b.v), config, at(b.low));
      }));
    }
    EXPECT_TRUE(Close(b.params, Tol(DType::kF32)));
    EXPECT_TRUE(Close(b.m, Tol(DType::kF32)));
    EXPECT_TRUE(Close(b.v, Tol(DType::kF32)));
    if (low != DType::kF32) {
      EXPECT_TRUE(Close(b.low, Tol(low)));
    }
  }
}

TEST_P(CudaOpsDTypeTest, SgdMomentumUpdateWritesLowPrecisionCopy) {
  const DType low = GetParam();
  for (const OptimizerCase& c : OptimizerCases()) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " offset=" << c.offset);
    OptimizerBuffers b = MakeBuffers(c, low);
    SgdConfig config;
    config.lr = 0.05f;
    config.momentum = 0.9f;
    config.weight_decay = 0.01f;
    config.grad_scale = 2.0f;
    for (int step = 0; step < 3; ++step) {
      ASSERT_TRUE(Both([&](Stream& s, auto at) {
        return SgdMomentumUpdate(s, at(b.params), at(b.grads), at(b.m), config, at(b.low));
      }));
    }
    EXPECT_TRUE(Close(b.params, Tol(DType::kF32)));
    EXPECT_TRUE(Close(b.m, Tol(DType::kF32)));
    if (low != DType::kF32) {
      EXPECT_TRUE(Close(b.low, Tol(low)));
    }
  }
}

}  // namespace
}  // namespace ops
}  // namespace tandem
