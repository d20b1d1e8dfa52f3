// The CPU backend of ops.h, in f32: plain single-threaded loops after llm.c's train_gpt2.c,
// with OpenBLAS's sgemm for every matmul (attention's included). ops.cc has checked every
// argument; the only errors left here are the ones that depend on the data (token ids).
//
// Legend: N = rows (B * T), C = channels, OC = output channels, V = vocabulary, B = batch,
// T = sequence, NH = heads, hs = C / NH. All tensors are contiguous, row-major.

// The project compiles at -O2, where GCC 12 vectorizes only loops whose trip count is a known
// multiple of the vector width, and -ftrapping-math keeps it from turning the clamps in
// Exp/Tanh into selects. The loops below are the CPU path's hot spots, so this file asks for
// the full vectorizer (before the includes: the inline helpers of <cmath> must be compiled
// with the same options, or they are not inlined into vectorizable loops). Neither option
// changes a result: they only drop FP-exception side effects, which nothing here reads.
#pragma GCC optimize("O3", "no-trapping-math")

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_format.h"
#include "runtime/ops_backend.h"
#include "runtime/status.h"

namespace tandem {
namespace ops {
namespace cpu {
namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

// ---- scalar helpers, inlined into the loops so that the loops still vectorize ---------------

// tanh as a 13/6 rational function (Eigen's float tanh): within 4e-7 of tanh everywhere,
// where tanhf would be a call that stops vectorization of the GELU loops.
inline float Tanh(float x) {
  const float kClamp = 7.90531110763549805f;  // |tanh| rounds to 1 beyond this
  float a = std::fabs(x);
  a = a > kClamp ? kClamp : a;  // a nan stays a nan
  const float a2 = a * a;
  float p = -2.76076847742355e-16f;
  p = p * a2 + 2.00018790482477e-13f;
  p = p * a2 - 8.60467152213735e-11f;
  p = p * a2 + 5.12229709037114e-08f;
  p = p * a2 + 1.48572235717979e-05f;
  p = p * a2 + 6.37261928875436e-04f;
  p = p * a2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * a2 + 1.18534705686654e-04f;
  q = q * a2 + 2.26843463243900e-03f;
  q = q * a2 + 4.89352518554385e-03f;
  return std::copysign(a * p / q, x);
}

// exp(x) for x <= 0 (softmax arguments after the row maximum is subtracted), after Cephes'
// expf: 2^n * exp(r) with |r| <= ln2 / 2, within 1e-7 relative; 0 below -87 (where expf
// would give a denormal that no softmax sum can notice), nan for nan.
inline float ExpNonPositive(float x) {
  const float xc = x < -87.0f ? -87.0f : x;  // keeps 2^n normal; a nan stays a nan
  // Adding 1.5 * 2^23 rounds to an integer n, which then sits in the low mantissa bits.
  const float kRound = 12582912.0f;
  const uint32_t kRoundBits = 0x4b400000u;
  const float shifted = xc * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 split in two
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  uint32_t bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  bits = (bits - kRoundBits + 127u) << 23;  // the exponent field of 2^n
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return x < -87.0f ? 0.0f : er * two_n;
}

inline float Gelu(float x) {
  const float u = kGeluScale * (x + kGeluCube * x * x * x);
  return 0.5f * x * (1.0f + Tanh(u));
}

// d GELU(x) / dx.
inline float GeluGrad(float x) {
  const float u = kGeluScale * (x + kGeluCube * x * x * x);
  const float t = Tanh(u);
  const float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
}

// Reductions keep kLanes independent partial sums: the compiler vectorizes them without
// reordering the additions, so a result never depends on where the data sits in memory.
constexpr int kLanes = 8;

inline float SumOf(const float* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; l++) acc[l] += x[i + l];
  }
  float sum = 0.0f;
  for (int l = 0; l < kLanes; l++) sum += acc[l];
  for (; i < n; i++) sum += x[i];
  return sum;
}

inline float DotOf(const float* x, const float* y, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; l++) acc[l] += x[i + l] * y[i + l];
  }
  float sum = 0.0f;
  for (int l = 0; l < kLanes; l++) sum += acc[l];
  for (; i < n; i++) sum += x[i] * y[i];
  return sum;
}

// sum of (x - mean)^2: the variance's second pass, which avoids E[x^2] - E[x]^2's cancellation.
inline float SumSquaredDeviationsOf(const float* x, float mean, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; l++) {
      const float d = x[i + l] - mean;
      acc[l] += d * d;
    }
  }
  float sum = 0.0f;
  for (int l = 0; l < kLanes; l++) sum += acc[l];
  for (; i < n; i++) sum += (x[i] - mean) * (x[i] - mean);
  return sum;
}

