// The ops a GPT and an MLP need, forward and backward, on the CPU and on CUDA devices.
// Every op checks its arguments (shapes, dtypes, devices; errors name the op and shapes),
// then dispatches on the device of its tensors: plain loops and OpenBLAS on the CPU,
// cuBLASLt and fused kernels on CUDA, issued in `stream`'s order. On both an op returns once
// it is queued, and an error found while it runs is the stream's, returned by the next op or
// synchronization (on an immediate CPU stream an op returns once it ran, with its own error:
// runtime/stream.h). The layer code above calls only these functions, so it is the same for
// both.
//
// Conventions (after llm.c): outputs first, then what backward needs, then inputs.
// Legend: N = rows (batch * sequence), C = channels, OC = output channels, V = vocabulary,
// B = batch, T = sequence, NH = heads, hs = C / NH.
// Parameter gradients ACCUMULATE (+=) so micro-batches sum without copies; gradients with
// respect to activations are WRITTEN (=) unless the op says otherwise.
// Dtypes: the CPU computes in f32 only (bf16/f16 tensors exist there only for Cast). On
// CUDA, ops marked "any float" take f32, bf16 or f16 activations and compute in f32;
// statistics (mean, rstd), losses and optimizer state are always f32.
// Readings of this contract where it is silent (ops.cc checks them):
// - Where an op is not marked "any float", CUDA takes the same as for a marked one: its
//   activations and their gradients share one float dtype; att, mean and rstd are f32; the
//   accumulated dweight and dbias of LinearBackward and LayerNormBackward are f32 or that
//   same dtype (as the CUDA kernels accumulate either).
// - Shapes are exact: an (N, C) argument is 2-D (pass a (B, T, C) activation as a
//   (B * T, C) view); "(1)" is any tensor holding one element.
// - Zero-sized tensors are valid: the op writes nothing, or what an empty sum gives (zeros).
// - A tensor may be undefined only where the op says so.
#ifndef TANDEM_RUNTIME_OPS_H_
#define TANDEM_RUNTIME_OPS_H_

#include <vector>

