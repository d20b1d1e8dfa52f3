// Generation with a key/value cache (model/generate.h). The per-position step mirrors
// TransformerBlock::Forward and HeadBlock::Forward (model/blocks.cc) for one row, with
// CachedAttentionForward in place of attention over the whole sequence; the parameter views
// are the blocks' own, in their Params() order.
#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_format.h"
#include "runtime/ops.h"
#include "runtime/status.h"

namespace tandem {
namespace {

// The parameters of a TransformerBlock and of a GPT's HeadBlock, in their Params() order.
enum Layer { kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW,
             kFcProjB };
enum Head { kHeadLnW, kHeadLnB, kHeadW };

absl::StatusOr<Tensor> F32(Device d, const Shape& shape) {
  return Tensor::Empty(shape, DType::kF32, d);
}

// logits (N, V) = head(x (N, C)): the final LayerNorm and the vocabulary projection.
absl::Status HeadLogits(Stream& s, const std::vector<Tensor>& p, const Tensor& x,
                        const Tensor& logits) {
  const int64_t N = x.dim(0), C = x.dim(1);
  ASSIGN_OR_RETURN(Tensor h, F32(x.device(), {N, C}));
  ASSIGN_OR_RETURN(Tensor mean, F32(x.device(), {N}));
  ASSIGN_OR_RETURN(Tensor rstd, F32(x.device(), {N}));
  RETURN_IF_ERROR(ops::LayerNormForward(s, h, mean, rstd, x, p[kHeadLnW], p[kHeadLnB]));
  return ops::LinearForward(s, logits, h, p[kHeadW], Tensor());
}

}  // namespace

absl::StatusOr<std::unique_ptr<GptWeights>> GptWeights::Create(const ModelConfig& config,
                                                               Device device, uint64_t seed) {
  RETURN_IF_ERROR(config.Validate());
  if (config.kind != ModelKind::kGpt) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model %s is an MLP: generation needs a GPT (its positions and attention)", config.name));
  }
  std::unique_ptr<GptWeights> w(new GptWeights(config, device));
  w->blocks_ = BuildBlocks(config);
  // Each parameter once (a tied head reads the embedding's table), as a whole-model stage.
  std::vector<std::vector<size_t>> block_params;
  std::vector<ParamSpec> specs =
      StageParams(w->blocks_, 0, static_cast<int>(w->blocks_.size()), &block_params);
  w->layout_ = std::make_unique<ParamLayout>(std::move(specs));
  ASSIGN_OR_RETURN(w->params_, FlatBuffer::Create(*w->layout_, DType::kF32, device));
  RETURN_IF_ERROR(InitializeParams(*w->layout_, w->params_, seed));
  for (const std::vector<size_t>& indices : block_params) {
    std::vector<Tensor> views;
    for (size_t i : indices) views.push_back(w->params_.view(i));
    w->block_params_.push_back(std::move(views));
  }
  return w;
}

absl::StatusOr<std::unique_ptr<KvCacheDecoder>> KvCacheDecoder::Create(const GptWeights& w) {
  const ModelConfig& c = w.config();
  std::unique_ptr<KvCacheDecoder> d(new KvCacheDecoder(w));
  ASSIGN_OR_RETURN(d->stream_, Stream::Compute(w.device()));
  const int64_t hs = c.d_model / c.n_head;
  for (int l = 0; l < c.n_layer; ++l) {
    ASSIGN_OR_RETURN(Tensor k, F32(w.device(), {c.n_head, c.seq_len, hs}));
    ASSIGN_OR_RETURN(Tensor v, F32(w.device(), {c.n_head, c.seq_len, hs}));
    d->k_cache_.push_back(std::move(k));
    d->v_cache_.push_back(std::move(v));
  }
  return d;
}