// -inf for n = 0; a nan is skipped here but reaches the result through exp(x - max).
inline float MaxOf(const float* x, int64_t n) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; l++) acc[l] = -INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; l++) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
  }
  float m = -INFINITY;
  for (int l = 0; l < kLanes; l++) m = acc[l] > m ? acc[l] : m;
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

// Writes exp(x - max) to out and returns their sum: a softmax row before normalization.
inline float ExpShiftedOf(float* out, const float* x, float max, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = ExpNonPositive(x[i] - max);
  return SumOf(out, n);
}

// ---- matmul through OpenBLAS --------------------------------------------------------------

// c (m, n) = alpha * op(a) @ op(b) + beta * c, row-major with leading dimensions. Empty
// extents are handled here: BLAS refuses the leading dimension 0 they can imply.
absl::Status Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {  // op(a) @ op(b) is all zeros; beta = 0 ignores c's contents, as BLAS does
    for (int64_t i = 0; i < m; i++) {
      float* c_row = c + i * ldc;
      for (int64_t j = 0; j < n; j++) c_row[j] = beta == 0.0f ? 0.0f : beta * c_row[j];
    }
    return absl::OkStatus();
  }
  for (int64_t d : {m, n, k, lda, ldb, ldc}) {
    if (d > INT_MAX) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "matmul of (%d, %d) @ (%d, %d): an extent exceeds what OpenBLAS indexes (2^31 - 1)", m, k,
          k, n));
    }
  }
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
  return absl::OkStatus();
}

}  // namespace

absl::Status Matmul(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b,
                    bool transpose_a, bool transpose_b, float alpha, float beta) {
  // out (M, N), op(a) (M, K), op(b) (K, N)
  const int64_t m = out.dim(0), n = out.dim(1);
  const int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  return Gemm(transpose_a, transpose_b, m, n, k, alpha, a.data<float>(), a.dim(1), b.data<float>(),
              b.dim(1), beta, out.data<float>(), n);
}

absl::Status LinearForward(Stream& s, const Tensor& out, const Tensor& inp, const Tensor& weight,
                           const Tensor& bias) {
  const int64_t n = inp.dim(0), c = inp.dim(1), oc = weight.dim(0);
  float* o = out.data<float>();           // (N, OC)
  const float* x = inp.data<float>();     // (N, C)
  const float* w = weight.data<float>();  // (OC, C)
  float beta = 0.0f;
  if (bias.defined()) {
    // Start every row at the bias and let sgemm accumulate onto it: one pass over out.
    const float* bs = bias.data<float>();  // (OC)
    for (int64_t i = 0; i < n; i++) std::memcpy(o + i * oc, bs, oc * sizeof(float));
    beta = 1.0f;
  }
  return Gemm(false, true, n, oc, c, 1.0f, x, c, w, c, beta, o, oc);
}

absl::Status LinearGeluForward(Stream& s, const Tensor& out, const Tensor& pre, const Tensor& inp,
                               const Tensor& weight, const Tensor& bias) {
  RETURN_IF_ERROR(LinearForward(s, pre, inp, weight, bias));
  float* o = out.data<float>();        // (N, OC)
  const float* p = pre.data<float>();  // (N, OC)
  const int64_t count = out.numel();
  for (int64_t i = 0; i < count; i++) o[i] = Gelu(p[i]);
  return absl::OkStatus();
}

absl::Status LinearBackward(Stream& s, const Tensor& dinp, const Tensor& dweight,
                            const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                            const Tensor& weight) {
  const int64_t n = inp.dim(0), c = inp.dim(1), oc = weight.dim(0);
  const float* d = dout.data<float>();    // (N, OC)
  const float* x = inp.data<float>();     // (N, C)
  const float* w = weight.data<float>();  // (OC, C)
  if (dinp.defined()) {
    // dinp (N, C) = dout (N, OC) @ weight (OC, C)
    RETURN_IF_ERROR(Gemm(false, false, n, c, oc, 1.0f, d, oc, w, c, 0.0f, dinp.data<float>(), c));
  }
  // dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
  RETURN_IF_ERROR(Gemm(true, false, oc, c, n, 1.0f, d, oc, x, c, 1.0f, dweight.data<float>(), c));
  if (dbias.defined()) {
    float* db = dbias.data<float>();  // (OC)
    for (int64_t i = 0; i < n; i++) {
      const float* d_row = d + i * oc;
      for (int64_t o = 0; o < oc; o++) db[o] += d_row[o];
    }
  }
  return absl::OkStatus();
}

