#include "model/config.h"

#include "absl/strings/str_format.h"
#include "runtime/status.h"

namespace tandem {

absl::StatusOr<Attention> ParseAttention(absl::string_view name) {
  if (name == "standard") return Attention::kStandard;
  if (name == "flash") return Attention::kFlash;
  return absl::InvalidArgumentError(
      absl::StrFormat("--attention=%s: use standard or flash", name));
}

const char* AttentionName(Attention a) {
  return a == Attention::kFlash ? "flash" : "standard";
}

int64_t ModelConfig::num_params() const {
  const int64_t C = d_model, V = vocab;
  if (kind == ModelKind::kMlp) {
    // embedding (V, C); per layer (C, C) + C; head (V, C) + V
    return V * C + n_layer * (C * C + C) + V * C + V;
  }
  const int64_t per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C +
                            (4 * C * C + 4 * C) + (4 * C * C + C);
  return V * C + static_cast<int64_t>(seq_len) * C + n_layer * per_layer + 2 * C + V * C;
}

int64_t ModelConfig::num_matmul_params() const {
  const int64_t embedding = static_cast<int64_t>(vocab) * d_model;
  const int64_t positions = kind == ModelKind::kGpt ? static_cast<int64_t>(seq_len) * d_model : 0;
  return num_params() - embedding - positions;
}

std::string ModelConfig::ToString() const {
  if (kind == ModelKind::kMlp) {
    return absl::StrFormat("%s: mlp, %d layers, width %d, seq %d, vocab %d, %.2fM parameters",
                           name, n_layer, d_model, seq_len, vocab, num_params() / 1e6);
  }
  return absl::StrFormat(
      "%s: gpt, %d layers, d_model %d, %d heads, seq %d, vocab %d, %.2fM parameters%s", name,
      n_layer, d_model, n_head, seq_len, vocab, num_params() / 1e6,
      attention == Attention::kFlash ? ", flash attention" : "");
}

absl::Status ModelConfig::Validate() const {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrFormat("model %s: %s", name, what));
  };
  if (n_layer < 1) return bad(absl::StrFormat("--n-layer=%d: need at least 1", n_layer));
  if (d_model < 1) return bad(absl::StrFormat("--d-model=%d: need at least 1", d_model));
  if (seq_len < 1) return bad(absl::StrFormat("--seq-len=%d: need at least 1", seq_len));
  if (vocab < 2) return bad(absl::StrFormat("--vocab=%d: need at least 2", vocab));
  if (data_vocab != 0 && (data_vocab < 2 || data_vocab > vocab)) {
    return bad(absl::StrFormat("the data's vocabulary %d is not in [2, %d], the model's",
                               data_vocab, vocab));
  }
  if (kind == ModelKind::kGpt && (n_head < 1 || d_model % n_head != 0)) {
    return bad(absl::StrFormat("--n-head=%d must divide --d-model=%d", n_head, d_model));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ModelPreset(absl::string_view name, int n_layer, int d_model,
                                        int n_head, int seq_len, absl::string_view attention) {
  ASSIGN_OR_RETURN(ModelConfig m, ModelPreset(name));
  if (n_layer) m.n_layer = n_layer;
  if (d_model) m.d_model = d_model;
  if (n_head) m.n_head = n_head;
  if (seq_len) m.seq_len = seq_len;
  ASSIGN_OR_RETURN(m.attention, ParseAttention(attention));
  return m;
}

absl::StatusOr<ModelConfig> ModelPreset(absl::string_view name) {
  ModelConfig c;
  c.name = std::string(name);
  if (name == "gpt-tiny" || name == "gpt") return c;
  if (name == "gpt2-small") {
    c.n_layer = 12;
    c.n_head = 12;
    c.d_model = 768;
    c.seq_len = 1024;
    // GPT-2's 50257-token vocabulary padded to 50304, a multiple of 64 (as nanoGPT and llm.c
    // do), so the head's matmuls have tensor-core-friendly sizes and 16-byte aligned rows;
    // the padding ids are never targets, and with the data's vocabulary known (--vocab, an
    // llm.c shard's kind) their logits are masked out of the softmax. The 124M
    // model's sizes, with an untied head (163M parameters, 124M of them in matmuls).
    c.vocab = 50304;
    return c;
  }
  if (name == "mlp") {
    c.kind = ModelKind::kMlp;
    c.n_layer = 4;
    c.d_model = 512;
    c.n_head = 1;
    return c;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown model '%s': use gpt-tiny, gpt2-small, gpt or mlp", name));
}

}  // namespace tandem
