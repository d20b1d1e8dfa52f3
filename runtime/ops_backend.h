// The backends behind ops.h. ops.cc checks every argument against the contracts in ops.h,
// then calls cpu::X or cuda::X with the same arguments; backends may assume valid input.
// cuda:: exists only in builds with CUDA (TANDEM_CUDA).
#ifndef TANDEM_RUNTIME_OPS_BACKEND_H_
#define TANDEM_RUNTIME_OPS_BACKEND_H_

#include "runtime/ops.h"

namespace tandem {
namespace ops {
namespace cpu {
#include "runtime/ops_decls.inc"
}  // namespace cpu

#if TANDEM_CUDA
namespace cuda {
#include "runtime/ops_decls.inc"
}  // namespace cuda
#endif

}  // namespace ops
}  // namespace tandem

#endif  // TANDEM_RUNTIME_OPS_BACKEND_H_