#include "absl/status/status.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace tandem {
namespace ops {

// ---- matmul -------------------------------------------------------------------------------

// out (M, N) = alpha * op(a) @ op(b) + beta * out, with op(x) = x or x^T; a and b are 2-D.
// Any float on CUDA (a, b and out one dtype), f32 accumulation; the cuBLASLt algorithm is
// chosen once per shape and cached. beta = 1 accumulates into out; beta = 0 ignores what out
// held (a nan there does not propagate), as BLAS and PyTorch's addmm. out may not share
// memory with a or b.
absl::Status Matmul(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b,
                    bool transpose_a, bool transpose_b, float alpha = 1.0f, float beta = 0.0f);
// What the matmuls keep allocated on `device`'s backend once they have run, for the memory
// check: on CUDA cuBLASLt's workspace (one for each stream that runs matmuls); on the CPU none.
int64_t MatmulWorkspaceBytes(Device device);

// out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC) (bias may be undefined).
// Any float on CUDA (inp, weight, bias and out one dtype); on CUDA the bias is added in the
// matmul's epilogue.
absl::Status LinearForward(Stream& s, const Tensor& out, const Tensor& inp, const Tensor& weight,
                           const Tensor& bias);
// The same followed by GELU: pre (N, OC) = inp @ weight^T + bias, out = GELU(pre); pre is
// kept for backward. On CUDA one cuBLASLt call with the GELU_AUX_BIAS epilogue. Here bias
// must be defined, and out may not share memory with pre or the inputs.
absl::Status LinearGeluForward(Stream& s, const Tensor& out, const Tensor& pre,
                               const Tensor& inp, const Tensor& weight, const Tensor& bias);
// dinp (N, C) = dout @ weight (written); dweight (OC, C) += dout^T @ inp; dbias (OC) += sum
// over rows of dout. Each output may be undefined and is then skipped, so a backward can
// compute dinp now and the parameter gradients later, with the same bits.
absl::Status LinearBackward(Stream& s, const Tensor& dinp, const Tensor& dweight,
                            const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                            const Tensor& weight);

// ---- elementwise ----------------------------------------------------------------------------

// GELU, tanh approximation (GPT-2's). out and inp may be the same tensor. Any float.
absl::Status GeluForward(Stream& s, const Tensor& out, const Tensor& inp);
// dinp = dout * GELU'(inp). Any float.
absl::Status GeluBackward(Stream& s, const Tensor& dinp, const Tensor& inp, const Tensor& dout);
// Bias add then GELU in one pass: pre = x + bias (row-broadcast, bias (C)), out = GELU(pre);
// pre may be undefined when backward does not need it. Any float.
absl::Status BiasGeluForward(Stream& s, const Tensor& out, const Tensor& pre, const Tensor& x,
                             const Tensor& bias);
// out = max(inp, 0) (a nan stays a nan). Any float.
absl::Status ReluForward(Stream& s, const Tensor& out, const Tensor& inp);
// dinp = dout where out > 0, else 0 (out is the forward's output). Any float.
absl::Status ReluBackward(Stream& s, const Tensor& dinp, const Tensor& out, const Tensor& dout);
// x (N, C) += bias (C), every row. Any float.
absl::Status BiasAdd(Stream& s, const Tensor& x, const Tensor& bias);
// out = a + b (same shape). Any float.
absl::Status Add(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b);
// y += alpha * x. Any float.
absl::Status Axpy(Stream& s, const Tensor& y, float alpha, const Tensor& x);
// x *= alpha. Any float.
absl::Status Scale(Stream& s, const Tensor& x, float alpha);
// out = in, converted between f32, bf16 and f16 (round to nearest even).
absl::Status Cast(Stream& s, const Tensor& out, const Tensor& in);
// Every element of x set to value. Any float.
absl::Status Fill(Stream& s, const Tensor& x, float value);

// ---- normalization, softmax -----------------------------------------------------------------

// out (N, C) = (inp - mean) * rstd * weight + bias over the last dimension; mean (N) and
// rstd (N) are f32 and kept for backward. eps = 1e-5. Any float for inp/out/weight/bias.
// The variance is the biased one (divided by C), as PyTorch's; inp, out, weight and bias
// share one dtype.
absl::Status LayerNormForward(Stream& s, const Tensor& out, const Tensor& mean,
                              const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias);
// dinp (N, C) written; dweight (C) and dbias (C) accumulate. Each output may be undefined
// and is then skipped (the same bits for the others as when all are computed).
absl::Status LayerNormBackward(Stream& s, const Tensor& dinp, const Tensor& dweight,
                               const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight, const Tensor& mean, const Tensor& rstd);
// Residual add fused with the layernorm after it: residual = a + b, then
// out = LayerNorm(residual). Saves a pass over memory. Any float.
absl::Status ResidualLayerNormForward(Stream& s, const Tensor& residual, const Tensor& out,
                                      const Tensor& mean, const Tensor& rstd, const Tensor& a,
                                      const Tensor& b, const Tensor& weight, const Tensor& bias);
// out (N, C) = softmax over the last dimension, f32 math. Any float.
absl::Status SoftmaxForward(Stream& s, const Tensor& out, const Tensor& inp);
// dinp = out * (dout - sum(dout * out)) per row. Any float.
absl::Status SoftmaxBackward(Stream& s, const Tensor& dinp, const Tensor& out,
                             const Tensor& dout);

// ---- attention ------------------------------------------------------------------------------

// Causal multi-head self-attention over qkv (B, T, 3C) laid out [q | k | v], heads
// contiguous in each: out (B, T, C); att (B, NH, T, T) keeps the softmax probabilities for
// backward (f32). Scores are scaled by 1/sqrt(hs); position t attends to 0..t. Any float
// for qkv/out.
absl::Status AttentionForward(Stream& s, const Tensor& out, const Tensor& att,
                              const Tensor& qkv, int num_heads);
// dqkv (B, T, 3C) written, from dout (B, T, C), qkv and att of the forward.
absl::Status AttentionBackward(Stream& s, const Tensor& dqkv, const Tensor& dout,
                               const Tensor& qkv, const Tensor& att, int num_heads);
// The same attention as FlashAttention computes it (Dao et al.): out as AttentionForward's,
// and only lse (B, NH, T) f32, each query row's log-sum-exp of its scaled scores, is kept for
// backward, which recomputes the probabilities: O(T) memory per head instead of O(T^2), and on
// CUDA (bf16/f16, hs 32, 64 or 128) tensor-core kernels that never write the scores to
// memory. Any float for qkv/out.
absl::Status FlashAttentionForward(Stream& s, const Tensor& out, const Tensor& lse,
                                   const Tensor& qkv, int num_heads);
// dqkv (B, T, 3C) written, from dout (B, T, C) and the forward's qkv, out and lse.
absl::Status FlashAttentionBackward(Stream& s, const Tensor& dqkv, const Tensor& dout,
                                    const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                    int num_heads);

// One query attending to a cache of keys and values, for generation a token at a time: the k
// and v of qkv (1, 3C) ([q | k | v], as above) are written to row `pos` of k_cache and v_cache
// (NH, maxT, hs), then out (1, C) = softmax(q k^T / sqrt(hs)) v over the cache's rows
// 0..pos of each head: the last row of causal attention over the sequence the cache holds.
// Its work and memory traffic are O(pos * C); rows after pos are neither read nor written.
// Any float (out, the caches and qkv one dtype); 0 <= pos < maxT.
absl::Status CachedAttentionForward(Stream& s, const Tensor& out, const Tensor& k_cache,
                                    const Tensor& v_cache, const Tensor& qkv, int64_t pos,
                                    int num_heads);

// The most the attention ops above allocate for their own use (beyond their arguments) on
// `device`'s backend, for qkv (B, T, 3C) in `dtype` with `num_heads` heads: in forward and in
// backward, of standard attention or of FlashAttention (`flash`). The sum of the sizes each
// requests, before the allocator's rounding; known from shapes, for the memory check.
struct AttentionScratch {
  int64_t forward = 0;
  int64_t backward = 0;
};
AttentionScratch AttentionScratchBytes(Device device, DType dtype, int64_t B, int64_t T, int64_t C,
                                       int num_heads, bool flash);

// ---- embedding and loss ---------------------------------------------------------------------

// out (B, T, C) = wte[tokens[b, t]] + wpe[t]; tokens (B, T) i32, wte (V, C), wpe (maxT, C)
// with maxT >= T (wpe may be undefined: no position embedding). Token ids out of [0, vocab)
// are an error on the CPU and produce zeros on CUDA (checked on the host by the data loader).
// A vocabulary-parallel slice of the table (Megatron's VocabParallelEmbedding): wte's rows are
// tokens [vocab_begin, vocab_begin + V) of a `vocab`-token table (vocab -1: V, the whole
// table), and a token outside the slice gives wpe[t] alone (or zeros without wpe).
absl::Status EmbeddingForward(Stream& s, const Tensor& out, const Tensor& tokens,
                              const Tensor& wte, const Tensor& wpe, int64_t vocab_begin = 0,
                              int64_t vocab = -1);
// dwte += scatter of dout by token; dwpe += sum over batch of dout (if defined). f32 grads.
// dwpe (maxT, C) with maxT >= T; only its first T rows change. Token ids out of [0, vocab) are
// an error on the CPU, as in the forward; with a slice, tokens outside it add nothing to dwte.
absl::Status EmbeddingBackward(Stream& s, const Tensor& dwte, const Tensor& dwpe,
                               const Tensor& dout, const Tensor& tokens, int64_t vocab_begin = 0,
                               int64_t vocab = -1);

// Softmax cross-entropy fused with its backward, one pass over the logits (after llm.c's
// fused classifier): losses (N) f32 get -log softmax(logits)[target]; when dlogits is
// defined it gets (softmax - onehot(target)) * dloss_scale (dloss_scale = 1/N for a mean
// loss, times the loss scale under mixed precision). logits (N, V) any float; targets (N)
// i32 in [0, V); a target of -1 is ignored (loss 0, gradient 0). dlogits may be the same
// tensor as logits (the model computes the gradient in place to save N * V memory). On the
// CPU a target outside [0, V) other than -1 is an error naming its row.
// `vocab` (default -1: all V columns) is the real vocabulary when the logits' rows are padded
// past it (llm.c's V and Vp: GPT-2's 50257 padded to 50304): the softmax and the loss run over
// the first `vocab` columns only, targets must be below it, and the padded columns' gradient
// is 0. With vocab = V the results are those of the default, bit for bit.
absl::Status SoftmaxCrossEntropy(Stream& s, const Tensor& losses, const Tensor& dlogits,
                                 const Tensor& logits, const Tensor& targets,
                                 float dloss_scale, int64_t vocab = -1);

// Vocabulary-parallel cross-entropy (Megatron's _VocabParallelCrossEntropy): each rank of a
// tensor-parallel group holds logits (N, Vl) for the tokens [vocab_begin, vocab_begin + Vl)
// of the vocabulary, of which the first `columns` (0 <= columns <= Vl) are real and the rest
// padding; the full rows are never gathered. In three steps, the caller reducing between
// them over the group:
//   CrossEntropyRowMax: max (N) f32 = each row's largest real logit (-inf with no column);
//     then all-reduce max;
//   CrossEntropyPartials: partials (2, N) f32 = [sum over real columns of exp(logit - max),
//     the target's logit where the target is in this slice, else 0]; then all-reduce sum;
//   VocabParallelCrossEntropy: losses (N) f32 = log(sum) + max - target's logit, and when
//     dlogits is defined (it may be logits itself) (softmax - onehot(target)) * dloss_scale
//     over the real columns, 0 over the padding.
// Targets (N) i32, global token ids; -1 is ignored (loss 0, gradient 0). With one rank
// (vocab_begin 0) the losses and gradients are SoftmaxCrossEntropy's up to rounding.
absl::Status CrossEntropyRowMax(Stream& s, const Tensor& max, const Tensor& logits,
                                int64_t columns);
absl::Status CrossEntropyPartials(Stream& s, const Tensor& partials, const Tensor& logits,
                                  const Tensor& max, const Tensor& targets, int64_t vocab_begin,
                                  int64_t columns);
absl::Status VocabParallelCrossEntropy(Stream& s, const Tensor& losses, const Tensor& dlogits,
                                       const Tensor& logits, const Tensor& max,
                                       const Tensor& partials, const Tensor& targets,
                                       float dloss_scale, int64_t vocab_begin, int64_t columns);

// ---- reductions -----------------------------------------------------------------------------

// out (1) f32 = sum of x. Any float.
absl::Status Sum(Stream& s, const Tensor& out, const Tensor& x);
// out (1) f32 += sum of x^2 (so several tensors' squares accumulate into one global norm).
// Any float. Non-finite values propagate (inf/nan detection for loss scaling uses this).
absl::Status SumSquaresAccumulate(Stream& s, const Tensor& out, const Tensor& x);

// ---- optimizers over flat f32 buffers -------------------------------------------------------

struct AdamWConfig {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: param -= lr * wd * param
  int step = 1;               // 1-based, for bias correction
  float grad_scale = 1.0f;    // gradients are multiplied by this first (unscale, clipping)
};
// One AdamW step over params, grads, m, v (all f32, same numel). When params_low (bf16 or
// f16, same numel) is defined it receives a low-precision copy of the new params in the same
// pass (mixed-precision training keeps f32 master weights). When grad_scale (1) f32 is
// defined, the gradients are multiplied by its value too, read on the device as the update
// runs (a clipping factor computed there, GradScale's), and a value that is not finite skips
// the update: nothing is written (as a fused optimizer given found_inf). As PyTorch's AdamW,
// the config is refused unless step >= 1, lr, eps and weight_decay are finite and >= 0 and
// the betas are in [0, 1).
absl::Status AdamWUpdate(Stream& s, const Tensor& params, const Tensor& grads, const Tensor& m,
                         const Tensor& v, const AdamWConfig& c,
                         const Tensor& params_low = Tensor(),
                         const Tensor& grad_scale = Tensor());

struct SgdConfig {
  float lr = 0.01f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;  // L2, added to the gradient (PyTorch's SGD)
  float grad_scale = 1.0f;
};
// buf = momentum * buf + (grad * grad_scale + wd * param); param -= lr * buf. All f32, same
// numel; params_low and grad_scale (1) as in AdamWUpdate; lr, momentum and weight_decay
// finite and >= 0.
absl::Status SgdMomentumUpdate(Stream& s, const Tensor& params, const Tensor& grads,
                               const Tensor& momentum_buf, const SgdConfig& c,
                               const Tensor& params_low = Tensor(),
                               const Tensor& grad_scale = Tensor());

// scale (1) f32 = the factor the optimizers multiply gradients by at the end of a step,
// computed on the device so that clipping needs no host read: `unscale` (1 / the loss scale)
// times the clipping factor that brings the global norm, sqrt(sumsq * unscale^2), down to
// clip_norm (clip_norm / (norm + 1e-6) above it; 1 within it or when clip_norm is 0), or nan
// when sumsq * unscale^2 is not finite, so that the update is skipped. sumsq (1) f32 is the sum of the
// squared (scaled) gradients.
absl::Status GradScale(Stream& s, const Tensor& scale, const Tensor& sumsq, float unscale,
                       float clip_norm);

// ---- CPU instruction sets -------------------------------------------------------------------

// The CPU ops are compiled for several x86-64 instruction sets, and the widest one the CPU runs
// is used (other builds have kBase only). Every variant gives bit-identical results: the choice
// changes speed, never a number.
enum class CpuIsa { kBase, kAvx2, kAvx512 };
const char* CpuIsaName(CpuIsa isa);  // "base", "avx2", "avx512"
CpuIsa BestCpuIsa();                 // the widest variant this build has and this CPU runs
CpuIsa CpuIsaInUse();
// Every later CPU op, on every thread, runs `isa` (benchmarks compare variants with it). An
// error, changing nothing, if isa is wider than BestCpuIsa().
absl::Status UseCpuIsa(CpuIsa isa);

}  // namespace ops
}  // namespace tandem

#endif  // TANDEM_RUNTIME_OPS_H_
