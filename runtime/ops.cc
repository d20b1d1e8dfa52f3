// The entry points of ops.h: each checks every argument against the contract written there
// (defined tensors, shapes, dtypes, one device that is also the stream's; errors name the op
// and the tensors), then runs the CPU or the CUDA backend, chosen by the stream's device.
#include "runtime/ops.h"

#include "runtime/profiler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <tuple>

#include "absl/strings/str_format.h"
#include "runtime/ops_backend.h"
#include "runtime/status.h"

namespace tandem {
namespace ops {
namespace {

// A named argument; `t` may be undefined where the contract allows it.
struct Arg {
  const char* name;
  const Tensor& t;
};
using Args = std::initializer_list<Arg>;

template <typename... A>
absl::Status Invalid(const absl::FormatSpec<A...>& format, const A&... args) {
  return absl::InvalidArgumentError(absl::StrFormat(format, args...));
}

absl::Status CheckDefined(const char* op, Args args) {
  for (const Arg& a : args) {
    if (!a.t.defined()) return Invalid("%s: %s is undefined", op, a.name);
  }
  return absl::OkStatus();
}

// Every defined tensor on one device, and that device the stream's: a backend never sees
// memory it cannot reach.
absl::Status CheckDevices(const char* op, const Stream& s, Args args, Args more = {}) {
  const Arg* first = nullptr;
  for (Args list : {args, more}) {
    for (const Arg& a : list) {
      if (!a.t.defined()) continue;
      if (first == nullptr) {
        first = &a;
        continue;
      }
      RETURN_IF_ERROR(CheckSameDevice(op, first->t, a.t));
    }
  }
  if (first != nullptr && first->t.device() != s.device()) {
    return Invalid("%s: %s is %s but the stream runs on %s", op, first->name, first->t.ToString(),
                   s.device().ToString());
  }
  return absl::OkStatus();
}

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// Activations and parameters: one float dtype among the defined `args`, and on the CPU that
// dtype is f32 (16-bit tensors exist there only for Cast and the optimizers' low copies).
absl::Status CheckFloats(const char* op, Device device, Args args) {
  const Arg* first = nullptr;
  for (const Arg& a : args) {
    if (!a.t.defined()) continue;
    if (!IsFloat(a.t.dtype())) {
      return Invalid("%s: %s is %s; expected f32, bf16 or f16", op, a.name, a.t.ToString());
    }
    if (device.is_cpu() && a.t.dtype() != DType::kF32) {
      return Invalid("%s: %s is %s: the CPU computes in f32; cast first", op, a.name,
                     a.t.ToString());
    }
    if (first == nullptr) {
      first = &a;
    } else if (a.t.dtype() != first->t.dtype()) {
      return Invalid("%s: %s is %s but %s is %s; they must share one dtype", op, a.name,
                     a.t.ToString(), first->name, first->t.ToString());
    }
  }
  return absl::OkStatus();
}

// Gradients of parameters that accumulate across micro-batches: f32, or on CUDA also the
// activations' dtype `act` (the CUDA kernels accumulate either).
absl::Status CheckParamGrads(const char* op, Device device, DType act, Args args) {
  for (const Arg& a : args) {
    if (!a.t.defined() || a.t.dtype() == DType::kF32) continue;
    if (device.is_cpu() || a.t.dtype() != act) {
      return Invalid("%s: %s is %s; expected f32%s", op, a.name, a.t.ToString(),
                     device.is_cpu() ? std::string() : absl::StrFormat(" or %s", DTypeName(act)));
    }
  }
  return absl::OkStatus();
}

// Statistics, losses, parameter gradients and optimizer state are f32 on every device.
absl::Status CheckF32(const char* op, Args args) {
  for (const Arg& a : args) {
    if (!a.t.defined()) continue;
    absl::Status st = CheckDType(op, a.name, a.t, DType::kF32);
    if (!st.ok()) return Invalid("%s (%s)", st.message(), a.t.ToString());
  }
  return absl::OkStatus();
}

absl::Status CheckI32(const char* op, const char* name, const Tensor& t) {
  absl::Status st = CheckDType(op, name, t, DType::kI32);
  if (!st.ok()) return Invalid("%s (%s)", st.message(), t.ToString());
  return absl::OkStatus();
}

// `dims` is how the contract writes the shape, e.g. "(N, C)".
absl::Status CheckRank(const char* op, const char* name, const Tensor& t, int rank,
                       const char* dims) {
  if (t.rank() != rank) {
    return Invalid("%s: %s must be %s (%d-D), got %s", op, name, dims, rank, t.ToString());
  }
  return absl::OkStatus();
}

// CheckShape that builds no Shape unless the check fails: ops are called per layer and
// micro-batch, so the checks stay cheap next to small kernels.
absl::Status CheckDims(const char* op, const char* name, const Tensor& t,
                       std::initializer_list<int64_t> want) {
  if (t.defined() && t.rank() == static_cast<int>(want.size()) &&
      std::equal(want.begin(), want.end(), t.shape().dims().begin())) {
    return absl::OkStatus();
  }
  return CheckShape(op, name, t, Shape(want));
}

absl::Status CheckOptionalDims(const char* op, const char* name, const Tensor& t,
                               std::initializer_list<int64_t> want) {
  return t.defined() ? CheckDims(op, name, t, want) : absl::OkStatus();
}

absl::Status CheckOptionalShape(const char* op, const char* name, const Tensor& t,
                                const Shape& want) {
  return t.defined() ? CheckShape(op, name, t, want) : absl::OkStatus();
}

bool Overlap(const Tensor& x, const Tensor& y) {
  if (!x.defined() || !y.defined() || x.bytes() == 0 || y.bytes() == 0) return false;
  const uintptr_t x0 = reinterpret_cast<uintptr_t>(x.raw());
  const uintptr_t y0 = reinterpret_cast<uintptr_t>(y.raw());
  return x0 < y0 + y.bytes() && y0 < x0 + x.bytes();
}

// Outputs of a matmul are written while its inputs are still read, so no memory may be
// shared between them (elementwise ops, in contrast, may work in place).
absl::Status CheckNoOverlap(const char* op, const Arg& output, Args inputs) {
  for (const Arg& a : inputs) {
    if (Overlap(output.t, a.t)) {
      return Invalid("%s: %s %s shares memory with %s %s", op, output.name, output.t.ToString(),
                     a.name, a.t.ToString());
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSameNumel(const char* op, const Arg& want, Args args) {
  for (const Arg& a : args) {
    if (a.t.defined() && a.t.numel() != want.t.numel()) {
      return Invalid("%s: %s %s and %s %s must have as many elements", op, want.name,
                     want.t.ToString(), a.name, a.t.ToString());
    }
  }
  return absl::OkStatus();
}

// The checks every op starts with: required tensors defined, and all tensors, optional ones
// included, on the stream's device.
absl::Status CheckCommon(const char* op, const Stream& s, Args required, Args optional = {}) {
  RETURN_IF_ERROR(CheckDefined(op, required));
  return CheckDevices(op, s, required, optional);
}

#if !TANDEM_CUDA
absl::Status NoCudaBackend(const char* op, Device d) {
  return absl::UnavailableError(absl::StrFormat(
      "%s: the tensors are on %s but this build has no CUDA backend", op, d.ToString()));
}
#endif

// ---- what each op costs, for the profiler's rates (OpCost) ----------------------------------

// Bytes of the defined tensors, each read or written once.
double Bytes(std::initializer_list<std::reference_wrapper<const Tensor>> tensors) {
  double bytes = 0;
  for (const Tensor& t : tensors) bytes += t.defined() ? static_cast<double>(t.bytes()) : 0;
  return bytes;
}

// `rows` rows of the table (rows, C) that a lookup touches.
double RowBytes(const Tensor& table, int64_t rows) {
  return table.defined() ? static_cast<double>(rows) * table.dim(1) * DTypeSize(table.dtype()) : 0;
}

OpCost Cost(double flops, double bytes) { return OpCost{flops, bytes}; }
OpCost Moves(double bytes) { return OpCost{0, bytes}; }

// inp (N, C) @ weight (OC, C)^T.
double LinearFlops(const Tensor& inp, const Tensor& weight) {
  return 2.0 * inp.dim(0) * inp.dim(1) * weight.dim(0);
}

// Causal attention forward over qkv (B, T, 3C): q k^T and p v over the unmasked half,
// 2 T^2 C per sample. The backward's four products are twice that (a recomputation, as
// FlashAttention's, is not counted).
double AttentionFlops(const Tensor& qkv) {
  return 2.0 * qkv.dim(0) * qkv.dim(1) * qkv.dim(1) * (qkv.dim(2) / 3);
}

}  // namespace

namespace {

// An op's argument as queued work keeps it: tensors without keeping their memory (the
// stream-aware allocator holds it until the work has run, as for a CUDA kernel's pointers),
// everything else by value.
template <typename T>
T Queued(const T& v) {
  return v;
}
Tensor Queued(const Tensor& t) { return t.Unowned(); }

// Runs the CPU backend's `fn` in `s`'s order: on an immediate stream now, else on the
// stream's thread with its arguments captured.
template <typename Fn, typename... A>
absl::Status LaunchCpu(Stream& s, Fn fn, const A&... args) {
  if (!s.async()) return s.Launch([&] { return fn(s, args...); });
  return s.Launch([fn, &s, queued = std::make_tuple(Queued(args)...)]() {
    return std::apply([&](const auto&... a) { return fn(s, a...); }, queued);
  });
}

}  // namespace

// Runs backend::op on the stream's device; every argument has been checked. `cost` (an OpCost)
// is evaluated only when the profiler is on.
#if TANDEM_CUDA
#define TANDEM_CUDA_OP(op, s, ...) cuda::op(s, __VA_ARGS__)
#else
#define TANDEM_CUDA_OP(op, s, ...) NoCudaBackend(#op, (s).device())
#endif
#define TANDEM_OPS_DISPATCH(op, cost, s, ...)                                \
  do {                                                                       \
    OpScope op_scope(#op, s, Profiler::enabled() ? (cost) : OpCost());       \
    if ((s).device().is_cpu()) return LaunchCpu(s, TANDEM_CPU_OP(op), __VA_ARGS__); \
    return TANDEM_CUDA_OP(op, s, __VA_ARGS__);                               \
  } while (0)

// ---- matmul -------------------------------------------------------------------------------

absl::Status Matmul(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b,
                    bool transpose_a, bool transpose_b, float alpha, float beta) {
  constexpr const char* kOp = "Matmul";
  const Args all = {{"out", out}, {"a", a}, {"b", b}};
  RETURN_IF_ERROR(CheckCommon(kOp, s, all));
  RETURN_IF_ERROR(CheckFloats(kOp, s.device(), all));
  RETURN_IF_ERROR(CheckRank(kOp, "a", a, 2, "a matrix"));
  RETURN_IF_ERROR(CheckRank(kOp, "b", b, 2, "a matrix"));
  const int64_t m = transpose_a ? a.dim(1) : a.dim(0);
  const int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  const int64_t kb = transpose_b ? b.dim(1) : b.dim(0);
  const int64_t n = transpose_b ? b.dim(0) : b.dim(1);
  if (k != kb) {
    return Invalid(
        "%s: inner dimensions differ: op(a) is (%d, %d) from a %s%s, op(b) is (%d, %d) from "
        "b %s%s",
        kOp, m, k, a.ToString(), transpose_a ? " transposed" : "", kb, n, b.ToString(),
        transpose_b ? " transposed" : "");
  }
  RETURN_IF_ERROR(CheckDims(kOp, "out", out, {m, n}));
  RETURN_IF_ERROR(CheckNoOverlap(kOp, {"out", out}, {{"a", a}, {"b", b}}));
  TANDEM_OPS_DISPATCH(Matmul,
                      Cost(2.0 * m * n * k, Bytes({a, b, out}) + (beta != 0 ? Bytes({out}) : 0)), s,
                      out, a, b, transpose_a, transpose_b, alpha, beta);
}

int64_t MatmulWorkspaceBytes(Device device) {
  if (device.is_cpu()) return TANDEM_CPU_OP(MatmulWorkspaceBytes)();
#if TANDEM_CUDA
  return cuda::MatmulWorkspaceBytes();
#else
  return 0;   // no CUDA device runs in this build
#endif
}

namespace {

// inp (N, C) and weight (OC, C) are matrices that agree on C.
absl::Status CheckInnerDim(const char* op, const Tensor& inp, const Tensor& weight) {
  RETURN_IF_ERROR(CheckRank(op, "inp", inp, 2, "(N, C)"));
  RETURN_IF_ERROR(CheckRank(op, "weight", weight, 2, "(OC, C)"));
  if (weight.dim(1) != inp.dim(1)) {
    return Invalid("%s: inp %s and weight %s disagree on C (%d vs %d)", op, inp.ToString(),
                   weight.ToString(), inp.dim(1), weight.dim(1));
  }
  return absl::OkStatus();
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC), as LinearForward and
// LinearGeluForward take it.
absl::Status CheckLinear(const char* op, const Stream& s, const Tensor& out, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias) {
  RETURN_IF_ERROR(
      CheckCommon(op, s, {{"out", out}, {"inp", inp}, {"weight", weight}}, {{"bias", bias}}));
  RETURN_IF_ERROR(CheckFloats(op, s.device(),
                              {{"out", out}, {"inp", inp}, {"weight", weight}, {"bias", bias}}));
  RETURN_IF_ERROR(CheckInnerDim(op, inp, weight));
  const int64_t n = inp.dim(0), oc = weight.dim(0);
  RETURN_IF_ERROR(CheckOptionalDims(op, "bias", bias, {oc}));
  RETURN_IF_ERROR(CheckDims(op, "out", out, {n, oc}));
  return CheckNoOverlap(op, {"out", out}, {{"inp", inp}, {"weight", weight}, {"bias", bias}});
}

}  // namespace

absl::Status LinearForward(Stream& s, const Tensor& out, const Tensor& inp, const Tensor& weight,
                           const Tensor& bias) {
  RETURN_IF_ERROR(CheckLinear("LinearForward", s, out, inp, weight, bias));
  TANDEM_OPS_DISPATCH(LinearForward,
                      Cost(LinearFlops(inp, weight), Bytes({out, inp, weight, bias})), s, out, inp,
                      weight, bias);
}

absl::Status LinearGeluForward(Stream& s, const Tensor& out, const Tensor& pre, const Tensor& inp,
                               const Tensor& weight, const Tensor& bias) {
  constexpr const char* kOp = "LinearGeluForward";
  RETURN_IF_ERROR(CheckDefined(kOp, {{"pre", pre}, {"bias", bias}}));
  RETURN_IF_ERROR(CheckLinear(kOp, s, pre, inp, weight, bias));
  RETURN_IF_ERROR(CheckCommon(kOp, s, {{"pre", pre}, {"out", out}}));
  RETURN_IF_ERROR(CheckFloats(kOp, s.device(), {{"pre", pre}, {"out", out}}));
  RETURN_IF_ERROR(CheckShape(kOp, "out", out, pre.shape()));
  // pre is kept for backward, so out may not overwrite it, nor the inputs.
  RETURN_IF_ERROR(CheckNoOverlap(kOp, {"out", out},
                                 {{"pre", pre}, {"inp", inp}, {"weight", weight}, {"bias", bias}}));
  TANDEM_OPS_DISPATCH(LinearGeluForward,
                      Cost(LinearFlops(inp, weight), Bytes({out, pre, inp, weight, bias})), s, out,
                      pre, inp, weight, bias);
}

absl::Status LinearBackward(Stream& s, const Tensor& dinp, const Tensor& dweight,
                            const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                            const Tensor& weight) {
  constexpr const char* kOp = "LinearBackward";
  RETURN_IF_ERROR(
      CheckCommon(kOp, s, {{"dout", dout}, {"inp", inp}, {"weight", weight}},
                  {{"dinp", dinp}, {"dweight", dweight}, {"dbias", dbias}}));
  RETURN_IF_ERROR(CheckFloats(kOp, s.device(),
                              {{"dout", dout}, {"inp", inp}, {"weight", weight}, {"dinp", dinp}}));
  RETURN_IF_ERROR(
      CheckParamGrads(kOp, s.device(), dout.dtype(), {{"dweight", dweight}, {"dbias", dbias}}));
  RETURN_IF_ERROR(CheckRank(kOp, "dout", dout, 2, "(N, OC)"));
  RETURN_IF_ERROR(CheckInnerDim(kOp, inp, weight));
  const int64_t n = inp.dim(0), c = inp.dim(1), oc = weight.dim(0);
  RETURN_IF_ERROR(CheckDims(kOp, "dout", dout, {n, oc}));
  RETURN_IF_ERROR(CheckOptionalDims(kOp, "dinp", dinp, {n, c}));
  RETURN_IF_ERROR(CheckOptionalDims(kOp, "dweight", dweight, {oc, c}));
  RETURN_IF_ERROR(CheckOptionalDims(kOp, "dbias", dbias, {oc}));
  const Args inputs = {{"dout", dout}, {"inp", inp}, {"weight", weight}};
  RETURN_IF_ERROR(CheckNoOverlap(kOp, {"dinp", dinp}, inputs));
  RETURN_IF_ERROR(CheckNoOverlap(kOp, {"dweight", dweight}, inputs));
  RETURN_IF_ERROR(CheckNoOverlap(kOp, {"dbias", dbias}, inputs));
  TANDEM_OPS_DISPATCH(LinearBackward,
                      Cost(LinearFlops(inp, weight) * (dinp.defined() ? 2 : 1),
                           Bytes({dout, inp}) + (dinp.defined() ? Bytes({dinp, weight}) : 0) +
                               2 * Bytes({dweight, dbias})),
                      s, dinp, dweight, dbias, dout, inp, weight);
}

// ---- elementwise ----------------------------------------------------------------------------

namespace {

// Tensors of one shape (the first's) and one float dtype: the elementwise ops.
absl::Status CheckElementwise(const char* op, const Stream& s, Args args) {
  RETURN_IF_ERROR(CheckCommon(op, s, args));
  RETURN_IF_ERROR(CheckFloats(op, s.device(), args));
  const Arg& first = *args.begin();
  for (const Arg& a : args) RETURN_IF_ERROR(CheckShape(op, a.name, a.t, first.t.shape()));
  return absl::OkStatus();
}

// x (N, C) and a row vector bias (C), as BiasAdd and BiasGeluForward take them.
absl::Status CheckRowsAndBias(const char* op, const Tensor& x, const Tensor& bias) {
  RETURN_IF_ERROR(CheckRank(op, "x", x, 2, "(N, C)"));
  return CheckDims(op, "bias", bias, {x.dim(1)});
}

}  // namespace

absl::Status GeluForward(Stream& s, const Tensor& out, const Tensor& inp) {
  RETURN_IF_ERROR(CheckElementwise("GeluForward", s, {{"inp", inp}, {"out", out}}));
  TANDEM_OPS_DISPATCH(GeluForward, Moves(Bytes({out, inp})), s, out, inp);
}

absl::Status GeluBackward(Stream& s, const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  RETURN_IF_ERROR(
      CheckElementwise("GeluBackward", s, {{"inp", inp}, {"dout", dout}, {"dinp", dinp}}));
  TANDEM_OPS_DISPATCH(GeluBackward, Moves(Bytes({dinp, inp, dout})), s, dinp, inp, dout);
}

absl::Status BiasGeluForward(Stream& s, const Tensor& out, const Tensor& pre, const Tensor& x,
                             const Tensor& bias) {
  constexpr const char* kOp = "BiasGeluForward";
  RETURN_IF_ERROR(CheckCommon(kOp, s, {{"out", out}, {"x", x}, {"bias", bias}}, {{"pre", pre}}));
  RETURN_IF_ERROR(
      CheckFloats(kOp, s.device(), {{"out", out}, {"x", x}, {"bias", bias}, {"pre", pre}}));
  RETURN_IF_ERROR(CheckRowsAndBias(kOp, x, bias));
  RETURN_IF_ERROR(CheckShape(kOp, "out", out, x.shape()));
  RETURN_IF_ERROR(CheckOptionalShape(kOp, "pre", pre, x.shape()));
  TANDEM_OPS_DISPATCH(BiasGeluForward, Moves(Bytes({out, pre, x, bias})), s, out, pre, x, bias);
}

absl::Status ReluForward(Stream& s, const Tensor& out, const Tensor& inp) {
  RETURN_IF_ERROR(CheckElementwise("ReluForward", s, {{"inp", inp}, {"out", out}}));
  TANDEM_OPS_DISPATCH(ReluForward, Moves(Bytes({out, inp})), s, out, inp);
}

absl::Status ReluBackward(Stream& s, const Tensor& dinp, const Tensor& out, const Tensor& dout) {
  RETURN_IF_ERROR(
      CheckElementwise("ReluBackward", s, {{"out", out}, {"dout", dout}, {"dinp", dinp}}));
  TANDEM_OPS_DISPATCH(ReluBackward, Moves(Bytes({dinp, out, dout})), s, dinp, out, dout);
}

absl::Status BiasAdd(Stream& s, const Tensor& x, const Tensor& bias) {
  constexpr const char* kOp = "BiasAdd";
  RETURN_IF_ERROR(CheckCommon(kOp, s, {{"x", x}, {"bias", bias}}));
  RETURN_IF_ERROR(CheckFloats(kOp, s.device(), {{"x", x}, {"bias", bias}}));
  RETURN_IF_ERROR(CheckRowsAndBias(kOp, x, bias));
  TANDEM_OPS_DISPATCH(BiasAdd, Moves(2 * Bytes({x}) + Bytes({bias})), s, x, bias);
}

absl::Status Add(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b) {
  RETURN_IF_ERROR(CheckElementwise("Add", s, {{"a", a}, {"b", b}, {"out", out}}));
  TANDEM_OPS_DISPATCH(Add, Moves(Bytes({out, a, b})), s, out, a, b);
}

absl::Status Axpy(Stream& s, const Tensor& y, float alpha, const Tensor& x) {
  RETURN_IF_ERROR(CheckElementwise("Axpy", s, {{"x", x}, {"y", y}}));
  TANDEM_OPS_DISPATCH(Axpy, Moves(Bytes({x}) + 2 * Bytes({y})), s, y, alpha, x);
}

absl::Status Scale(Stream& s, const Tensor& x, float alpha) {
  RETURN_IF_ERROR(CheckElementwise("Scale", s, {{"x", x}}));
  TANDEM_OPS_DISPATCH(Scale, Moves(2 * Bytes({x})), s, x, alpha);
}

absl::Status Cast(Stream& s, const Tensor& out, const Tensor& in) {
  constexpr const char* kOp = "Cast";
  RETURN_IF_ERROR(CheckCommon(kOp, s, {{"out", out}, {"in", in}}));
  for (const Arg& a : Args{{"in", in}, {"out", out}}) {
    if (!IsFloat(a.t.dtype())) {
      return Invalid("%s: %s is %s; Cast converts between f32, bf16 and f16", kOp, a.name,
                     a.t.ToString());
    }
  }
  RETURN_IF_ERROR(CheckShape(kOp, "out", out, in.shape()));
  TANDEM_OPS_DISPATCH(Cast, Moves(Bytes({out, in})), s, out, in);
}

absl::Status Fill(Stream& s, const Tensor& x, float value) {
  RETURN_IF_ERROR(CheckElementwise("Fill", s, {{"x", x}}));
  TANDEM_OPS_DISPATCH(Fill, Moves(Bytes({x})), s, x, value);
}

// ---- normalization, softmax -----------------------------------------------------------------

namespace {

// inp (N, C), weight (C), bias (C), out (N, C) one float dtype; mean (N), rstd (N) f32.
absl::Status CheckLayerNorm(const char* op, const Stream& s, const Tensor& out, const Tensor& mean,
                            const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                            const Tensor& bias) {
  const Args floats = {{"inp", inp}, {"weight", weight}, {"bias", bias}, {"out", out}};
  RETURN_IF_ERROR(CheckDefined(op, {{"mean", mean}, {"rstd", rstd}}));
  RETURN_IF_ERROR(CheckCommon(op, s, floats, {{"mean", mean}, {"rstd", rstd}}));
  RETURN_IF_ERROR(CheckFloats(op, s.device(), floats));
  RETURN_IF_ERROR(CheckF32(op, {{"mean", mean}, {"rstd", rstd}}));
  RETURN_IF_ERROR(CheckRank(op, "inp", inp, 2, "(N, C)"));
  const int64_t n = inp.dim(0), c = inp.dim(1);
  RETURN_IF_ERROR(CheckDims(op, "weight", weight, {c}));
  RETURN_IF_ERROR(CheckDims(op, "bias", bias, {c}));
  RETURN_IF_ERROR(CheckDims(op, "out", out, {n, c}));
  RETURN_IF_ERROR(CheckDims(op, "mean", mean, {n}));
  return CheckDims(op, "rstd", rstd, {n});
}

}  // namespace

absl::Status LayerNormForward(Stream& s, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                              const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  RETURN_IF_ERROR(CheckLayerNorm("LayerNormForward", s, out, mean, rstd, inp, weight, bias));
  TANDEM_OPS_DISPATCH(LayerNormForward, Moves(Bytes({out, mean, rstd, inp, weight, bias})), s, out,
                      mean, rstd, inp, weight, bias);
}

absl::Status LayerNormBackward(Stream& s, const Tensor& dinp, const Tensor& dweight,
                               const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  constexpr const char* kOp = "LayerNormBackward";
  // The outputs may each be undefined (a backward that needs only some of them).
  RETURN_IF_ERROR(CheckCommon(
      kOp, s, {{"inp", inp}, {"weight", weight}, {"dout", dout}, {"mean", mean}, {"rstd", rstd}},
      {{"dinp", dinp}, {"dweight", dweight}, {"dbias", dbias}}));
  RETURN_IF_ERROR(CheckFloats(kOp, s.device(),
                              {{"inp", inp}, {"weight", weight}, {"dout", dout}, {"dinp", dinp}}));
  RETURN_IF_ERROR(CheckF32(kOp, {{"mean", mean}, {"rstd", rstd}}));
  RETURN_IF_ERROR(
      CheckParamGrads(kOp, s.device(), inp.dtype(), {{"dweight", dweight}, {"dbias", dbias}}));
  RETURN_IF_ERROR(CheckRank(kOp, "inp", inp, 2, "(N, C)"));
  const int64_t n = inp.dim(0), c = inp.dim(1);
  RETURN_IF_ERROR(CheckDims(kOp, "weight", weight, {c}));
  RETURN_IF_ERROR(CheckDims(kOp, "dout", dout, {n, c}));
  RETURN_IF_ERROR(CheckOptionalDims(kOp, "dinp", dinp, {n, c}));
  RETURN_IF_ERROR(CheckOptionalDims(kOp, "dweight", dweight, {c}));
  RETURN_IF_ERROR(CheckOptionalDims(kOp, "dbias", dbias, {c}));
  RETURN_IF_ERROR(CheckDims(kOp, "mean", mean, {n}));
  RETURN_IF_ERROR(CheckDims(kOp, "rstd", rstd, {n}));
  TANDEM_OPS_DISPATCH(
      LayerNormBackward,
      Moves(Bytes({dinp, dout, inp, weight, mean, rstd}) + 2 * Bytes({dweight, dbias})), s, dinp,
      dweight, dbias, dout, inp, weight, mean, rstd);
}

absl::Status ResidualLayerNormForward(Stream& s, const Tensor& residual, const Tensor& out,
                                      const Tensor& mean, const Tensor& rstd, const Tensor& a,
                                      const Tensor& b, const Tensor& weight, const Tensor& bias) {
  constexpr const char* kOp = "ResidualLayerNormForward";
  RETURN_IF_ERROR(CheckCommon(kOp, s, {{"a", a}, {"b", b}, {"residual", residual}},
                              {{"out", out}, {"weight", weight}}));
  RETURN_IF_ERROR(
      CheckFloats(kOp, s.device(), {{"a", a}, {"b", b}, {"residual", residual}, {"out", out}}));
  RETURN_IF_ERROR(CheckLayerNorm(kOp, s, out, mean, rstd, residual, weight, bias));
  RETURN_IF_ERROR(CheckShape(kOp, "a", a, residual.shape()));
  RETURN_IF_ERROR(CheckShape(kOp, "b", b, residual.shape()));
  TANDEM_OPS_DISPATCH(ResidualLayerNormForward,
                      Moves(Bytes({residual, out, mean, rstd, a, b, weight, bias})), s, residual,
                      out, mean, rstd, a, b, weight, bias);
}

absl::Status SoftmaxForward(Stream& s, const Tensor& out, const Tensor& inp) {
  constexpr const char* kOp = "SoftmaxForward";
  RETURN_IF_ERROR(CheckElementwise(kOp, s, {{"inp", inp}, {"out", out}}));
  RETURN_IF_ERROR(CheckRank(kOp, "inp", inp, 2, "(N, C)"));
  TANDEM_OPS_DISPATCH(SoftmaxForward, Moves(Bytes({out, inp})), s, out, inp);
}

absl::Status SoftmaxBackward(Stream& s, const Tensor& dinp, const Tensor& out, const Tensor& dout) {
  constexpr const char* kOp = "SoftmaxBackward";
  RETURN_IF_ERROR(CheckElementwise(kOp, s, {{"out", out}, {"dout", dout}, {"dinp", dinp}}));
  RETURN_IF_ERROR(CheckRank(kOp, "out", out, 2, "(N, C)"));
  TANDEM_OPS_DISPATCH(SoftmaxBackward, Moves(Bytes({dinp, out, dout})), s, dinp, out, dout);
}

// ---- attention ------------------------------------------------------------------------------

namespace {

// The name of what attention keeps for backward: att, the probabilities, or FlashAttention's
// lse.
const char* SavedName(bool probabilities) { return probabilities ? "att" : "lse"; }

// qkv (B, T, 3C) with C divisible by num_heads, and `saved` f32: with `probabilities` att
// (B, NH, T, T), else lse (B, NH, T). Sets b, t, c.
absl::Status CheckAttention(const char* op, const Tensor& qkv, const Tensor& saved, int num_heads,
                            bool probabilities, int64_t* b, int64_t* t, int64_t* c) {
  const char* saved_name = SavedName(probabilities);
  RETURN_IF_ERROR(CheckRank(op, "qkv", qkv, 3, "(B, T, 3C)"));
  if (qkv.dim(2) % 3 != 0) {
    return Invalid("%s: qkv %s: its last dimension must be 3C ([q | k | v])", op, qkv.ToString());
  }
  *b = qkv.dim(0);
  *t = qkv.dim(1);
  *c = qkv.dim(2) / 3;
  if (num_heads < 1 || *c % num_heads != 0) {
    return Invalid("%s: C = %d (qkv %s) is not divisible by num_heads = %d", op, *c, qkv.ToString(),
                   num_heads);
  }
  RETURN_IF_ERROR(CheckF32(op, {{saved_name, saved}}));
  if (probabilities) return CheckDims(op, saved_name, saved, {*b, num_heads, *t, *t});
  return CheckDims(op, saved_name, saved, {*b, num_heads, *t});
}

// The checks both attention forwards share: `saved` is att or lse.
absl::Status CheckAttentionForward(const char* op, const Stream& s, const Tensor& out,
                                   const Tensor& saved, const Tensor& qkv, int num_heads,
                                   bool probabilities) {
  const char* saved_name = SavedName(probabilities);
  RETURN_IF_ERROR(CheckCommon(op, s, {{"out", out}, {saved_name, saved}, {"qkv", qkv}}));
  RETURN_IF_ERROR(CheckFloats(op, s.device(), {{"qkv", qkv}, {"out", out}}));
  int64_t b, t, c;
  RETURN_IF_ERROR(CheckAttention(op, qkv, saved, num_heads, probabilities, &b, &t, &c));
  RETURN_IF_ERROR(CheckDims(op, "out", out, {b, t, c}));
  RETURN_IF_ERROR(CheckNoOverlap(op, {"out", out}, {{"qkv", qkv}, {saved_name, saved}}));
  return CheckNoOverlap(op, {saved_name, saved}, {{"qkv", qkv}});
}

// The checks both attention backwards share; out (B, T, C) only for FlashAttention, which
// needs it.
absl::Status CheckAttentionBackward(const char* op, const Stream& s, const Tensor& dqkv,
                                    const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& saved, int num_heads, bool probabilities) {
  const char* saved_name = SavedName(probabilities);
  if (!probabilities) RETURN_IF_ERROR(CheckDefined(op, {{"out", out}}));
  RETURN_IF_ERROR(CheckCommon(op, s, {{"dqkv", dqkv}, {"dout", dout}, {"qkv", qkv},
                                      {saved_name, saved}}, {{"out", out}}));
  RETURN_IF_ERROR(CheckFloats(
      op, s.device(), {{"qkv", qkv}, {"dout", dout}, {"dqkv", dqkv}, {"out", out}}));
  int64_t b, t, c;
  RETURN_IF_ERROR(CheckAttention(op, qkv, saved, num_heads, probabilities, &b, &t, &c));
  RETURN_IF_ERROR(CheckDims(op, "dout", dout, {b, t, c}));
  RETURN_IF_ERROR(CheckOptionalDims(op, "out", out, {b, t, c}));
  RETURN_IF_ERROR(CheckShape(op, "dqkv", dqkv, qkv.shape()));
  return CheckNoOverlap(
      op, {"dqkv", dqkv}, {{"dout", dout}, {"qkv", qkv}, {"out", out}, {saved_name, saved}});
}

}  // namespace

absl::Status AttentionForward(Stream& s, const Tensor& out, const Tensor& att, const Tensor& qkv,
                              int num_heads) {
  RETURN_IF_ERROR(CheckAttentionForward("AttentionForward", s, out, att, qkv, num_heads, true));
  TANDEM_OPS_DISPATCH(AttentionForward, Cost(AttentionFlops(qkv), Bytes({out, att, qkv})), s, out,
                      att, qkv, num_heads);
}

absl::Status AttentionBackward(Stream& s, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                               const Tensor& att, int num_heads) {
  RETURN_IF_ERROR(CheckAttentionBackward("AttentionBackward", s, dqkv, dout, qkv, Tensor(), att,
                                         num_heads, true));
  TANDEM_OPS_DISPATCH(AttentionBackward,
                      Cost(2 * AttentionFlops(qkv), Bytes({dqkv, dout, qkv, att})), s, dqkv, dout,
                      qkv, att, num_heads);
}

absl::Status FlashAttentionForward(Stream& s, const Tensor& out, const Tensor& lse,
                                   const Tensor& qkv, int num_heads) {
  RETURN_IF_ERROR(
      CheckAttentionForward("FlashAttentionForward", s, out, lse, qkv, num_heads, false));
  TANDEM_OPS_DISPATCH(FlashAttentionForward, Cost(AttentionFlops(qkv), Bytes({out, lse, qkv})), s,
                      out, lse, qkv, num_heads);
}

absl::Status FlashAttentionBackward(Stream& s, const Tensor& dqkv, const Tensor& dout,
                                    const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                    int num_heads) {
  RETURN_IF_ERROR(CheckAttentionBackward("FlashAttentionBackward", s, dqkv, dout, qkv, out, lse,
                                         num_heads, false));
  TANDEM_OPS_DISPATCH(FlashAttentionBackward,
                      Cost(2 * AttentionFlops(qkv), Bytes({dqkv, dout, qkv, out, lse})), s, dqkv,
                      dout, qkv, out, lse, num_heads);
}

absl::Status CachedAttentionForward(Stream& s, const Tensor& out, const Tensor& k_cache,
                                    const Tensor& v_cache, const Tensor& qkv, int64_t pos,
                                    int num_heads) {
  constexpr const char* kOp = "CachedAttentionForward";
  const Args all = {{"out", out}, {"k_cache", k_cache}, {"v_cache", v_cache}, {"qkv", qkv}};
  RETURN_IF_ERROR(CheckCommon(kOp, s, all));
  RETURN_IF_ERROR(CheckFloats(kOp, s.device(), all));
  RETURN_IF_ERROR(CheckRank(kOp, "qkv", qkv, 2, "(1, 3C)"));
  if (qkv.dim(0) != 1 || qkv.dim(1) % 3 != 0) {
    return Invalid("%s: qkv must be (1, 3C) ([q | k | v] of one position), got %s", kOp,
                   qkv.ToString());
  }
  const int64_t C = qkv.dim(1) / 3;
  if (num_heads < 1 || C % num_heads != 0) {
    return Invalid("%s: C = %d (qkv %s) is not divisible by num_heads = %d", kOp, C,
                   qkv.ToString(), num_heads);
  }
  RETURN_IF_ERROR(CheckRank(kOp, "k_cache", k_cache, 3, "(NH, maxT, hs)"));
  const int64_t max_t = k_cache.dim(1);
  RETURN_IF_ERROR(CheckDims(kOp, "k_cache", k_cache, {num_heads, max_t, C / num_heads}));
  RETURN_IF_ERROR(CheckShape(kOp, "v_cache", v_cache, k_cache.shape()));
  RETURN_IF_ERROR(CheckDims(kOp, "out", out, {1, C}));
  if (pos < 0 || pos >= max_t) {
    return Invalid("%s: pos = %d is outside the cache's %d rows (k_cache %s)", kOp, pos, max_t,
                   k_cache.ToString());
  }
  RETURN_IF_ERROR(CheckNoOverlap(kOp, {"out", out},
                                 {{"qkv", qkv}, {"k_cache", k_cache}, {"v_cache", v_cache}}));
  RETURN_IF_ERROR(CheckNoOverlap(kOp, {"k_cache", k_cache}, {{"qkv", qkv}, {"v_cache", v_cache}}));
  RETURN_IF_ERROR(CheckNoOverlap(kOp, {"v_cache", v_cache}, {{"qkv", qkv}}));
  // q k^T and p v over pos + 1 keys; the keys and values read, qkv, out.
  const double keys = static_cast<double>(pos + 1);
  TANDEM_OPS_DISPATCH(CachedAttentionForward,
                      Cost(4.0 * keys * C, Bytes({qkv, out}) + 2 * keys * C * DTypeSize(qkv.dtype())),
                      s, out, k_cache, v_cache, qkv, pos, num_heads);
}

AttentionScratch AttentionScratchBytes(Device device, DType dtype, int64_t B, int64_t T, int64_t C,
                                       int num_heads, bool flash) {
  if (device.is_cpu())
    return TANDEM_CPU_OP(AttentionScratchBytes)(dtype, B, T, C, num_heads, flash);
#if TANDEM_CUDA
  return cuda::AttentionScratchBytes(dtype, B, T, C, num_heads, flash);
#else
  return {};  // no CUDA device runs in this build
#endif
}

// ---- embedding and loss ---------------------------------------------------------------------

namespace {

// tokens (B, T) i32; a position table (maxT, C) with maxT >= T, when defined.
absl::Status CheckTokensAndPositions(const char* op, const Tensor& tokens, const char* name,
                                     const Tensor& pos, int64_t c) {
  RETURN_IF_ERROR(CheckI32(op, "tokens", tokens));
  RETURN_IF_ERROR(CheckRank(op, "tokens", tokens, 2, "(B, T)"));
  if (!pos.defined()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckRank(op, name, pos, 2, "(maxT, C)"));
  if (pos.dim(0) < tokens.dim(1) || pos.dim(1) != c) {
    return Invalid("%s: %s %s must be (maxT >= %d, %d) for tokens %s", op, name, pos.ToString(),
                   tokens.dim(1), c, tokens.ToString());
  }
  return absl::OkStatus();
}

// A table slice [vocab_begin, vocab_begin + rows) of a `vocab`-token table (-1: rows).
absl::Status CheckVocabSlice(const char* op, int64_t vocab_begin, int64_t* vocab, int64_t rows) {
  if (*vocab == -1) *vocab = rows;
  if (vocab_begin < 0 || vocab_begin + rows > *vocab) {
    return Invalid("%s: the table's %d rows from token %d do not fit a vocabulary of %d", op,
                   rows, vocab_begin, *vocab);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingForward(Stream& s, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                              const Tensor& wpe, int64_t vocab_begin, int64_t vocab) {
  constexpr const char* kOp = "EmbeddingForward";
  RETURN_IF_ERROR(
      CheckCommon(kOp, s, {{"out", out}, {"tokens", tokens}, {"wte", wte}}, {{"wpe", wpe}}));
  RETURN_IF_ERROR(CheckFloats(kOp, s.device(), {{"wte", wte}, {"wpe", wpe}, {"out", out}}));
  RETURN_IF_ERROR(CheckRank(kOp, "wte", wte, 2, "(V, C)"));
  RETURN_IF_ERROR(CheckTokensAndPositions(kOp, tokens, "wpe", wpe, wte.dim(1)));
  RETURN_IF_ERROR(CheckDims(kOp, "out", out, {tokens.dim(0), tokens.dim(1), wte.dim(1)}));
  RETURN_IF_ERROR(CheckVocabSlice(kOp, vocab_begin, &vocab, wte.dim(0)));
  TANDEM_OPS_DISPATCH(
      EmbeddingForward,
      Moves(Bytes({out, tokens}) + RowBytes(wte, tokens.numel()) + RowBytes(wpe, tokens.dim(1))), s,
      out, tokens, wte, wpe, vocab_begin, vocab);
}

absl::Status EmbeddingBackward(Stream& s, const Tensor& dwte, const Tensor& dwpe,
                               const Tensor& dout, const Tensor& tokens, int64_t vocab_begin,
                               int64_t vocab) {
  constexpr const char* kOp = "EmbeddingBackward";
  RETURN_IF_ERROR(
      CheckCommon(kOp, s, {{"dwte", dwte}, {"dout", dout}, {"tokens", tokens}}, {{"dwpe", dwpe}}));
  RETURN_IF_ERROR(CheckFloats(kOp, s.device(), {{"dout", dout}}));
  RETURN_IF_ERROR(CheckF32(kOp, {{"dwte", dwte}, {"dwpe", dwpe}}));
  RETURN_IF_ERROR(CheckRank(kOp, "dwte", dwte, 2, "(V, C)"));
  RETURN_IF_ERROR(CheckTokensAndPositions(kOp, tokens, "dwpe", dwpe, dwte.dim(1)));
  RETURN_IF_ERROR(CheckDims(kOp, "dout", dout, {tokens.dim(0), tokens.dim(1), dwte.dim(1)}));
  RETURN_IF_ERROR(CheckVocabSlice(kOp, vocab_begin, &vocab, dwte.dim(0)));
  TANDEM_OPS_DISPATCH(EmbeddingBackward,
                      Moves(Bytes({dout, tokens}) +
                            2 * (RowBytes(dwte, tokens.numel()) + RowBytes(dwpe, tokens.dim(1)))),
                      s, dwte, dwpe, dout, tokens, vocab_begin, vocab);
}

absl::Status SoftmaxCrossEntropy(Stream& s, const Tensor& losses, const Tensor& dlogits,
                                 const Tensor& logits, const Tensor& targets, float dloss_scale,
                                 int64_t vocab) {
  constexpr const char* kOp = "SoftmaxCrossEntropy";
  RETURN_IF_ERROR(CheckCommon(kOp, s,
                              {{"losses", losses}, {"logits", logits}, {"targets", targets}},
                              {{"dlogits", dlogits}}));
  RETURN_IF_ERROR(CheckFloats(kOp, s.device(), {{"logits", logits}, {"dlogits", dlogits}}));
  RETURN_IF_ERROR(CheckF32(kOp, {{"losses", losses}}));
  RETURN_IF_ERROR(CheckI32(kOp, "targets", targets));
  RETURN_IF_ERROR(CheckRank(kOp, "logits", logits, 2, "(N, V)"));
  const int64_t n = logits.dim(0);
  RETURN_IF_ERROR(CheckDims(kOp, "targets", targets, {n}));
  RETURN_IF_ERROR(CheckDims(kOp, "losses", losses, {n}));
  RETURN_IF_ERROR(CheckOptionalShape(kOp, "dlogits", dlogits, logits.shape()));
  if (vocab == -1) vocab = logits.dim(1);
  if (vocab < 0 || vocab > logits.dim(1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: vocab %d is not in [0, %d] of logits %s (-1: all columns)", kOp, vocab,
        logits.dim(1), logits.ToString()));
  }
  TANDEM_OPS_DISPATCH(SoftmaxCrossEntropy, Moves(Bytes({losses, dlogits, logits, targets})), s,
                      losses, dlogits, logits, targets, dloss_scale, vocab);
}

namespace {

// logits (N, Vl) with `columns` of them real; targets (N) i32; max (N) f32.
absl::Status CheckVocabParallel(const char* op, const Tensor& logits, int64_t columns,
                                const Tensor& max) {
  RETURN_IF_ERROR(CheckRank(op, "logits", logits, 2, "(N, Vl)"));
  RETURN_IF_ERROR(CheckDims(op, "max", max, {logits.dim(0)}));
  if (columns < 0 || columns > logits.dim(1)) {
    return Invalid("%s: columns %d is not in [0, %d] of logits %s", op, columns, logits.dim(1),
                   logits.ToString());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CrossEntropyRowMax(Stream& s, const Tensor& max, const Tensor& logits,
                                int64_t columns) {
  constexpr const char* kOp = "CrossEntropyRowMax";
  RETURN_IF_ERROR(CheckCommon(kOp, s, {{"max", max}, {"logits", logits}}));
  RETURN_IF_ERROR(CheckFloats(kOp, s.device(), {{"logits", logits}}));
  RETURN_IF_ERROR(CheckF32(kOp, {{"max", max}}));
  RETURN_IF_ERROR(CheckVocabParallel(kOp, logits, columns, max));
  TANDEM_OPS_DISPATCH(CrossEntropyRowMax, Moves(Bytes({max, logits})), s, max, logits, columns);
}

absl::Status CrossEntropyPartials(Stream& s, const Tensor& partials, const Tensor& logits,
                                  const Tensor& max, const Tensor& targets, int64_t vocab_begin,
                                  int64_t columns) {
  constexpr const char* kOp = "CrossEntropyPartials";
  RETURN_IF_ERROR(CheckCommon(
      kOp, s, {{"partials", partials}, {"logits", logits}, {"max", max}, {"targets", targets}}));
  RETURN_IF_ERROR(CheckFloats(kOp, s.device(), {{"logits", logits}}));
  RETURN_IF_ERROR(CheckF32(kOp, {{"partials", partials}, {"max", max}}));
  RETURN_IF_ERROR(CheckI32(kOp, "targets", targets));
  RETURN_IF_ERROR(CheckVocabParallel(kOp, logits, columns, max));
  RETURN_IF_ERROR(CheckDims(kOp, "targets", targets, {logits.dim(0)}));
  RETURN_IF_ERROR(CheckDims(kOp, "partials", partials, {2, logits.dim(0)}));
  if (vocab_begin < 0) return Invalid("%s: vocab_begin %d is negative", kOp, vocab_begin);
  TANDEM_OPS_DISPATCH(CrossEntropyPartials, Moves(Bytes({partials, logits, max, targets})), s,
                      partials, logits, max, targets, vocab_begin, columns);
}

absl::Status VocabParallelCrossEntropy(Stream& s, const Tensor& losses, const Tensor& dlogits,
                                       const Tensor& logits, const Tensor& max,
                                       const Tensor& partials, const Tensor& targets,
                                       float dloss_scale, int64_t vocab_begin, int64_t columns) {
  constexpr const char* kOp = "VocabParallelCrossEntropy";
  RETURN_IF_ERROR(CheckCommon(kOp, s,
                              {{"losses", losses}, {"logits", logits}, {"max", max},
                               {"partials", partials}, {"targets", targets}},
                              {{"dlogits", dlogits}}));
  RETURN_IF_ERROR(CheckFloats(kOp, s.device(), {{"logits", logits}, {"dlogits", dlogits}}));
  RETURN_IF_ERROR(CheckF32(kOp, {{"losses", losses}, {"max", max}, {"partials", partials}}));
  RETURN_IF_ERROR(CheckI32(kOp, "targets", targets));
  RETURN_IF_ERROR(CheckVocabParallel(kOp, logits, columns, max));
  const int64_t n = logits.dim(0);
  RETURN_IF_ERROR(CheckDims(kOp, "targets", targets, {n}));
  RETURN_IF_ERROR(CheckDims(kOp, "losses", losses, {n}));
  RETURN_IF_ERROR(CheckDims(kOp, "partials", partials, {2, n}));
  RETURN_IF_ERROR(CheckOptionalShape(kOp, "dlogits", dlogits, logits.shape()));
  if (vocab_begin < 0) return Invalid("%s: vocab_begin %d is negative", kOp, vocab_begin);
  TANDEM_OPS_DISPATCH(VocabParallelCrossEntropy,
                      Moves(Bytes({losses, dlogits, logits, max, partials, targets})), s, losses,
                      dlogits, logits, max, partials, targets, dloss_scale, vocab_begin, columns);
}

// ---- reductions -----------------------------------------------------------------------------

namespace {

absl::Status CheckReduction(const char* op, const Stream& s, const Tensor& out, const Tensor& x) {
  RETURN_IF_ERROR(CheckCommon(op, s, {{"out", out}, {"x", x}}));
  RETURN_IF_ERROR(CheckFloats(op, s.device(), {{"x", x}}));
  RETURN_IF_ERROR(CheckF32(op, {{"out", out}}));
  if (out.numel() != 1) {
    return Invalid("%s: out %s must hold one element", op, out.ToString());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Sum(Stream& s, const Tensor& out, const Tensor& x) {
  RETURN_IF_ERROR(CheckReduction("Sum", s, out, x));
  TANDEM_OPS_DISPATCH(Sum, Moves(Bytes({out, x})), s, out, x);
}

absl::Status SumSquaresAccumulate(Stream& s, const Tensor& out, const Tensor& x) {
  RETURN_IF_ERROR(CheckReduction("SumSquaresAccumulate", s, out, x));
  TANDEM_OPS_DISPATCH(SumSquaresAccumulate, Moves(Bytes({x}) + 2 * Bytes({out})), s, out, x);
}

// ---- optimizers over flat f32 buffers -------------------------------------------------------

namespace {

// f32 buffers of params' numel, params_low (bf16 or f16) of the same numel if defined, and
// grad_scale one f32 if defined.
absl::Status CheckOptimizerBuffers(const char* op, const Stream& s, Args f32,
                                   const Tensor& params_low, const Tensor& grad_scale) {
  RETURN_IF_ERROR(
      CheckCommon(op, s, f32, {{"params_low", params_low}, {"grad_scale", grad_scale}}));
  if (grad_scale.defined()) {
    RETURN_IF_ERROR(CheckF32(op, {{"grad_scale", grad_scale}}));
    if (grad_scale.numel() != 1) {
      return Invalid("%s: grad_scale %s must hold one element", op, grad_scale.ToString());
    }
  }
  RETURN_IF_ERROR(CheckF32(op, f32));
  const Arg& params = *f32.begin();
  RETURN_IF_ERROR(CheckSameNumel(op, params, f32));
  if (params_low.defined()) {
    if (params_low.dtype() != DType::kBF16 && params_low.dtype() != DType::kF16) {
      return Invalid("%s: params_low is %s; expected bf16 or f16", op, params_low.ToString());
    }
    RETURN_IF_ERROR(CheckSameNumel(op, params, {{"params_low", params_low}}));
  }
  return absl::OkStatus();
}

// Finite and >= 0: written so that a nan fails too.
bool NonNegative(float x) { return x >= 0.0f && x < INFINITY; }

}  // namespace

absl::Status AdamWUpdate(Stream& s, const Tensor& params, const Tensor& grads, const Tensor& m,
                         const Tensor& v, const AdamWConfig& c, const Tensor& params_low,
                         const Tensor& grad_scale) {
  constexpr const char* kOp = "AdamWUpdate";
  RETURN_IF_ERROR(CheckOptimizerBuffers(
      kOp, s, {{"params", params}, {"grads", grads}, {"m", m}, {"v", v}}, params_low,
      grad_scale));
  // PyTorch's AdamW refuses the same settings.
  if (c.step < 1) {
    return Invalid("%s: step is %d; it counts from 1 (params %s)", kOp, c.step, params.ToString());
  }
  if (!NonNegative(c.lr) || !NonNegative(c.eps) || !NonNegative(c.weight_decay) ||
      !(c.beta1 >= 0.0f && c.beta1 < 1.0f) || !(c.beta2 >= 0.0f && c.beta2 < 1.0f)) {
    return Invalid(
        "%s: lr %g, eps %g and weight_decay %g must be finite and >= 0, beta1 %g and beta2 %g "
        "in [0, 1) (params %s)",
        kOp, c.lr, c.eps, c.weight_decay, c.beta1, c.beta2, params.ToString());
  }
  TANDEM_OPS_DISPATCH(AdamWUpdate, Moves(Bytes({grads, params_low}) + 2 * Bytes({params, m, v})), s,
                      params, grads, m, v, c, params_low, grad_scale);
}

absl::Status SgdMomentumUpdate(Stream& s, const Tensor& params, const Tensor& grads,
                               const Tensor& momentum_buf, const SgdConfig& c,
                               const Tensor& params_low, const Tensor& grad_scale) {
  constexpr const char* kOp = "SgdMomentumUpdate";
  RETURN_IF_ERROR(CheckOptimizerBuffers(
      kOp, s, {{"params", params}, {"grads", grads}, {"momentum_buf", momentum_buf}}, params_low,
      grad_scale));
  if (!NonNegative(c.lr) || !NonNegative(c.momentum) || !NonNegative(c.weight_decay)) {
    return Invalid(
        "%s: lr %g, momentum %g and weight_decay %g must be finite and >= 0 "
        "(params %s)",
        kOp, c.lr, c.momentum, c.weight_decay, params.ToString());
  }
  TANDEM_OPS_DISPATCH(SgdMomentumUpdate,
                      Moves(Bytes({grads, params_low}) + 2 * Bytes({params, momentum_buf})), s,
                      params, grads, momentum_buf, c, params_low, grad_scale);
}

absl::Status GradScale(Stream& s, const Tensor& scale, const Tensor& sumsq, float unscale,
                       float clip_norm) {
  constexpr const char* kOp = "GradScale";
  RETURN_IF_ERROR(CheckCommon(kOp, s, {{"scale", scale}, {"sumsq", sumsq}}));
  RETURN_IF_ERROR(CheckF32(kOp, {{"scale", scale}, {"sumsq", sumsq}}));
  for (const Arg& a : {Arg{"scale", scale}, Arg{"sumsq", sumsq}}) {
    if (a.t.numel() != 1) return Invalid("%s: %s %s must hold one element", kOp, a.name, a.t.ToString());
  }
  if (!NonNegative(clip_norm) || !(unscale > 0.0f) || !std::isfinite(unscale)) {
    return Invalid("%s: clip_norm %g must be finite and >= 0, unscale %g finite and > 0", kOp,
                   clip_norm, unscale);
  }
  TANDEM_OPS_DISPATCH(GradScale, Moves(Bytes({scale, sumsq})), s, scale, sumsq, unscale,
                      clip_norm);
}

#undef TANDEM_OPS_DISPATCH

}  // namespace ops
}  // namespace tandem