// ---- elementwise ----------------------------------------------------------------------------

absl::Status GeluForward(Stream& s, const Tensor& out, const Tensor& inp) {
  float* o = out.data<float>();
  const float* x = inp.data<float>();
  const int64_t count = out.numel();
  for (int64_t i = 0; i < count; i++) o[i] = Gelu(x[i]);
  return absl::OkStatus();
}

absl::Status GeluBackward(Stream& s, const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  float* dx = dinp.data<float>();
  const float* x = inp.data<float>();
  const float* d = dout.data<float>();
  const int64_t count = dinp.numel();
  for (int64_t i = 0; i < count; i++) dx[i] = GeluGrad(x[i]) * d[i];
  return absl::OkStatus();
}

absl::Status BiasGeluForward(Stream& s, const Tensor& out, const Tensor& pre, const Tensor& x,
                             const Tensor& bias) {
  const int64_t n = x.dim(0), c = x.dim(1);
  float* o = out.data<float>();                            // (N, C)
  float* p = pre.defined() ? pre.data<float>() : nullptr;  // (N, C) or none
  const float* xs = x.data<float>();                       // (N, C)
  const float* bs = bias.data<float>();                    // (C)
  for (int64_t i = 0; i < n; i++) {
    float* o_row = o + i * c;
    const float* x_row = xs + i * c;
    if (p != nullptr) {
      float* p_row = p + i * c;
      for (int64_t j = 0; j < c; j++) {
        const float v = x_row[j] + bs[j];
        p_row[j] = v;
        o_row[j] = Gelu(v);
      }
    } else {
      for (int64_t j = 0; j < c; j++) o_row[j] = Gelu(x_row[j] + bs[j]);
    }
  }
  return absl::OkStatus();
}

absl::Status ReluForward(Stream& s, const Tensor& out, const Tensor& inp) {
  float* o = out.data<float>();
  const float* x = inp.data<float>();
  const int64_t count = out.numel();
  for (int64_t i = 0; i < count; i++) o[i] = x[i] < 0.0f ? 0.0f : x[i];  // a nan stays a nan
  return absl::OkStatus();
}

