// The PTX instructions of sm_80 and later that the FlashAttention kernels use (PTX ISA,
// "Warp-level matrix instructions" and "Data movement"): ldmatrix, which loads four 8 x 8
// matrices of 16-bit elements from shared memory into the fragment layout; mma.m16n8k16 with
// f32 accumulation; and cp.async, which copies global memory to shared memory without
// passing through registers, so that a block computes while its next tile loads.
// runtime/cuda_emulation.h emulates each, with the same signatures and the semantics PTX
// documents, so the kernels run on the host too. Device-only.
#ifndef TANDEM_RUNTIME_CUDA_SM80_CUH_
#define TANDEM_RUNTIME_CUDA_SM80_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

// Lane l passes the address of row l % 8 of matrix l / 8 (16 contiguous, 16-byte aligned
// bytes of shared memory). r[j] gets matrix j's elements (l / 4, 2 (l % 4)) and
// (l / 4, 2 (l % 4) + 1), low half first; with kTrans the transposed matrix's.
#define TANDEM_LDMATRIX_X4(trans)                                                            \
  asm volatile("ldmatrix.sync.aligned.m8n8.x4" trans ".shared.b16 {%0, %1, %2, %3}, [%4];\n" \
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                              \
               : "r"(at)                                                                     \
               : "memory")
template <bool kTrans>
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  const unsigned int at = static_cast<unsigned int>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    TANDEM_LDMATRIX_X4(".trans");
  } else {
    TANDEM_LDMATRIX_X4("");
  }
}
#undef TANDEM_LDMATRIX_X4

// d (16 x 8, f32) += a (16 x 16) b (16 x 8), E = __nv_bfloat16 or __half. With g = lane / 4
// and t = lane % 4: a[0] holds a's (g, 2t..2t+1), a[1] (g+8, 2t..), a[2] (g, 2t+8..),
// a[3] (g+8, 2t+8..); b0 b's (2t..2t+1, g), b1 (2t+8.., g); d[0], d[1] d's (g, 2t), (g, 2t+1)
// and d[2], d[3] (g+8, 2t), (g+8, 2t+1).
#define TANDEM_MMA_M16N8K16(type)                                                       \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." type "." type                   \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <typename E>
__device__ __forceinline__ void MmaM16N8K16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
  static_assert(std::is_same<E, __nv_bfloat16>::value || std::is_same<E, __half>::value,
                "mma.m16n8k16 takes bf16 or f16");
  if constexpr (std::is_same<E, __nv_bfloat16>::value) {
    TANDEM_MMA_M16N8K16("bf16");
  } else {
    TANDEM_MMA_M16N8K16("f16");
  }
}
#undef TANDEM_MMA_M16N8K16

// Starts copying 16 bytes from global `src` to shared `dst` (both 16-byte aligned) in the
// calling thread's open group; where !valid nothing is read and dst gets zeros.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  const unsigned int at = static_cast<unsigned int>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at),
               "l"(__cvta_generic_to_global(src)), "r"(valid ? 16 : 0)
               : "memory");
}

// Closes the calling thread's open group of copies (an empty group too).
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of the calling thread's newest groups are still copying. The
// copies are the thread's own: other threads see them after a __syncthreads that follows.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

#endif  // TANDEM_RUNTIME_CUDA_SM80_CUH_
