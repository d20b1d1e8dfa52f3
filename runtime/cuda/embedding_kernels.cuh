// The kernels of embedding.cu, whose launchers stay there: text included inside
// tandem::ops::cuda by embedding.cu and, on the host with CUDA's execution model emulated
// (runtime/cuda_emulation.h), by runtime/cuda_kernels_emulation_test.cc, so the same
// source is checked without a GPU. The includer provides device_functions.cuh first.

// ---- kernels ----------------------------------------------------------------------------------

// out[b, t, :] = wte[tokens[b, t] - vocab_begin, :] + wpe[t, :] (wpe may be null); wte holds
// tokens [vocab_begin, vocab_begin + V), and a token outside them gives wpe[t, :] alone (or a
// zero row). P elements per step, C % P == 0.
// out: (B * T, C); tokens: (B * T) i32; wte: (V, C); wpe: (maxT, C)
template <typename T, int P>
__global__ void EmbeddingForwardKernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                       int64_t rows, int seq, int C, int V, int vocab_begin) {
  using Vec = Pack<T, P>;
  const int64_t packs = rows * C / P;
  for (int64_t p = GridThread(); p < packs; p += GridThreads()) {
    const int64_t i = p * P;
    const int64_t row = i / C;
    const int c = static_cast<int>(i % C);
    const int token = tokens[row] - vocab_begin;
    const bool held = token >= 0 && token < V;
    Vec w, pe;
    if (held) w = Vec::Load(wte + static_cast<int64_t>(token) * C + c);
    if (wpe != nullptr) pe = Vec::Load(wpe + (row % seq) * C + c);
    Vec o;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      o[j] = FromF32<T>((held ? ToF32(w[j]) : 0.0f) + (wpe != nullptr ? ToF32(pe[j]) : 0.0f));
    }
    o.Store(out + i);
  }
}

// dwte[tokens[r] - vocab_begin, c] += dout[r, c], by atomicAdd (tokens repeat); tokens outside
// the slice add nothing.
// dwte: (V, C) f32; dout: (rows, C); tokens: (rows) i32
template <typename T, int P>
__global__ void WteBackwardKernel(float* dwte, const T* dout, const int32_t* tokens, int64_t rows,
                                  int C, int V, int vocab_begin) {
  using Vec = Pack<T, P>;
  const int64_t packs = rows * C / P;
  for (int64_t p = GridThread(); p < packs; p += GridThreads()) {
    const int64_t i = p * P;
    const int64_t row = i / C;
    const int c = static_cast<int>(i % C);
    const int token = tokens[row] - vocab_begin;
    if (token < 0 || token >= V) continue;
    const Vec g = Vec::Load(dout + i);
    float* dst = dwte + static_cast<int64_t>(token) * C + c;
#pragma unroll
    for (int j = 0; j < P; ++j) atomicAdd(dst + j, ToF32(g[j]));
  }
}

// dwpe[t, c] += sum over b of dout[b, t, c]; one thread per (t, c).
// dwpe: (maxT, C) f32; dout: (B, T, C)
template <typename T>
__global__ void WpeBackwardKernel(float* dwpe, const T* dout, int B, int seq, int C) {
  const int64_t n = static_cast<int64_t>(seq) * C;
  for (int64_t i = GridThread(); i < n; i += GridThreads()) {
    float sum = 0.0f;
    for (int b = 0; b < B; ++b) sum += ToF32(dout[b * n + i]);
    dwpe[i] += sum;
  }
}