absl::Status ReluBackward(Stream& s, const Tensor& dinp, const Tensor& out, const Tensor& dout) {
  float* dx = dinp.data<float>();
  const float* y = out.data<float>();
  const float* d = dout.data<float>();
  const int64_t count = dinp.numel();
  for (int64_t i = 0; i < count; i++) {
    const float g = d[i];  // loaded unconditionally, so the select needs no branch
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
  return absl::OkStatus();
}

absl::Status BiasAdd(Stream& s, const Tensor& x, const Tensor& bias) {
  const int64_t n = x.dim(0), c = x.dim(1);
  float* xs = x.data<float>();           // (N, C)
  const float* bs = bias.data<float>();  // (C)
  for (int64_t i = 0; i < n; i++) {
    float* x_row = xs + i * c;
    for (int64_t j = 0; j < c; j++) x_row[j] += bs[j];
  }
  return absl::OkStatus();
}

absl::Status Add(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b) {
  float* o = out.data<float>();
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  const int64_t count = out.numel();
  for (int64_t i = 0; i < count; i++) o[i] = x[i] + y[i];
  return absl::OkStatus();
}

absl::Status Axpy(Stream& s, const Tensor& y, float alpha, const Tensor& x) {
  float* ys = y.data<float>();
  const float* xs = x.data<float>();
  const int64_t count = y.numel();
  for (int64_t i = 0; i < count; i++) ys[i] += alpha * xs[i];
  return absl::OkStatus();
}

absl::Status Scale(Stream& s, const Tensor& x, float alpha) {
  float* xs = x.data<float>();
  const int64_t count = x.numel();
  for (int64_t i = 0; i < count; i++) xs[i] *= alpha;
  return absl::OkStatus();
}

absl::Status Cast(Stream& s, const Tensor& out, const Tensor& in) {
  const int64_t count = out.numel();
  if (out.dtype() == in.dtype()) {
    if (count > 0) std::memmove(out.raw(), in.raw(), out.bytes());
    return absl::OkStatus();
  }
  // Each conversion rounds once: bf16 and f16 widen to f32 exactly.
  float* of = out.dtype() == DType::kF32 ? out.data<float>() : nullptr;
  uint16_t* o16 = out.dtype() == DType::kF32 ? nullptr : out.data<uint16_t>();
  const bool to_bf16 = out.dtype() == DType::kBF16;
  for (int64_t i = 0; i < count; i++) {
    float v;
    switch (in.dtype()) {
      case DType::kBF16:
        v = Bf16ToFloat(in.data<uint16_t>()[i]);
        break;
      case DType::kF16:
        v = HalfToFloat(in.data<uint16_t>()[i]);
        break;
      default:
        v = in.data<float>()[i];
        break;
    }
    if (of != nullptr) {
      of[i] = v;
    } else {
      o16[i] = to_bf16 ? FloatToBf16(v) : FloatToHalf(v);
    }
  }
  return absl::OkStatus();
}

absl::Status Fill(Stream& s, const Tensor& x, float value) {
  float* xs = x.data<float>();
  const int64_t count = x.numel();
  for (int64_t i = 0; i < count; i++) xs[i] = value;
  return absl::OkStatus();
}

// ---- normalization, softmax -----------------------------------------------------------------

namespace {

// One row of layernorm: out = (x - mean) * rstd * w + b; returns mean and rstd. The variance
// is the biased one (divided by C), as PyTorch's.
inline void LayerNormRow(float* out, float* mean, float* rstd, const float* x, const float* w,
                         const float* b, int64_t c) {
  const float m = c > 0 ? SumOf(x, c) / c : 0.0f;
  const float var = c > 0 ? SumSquaredDeviationsOf(x, m, c) / c : 0.0f;
  const float r = 1.0f / std::sqrt(var + kLayerNormEps);
  for (int64_t j = 0; j < c; j++) out[j] = (x[j] - m) * r * w[j] + b[j];
  *mean = m;
  *rstd = r;
}

}  // namespace

absl::Status LayerNormForward(Stream& s, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                              const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  const int64_t n = inp.dim(0), c = inp.dim(1);
  float* o = out.data<float>();           // (N, C)
  float* mu = mean.data<float>();         // (N)
  float* rs = rstd.data<float>();         // (N)
  const float* x = inp.data<float>();     // (N, C)
  const float* w = weight.data<float>();  // (C)
  const float* b = bias.data<float>();    // (C)
  for (int64_t i = 0; i < n; i++) LayerNormRow(o + i * c, mu + i, rs + i, x + i * c, w, b, c);
  return absl::OkStatus();
}

absl::Status LayerNormBackward(Stream& s, const Tensor& dinp, const Tensor& dweight,
                               const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const int64_t n = inp.dim(0), c = inp.dim(1);
  float* dx = dinp.data<float>();         // (N, C)
  float* dw = dweight.data<float>();      // (C)
  float* db = dbias.data<float>();        // (C)
  const float* d = dout.data<float>();    // (N, C)
  const float* x = inp.data<float>();     // (N, C)
  const float* w = weight.data<float>();  // (C)
  const float* mu = mean.data<float>();   // (N)
  const float* rs = rstd.data<float>();   // (N)
  for (int64_t i = 0; i < n; i++) {
    const float* d_row = d + i * c;
    const float* x_row = x + i * c;
    float* dx_row = dx + i * c;
    const float m = mu[i], r = rs[i];
    // The two means the gradient of the normalization needs, over the row:
    // mean(dnorm) and mean(dnorm * norm), with dnorm = w * dout and norm = (x - m) * r.
    float acc_dnorm[kLanes] = {}, acc_dnorm_norm[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= c; j += kLanes) {
      for (int l = 0; l < kLanes; l++) {
        const float norm = (x_row[j + l] - m) * r;
        const float dnorm = w[j + l] * d_row[j + l];
        acc_dnorm[l] += dnorm;
        acc_dnorm_norm[l] += dnorm * norm;
      }
    }
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int l = 0; l < kLanes; l++) {
      dnorm_mean += acc_dnorm[l];
      dnorm_norm_mean += acc_dnorm_norm[l];
    }
    for (; j < c; j++) {
      const float norm = (x_row[j] - m) * r;
      const float dnorm = w[j] * d_row[j];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= c;
    dnorm_norm_mean /= c;
    // Two loops rather than one: fewer arrays per loop keep the compiler's aliasing checks
    // within what it is willing to emit for a vectorized version.
    for (j = 0; j < c; j++) {
      db[j] += d_row[j];
      dw[j] += (x_row[j] - m) * r * d_row[j];
    }
    for (j = 0; j < c; j++) {
      const float norm = (x_row[j] - m) * r;
      dx_row[j] = (w[j] * d_row[j] - dnorm_mean - norm * dnorm_norm_mean) * r;
    }
  }
  return absl::OkStatus();
}

absl::Status ResidualLayerNormForward(Stream& s, const Tensor& residual, const Tensor& out,
                                      const Tensor& mean, const Tensor& rstd, const Tensor& a,
                                      const Tensor& b, const Tensor& weight, const Tensor& bias) {
  const int64_t n = a.dim(0), c = a.dim(1);
  float* res = residual.data<float>();    // (N, C)
  float* o = out.data<float>();           // (N, C)
  float* mu = mean.data<float>();         // (N)
  float* rs = rstd.data<float>();         // (N)
  const float* xa = a.data<float>();      // (N, C)
  const float* xb = b.data<float>();      // (N, C)
  const float* w = weight.data<float>();  // (C)
  const float* bs = bias.data<float>();   // (C)
  // Row by row, so the residual row is still in cache when the layernorm reads it.
  for (int64_t i = 0; i < n; i++) {
    float* res_row = res + i * c;
    const float* a_row = xa + i * c;
    const float* b_row = xb + i * c;
    for (int64_t j = 0; j < c; j++) res_row[j] = a_row[j] + b_row[j];
    LayerNormRow(o + i * c, mu + i, rs + i, res_row, w, bs, c);
  }
  return absl::OkStatus();
}

absl::Status SoftmaxForward(Stream& s, const Tensor& out, const Tensor& inp) {
  const int64_t n = inp.dim(0), c = inp.dim(1);
  float* o = out.data<float>();        // (N, C)
  const float* x = inp.data<float>();  // (N, C)
  for (int64_t i = 0; i < n; i++) {
    float* o_row = o + i * c;
    const float* x_row = x + i * c;
    const float max = MaxOf(x_row, c);
    const float inv_sum = 1.0f / ExpShiftedOf(o_row, x_row, max, c);
    for (int64_t j = 0; j < c; j++) o_row[j] *= inv_sum;
  }
  return absl::OkStatus();
}

absl::Status SoftmaxBackward(Stream& s, const Tensor& dinp, const Tensor& out, const Tensor& dout) {
  const int64_t n = out.dim(0), c = out.dim(1);
  float* dx = dinp.data<float>();       // (N, C)
  const float* y = out.data<float>();   // (N, C)
  const float* d = dout.data<float>();  // (N, C)
  for (int64_t i = 0; i < n; i++) {
    float* dx_row = dx + i * c;
    const float* y_row = y + i * c;
    const float* d_row = d + i * c;
    const float dot = DotOf(d_row, y_row, c);
    for (int64_t j = 0; j < c; j++) dx_row[j] = y_row[j] * (d_row[j] - dot);
  }
  return absl::OkStatus();
}

// ---- attention ------------------------------------------------------------------------------
// For each (b, head) the heads' q, k and v are (T, hs) matrices inside qkv with leading
// dimension 3C, so sgemm reads them in place: no copies, no hand-written O(T^2 hs) loops.

absl::Status AttentionForward(Stream& s, const Tensor& out, const Tensor& att, const Tensor& qkv,
                              int num_heads) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  const int64_t NH = num_heads, hs = C / NH;
  const float scale = hs > 0 ? 1.0f / std::sqrt(static_cast<float>(hs)) : 1.0f;
  float* o = out.data<float>();        // (B, T, C)
  float* a = att.data<float>();        // (B, NH, T, T)
  const float* x = qkv.data<float>();  // (B, T, 3C)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < NH; h++) {
      const float* q = x + b * T * 3 * C + h * hs;  // (T, hs), row stride 3C
      const float* k = q + C;                       // (T, hs), row stride 3C
      const float* v = q + 2 * C;                   // (T, hs), row stride 3C
      float* a_bh = a + (b * NH + h) * T * T;       // (T, T)
      float* o_bh = o + b * T * C + h * hs;         // (T, hs), row stride C
      // scores = q @ k^T / sqrt(hs); the part above the diagonal is overwritten below.
      RETURN_IF_ERROR(Gemm(false, true, T, T, hs, scale, q, 3 * C, k, 3 * C, 0.0f, a_bh, T));
      for (int64_t t = 0; t < T; t++) {
        float* row = a_bh + t * T;
        const int64_t len = t + 1;  // position t attends to 0..t
        const float inv_sum = 1.0f / ExpShiftedOf(row, row, MaxOf(row, len), len);
        for (int64_t t2 = 0; t2 < len; t2++) row[t2] *= inv_sum;
        for (int64_t t2 = len; t2 < T; t2++) row[t2] = 0.0f;
      }
      // out = att @ v: the zeros above the diagonal keep it causal.
      RETURN_IF_ERROR(Gemm(false, false, T, hs, T, 1.0f, a_bh, T, v, 3 * C, 0.0f, o_bh, C));
    }
  }
  return absl::OkStatus();
}

