#include "model/hf_gpt2.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/block.h"
#include "runtime/status.h"

namespace tandem {
namespace {

constexpr char kPrefix[] = "transformer.";
constexpr char kLmHead[] = "lm_head.weight";
constexpr char kWte[] = "transformer.wte.weight";

// A parameter's Hugging Face tensor and how its values are laid out there.
struct HfName {
  std::string name;
  bool transpose = false;  // a Conv1D weight: [in, out] there, [out, in] here
  enum Rows { kSame, kVocab, kPositions } rows = kSame;
};

absl::StatusOr<HfName> HfNameOf(const std::string& ours) {
  static const auto* top = new std::map<std::string, HfName>{
      {"embed.wte", {kWte, false, HfName::kVocab}},
      {"embed.wpe", {"transformer.wpe.weight", false, HfName::kPositions}},
      {"head.ln.weight", {"transformer.ln_f.weight"}},
      {"head.ln.bias", {"transformer.ln_f.bias"}},
      {"head.weight", {kLmHead, false, HfName::kVocab}},
  };
  // A layer's parameters after "hI.": their names after "transformer.h.I.".
  static const auto* layer = new std::map<std::string, HfName>{
      {"ln1.weight", {"ln_1.weight"}},
      {"ln1.bias", {"ln_1.bias"}},
      {"attn.qkv.weight", {"attn.c_attn.weight", true}},
      {"attn.qkv.bias", {"attn.c_attn.bias"}},
      {"attn.proj.weight", {"attn.c_proj.weight", true}},
      {"attn.proj.bias", {"attn.c_proj.bias"}},
      {"ln2.weight", {"ln_2.weight"}},
      {"ln2.bias", {"ln_2.bias"}},
      {"mlp.fc.weight", {"mlp.c_fc.weight", true}},
      {"mlp.fc.bias", {"mlp.c_fc.bias"}},
      {"mlp.proj.weight", {"mlp.c_proj.weight", true}},
      {"mlp.proj.bias", {"mlp.c_proj.bias"}},
  };
  if (auto it = top->find(ours); it != top->end()) return it->second;
  const size_t dot = ours.find('.');
  int i;
  if (ours.size() > 1 && ours[0] == 'h' && dot != std::string::npos &&
      absl::SimpleAtoi(ours.substr(1, dot - 1), &i)) {
    if (auto it = layer->find(ours.substr(dot + 1)); it != layer->end()) {
      HfName n = it->second;
      n.name = absl::StrCat(kPrefix, "h.", i, ".", n.name);
      return n;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("parameter '%s' has no Hugging Face GPT-2 counterpart", ours));
}

absl::Status RefuseMlp(const ModelConfig& m) {
  if (m.kind == ModelKind::kGpt) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "model %s is an MLP, which has no Hugging Face GPT-2 counterpart; only GPT models are "
      "exported to or loaded from safetensors",
      m.name));
}

std::vector<ParamSpec> ModelSpecs(const ModelConfig& m) {
  std::vector<ParamSpec> specs;
  for (const auto& b : BuildBlocks(m)) {
    for (ParamSpec& p : b->Params()) specs.push_back(std::move(p));
  }
  return specs;
}

std::string ShapeText(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

std::string Stripped(const std::string& name) {
  return absl::StartsWith(name, kPrefix) ? name.substr(sizeof(kPrefix) - 1) : name;
}

// Attention's causal-mask buffers, which older transformers saved with the weights.
bool IsMaskBuffer(const std::string& stripped) {
  return absl::EndsWith(stripped, ".attn.bias") || absl::EndsWith(stripped, ".attn.masked_bias");
}

// A file's tensors by name without transformer.'s prefix (GPT2Model saves them without it).
absl::StatusOr<std::map<std::string, const SafetensorsTensor*>> ByName(const SafetensorsFile& f,
                                                                      const std::string& what) {
  std::map<std::string, const SafetensorsTensor*> by_name;
  for (const SafetensorsTensor& t : f.tensors) {
    if (!by_name.emplace(Stripped(t.name), &t).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s holds %s both with and without the '%s' prefix; keep one", what, t.name, kPrefix));
    }
  }
  return by_name;
}

// Where one parameter's values are in the file, its shape checked.
struct Source {
  const SafetensorsTensor* tensor = nullptr;
  HfName hf;
};

absl::StatusOr<Source> SourceOf(const std::map<std::string, const SafetensorsTensor*>& by_name,
                                const ParamSpec& spec, const std::string& what) {
  Source src;
  ASSIGN_OR_RETURN(src.hf, HfNameOf(spec.name));
  auto it = by_name.find(Stripped(src.hf.name));
  // A tied file (transformers drops lm_head when it is wte): the head takes wte.
  if (it == by_name.end() && spec.name == "head.weight") it = by_name.find(Stripped(kWte));
  if (it == by_name.end()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s has no tensor %s for the model's %s %s; is it a GPT-2 model's file?", what,
        src.hf.name, spec.name, spec.shape.ToString()));
  }
  src.tensor = it->second;
  const std::vector<int64_t>& got = src.tensor->shape;
  const std::vector<int64_t> ours = spec.shape.dims();
  bool fits = got.size() == ours.size();
  std::string need = ShapeText(ours);
  if (fits && src.hf.transpose) {
    fits = got[0] == ours[1] && got[1] == ours[0];
    need = ShapeText({ours[1], ours[0]});
  } else if (fits && src.hf.rows != HfName::kSame) {
    const bool vocab = src.hf.rows == HfName::kVocab;
    fits = got[1] == ours[1] && got[0] >= 1 && (vocab ? got[0] <= ours[0] : got[0] >= ours[0]);
    need = absl::StrFormat("[%s%d, %d]", vocab ? "at most " : "at least ", ours[0], ours[1]);
  } else if (fits) {
    fits = got == ours;
  }
  if (!fits) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: tensor %s is %s; the model's %s needs %s: pass the sizes of the model the file "
        "holds (--n-layer, --d-model, --seq-len, --vocab)",
        what, src.tensor->name, ShapeText(got), spec.name, need));
  }
  return src;
}

