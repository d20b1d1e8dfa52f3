// The model's blocks: gradients against finite differences of the loss, and a model split
// into stages computing exactly what the whole model computes.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "model/data.h"
#include "model/stage.h"
#include "model/test_configs.h"
#include "model/trainer.h"
#include "runtime/allocator.h"
#include "runtime/ops.h"

namespace tandem {
namespace {

ModelConfig SmallGpt() { return TwoLayerModel("gpt", 16, 2, 8, 32); }
ModelConfig SmallMlp() { return TwoLayerModel("mlp", 16, 2, 8, 32); }

MicroBatch Batch(const ModelConfig& c, int B, uint64_t seed) {
  auto data = TokenDataset::Synthetic(4096, c.seq_len, c.vocab, seed);
  DataOrder order(data.num_samples(), seed);
  return *MakeMicroBatch(data, order, 0, 0, B, c.seq_len, Device::Cpu(),
                         1.0f / (B * c.seq_len));
}

double MeanLoss(Stage& st, const MicroBatch& mb) {
  Stream& s = **Stream::Compute(Device::Cpu());
  Tensor losses;
  EXPECT_TRUE(st.Forward(s, 0, mb, Tensor(), &losses).ok());
  st.DropActivations();
  double sum = 0;
  const std::vector<float> values = *losses.ToFloatVector();
  for (float l : values) sum += l;
  return sum / losses.numel();
}

// h: the finite-difference step; abs_tol: the rounding of an f32 loss divided by 2h, plus
// for ReLU the chance that a step crosses a kink.
void CheckGradients(const ModelConfig& c, float h, double abs_tol) {
  auto st = *Stage::Create(c, 0, c.num_blocks(), Device::Cpu(), 5);
  Stream& s = **Stream::Compute(Device::Cpu());
  MicroBatch mb = Batch(c, 3, 17);
  Tensor losses, dx;
  ASSERT_TRUE(st->Forward(s, 0, mb, Tensor(), &losses).ok());
  ASSERT_TRUE(st->Backward(s, 0, mb, Tensor(), &dx).ok());
  EXPECT_EQ(st->in_flight(), 0);
  std::vector<float> grads = *st->grads().flat().ToFloatVector();
  float* p = st->params().flat().data<float>();
  // Every parameter tensor: its three largest gradients and one arbitrary entry.
  int checked = 0;
  for (const ParamEntry& e : st->layout().entries()) {
    const int64_t n = e.spec.shape.numel();
    std::vector<int64_t> idx(n);
    for (int64_t i = 0; i < n; ++i) idx[i] = e.offset + i;
    std::partial_sort(idx.begin(), idx.begin() + std::min<int64_t>(3, n), idx.end(),
                      [&](int64_t a, int64_t b) { return std::fabs(grads[a]) > std::fabs(grads[b]); });
    idx.resize(std::min<int64_t>(3, n));
    idx.push_back(e.offset + n / 2);
    for (int64_t i : idx) {
      const float keep = p[i];
      p[i] = keep + h;
      const double up = MeanLoss(*st, mb);
      p[i] = keep - h;
      const double down = MeanLoss(*st, mb);
      p[i] = keep;
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(grads[i], fd, abs_tol + 0.03 * std::fabs(fd))
          << e.spec.name << " element " << (i - e.offset);
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

// Forward then backward of `mb` through `stages` chained (a model split at their bounds);
// the last stage's losses.
std::vector<float> Chain(const std::vector<Stage*>& stages, const MicroBatch& mb) {
  Stream& s = **Stream::Compute(Device::Cpu());
  Tensor x;
  for (Stage* st : stages) {
    Tensor y;
    EXPECT_TRUE(st->Forward(s, 0, mb, x, &y).ok());
    x = y;
  }
  const std::vector<float> losses = *x.ToFloatVector();
  Tensor d;
  for (auto it = stages.rbegin(); it != stages.rend(); ++it) {
    Tensor dx;
    EXPECT_TRUE((*it)->Backward(s, 0, mb, d, &dx).ok());
    d = dx;
  }
  EXPECT_FALSE(d.defined());
  return losses;
}

TEST(BlocksTest, GptGradientsMatchFiniteDifferences) { CheckGradients(SmallGpt(), 1e-2f, 2e-4); }
TEST(BlocksTest, MlpGradientsMatchFiniteDifferences) { CheckGradients(SmallMlp(), 3e-4f, 3e-4); }
TEST(BlocksTest, GptFlashAttentionGradientsMatchFiniteDifferences) {
  ModelConfig c = SmallGpt();
  c.attention = Attention::kFlash;
  CheckGradients(c, 1e-2f, 2e-4);
}

TEST(BlocksTest, ParameterCountMatchesConfig) {
  ModelConfig tied_gpt = SmallGpt(), tied_mlp = SmallMlp();
  tied_gpt.tie_embeddings = tied_mlp.tie_embeddings = true;
  for (ModelConfig c : {SmallGpt(), SmallMlp(), *ModelPreset("gpt-tiny"), tied_gpt, tied_mlp}) {
    auto st = *Stage::Create(c, 0, c.num_blocks(), Device::Cpu(), 1);
    EXPECT_EQ(st->layout().numel(), c.num_params()) << c.ToString();
  }
  // GPT-2 small is GPT-2 124M, tied. By hand from its shapes (V 50257, C 768, T 1024, 12
  // layers): wte V*C = 38,597,376; wpe T*C = 786,432; a layer's two LayerNorms 4C, qkv
  // 3C*C + 3C, projection C*C + C, MLP 4C*C + 4C and 4C*C + C: 12C^2 + 13C = 7,087,872,
  // times 12 = 85,054,464; the final LayerNorm 2C = 1,536. Sum: 124,439,808. Padded to
  // 50304 rows, 47 more rows of 768: 124,475,904.
  const int64_t C = 768, layer = 4 * C + 3 * C * C + 3 * C + C * C + C + 4 * C * C + 4 * C +
                                 4 * C * C + C;
  EXPECT_EQ(layer, 7087872);
  EXPECT_EQ(50257 * C + 1024 * C + 12 * layer + 2 * C, 124439808);
  ModelConfig g = *ModelPreset("gpt2-small");
  EXPECT_TRUE(g.tie_embeddings);
  EXPECT_EQ(g.num_params(), 124475904);
  EXPECT_EQ(g.num_params(), 124439808 + int64_t{50304 - 50257} * 768);
  EXPECT_NE(g.ToString().find("124.48M parameters, tied"), std::string::npos) << g.ToString();
  // In matmuls: every parameter but the position table (the tied table is the head's weight).
  EXPECT_EQ(g.num_matmul_params(), 124475904 - int64_t{1024} * 768);
  // Untied, the head adds its own V x C, and the table is only looked up.
  g.tie_embeddings = false;
  EXPECT_EQ(g.num_params(), 124475904 + int64_t{50304} * 768);
  EXPECT_EQ(g.num_matmul_params(), 124475904 - int64_t{1024} * 768);
  // The MLP looks up its input embedding (V x C) and multiplies the rest.
  const ModelConfig m = SmallMlp();
  EXPECT_EQ(m.num_matmul_params(), m.num_params() - int64_t{m.vocab} * m.d_model);
  EXPECT_EQ(tied_mlp.num_matmul_params(), tied_mlp.num_params());
}

// A tied head computes what an untied head whose weight is a copy of the table computes: the
// same losses, and the table's gradient is the untied table's plus the head's.
TEST(BlocksTest, TiedHeadIsTheUntiedHeadReadingTheTable) {
  for (ModelConfig untied : {SmallGpt(), SmallMlp()}) {
    ModelConfig tied = untied;
    tied.tie_embeddings = true;
    Stream& s = **Stream::Compute(Device::Cpu());
    MicroBatch mb = Batch(untied, 3, 11);
    auto a = *Stage::Create(tied, 0, tied.num_blocks(), Device::Cpu(), 4);
    auto b = *Stage::Create(untied, 0, untied.num_blocks(), Device::Cpu(), 4);
    std::map<std::string, std::pair<int64_t, int64_t>> in_a, in_b;  // offset, numel
    for (const ParamEntry& e : a->layout().entries()) in_a[e.spec.name] = {e.offset, e.spec.shape.numel()};
    for (const ParamEntry& e : b->layout().entries()) in_b[e.spec.name] = {e.offset, e.spec.shape.numel()};
    EXPECT_EQ(in_a.count("head.weight"), 0u);
    EXPECT_EQ(in_a.size() + 1, in_b.size());
    // The untied model's weights are the tied one's, its head's the table.
    const float* pa = a->params().flat().data<float>();
    float* pb = b->params().flat().data<float>();
    for (const auto& [name, where] : in_b) {
      const auto& from = in_a[name == "head.weight" ? "embed.wte" : name];
      ASSERT_EQ(from.second, where.second) << name;
      std::copy_n(pa + from.first, from.second, pb + where.first);
    }
    Tensor la, lb, dx;
    ASSERT_TRUE(a->Forward(s, 0, mb, Tensor(), &la).ok());
    ASSERT_TRUE(b->Forward(s, 0, mb, Tensor(), &lb).ok());
    EXPECT_EQ(*la.ToFloatVector(), *lb.ToFloatVector()) << tied.ToString();
    ASSERT_TRUE(a->Backward(s, 0, mb, Tensor(), &dx).ok());
    ASSERT_TRUE(b->Backward(s, 0, mb, Tensor(), &dx).ok());
    const std::vector<float> ga = *a->grads().flat().ToFloatVector();
    const std::vector<float> gb = *b->grads().flat().ToFloatVector();
    for (const auto& [name, where] : in_a) {
      for (int64_t i = 0; i < where.second; ++i) {
        double want = gb[in_b[name].first + i];
        if (name == "embed.wte") want += gb[in_b["head.weight"].first + i];
        // Only the order of the table's two addends differs: one rounding.
        ASSERT_NEAR(ga[where.first + i], want, 1e-7 * (1 + std::fabs(want)) + 2e-6 * std::fabs(want))
            << name << " element " << i;
      }
    }
  }
}

TEST(BlocksTest, TiedGptGradientsMatchFiniteDifferences) {
  ModelConfig c = SmallGpt();
  c.tie_embeddings = true;
  CheckGradients(c, 1e-2f, 2e-4);
}

// Stages [0, k) and [k, n) chained compute the same losses and gradients as one stage, and
// their initial weights are the same whatever the split. Tied, the last stage holds a copy of
// the table, first in its buffer, initialized as the first stage's, and the two stages' table
// gradients add up to the whole model's (in another order: within one rounding).
TEST(BlocksTest, SplitStagesMatchTheWholeModel) {
  ModelConfig tied = SmallGpt();
  tied.tie_embeddings = true;
  for (ModelConfig c : {SmallGpt(), SmallMlp(), tied}) {
    const int n = c.num_blocks();
    const int64_t table = c.tie_embeddings ? int64_t{c.vocab} * c.d_model : 0;
    MicroBatch mb = Batch(c, 2, 3);
    auto whole = *Stage::Create(c, 0, n, Device::Cpu(), 9);
    EXPECT_EQ(whole->embedding_copy_numel(), 0);
    const std::vector<float> want_loss = Chain({whole.get()}, mb);
    const std::vector<float> want_grad = *whole->grads().flat().ToFloatVector();
    const std::vector<float> want_param = *whole->params().flat().ToFloatVector();
    for (int k = 1; k < n; ++k) {
      auto a = *Stage::Create(c, 0, k, Device::Cpu(), 9);
      auto b = *Stage::Create(c, k, n, Device::Cpu(), 9);
      EXPECT_EQ(a->embedding_copy_numel(), 0);
      ASSERT_EQ(b->embedding_copy_numel(), table);
      EXPECT_EQ(b->layout().numel(), c.num_params() - a->layout().numel() + table);
      if (table > 0) {
        EXPECT_EQ(b->layout().entries().front().spec.name, "embed.wte");
        // The copy is complete, for the buckets, after the stage's first block.
        EXPECT_EQ(b->ParamBlocks().front(), 0);
      }
      EXPECT_EQ(Chain({a.get(), b.get()}, mb), want_loss) << "split at " << k;
      const std::vector<float> ga = *a->grads().flat().ToFloatVector();
      const std::vector<float> gb = *b->grads().flat().ToFloatVector();
      const std::vector<float> pa = *a->params().flat().ToFloatVector();
      const std::vector<float> pb = *b->params().flat().ToFloatVector();
      for (int64_t i = 0; i < table; ++i) {
        ASSERT_EQ(pb[i], want_param[i]) << "split at " << k;
        const double sum = double{ga[i]} + gb[i];
        ASSERT_NEAR(sum, want_grad[i], 1e-7 + 2e-6 * std::fabs(want_grad[i]))
            << "split at " << k;
      }
      // Everything else, bit for bit.
      std::vector<float> g(ga.begin() + table, ga.end()), p(pa.begin() + table, pa.end());
      g.insert(g.end(), gb.begin() + table, gb.end());
      p.insert(p.end(), pb.begin() + table, pb.end());
      EXPECT_EQ(g, std::vector<float>(want_grad.begin() + table, want_grad.end())) << k;
      EXPECT_EQ(p, std::vector<float>(want_param.begin() + table, want_param.end())) << k;
    }
  }
}

TEST(BlocksTest, MicroBatchesAccumulateTheFullBatchGradient) {
  ModelConfig c = SmallGpt();
  Stream& s = **Stream::Compute(Device::Cpu());
  auto data = TokenDataset::Synthetic(4096, c.seq_len, c.vocab, 1);
  DataOrder order(data.num_samples(), 1);
  auto make = [&](int row, int rows) {
    return *MakeMicroBatch(data, order, 0, row, rows, c.seq_len, Device::Cpu(),
                           1.0f / (4 * c.seq_len));
  };
  auto full = *Stage::Create(c, 0, c.num_blocks(), Device::Cpu(), 2);
  auto acc = *Stage::Create(c, 0, c.num_blocks(), Device::Cpu(), 2);
  Tensor y, dx;
  MicroBatch all = make(0, 4);
  ASSERT_TRUE(full->Forward(s, 0, all, Tensor(), &y).ok());
  ASSERT_TRUE(full->Backward(s, 0, all, Tensor(), &dx).ok());
  // Two micro-batches in flight at once (GPipe order), then both backwards.
  MicroBatch m0 = make(0, 2), m1 = make(2, 2);
  ASSERT_TRUE(acc->Forward(s, 0, m0, Tensor(), &y).ok());
  ASSERT_TRUE(acc->Forward(s, 1, m1, Tensor(), &y).ok());
  EXPECT_EQ(acc->in_flight(), 2);
  ASSERT_TRUE(acc->Backward(s, 1, m1, Tensor(), &dx).ok());
  ASSERT_TRUE(acc->Backward(s, 0, m0, Tensor(), &dx).ok());
  std::vector<float> a = *full->grads().flat().ToFloatVector();
  std::vector<float> b = *acc->grads().flat().ToFloatVector();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], 1e-6 + 1e-4 * std::fabs(a[i])) << i;
  }
  EXPECT_FALSE(acc->Backward(s, 0, m0, Tensor(), &dx).ok());  // already done
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Re-materialization computes the same gradients, bit for bit, with less memory held
// between forward and backward.
TEST(BlocksTest, RecomputeMatchesAndSavesMemory) {
  ModelConfig c = SmallGpt();
  c.d_model = 64;
  c.n_head = 4;
  c.seq_len = 32;
  Stream& s = **Stream::Compute(Device::Cpu());
  Allocator* cpu = *GetAllocator(Device::Cpu());
  std::vector<MicroBatch> mbs;
  for (int m = 0; m < 4; ++m) mbs.push_back(Batch(c, 4, 100 + m));
  std::vector<float> grads[2];
  int64_t peak[2];
  for (int rc = 0; rc < 2; ++rc) {
    auto st = *Stage::Create(c, 0, c.num_blocks(), Device::Cpu(), 3);
    st->set_recompute(rc == 1);
    peak[rc] = PeakAllocatedDuring(*cpu, [&] {
      std::vector<Tensor> losses(4);
      for (int m = 0; m < 4; ++m) EXPECT_TRUE(st->Forward(s, m, mbs[m], Tensor(), &losses[m]).ok());
    });
    for (int m = 3; m >= 0; --m) {
      Tensor dx;
      ASSERT_TRUE(st->Backward(s, m, mbs[m], Tensor(), &dx).ok());
    }
    grads[rc] = *st->grads().flat().ToFloatVector();
  }
  EXPECT_EQ(grads[0], grads[1]);
  // Four micro-batches of activations held, against four inputs (and one forward's worth).
  EXPECT_LT(peak[1] * 2, peak[0]) << "recompute " << peak[1] << " B, keep " << peak[0] << " B";
}

// Flash attention computes the standard forward exactly (one code path on the CPU) and the
// same gradients up to rounding, keeping (B, NH, T) per layer for backward where standard
// attention keeps (B, NH, T, T).
TEST(BlocksTest, FlashAttentionMatchesStandardAndSavesMemory) {
  ModelConfig c = SmallGpt();
  c.d_model = 64;
  c.n_head = 4;
  c.seq_len = 64;
  Stream& s = **Stream::Compute(Device::Cpu());
  Allocator* cpu = *GetAllocator(Device::Cpu());
  const MicroBatch mb = Batch(c, 4, 7);
  std::vector<float> losses[2], grads[2];
  int64_t held[2];
  for (Attention a : {Attention::kStandard, Attention::kFlash}) {
    const int i = a == Attention::kFlash;
    c.attention = a;
    auto st = *Stage::Create(c, 0, c.num_blocks(), Device::Cpu(), 3);
    const int64_t base = cpu->stats().allocated_bytes;
    Tensor loss, dx;
    ASSERT_TRUE(st->Forward(s, 0, mb, Tensor(), &loss).ok());
    losses[i] = *loss.ToFloatVector();
    loss = Tensor();
    held[i] = cpu->stats().allocated_bytes - base;
    ASSERT_TRUE(st->Backward(s, 0, mb, Tensor(), &dx).ok());
    grads[i] = *st->grads().flat().ToFloatVector();
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  double worst = 0, scale = 0;
  for (size_t j = 0; j < grads[0].size(); ++j) {
    worst = std::max(worst, std::fabs(static_cast<double>(grads[1][j]) - grads[0][j]));
    scale = std::max(scale, std::fabs(static_cast<double>(grads[0][j])));
  }
  EXPECT_LT(worst, 1e-5 * scale) << "largest gradient " << scale;
  // Two layers of (4, 4, 64, 64) f32 probabilities (256 KiB each) are not held; the
  // log-sum-exp rows (4, 4, 64) are.
  const int64_t probs = int64_t{2} * 4 * 4 * 64 * 64 * 4;
  const int64_t rows = int64_t{2} * 4 * 4 * 64 * 4;
  EXPECT_LE(held[1], held[0] - probs + rows)
      << "flash " << held[1] << " B, standard " << held[0] << " B";
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// A (B, T, C) f32 tensor of values in [-1, 1) that depend on `seed`.
Tensor Values(int64_t B, int64_t T, int64_t C, uint32_t seed) {
  std::vector<float> v(B * T * C);
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) / static_cast<float>(1 << 23) - 1.0f;
  }
  return *Tensor::FromVector(v, {B, T, C});
}

// Block b alone, two micro-batches: Backward of each against BackwardInput of both and then
// BackwardWeights of both, which must leave all but the LayerNorms' gradients alone until W
// and then give the same bits, as must the input gradients.
void CheckBackwardSplit(const ModelConfig& c, int b) {
  const int B = 2, T = c.seq_len, C = c.d_model;
  const bool head = b == c.num_blocks() - 1;
  Stream& s = **Stream::Compute(Device::Cpu());
  const MicroBatch mbs[2] = {Batch(c, B, 31), Batch(c, B, 32)};
  Tensor x[2], dy[2];
  for (int m = 0; m < 2; ++m) {
    if (b > 0) x[m] = Values(B, T, C, 10 + m);
    if (!head) dy[m] = Values(B, T, C, 20 + m);
  }
  auto whole = *Stage::Create(c, b, b + 1, Device::Cpu(), 4);
  auto split = *Stage::Create(c, b, b + 1, Device::Cpu(), 4);
  Tensor want_dx[2], got_dx[2], y;
  for (Stage* st : {whole.get(), split.get()}) {
    for (int m = 0; m < 2; ++m) ASSERT_TRUE(st->Forward(s, m, mbs[m], x[m], &y).ok());
  }
  for (int m = 0; m < 2; ++m) {
    ASSERT_TRUE(whole->Backward(s, m, mbs[m], dy[m], &want_dx[m]).ok());
  }
  for (int m = 0; m < 2; ++m) {
    ASSERT_TRUE(split->BackwardInput(s, m, mbs[m], dy[m], &got_dx[m]).ok());
  }
  EXPECT_EQ(split->in_flight(), 0);
  EXPECT_EQ(split->weights_pending(), 2);
  // B wrote the LayerNorms' gradients, Backward's bits for both micro-batches, and no other;
  // the head's B wrote all of its own (its W would keep the logits' gradient).
  const std::vector<float> before_w = *split->grads().flat().ToFloatVector();
  const std::vector<float> whole_grads = *whole->grads().flat().ToFloatVector();
  for (const ParamEntry& e : split->layout().entries()) {
    const bool in_b = head || absl::StrContains(e.spec.name, ".ln");
    for (int64_t i = e.offset; i < e.offset + e.spec.shape.numel(); ++i) {
      ASSERT_EQ(before_w[i], in_b ? whole_grads[i] : 0.0f) << e.spec.name << " [" << i << "]";
    }
  }
  std::vector<int> done;
  for (int m = 0; m < 2; ++m) {
    ASSERT_TRUE(split
                    ->BackwardWeights(s, m, mbs[m],
                                      [&](int block) {
                                        done.push_back(block);
                                        return absl::OkStatus();
                                      })
                    .ok());
  }
  EXPECT_EQ(done, std::vector<int>({0, 0}));
  EXPECT_EQ(split->weights_pending(), 0);
  if (!head) EXPECT_NE(whole_grads, before_w) << "no weight gradient to compare";
  EXPECT_EQ(*split->grads().flat().ToFloatVector(), whole_grads);
  for (int m = 0; m < 2; ++m) {
    ASSERT_EQ(got_dx[m].defined(), b > 0);
    if (b > 0) {
      EXPECT_EQ(*got_dx[m].ToFloatVector(), *want_dx[m].ToFloatVector()) << m;
    }
  }
}

TEST(BlocksTest, BackwardInputThenWeightsIsBackwardForEveryBlock) {
  ModelConfig flash = SmallGpt();
  flash.attention = Attention::kFlash;
  for (const ModelConfig& c : {SmallGpt(), flash, SmallMlp()}) {
    for (int b = 0; b < c.num_blocks(); ++b) {
      SCOPED_TRACE(c.ToString() + " block " + std::to_string(b));
      CheckBackwardSplit(c, b);
    }
  }
}

// The Ws of a whole model deferred behind other micro-batches' Bs (zero-bubble's order), with
// recomputation: the gradients of plain Backwards; W before B and B twice are refused.
TEST(BlocksTest, DeferredWeightGradientsMatchBackward) {
  const ModelConfig c = SmallGpt();
  Stream& s = **Stream::Compute(Device::Cpu());
  std::vector<MicroBatch> mbs;
  for (int m = 0; m < 3; ++m) mbs.push_back(Batch(c, 2, 40 + m));
  auto whole = *Stage::Create(c, 0, c.num_blocks(), Device::Cpu(), 6);
  auto split = *Stage::Create(c, 0, c.num_blocks(), Device::Cpu(), 6);
  split->set_recompute(true);
  Tensor y, dx;
  for (int m = 0; m < 3; ++m) {
    ASSERT_TRUE(whole->Forward(s, m, mbs[m], Tensor(), &y).ok());
    ASSERT_TRUE(whole->Backward(s, m, mbs[m], Tensor(), &dx).ok());
    ASSERT_TRUE(split->Forward(s, m, mbs[m], Tensor(), &y).ok());
  }
  EXPECT_FALSE(split->BackwardWeights(s, 0, mbs[0]).ok());
  ASSERT_TRUE(split->BackwardInput(s, 0, mbs[0], Tensor(), &dx).ok());
  const absl::Status twice = split->BackwardInput(s, 0, mbs[0], Tensor(), &dx);
  EXPECT_NE(twice.message().find("twice"), std::string::npos) << twice;
  ASSERT_TRUE(split->BackwardInput(s, 1, mbs[1], Tensor(), &dx).ok());
  ASSERT_TRUE(split->BackwardWeights(s, 0, mbs[0]).ok());
  ASSERT_TRUE(split->BackwardInput(s, 2, mbs[2], Tensor(), &dx).ok());
  ASSERT_TRUE(split->BackwardWeights(s, 1, mbs[1]).ok());
  ASSERT_TRUE(split->BackwardWeights(s, 2, mbs[2]).ok());
  const absl::Status again = split->BackwardWeights(s, 2, mbs[2]);
  EXPECT_NE(again.message().find("before its input gradient"), std::string::npos) << again;
  EXPECT_EQ(*split->grads().flat().ToFloatVector(), *whole->grads().flat().ToFloatVector());
}

// A vocabulary padded past the data's (data_vocab, as GPT-2's 50257 in 50304): the padded
// logits take no part in the loss, so the head's rows for them get no gradient at all; without
// the mask they would (training would push their logits down).
TEST(BlocksTest, PaddedVocabularyRowsGetNoGradient) {
  for (const char* preset : {"gpt", "mlp"}) {
    SCOPED_TRACE(preset);
    ModelConfig c = TwoLayerModel(preset, 16, 2, 8, 64);
    auto data = TokenDataset::Synthetic(4096, c.seq_len, 50, 3);
    MicroBatch mb = *MakeMicroBatch(data, DataOrder(data.num_samples(), 3), 0, 0, 3, c.seq_len,
                                    Device::Cpu(), 1.0f / (3 * c.seq_len));
    auto padded_row_grads = [&](int data_vocab) {
      c.data_vocab = data_vocab;
      auto st = *Stage::Create(c, 0, c.num_blocks(), Device::Cpu(), 5);
      Stream& s = **Stream::Compute(Device::Cpu());
      Tensor losses, dx;
      EXPECT_TRUE(st->Forward(s, 0, mb, Tensor(), &losses).ok());
      EXPECT_TRUE(st->Backward(s, 0, mb, Tensor(), &dx).ok());
      const std::vector<float> g = *st->grads().flat().ToFloatVector();
      std::vector<float> rows;  // head.weight (V, C): rows 50..63
      for (const ParamEntry& e : st->layout().entries()) {
        if (e.spec.name != "head.weight") continue;
        rows.assign(g.begin() + e.offset + 50 * c.d_model, g.begin() + e.offset + 64 * c.d_model);
      }
      return rows;
    };
    const std::vector<float> masked = padded_row_grads(50);
    ASSERT_EQ(masked.size(), 14u * c.d_model);
    for (float v : masked) ASSERT_EQ(v, 0.0f);
    const std::vector<float> unmasked = padded_row_grads(0);
    EXPECT_NE(unmasked, masked);
  }
}

}  // namespace
}  // namespace tandem