absl::StatusOr<std::vector<float>> KvCacheDecoder::Step(int32_t token) {
  const ModelConfig& c = w_.config();
  if (position_ >= c.seq_len) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the key/value cache is full: %d positions, the model's seq_len", c.seq_len));
  }
  if (token < 0 || token >= c.vocab) {
    return absl::InvalidArgumentError(
        absl::StrFormat("token %d is outside the model's vocabulary [0, %d)", token, c.vocab));
  }
  Stream& s = *stream_;
  const Device dev = w_.device();
  const int64_t C = c.d_model, pos = position_;
  // The embedding of `token` at `pos`: the position table seen from row pos.
  const std::vector<Tensor>& emb = w_.block(0);
  ASSIGN_OR_RETURN(Tensor tokens, Tensor::FromInts({token}, {1, 1}, dev));
  ASSIGN_OR_RETURN(Tensor wpe_row, emb[1].View(pos * C, {1, C}));
  ASSIGN_OR_RETURN(Tensor x, F32(dev, {1, C}));
  ASSIGN_OR_RETURN(Tensor x3, x.Reshape({1, 1, C}));
  RETURN_IF_ERROR(ops::EmbeddingForward(s, x3, tokens, emb[0], wpe_row));
  ASSIGN_OR_RETURN(Tensor mean, F32(dev, {1}));
  ASSIGN_OR_RETURN(Tensor rstd, F32(dev, {1}));
  for (int l = 0; l < c.n_layer; ++l) {
    const std::vector<Tensor>& p = w_.block(1 + l);
    ASSIGN_OR_RETURN(Tensor ln1, F32(dev, {1, C}));
    RETURN_IF_ERROR(ops::LayerNormForward(s, ln1, mean, rstd, x, p[kLn1W], p[kLn1B]));
    ASSIGN_OR_RETURN(Tensor qkv, F32(dev, {1, 3 * C}));
    RETURN_IF_ERROR(ops::LinearForward(s, qkv, ln1, p[kQkvW], p[kQkvB]));
    ASSIGN_OR_RETURN(Tensor atty, F32(dev, {1, C}));
    RETURN_IF_ERROR(ops::CachedAttentionForward(s, atty, k_cache_[l], v_cache_[l], qkv, pos,
                                                c.n_head));
    ASSIGN_OR_RETURN(Tensor proj, F32(dev, {1, C}));
    RETURN_IF_ERROR(ops::LinearForward(s, proj, atty, p[kProjW], p[kProjB]));
    ASSIGN_OR_RETURN(Tensor res2, F32(dev, {1, C}));
    ASSIGN_OR_RETURN(Tensor ln2, F32(dev, {1, C}));
    RETURN_IF_ERROR(ops::ResidualLayerNormForward(s, res2, ln2, mean, rstd, x, proj, p[kLn2W],
                                                  p[kLn2B]));
    ASSIGN_OR_RETURN(Tensor fc_pre, F32(dev, {1, 4 * C}));
    ASSIGN_OR_RETURN(Tensor fc_act, F32(dev, {1, 4 * C}));
    RETURN_IF_ERROR(ops::LinearGeluForward(s, fc_act, fc_pre, ln2, p[kFcW], p[kFcB]));
    ASSIGN_OR_RETURN(Tensor fc_out, F32(dev, {1, C}));
    RETURN_IF_ERROR(ops::LinearForward(s, fc_out, fc_act, p[kFcProjW], p[kFcProjB]));
    ASSIGN_OR_RETURN(Tensor y, F32(dev, {1, C}));
    RETURN_IF_ERROR(ops::Add(s, y, res2, fc_out));
    x = y;
  }
  ASSIGN_OR_RETURN(Tensor logits, F32(dev, {1, c.vocab}));
  RETURN_IF_ERROR(HeadLogits(s, w_.block(c.n_layer + 1), x, logits));
  ++position_;
  return logits.ToFloatVector();
}

