// Generation: the key/value cache's logits against the training forward's, sampling's
// determinism and distribution, the context's slide, each step's work, loading a checkpoint
// by name, and the byte-level BPE tokenizer against a hand-written tokenizer.json and against
// Hugging Face's tokenizers.
#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/sharded_checkpoint.h"
#include "model/test_configs.h"
#include "model/tokenizer.h"
#include "model/trainer.h"
#include "runtime/json.h"
#include "runtime/ops.h"
#include "runtime/profiler.h"
#include "runtime/status_testing.h"
#include "runtime/test_files.h"

// `lhs = *expr` once expr's status is OK; else the test fails, printing it.
#define GEN_CONCAT_(a, b) a##b
#define GEN_CONCAT(a, b) GEN_CONCAT_(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_(GEN_CONCAT(result_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_(r, lhs, expr)       \
  auto r = (expr);                                \
  ASSERT_TRUE(r.ok()) << #expr << ": " << r.status(); \
  lhs = std::move(*r)

namespace tandem {
namespace {

// Weights of `c` on the CPU, drawn with std 0.2 rather than training's 0.02, so that attention
// is far from uniform and a wrong key, value or position shows in the logits.
std::unique_ptr<GptWeights> SharpWeights(const ModelConfig& c, uint64_t seed) {
  std::unique_ptr<GptWeights> w = *GptWeights::Create(c, Device::Cpu(), seed);
  Rng rng(seed);
  std::vector<float> values(w->flat().numel());
  for (float& v : values) v = 0.2f * rng.Normal();
  const absl::Status copied = CopySync(w->flat(), *Tensor::FromVector(values, w->flat().shape()));
  EXPECT_TRUE(copied.ok()) << copied;
  return w;
}

std::vector<int32_t> RandomTokens(int n, int vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng.Below(vocab));
  return t;
}

// The cache's logits at every position are those of the training forward over the whole
// sequence (THE check that the cache is right), and the cache grows by one position a step.
TEST(GenerateTest, CachedLogitsEqualTheTrainingForward) {
  const ModelConfig c = *ModelPreset("gpt-tiny");
  std::unique_ptr<GptWeights> w = SharpWeights(c, 3);
  const std::vector<int32_t> tokens = RandomTokens(c.seq_len, c.vocab, 4);
  ASSERT_OK_AND_ASSIGN(Tensor full, FullForwardLogits(*w, tokens));
  ASSERT_OK_AND_ASSIGN(std::vector<float> want, full.ToFloatVector());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCacheDecoder> d, KvCacheDecoder::Create(*w));
  std::vector<std::vector<float>> cached;
  for (int t = 0; t < c.seq_len; ++t) {
    ASSERT_OK_AND_ASSIGN(std::vector<float> logits, d->Step(tokens[t]));
    ASSERT_EQ(d->position(), t + 1);
    ASSERT_EQ(logits.size(), static_cast<size_t>(c.vocab));
    double sq = 0;
    for (int v = 0; v < c.vocab; ++v) sq += double{want[t * c.vocab + v]} * want[t * c.vocab + v];
    const double rms = std::sqrt(sq / c.vocab);
    ASSERT_GT(rms, 0.5) << "logits this small would hide errors";
    for (int v = 0; v < c.vocab; ++v) {
      const double ref = want[t * c.vocab + v];
      ASSERT_LE(std::fabs(logits[v] - ref), 1e-5 * (std::fabs(ref) + rms))
          << "position " << t << " id " << v << ": cached " << logits[v] << ", full " << ref;
    }
    cached.push_back(logits);
  }
  EXPECT_FALSE(d->Step(0).ok()) << "the cache holds seq_len positions";

  // The head block's own losses (the training forward, head included) from the same weights:
  // -log softmax(cached logits)[next token], computed here in double.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Stage> stage,
                       Stage::Create(c, 0, c.num_blocks(), Device::Cpu(), 3));
  ASSERT_OK(CopySync(stage->params().flat(), w->flat()));
  std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
  targets.push_back(tokens[0]);
  MicroBatch mb;
  mb.tokens = *Tensor::FromInts(tokens, {1, c.seq_len});
  mb.targets = *Tensor::FromInts(targets, {1, c.seq_len});
  Tensor losses;
  Stream& s = **Stream::Compute(Device::Cpu());
  ASSERT_OK(stage->Forward(s, 0, mb, Tensor(), &losses));
  ASSERT_OK_AND_ASSIGN(std::vector<float> got_losses, losses.ToFloatVector());
  for (int t = 0; t < c.seq_len; ++t) {
    double max = -INFINITY, sum = 0;
    for (float l : cached[t]) max = std::max(max, double{l});
    for (float l : cached[t]) sum += std::exp(l - max);
    const double loss = max + std::log(sum) - cached[t][targets[t]];
    EXPECT_NEAR(got_losses[t], loss, 1e-5 * std::max(1.0, loss)) << "position " << t;
  }
}

