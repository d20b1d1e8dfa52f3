// CUDA's execution model emulated on the host, so that the backend's kernels (the
// runtime/cuda/*_kernels.cuh files, compiled as C++) run and are checked without a GPU.
//
// A grid's blocks run one after another on one std::thread per CUDA thread.
// __syncthreads and __syncwarp are barriers; a thread that returns leaves them, as an exited
// thread does on the hardware, and a shuffle in a warp with an exited lane is reported (its
// result is undefined on the hardware). Shared memory: `__shared__` arrays become statics
// (one block runs at a time) and the dynamic part starts as NaN bytes, so a value read
// before it was written shows. atomicAdd is atomic; bf16 and f16 round as the host's
// dtype.h does. A barrier that waits over 60 s (threads that diverge around __syncthreads)
// ends the process with a message. The sm_80 instructions of runtime/cuda/sm80.cuh: ldmatrix
// and mma.m16n8k16 gather the warp's registers and compute what PTX documents; cp.async
// fills its destination with NaN bytes at once and copies only when cp.async.wait_group lets
// the copy be complete, so that a tile read before its wait, or overwritten while another
// warp still reads it, shows; a thread that exits with copies outstanding is reported. Test-only (cuda_kernels_emulation_test.cc,
// flash_attention_emulation_test.cc).
#ifndef TANDEM_RUNTIME_CUDA_EMULATION_H_
#define TANDEM_RUNTIME_CUDA_EMULATION_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

#include "runtime/dtype.h"

// ---- CUDA's names, in the global namespace as CUDA declares them -----------------------------

struct dim3 {
  dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
  unsigned int x, y, z;
};
extern thread_local dim3 threadIdx;
extern thread_local dim3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

struct int4 {
  int x, y, z, w;
};
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
struct uint2 {
  unsigned int x, y;
};

// 16-bit storage types, rounded to nearest even like the device's conversions.
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 x) { return tandem::Bf16ToFloat(x.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {tandem::FloatToBf16(x)}; }
inline float __half2float(__half x) { return tandem::HalfToFloat(x.bits); }
inline __half __float2half_rn(float x) { return {tandem::FloatToHalf(x)}; }

void __syncthreads();
void __syncwarp(unsigned int mask = 0xffffffffu);
float __shfl_xor_sync(unsigned int mask, float v, int lane_mask);
float atomicAdd(float* address, float v);
using std::max;
using std::min;

namespace tandem {
namespace cuda_emulation {

// The dynamic shared memory of the calling thread's block: 128-byte aligned, as many bytes
// as its launch asked for.
unsigned char* DynamicShared();
size_t DynamicSharedBytes();

// Runs kernel() on a grid of `grid` blocks of `block` threads with `shared` bytes of dynamic
// shared memory. Warps are made of consecutive linear thread ids (x fastest), as on the GPU.
void Launch(dim3 grid, dim3 block, size_t shared, const std::function<void()>& kernel);

// The first rule a kernel broke since the last call (and clears it); "" if none.
std::string TakeError();
// Records a broken rule (the first one is kept).
void Fail(const std::string& what);

// ldmatrix .x4 (.trans), mma.m16n8k16 with f32 accumulation and cp.async, for
// runtime/cuda/sm80.cuh.
void LdMatrixX4(uint32_t (&r)[4], const void* row, bool trans);
void MmaM16N8K16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16);
void CpAsync16(void* dst, const void* src, bool valid);
void CpAsyncCommit();
void CpAsyncWait(int pending);

}  // namespace cuda_emulation
}  // namespace tandem

// runtime/cuda/sm80.cuh's functions.
template <bool kTrans>
void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  tandem::cuda_emulation::LdMatrixX4(r, row, kTrans);
}
template <typename E>
void MmaM16N8K16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(std::is_same<E, __nv_bfloat16>::value || std::is_same<E, __half>::value,
                "mma.m16n8k16 takes bf16 or f16");
  tandem::cuda_emulation::MmaM16N8K16(d, a, b0, b1, std::is_same<E, __nv_bfloat16>::value);
}
inline void CpAsync16(void* dst, const void* src, bool valid) {
  tandem::cuda_emulation::CpAsync16(dst, src, valid);
}
inline void CpAsyncCommit() { tandem::cuda_emulation::CpAsyncCommit(); }
template <int kPending>
void CpAsyncWait() {
  tandem::cuda_emulation::CpAsyncWait(kPending);
}

// CUDA's qualifiers. Include this header after every other one: `__shared__` becomes
// `static`.
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static

#endif  // TANDEM_RUNTIME_CUDA_EMULATION_H_
