// The GPT model's parameters in Hugging Face's GPT2LMHeadModel names and layout, both ways,
// so that transformers loads a model Tandem trained and Tandem trains from a transformers
// file (a safetensors file with a config.json beside it).
//
//   ours                          Hugging Face                      layout
//   embed.wte       [V, C]        transformer.wte.weight [V', C]    V' rows: the real vocabulary
//   embed.wpe       [T, C]        transformer.wpe.weight [T', C]    T' >= T positions
//   hI.ln1.*, hI.ln2.*            transformer.h.I.ln_1.*, ln_2.*
//   hI.attn.qkv.weight [3C, C]    transformer.h.I.attn.c_attn.weight [C, 3C]  transposed (Conv1D)
//   hI.attn.proj.weight [C, C]    transformer.h.I.attn.c_proj.weight [C, C]   transposed
//   hI.mlp.fc.weight [4C, C]      transformer.h.I.mlp.c_fc.weight [C, 4C]     transposed
//   hI.mlp.proj.weight [C, 4C]    transformer.h.I.mlp.c_proj.weight [4C, C]   transposed
//   hI.*.bias                     the same names' .bias, as they are
//   head.ln.*                     transformer.ln_f.*
//   head.weight     [V, C]        lm_head.weight [V', C]; absent where the file is tied
//
// Our linear weights are [out, in] (llm.c's layout), Conv1D's are [in, out]. The fused qkv's
// rows are Q, then K, then V, each head's hs rows contiguous (ops' attention reads head h of
// Q at columns h*hs of a qkv row, K at C + h*hs, V at 2C + h*hs), which is how GPT2Attention
// splits c_attn's output columns: the transpose is all there is to it. The rest matches
// GPT-2 as transformers computes it: LayerNorm eps 1e-5, GELU's tanh approximation
// ("gelu_new"), attention scores scaled by 1/sqrt(head size), no dropout at inference.
#ifndef TANDEM_MODEL_HF_GPT2_H_
#define TANDEM_MODEL_HF_GPT2_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/params.h"
#include "model/stage.h"
#include "runtime/json.h"
#include "runtime/safetensors.h"

namespace tandem {

// The parameters of a GPT model as Hugging Face tensors. `params` maps our names to values
// (a checkpoint's); every one must be a parameter of `model` of its size. Without
// "head.weight" the model's head is tied to the embedding and the file has no lm_head.
// `vocab` rows of wte and lm_head are kept (the real vocabulary of a padded model; 0: all).
// An MLP model is refused: it has no Hugging Face counterpart.
absl::StatusOr<SafetensorsFile> ExportGpt2(const ModelConfig& model,
                                           const std::map<std::string, std::vector<float>>& params,
                                           int vocab = 0);

// config.json for GPT2LMHeadModel.from_pretrained beside the exported file: the model's sizes,
// vocab_size `vocab` (0: the model's), tie_word_embeddings `tied`, and GPT-2's choices Tandem
// computes with (gelu_new, eps 1e-5, scaled attention, no dropout).
Json Gpt2ConfigJson(const ModelConfig& model, int vocab, bool tied);

// Fills every parameter of `stage` (any blocks of a GPT model) from `file` by name, the
// names with or without transformer.'s prefix. A file with fewer vocabulary rows than the
// model's padded vocabulary fills the rest with zeros; a file with more positions than the
// model's sequence takes the first ones. A head without lm_head in the file (a tied file)
// takes transformer.wte.weight; a tied model (no head.weight) takes no lm_head, and refuses
// a file whose lm_head differs from its wte. Everything is checked before anything changes;
// an error names `what`, the tensor and the fix.
absl::Status LoadGpt2Params(const SafetensorsFile& file, const std::string& what, Stage& stage);
// Reads `path` and loads it as LoadGpt2Params does.
absl::Status InitFromSafetensors(const std::string& path, Stage& stage);

// The launcher's check of --init-from, from the file's header only: every parameter of
// `model` has its tensor, of a size that fits, and the file holds no layer or tensor the
// model lacks (attention's mask buffers aside).
absl::Status CheckGpt2File(const std::string& path, const ModelConfig& model);

}  // namespace tandem

#endif  // TANDEM_MODEL_HF_GPT2_H_
