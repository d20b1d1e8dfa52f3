// The CPU backend of ops.h, compiled once per x86-64 instruction set and chosen at run time by
// what the CPU supports, as ATen's CPU capability dispatch does: the loops are in
// ops_cpu_impl.inc, included below into namespaces base (SSE2, any x86-64 or other CPU), avx2
// (AVX2 + FMA + F16C) and avx512 (AVX-512 F/VL/BW/DQ). Each loop runs the same additions and
// multiplications in the same order whatever the vector width (no FMA contraction: the ops
// library compiles with -ffp-contract=off; reductions keep a fixed number of partial sums), so
// every variant gives bit-identical results and the choice changes speed only.

// The project compiles at -O2, where GCC 12 vectorizes only loops whose trip count is a known
// multiple of the vector width, and -ftrapping-math keeps it from turning the clamps in
// Exp/Tanh into selects. The loops are the CPU path's hot spots, so this file asks for the full
// vectorizer (before the includes: the inline helpers of <cmath> must be compiled with the same
// options, or they are not inlined into vectorizable loops). Neither option changes a result:
// they only drop FP-exception side effects, which nothing here reads.
#pragma GCC optimize("O3", "no-trapping-math")

#include <cblas.h>

#include <algorithm>
#include <atomic>
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

namespace base {
#include "runtime/ops_cpu_impl.inc"
}  // namespace base

#if TANDEM_CPU_VARIANTS
// The target pragmas apply to every function defined between push and pop: the op functions and
// their inline helpers in the .inc. The headers' inline functions stay compiled for the base
// instruction set; GCC inlines them into the wider variants, never the other way round.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#include "runtime/ops_cpu_impl.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq")
namespace avx512 {
#include "runtime/ops_cpu_impl.inc"
}  // namespace avx512
#pragma GCC pop_options
#endif  // TANDEM_CPU_VARIANTS

namespace {

CpuIsa Detect() {
#if TANDEM_CPU_VARIANTS
  // libgcc's checks include the operating system's support for the wider registers (XGETBV).
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("fma")) {
    return CpuIsa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kBase;
}

std::atomic<CpuIsa>& Active() {
  static std::atomic<CpuIsa> isa{BestCpuIsa()};
  return isa;
}

}  // namespace

}  // namespace cpu

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBase:
      return "base";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

CpuIsa BestCpuIsa() {
  static const CpuIsa best = cpu::Detect();
  return best;
}

CpuIsa CpuIsaInUse() { return cpu::Active().load(std::memory_order_relaxed); }

absl::Status UseCpuIsa(CpuIsa isa) {
  if (static_cast<int>(isa) > static_cast<int>(BestCpuIsa())) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "CPU instruction set %s: this CPU (or this build) runs at most %s; choose one of those",
        CpuIsaName(isa), CpuIsaName(BestCpuIsa())));
  }
  cpu::Active().store(isa, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace ops
}  // namespace tandem
