// The backends behind ops.h. ops.cc checks every argument against the contracts in ops.h,
// then calls the CPU or the CUDA version of the op with the same arguments; backends may assume
// valid input. cuda:: exists only in builds with CUDA (TANDEM_CUDA).
#ifndef TANDEM_RUNTIME_OPS_BACKEND_H_
#define TANDEM_RUNTIME_OPS_BACKEND_H_

#include "runtime/ops.h"

// x86-64 builds with GCC compile the CPU backend once per instruction set (ops_cpu.cc); other
// builds have the base variant only.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TANDEM_CPU_VARIANTS 1
#else
#define TANDEM_CPU_VARIANTS 0
#endif

namespace tandem {
namespace ops {
namespace cpu {

namespace base {
#include "runtime/ops_decls.inc"
}  // namespace base

#if TANDEM_CPU_VARIANTS
namespace avx2 {
#include "runtime/ops_decls.inc"
}  // namespace avx2
namespace avx512 {
#include "runtime/ops_decls.inc"
}  // namespace avx512
#endif

// The variant of one op for the instruction set in use: base_op, avx2_op or avx512_op.
template <typename Fn>
Fn Variant(Fn base_op, Fn avx2_op, Fn avx512_op) {
  switch (CpuIsaInUse()) {
    case CpuIsa::kAvx512:
      return avx512_op;
    case CpuIsa::kAvx2:
      return avx2_op;
    case CpuIsa::kBase:
      break;
  }
  return base_op;
}

}  // namespace cpu

#if TANDEM_CPU_VARIANTS
#define TANDEM_CPU_OP(op) cpu::Variant(&cpu::base::op, &cpu::avx2::op, &cpu::avx512::op)
#else
#define TANDEM_CPU_OP(op) (&cpu::base::op)
#endif

#if TANDEM_CUDA
namespace cuda {
#include "runtime/ops_decls.inc"
}  // namespace cuda
#endif

}  // namespace ops
}  // namespace tandem

#endif  // TANDEM_RUNTIME_OPS_BACKEND_H_
