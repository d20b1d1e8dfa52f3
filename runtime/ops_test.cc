// Tests of ops.h on the CPU in f32: every op against a naive reference written here, every
// backward against central finite differences of a scalar function of its forward, gradient
// accumulation, zero-sized tensors, and argument errors that name the op and the shapes.
#include "runtime/ops.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/allocator.h"
#include "runtime/dtype.h"
#include "runtime/status_testing.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace tandem {
namespace ops {
namespace {

using Vec = std::vector<float>;
using Ref = std::vector<double>;

Stream& Cpu() { return *Stream::Compute(Device::Cpu()).value(); }

std::mt19937& Gen() {
  static std::mt19937 gen(1234);
  return gen;
}

Vec RandVec(int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  Vec v(n);
  for (float& x : v) x = u(Gen());
  return v;
}

int64_t RandInt(int64_t lo, int64_t hi) {  // inclusive
  return std::uniform_int_distribution<int64_t>(lo, hi)(Gen());
}

Tensor FromVec(const Vec& v, const Shape& shape) { return Tensor::FromVector(v, shape).value(); }
Tensor Rand(const Shape& shape, float lo = -1.0f, float hi = 1.0f) {
  return FromVec(RandVec(shape.numel(), lo, hi), shape);
}
Tensor Zeros(const Shape& shape) { return FromVec(Vec(shape.numel(), 0.0f), shape); }
Tensor Ints(const std::vector<int32_t>& v, const Shape& shape) {
  return Tensor::FromInts(v, shape).value();
}
Vec Get(const Tensor& t) { return t.ToFloatVector().value(); }

// got == want within atol + rtol * |want|, element by element; reports the first miss.
::testing::AssertionResult AllClose(const Vec& got, const Ref& want, double atol, double rtol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  }
  int misses = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i]))) {
      if (misses++ == 0) {
        first = "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " +
                std::to_string(want[i]);
      }
    }
  }
  if (misses == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << misses << " of " << got.size() << " differ; " << first;
}

Ref ToRef(const Vec& v) { return Ref(v.begin(), v.end()); }

// sum(out * r) in double: the scalar whose gradient with respect to out is r.
double Weighted(const Tensor& out, const Vec& r) {
  const Vec o = Get(out);
  double l = 0.0;
  for (size_t i = 0; i < o.size(); i++) l += static_cast<double>(o[i]) * r[i];
  return l;
}

// Central differences of loss() with respect to every element of x (an f32 CPU tensor).
Ref NumericGrad(const Tensor& x, const std::function<double()>& loss, float eps = 1e-2f) {
  // The host writes x below: no queued op may still read it.
  EXPECT_TRUE(Cpu().Synchronize().ok());
  float* p = x.data<float>();
  Ref g(x.numel());
  for (int64_t i = 0; i < x.numel(); i++) {
    const float v = p[i];
    const float hi = v + eps, lo = v - eps;
    p[i] = hi;
    const double lp = loss();
    p[i] = lo;
    const double lm = loss();
    p[i] = v;
    g[i] = (lp - lm) / (static_cast<double>(hi) - lo);
  }
  return g;
}

// Finite differences in f32 with eps = 1e-2: truncation O(eps^2), rounding ~1e-6 / eps.
constexpr double kGradAtol = 2e-3;
constexpr double kGradRtol = 1e-2;

// An argument error comes back from the call; an error found while the op runs (a token id
// out of range) is the stream's, returned by its next synchronization.
void ExpectError(const absl::Status& issued, const std::vector<std::string>& parts) {
  const absl::Status st = issued.ok() ? Cpu().Synchronize() : issued;
  ASSERT_FALSE(st.ok()) << "expected an error mentioning " << parts[0];
  for (const std::string& p : parts) {
    EXPECT_NE(st.message().find(p), absl::string_view::npos)
        << "'" << p << "' missing in: " << st.message();
  }
}

// ---- references -----------------------------------------------------------------------------

// Softmax cross-entropy in double over the first v of each row's vp logits (n rows; a target
// of -1: loss 0); with `grad`, also (softmax - onehot) * scale there, 0 elsewhere.
Ref RefCrossEntropy(const Vec& x, int n, int vp, int v, const std::vector<int32_t>& tg,
                    double scale, Ref* grad) {
  Ref loss(n, 0.0);
  if (grad != nullptr) grad->assign(static_cast<size_t>(n) * vp, 0.0);
  for (int i = 0; i < n; i++) {
    if (tg[i] < 0) continue;
    const float* row = x.data() + static_cast<size_t>(i) * vp;
    double mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < v; j++) mx = std::max(mx, static_cast<double>(row[j]));
    for (int j = 0; j < v; j++) sum += std::exp(row[j] - mx);
    loss[i] = std::log(sum) + mx - row[tg[i]];
    for (int j = 0; grad != nullptr && j < v; j++) {
      (*grad)[i * vp + j] = (std::exp(row[j] - mx) / sum - (j == tg[i] ? 1.0 : 0.0)) * scale;
    }
  }
  return loss;
}

double RefGelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// out (M, N) = alpha * op(a) @ op(b) + beta * out0 (beta 0: out0 ignored).
Ref RefMatmul(const Vec& a, const Vec& b, const Vec& out0, int64_t m, int64_t n, int64_t k, bool ta,
              bool tb, double alpha, double beta) {
  Ref out(m * n);
  for (int64_t i = 0; i < m; i++) {
    for (int64_t j = 0; j < n; j++) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; p++) {
        const double av = ta ? a[p * m + i] : a[i * k + p];
        const double bv = tb ? b[j * k + p] : b[p * n + j];
        acc += av * bv;
      }
      out[i * n + j] = alpha * acc + (beta == 0.0 ? 0.0 : beta * out0[i * n + j]);
    }
  }
  return out;
}

// out (N, OC) = inp (N, C) @ w (OC, C)^T + bias.
Ref RefLinear(const Vec& inp, const Vec& w, const Vec* bias, int64_t n, int64_t c, int64_t oc) {
  Ref out(n * oc);
  for (int64_t i = 0; i < n; i++) {
    for (int64_t o = 0; o < oc; o++) {
      double acc = bias ? (*bias)[o] : 0.0;
      for (int64_t j = 0; j < c; j++) acc += static_cast<double>(inp[i * c + j]) * w[o * c + j];
      out[i * oc + o] = acc;
    }
  }
  return out;
}

struct RefLayerNormOut {
  Ref out, mean, rstd;
};
RefLayerNormOut RefLayerNorm(const Vec& x, const Vec& w, const Vec& b, int64_t n, int64_t c) {
  RefLayerNormOut r{Ref(n * c), Ref(n), Ref(n)};
  for (int64_t i = 0; i < n; i++) {
    double m = 0.0, v = 0.0;
    for (int64_t j = 0; j < c; j++) m += x[i * c + j];
    m /= c;
    for (int64_t j = 0; j < c; j++) v += (x[i * c + j] - m) * (x[i * c + j] - m);
    v /= c;
    const double rs = 1.0 / std::sqrt(v + 1e-5);
    for (int64_t j = 0; j < c; j++) r.out[i * c + j] = (x[i * c + j] - m) * rs * w[j] + b[j];
    r.mean[i] = m;
    r.rstd[i] = rs;
  }
  return r;
}

Ref RefSoftmax(const Vec& x, int64_t n, int64_t c) {
  Ref out(n * c);
  for (int64_t i = 0; i < n; i++) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < c; j++) mx = std::max(mx, static_cast<double>(x[i * c + j]));
    for (int64_t j = 0; j < c; j++) sum += std::exp(x[i * c + j] - mx);
    for (int64_t j = 0; j < c; j++) out[i * c + j] = std::exp(x[i * c + j] - mx) / sum;
  }
  return out;
}

// Causal attention by its definition: out (B, T, C), att (B, NH, T, T), and lse (B, NH, T),
// each row's log-sum-exp of the scaled scores, when given.
void RefAttention(const Vec& qkv, int64_t B, int64_t T, int64_t C, int64_t NH, Ref* out, Ref* att,
                  Ref* lse = nullptr) {
  const int64_t hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  out->assign(B * T * C, 0.0);
  att->assign(B * NH * T * T, 0.0);
  if (lse != nullptr) lse->assign(B * NH * T, 0.0);
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < NH; h++) {
      for (int64_t t = 0; t < T; t++) {
        std::vector<double> p(t + 1);
        double mx = -INFINITY, sum = 0.0;
        for (int64_t t2 = 0; t2 <= t; t2++) {
          double dot = 0.0;
          for (int64_t i = 0; i < hs; i++) {
            dot += static_cast<double>(qkv[(b * T + t) * 3 * C + h * hs + i]) *
                   qkv[(b * T + t2) * 3 * C + C + h * hs + i];
          }
          p[t2] = dot * scale;
          mx = std::max(mx, p[t2]);
        }
        for (int64_t t2 = 0; t2 <= t; t2++) sum += (p[t2] = std::exp(p[t2] - mx));
        if (lse != nullptr) (*lse)[(b * NH + h) * T + t] = mx + std::log(sum);
        for (int64_t t2 = 0; t2 <= t; t2++) {
          p[t2] /= sum;
          (*att)[((b * NH + h) * T + t) * T + t2] = p[t2];
          for (int64_t i = 0; i < hs; i++) {
            (*out)[(b * T + t) * C + h * hs + i] +=
                p[t2] * qkv[(b * T + t2) * 3 * C + 2 * C + h * hs + i];
          }
        }
      }
    }
  }
}

// ---- matmul and linear ----------------------------------------------------------------------

TEST(MatmulTest, AllTransposesAlphaBetaAgainstReference) {
  struct Mnk {
    int64_t m, n, k;
  };
  std::vector<Mnk> shapes = {{1, 1, 1},   {7, 13, 5}, {33, 1, 7}, {1, 33, 13},
                             {13, 7, 33}, {0, 5, 3},  {5, 0, 3},  {4, 6, 0}};
  for (int r = 0; r < 3; r++) shapes.push_back({RandInt(1, 40), RandInt(1, 40), RandInt(1, 40)});
  for (const Mnk& s : shapes) {
    for (int ta = 0; ta < 2; ta++) {
      for (int tb = 0; tb < 2; tb++) {
        for (float beta : {0.0f, 0.5f, 1.0f}) {
          const float alpha = 0.75f;
          Tensor a = Rand(ta ? Shape{s.k, s.m} : Shape{s.m, s.k});
          Tensor b = Rand(tb ? Shape{s.n, s.k} : Shape{s.k, s.n});
          Tensor out = Rand({s.m, s.n});
          const Vec out0 = Get(out);
          ASSERT_OK(Matmul(Cpu(), out, a, b, ta, tb, alpha, beta));
          EXPECT_TRUE(AllClose(Get(out),
                               RefMatmul(Get(a), Get(b), out0, s.m, s.n, s.k, ta, tb, alpha, beta),
                               1e-5, 1e-5))
              << "m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << ta << " tb=" << tb
              << " beta=" << beta;
        }
      }
    }
  }
}