ModelConfig SmallGpt() { return TwoLayerModel("gpt", 64, 4, 32, 256); }

// O(T) per token, counted: step t runs one CachedAttentionForward per layer over t + 1 keys
// (4 (t + 1) C flops each, the op's count of its q k^T and p v), and every other op the same
// work whatever t. (Rows after t are never read: KernelTest.CachedAttention's nan rows.)
TEST(GenerateTest, EachStepsWorkGrowsLinearlyWithThePosition) {
  const ModelConfig c = SmallGpt();
  std::unique_ptr<GptWeights> w = SharpWeights(c, 8);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCacheDecoder> d, KvCacheDecoder::Create(*w));
  double other_flops = -1;
  Profiler::Enable(true);
  for (int t = 0; t < c.seq_len; ++t) {
    Profiler::Reset();
    ASSERT_OK(d->Step(static_cast<int32_t>(t % c.vocab)).status());
    double attention = 0, others = 0;
    int64_t attention_calls = 0;
    for (const OpStat& op : Profiler::OpTable()) {
      if (op.name == "CachedAttentionForward") {
        attention += op.flops;
        attention_calls += op.count;
      } else {
        others += op.flops;
      }
    }
    EXPECT_EQ(attention_calls, c.n_layer);
    EXPECT_EQ(attention, 4.0 * (t + 1) * c.d_model * c.n_layer) << "step " << t;
    if (other_flops < 0) other_flops = others;
    EXPECT_EQ(others, other_flops) << "step " << t;
  }
  Profiler::Enable(false);
  Profiler::Reset();
  EXPECT_GT(other_flops, 0);
}

TEST(GenerateTest, CachedAttentionRefusesBadArguments) {
  Stream& s = **Stream::Compute(Device::Cpu());
  const Tensor qkv = *Tensor::FromVector(std::vector<float>(24, 0.5f), {1, 24});  // C = 8
  const Tensor out = *Tensor::Empty({1, 8}, DType::kF32, Device::Cpu());
  const Tensor k = *Tensor::Empty({2, 5, 4}, DType::kF32, Device::Cpu());
  const Tensor v = *Tensor::Empty({2, 5, 4}, DType::kF32, Device::Cpu());
  ASSERT_OK(ops::CachedAttentionForward(s, out, k, v, qkv, 4, 2));
  EXPECT_FALSE(ops::CachedAttentionForward(s, out, k, v, qkv, 5, 2).ok());   // past maxT
  EXPECT_FALSE(ops::CachedAttentionForward(s, out, k, v, qkv, -1, 2).ok());
  EXPECT_FALSE(ops::CachedAttentionForward(s, out, k, v, qkv, 0, 4).ok());   // (4, 5, 2) wanted
  const Tensor v3 = *Tensor::Empty({2, 3, 4}, DType::kF32, Device::Cpu());
  EXPECT_FALSE(ops::CachedAttentionForward(s, out, k, v3, qkv, 0, 2).ok());
  const Tensor two_rows = *Tensor::FromVector(std::vector<float>(48, 0.5f), {2, 24});
  EXPECT_FALSE(ops::CachedAttentionForward(s, out, k, v, two_rows, 0, 2).ok());
  EXPECT_FALSE(ops::CachedAttentionForward(s, out, k, k, qkv, 0, 2).ok());  // k and v shared
}

TEST(GenerateTest, GreedyIsDeterministicAndTheSameWithoutTheCache) {
  std::unique_ptr<GptWeights> w = SharpWeights(SmallGpt(), 5);
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.tokens = 80;  // past seq_len 32: the context slides twice
  const std::vector<int32_t> prompt = {72, 105};
  std::vector<int32_t> streamed;
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> a,
                       Generate(*w, prompt, o, [&](int32_t t) { streamed.push_back(t); }));
  ASSERT_EQ(a.size(), 80u);
  EXPECT_EQ(streamed, a);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> b, Generate(*w, prompt, o));
  EXPECT_EQ(a, b);
  o.use_cache = false;
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> full, Generate(*w, prompt, o));
  EXPECT_EQ(a, full);
}

