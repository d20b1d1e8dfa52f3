// `bazel run //tools:export -- --checkpoint=<run_dir>/checkpoints/step-N --out=model.safetensors`
// writes a checkpoint's weights (gathered by name from its shards, whatever strategy wrote
// them) in Hugging Face GPT2LMHeadModel's names and layout, and config.json beside them, so
// that GPT2LMHeadModel.from_pretrained(dir) loads the model (model/hf_gpt2.h).
//
// `--logits-of=DIR/model.safetensors --tokens=FILE --out=logits.safetensors` runs such a file
// (config.json beside it) forward with Tandem's ops on the CPU and writes the logits of each
// token, [rows, tokens, vocab], for comparison with transformers (tools/hf_logits_test.sh).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "launcher/flags.h"
#include "launcher/paths.h"
#include "model/hf_gpt2.h"
#include "model/sharded_checkpoint.h"
#include "runtime/files.h"
#include "runtime/json.h"
#include "runtime/ops.h"
#include "runtime/safetensors.h"
#include "runtime/status.h"

ABSL_FLAG(std::string, checkpoint, "",
          "the checkpoint to export: <run_dir>/checkpoints/step-N (or one of its files), or a "
          "run directory (its newest complete checkpoint)");
ABSL_FLAG(std::string, out, "",
          "the safetensors file to write (config.json goes beside it; from_pretrained(dir) "
          "reads dir/model.safetensors); with --logits-of, the logits' file");
ABSL_FLAG(std::string, logits_of, "",
          "instead of exporting: run this safetensors file (config.json beside it) on --tokens "
          "and write the logits to --out");
ABSL_FLAG(std::string, tokens, "",
          "with --logits-of: a text file of token ids, one row of equally many a line");

namespace tandem {
namespace {

using launcher::DirOf;

// A GPT's sizes from its parameters (the checkpoint holds them by name) and its head count
// from the model's description ("..., 4 heads, ...").
absl::StatusOr<ModelConfig> ModelOfParams(const std::map<std::string, std::vector<float>>& p,
                                          const std::string& description,
                                          const std::string& what) {
  if (absl::StrContains(description, ": mlp,")) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s holds an MLP model (%s), which has no Hugging Face counterpart; only GPT models "
        "are exported",
        what, description));
  }
  auto size = [&](const std::string& name) -> int64_t {
    auto it = p.find(name);
    return it == p.end() ? 0 : static_cast<int64_t>(it->second.size());
  };
  ModelConfig m = *ModelPreset("gpt");
  m.d_model = static_cast<int>(size("h0.ln1.weight"));
  m.n_layer = 0;
  while (size(absl::StrCat("h", m.n_layer, ".ln1.weight")) > 0) ++m.n_layer;
  const size_t heads = description.find(" heads");
  const size_t comma = description.rfind(", ", heads);
  if (m.d_model == 0 || heads == std::string::npos || comma == std::string::npos ||
      !absl::SimpleAtoi(description.substr(comma + 2, heads - comma - 2), &m.n_head)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is not of a GPT model Tandem knows (%s)", what, description));
  }
  m.vocab = static_cast<int>(size("embed.wte") / m.d_model);
  m.seq_len = static_cast<int>(size("embed.wpe") / m.d_model);
  RETURN_IF_ERROR(m.Validate());
  return m;
}

absl::Status Export(const std::string& checkpoint, const std::string& out) {
  ASSIGN_OR_RETURN(std::string prefix, ResolveCheckpointArg(checkpoint));
  Manifest manifest;
  std::map<std::string, std::string> meta;
  ASSIGN_OR_RETURN(auto params, ReadCheckpointParams(prefix, &manifest, &meta));
  ASSIGN_OR_RETURN(ModelConfig model, ModelOfParams(params, manifest.model, prefix));
  int vocab = 0;  // the model's rows, unless the checkpoint records the data's vocabulary
  if (auto it = meta.find("data_vocab"); it != meta.end()) (void)absl::SimpleAtoi(it->second, &vocab);
  ASSIGN_OR_RETURN(SafetensorsFile file, ExportGpt2(model, params, vocab));
  const bool tied = params.count("head.weight") == 0;
  RETURN_IF_ERROR(MakeDirs(DirOf(out)));
  RETURN_IF_ERROR(WriteSafetensors(out, file));
  const std::string config = DirOf(out) + "/config.json";
  RETURN_IF_ERROR(WriteFileAtomically(
      config, JsonText(Gpt2ConfigJson(model, vocab, tied), JsonLayout::kObjects) + "\n"));
  std::printf("export: wrote %s (%zu tensors; %s) and %s, from %s (step %d)%s\n", out.c_str(),
              file.tensors.size(), manifest.model.c_str(), config.c_str(), prefix.c_str(),
              manifest.step,
              vocab > 0 ? absl::StrFormat("; vocabulary %d of the model's padded %d", vocab,
                                          model.vocab).c_str()
                        : "");
  if (!absl::EndsWith(out, "/model.safetensors") && out != "model.safetensors") {
    std::printf("export: GPT2LMHeadModel.from_pretrained(dir) reads dir/model.safetensors\n");
  }
  return absl::OkStatus();
}