// The parameter's values in our layout (the file's values read).
std::vector<float> ValuesOf(const Source& src, const ParamSpec& spec) {
  const std::vector<float>& v = src.tensor->values;
  std::vector<float> out(spec.shape.numel(), 0.0f);
  if (src.hf.transpose) {
    const int64_t rows = spec.shape.dim(0), cols = spec.shape.dim(1);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = v[j * rows + i];
    }
  } else {
    // Rows past the file's (a padded vocabulary) stay zero; positions past the model's are left.
    std::copy_n(v.begin(), std::min(v.size(), out.size()), out.begin());
  }
  return out;
}

// Checks every parameter of `specs` against the file; with values read, fills `values` (one
// per spec). `tied`: the model's head uses embed.wte (it has no head.weight).
absl::Status Import(const SafetensorsFile& file, const std::string& what,
                    const std::vector<ParamSpec>& specs, bool tied, bool whole_model,
                    std::vector<std::vector<float>>* values) {
  ASSIGN_OR_RETURN(auto by_name, ByName(file, what));
  std::set<const SafetensorsTensor*> used;
  std::vector<Source> sources;
  for (const ParamSpec& spec : specs) {
    ASSIGN_OR_RETURN(Source src, SourceOf(by_name, spec, what));
    used.insert(src.tensor);
    sources.push_back(src);
  }
  auto lm_head = by_name.find(kLmHead);
  auto wte = by_name.find(Stripped(kWte));
  if (tied && lm_head != by_name.end() && wte != by_name.end()) {
    const SafetensorsTensor& h = *lm_head->second;
    const SafetensorsTensor& e = *wte->second;
    if (h.shape != e.shape || h.values != e.values) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s holds an lm_head.weight that differs from transformer.wte.weight, and this "
          "model's head is tied to its embedding; train a model with its own head, or load a "
          "tied file",
          what));
    }
    used.insert(lm_head->second);
  }
  if (whole_model) {
    for (const auto& [name, t] : by_name) {
      if (used.count(t) || IsMaskBuffer(name)) continue;
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s holds %s %s, which the model has no parameter for: pass the sizes of the model "
          "the file holds (--n-layer, --d-model, --seq-len, --vocab)",
          what, t->name, ShapeText(t->shape)));
    }
  }
  if (values != nullptr) {
    values->clear();
    for (size_t i = 0; i < specs.size(); ++i) values->push_back(ValuesOf(sources[i], specs[i]));
  }
  return absl::OkStatus();
}

bool HasParam(const std::vector<ParamSpec>& specs, const std::string& name) {
  return std::any_of(specs.begin(), specs.end(),
                     [&](const ParamSpec& s) { return s.name == name; });
}

}  // namespace