absl::Status AttentionBackward(Stream& s, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                               const Tensor& att, int num_heads) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  const int64_t NH = num_heads, hs = C / NH;
  if (B == 0 || T == 0 || C == 0) return absl::OkStatus();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // One (T, T) scratch for d(att), turned in place into d(scores), reused by every head.
  ASSIGN_OR_RETURN(Tensor scratch, Tensor::Empty({T, T}, DType::kF32, Device::Cpu()));
  float* ds = scratch.data<float>();    // (T, T)
  float* dx = dqkv.data<float>();       // (B, T, 3C)
  const float* d = dout.data<float>();  // (B, T, C)
  const float* x = qkv.data<float>();   // (B, T, 3C)
  const float* a = att.data<float>();   // (B, NH, T, T)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < NH; h++) {
      const float* q = x + b * T * 3 * C + h * hs;  // (T, hs), row stride 3C
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dx + b * T * 3 * C + h * hs;  // (T, hs), row stride 3C
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a_bh = a + (b * NH + h) * T * T;  // (T, T)
      const float* d_bh = d + b * T * C + h * hs;    // (T, hs), row stride C
      // datt = dout @ v^T; dv = att^T @ dout
      RETURN_IF_ERROR(Gemm(false, true, T, T, hs, 1.0f, d_bh, C, v, 3 * C, 0.0f, ds, T));
      RETURN_IF_ERROR(Gemm(true, false, T, hs, T, 1.0f, a_bh, T, d_bh, C, 0.0f, dv, 3 * C));
      // Softmax backward over each causal row, times the 1/sqrt(hs) of the scores.
      for (int64_t t = 0; t < T; t++) {
        float* ds_row = ds + t * T;
        const float* a_row = a_bh + t * T;
        const int64_t len = t + 1;
        const float dot = DotOf(ds_row, a_row, len);
        for (int64_t t2 = 0; t2 < len; t2++) ds_row[t2] = a_row[t2] * (ds_row[t2] - dot) * scale;
        for (int64_t t2 = len; t2 < T; t2++) ds_row[t2] = 0.0f;
      }
      // dq = dscores @ k; dk = dscores^T @ q
      RETURN_IF_ERROR(Gemm(false, false, T, hs, T, 1.0f, ds, T, k, 3 * C, 0.0f, dq, 3 * C));
      RETURN_IF_ERROR(Gemm(true, false, T, hs, T, 1.0f, ds, T, q, 3 * C, 0.0f, dk, 3 * C));
    }
  }
  return absl::OkStatus();
}

