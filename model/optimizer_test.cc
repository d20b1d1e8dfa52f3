#include "model/optimizer.h"

#include <cmath>

#include "gtest/gtest.h"
#include "model/config.h"
#include "model/stage.h"

namespace tandem {
namespace {

Tensor T(std::vector<float> v) { return *Tensor::FromVector(v, {int64_t(v.size())}); }
// A one-element tensor's value, read on the host once the queued work has run.
float Value(const Tensor& t) { return t.ToFloatVector().value()[0]; }

// Values worked out by hand from the update rules (see the comments).
TEST(OptimizerTest, AdamWMatchesHandComputedSteps) {
  OptimizerConfig c;
  c.lr = 0.1f;
  c.min_lr_ratio = 1.0f;  // constant rate
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.weight_decay = 0.1f;
  auto opt = *Optimizer::Create(c, 1, Device::Cpu());
  Stream& s = **Stream::Compute(Device::Cpu());
  Tensor p = T({1.0f});
  // Step 1, g = 0.5: m = 0.05, v = 0.0125, m^ = 0.5, v^ = 0.25, update = 1;
  // p = 1 - 0.1 * (1 + 0.1 * 1) = 0.89.
  ASSERT_TRUE(opt.Step(s, p, T({0.5f}), 0, 1.0f).ok());
  EXPECT_NEAR(Value(p), 0.89f, 1e-6);
  // Step 2, g = -0.5: m = -0.005, v = 0.024375, m^ = -0.0263158, v^ = 0.25,
  // update = -0.0526316; p = 0.89 - 0.1 * (-0.0526316 + 0.089) = 0.8863632.
  ASSERT_TRUE(opt.Step(s, p, T({-0.5f}), 1, 1.0f).ok());
  EXPECT_NEAR(Value(p), 0.8863632f, 1e-6);
}

TEST(OptimizerTest, AdamWGradScaleUnscales) {
  OptimizerConfig c;
  c.lr = 0.1f;
  c.min_lr_ratio = 1.0f;
  auto a = *Optimizer::Create(c, 1, Device::Cpu());
  auto b = *Optimizer::Create(c, 1, Device::Cpu());
  Stream& s = **Stream::Compute(Device::Cpu());
  Tensor pa = T({2.0f}), pb = T({2.0f});
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(a.Step(s, pa, T({0.25f * (i + 1)}), i, 1.0f).ok());
    ASSERT_TRUE(b.Step(s, pb, T({1024.0f * 0.25f * (i + 1)}), i, 1.0f / 1024).ok());
  }
  EXPECT_FLOAT_EQ(Value(pa), Value(pb));
}

TEST(OptimizerTest, SgdMomentumMatchesHandComputedSteps) {
  OptimizerConfig c;
  c.kind = "sgd";
  c.lr = 0.1f;
  c.min_lr_ratio = 1.0f;
  c.momentum = 0.9f;
  auto opt = *Optimizer::Create(c, 1, Device::Cpu());
  Stream& s = **Stream::Compute(Device::Cpu());
  Tensor p = T({1.0f});
  ASSERT_TRUE(opt.Step(s, p, T({0.5f}), 0, 1.0f).ok());  // buf = 0.5, p = 0.95
  EXPECT_NEAR(Value(p), 0.95f, 1e-6);
  ASSERT_TRUE(opt.Step(s, p, T({0.5f}), 1, 1.0f).ok());  // buf = 0.95, p = 0.855
  EXPECT_NEAR(Value(p), 0.855f, 1e-6);
}

TEST(OptimizerTest, WarmupThenCosine) {
  OptimizerConfig c;
  c.lr = 1.0f;
  c.warmup_steps = 10;
  c.total_steps = 110;
  c.min_lr_ratio = 0.1f;
  EXPECT_FLOAT_EQ(LearningRate(c, 0), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(c, 9), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(c, 10), 1.0f);
  EXPECT_NEAR(LearningRate(c, 60), 0.55f, 1e-6);  // half way: floor + half the range
  EXPECT_NEAR(LearningRate(c, 110), 0.1f, 1e-6);
  EXPECT_NEAR(LearningRate(c, 500), 0.1f, 1e-6);
}

TEST(OptimizerTest, ClipFactor) {
  EXPECT_FLOAT_EQ(ClipFactor(4.0f, 1.0f), 1.0f / (2.0f + 1e-6f));  // norm 2 -> 0.5
  EXPECT_FLOAT_EQ(ClipFactor(0.25f, 1.0f), 1.0f);
  EXPECT_FLOAT_EQ(ClipFactor(100.0f, 0.0f), 1.0f);  // off
}

// The clipping factor computed on the device gives the bits the host's ClipFactor gives, and
// a sum of squares that is not finite gives nan, so that the update is skipped.
TEST(OptimizerTest, GradScaleOnTheDeviceIsTheHostsClipFactor) {
  Stream& s = **Stream::Compute(Device::Cpu());
  Tensor scale = T({0.0f});
  for (float sumsq : {0.0f, 0.25f, 4.0f, 9.5f, 1e6f}) {
    for (float loss_scale : {1.0f, 1024.0f}) {
      for (float clip : {0.0f, 1.0f, 2.5f}) {
        const float unscale = 1.0f / loss_scale;
        const float scaled = sumsq * loss_scale * loss_scale;
        ASSERT_TRUE(ops::GradScale(s, scale, T({scaled}), unscale, clip).ok());
        const float want = unscale * ClipFactor(scaled * unscale * unscale, clip);
        EXPECT_EQ(Value(scale), want) << sumsq << " " << loss_scale << " " << clip;
      }
    }
  }
  for (float bad : {NAN, INFINITY}) {
    ASSERT_TRUE(ops::GradScale(s, scale, T({bad}), 1.0f, 1.0f).ok());
    EXPECT_TRUE(std::isnan(Value(scale)));
  }
}

// A device scale multiplies the gradients (1 * scale: the bits of a host factor), and one that
// is not finite leaves parameters and state unchanged, as the host skipping the step would.
TEST(OptimizerTest, DeviceScaleScalesOrSkips) {
  for (const char* kind : {"adamw", "sgd"}) {
    SCOPED_TRACE(kind);
    OptimizerConfig c;
    c.kind = kind;
    c.weight_decay = 0.1f;
    auto host = *Optimizer::Create(c, 3, Device::Cpu());
    auto device = *Optimizer::Create(c, 3, Device::Cpu());
    Stream& s = **Stream::Compute(Device::Cpu());
    Tensor ph = T({1.0f, -2.0f, 0.5f}), pd = T({1.0f, -2.0f, 0.5f});
    const Tensor g = T({0.3f, -0.7f, 2.0f});
    ASSERT_TRUE(host.Step(s, ph, g, 0, 0.37f).ok());
    ASSERT_TRUE(device.Step(s, pd, g, 0, 1.0f, Tensor(), T({0.37f})).ok());
    EXPECT_EQ(ph.ToFloatVector().value(), pd.ToFloatVector().value());
    const std::vector<float> before = pd.ToFloatVector().value();
    const std::vector<float> state = device.state0().ToFloatVector().value();
    ASSERT_TRUE(device.Step(s, pd, g, 1, 1.0f, Tensor(), T({NAN})).ok());
    EXPECT_EQ(pd.ToFloatVector().value(), before);
    EXPECT_EQ(device.state0().ToFloatVector().value(), state);
  }
}

// A small GPT-like layout: the names and ranks the blocks give their parameters.
ParamLayout SmallLayout() {
  return ParamLayout({{"embed.wte", {4, 3}},
                      {"embed.wpe", {2, 3}},
                      {"h0.ln1.weight", {3}},
                      {"h0.ln1.bias", {3}},
                      {"h0.attn.qkv.weight", {9, 3}},
                      {"h0.attn.qkv.bias", {9}},
                      {"head.ln.weight", {3}},
                      {"head.weight", {4, 3}}});
}

TEST(OptimizerTest, DecayedRangesAreTheMatricesAndTheTokenEmbedding) {
  const ParamLayout layout = SmallLayout();
  // wte [0, 12); wpe [12, 18); ln1 [18, 24); qkv.weight [24, 51); qkv.bias [51, 60);
  // head.ln.weight [60, 63); head.weight [63, 75).
  EXPECT_EQ(DecayedRanges(layout, false),
            (std::vector<ElementRange>{{0, 12}, {24, 51}, {63, 75}}));
  EXPECT_EQ(DecayedRanges(layout, true), (std::vector<ElementRange>{{0, 75}}));
  // The real model: every 2-D weight but the position table, nothing 1-D.
  ModelConfig m = *ModelPreset("gpt-tiny");
  auto stage = *Stage::Create(m, 0, m.num_blocks(), Device::Cpu(), 1, DType::kF32);
  int decayed = 0;
  for (const ParamEntry& e : stage->layout().entries()) {
    const bool want = e.spec.shape.rank() == 2 && e.spec.name != "embed.wpe";
    EXPECT_EQ(DecaysByDefault(e.spec), want) << e.spec.name;
    decayed += want;
  }
  EXPECT_EQ(decayed, 2 + 4 * m.n_layer);  // wte, head, and each layer's four matrices
}

// With zero gradients and zero moments Adam's own term is exactly 0 (0 / (0 + eps)), so what
// a step does is the decay alone: decoupled decay multiplies a parameter by 1 - lr * decay.
// (With lr 0 it would move nothing: AdamW's decay is scaled by the learning rate.) lr 0.5
// and decay 0.5 give 0.75, exact in float for the values used here.
TEST(OptimizerTest, DecayMovesOnlyTheDecayedParameters) {
  const ParamLayout layout = SmallLayout();
  for (const char* kind : {"adamw", "sgd"}) {
    for (bool decay_all : {false, true}) {
      SCOPED_TRACE(std::string(kind) + (decay_all ? " decay_all" : ""));
      OptimizerConfig c;
      c.kind = kind;
      c.lr = 0.5f;
      c.min_lr_ratio = 1.0f;
      c.weight_decay = 0.5f;
      c.decay_all = decay_all;
      auto opt = *Optimizer::Create(c, layout, 0, layout.numel(), Device::Cpu());
      std::vector<float> before(layout.numel());
      for (size_t i = 0; i < before.size(); ++i) before[i] = 0.5f * (int(i % 7) - 3);
      Tensor p = T(before);
      Stream& s = **Stream::Compute(Device::Cpu());
      ASSERT_TRUE(opt.Step(s, p, T(std::vector<float>(before.size(), 0.0f)), 0, 1.0f).ok());
      const std::vector<float> after = p.ToFloatVector().value();
      for (const ParamEntry& e : layout.entries()) {
        const bool decays = decay_all || (e.spec.shape.rank() == 2 && e.spec.name != "embed.wpe");
        for (int64_t i = e.offset; i < e.offset + e.spec.shape.numel(); ++i) {
          EXPECT_EQ(after[i], decays ? before[i] * 0.75f : before[i]) << e.spec.name << " " << i;
        }
      }
    }
  }
}

// ZeRO-1: each replica's optimizer holds a shard of the flat buffer whose boundaries may fall
// inside a parameter, and steps it bucket by bucket at state offsets. Every split gives the
// bits one optimizer over the whole buffer gives.
TEST(OptimizerTest, ShardsDecayAsTheWholeBuffer) {
  const ParamLayout layout = SmallLayout();
  const int64_t n = layout.numel();
  OptimizerConfig c;
  c.lr = 0.1f;
  c.weight_decay = 0.3f;
  std::vector<float> init(n), grads0(n), grads1(n);
  for (int64_t i = 0; i < n; ++i) {
    init[i] = 0.01f * (i % 13) - 0.05f;
    grads0[i] = 0.02f * (i % 5) - 0.04f;
    grads1[i] = 0.03f * (i % 3) - 0.02f;
  }
  Stream& s = **Stream::Compute(Device::Cpu());
  Tensor whole = T(init);
  auto full = *Optimizer::Create(c, layout, 0, n, Device::Cpu());
  ASSERT_TRUE(full.Step(s, whole, T(grads0), 0, 1.0f).ok());
  ASSERT_TRUE(full.Step(s, whole, T(grads1), 1, 1.0f).ok());
  const std::vector<float> want = whole.ToFloatVector().value();
  // Shards split inside wte, qkv.weight and qkv.bias; each shard stepped in two buckets that
  // split inside a parameter again.
  const std::vector<int64_t> bounds = {0, 7, 30, 55, n};
  Tensor sharded = T(init);
  const Tensor g0 = T(grads0), g1 = T(grads1);
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    const int64_t lo = bounds[k], hi = bounds[k + 1], mid = (lo + hi) / 2;
    auto opt = *Optimizer::Create(c, layout, lo, hi, Device::Cpu());
    for (int step = 0; step < 2; ++step) {
      for (auto [a, b] : {std::pair<int64_t, int64_t>{lo, mid}, {mid, hi}}) {
        Tensor pv = *sharded.View(a, {b - a});
        Tensor gv = *(step == 0 ? g0 : g1).View(a, {b - a});
        ASSERT_TRUE(opt.Step(s, pv, gv, step, 1.0f, Tensor(), Tensor(), a - lo).ok());
      }
    }
  }
  EXPECT_EQ(sharded.ToFloatVector().value(), want);
}