absl::StatusOr<SafetensorsFile> ExportGpt2(const ModelConfig& model,
                                           const std::map<std::string, std::vector<float>>& params,
                                           int vocab) {
  RETURN_IF_ERROR(RefuseMlp(model));
  if (vocab < 0 || vocab > model.vocab) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a vocabulary of %d rows out of the model's %d", vocab, model.vocab));
  }
  SafetensorsFile file;
  // transformers loads a safetensors file only with this (PyTorch's tensors).
  file.metadata["format"] = "pt";
  const std::vector<ParamSpec> specs = ModelSpecs(model);
  for (const auto& [name, v] : params) {
    if (!HasParam(specs, name)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("parameter %s is not one of %s's", name, model.ToString()));
    }
  }
  for (const ParamSpec& spec : specs) {
    auto it = params.find(spec.name);
    if (it == params.end()) {
      if (spec.name == "head.weight") continue;  // tied to embed.wte: no lm_head
      return absl::InvalidArgumentError(
          absl::StrFormat("the model's parameter %s is missing", spec.name));
    }
    if (static_cast<int64_t>(it->second.size()) != spec.shape.numel()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "parameter %s has %d values; %s needs %s", spec.name, it->second.size(),
          model.ToString(), spec.shape.ToString()));
    }
    ASSIGN_OR_RETURN(HfName hf, HfNameOf(spec.name));
    SafetensorsTensor t;
    t.name = hf.name;
    t.dtype = "F32";
    const std::vector<float>& v = it->second;
    const std::vector<int64_t> dims = spec.shape.dims();
    if (hf.transpose) {
      const int64_t rows = dims[0], cols = dims[1];
      t.shape = {cols, rows};
      t.values.resize(v.size());
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) t.values[j * rows + i] = v[i * cols + j];
      }
    } else if (hf.rows == HfName::kVocab && vocab > 0) {
      t.shape = {vocab, dims[1]};
      t.values.assign(v.begin(), v.begin() + int64_t{vocab} * dims[1]);
    } else {
      t.shape = dims;
      t.values = v;
    }
    file.tensors.push_back(std::move(t));
  }
  return file;
}

Json Gpt2ConfigJson(const ModelConfig& model, int vocab, bool tied) {
  const int v = vocab > 0 ? vocab : model.vocab;
  Json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = v;
  j["n_positions"] = model.seq_len;
  j["n_ctx"] = model.seq_len;
  j["n_embd"] = model.d_model;
  j["n_layer"] = model.n_layer;
  j["n_head"] = model.n_head;
  j["n_inner"] = nullptr;  // 4 x n_embd, as ours
  // What the ops compute (runtime/ops_cpu_impl.inc, runtime/cuda): GELU's tanh form, eps 1e-5,
  // scores scaled by 1/sqrt(head size).
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = 1e-5;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["initializer_range"] = 0.02;
  j["bos_token_id"] = v - 1;  // GPT-2's <|endoftext|>, 50256, is its last token
  j["eos_token_id"] = v - 1;
  j["tie_word_embeddings"] = tied;
  j["torch_dtype"] = "float32";
  return j;
}

absl::Status LoadGpt2Params(const SafetensorsFile& file, const std::string& what, Stage& stage) {
  RETURN_IF_ERROR(RefuseMlp(stage.config()));
  const ParamLayout& layout = stage.layout();
  // The file holds whole tensors; a tensor-parallel stage takes its part of each.
  std::vector<ParamSpec> specs;
  for (const ParamEntry& e : layout.entries()) specs.push_back(WholeSpec(e.spec));
  const bool tied = !HasParam(ModelSpecs(stage.config()), "head.weight");
  std::vector<std::vector<float>> values;
  RETURN_IF_ERROR(Import(file, what, specs, tied, /*whole_model=*/false, &values));
  std::vector<float> host(layout.numel());
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamEntry& e = layout.entries()[i];
    ExtractShard(e.spec, values[i].data(), host.data() + e.offset);
  }
  RETURN_IF_ERROR(CopyFromHost(stage.params().flat(), host));
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(stage.device()));
  return stage.ParamsChanged(*s);
}

absl::Status InitFromSafetensors(const std::string& path, Stage& stage) {
  ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
  return LoadGpt2Params(file, path, stage);
}

absl::Status CheckGpt2File(const std::string& path, const ModelConfig& model) {
  RETURN_IF_ERROR(RefuseMlp(model));
  ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensorsHeader(path));
  const std::vector<ParamSpec> specs = ModelSpecs(model);
  // The header holds no values: a tied model's lm_head is compared with wte when it loads.
  return Import(file, path, specs, !HasParam(specs, "head.weight"), /*whole_model=*/true,
                nullptr);
}

}  // namespace tandem