TEST(GenerateTest, SeededSamplingIsReproducibleAndTopKOneIsGreedy) {
  std::unique_ptr<GptWeights> w = SharpWeights(SmallGpt(), 6);
  const std::vector<int32_t> prompt = RandomTokens(40, 256, 7);  // longer than seq_len
  GenerateOptions o;
  o.tokens = 30;
  o.seed = 1;
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> a, Generate(*w, prompt, o));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> b, Generate(*w, prompt, o));
  EXPECT_EQ(a, b);
  o.seed = 2;
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> other, Generate(*w, prompt, o));
  EXPECT_NE(a, other);

  o.sampling.top_k = 1;
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> top1, Generate(*w, prompt, o));
  o.sampling.temperature = 0;
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> greedy, Generate(*w, prompt, o));
  EXPECT_EQ(top1, greedy);
  EXPECT_FALSE(Generate(*w, {}, o).ok());
}

TEST(GenerateTest, SamplingDrawsFromTheTemperedTopK) {
  // Ids 4 and 5 are padding (>= vocab 4): never chosen, however large their logits.
  const std::vector<float> logits = {0.0f, std::log(3.0f), -1.0f, -2.0f, 50.0f, 50.0f};
  Rng rng(9);
  EXPECT_EQ(SampleToken(logits, 4, {0.0f, 0}, rng), 1);
  // top-k 2 at temperature 1: p(1) = 3 / (1 + 3); at temperature 2: sqrt(3) / (1 + sqrt(3)).
  for (float temperature : {1.0f, 2.0f}) {
    int ones = 0, n = 20000;
    for (int i = 0; i < n; ++i) {
      const int32_t t = SampleToken(logits, 4, {temperature, 2}, rng);
      ASSERT_TRUE(t == 0 || t == 1) << t;
      ones += t == 1;
    }
    const double want = temperature == 1.0f ? 0.75 : std::sqrt(3.0) / (1 + std::sqrt(3.0));
    EXPECT_NEAR(static_cast<double>(ones) / n, want, 0.015) << "temperature " << temperature;
  }
  for (int i = 0; i < 1000; ++i) ASSERT_LT(SampleToken(logits, 4, {1.0f, 0}, rng), 4);
}

TEST(GenerateTest, ParamsLoadByNameFromATrainingCheckpoint) {
  TrainConfig c = ResumableConfig();
  c.steps = 2;
  c.checkpoint_every = 2;
  c.checkpoint_dir = FreshTestDir("generate-ckpt");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> trainer, Trainer::Create(c));
  ASSERT_OK(trainer->Run(nullptr));
  const std::string prefix = CheckpointPrefixFor(c.checkpoint_dir, 2);
  ASSERT_OK_AND_ASSIGN(Manifest m, ReadManifest(prefix));
  ASSERT_OK_AND_ASSIGN(ModelConfig model, ParseModelDescription(m.model));
  EXPECT_EQ(model.ToString(), c.model.ToString());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GptWeights> w,
                       GptWeights::Create(model, Device::Cpu(), /*seed=*/99));
  ASSERT_OK(LoadParamsByName(prefix, model, w->layout(), w->flat()));
  EXPECT_EQ(*w->flat().ToFloatVector(), *trainer->stage().params().flat().ToFloatVector());

  ModelConfig wider = model;
  wider.d_model = 64;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GptWeights> other,
                       GptWeights::Create(wider, Device::Cpu(), 1));
  EXPECT_FALSE(LoadParamsByName(prefix, wider, other->layout(), other->flat()).ok());
}

TEST(GenerateTest, ModelDescriptionsReadBack) {
  for (const char* preset : {"gpt-tiny", "gpt2-small", "mlp"}) {
    ModelConfig c = *ModelPreset(preset);
    ASSERT_OK_AND_ASSIGN(ModelConfig back, ParseModelDescription(c.ToString()));
    EXPECT_EQ(back.ToString(), c.ToString());
  }
  ModelConfig flash = *ModelPreset("gpt-tiny");
  flash.attention = Attention::kFlash;
  flash.vocab = 50304;
  ASSERT_OK_AND_ASSIGN(ModelConfig back, ParseModelDescription(flash.ToString()));
  EXPECT_EQ(back.attention, Attention::kFlash);
  EXPECT_EQ(back.vocab, 50304);
  EXPECT_FALSE(ParseModelDescription("gpt-tiny: gpt, 8 layers").ok());
  EXPECT_FALSE(GptWeights::Create(*ModelPreset("mlp"), Device::Cpu(), 1).ok());
}