TEST(MatmulTest, BetaZeroIgnoresWhatOutHeld) {
  for (int64_t k : {int64_t{3}, int64_t{0}}) {
    Tensor a = Rand({4, k}), b = Rand({k, 5});
    Tensor out = FromVec(Vec(20, std::numeric_limits<float>::quiet_NaN()), {4, 5});
    ASSERT_OK(Matmul(Cpu(), out, a, b, false, false));
    for (float v : Get(out)) EXPECT_TRUE(std::isfinite(v)) << "k=" << k;
  }
}

TEST(LinearTest, ForwardAgainstReference) {
  struct Dims {
    int64_t n, c, oc;
  };
  std::vector<Dims> dims = {{1, 1, 1}, {7, 13, 5}, {33, 7, 13}, {0, 4, 3}, {5, 0, 3}, {4, 3, 0}};
  dims.push_back({RandInt(1, 40), RandInt(1, 40), RandInt(1, 40)});
  for (const Dims& d : dims) {
    Tensor inp = Rand({d.n, d.c}), w = Rand({d.oc, d.c}), bias = Rand({d.oc});
    const Vec bv = Get(bias);
    Tensor out = Rand({d.n, d.oc});
    ASSERT_OK(LinearForward(Cpu(), out, inp, w, bias));
    EXPECT_TRUE(AllClose(Get(out), RefLinear(Get(inp), Get(w), &bv, d.n, d.c, d.oc), 1e-5, 1e-5));
    ASSERT_OK(LinearForward(Cpu(), out, inp, w, Tensor()));
    EXPECT_TRUE(
        AllClose(Get(out), RefLinear(Get(inp), Get(w), nullptr, d.n, d.c, d.oc), 1e-5, 1e-5));

    Tensor pre = Zeros({d.n, d.oc}), gout = Zeros({d.n, d.oc});
    ASSERT_OK(LinearGeluForward(Cpu(), gout, pre, inp, w, bias));
    const Ref want_pre = RefLinear(Get(inp), Get(w), &bv, d.n, d.c, d.oc);
    Ref want_out(want_pre.size());
    for (size_t i = 0; i < want_pre.size(); i++) want_out[i] = RefGelu(want_pre[i]);
    EXPECT_TRUE(AllClose(Get(pre), want_pre, 1e-5, 1e-5));
    EXPECT_TRUE(AllClose(Get(gout), want_out, 1e-5, 1e-5));
  }
}

TEST(LinearTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  for (auto [n, c, oc] :
       {std::make_tuple(1, 1, 1), std::make_tuple(7, 5, 3), std::make_tuple(4, 13, 6)}) {
    Tensor inp = Rand({n, c}), w = Rand({oc, c}), bias = Rand({oc});
    Tensor out = Zeros({n, oc});
    const Vec r = RandVec(n * oc);
    auto loss = [&] {
      EXPECT_TRUE(LinearForward(Cpu(), out, inp, w, bias).ok());
      return Weighted(out, r);
    };
    Tensor dout = FromVec(r, {n, oc});
    Tensor dinp = Rand({n, c}), dw = Zeros({oc, c}), db = Zeros({oc});
    ASSERT_OK(LinearBackward(Cpu(), dinp, dw, db, dout, inp, w));
    EXPECT_TRUE(AllClose(Get(dinp), NumericGrad(inp, loss), kGradAtol, kGradRtol));
    const Ref num_dw = NumericGrad(w, loss), num_db = NumericGrad(bias, loss);
    EXPECT_TRUE(AllClose(Get(dw), num_dw, kGradAtol, kGradRtol));
    EXPECT_TRUE(AllClose(Get(db), num_db, kGradAtol, kGradRtol));

    // A second call adds the same parameter gradients again; dinp is written, not added.
    const Vec dinp1 = Get(dinp), dw1 = Get(dw), db1 = Get(db);
    ASSERT_OK(LinearBackward(Cpu(), dinp, dw, db, dout, inp, w));
    Ref dw2(dw1.size()), db2(db1.size());
    for (size_t i = 0; i < dw1.size(); i++) dw2[i] = 2.0 * dw1[i];
    for (size_t i = 0; i < db1.size(); i++) db2[i] = 2.0 * db1[i];
    EXPECT_TRUE(AllClose(Get(dw), dw2, 1e-6, 1e-6));
    EXPECT_TRUE(AllClose(Get(db), db2, 1e-6, 1e-6));
    EXPECT_EQ(Get(dinp), dinp1);

    // dinp and dbias may be undefined.
    ASSERT_OK(LinearBackward(Cpu(), Tensor(), dw, Tensor(), dout, inp, w));
  }
}

// A backward in two parts (the input gradient, then the parameter gradients, as a pipeline's
// B and W) gives the bits of one call computing all, accumulating into the same gradients.
TEST(LinearTest, BackwardOutputsComputedApartGiveTheSameBits) {
  const int n = 9, c = 21, oc = 11;
  const Tensor inp = Rand({n, c}), w = Rand({oc, c}), dout = Rand({n, oc});
  const Vec dw0 = RandVec(oc * c), db0 = RandVec(oc);
  Tensor dinp = Zeros({n, c}), dw = FromVec(dw0, {oc, c}), db = FromVec(db0, {oc});
  ASSERT_OK(LinearBackward(Cpu(), dinp, dw, db, dout, inp, w));
  Tensor dinp_b = Zeros({n, c}), dw_w = FromVec(dw0, {oc, c}), db_w = FromVec(db0, {oc});
  ASSERT_OK(LinearBackward(Cpu(), dinp_b, Tensor(), Tensor(), dout, inp, w));
  ASSERT_OK(LinearBackward(Cpu(), Tensor(), dw_w, db_w, dout, inp, w));
  EXPECT_EQ(Get(dinp_b), Get(dinp));
  EXPECT_EQ(Get(dw_w), Get(dw));
  EXPECT_EQ(Get(db_w), Get(db));
}

TEST(LayerNormTest, BackwardOutputsComputedApartGiveTheSameBits) {
  for (auto [n, c] : {std::make_pair(5, 7), std::make_pair(6, 37)}) {
    const Tensor x = Rand({n, c}, -2.0f, 2.0f), w = Rand({c}, 0.5f, 1.5f), b = Rand({c});
    Tensor out = Zeros({n, c}), mean = Zeros({n}), rstd = Zeros({n});
    ASSERT_OK(LayerNormForward(Cpu(), out, mean, rstd, x, w, b));
    const Tensor dout = Rand({n, c});
    const Vec dw0 = RandVec(c), db0 = RandVec(c);
    Tensor dinp = Zeros({n, c}), dw = FromVec(dw0, {c}), db = FromVec(db0, {c});
    ASSERT_OK(LayerNormBackward(Cpu(), dinp, dw, db, dout, x, w, mean, rstd));
    Tensor dinp_b = Zeros({n, c}), dw_w = FromVec(dw0, {c}), db_w = FromVec(db0, {c});
    ASSERT_OK(LayerNormBackward(Cpu(), dinp_b, Tensor(), Tensor(), dout, x, w, mean, rstd));
    ASSERT_OK(LayerNormBackward(Cpu(), Tensor(), dw_w, db_w, dout, x, w, mean, rstd));
    EXPECT_EQ(Get(dinp_b), Get(dinp));
    EXPECT_EQ(Get(dw_w), Get(dw));
    EXPECT_EQ(Get(db_w), Get(db));
    // The statistics stay required.
    EXPECT_FALSE(LayerNormBackward(Cpu(), dinp, dw, db, dout, x, w, Tensor(), rstd).ok());
  }
}

TEST(LinearTest, EmptyExtents) {
  // OC = 0: dinp = dout @ weight is a sum over nothing, so zeros.
  Tensor dinp = Rand({3, 4});
  Tensor dw = Zeros({0, 4}), db = Zeros({0});
  ASSERT_OK(LinearBackward(Cpu(), dinp, dw, db, Zeros({3, 0}), Rand({3, 4}), Zeros({0, 4})));
  EXPECT_EQ(Get(dinp), Vec(12, 0.0f));
  // N = 0: nothing is added to the parameter gradients.
  Tensor dw2 = Rand({2, 4});
  const Vec before = Get(dw2);
  ASSERT_OK(LinearBackward(Cpu(), Zeros({0, 4}), dw2, Zeros({2}), Zeros({0, 2}), Zeros({0, 4}),
                           Rand({2, 4})));
  EXPECT_EQ(Get(dw2), before);
  // C = 0: the output is the bias.
  Tensor out = Rand({3, 2}), bias = FromVec({1.5f, -2.0f}, {2});
  ASSERT_OK(LinearForward(Cpu(), out, Zeros({3, 0}), Zeros({2, 0}), bias));
  EXPECT_EQ(Get(out), (Vec{1.5f, -2.0f, 1.5f, -2.0f, 1.5f, -2.0f}));
}

// ---- elementwise ----------------------------------------------------------------------------

std::vector<Shape> ElementwiseShapes() {
  std::vector<Shape> shapes = {{1}, {7}, {13, 33}, {0}, {3, 0}, {2, 3, 5}};
  shapes.push_back(Shape{RandInt(1, 50), RandInt(1, 50)});
  return shapes;
}

TEST(GeluTest, ForwardAgainstReferenceAndInPlace) {
  for (const Shape& shape : ElementwiseShapes()) {
    Tensor x = Rand(shape, -6.0f, 6.0f), out = Zeros(shape);
    const Vec xv = Get(x);
    Ref want(xv.size());
    for (size_t i = 0; i < xv.size(); i++) want[i] = RefGelu(xv[i]);
    ASSERT_OK(GeluForward(Cpu(), out, x));
    EXPECT_TRUE(AllClose(Get(out), want, 1e-6, 1e-5)) << shape.ToString();
    ASSERT_OK(GeluForward(Cpu(), x, x));  // in place
    EXPECT_TRUE(AllClose(Get(x), want, 1e-6, 1e-5)) << shape.ToString();
  }
  // Far tails and a nan.
  Tensor x = FromVec({-30.0f, 30.0f, 0.0f, std::numeric_limits<float>::quiet_NaN()}, {4});
  Tensor out = Zeros({4});
  ASSERT_OK(GeluForward(Cpu(), out, x));
  const Vec o = Get(out);
  EXPECT_NEAR(o[0], 0.0f, 1e-6);
  EXPECT_EQ(o[1], 30.0f);
  EXPECT_EQ(o[2], 0.0f);
  EXPECT_TRUE(std::isnan(o[3]));
}

