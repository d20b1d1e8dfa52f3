// cuBLASLt GEMM for the CUDA backend: row-major problems mapped to cuBLAS's column-major
// convention, one cuBLASLt handle per device, a 32 MiB workspace per stream that runs
// matmuls (normally one stream per device), and the per-shape algorithm cache.
//
// Layout mapping. A row-major matrix X (r, c) with row stride ld is, read column-major, the
// matrix X^T (c x r) with leading dimension ld. So for out (m, n) = op(a) @ op(b):
//   out^T (n x m, col-major) = op(b)^T @ op(a)^T
// which is one cuBLAS call with A := b (op = T when transpose_b), B := a (op = T when
// transpose_a), dimensions (m', n', k') = (n, m, k), lda' = ldb, ldb' = lda, ldd' = ldo.
// Check, no transposes: b (k, n) row-major is col-major (n x k) = A with op N: m' x k' ✓;
// a (m, k) is col-major (k x m) = B with op N: k' x n' ✓; out^T is n x m = m' x n' ✓.
// With transpose_b, b is stored (n, k): col-major (k x n), op T gives n x k = m' x k' ✓.
// A bias over out's columns is a vector over the rows of D' = out^T: exactly cuBLASLt's
// BIAS epilogue (length = rows of D). The GELU aux matrix has D's layout, ld = ldpre.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "runtime/allocator.h"
#include "runtime/cuda/gemm.cuh"
#include "runtime/cuda_status.h"
#include "runtime/device.h"
#include "runtime/status.h"

namespace tandem {
namespace ops {
namespace cuda {
namespace {

constexpr int kMaxCandidates = 8;
constexpr int kTimedRuns = 2;

bool AllowTf32() {
  static const bool allow = [] {
    const char* e = std::getenv("TANDEM_CUBLAS_TF32");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }();
  return allow;
}

size_t ElementBytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// Largest power of two (at most 256) dividing the address and the batch stride in bytes:
// the alignment every matrix of the batch is guaranteed to have.
uint32_t AlignmentOf(const void* p, int64_t stride_bytes) {
  const uint64_t bits = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)) |
                        static_cast<uint64_t>(stride_bytes) | 256u;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// The problem in cuBLAS's column-major terms (see the file comment).
struct ColMajorGemm {
  cublasOperation_t trans_a, trans_b;
  int64_t m, n, k;
  const void* a;
  int64_t lda, stride_a;
  const void* b;
  int64_t ldb, stride_b;
  void* d;
  int64_t ldd, stride_d;
  int batch;
  cudaDataType_t ab_type, d_type;
  cublasComputeType_t compute;
  cublasLtEpilogue_t epilogue;
  const void* bias;
  void* aux;
  int64_t ld_aux;
  float alpha, beta;
};

using AlgoKey = std::array<int64_t, 23>;

AlgoKey KeyOf(int device, const ColMajorGemm& p) {
  const int64_t ab = static_cast<int64_t>(ElementBytes(p.ab_type));
  const int64_t db = static_cast<int64_t>(ElementBytes(p.d_type));
  return {device, p.m, p.n, p.k, p.trans_a, p.trans_b, p.ab_type, p.d_type, p.compute,
          p.epilogue, p.batch, p.lda, p.ldb, p.ldd, p.ld_aux, p.stride_a, p.stride_b,
          p.stride_d, AlignmentOf(p.a, p.stride_a * ab), AlignmentOf(p.b, p.stride_b * ab),
          AlignmentOf(p.d, p.stride_d * db), AlignmentOf(p.bias, 0), AlignmentOf(p.aux, 0)};
}

struct CachedAlgo {
  bool found;
  cublasLtMatmulAlgo_t algo;
};

struct GemmState {
  absl::Mutex mu;
  std::map<int, cublasLtHandle_t> lt_handles ABSL_GUARDED_BY(mu);
  std::map<int, cublasHandle_t> blas_handles ABSL_GUARDED_BY(mu);
  std::map<std::pair<int, cudaStream_t>, void*> workspaces ABSL_GUARDED_BY(mu);
  // The fastest algorithm per problem, or none where cuBLASLt had no algorithm (so the
  // heuristic is asked once per shape either way).
  std::map<AlgoKey, CachedAlgo> algos ABSL_GUARDED_BY(mu);
  // cublasSetStream + the call must not interleave between threads sharing a cuBLAS handle.
  absl::Mutex blas_call_mu;
};

GemmState& State() {
  static auto* state = new GemmState();  // never destroyed: handles outlive static dtors
  return *state;
}

absl::StatusOr<cublasLtHandle_t> LtHandle(int device) {
  GemmState& st = State();
  absl::MutexLock lock(&st.mu);
  auto it = st.lt_handles.find(device);
  if (it != st.lt_handles.end()) return it->second;
  cublasLtHandle_t h;
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&h));
  st.lt_handles[device] = h;
  return h;
}

absl::StatusOr<cublasHandle_t> BlasHandle(int device) {
  GemmState& st = State();
  absl::MutexLock lock(&st.mu);
  auto it = st.blas_handles.find(device);
  if (it != st.blas_handles.end()) return it->second;
  cublasHandle_t h;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&h));
  st.blas_handles[device] = h;
  return h;
}