// ---- embedding and loss ---------------------------------------------------------------------

namespace {

// Token ids come from data files, so they are checked before anything is written.
absl::Status CheckTokenIds(const char* op, const Tensor& tokens, int64_t vocab,
                           const Tensor& table) {
  const int64_t T = tokens.dim(1);
  const int32_t* ids = tokens.data<int32_t>();  // (B, T)
  for (int64_t i = 0; i < tokens.numel(); i++) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: token id %d at position (b=%d, t=%d) of tokens %s is outside [0, %d) of %s", op,
          ids[i], i / T, i % T, tokens.ToString(), vocab, table.ToString()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingForward(Stream& s, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                              const Tensor& wpe) {
  const int64_t B = tokens.dim(0), T = tokens.dim(1), V = wte.dim(0), C = wte.dim(1);
  RETURN_IF_ERROR(CheckTokenIds("EmbeddingForward", tokens, V, wte));
  float* o = out.data<float>();                                   // (B, T, C)
  const int32_t* ids = tokens.data<int32_t>();                    // (B, T)
  const float* te = wte.data<float>();                            // (V, C)
  const float* pe = wpe.defined() ? wpe.data<float>() : nullptr;  // (maxT, C) or none
  for (int64_t b = 0; b < B; b++) {
    for (int64_t t = 0; t < T; t++) {
      float* o_bt = o + (b * T + t) * C;
      const float* te_row = te + static_cast<int64_t>(ids[b * T + t]) * C;
      if (pe != nullptr) {
        const float* pe_row = pe + t * C;
        for (int64_t c = 0; c < C; c++) o_bt[c] = te_row[c] + pe_row[c];
      } else {
        for (int64_t c = 0; c < C; c++) o_bt[c] = te_row[c];
      }
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(Stream& s, const Tensor& dwte, const Tensor& dwpe,
                               const Tensor& dout, const Tensor& tokens) {
  const int64_t B = tokens.dim(0), T = tokens.dim(1), V = dwte.dim(0), C = dwte.dim(1);
  RETURN_IF_ERROR(CheckTokenIds("EmbeddingBackward", tokens, V, dwte));
  float* dte = dwte.data<float>();                             // (V, C)
  float* dpe = dwpe.defined() ? dwpe.data<float>() : nullptr;  // (maxT, C) or none
  const float* d = dout.data<float>();                         // (B, T, C)
  const int32_t* ids = tokens.data<int32_t>();                 // (B, T)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t t = 0; t < T; t++) {
      const float* d_bt = d + (b * T + t) * C;
      float* dte_row = dte + static_cast<int64_t>(ids[b * T + t]) * C;
      for (int64_t c = 0; c < C; c++) dte_row[c] += d_bt[c];
      if (dpe != nullptr) {
        float* dpe_row = dpe + t * C;
        for (int64_t c = 0; c < C; c++) dpe_row[c] += d_bt[c];
      }
    }
  }
  return absl::OkStatus();
}

namespace {
constexpr int64_t kExpChunk = 256;  // floats of exp(x - max) summed at a time, on the stack
}  // namespace

absl::Status SoftmaxCrossEntropy(Stream& s, const Tensor& losses, const Tensor& dlogits,
                                 const Tensor& logits, const Tensor& targets, float dloss_scale) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  const int32_t* tg = targets.data<int32_t>();  // (N)
  for (int64_t i = 0; i < N; i++) {
    if (tg[i] != -1 && (tg[i] < 0 || tg[i] >= V)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "SoftmaxCrossEntropy: target %d of row %d (targets %s) is outside [0, %d) of "
          "logits %s and is not -1 (ignored)",
          tg[i], i, targets.ToString(), V, logits.ToString()));
    }
  }
  float* loss = losses.data<float>();                               // (N)
  float* dl = dlogits.defined() ? dlogits.data<float>() : nullptr;  // (N, V) or none
  const float* x = logits.data<float>();                            // (N, V)
  for (int64_t i = 0; i < N; i++) {
    const float* x_row = x + i * V;
    const int32_t target = tg[i];
    if (target < 0) {
      loss[i] = 0.0f;
      if (dl != nullptr) std::memset(dl + i * V, 0, V * sizeof(float));
      continue;
    }
    const float max = MaxOf(x_row, V);
    const float target_logit = x_row[target];  // read first: dlogits may be logits itself
    // sum of exp(x - max), added up in the same order with or without dlogits, so a loss
    // does not depend on whether its gradient was asked for.
    float sum = 0.0f;
    if (dl != nullptr) {
      // dlogits doubles as the buffer of exp(x - max), so each logit is exponentiated once.
      float* dl_row = dl + i * V;
      for (int64_t j = 0; j < V; j++) dl_row[j] = ExpNonPositive(x_row[j] - max);
      for (int64_t j = 0; j < V; j += kExpChunk)
        sum += SumOf(dl_row + j, std::min(kExpChunk, V - j));
      const float p_scale = dloss_scale / sum;  // turns exp(x - max) into softmax * scale
      for (int64_t j = 0; j < V; j++) dl_row[j] *= p_scale;
      dl_row[target] -= dloss_scale;
    } else {
      float exps[kExpChunk];
      for (int64_t j = 0; j < V; j += kExpChunk) {
        const int64_t len = std::min(kExpChunk, V - j);
        sum += ExpShiftedOf(exps, x_row + j, max, len);
      }
    }
    // -log softmax[target] = log(sum exp(x - max)) - (x[target] - max)
    loss[i] = std::log(sum) - (target_logit - max);
  }
  return absl::OkStatus();
}