TEST(GeluTest, BackwardMatchesFiniteDifferences) {
  Tensor x = Rand({7, 13}, -4.0f, 4.0f), out = Zeros({7, 13});
  const Vec r = RandVec(7 * 13);
  auto loss = [&] {
    EXPECT_TRUE(GeluForward(Cpu(), out, x).ok());
    return Weighted(out, r);
  };
  Tensor dinp = Zeros({7, 13});
  ASSERT_OK(GeluBackward(Cpu(), dinp, x, FromVec(r, {7, 13})));
  EXPECT_TRUE(AllClose(Get(dinp), NumericGrad(x, loss), kGradAtol, kGradRtol));
}

TEST(GeluTest, BiasGeluAgainstReference) {
  for (auto [n, c] :
       {std::make_pair(1, 1), std::make_pair(7, 13), std::make_pair(0, 5), std::make_pair(3, 0)}) {
    Tensor x = Rand({n, c}, -3.0f, 3.0f), bias = Rand({c}), out = Zeros({n, c}),
           pre = Zeros({n, c});
    const Vec xv = Get(x), bv = Get(bias);
    Ref want_pre(n * c), want_out(n * c);
    for (int i = 0; i < n; i++) {
      for (int j = 0; j < c; j++) {
        want_pre[i * c + j] = static_cast<double>(xv[i * c + j]) + bv[j];
        want_out[i * c + j] = RefGelu(static_cast<float>(want_pre[i * c + j]));
      }
    }
    ASSERT_OK(BiasGeluForward(Cpu(), out, pre, x, bias));
    EXPECT_TRUE(AllClose(Get(pre), want_pre, 1e-6, 1e-6));
    EXPECT_TRUE(AllClose(Get(out), want_out, 1e-6, 1e-5));
    Tensor out2 = Zeros({n, c});
    ASSERT_OK(BiasGeluForward(Cpu(), out2, Tensor(), x, bias));
    EXPECT_EQ(Get(out2), Get(out));
  }
}

TEST(ReluTest, ForwardBackward) {
  for (const Shape& shape : ElementwiseShapes()) {
    // Values kept away from the kink, so finite differences do not straddle it.
    Vec xv = RandVec(shape.numel());
    for (float& v : xv) v = v < 0 ? v - 0.05f : v + 0.05f;
    Tensor x = FromVec(xv, shape), out = Zeros(shape);
    ASSERT_OK(ReluForward(Cpu(), out, x));
    Ref want(xv.size());
    for (size_t i = 0; i < xv.size(); i++) want[i] = xv[i] > 0 ? xv[i] : 0.0;
    EXPECT_TRUE(AllClose(Get(out), want, 0, 0));

    const Vec r = RandVec(shape.numel());
    Tensor y = Zeros(shape);
    auto loss = [&] {
      EXPECT_TRUE(ReluForward(Cpu(), y, x).ok());
      return Weighted(y, r);
    };
    Tensor dinp = Zeros(shape);
    ASSERT_OK(ReluBackward(Cpu(), dinp, out, FromVec(r, shape)));
    EXPECT_TRUE(AllClose(Get(dinp), NumericGrad(x, loss), kGradAtol, kGradRtol));
  }
}

TEST(ElementwiseTest, BiasAddAddAxpyScaleFill) {
  for (const Shape& shape : ElementwiseShapes()) {
    Tensor a = Rand(shape), b = Rand(shape), out = Zeros(shape);
    const Vec av = Get(a), bv = Get(b);
    Ref sum(av.size()), axpy(av.size()), scaled(av.size());
    for (size_t i = 0; i < av.size(); i++) {
      sum[i] = static_cast<double>(av[i]) + bv[i];
      axpy[i] = bv[i] + 0.5 * av[i];
      scaled[i] = av[i] * -3.0;
    }
    ASSERT_OK(Add(Cpu(), out, a, b));
    EXPECT_TRUE(AllClose(Get(out), sum, 1e-7, 1e-7));
    ASSERT_OK(Axpy(Cpu(), b, 0.5f, a));
    EXPECT_TRUE(AllClose(Get(b), axpy, 1e-7, 1e-6));
    ASSERT_OK(Scale(Cpu(), a, -3.0f));
    EXPECT_TRUE(AllClose(Get(a), scaled, 1e-7, 1e-7));
    ASSERT_OK(Fill(Cpu(), a, 2.5f));
    EXPECT_EQ(Get(a), Vec(shape.numel(), 2.5f));
  }
  for (auto [n, c] :
       {std::make_pair(1, 1), std::make_pair(7, 33), std::make_pair(0, 3), std::make_pair(4, 0)}) {
    Tensor x = Rand({n, c}), bias = Rand({c});
    const Vec xv = Get(x), bv = Get(bias);
    Ref want(xv.size());
    for (int i = 0; i < n; i++) {
      for (int j = 0; j < c; j++) want[i * c + j] = static_cast<double>(xv[i * c + j]) + bv[j];
    }
    ASSERT_OK(BiasAdd(Cpu(), x, bias));
    EXPECT_TRUE(AllClose(Get(x), want, 1e-7, 1e-7));
  }
}

TEST(CastTest, RoundTripsAndConversions) {
  Vec v = RandVec(33, -100.0f, 100.0f);
  v.push_back(0.0f);
  v.push_back(-0.0f);
  v.push_back(INFINITY);
  v.push_back(-INFINITY);
  v.push_back(1e-6f);  // a subnormal in f16
  const int64_t n = v.size();
  Tensor f32 = FromVec(v, {n});
  for (DType low : {DType::kBF16, DType::kF16}) {
    Tensor l = Tensor::Empty({n}, low, Device::Cpu()).value();
    Tensor back = Zeros({n});
    ASSERT_OK(Cast(Cpu(), l, f32));
    ASSERT_OK(Cast(Cpu(), back, l));
    const Vec got = Get(back);
    for (int64_t i = 0; i < n; i++) {
      const float want =
          low == DType::kBF16 ? Bf16ToFloat(FloatToBf16(v[i])) : HalfToFloat(FloatToHalf(v[i]));
      EXPECT_EQ(std::memcmp(&got[i], &want, 4), 0) << DTypeName(low) << " " << v[i];
      if (std::isfinite(v[i]) && std::fabs(v[i]) > 1e-3f) {
        EXPECT_NEAR(got[i], v[i], std::fabs(v[i]) * (low == DType::kBF16 ? 4e-3 : 5e-4));
      }
    }
    // A value the 16-bit format holds exactly survives f32 -> low -> f32 unchanged.
    Tensor exact = FromVec({1.5f, -0.25f, 96.0f}, {3});
    Tensor el = Tensor::Empty({3}, low, Device::Cpu()).value(), eb = Zeros({3});
    ASSERT_OK(Cast(Cpu(), el, exact));
    ASSERT_OK(Cast(Cpu(), eb, el));
    EXPECT_EQ(Get(eb), (Vec{1.5f, -0.25f, 96.0f}));
  }
  // bf16 <-> f16 round once, through f32.
  Tensor bf = Tensor::FromVector(v, {n}, Device::Cpu(), DType::kBF16).value();
  Tensor h = Tensor::Empty({n}, DType::kF16, Device::Cpu()).value();
  ASSERT_OK(Cast(Cpu(), h, bf));
  ASSERT_OK(Cpu().Synchronize());  // read on the host below
  for (int64_t i = 0; i < n; i++) {
    EXPECT_EQ(h.data<uint16_t>()[i], FloatToHalf(Bf16ToFloat(bf.data<uint16_t>()[i])));
  }
  Tensor bf2 = Tensor::Empty({n}, DType::kBF16, Device::Cpu()).value();
  ASSERT_OK(Cast(Cpu(), bf2, h));
  ASSERT_OK(Cpu().Synchronize());
  for (int64_t i = 0; i < n; i++) {
    EXPECT_EQ(bf2.data<uint16_t>()[i], FloatToBf16(HalfToFloat(h.data<uint16_t>()[i])));
  }
  // Same dtype: a copy. Empty: nothing.
  Tensor copy = Zeros({n});
  ASSERT_OK(Cast(Cpu(), copy, f32));
  ASSERT_OK(Cpu().Synchronize());
  EXPECT_EQ(std::memcmp(copy.raw(), f32.raw(), f32.bytes()), 0);
  ASSERT_OK(Cast(Cpu(), Tensor::Empty({0}, DType::kBF16, Device::Cpu()).value(), Zeros({0})));
}

// ---- normalization, softmax -----------------------------------------------------------------

TEST(LayerNormTest, ForwardAgainstReference) {
  std::vector<std::pair<int64_t, int64_t>> dims = {{1, 1}, {7, 13}, {3, 33}, {0, 5}, {2, 768}};
  dims.push_back({RandInt(1, 20), RandInt(1, 70)});
  for (auto [n, c] : dims) {
    Tensor x = Rand({n, c}, -2.0f, 3.0f), w = Rand({c}), b = Rand({c});
    Tensor out = Zeros({n, c}), mean = Zeros({n}), rstd = Zeros({n});
    ASSERT_OK(LayerNormForward(Cpu(), out, mean, rstd, x, w, b));
    const RefLayerNormOut want = RefLayerNorm(Get(x), Get(w), Get(b), n, c);
    EXPECT_TRUE(AllClose(Get(out), want.out, 1e-5, 1e-4)) << n << "x" << c;
    EXPECT_TRUE(AllClose(Get(mean), want.mean, 1e-6, 1e-5));
    EXPECT_TRUE(AllClose(Get(rstd), want.rstd, 1e-6, 1e-4));

    // The fused residual add: residual = a + b, then the same layernorm.
    Tensor a = Rand({n, c}), bb = Rand({n, c}), residual = Zeros({n, c});
    Tensor out2 = Zeros({n, c}), mean2 = Zeros({n}), rstd2 = Zeros({n});
    ASSERT_OK(ResidualLayerNormForward(Cpu(), residual, out2, mean2, rstd2, a, bb, w, b));
    Vec sum(n * c);
    const Vec av = Get(a), bv = Get(bb);
    for (int64_t i = 0; i < n * c; i++) sum[i] = av[i] + bv[i];
    const RefLayerNormOut want2 = RefLayerNorm(sum, Get(w), Get(b), n, c);
    EXPECT_EQ(Get(residual), sum);
    EXPECT_TRUE(AllClose(Get(out2), want2.out, 1e-5, 1e-4));
    EXPECT_TRUE(AllClose(Get(mean2), want2.mean, 1e-6, 1e-5));
    EXPECT_TRUE(AllClose(Get(rstd2), want2.rstd, 1e-6, 1e-4));
    // In place: residual = a, so a += b.
    ASSERT_OK(ResidualLayerNormForward(Cpu(), a, out2, mean2, rstd2, a, bb, w, b));
    EXPECT_EQ(Get(a), sum);
  }
  // C = 0: rows of nothing still get finite statistics.
  Tensor mean = Rand({3}), rstd = Rand({3});
  ASSERT_OK(
      LayerNormForward(Cpu(), Zeros({3, 0}), mean, rstd, Zeros({3, 0}), Zeros({0}), Zeros({0})));
  for (float v : Get(mean)) EXPECT_EQ(v, 0.0f);
  for (float v : Get(rstd)) EXPECT_TRUE(std::isfinite(v));
}