// The workspace of (device, stream), allocated once and kept: two streams running matmuls
// at the same time must not share one.
absl::StatusOr<void*> Workspace(int device, cudaStream_t stream) {
  GemmState& st = State();
  absl::MutexLock lock(&st.mu);
  auto key = std::make_pair(device, stream);
  auto it = st.workspaces.find(key);
  if (it != st.workspaces.end()) return it->second;
  ASSIGN_OR_RETURN(Allocator * allocator, GetAllocator(Device::Cuda(device)));
  ASSIGN_OR_RETURN(void* ws, allocator->Allocate(kGemmWorkspaceBytes));
  st.workspaces[key] = ws;
  return ws;
}

// Descriptors of one call, destroyed with it.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

absl::Status SetBatch(cublasLtMatrixLayout_t layout, int batch, int64_t stride) {
  if (batch == 1) return absl::OkStatus();
  const int32_t count = batch;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  return absl::OkStatus();
}

absl::Status MakeDescs(const ColMajorGemm& p, LtDescs* d) {
  // Stored shapes: A is (m x k) or, transposed, (k x m); B is (k x n) or (n x k); D (m x n).
  const bool na = p.trans_a == CUBLAS_OP_N;
  const bool nb = p.trans_b == CUBLAS_OP_N;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d->a, p.ab_type, na ? p.m : p.k,
                                                    na ? p.k : p.m, p.lda));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d->b, p.ab_type, nb ? p.k : p.n,
                                                    nb ? p.n : p.k, p.ldb));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d->d, p.d_type, p.m, p.n, p.ldd));
  RETURN_IF_ERROR(SetBatch(d->a, p.batch, p.stride_a));
  RETURN_IF_ERROR(SetBatch(d->b, p.batch, p.stride_b));
  RETURN_IF_ERROR(SetBatch(d->d, p.batch, p.stride_d));

  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&d->op, p.compute, CUDA_R_32F));
  const int32_t ta = p.trans_a, tb = p.trans_b;
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const uint32_t epilogue = p.epilogue;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                        &epilogue, sizeof(epilogue)));
  if (p.bias != nullptr) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        d->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
  }
  if (p.aux != nullptr) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof(p.aux)));
    const int64_t ld_aux = p.ld_aux;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof(ld_aux)));
  }

  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&d->pref));
  const uint64_t ws = kGemmWorkspaceBytes;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      d->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // The heuristic assumes 256-byte aligned matrices unless told: views into flat buffers
  // (and batches at odd strides) may be less aligned.
  const int64_t ab = static_cast<int64_t>(ElementBytes(p.ab_type));
  const int64_t db = static_cast<int64_t>(ElementBytes(p.d_type));
  const uint32_t align_a = AlignmentOf(p.a, p.stride_a * ab);
  const uint32_t align_b = AlignmentOf(p.b, p.stride_b * ab);
  const uint32_t align_d = AlignmentOf(p.d, p.stride_d * db);
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      d->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      d->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      d->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      d->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
  return absl::OkStatus();
}

cublasStatus_t LtCall(cublasLtHandle_t h, const ColMajorGemm& p, const LtDescs& d,
                      const cublasLtMatmulAlgo_t& algo, void* out, void* ws,
                      cudaStream_t stream) {
  // C is read (beta != 0) from the real output; D may be a scratch copy while timing.
  return cublasLtMatmul(h, d.op, &p.alpha, p.a, d.a, p.b, d.b, &p.beta, p.d, d.d, out, d.d, &algo,
                        ws, kGemmWorkspaceBytes, stream);
}

