#include "model/hf_gpt2.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/test_files.h"

namespace tandem {
namespace {

ModelConfig Small() {
  ModelConfig c = *ModelPreset("gpt");
  c.n_layer = 2;
  c.d_model = 8;
  c.n_head = 2;
  c.seq_len = 4;
  c.vocab = 10;
  return c;
}

std::unique_ptr<Stage> MakeStage(const ModelConfig& c, uint64_t seed, int begin = 0, int end = -1) {
  return *Stage::Create(c, begin, end < 0 ? c.num_blocks() : end, Device::Cpu(), seed);
}

std::map<std::string, std::vector<float>> ByName(const Stage& s) {
  std::map<std::string, std::vector<float>> out;
  for (size_t i = 0; i < s.layout().entries().size(); ++i) {
    out[s.layout().entries()[i].spec.name] = *s.params().view(i).ToFloatVector();
  }
  return out;
}

const SafetensorsTensor& Get(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsTensor* t = f.Find(name);
  EXPECT_NE(t, nullptr) << name;
  static const SafetensorsTensor none;
  return t != nullptr ? *t : none;
}

TEST(HfGpt2, ExportUsesGpt2NamesAndConv1dLayout) {
  const ModelConfig c = Small();
  auto stage = MakeStage(c, 1);
  const auto ours = ByName(*stage);
  absl::StatusOr<SafetensorsFile> f = ExportGpt2(c, ours);
  ASSERT_TRUE(f.ok()) << f.status();
  std::set<std::string> names;
  for (const SafetensorsTensor& t : f->tensors) names.insert(t.name);
  // GPT2LMHeadModel's state_dict names, written out from its source.
  std::set<std::string> want = {"transformer.wte.weight", "transformer.wpe.weight",
                                "transformer.ln_f.weight", "transformer.ln_f.bias",
                                "lm_head.weight"};
  for (int i = 0; i < 2; ++i) {
    for (const char* n : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                          "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
                          "mlp.c_proj.bias"}) {
      want.insert(absl::StrCat("transformer.h.", i, ".", n));
    }
  }
  EXPECT_EQ(names, want);
  EXPECT_EQ(f->metadata.at("format"), "pt");
  // Conv1D: [in, out]; c_attn.weight[j][i] is our qkv.weight[i][j] (row i of 3C outputs).
  const SafetensorsTensor& attn = Get(*f, "transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(attn.shape, (std::vector<int64_t>{8, 24}));
  const std::vector<float>& qkv = ours.at("h1.attn.qkv.weight");  // [24, 8]
  for (int i = 0; i < 24; ++i) {
    for (int j = 0; j < 8; ++j) ASSERT_EQ(attn.values[j * 24 + i], qkv[i * 8 + j]) << i << "," << j;
  }
  const SafetensorsTensor& fc = Get(*f, "transformer.h.0.mlp.c_fc.weight");
  EXPECT_EQ(fc.shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(fc.values[3 * 32 + 17], ours.at("h0.mlp.fc.weight")[17 * 8 + 3]);
  const SafetensorsTensor& proj = Get(*f, "transformer.h.0.mlp.c_proj.weight");
  EXPECT_EQ(proj.shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(proj.values[17 * 8 + 3], ours.at("h0.mlp.proj.weight")[3 * 32 + 17]);
  EXPECT_EQ(Get(*f, "transformer.ln_f.weight").values, ours.at("head.ln.weight"));
  EXPECT_EQ(Get(*f, "lm_head.weight").values, ours.at("head.weight"));

  const Json j = Gpt2ConfigJson(c, 0, /*tied=*/false);
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["n_embd"], 8);
  EXPECT_EQ(j["n_head"], 2);
  EXPECT_EQ(j["n_layer"], 2);
  EXPECT_EQ(j["n_positions"], 4);
  EXPECT_EQ(j["vocab_size"], 10);
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_EQ(j["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(j["tie_word_embeddings"], false);
}

TEST(HfGpt2, ImportGivesBackTheSameBitsInAnySplit) {
  const ModelConfig c = Small();
  auto a = MakeStage(c, 1);
  const SafetensorsFile f = *ExportGpt2(c, ByName(*a));
  auto b = MakeStage(c, 2);
  ASSERT_NE(ByName(*a), ByName(*b));
  ASSERT_TRUE(LoadGpt2Params(f, "m", *b).ok());
  EXPECT_EQ(*a->params().flat().ToFloatVector(), *b->params().flat().ToFloatVector());
  // Pipeline stages take their parameters by name.
  const auto all = ByName(*a);
  for (auto [begin, end] : {std::pair{0, 2}, std::pair{2, 4}, std::pair{1, 3}}) {
    auto s = MakeStage(c, 3, begin, end);
    ASSERT_TRUE(LoadGpt2Params(f, "m", *s).ok());
    for (const auto& [name, v] : ByName(*s)) EXPECT_EQ(v, all.at(name)) << name;
  }
  // Names without transformer.'s prefix, as GPT2Model saves them.
  SafetensorsFile bare = f;
  for (SafetensorsTensor& t : bare.tensors) {
    if (absl::StartsWith(t.name, "transformer.")) t.name = t.name.substr(12);
  }
  auto d = MakeStage(c, 4);
  ASSERT_TRUE(LoadGpt2Params(bare, "m", *d).ok());
  EXPECT_EQ(*a->params().flat().ToFloatVector(), *d->params().flat().ToFloatVector());
}

TEST(HfGpt2, TiedFileAndRealVocabulary) {
  const ModelConfig c = Small();
  auto a = MakeStage(c, 1);
  const auto ours = ByName(*a);
  // 7 of the 10 rows: the real vocabulary of a padded model.
  SafetensorsFile f = *ExportGpt2(c, ours, /*vocab=*/7);
  EXPECT_EQ(Get(f, "transformer.wte.weight").shape, (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(Get(f, "lm_head.weight").shape, (std::vector<int64_t>{7, 8}));
  // transformers saves a tied model without lm_head: the head takes wte.
  f.tensors.erase(std::find_if(f.tensors.begin(), f.tensors.end(),
                               [](const SafetensorsTensor& t) { return t.name == "lm_head.weight"; }));
  auto b = MakeStage(c, 2);
  ASSERT_TRUE(LoadGpt2Params(f, "m", *b).ok());
  const auto got = ByName(*b);
  for (const char* name : {"embed.wte", "head.weight"}) {
    const std::vector<float>& v = got.at(name);
    for (int i = 0; i < 10 * 8; ++i) {
      // Rows 7..9, the padding, are zeros.
      ASSERT_EQ(v[i], i < 7 * 8 ? ours.at("embed.wte")[i] : 0.0f) << name << " " << i;
    }
  }
  EXPECT_EQ(got.at("h1.attn.qkv.weight"), ours.at("h1.attn.qkv.weight"));
}

TEST(HfGpt2, WrongFilesAreRefusedInOneLine) {
  const ModelConfig c = Small();
  auto a = MakeStage(c, 1);
  const SafetensorsFile f = *ExportGpt2(c, ByName(*a));
  auto refused = [&](const SafetensorsFile& file, const std::string& words) {
    auto b = MakeStage(c, 2);
    const std::vector<float> before = *b->params().flat().ToFloatVector();
    absl::Status s = LoadGpt2Params(file, "m.safetensors", *b);
    EXPECT_FALSE(s.ok()) << words;
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
    EXPECT_EQ(*b->params().flat().ToFloatVector(), before);  // nothing changed
  };
  SafetensorsFile missing = f;
  missing.tensors.erase(missing.tensors.begin() + 3);
  refused(missing, absl::StrCat("m.safetensors has no tensor ", f.tensors[3].name));
  SafetensorsFile wide = f;
  for (SafetensorsTensor& t : wide.tensors) {
    if (t.name == "transformer.h.0.attn.c_attn.weight") t.shape = {24, 8};  // not transposed
  }
  refused(wide, "tensor transformer.h.0.attn.c_attn.weight is [24, 8]; the model's "
                "h0.attn.qkv.weight needs [8, 24]");

  // The launcher's whole-model check reads the header: a file of more layers is refused.
  ModelConfig three = c;
  three.n_layer = 3;
  auto big = MakeStage(three, 1);
  const std::string path = FreshTestPath("three.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, *ExportGpt2(three, ByName(*big))).ok());
  EXPECT_TRUE(CheckGpt2File(path, three).ok());
  absl::Status s = CheckGpt2File(path, c);
  EXPECT_NE(s.message().find("holds transformer.h.2."), std::string::npos) << s.message();
  ModelConfig wider = three;
  wider.d_model = 16;
  s = CheckGpt2File(path, wider);
  EXPECT_NE(s.message().find("pass the sizes of the model"), std::string::npos) << s.message();

  ModelConfig mlp = *ModelPreset("mlp");
  EXPECT_NE(ExportGpt2(mlp, {}).status().message().find("MLP"), std::string::npos);
  EXPECT_NE(CheckGpt2File(path, mlp).message().find("MLP"), std::string::npos);
}

}  // namespace
}  // namespace tandem
