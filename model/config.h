// Model configurations: a GPT (GPT-2 style, pre-LayerNorm) or an MLP language model, both
// over the same byte tokens, and the named presets users pick with --model.
#ifndef TANDEM_MODEL_CONFIG_H_
#define TANDEM_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

enum class ModelKind { kGpt, kMlp };

// How a GPT block computes attention: kStandard keeps the softmax probabilities (B, NH, T, T)
// for backward (ops::AttentionForward); kFlash keeps each row's log-sum-exp (B, NH, T) and
// recomputes them (ops::FlashAttentionForward, on CUDA one tensor-core kernel). The same
// results up to rounding.
enum class Attention { kStandard, kFlash };
// "standard" or "flash"; the error names the choices.
absl::StatusOr<Attention> ParseAttention(absl::string_view name);
const char* AttentionName(Attention a);

struct ModelConfig {
  ModelKind kind = ModelKind::kGpt;
  std::string name = "gpt-tiny";
  int n_layer = 8;     // GPT: transformer blocks; MLP: hidden layers (depth)
  int n_head = 4;      // GPT only
  int d_model = 128;   // GPT: channels; MLP: width
  int seq_len = 64;    // tokens per sample
  int vocab = 256;     // bytes, or the data's padded (JobConfig::Model); MLP: also the classes
  // The data's vocabulary when `vocab` pads it (GPT-2's 50257 of 50304): the head's softmax
  // and loss leave the padded logits out. 0: all of `vocab` is real. Shapes, parameter counts
  // and checkpoints depend on `vocab` alone.
  int data_vocab = 0;
  Attention attention = Attention::kStandard;  // GPT only
  // The head's projection is the token embedding's table "embed.wte" (GPT-2's tying): no
  // "head.weight". A pipeline's last stage holds a copy, kept equal to the first stage's by
  // summing their gradients every step (DistributedTrainer's embedding group).
  bool tie_embeddings = false;

  // Blocks in order: embedding, n_layer layers, head.
  int num_blocks() const { return n_layer + 2; }
  // Parameters in all blocks.
  int64_t num_params() const;
  // Those that take part in a matmul: all but the position table and, untied, the token
  // table, which are only looked up; tied, the token table is the head's weight and counts
  // once. The N of the usual 6 N FLOPs per trained token (forward 2 N, backward 4 N;
  // attention's score and value products are left out), as in MFU. For gpt2-small (tied)
  // 124.48M less the 0.79M position table.
  int64_t num_matmul_params() const;
  // "gpt-tiny: gpt, 8 layers, d_model 128, 4 heads, seq 64, vocab 256, 1.65M parameters",
  // with ", tied" after the count when the embeddings are tied.
  std::string ToString() const;
  // Checks every size (positive, heads divide d_model, ...); the error says which and why.
  absl::Status Validate() const;
};

// The configuration a ToString() text describes (a checkpoint records its model so); the
// error says what in it did not read.
absl::StatusOr<ModelConfig> ParseModelDescription(absl::string_view text);

// "gpt-tiny" (the default), "gpt2-small" (GPT-2 124M: its sizes and tied embeddings, the
// vocabulary padded to 50304), "gpt" and "mlp" (sizes from flags, starting from gpt-tiny's
// and mlp's defaults: depth 4, width 512). Only gpt2-small is tied by default.
absl::StatusOr<ModelConfig> ModelPreset(absl::string_view name);
// The preset with each size that is not 0 put in its place, the attention parsed and the
// embeddings tied if `tie_embeddings` (or the preset ties them) (as flags set them); the sizes
// are not validated.
absl::StatusOr<ModelConfig> ModelPreset(absl::string_view name, int n_layer, int d_model,
                                        int n_head, int seq_len, absl::string_view attention,
                                        bool tie_embeddings = false);

}  // namespace tandem

#endif  // TANDEM_MODEL_CONFIG_H_