TEST(OptimizerTest, BadConfigIsRefused) {
  OptimizerConfig c;
  c.kind = "lamb";
  EXPECT_NE(c.Validate().message().find("--optimizer=lamb"), std::string::npos);
  c.kind = "adamw";
  c.lr = -1;
  EXPECT_NE(c.Validate().message().find("--lr=-1"), std::string::npos);
  c.lr = 1e-3f;
  EXPECT_TRUE(c.Validate().ok());
  c.weight_decay = std::nanf("");
  EXPECT_NE(c.Validate().message().find("--weight-decay=nan"), std::string::npos);
  c.weight_decay = INFINITY;
  EXPECT_NE(c.Validate().message().find("--weight-decay=inf"), std::string::npos);
  c.weight_decay = 0;
  c.clip_norm = std::nanf("");
  EXPECT_NE(c.Validate().message().find("--clip-norm=nan"), std::string::npos);
  c.clip_norm = -1;
  EXPECT_NE(c.Validate().message().find("--clip-norm=-1"), std::string::npos);
}

TEST(LossScalerTest, OverflowSkipsAndBacksOffCleanStepsGrow) {
  LossScaler s(/*enabled=*/true, 65536.0f, /*growth_interval=*/2000);
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_FALSE(s.Update(/*found_inf=*/true));  // skip the step
  EXPECT_EQ(s.scale(), 32768.0f);
  for (int i = 0; i < 1999; ++i) ASSERT_TRUE(s.Update(false));
  EXPECT_EQ(s.scale(), 32768.0f);
  EXPECT_TRUE(s.Update(false));  // the 2000th clean step in a row
  EXPECT_EQ(s.scale(), 65536.0f);
  // An overflow resets the count of clean steps.
  for (int i = 0; i < 1500; ++i) s.Update(false);
  s.Update(true);
  for (int i = 0; i < 1999; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 32768.0f);
}

TEST(LossScalerTest, DisabledKeepsScaleOneButStillSkipsNonFinite) {
  LossScaler s(false);
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_TRUE(s.Update(false));
  EXPECT_FALSE(s.Update(true));
  EXPECT_EQ(s.scale(), 1.0f);
}

}  // namespace
}  // namespace tandem