TEST(LayerNormTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  for (auto [n, c] : {std::make_pair(1, 3), std::make_pair(5, 7), std::make_pair(3, 13)}) {
    Tensor x = Rand({n, c}, -2.0f, 2.0f), w = Rand({c}, 0.5f, 1.5f), b = Rand({c});
    Tensor out = Zeros({n, c}), mean = Zeros({n}), rstd = Zeros({n});
    const Vec r = RandVec(n * c);
    auto loss = [&] {
      EXPECT_TRUE(LayerNormForward(Cpu(), out, mean, rstd, x, w, b).ok());
      return Weighted(out, r);
    };
    loss();
    const Tensor mean0 = FromVec(Get(mean), {n}), rstd0 = FromVec(Get(rstd), {n});
    Tensor dinp = Rand({n, c}), dw = Zeros({c}), db = Zeros({c});
    Tensor dout = FromVec(r, {n, c});
    ASSERT_OK(LayerNormBackward(Cpu(), dinp, dw, db, dout, x, w, mean0, rstd0));
    EXPECT_TRUE(AllClose(Get(dinp), NumericGrad(x, loss), kGradAtol, kGradRtol));
    EXPECT_TRUE(AllClose(Get(dw), NumericGrad(w, loss), kGradAtol, kGradRtol));
    EXPECT_TRUE(AllClose(Get(db), NumericGrad(b, loss), kGradAtol, kGradRtol));

    const Vec dinp1 = Get(dinp), dw1 = Get(dw), db1 = Get(db);
    ASSERT_OK(LayerNormBackward(Cpu(), dinp, dw, db, dout, x, w, mean0, rstd0));
    EXPECT_EQ(Get(dinp), dinp1);
    Ref dw2(c), db2(c);
    for (int j = 0; j < c; j++) {
      dw2[j] = 2.0 * dw1[j];
      db2[j] = 2.0 * db1[j];
    }
    EXPECT_TRUE(AllClose(Get(dw), dw2, 1e-6, 1e-6));
    EXPECT_TRUE(AllClose(Get(db), db2, 1e-6, 1e-6));
  }
}