// Holds what timing borrowed (events, scratch output) and gives it back on every path.
struct TrialResources {
  cudaEvent_t start = nullptr, stop = nullptr;
  Allocator* allocator = nullptr;
  void* scratch = nullptr;
  ~TrialResources() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (scratch) allocator->Free(scratch);  // only after the stop event was waited for
  }
};

// Times each usable candidate on the stream and returns the index of the fastest, or -1
// when every candidate refused the actual arguments.
absl::StatusOr<int> PickFastest(int device, cublasLtHandle_t h, const ColMajorGemm& p,
                                const LtDescs& d,
                                const std::vector<cublasLtMatmulHeuristicResult_t>& cands,
                                void* ws, cudaStream_t stream) {
  if (cands.size() == 1) return 0;
  TrialResources r;
  void* out = p.d;
  if (p.beta != 0.0f) {
    // Accumulating calls must not disturb out: trial results go to a scratch matrix.
    const int64_t elems = (p.batch - 1) * p.stride_d + (p.n - 1) * p.ldd + p.m;
    ASSIGN_OR_RETURN(r.allocator, GetAllocator(Device::Cuda(device)));
    ASSIGN_OR_RETURN(r.scratch, r.allocator->Allocate(elems * ElementBytes(p.d_type)));
    out = r.scratch;
  }
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&r.start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&r.stop));
  int best = -1;
  float best_ms = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < cands.size(); ++i) {
    // Warm-up run, which also weeds out candidates that refuse the actual arguments.
    if (LtCall(h, p, d, cands[i].algo, out, ws, stream) != CUBLAS_STATUS_SUCCESS) continue;
    CUDA_RETURN_IF_ERROR(cudaEventRecord(r.start, stream));
    bool ok = true;
    for (int run = 0; run < kTimedRuns && ok; ++run) {
      ok = LtCall(h, p, d, cands[i].algo, out, ws, stream) == CUBLAS_STATUS_SUCCESS;
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(r.stop, stream));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(r.stop));
    float ms = 0.0f;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, r.start, r.stop));
    if (ok && ms < best_ms) {
      best_ms = ms;
      best = static_cast<int>(i);
    }
  }
  return best;  // -1 when none ran: treated as cuBLASLt having no algorithm
}

