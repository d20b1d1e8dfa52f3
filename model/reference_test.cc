// Tandem's GPT against PyTorch, an outside oracle: tests/data/gpt_reference.ckpt (written by
// tools/make_reference.py) holds a small GPT's weights, a batch, and what PyTorch computed:
// logits, loss, every gradient, and the losses of three AdamW steps. Logits and gradients
// must match within 1e-4 of each tensor's largest magnitude; losses within 1e-4 relative.
#include <cmath>
#include <string>

#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/optimizer.h"
#include "model/stage.h"
#include "runtime/ops.h"

namespace tandem {
namespace {

constexpr char kFixture[] = "tests/data/gpt_reference.ckpt";

class ReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = ReadCheckpoint(kFixture);
    ASSERT_TRUE(d.ok()) << d.status();
    ref_ = std::move(*d);
    auto meta = [&](const char* k) { return std::stod(*ref_.Meta(k)); };
    config_ = *ModelPreset("gpt");
    config_.n_layer = static_cast<int>(meta("n_layer"));
    config_.n_head = static_cast<int>(meta("n_head"));
    config_.d_model = static_cast<int>(meta("d_model"));
    config_.seq_len = static_cast<int>(meta("seq_len"));
    config_.vocab = static_cast<int>(meta("vocab"));
    batch_ = static_cast<int>(meta("batch"));
    std::vector<int32_t> tok, tgt;
    for (float v : Array("tokens")) tok.push_back(static_cast<int32_t>(v));
    for (float v : Array("targets")) tgt.push_back(static_cast<int32_t>(v));
    mb_.tokens = *Tensor::FromInts(tok, {batch_, config_.seq_len});
    mb_.targets = *Tensor::FromInts(tgt, {batch_, config_.seq_len});
    mb_.dloss_scale = 1.0f / (batch_ * config_.seq_len);
  }

  const std::vector<float>& Array(const std::string& name) {
    auto a = ref_.Array(name);
    EXPECT_TRUE(a.ok()) << a.status();
    static const std::vector<float> empty;
    return a.ok() ? **a : empty;
  }

  // A stage of blocks [begin, end) holding the fixture's weights.
  std::unique_ptr<Stage> Load(int begin, int end) {
    auto st = *Stage::Create(config_, begin, end, Device::Cpu(), 1);
    for (size_t i = 0; i < st->layout().entries().size(); ++i) {
      const ParamEntry& e = st->layout().entries()[i];
      const std::vector<float>& v = Array("param/" + e.spec.name);
      EXPECT_EQ(static_cast<int64_t>(v.size()), e.spec.shape.numel()) << e.spec.name;
      EXPECT_TRUE(CopySync(st->params().view(i), *Tensor::FromVector(v, e.spec.shape)).ok());
    }
    return st;
  }

  void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                   const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    float scale = 0;
    for (float w : want) scale = std::max(scale, std::fabs(w));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4f * scale) << what << " element " << i;
    }
  }

  CheckpointData ref_;
  ModelConfig config_;
  int batch_ = 0;
  MicroBatch mb_;
  Stream& s_ = **Stream::Compute(Device::Cpu());
};

TEST_F(ReferenceTest, Logits) {
  const int n = config_.num_blocks();
  auto body = Load(0, n - 1);
  auto head = Load(n - 1, n);
  Tensor x;
  ASSERT_TRUE(body->Forward(s_, 0, mb_, Tensor(), &x).ok());
  const int64_t N = batch_ * config_.seq_len, C = config_.d_model;
  Tensor x2 = *x.Reshape({N, C});
  Tensor ln = *Tensor::Empty({N, C}, DType::kF32, Device::Cpu());
  Tensor mean = *Tensor::Empty({N}, DType::kF32, Device::Cpu());
  Tensor rstd = *Tensor::Empty({N}, DType::kF32, Device::Cpu());
  ASSERT_TRUE(ops::LayerNormForward(s_, ln, mean, rstd, x2, head->params().view(0),
                                    head->params().view(1)).ok());
  Tensor logits = *Tensor::Empty({N, config_.vocab}, DType::kF32, Device::Cpu());
  ASSERT_TRUE(ops::LinearForward(s_, logits, ln, head->params().view(2), Tensor()).ok());
  ExpectClose(*logits.ToFloatVector(), Array("logits"), "logits");
}

TEST_F(ReferenceTest, LossAndGradients) {
  auto st = Load(0, config_.num_blocks());
  Tensor losses, dx;
  ASSERT_TRUE(st->Forward(s_, 0, mb_, Tensor(), &losses).ok());
  ASSERT_TRUE(st->Backward(s_, 0, mb_, Tensor(), &dx).ok());
  double sum = 0;
  const std::vector<float> l = *losses.ToFloatVector();
  for (float v : l) sum += v;
  const float want = Array("loss")[0];
  EXPECT_NEAR(sum / l.size(), want, 1e-4 * want);
  for (size_t i = 0; i < st->layout().entries().size(); ++i) {
    const std::string& name = st->layout().entries()[i].spec.name;
    ExpectClose(*st->grads().view(i).ToFloatVector(), Array("grad/" + name), "grad of " + name);
  }
}

TEST_F(ReferenceTest, ThreeAdamWSteps) {
  auto st = Load(0, config_.num_blocks());
  OptimizerConfig oc;
  oc.kind = "adamw";
  oc.lr = static_cast<float>(std::stod(*ref_.Meta("lr")));
  oc.min_lr_ratio = 1.0f;  // constant rate, as in the reference
  oc.beta1 = static_cast<float>(std::stod(*ref_.Meta("beta1")));
  oc.beta2 = static_cast<float>(std::stod(*ref_.Meta("beta2")));
  oc.eps = static_cast<float>(std::stod(*ref_.Meta("eps")));
  oc.weight_decay = static_cast<float>(std::stod(*ref_.Meta("weight_decay")));
  oc.clip_norm = 0;
  auto opt = *Optimizer::Create(oc, st->layout().numel(), Device::Cpu());
  const std::vector<float>& want = Array("adamw_losses");
  ASSERT_EQ(want.size(), 3u);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(st->ZeroGrads(s_).ok());
    Tensor losses, dx;
    ASSERT_TRUE(st->Forward(s_, 0, mb_, Tensor(), &losses).ok());
    ASSERT_TRUE(st->Backward(s_, 0, mb_, Tensor(), &dx).ok());
    double sum = 0;
    const std::vector<float> l = *losses.ToFloatVector();
    for (float v : l) sum += v;
    EXPECT_NEAR(sum / l.size(), want[step], 1e-4 * want[step]) << "step " << step;
    ASSERT_TRUE(opt.Step(s_, st->params().flat(), st->grads().flat(), step, 1.0f).ok());
  }
}

}  // namespace
}  // namespace tandem