TEST(SoftmaxTest, ForwardAgainstReference) {
  std::vector<std::pair<int64_t, int64_t>> dims = {{1, 1}, {7, 13}, {3, 33}, {0, 4}, {5, 0}};
  dims.push_back({RandInt(1, 20), RandInt(1, 300)});
  for (auto [n, c] : dims) {
    Tensor x = Rand({n, c}, -10.0f, 10.0f), out = Zeros({n, c});
    ASSERT_OK(SoftmaxForward(Cpu(), out, x));
    EXPECT_TRUE(AllClose(Get(out), RefSoftmax(Get(x), n, c), 1e-7, 1e-5)) << n << "x" << c;
  }
  // Large logits do not overflow; -inf gets probability 0; a nan row stays nan.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = FromVec({1000.0f, 999.0f, -INFINITY, 0.0f, 1.0f, nan}, {2, 3});
  Tensor out = Zeros({2, 3});
  ASSERT_OK(SoftmaxForward(Cpu(), out, x));
  const Vec o = Get(out);
  EXPECT_NEAR(o[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(o[1], std::exp(-1.0) / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_EQ(o[2], 0.0f);
  for (int j = 3; j < 6; j++) EXPECT_TRUE(std::isnan(o[j]));
}

TEST(SoftmaxTest, BackwardMatchesFiniteDifferences) {
  Tensor x = Rand({5, 13}, -2.0f, 2.0f), out = Zeros({5, 13});
  const Vec r = RandVec(5 * 13);
  auto loss = [&] {
    EXPECT_TRUE(SoftmaxForward(Cpu(), out, x).ok());
    return Weighted(out, r);
  };
  loss();
  const Tensor y = FromVec(Get(out), {5, 13});
  Tensor dinp = Zeros({5, 13});
  ASSERT_OK(SoftmaxBackward(Cpu(), dinp, y, FromVec(r, {5, 13})));
  EXPECT_TRUE(AllClose(Get(dinp), NumericGrad(x, loss), kGradAtol, kGradRtol));
}

// ---- attention ------------------------------------------------------------------------------

struct AttentionDims {
  int64_t b, t, c, nh;
};

TEST(AttentionTest, ForwardAgainstReference) {
  // Up to 33 positions: one row tile; 64, 65 and 150: tiles of 64 rows, whole and partial.
  const std::vector<AttentionDims> dims = {
      {1, 1, 4, 1},  {2, 7, 12, 3},  {1, 13, 8, 2}, {2, 5, 6, 6}, {1, 33, 16, 4}, {1, 64, 8, 2},
      {1, 65, 8, 2}, {2, 150, 8, 2}, {0, 3, 4, 2},  {2, 0, 4, 2}, {2, 3, 0, 1}};
  for (const AttentionDims& d : dims) {
    Tensor qkv = Rand({d.b, d.t, 3 * d.c}, -2.0f, 2.0f);
    Tensor out = Rand({d.b, d.t, d.c}), att = Rand({d.b, d.nh, d.t, d.t});
    ASSERT_OK(AttentionForward(Cpu(), out, att, qkv, d.nh));
    if (d.c == 0) continue;
    Ref want_out, want_att;
    RefAttention(Get(qkv), d.b, d.t, d.c, d.nh, &want_out, &want_att);
    EXPECT_TRUE(AllClose(Get(out), want_out, 1e-5, 1e-5)) << d.b << " " << d.t << " " << d.c;
    EXPECT_TRUE(AllClose(Get(att), want_att, 1e-6, 1e-5));
  }
}

TEST(AttentionTest, IsCausal) {
  const int64_t B = 2, T = 9, C = 12, NH = 3;
  Tensor qkv = Rand({B, T, 3 * C}), out = Zeros({B, T, C}), att = Zeros({B, NH, T, T});
  ASSERT_OK(AttentionForward(Cpu(), out, att, qkv, NH));
  const Vec out0 = Get(out);
  const Vec a = Get(att);
  for (int64_t i = 0; i < B * NH; i++) {
    for (int64_t t = 0; t < T; t++) {
      for (int64_t t2 = t + 1; t2 < T; t2++) EXPECT_EQ(a[(i * T + t) * T + t2], 0.0f);
    }
  }
  // Changing q, k and v at position p changes no output before p, and does change p.
  for (int64_t p : {int64_t{0}, int64_t{4}, T - 1}) {
    Tensor moved = FromVec(Get(qkv), {B, T, 3 * C});
    for (int64_t b = 0; b < B; b++) {
      for (int64_t j = 0; j < 3 * C; j++) moved.data<float>()[(b * T + p) * 3 * C + j] += 0.5f;
    }
    ASSERT_OK(AttentionForward(Cpu(), out, att, moved, NH));
    const Vec o = Get(out);
    for (int64_t b = 0; b < B; b++) {
      for (int64_t t = 0; t < T; t++) {
        bool same = true;
        for (int64_t j = 0; j < C; j++) same &= o[(b * T + t) * C + j] == out0[(b * T + t) * C + j];
        EXPECT_EQ(same, t < p) << "b=" << b << " t=" << t << " p=" << p;
      }
    }
  }
  // Backward: with dout zero from position p on, nothing at p or later gets a gradient.
  const int64_t p = 5;
  Vec r = RandVec(B * T * C);
  for (int64_t b = 0; b < B; b++) {
    for (int64_t t = p; t < T; t++) {
      for (int64_t j = 0; j < C; j++) r[(b * T + t) * C + j] = 0.0f;
    }
  }
  ASSERT_OK(AttentionForward(Cpu(), out, att, qkv, NH));
  Tensor dqkv = Rand({B, T, 3 * C});
  ASSERT_OK(AttentionBackward(Cpu(), dqkv, FromVec(r, {B, T, C}), qkv, att, NH));
  const Vec g = Get(dqkv);
  for (int64_t b = 0; b < B; b++) {
    for (int64_t t = p; t < T; t++) {
      for (int64_t j = 0; j < 3 * C; j++) EXPECT_EQ(g[(b * T + t) * 3 * C + j], 0.0f);
    }
  }
}

TEST(AttentionTest, BackwardMatchesFiniteDifferences) {
  for (const AttentionDims& d : {AttentionDims{2, 5, 6, 2}, AttentionDims{1, 7, 9, 3},
                                 AttentionDims{1, 4, 4, 4}, AttentionDims{1, 70, 4, 2}}) {
    Tensor qkv = Rand({d.b, d.t, 3 * d.c});
    Tensor out = Zeros({d.b, d.t, d.c}), att = Zeros({d.b, d.nh, d.t, d.t});
    const Vec r = RandVec(d.b * d.t * d.c);
    auto loss = [&] {
      EXPECT_TRUE(AttentionForward(Cpu(), out, att, qkv, d.nh).ok());
      return Weighted(out, r);
    };
    loss();
    const Tensor att0 = FromVec(Get(att), att.shape());
    Tensor dqkv = Rand(qkv.shape());
    ASSERT_OK(AttentionBackward(Cpu(), dqkv, FromVec(r, out.shape()), qkv, att0, d.nh));
    EXPECT_TRUE(AllClose(Get(dqkv), NumericGrad(qkv, loss), kGradAtol, kGradRtol))
        << d.b << " " << d.t << " " << d.c << " " << d.nh;
  }
  // Empty batch, sequence or channels: nothing to do.
  ASSERT_OK(AttentionBackward(Cpu(), Zeros({0, 3, 12}), Zeros({0, 3, 4}), Zeros({0, 3, 12}),
                              Zeros({0, 2, 3, 3}), 2));
  ASSERT_OK(AttentionBackward(Cpu(), Zeros({2, 3, 0}), Zeros({2, 3, 0}), Zeros({2, 3, 0}),
                              Zeros({2, 1, 3, 3}), 1));
}

// FlashAttention keeps lse instead of att; its out is AttentionForward's, bit for bit (one
// code path on the CPU), and its gradients match finite differences and AttentionBackward.
TEST(FlashAttentionTest, ForwardMatchesAttentionAndReference) {
  // Up to 33 positions: one row tile; 64, 65 and 150: tiles of 64 rows, whole and partial.
  const std::vector<AttentionDims> dims = {
      {1, 1, 4, 1},  {2, 7, 12, 3},  {1, 13, 8, 2}, {2, 5, 6, 6}, {1, 33, 16, 4}, {1, 64, 8, 2},
      {1, 65, 8, 2}, {2, 150, 8, 2}, {0, 3, 4, 2},  {2, 0, 4, 2}, {2, 3, 0, 1}};
  for (const AttentionDims& d : dims) {
    Tensor qkv = Rand({d.b, d.t, 3 * d.c}, -2.0f, 2.0f);
    Tensor out = Rand({d.b, d.t, d.c}), lse = Rand({d.b, d.nh, d.t});
    ASSERT_OK(FlashAttentionForward(Cpu(), out, lse, qkv, d.nh));
    Tensor att_out = Rand({d.b, d.t, d.c}), att = Rand({d.b, d.nh, d.t, d.t});
    ASSERT_OK(AttentionForward(Cpu(), att_out, att, qkv, d.nh));
    EXPECT_EQ(Get(out), Get(att_out));
    Ref want_out, want_att, want_lse;
    RefAttention(Get(qkv), d.b, d.t, d.c, d.nh, &want_out, &want_att, &want_lse);
    if (d.c == 0) {  // empty heads: every score is 0, so row t is uniform over t + 1 keys
      for (size_t i = 0; i < want_lse.size(); i++) want_lse[i] = std::log(i % d.t + 1.0);
    }
    EXPECT_TRUE(AllClose(Get(lse), want_lse, 1e-5, 1e-5)) << d.b << " " << d.t << " " << d.c;
  }
}

TEST(FlashAttentionTest, BackwardMatchesFiniteDifferencesAndAttention) {
  for (const AttentionDims& d :
       {AttentionDims{2, 5, 6, 2}, AttentionDims{1, 7, 9, 3}, AttentionDims{1, 4, 4, 4},
        AttentionDims{1, 1, 4, 2}, AttentionDims{1, 130, 4, 2}}) {
    Tensor qkv = Rand({d.b, d.t, 3 * d.c});
    Tensor out = Zeros({d.b, d.t, d.c}), lse = Zeros({d.b, d.nh, d.t});
    const Vec r = RandVec(d.b * d.t * d.c);
    auto loss = [&] {
      EXPECT_TRUE(FlashAttentionForward(Cpu(), out, lse, qkv, d.nh).ok());
      return Weighted(out, r);
    };
    loss();
    const Tensor out0 = FromVec(Get(out), out.shape());
    const Tensor lse0 = FromVec(Get(lse), lse.shape());
    const Tensor dout = FromVec(r, out.shape());
    Tensor dqkv = Rand(qkv.shape());
    ASSERT_OK(FlashAttentionBackward(Cpu(), dqkv, dout, qkv, out0, lse0, d.nh));
    EXPECT_TRUE(AllClose(Get(dqkv), NumericGrad(qkv, loss), kGradAtol, kGradRtol))
        << d.b << " " << d.t << " " << d.c << " " << d.nh;
    Tensor att = Zeros({d.b, d.nh, d.t, d.t}), want = Zeros(qkv.shape());
    ASSERT_OK(AttentionForward(Cpu(), Zeros(out.shape()), att, qkv, d.nh));
    ASSERT_OK(AttentionBackward(Cpu(), want, dout, qkv, att, d.nh));
    const Vec w = Get(want);
    EXPECT_TRUE(AllClose(Get(dqkv), Ref(w.begin(), w.end()), 1e-5, 1e-4));
  }
  ASSERT_OK(FlashAttentionBackward(Cpu(), Zeros({0, 3, 12}), Zeros({0, 3, 4}), Zeros({0, 3, 12}),
                                   Zeros({0, 3, 4}), Zeros({0, 2, 3}), 2));
  ASSERT_OK(FlashAttentionBackward(Cpu(), Zeros({2, 3, 0}), Zeros({2, 3, 0}), Zeros({2, 3, 0}),
                                   Zeros({2, 3, 0}), Zeros({2, 1, 3}), 1));
}

// Each attention op's scratch, measured: the allocator's peak during the call above what was
// live before it (its arguments), against AttentionScratchBytes, within the rounding of its one
// request. From an empty cache, so that the request gets a block of its own size.
TEST(AttentionScratchBytes, IsWhatTheOpsAllocate) {
  Allocator& alloc = **GetAllocator(Device::Cpu());
  auto scratch_of = [&](const std::function<absl::Status()>& op) {
    return PeakAllocatedDuring(
        alloc, [&] { EXPECT_TRUE(op().ok() && Cpu().Synchronize().ok()); }, /*fresh=*/true);
  };
  auto expect_near = [](int64_t measured, int64_t want) {
    EXPECT_GE(measured, want);
    EXPECT_LE(measured, want + static_cast<int64_t>(CachingAllocator::kRoundBytes));
  };
  for (const AttentionDims& d :
       {AttentionDims{2, 7, 12, 3}, AttentionDims{1, 64, 8, 2}, AttentionDims{2, 150, 8, 2}}) {
    SCOPED_TRACE(::testing::Message() << d.b << " " << d.t << " " << d.c << " " << d.nh);
    Tensor qkv = Rand({d.b, d.t, 3 * d.c}), out = Zeros({d.b, d.t, d.c});
    Tensor dqkv = Zeros(qkv.shape()), dout = Rand(out.shape());
    Tensor att = Zeros({d.b, d.nh, d.t, d.t}), lse = Zeros({d.b, d.nh, d.t});
    const AttentionScratch standard =
        AttentionScratchBytes(Device::Cpu(), DType::kF32, d.b, d.t, d.c, d.nh, false);
    const AttentionScratch flash =
        AttentionScratchBytes(Device::Cpu(), DType::kF32, d.b, d.t, d.c, d.nh, true);
    EXPECT_GT(standard.backward, 0);
    EXPECT_GT(flash.forward, 0);
    expect_near(scratch_of([&] { return AttentionForward(Cpu(), out, att, qkv, d.nh); }),
                standard.forward);
    expect_near(scratch_of([&] { return AttentionBackward(Cpu(), dqkv, dout, qkv, att, d.nh); }),
                standard.backward);
    expect_near(scratch_of([&] { return FlashAttentionForward(Cpu(), out, lse, qkv, d.nh); }),
                flash.forward);
    expect_near(
        scratch_of([&] { return FlashAttentionBackward(Cpu(), dqkv, dout, qkv, out, lse, d.nh); }),
        flash.backward);
  }
  EXPECT_EQ(AttentionScratchBytes(Device::Cpu(), DType::kF32, 0, 7, 12, 3, true).backward, 0);
  EXPECT_EQ(MatmulWorkspaceBytes(Device::Cpu()), 0);
}

// ---- embedding and loss ---------------------------------------------------------------------

TEST(EmbeddingTest, ForwardAgainstReference) {
  const int64_t B = 2, T = 3, V = 5, C = 7, maxT = 4;
  const std::vector<int32_t> ids = {4, 0, 4, 1, 1, 3};
  Tensor tokens = Ints(ids, {B, T}), wte = Rand({V, C}), wpe = Rand({maxT, C});
  const Vec te = Get(wte), pe = Get(wpe);
  Tensor out = Zeros({B, T, C});
  ASSERT_OK(EmbeddingForward(Cpu(), out, tokens, wte, wpe));
  Ref want(B * T * C), want_nopos(B * T * C);
  for (int64_t b = 0; b < B; b++) {
    for (int64_t t = 0; t < T; t++) {
      for (int64_t c = 0; c < C; c++) {
        want[(b * T + t) * C + c] = static_cast<double>(te[ids[b * T + t] * C + c]) + pe[t * C + c];
        want_nopos[(b * T + t) * C + c] = te[ids[b * T + t] * C + c];
      }
    }
  }
  EXPECT_TRUE(AllClose(Get(out), want, 1e-7, 1e-7));
  ASSERT_OK(EmbeddingForward(Cpu(), out, tokens, wte, Tensor()));
  EXPECT_TRUE(AllClose(Get(out), want_nopos, 0, 0));
  ASSERT_OK(EmbeddingForward(Cpu(), Zeros({0, T, C}), Ints({}, {0, T}), wte, wpe));
}

TEST(EmbeddingTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int64_t B = 2, T = 3, V = 5, C = 4, maxT = 3;
  Tensor tokens = Ints({2, 2, 0, 4, 2, 1}, {B, T}), wte = Rand({V, C}), wpe = Rand({maxT, C});
  Tensor out = Zeros({B, T, C});
  const Vec r = RandVec(B * T * C);
  auto loss = [&] {
    EXPECT_TRUE(EmbeddingForward(Cpu(), out, tokens, wte, wpe).ok());
    return Weighted(out, r);
  };
  Tensor dwte = Zeros({V, C}), dwpe = Zeros({maxT, C}), dout = FromVec(r, {B, T, C});
  ASSERT_OK(EmbeddingBackward(Cpu(), dwte, dwpe, dout, tokens));
  const Ref num_te = NumericGrad(wte, loss), num_pe = NumericGrad(wpe, loss);
  EXPECT_TRUE(AllClose(Get(dwte), num_te, kGradAtol, kGradRtol));
  EXPECT_TRUE(AllClose(Get(dwpe), num_pe, kGradAtol, kGradRtol));
  // Row 3 is no token's: its gradient stays zero.
  for (int64_t c = 0; c < C; c++) EXPECT_EQ(Get(dwte)[3 * C + c], 0.0f);
  ASSERT_OK(EmbeddingBackward(Cpu(), dwte, Tensor(), dout, tokens));
  Ref twice(num_te.size());
  for (size_t i = 0; i < num_te.size(); i++) twice[i] = 2.0 * num_te[i];
  EXPECT_TRUE(AllClose(Get(dwte), twice, 2 * kGradAtol, kGradRtol));
  EXPECT_TRUE(AllClose(Get(dwpe), num_pe, kGradAtol, kGradRtol));  // undefined: untouched
}

TEST(SoftmaxCrossEntropyTest, LossesAndGradient) {
  for (auto [n, v] : {std::make_pair(1, 1), std::make_pair(6, 13), std::make_pair(4, 33),
                      std::make_pair(0, 5), std::make_pair(3, 600)}) {
    Tensor logits = Rand({n, v}, -4.0f, 4.0f);
    std::vector<int32_t> tg(n);
    for (int i = 0; i < n; i++) tg[i] = i == 1 ? -1 : static_cast<int32_t>(RandInt(0, v - 1));
    Tensor targets = Ints(tg, {n});
    Tensor losses = Rand({n}), dlogits = Rand({n, v});
    const float scale = 1.0f / 3.0f;
    ASSERT_OK(SoftmaxCrossEntropy(Cpu(), losses, dlogits, logits, targets, scale));
    const Vec x = Get(logits);
    EXPECT_TRUE(
        AllClose(Get(losses), RefCrossEntropy(x, n, v, v, tg, scale, nullptr), 1e-5, 1e-5));
    // The loss does not depend on whether the gradient was asked for.
    Tensor losses2 = Zeros({n});
    ASSERT_OK(SoftmaxCrossEntropy(Cpu(), losses2, Tensor(), logits, targets, scale));
    EXPECT_EQ(Get(losses2), Get(losses));
    // In place: dlogits may be logits itself.
    Tensor inplace = FromVec(x, {n, v}), losses3 = Zeros({n});
    ASSERT_OK(SoftmaxCrossEntropy(Cpu(), losses3, inplace, inplace, targets, scale));
    EXPECT_EQ(Get(losses3), Get(losses));
    EXPECT_EQ(Get(inplace), Get(dlogits));
    if (n == 0 || v > 100) continue;
    // dlogits is the gradient of scale * sum(losses).
    Tensor l = Zeros({n});
    auto loss = [&] {
      EXPECT_TRUE(SoftmaxCrossEntropy(Cpu(), l, Tensor(), logits, targets, 1.0f).ok());
      return scale * Weighted(l, Vec(n, 1.0f));
    };
    EXPECT_TRUE(AllClose(Get(dlogits), NumericGrad(logits, loss), kGradAtol, kGradRtol));
    for (int j = 0; j < v && n > 1; j++) EXPECT_EQ(Get(dlogits)[1 * v + j], 0.0f);  // ignored row
  }
  // Large logits stay finite.
  Tensor losses = Zeros({1}), dl = Zeros({1, 3});
  ASSERT_OK(SoftmaxCrossEntropy(Cpu(), losses, dl, FromVec({500.0f, 0.0f, -500.0f}, {1, 3}),
                                Ints({1}, {1}), 1.0f));
  EXPECT_NEAR(Get(losses)[0], 500.0f, 1e-3);
  EXPECT_NEAR(Get(dl)[0], 1.0f, 1e-6);
  EXPECT_NEAR(Get(dl)[1], -1.0f, 1e-6);
}

// Rows padded past the vocabulary (GPT-2's 50257 to 50304): loss and gradient are those of a
// softmax over the first V columns, computed here in double; the padding's gradient is exactly
// 0, however large its logits; vocab = all columns is the default, bit for bit.
TEST(SoftmaxCrossEntropyTest, PaddedColumnsAreMasked) {
  for (auto [n, v, vp] : {std::tuple{4, 13, 64}, std::tuple{3, 1, 8}, std::tuple{5, 300, 320}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " v=" << v << " vp=" << vp);
    Vec x = Get(Rand({n, vp}, -4.0f, 4.0f));
    // Padding larger than every real logit: it would dominate an unmasked softmax.
    for (int i = 0; i < n; i++) {
      for (int j = v; j < vp; j++) x[i * vp + j] = 30.0f;
    }
    std::vector<int32_t> tg(n);
    for (int i = 0; i < n; i++) tg[i] = i == 1 ? -1 : static_cast<int32_t>(RandInt(0, v - 1));
    const float scale = 0.125f;
    Tensor logits = FromVec(x, {n, vp}), losses = Rand({n}), dlogits = Rand({n, vp});
    ASSERT_OK(SoftmaxCrossEntropy(Cpu(), losses, dlogits, logits, Ints(tg, {n}), scale, v));
    Ref want_d;
    EXPECT_TRUE(AllClose(Get(losses), RefCrossEntropy(x, n, vp, v, tg, scale, &want_d), 1e-5,
                         1e-5));
    EXPECT_TRUE(AllClose(Get(dlogits), want_d, 1e-7, 1e-5));
    const Vec d = Get(dlogits);
    for (int i = 0; i < n; i++) {
      for (int j = v; j < vp; j++) ASSERT_EQ(d[i * vp + j], 0.0f) << "row " << i << " col " << j;
    }
    // In place, and without the gradient: the same losses.
    Tensor inplace = FromVec(x, {n, vp}), losses2 = Zeros({n}), losses3 = Zeros({n});
    ASSERT_OK(SoftmaxCrossEntropy(Cpu(), losses2, inplace, inplace, Ints(tg, {n}), scale, v));
    EXPECT_EQ(Get(losses2), Get(losses));
    EXPECT_EQ(Get(inplace), d);
    ASSERT_OK(SoftmaxCrossEntropy(Cpu(), losses3, Tensor(), logits, Ints(tg, {n}), scale, v));
    EXPECT_EQ(Get(losses3), Get(losses));
    // A target among the padding is refused, naming it.
    std::vector<int32_t> bad = tg;
    bad[0] = v;
    ExpectError(SoftmaxCrossEntropy(Cpu(), Zeros({n}), Tensor(), logits, Ints(bad, {n}), scale, v),
                {"SoftmaxCrossEntropy", "target " + std::to_string(v) + " of row 0"});
  }
  // vocab = every column gives the default's bits.
  Tensor logits = Rand({6, 77}, -4.0f, 4.0f), targets = Ints({0, 5, 76, -1, 3, 40}, {6});
  Tensor l1 = Zeros({6}), d1 = Zeros({6, 77}), l2 = Zeros({6}), d2 = Zeros({6, 77});
  ASSERT_OK(SoftmaxCrossEntropy(Cpu(), l1, d1, logits, targets, 0.5f));
  ASSERT_OK(SoftmaxCrossEntropy(Cpu(), l2, d2, logits, targets, 0.5f, 77));
  EXPECT_EQ(Get(l1), Get(l2));
  EXPECT_EQ(Get(d1), Get(d2));
  ExpectError(SoftmaxCrossEntropy(Cpu(), l1, d1, logits, targets, 0.5f, 78),
              {"SoftmaxCrossEntropy", "vocab 78"});
}

// The vocabulary split over `parts` ranks of a tensor-parallel group (the last slice short of
// real columns where the padded vocabulary vp is larger than v): each slice's max and partials
// reduced here as the group's all-reduces would, then each slice's losses and gradient. Every
// slice's losses, and the slices' gradients side by side, are the unsplit softmax's, computed
// in double.
TEST(VocabParallelCrossEntropyTest, SlicesTogetherAreTheWholeSoftmax) {
  for (auto [n, v, vp, parts] : {std::tuple{5, 13, 16, 2}, std::tuple{4, 33, 36, 3},
                                 std::tuple{3, 10, 16, 4}, std::tuple{2, 7, 7, 1}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " v=" << v << " vp=" << vp
                                      << " parts=" << parts);
    const int vl = vp / parts;
    Vec x = Get(Rand({n, vp}, -4.0f, 4.0f));
    for (int i = 0; i < n; i++) {
      for (int j = v; j < vp; j++) x[i * vp + j] = 30.0f;  // padding: must take no part
    }
    std::vector<int32_t> tg(n);
    for (int i = 0; i < n; i++) tg[i] = i == 1 ? -1 : static_cast<int32_t>(RandInt(0, v - 1));
    const float scale = 0.25f;
    Ref want_d;
    const Ref want = RefCrossEntropy(x, n, vp, v, tg, scale, &want_d);
    std::vector<Tensor> slices;
    std::vector<int64_t> columns;
    Vec max(n, -INFINITY), sums(2 * n, 0.0f);
    for (int r = 0; r < parts; r++) {
      Vec xs(static_cast<size_t>(n) * vl);
      for (int i = 0; i < n; i++) {
        for (int j = 0; j < vl; j++) xs[i * vl + j] = x[i * vp + r * vl + j];
      }
      slices.push_back(FromVec(xs, {n, vl}));
      columns.push_back(std::clamp<int64_t>(v - int64_t{r} * vl, 0, vl));
      Tensor m = Zeros({n});
      ASSERT_OK(CrossEntropyRowMax(Cpu(), m, slices[r], columns[r]));
      for (int i = 0; i < n; i++) max[i] = std::max(max[i], Get(m)[i]);  // all-reduce max
    }
    const Tensor max_t = FromVec(max, {n});
    for (int r = 0; r < parts; r++) {
      Tensor part = Zeros({2, n});
      ASSERT_OK(CrossEntropyPartials(Cpu(), part, slices[r], max_t, Ints(tg, {n}),
                                     int64_t{r} * vl, columns[r]));
      for (int i = 0; i < 2 * n; i++) sums[i] += Get(part)[i];  // all-reduce sum
    }
    const Tensor sums_t = FromVec(sums, {2, n});
    for (int r = 0; r < parts; r++) {
      Tensor losses = Rand({n}), dl = Rand({n, vl});
      ASSERT_OK(VocabParallelCrossEntropy(Cpu(), losses, dl, slices[r], max_t, sums_t,
                                          Ints(tg, {n}), scale, int64_t{r} * vl, columns[r]));
      EXPECT_TRUE(AllClose(Get(losses), want, 1e-5, 1e-5));
      Ref want_slice(static_cast<size_t>(n) * vl);
      for (int i = 0; i < n; i++) {
        for (int j = 0; j < vl; j++) want_slice[i * vl + j] = want_d[i * vp + r * vl + j];
      }
      EXPECT_TRUE(AllClose(Get(dl), want_slice, 1e-7, 1e-5));
      // In place, and without the gradient: the same losses.
      Tensor inplace = FromVec(Get(slices[r]), {n, vl}), l2 = Zeros({n}), l3 = Zeros({n});
      ASSERT_OK(VocabParallelCrossEntropy(Cpu(), l2, inplace, inplace, max_t, sums_t,
                                          Ints(tg, {n}), scale, int64_t{r} * vl, columns[r]));
      EXPECT_EQ(Get(inplace), Get(dl));
      ASSERT_OK(VocabParallelCrossEntropy(Cpu(), l3, Tensor(), slices[r], max_t, sums_t,
                                          Ints(tg, {n}), scale, int64_t{r} * vl, columns[r]));
      EXPECT_EQ(Get(l3), Get(losses));
    }
  }
  ExpectError(CrossEntropyRowMax(Cpu(), Zeros({2}), Rand({2, 4}), 5),
              {"CrossEntropyRowMax", "columns 5"});
}

// A table split by rows over three ranks: the slices' outputs summed (the group's all-reduce,
// with the positions on one rank only) are the whole table's; each slice's gradient is its
// rows of the whole table's.
TEST(EmbeddingTest, VocabularySlicesAddUpToTheWholeTable) {
  const int64_t B = 2, T = 5, C = 3, V = 9, parts = 3, vl = V / parts;
  const Tensor wte = Rand({V, C}), wpe = Rand({T, C}), dout = Rand({B, T, C});
  std::vector<int32_t> ids(B * T);
  for (int64_t i = 0; i < B * T; i++) ids[i] = static_cast<int32_t>((i * 4 + 1) % V);
  const Tensor tokens = Ints(ids, {B, T});
  Tensor whole = Zeros({B, T, C}), dwhole = Zeros({V, C});
  ASSERT_OK(EmbeddingForward(Cpu(), whole, tokens, wte, wpe));
  ASSERT_OK(EmbeddingBackward(Cpu(), dwhole, Tensor(), dout, tokens));
  Ref sum(B * T * C, 0.0);
  const Vec table = Get(wte), dtable = Get(dwhole);
  for (int64_t r = 0; r < parts; r++) {
    const Tensor slice = FromVec(Vec(table.begin() + r * vl * C, table.begin() + (r + 1) * vl * C),
                                 {vl, C});
    Tensor out = Zeros({B, T, C}), dslice = Zeros({vl, C});
    ASSERT_OK(EmbeddingForward(Cpu(), out, tokens, slice, r == 0 ? wpe : Tensor(), r * vl, V));
    for (size_t i = 0; i < sum.size(); i++) sum[i] += Get(out)[i];
    ASSERT_OK(EmbeddingBackward(Cpu(), dslice, Tensor(), dout, tokens, r * vl, V));
    EXPECT_EQ(Get(dslice), Vec(dtable.begin() + r * vl * C, dtable.begin() + (r + 1) * vl * C));
  }
  EXPECT_TRUE(AllClose(Get(whole), sum, 1e-6, 1e-6));
  ExpectError(EmbeddingForward(Cpu(), Zeros({B, T, C}), tokens, Rand({vl, C}), Tensor(), 7, V),
              {"EmbeddingForward", "do not fit a vocabulary of 9"});
}

// ---- reductions -----------------------------------------------------------------------------

TEST(ReductionTest, SumAndSumSquares) {
  for (const Shape& shape : ElementwiseShapes()) {
    Tensor x = Rand(shape);
    const Vec v = Get(x);
    double sum = 0.0, sq = 0.0;
    for (float e : v) {
      sum += e;
      sq += static_cast<double>(e) * e;
    }
    Tensor out = Rand({1});
    ASSERT_OK(Sum(Cpu(), out, x));
    EXPECT_TRUE(AllClose(Get(out), {sum}, 1e-6, 1e-6));
    Tensor acc = FromVec({1.0f}, {1});
    ASSERT_OK(SumSquaresAccumulate(Cpu(), acc, x));
    ASSERT_OK(SumSquaresAccumulate(Cpu(), acc, x));
    EXPECT_TRUE(AllClose(Get(acc), {1.0 + 2.0 * sq}, 1e-6, 1e-6)) << shape.ToString();
  }
  Tensor acc = Zeros({1});
  ASSERT_OK(SumSquaresAccumulate(Cpu(), acc, FromVec({1.0f, -INFINITY, 2.0f}, {3})));
  EXPECT_EQ(Get(acc)[0], INFINITY);
  ASSERT_OK(SumSquaresAccumulate(Cpu(), acc, FromVec({1.0f}, {1})));
  EXPECT_EQ(Get(acc)[0], INFINITY);
  Tensor acc2 = Zeros({1});
  ASSERT_OK(SumSquaresAccumulate(Cpu(), acc2, FromVec({3e20f, 1.0f}, {2})));  // square overflows
  EXPECT_EQ(Get(acc2)[0], INFINITY);
  Tensor acc3 = Zeros({1});
  ASSERT_OK(SumSquaresAccumulate(Cpu(), acc3,
                                 FromVec({1.0f, std::numeric_limits<float>::quiet_NaN()}, {2})));
  EXPECT_TRUE(std::isnan(Get(acc3)[0]));
}

// ---- optimizers -----------------------------------------------------------------------------

TEST(OptimizerTest, AdamWAgainstScalarReference) {
  for (int64_t n : {int64_t{1}, int64_t{13}, int64_t{5000}, int64_t{0}}) {
    Tensor p = Rand({n}), m = Zeros({n}), v = Zeros({n});
    Tensor low = Tensor::Empty({n}, DType::kBF16, Device::Cpu()).value();
    Ref rp = ToRef(Get(p)), rm(n, 0.0), rv(n, 0.0);
    AdamWConfig c;
    c.lr = 1e-2f;
    c.weight_decay = 0.1f;
    c.grad_scale = 0.5f;
    for (int step = 1; step <= 5; step++) {
      c.step = step;
      Tensor g = Rand({n});
      const Vec gv = Get(g);
      ASSERT_OK(AdamWUpdate(Cpu(), p, g, m, v, c, low));
      // PyTorch's formulas, with the config's values as the f32 numbers they are.
      const double b1 = c.beta1, b2 = c.beta2, lr = c.lr, wd = c.weight_decay, eps = c.eps;
      for (int64_t i = 0; i < n; i++) {
        const double grad = gv[i] * 0.5;
        rm[i] = b1 * rm[i] + (1.0 - b1) * grad;
        rv[i] = b2 * rv[i] + (1.0 - b2) * grad * grad;
        const double mhat = rm[i] / (1.0 - std::pow(b1, step));
        const double vhat = rv[i] / (1.0 - std::pow(b2, step));
        rp[i] = rp[i] * (1.0 - lr * wd) - lr * mhat / (std::sqrt(vhat) + eps);
      }
      ASSERT_TRUE(AllClose(Get(p), rp, 1e-6, 1e-5)) << "step " << step << " n " << n;
      ASSERT_TRUE(AllClose(Get(m), rm, 1e-7, 1e-5));
      ASSERT_TRUE(AllClose(Get(v), rv, 1e-9, 1e-5));
    }
    const Vec pv = Get(p);
    for (int64_t i = 0; i < n; i++) ASSERT_EQ(low.data<uint16_t>()[i], FloatToBf16(pv[i]));
  }
  // An f16 low copy, and none at all.
  Tensor p = Rand({9}), m = Zeros({9}), v = Zeros({9}), g = Rand({9});
  Tensor half = Tensor::Empty({3, 3}, DType::kF16, Device::Cpu()).value();
  ASSERT_OK(AdamWUpdate(Cpu(), p, g, m, v, AdamWConfig(), half));
  ASSERT_OK(Cpu().Synchronize());
  for (int i = 0; i < 9; i++) EXPECT_EQ(half.data<uint16_t>()[i], FloatToHalf(Get(p)[i]));
  ASSERT_OK(AdamWUpdate(Cpu(), p, g, m, v, AdamWConfig()));
}

TEST(OptimizerTest, SgdMomentumAgainstScalarReference) {
  for (int64_t n : {int64_t{1}, int64_t{33}, int64_t{4099}, int64_t{0}}) {
    Tensor p = Rand({n}), buf = Zeros({n});
    Tensor low = Tensor::Empty({n}, DType::kBF16, Device::Cpu()).value();
    Ref rp = ToRef(Get(p)), rb(n, 0.0);
    SgdConfig c;
    c.lr = 0.1f;
    c.momentum = 0.9f;
    c.weight_decay = 0.01f;
    c.grad_scale = 2.0f;
    for (int step = 0; step < 4; step++) {
      Tensor g = Rand({n});
      const Vec gv = Get(g);
      ASSERT_OK(SgdMomentumUpdate(Cpu(), p, g, buf, c, low));
      const double lr = c.lr, mu = c.momentum, wd = c.weight_decay;
      for (int64_t i = 0; i < n; i++) {
        rb[i] = mu * rb[i] + (gv[i] * 2.0 + wd * rp[i]);
        rp[i] -= lr * rb[i];
      }
      ASSERT_TRUE(AllClose(Get(p), rp, 1e-6, 1e-5)) << "step " << step;
      ASSERT_TRUE(AllClose(Get(buf), rb, 1e-6, 1e-5));
    }
    const Vec pv = Get(p);
    for (int64_t i = 0; i < n; i++) ASSERT_EQ(low.data<uint16_t>()[i], FloatToBf16(pv[i]));
  }
}

// ---- zero-sized tensors ---------------------------------------------------------------------

TEST(ZeroSizedTest, EveryOpAcceptsEmptyTensors) {
  Stream& s = Cpu();
  Tensor dw = Rand({4}), db = Rand({4});
  const Vec dw0 = Get(dw), db0 = Get(db);
  ASSERT_OK(GeluBackward(s, Zeros({0, 4}), Zeros({0, 4}), Zeros({0, 4})));
  ASSERT_OK(SoftmaxBackward(s, Zeros({0, 4}), Zeros({0, 4}), Zeros({0, 4})));
  ASSERT_OK(SoftmaxBackward(s, Zeros({3, 0}), Zeros({3, 0}), Zeros({3, 0})));
  ASSERT_OK(LayerNormBackward(s, Zeros({0, 4}), dw, db, Zeros({0, 4}), Zeros({0, 4}), Zeros({4}),
                              Zeros({0}), Zeros({0})));
  EXPECT_EQ(Get(dw), dw0);  // nothing added
  EXPECT_EQ(Get(db), db0);
  ASSERT_OK(LayerNormBackward(s, Zeros({3, 0}), Zeros({0}), Zeros({0}), Zeros({3, 0}),
                              Zeros({3, 0}), Zeros({0}), Zeros({3}), Zeros({3})));
  ASSERT_OK(ResidualLayerNormForward(s, Zeros({0, 4}), Zeros({0, 4}), Zeros({0}), Zeros({0}),
                                     Zeros({0, 4}), Zeros({0, 4}), Zeros({4}), Zeros({4})));
  ASSERT_OK(
      LinearGeluForward(s, Zeros({0, 3}), Zeros({0, 3}), Zeros({0, 4}), Rand({3, 4}), Rand({3})));
  ASSERT_OK(AttentionForward(s, Zeros({1, 0, 4}), Zeros({1, 2, 0, 0}), Zeros({1, 0, 12}), 2));
  ASSERT_OK(FlashAttentionForward(s, Zeros({1, 0, 4}), Zeros({1, 2, 0}), Zeros({1, 0, 12}), 2));
  Tensor dwte = Rand({5, 4});
  const Vec dwte0 = Get(dwte);
  ASSERT_OK(EmbeddingBackward(s, dwte, Zeros({3, 4}), Zeros({0, 3, 4}), Ints({}, {0, 3})));
  EXPECT_EQ(Get(dwte), dwte0);
  ASSERT_OK(SoftmaxCrossEntropy(s, Zeros({0}), Zeros({0, 5}), Zeros({0, 5}), Ints({}, {0}), 1.0f));
  // V = 0: only ignored targets are possible, with loss 0.
  Tensor losses = Rand({2});
  ASSERT_OK(
      SoftmaxCrossEntropy(s, losses, Zeros({2, 0}), Zeros({2, 0}), Ints({-1, -1}, {2}), 1.0f));
  EXPECT_EQ(Get(losses), (Vec{0.0f, 0.0f}));
  ASSERT_OK(Cast(s, Zeros({0, 2}), Zeros({0, 2})));
  ASSERT_OK(Fill(s, Zeros({0}), 1.0f));
  Tensor sum = Rand({1});
  ASSERT_OK(Sum(s, sum, Zeros({0, 7})));
  EXPECT_EQ(Get(sum)[0], 0.0f);
}

// ---- argument errors ------------------------------------------------------------------------

TEST(ArgumentErrorsTest, NameTheOpAndTheShapes) {
  Stream& s = Cpu();
  // matmul and linear
  ExpectError(Matmul(s, Zeros({3, 5}), Zeros({3, 4}), Zeros({5, 5}), false, false),
              {"Matmul", "[3, 4]", "[5, 5]", "inner"});
  ExpectError(Matmul(s, Zeros({3, 6}), Zeros({3, 4}), Zeros({4, 5}), false, false),
              {"Matmul", "out", "[3, 6]", "[3, 5]"});
  Tensor square = Zeros({4, 4});
  ExpectError(Matmul(s, square, square, Zeros({4, 4}), false, false),
              {"Matmul", "shares memory", "[4, 4]"});
  ExpectError(LinearForward(s, Zeros({2, 3}), Zeros({2, 4}), Zeros({3, 4}), Zeros({4})),
              {"LinearForward", "bias", "[4]", "[3]"});
  ExpectError(LinearForward(s, Zeros({2, 3}), Zeros({2, 4}), Zeros({3, 5}), Tensor()),
              {"LinearForward", "[2, 4]", "[3, 5]"});
  ExpectError(LinearForward(s, Zeros({2, 3}), Zeros({2, 2, 4}), Zeros({3, 4}), Tensor()),
              {"LinearForward", "inp", "(N, C)", "[2, 2, 4]"});
  ExpectError(
      LinearGeluForward(s, Zeros({2, 3}), Zeros({2, 3}), Zeros({2, 4}), Zeros({3, 4}), Tensor()),
      {"LinearGeluForward", "bias is undefined"});
  ExpectError(LinearBackward(s, Tensor(), Zeros({3, 4}), Tensor(), Zeros({2, 5}), Zeros({2, 4}),
                             Zeros({3, 4})),
              {"LinearBackward", "dout", "[2, 5]", "[2, 3]"});
  // elementwise: the CPU computes in f32
  Tensor bf = Tensor::Empty({2, 3}, DType::kBF16, Device::Cpu()).value();
  ExpectError(GeluForward(s, bf, bf),
              {"GeluForward", "bf16[2, 3] on cpu", "the CPU computes in f32; cast first"});
  ExpectError(GeluBackward(s, Zeros({2, 3}), Zeros({2, 3}), Zeros({3, 2})),
              {"GeluBackward", "dout", "[3, 2]", "[2, 3]"});
  ExpectError(Add(s, Zeros({4}), Zeros({4}), Zeros({5})), {"Add", "[5]", "[4]"});
  ExpectError(BiasAdd(s, Zeros({2, 3}), Zeros({4})), {"BiasAdd", "bias", "[4]", "[3]"});
  ExpectError(ReluBackward(s, Zeros({2}), Zeros({2}), Tensor()),
              {"ReluBackward", "dout is undefined"});
  ExpectError(Axpy(s, Zeros({2}), 1.0f, Ints({1, 2}, {2})), {"Axpy", "i32[2] on cpu"});
  ExpectError(Cast(s, Zeros({2}), Ints({1, 2}, {2})), {"Cast", "i32[2] on cpu"});
  ExpectError(Cast(s, Zeros({3}), bf), {"Cast", "[3]", "[2, 3]"});
  // normalization
  ExpectError(LayerNormForward(s, Zeros({2, 3}), Zeros({3}), Zeros({2}), Zeros({2, 3}), Zeros({3}),
                               Zeros({3})),
              {"LayerNormForward", "mean", "[3]", "[2]"});
  Tensor bf_mean = Tensor::Empty({2}, DType::kBF16, Device::Cpu()).value();
  ExpectError(LayerNormBackward(s, Zeros({2, 3}), Zeros({3}), Zeros({3}), Zeros({2, 3}),
                                Zeros({2, 3}), Zeros({3}), bf_mean, Zeros({2})),
              {"LayerNormBackward", "mean", "bf16[2] on cpu"});
  ExpectError(SoftmaxForward(s, Zeros({6}), Zeros({6})), {"SoftmaxForward", "(N, C)", "[6]"});
  ExpectError(ResidualLayerNormForward(s, Zeros({2, 3}), Zeros({2, 3}), Zeros({2}), Zeros({2}),
                                       Zeros({2, 3}), Zeros({2, 4}), Zeros({3}), Zeros({3})),
              {"ResidualLayerNormForward", "[2, 4]", "[2, 3]"});
  // attention
  ExpectError(AttentionForward(s, Zeros({1, 2, 6}), Zeros({1, 4, 2, 2}), Zeros({1, 2, 18}), 4),
              {"AttentionForward", "num_heads = 4", "[1, 2, 18]"});
  ExpectError(AttentionForward(s, Zeros({1, 2, 6}), Zeros({1, 2, 2, 3}), Zeros({1, 2, 18}), 2),
              {"AttentionForward", "att", "[1, 2, 2, 3]", "[1, 2, 2, 2]"});
  ExpectError(AttentionBackward(s, Zeros({1, 2, 18}), Zeros({1, 3, 6}), Zeros({1, 2, 18}),
                                Zeros({1, 2, 2, 2}), 2),
              {"AttentionBackward", "dout", "[1, 3, 6]", "[1, 2, 6]"});
  ExpectError(FlashAttentionForward(s, Zeros({1, 2, 6}), Zeros({1, 2, 2, 2}), Zeros({1, 2, 18}), 2),
              {"FlashAttentionForward", "lse", "[1, 2, 2, 2]", "[1, 2, 2]"});
  ExpectError(FlashAttentionBackward(s, Zeros({1, 2, 18}), Zeros({1, 2, 6}), Zeros({1, 2, 18}),
                                     Tensor(), Zeros({1, 2, 2}), 2),
              {"FlashAttentionBackward", "out is undefined"});
  ExpectError(FlashAttentionBackward(s, Zeros({1, 2, 18}), Zeros({1, 2, 6}), Zeros({1, 2, 18}),
                                     Zeros({1, 2, 5}), Zeros({1, 2, 2}), 2),
              {"FlashAttentionBackward", "out", "[1, 2, 5]", "[1, 2, 6]"});
  // embedding and loss
  ExpectError(EmbeddingForward(s, Zeros({2, 3, 4}), Ints({0, 1, 2, 3, 9, 0}, {2, 3}), Zeros({5, 4}),
                               Tensor()),
              {"EmbeddingForward", "token id 9", "b=1, t=1", "[2, 3]", "[5, 4]"});
  ExpectError(EmbeddingForward(s, Zeros({1, 2, 4}), Ints({-1, 0}, {1, 2}), Zeros({5, 4}), Tensor()),
              {"EmbeddingForward", "token id -1", "b=0, t=0"});
  ExpectError(
      EmbeddingForward(s, Zeros({1, 3, 4}), Ints({0, 1, 2}, {1, 3}), Zeros({5, 4}), Zeros({2, 4})),
      {"EmbeddingForward", "wpe", "[2, 4]", "maxT >= 3"});
  ExpectError(EmbeddingBackward(s, Zeros({5, 4}), Tensor(), Zeros({1, 2, 4}), Ints({0, 7}, {1, 2})),
              {"EmbeddingBackward", "token id 7", "b=0, t=1"});
  ExpectError(
      EmbeddingBackward(s, Zeros({5, 4}), Tensor(), Zeros({1, 2, 4}), FromVec({0, 1}, {1, 2})),
      {"EmbeddingBackward", "tokens", "f32[1, 2] on cpu", "i32"});
  ExpectError(
      SoftmaxCrossEntropy(s, Zeros({2}), Tensor(), Zeros({2, 3}), FromVec({0, 1}, {2}), 1.0f),
      {"SoftmaxCrossEntropy", "targets", "f32[2] on cpu"});
  ExpectError(SoftmaxCrossEntropy(s, Zeros({2}), Tensor(), Zeros({2, 3}), Ints({0, 3}, {2}), 1.0f),
              {"SoftmaxCrossEntropy", "target 3 of row 1", "[2, 3]"});
  // reductions
  ExpectError(Sum(s, Zeros({2}), Zeros({3})), {"Sum", "f32[2] on cpu", "one element"});
  ExpectError(SumSquaresAccumulate(s, Tensor(), Zeros({3})),
              {"SumSquaresAccumulate", "out is undefined"});
  // optimizers
  ExpectError(AdamWUpdate(s, Zeros({4}), Zeros({4}), Zeros({5}), Zeros({4}), AdamWConfig()),
              {"AdamWUpdate", "m", "f32[5] on cpu", "f32[4] on cpu"});
  AdamWConfig step0;
  step0.step = 0;
  ExpectError(AdamWUpdate(s, Zeros({4}), Zeros({4}), Zeros({4}), Zeros({4}), step0),
              {"AdamWUpdate", "step is 0", "f32[4] on cpu"});
  ExpectError(
      AdamWUpdate(s, Zeros({4}), Zeros({4}), Zeros({4}), Zeros({4}), AdamWConfig(), Zeros({4})),
      {"AdamWUpdate", "params_low", "f32[4] on cpu", "bf16 or f16"});
  ExpectError(SgdMomentumUpdate(s, Zeros({4}), Zeros({4}), Zeros({4}), SgdConfig(),
                                Tensor::Empty({3}, DType::kBF16, Device::Cpu()).value()),
              {"SgdMomentumUpdate", "params_low", "bf16[3] on cpu"});
  Tensor bf_grads = Tensor::Empty({4}, DType::kBF16, Device::Cpu()).value();
  ExpectError(SgdMomentumUpdate(s, Zeros({4}), bf_grads, Zeros({4}), SgdConfig()),
              {"SgdMomentumUpdate", "grads", "bf16[4] on cpu"});
}

}  // namespace
}  // namespace ops
}  // namespace tandem