// The model config.json describes, refusing what Tandem does not compute that way.
absl::StatusOr<ModelConfig> ModelOfConfigJson(const std::string& path) {
  ASSIGN_OR_RETURN(Json j, ReadJsonFile(path));
  ModelConfig m = *ModelPreset("gpt");
  m.n_layer = static_cast<int>(NumberOr(j, "n_layer", 0));
  m.d_model = static_cast<int>(NumberOr(j, "n_embd", 0));
  m.n_head = static_cast<int>(NumberOr(j, "n_head", 0));
  m.seq_len = static_cast<int>(NumberOr(j, "n_positions", 0));
  m.vocab = static_cast<int>(NumberOr(j, "vocab_size", 0));
  const std::string act = StringOr(j, "activation_function", "gelu_new");
  const double eps = NumberOr(j, "layer_norm_epsilon", 1e-5);
  if (StringOr(j, "model_type", "") != "gpt2" || act != "gelu_new" || eps != 1e-5 ||
      NumberOr(j, "scale_attn_weights", 1) != 1 ||
      NumberOr(j, "scale_attn_by_inverse_layer_idx", 0) != 0 || !j.value("n_inner", Json()).is_null()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is not a GPT-2 that Tandem computes (model_type gpt2, gelu_new, layer_norm_epsilon "
        "1e-5, scaled attention, n_inner null)",
        path));
  }
  RETURN_IF_ERROR(m.Validate());
  return m;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> ReadTokens(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  std::vector<std::vector<int32_t>> rows;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    std::vector<int32_t> row;
    for (absl::string_view w : absl::StrSplit(line, absl::ByAnyChar(" \t,"), absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(w, &id)) {
        return absl::InvalidArgumentError(absl::StrFormat("--tokens=%s: '%s' is not a token id", path, w));
      }
      row.push_back(id);
    }
    if (!rows.empty() && row.size() != rows[0].size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--tokens=%s: rows of %d and %d tokens", path, rows[0].size(), row.size()));
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrFormat("--tokens=%s holds no tokens", path));
  return rows;
}

// The view of the parameter `name` in one of the stages; nullptr when none holds it.
const Tensor* ParamNamed(const std::vector<const Stage*>& stages, const std::string& name) {
  for (const Stage* s : stages) {
    for (size_t i = 0; i < s->layout().entries().size(); ++i) {
      if (s->layout().entries()[i].spec.name == name) return &s->params().view(i);
    }
  }
  return nullptr;
}