// ---- reductions -----------------------------------------------------------------------------
// In double: these feed losses and global gradient norms over millions of elements.

absl::Status Sum(Stream& s, const Tensor& out, const Tensor& x) {
  const float* xs = x.data<float>();
  const int64_t count = x.numel();
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (int l = 0; l < kLanes; l++) acc[l] += xs[i + l];
  }
  double sum = 0.0;
  for (int l = 0; l < kLanes; l++) sum += acc[l];
  for (; i < count; i++) sum += xs[i];
  out.data<float>()[0] = static_cast<float>(sum);
  return absl::OkStatus();
}

absl::Status SumSquaresAccumulate(Stream& s, const Tensor& out, const Tensor& x) {
  const float* xs = x.data<float>();
  const int64_t count = x.numel();
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (int l = 0; l < kLanes; l++) acc[l] += static_cast<double>(xs[i + l]) * xs[i + l];
  }
  double sum = 0.0;
  for (int l = 0; l < kLanes; l++) sum += acc[l];
  for (; i < count; i++) sum += static_cast<double>(xs[i]) * xs[i];
  // A sum beyond f32's range becomes inf here, which is what overflow detection wants.
  float* o = out.data<float>();
  o[0] = static_cast<float>(o[0] + sum);
  return absl::OkStatus();
}