absl::StatusOr<Tensor> FullForwardLogits(const GptWeights& w, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = w.config();
  const int64_t T = static_cast<int64_t>(tokens.size());
  if (T < 1 || T > c.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d tokens: the forward takes 1 to seq_len = %d", T, c.seq_len));
  }
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(w.device()));
  MicroBatch mb;
  ASSIGN_OR_RETURN(mb.tokens, Tensor::FromInts(tokens, {1, T}, w.device()));
  // The embedding and every layer, as training runs them (their saved activations dropped).
  Tensor x;
  for (int b = 0; b <= c.n_layer; ++b) {
    Tensor y;
    Saved saved;
    RETURN_IF_ERROR(w.blocks()[b]->Forward(*s, w.block(b), mb, x, &y, &saved));
    x = y;
  }
  ASSIGN_OR_RETURN(Tensor x2, x.Reshape({T, c.d_model}));
  ASSIGN_OR_RETURN(Tensor logits, F32(w.device(), {T, c.vocab}));
  RETURN_IF_ERROR(HeadLogits(*s, w.block(c.n_layer + 1), x2, logits));
  return logits;
}

int32_t SampleToken(const std::vector<float>& logits, int vocab, const SamplingOptions& o,
                    Rng& rng) {
  const int n = std::max(1, std::min(vocab, static_cast<int>(logits.size())));
  const int k = o.top_k <= 0 ? n : std::min(o.top_k, n);
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  const auto higher = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (o.temperature <= 0.0f) return *std::min_element(ids.begin(), ids.end(), higher);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), higher);
  // softmax(logits / temperature) over the k candidates, in double, shifted by the largest.
  std::vector<double> cumulative(k);
  double total = 0;
  for (int i = 0; i < k; ++i) {
    total += std::exp((static_cast<double>(logits[ids[i]]) - logits[ids[0]]) / o.temperature);
    cumulative[i] = total;
  }
  const double u = static_cast<double>(rng.Next() >> 11) * (1.0 / 9007199254740992.0) * total;
  const int chosen = static_cast<int>(
      std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin());
  return ids[std::min(chosen, k - 1)];
}

absl::StatusOr<std::vector<int32_t>> Generate(const GptWeights& w,
                                              const std::vector<int32_t>& prompt,
                                              const GenerateOptions& o,
                                              const std::function<void(int32_t)>& on_token) {
  const ModelConfig& c = w.config();
  if (prompt.empty()) {
    return absl::InvalidArgumentError("the prompt is empty: generation starts from a token");
  }
  std::unique_ptr<KvCacheDecoder> decoder;
  if (o.use_cache) {
    ASSIGN_OR_RETURN(decoder, KvCacheDecoder::Create(w));
  }
  std::vector<int32_t> context;  // what the model sees: positions 0.. of the cache
  // Appends `token` to the context, sliding it first when full; the logits after it (only
  // where `want_logits`, or with the cache, which runs every position anyway).
  auto feed = [&](int32_t token, bool want_logits) -> absl::StatusOr<std::vector<float>> {
    if (static_cast<int>(context.size()) == c.seq_len) {
      context.erase(context.begin(), context.end() - c.seq_len / 2);
      if (decoder != nullptr) {
        decoder->Reset();
        for (int32_t t : context) RETURN_IF_ERROR(decoder->Step(t).status());
      }
    }
    context.push_back(token);
    if (decoder != nullptr) return decoder->Step(token);
    if (!want_logits) return std::vector<float>();
    ASSIGN_OR_RETURN(Tensor logits, FullForwardLogits(w, context));
    ASSIGN_OR_RETURN(Tensor last, logits.View((context.size() - 1) * c.vocab, {c.vocab}));
    return last.ToFloatVector();
  };
  std::vector<float> logits;
  for (size_t i = 0; i < prompt.size(); ++i) {
    ASSIGN_OR_RETURN(logits, feed(prompt[i], i + 1 == prompt.size()));
  }
  Rng rng(o.seed);
  const int vocab = o.vocab > 0 ? std::min(o.vocab, c.vocab) : c.vocab;
  std::vector<int32_t> out;
  for (int i = 0; i < o.tokens; ++i) {
    const int32_t next = SampleToken(logits, vocab, o.sampling, rng);
    out.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 < o.tokens) {
      ASSIGN_OR_RETURN(logits, feed(next, true));
    }
  }
  return out;
}

}  // namespace tandem
