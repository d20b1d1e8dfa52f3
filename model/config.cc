#include "model/config.h"

#include <cstdio>
#include <string>

#include "absl/strings/match.h"
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
    // embedding (V, C); per layer (C, C) + C; head (V, C) unless tied, + V
    return V * C + n_layer * (C * C + C) + (tie_embeddings ? 0 : V * C) + V;
  }
  const int64_t per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C +
                            (4 * C * C + 4 * C) + (4 * C * C + C);
  return V * C + static_cast<int64_t>(seq_len) * C + n_layer * per_layer + 2 * C +
         (tie_embeddings ? 0 : V * C);
}

int64_t ModelConfig::num_matmul_params() const {
  // Tied, the token table is the head's weight: multiplied, and counted once.
  const int64_t embedding = tie_embeddings ? 0 : static_cast<int64_t>(vocab) * d_model;
  const int64_t positions = kind == ModelKind::kGpt ? static_cast<int64_t>(seq_len) * d_model : 0;
  return num_params() - embedding - positions;
}

std::string ModelConfig::ToString() const {
  const char* tied = tie_embeddings ? ", tied" : "";
  if (kind == ModelKind::kMlp) {
    return absl::StrFormat("%s: mlp, %d layers, width %d, seq %d, vocab %d, %.2fM parameters%s",
                           name, n_layer, d_model, seq_len, vocab, num_params() / 1e6, tied);
  }
  return absl::StrFormat(
      "%s: gpt, %d layers, d_model %d, %d heads, seq %d, vocab %d, %.2fM parameters%s%s", name,
      n_layer, d_model, n_head, seq_len, vocab, num_params() / 1e6, tied,
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

absl::StatusOr<ModelConfig> ParseModelDescription(absl::string_view text) {
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrFormat("model description '%s' does not read: %s", text, why));
  };
  const size_t colon = text.find(": ");
  if (colon == absl::string_view::npos) return bad("no 'name: ' at its start");
  ModelConfig c;
  c.name = std::string(text.substr(0, colon));
  const std::string rest(text.substr(colon + 2));
  char kind[8] = {};
  int n = 0;
  if (std::sscanf(rest.c_str(), "%7[a-z], %d layers, %n", kind, &c.n_layer, &n) != 2) {
    return bad("expected '<kind>, <n> layers, ...'");
  }
  const std::string sizes = rest.substr(n);
  if (std::string(kind) == "gpt") {
    if (std::sscanf(sizes.c_str(), "d_model %d, %d heads, seq %d, vocab %d", &c.d_model,
                    &c.n_head, &c.seq_len, &c.vocab) != 4) {
      return bad("expected 'd_model <C>, <NH> heads, seq <T>, vocab <V>' after the layers");
    }
    if (absl::EndsWith(text, ", flash attention")) c.attention = Attention::kFlash;
  } else if (std::string(kind) == "mlp") {
    c.kind = ModelKind::kMlp;
    if (std::sscanf(sizes.c_str(), "width %d, seq %d, vocab %d", &c.d_model, &c.seq_len,
                    &c.vocab) != 3) {
      return bad("expected 'width <C>, seq <T>, vocab <V>' after the layers");
    }
  } else {
    return bad("the kind is neither gpt nor mlp");
  }
  c.tie_embeddings = absl::StrContains(text, " parameters, tied");
  if (c.ToString() != text) return bad("it is not what those sizes describe");
  return c;
}

absl::StatusOr<ModelConfig> ModelPreset(absl::string_view name, int n_layer, int d_model,
                                        int n_head, int seq_len, absl::string_view attention,
                                        bool tie_embeddings) {
  ASSIGN_OR_RETURN(ModelConfig m, ModelPreset(name));
  if (tie_embeddings) m.tie_embeddings = true;
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
    // llm.c shard's kind) their logits are masked out of the softmax. The head is the token
    // embedding, as GPT-2's: 124,475,904 parameters (GPT-2's 124,439,808 with the 47 padding
    // rows).
    c.vocab = 50304;
    c.tie_embeddings = true;
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