// ---- optimizers over flat f32 buffers -------------------------------------------------------

namespace {

// Updates run in chunks small enough to stay in L1, so that the low-precision copy of a chunk
// is written while its new params are still in cache: one pass over memory.
constexpr int64_t kChunk = 2048;

void WriteLowCopy(const Tensor& params_low, const float* p, int64_t begin, int64_t end) {
  uint16_t* low = params_low.data<uint16_t>();
  if (params_low.dtype() == DType::kBF16) {
    for (int64_t i = begin; i < end; i++) low[i] = FloatToBf16(p[i]);
  } else {
    for (int64_t i = begin; i < end; i++) low[i] = FloatToHalf(p[i]);
  }
}

}  // namespace

absl::Status AdamWUpdate(Stream& s, const Tensor& params, const Tensor& grads, const Tensor& m,
                         const Tensor& v, const AdamWConfig& c, const Tensor& params_low) {
  float* p = params.data<float>();
  const float* g = grads.data<float>();
  float* ms = m.data<float>();
  float* vs = v.data<float>();
  const int64_t count = params.numel();
  const float b1 = c.beta1, b2 = c.beta2;
  const float bias_correction1 = 1.0f - std::pow(b1, static_cast<float>(c.step));
  const float bias_correction2 = 1.0f - std::pow(b2, static_cast<float>(c.step));
  const float lr = c.lr, eps = c.eps, decay = c.lr * c.weight_decay, gs = c.grad_scale;
  // sqrt of the chunk's v_hat: sqrtf may set errno, so the compiler keeps it scalar (a call
  // guard per element); alone in its loop, it leaves the arithmetic around it vectorized.
  float root[kChunk];
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t len = std::min(kChunk, count - begin);
    float* pc = p + begin;
    const float* gc = g + begin;
    float* mc = ms + begin;
    float* vc = vs + begin;
    for (int64_t i = 0; i < len; i++) {
      const float grad = gc[i] * gs;
      mc[i] = b1 * mc[i] + (1.0f - b1) * grad;
      vc[i] = b2 * vc[i] + (1.0f - b2) * grad * grad;
      root[i] = vc[i] / bias_correction2;
    }
    for (int64_t i = 0; i < len; i++) root[i] = std::sqrt(root[i]);
    for (int64_t i = 0; i < len; i++) {
      const float m_hat = mc[i] / bias_correction1;
      // Decoupled weight decay: it shrinks the parameter, it is not part of the gradient.
      pc[i] -= lr * (m_hat / (root[i] + eps)) + decay * pc[i];
    }
    if (params_low.defined()) WriteLowCopy(params_low, p, begin, begin + len);
  }
  return absl::OkStatus();
}

absl::Status SgdMomentumUpdate(Stream& s, const Tensor& params, const Tensor& grads,
                               const Tensor& momentum_buf, const SgdConfig& c,
                               const Tensor& params_low) {
  float* p = params.data<float>();
  const float* g = grads.data<float>();
  float* buf = momentum_buf.data<float>();
  const int64_t count = params.numel();
  const float lr = c.lr, mu = c.momentum, wd = c.weight_decay, gs = c.grad_scale;
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t end = begin + kChunk < count ? begin + kChunk : count;
    for (int64_t i = begin; i < end; i++) {
      // L2 weight decay as PyTorch's SGD: part of the gradient, so momentum carries it.
      const float grad = g[i] * gs + wd * p[i];
      buf[i] = mu * buf[i] + grad;
      p[i] -= lr * buf[i];
    }
    if (params_low.defined()) WriteLowCopy(params_low, p, begin, end);
  }
  return absl::OkStatus();
}

}  // namespace cpu
}  // namespace ops
}  // namespace tandem