// Plain cuBLAS for what cuBLASLt declines (no epilogue only).
absl::Status ClassicGemm(int device, const ColMajorGemm& p, cudaStream_t stream) {
  ASSIGN_OR_RETURN(cublasHandle_t h, BlasHandle(device));
  absl::MutexLock lock(&State().blas_call_mu);
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, stream));
  CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx_64(
      h, p.trans_a, p.trans_b, p.m, p.n, p.k, &p.alpha, p.a, p.ab_type, p.lda, p.stride_a, p.b,
      p.ab_type, p.ldb, p.stride_b, &p.beta, p.d, p.d_type, p.ldd, p.stride_d, p.batch,
      p.compute, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunGemm(Stream& s, const RowMajorGemm& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return absl::OkStatus();
  if (g.k <= 0 || g.m < 0 || g.n < 0 || g.batch < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gemm: m=%d n=%d k=%d batch=%d (k = 0 is the caller's to handle)", g.m, g.n, g.k,
        g.batch));
  }
  const bool has_epilogue = g.bias != nullptr || g.gelu;
  if (has_epilogue) {
    // cuBLASLt's constraints on the GELU aux matrix: ld a multiple of 8 and >= rows of D
    // (= n); the matrix itself 16-byte aligned. Checked here so the fallback is taken
    // before anything runs.
    if (g.batch != 1) return absl::UnimplementedError("gemm: epilogue on a batched gemm");
    if (g.pre != nullptr && (g.ldpre % 8 != 0 || g.ldpre < g.n || !(AlignmentOf(g.pre, 0) >= 16))) {
      return absl::UnimplementedError("gemm: GELU aux matrix not 8-element/16-byte aligned");
    }
    // cuBLASLt takes no alignment preference for the bias vector, and its epilogue kernels
    // may load it 16 bytes at a time: a less aligned bias (a view into a flat buffer) goes to
    // the fallback, a plain gemm then the bias kernels.
    if (g.bias != nullptr && !(AlignmentOf(g.bias, 0) >= 16)) {
      return absl::UnimplementedError("gemm: bias not 16-byte aligned");
    }
  }
  RETURN_IF_ERROR(SetCurrentDevice(s.device()));
  const int device = s.device().index();
  cudaStream_t stream = static_cast<cudaStream_t>(s.native());

  ColMajorGemm p;
  p.trans_a = g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  p.a = g.b;
  p.lda = g.ldb;
  p.stride_a = g.stride_b;
  p.trans_b = g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  p.b = g.a;
  p.ldb = g.lda;
  p.stride_b = g.stride_a;
  p.m = g.n;
  p.n = g.m;
  p.k = g.k;
  p.d = g.out;
  p.ldd = g.ldo;
  p.stride_d = g.stride_out;
  p.batch = g.batch;
  p.ab_type = g.ab_type;
  p.d_type = g.out_type;
  p.compute = (g.ab_type == CUDA_R_32F && AllowTf32()) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                       : CUBLAS_COMPUTE_32F;
  p.bias = g.bias;
  p.aux = g.gelu ? g.pre : nullptr;
  p.ld_aux = g.gelu && g.pre != nullptr ? g.ldpre : 0;
  p.alpha = g.alpha;
  p.beta = g.beta;
  if (g.gelu) {
    if (g.pre != nullptr) {
      p.epilogue = g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    } else {
      p.epilogue = g.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    }
  } else {
    p.epilogue = g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }

  ASSIGN_OR_RETURN(cublasLtHandle_t h, LtHandle(device));
  ASSIGN_OR_RETURN(void* ws, Workspace(device, stream));
  LtDescs d;
  RETURN_IF_ERROR(MakeDescs(p, &d));

  const AlgoKey key = KeyOf(device, p);
  GemmState& st = State();
  CachedAlgo entry{false, {}};
  bool cached = false;
  {
    absl::MutexLock lock(&st.mu);
    auto it = st.algos.find(key);
    if (it != st.algos.end()) {
      entry = it->second;
      cached = true;
    }
  }
  if (!cached) {
    cublasLtMatmulHeuristicResult_t results[kMaxCandidates];
    int count = 0;
    // A refusal (NOT_SUPPORTED, or INVALID_VALUE for a layout cuBLASLt does not take) means
    // no algorithm: cuBLAS, or the caller's kernels, will do the work.
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
        h, d.op, d.a, d.b, d.d, d.d, d.pref, kMaxCandidates, results, &count);
    std::vector<cublasLtMatmulHeuristicResult_t> cands;
    if (hs == CUBLAS_STATUS_SUCCESS) {
      for (int i = 0; i < count; ++i) {
        if (results[i].state == CUBLAS_STATUS_SUCCESS &&
            results[i].workspaceSize <= kGemmWorkspaceBytes) {
          cands.push_back(results[i]);
        }
      }
    }
    if (!cands.empty()) {
      ASSIGN_OR_RETURN(int best, PickFastest(device, h, p, d, cands, ws, stream));
      if (best >= 0) entry = {true, cands[best].algo};
    }
    absl::MutexLock lock(&st.mu);
    st.algos.emplace(key, entry);
  }
  if (!entry.found) {
    if (has_epilogue) {
      return absl::UnimplementedError(absl::StrFormat(
          "cuBLASLt has no algorithm for epilogue %d at m=%d n=%d k=%d", p.epilogue, p.m, p.n,
          p.k));
    }
    return ClassicGemm(device, p, stream);
  }
  const cublasStatus_t run = LtCall(h, p, d, entry.algo, p.d, ws, stream);
  if (run == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  // cuBLASLt checks its arguments before it launches anything: a refusal wrote nothing.
  if (run == CUBLAS_STATUS_NOT_SUPPORTED || run == CUBLAS_STATUS_INVALID_VALUE) {
    if (has_epilogue) {
      return absl::UnimplementedError("cuBLASLt refused the epilogue at run time");
    }
    return ClassicGemm(device, p, stream);
  }
  CUBLAS_RETURN_IF_ERROR(run);
  return absl::OkStatus();
}

size_t CublasLtCacheSizeForTesting() {
  GemmState& st = State();
  absl::MutexLock lock(&st.mu);
  return st.algos.size();
}

}  // namespace cuda
}  // namespace ops
}  // namespace tandem