absl::Status Logits(const std::string& model_file, const std::string& tokens_file,
                    const std::string& out) {
  ASSIGN_OR_RETURN(ModelConfig m, ModelOfConfigJson(DirOf(model_file) + "/config.json"));
  ASSIGN_OR_RETURN(auto rows, ReadTokens(tokens_file));
  const int64_t B = rows.size(), T = rows[0].size(), C = m.d_model, V = m.vocab;
  if (T > m.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--tokens: rows of %d tokens; the model has %d positions", T, m.seq_len));
  }
  std::vector<int32_t> ids;
  for (const auto& r : rows) ids.insert(ids.end(), r.begin(), r.end());
  // The body (embedding and layers) as one stage; the head's LayerNorm and projection are
  // applied here, since the head block fuses them with the loss and keeps no logits.
  const Device cpu = Device::Cpu();
  ASSIGN_OR_RETURN(auto body, Stage::Create(m, 0, m.n_layer + 1, cpu, 0));
  ASSIGN_OR_RETURN(auto head, Stage::Create(m, m.n_layer + 1, m.num_blocks(), cpu, 0));
  ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(model_file));
  RETURN_IF_ERROR(LoadGpt2Params(file, model_file, *body));
  RETURN_IF_ERROR(LoadGpt2Params(file, model_file, *head));
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(cpu));
  MicroBatch mb;
  ASSIGN_OR_RETURN(mb.tokens, Tensor::FromInts(ids, {B, T}));
  mb.targets = mb.tokens;
  Tensor x;
  RETURN_IF_ERROR(body->Forward(*s, 0, mb, Tensor(), &x));
  const Tensor* ln_w = ParamNamed({head.get()}, "head.ln.weight");
  const Tensor* ln_b = ParamNamed({head.get()}, "head.ln.bias");
  const Tensor* w = ParamNamed({head.get()}, "head.weight");
  if (w == nullptr) w = ParamNamed({body.get()}, "embed.wte");  // a tied head
  if (ln_w == nullptr || ln_b == nullptr || w == nullptr) {
    return absl::InternalError("the head's parameters are not where the GPT blocks put them");
  }
  ASSIGN_OR_RETURN(Tensor x2, x.Reshape({B * T, C}));
  ASSIGN_OR_RETURN(Tensor h, Tensor::Empty({B * T, C}, DType::kF32, cpu));
  ASSIGN_OR_RETURN(Tensor mean, Tensor::Empty({B * T}, DType::kF32, cpu));
  ASSIGN_OR_RETURN(Tensor rstd, Tensor::Empty({B * T}, DType::kF32, cpu));
  ASSIGN_OR_RETURN(Tensor logits, Tensor::Empty({B * T, V}, DType::kF32, cpu));
  RETURN_IF_ERROR(ops::LayerNormForward(*s, h, mean, rstd, x2, *ln_w, *ln_b));
  RETURN_IF_ERROR(ops::LinearForward(*s, logits, h, *w, Tensor()));
  SafetensorsFile result;
  SafetensorsTensor t;
  t.name = "logits";
  t.dtype = "F32";
  t.shape = {B, T, V};
  ASSIGN_OR_RETURN(t.values, logits.ToFloatVector());
  result.tensors.push_back(std::move(t));
  RETURN_IF_ERROR(WriteSafetensors(out, result));
  std::printf("export: wrote the logits of %d x %d tokens to %s\n", static_cast<int>(B),
              static_cast<int>(T), out.c_str());
  return absl::OkStatus();
}

int Main() {
  const std::string user_dir = launcher::BuildWorkingDirectory();
  auto users = [&](const std::string& p) { return launcher::AbsolutePath(user_dir, p); };
  const std::string out = users(absl::GetFlag(FLAGS_out));
  const std::string logits_of = users(absl::GetFlag(FLAGS_logits_of));
  const std::string checkpoint = users(absl::GetFlag(FLAGS_checkpoint));
  absl::Status s;
  if (out.empty()) {
    s = absl::InvalidArgumentError("--out=FILE is needed (the safetensors file to write)");
  } else if (!logits_of.empty()) {
    const std::string tokens = users(absl::GetFlag(FLAGS_tokens));
    s = tokens.empty() ? absl::InvalidArgumentError("--logits-of needs --tokens=FILE")
                       : Logits(logits_of, tokens, out);
  } else if (checkpoint.empty()) {
    s = absl::InvalidArgumentError("--checkpoint=<run_dir>/checkpoints/step-N is needed");
  } else {
    s = Export(checkpoint, out);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "export: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  const tandem::launcher::FlagSet flags{"tools/export.cc",
                                        {"checkpoint", "out", "logits_of", "tokens"}};
  const int rc = tandem::launcher::ParseCommandLine(
      flags, argc, argv, "export",
      "Usage: bazel run //tools:export -- --checkpoint=<run_dir>/checkpoints/step-N "
      "--out=DIR/model.safetensors\n"
      "Writes a GPT checkpoint's weights in Hugging Face GPT2LMHeadModel's names and\n"
      "layout, with config.json beside them (GPT2LMHeadModel.from_pretrained(DIR)).\n"
      "Training starts from such a file with --init-from=DIR/model.safetensors.\n");
  return rc >= 0 ? rc : tandem::Main();
}