// GPT-2's bytes_to_unicode, written out as encoder.py has it.
std::vector<char32_t> Gpt2BytesToUnicode() {
  std::vector<int> bs, cs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xa1; b <= 0xac; ++b) bs.push_back(b);
  for (int b = 0xae; b <= 0xff; ++b) bs.push_back(b);
  cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  }
  std::vector<char32_t> table(256);
  for (size_t i = 0; i < bs.size(); ++i) table[bs[i]] = static_cast<char32_t>(cs[i]);
  return table;
}

TEST(TokenizerTest, AlphabetIsGpt2s) {
  const std::vector<char32_t> alphabet = ByteLevelAlphabet();
  EXPECT_EQ(alphabet, Gpt2BytesToUnicode());
  EXPECT_EQ(alphabet[' '], U'\u0120');   // "Ġ"
  EXPECT_EQ(alphabet['\n'], U'\u010a');  // "Ċ"
}

// "Ġ" is a space, "Ċ" a newline, "Ã©" the two bytes of "é" in UTF-8.
constexpr char kTokenizerJson[] = R"({
  "version": "1.0",
  "added_tokens": [{"id": 17, "content": "<|endoftext|>", "special": true}],
  "model": {
    "type": "BPE",
    "vocab": {"H": 0, "e": 1, "l": 2, "o": 3, "\u0120": 4, "w": 5, "r": 6, "d": 7, "ll": 8,
              "llo": 9, "\u0120w": 10, "\u010a": 11, "!": 12, "\u00c3\u00a9": 13, "He": 14,
              "\u0120wor": 15, "or": 16},
    "merges": ["l l", "ll o", "H e", ["\u0120", "w"], "o r", "\u0120w or"]
  }
})";

TEST(TokenizerTest, DecodesAndEncodesByteLevelBpe) {
  ASSERT_OK_AND_ASSIGN(BpeTokenizer t, BpeTokenizer::FromJson(kTokenizerJson));
  EXPECT_EQ(t.size(), 18);
  EXPECT_EQ(*t.Decode({14, 9, 15, 2, 7, 12, 11}), "Hello world!\n");
  EXPECT_EQ(*t.Decode({13}), "\xc3\xa9");
  EXPECT_EQ(*t.Decode({17}), "<|endoftext|>");
  EXPECT_FALSE(t.Decode({16, 99}).ok());
  // "Hello": l l, then ll o, then H e; " world": Ġ w, o r, then Ġw or.
  EXPECT_EQ(*t.Encode("Hello world!\n"), (std::vector<int32_t>{14, 9, 15, 2, 7, 12, 11}));
  EXPECT_FALSE(t.Encode("xyz").ok());
  EXPECT_FALSE(BpeTokenizer::FromJson(R"({"model": {"vocab": {"\u4e00": 0}}})").ok());
  EXPECT_FALSE(BpeTokenizer::FromJson("{}").ok());
}

// Against Hugging Face's tokenizers, an outside oracle: a byte-level BPE it trained and the
// ids it encodes texts to (tests/data, written by tools/make_tokenizer_fixture.py).
TEST(TokenizerTest, EncodesAsHuggingFaceTokenizers) {
  ASSERT_OK_AND_ASSIGN(BpeTokenizer t, BpeTokenizer::Load("tests/data/bpe_tokenizer.json"));
  ASSERT_OK_AND_ASSIGN(Json samples, ReadJsonFile("tests/data/bpe_samples.json"));
  ASSERT_GE(samples.size(), 60u);
  for (const Json& sample : samples) {
    const std::string text = sample["text"].get<std::string>();
    const std::vector<int32_t> ids = sample["ids"].get<std::vector<int32_t>>();
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, t.Encode(text));
    EXPECT_EQ(got, ids) << "\"" << text << "\"";
    ASSERT_OK_AND_ASSIGN(std::string back, t.Decode(ids));
    EXPECT_EQ(back, text);
  }
}

}  // namespace
}  // namespace tandem
