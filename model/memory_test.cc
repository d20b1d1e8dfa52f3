// The memory a run is checked against before it starts: each block's declared activation
// bytes against what its Forward really keeps, a stage's estimate against the allocator, and
// the refusal's message.
#include "model/memory.h"

#include <memory>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/block.h"
#include "model/data.h"
#include "model/memory_testing.h"
#include "model/stage.h"
#include "model/test_configs.h"
#include "model/trainer.h"
#include "runtime/allocator.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

ModelConfig Small(const char* preset, Attention attention = Attention::kStandard) {
  ModelConfig c = TwoLayerModel(preset, 16, 2, 8, 32);
  c.attention = attention;
  return c;
}

std::vector<ModelConfig> Configs() {
  return {Small("gpt"), Small("gpt", Attention::kFlash), Small("mlp")};
}

// Every block's Forward, in order; the bytes of the distinct buffers it saved or returned,
// not counting the one it was given.
TEST(ActivationBytes, EqualWhatForwardKeeps) {
  for (const ModelConfig& c : Configs()) {
    SCOPED_TRACE(c.ToString() + " " + AttentionName(c.attention));
    const std::vector<std::unique_ptr<Block>> blocks = BuildBlocks(c);
    Stream& s = **Stream::Compute(Device::Cpu());
    const int B = 3;
    const MicroBatch mb = Batch(c, B);
    Tensor x;
    std::vector<Saved> saved(blocks.size());
    for (size_t b = 0; b < blocks.size(); ++b) {
      SCOPED_TRACE(blocks[b]->name());
      ParamLayout layout(blocks[b]->Params());
      FlatBuffer params = *FlatBuffer::Create(layout, DType::kF32, Device::Cpu());
      ASSERT_TRUE(InitializeParams(layout, params, 1).ok());
      std::vector<Tensor> p;
      for (size_t i = 0; i < params.size(); ++i) p.push_back(params.view(i));
      Tensor y;
      ASSERT_TRUE(blocks[b]->Forward(s, p, mb, x, &y, &saved[b]).ok());
      std::set<const void*> seen;
      if (x.defined()) seen.insert(x.storage().get());
      int64_t kept = 0;
      std::vector<Tensor> held = saved[b].t;
      held.push_back(y);
      for (const Tensor& t : held) {
        if (t.defined() && seen.insert(t.storage().get()).second) kept += t.bytes();
      }
      EXPECT_EQ(blocks[b]->ActivationBytes(B, c.seq_len, DType::kF32), kept);
      x = y;
    }
  }
}

// Every block's BackwardInput, last to first after the forwards: the bytes of the distinct
// buffers it keeps for the W (inputs and gradients alike), and for the embedding the tokens its
// W reads, are what WeightStashBytes declares, so a pending W is never under-counted.
TEST(WeightStashBytes, EqualWhatBackwardInputKeeps) {
  for (const ModelConfig& c : Configs()) {
    SCOPED_TRACE(c.ToString() + " " + AttentionName(c.attention));
    const std::vector<std::unique_ptr<Block>> blocks = BuildBlocks(c);
    Stream& s = **Stream::Compute(Device::Cpu());
    const int B = 3;
    const MicroBatch mb = Batch(c, B);
    std::vector<FlatBuffer> params, grads;
    std::vector<std::vector<Tensor>> p(blocks.size()), g(blocks.size());
    std::vector<Saved> saved(blocks.size());
    Tensor x;
    for (size_t b = 0; b < blocks.size(); ++b) {
      ParamLayout layout(blocks[b]->Params());
      params.push_back(*FlatBuffer::Create(layout, DType::kF32, Device::Cpu()));
      ASSERT_TRUE(InitializeParams(layout, params.back(), 1).ok());
      grads.push_back(*FlatBuffer::Create(layout, DType::kF32, Device::Cpu()));
      ASSERT_TRUE(ZeroFill(grads.back().flat(), s).ok());  // B adds the LayerNorms' into it
      for (size_t i = 0; i < params.back().size(); ++i) {
        p[b].push_back(params.back().view(i));
        g[b].push_back(grads.back().view(i));
      }
      Tensor y;
      ASSERT_TRUE(blocks[b]->Forward(s, p[b], mb, x, &y, &saved[b]).ok());
      x = y;
    }
    Tensor dy;  // the head's: none
    for (int b = static_cast<int>(blocks.size()) - 1; b >= 0; --b) {
      SCOPED_TRACE(blocks[b]->name());
      Tensor dx;
      Saved for_w;
      ASSERT_TRUE(blocks[b]->BackwardInput(s, p[b], g[b], mb, dy, saved[b], &dx, &for_w).ok());
      std::set<const void*> seen;
      int64_t kept = b == 0 ? static_cast<int64_t>(mb.tokens.bytes()) : 0;
      for (const Tensor& t : for_w.t) {
        if (t.defined() && seen.insert(t.storage().get()).second) kept += t.bytes();
      }
      EXPECT_EQ(blocks[b]->WeightStashBytes(B, c.seq_len, DType::kF32), kept);
      dy = dx;
    }
  }
}

// A stage holding M micro-batches' activations: the allocator's live bytes grow by the
// estimate, up to its rounding of each buffer. The whole model, and a last stage that
// receives its inputs.
TEST(EstimateStageMemory, MatchesTheAllocator) {
  for (const ModelConfig& c : Configs()) {
    for (int begin : {0, 2}) {
      SCOPED_TRACE(c.ToString() + " " + AttentionName(c.attention) + " from block " +
                   std::to_string(begin));
      // B large enough that a stage's inputs (B x 8 x 16 f32 each) outweigh the rounding.
      const int B = 64, M = 3, n_blocks = c.num_blocks() - begin;
      auto st = *Stage::Create(c, begin, c.num_blocks(), Device::Cpu(), 7);
      Stream& s = **Stream::Compute(Device::Cpu());
      Allocator& alloc = **GetAllocator(Device::Cpu());
      std::vector<MicroBatch> mbs;
      for (int m = 0; m < M; ++m) mbs.push_back(Batch(c, B));
      const int64_t before = alloc.stats().allocated_bytes;
      std::vector<Tensor> losses(M);
      for (int m = 0; m < M; ++m) {
        // What the previous stage would send.
        Tensor x = begin == 0 ? Tensor() : Boundary(c, B);
        ASSERT_TRUE(st->Forward(s, m, mbs[m], x, &losses[m]).ok());
      }
      const int64_t held = alloc.stats().allocated_bytes - before;
      const MemoryNeed n =
          EstimateStageMemory(c, begin, c.num_blocks(), B, M,
                              /*recompute=*/false, DType::kF32, "adamw", Device::Cpu());
      EXPECT_EQ(n.in_flight, M);
      EXPECT_GE(held, n.activations);
      const int64_t buffers_per_block = 16;  // no block keeps more
      EXPECT_LE(held, n.activations + int64_t{M} * n_blocks * buffers_per_block *
                                          static_cast<int64_t>(CachingAllocator::kRoundBytes));
      // The model state: what the stage and an AdamW optimizer allocate.
      const int64_t numel = st->layout().numel();
      EXPECT_EQ(n.params, static_cast<int64_t>(st->params().flat().bytes()));
      EXPECT_EQ(n.grads, static_cast<int64_t>(st->grads().flat().bytes()));
      EXPECT_EQ(n.optimizer, 2 * numel * 4);
      EXPECT_EQ(EstimateStageMemory(c, begin, c.num_blocks(), B, M, false, DType::kF32, "sgd",
                                    Device::Cpu())
                    .optimizer,
                numel * 4);
    }
  }
}

// The model state is all a CPU stage takes to start: no staging buffer of the parameters' size
// is left in the allocator's cache, where it would serve the next request up to half its size
// (the optimizer's moments of a ZeRO-1 shard) and be counted whole.
TEST(EstimateStageMemory, CreatingAStageLeavesNothingCached) {
  const ModelConfig c = Small("gpt");
  Allocator& alloc = **GetAllocator(Device::Cpu());
  alloc.EmptyCache();
  const AllocatorStats before = alloc.stats();
  auto st = *Stage::Create(c, 0, c.num_blocks(), Device::Cpu(), 7);
  const AllocatorStats after = alloc.stats();
  const MemoryNeed n = EstimateStageMemory(c, 0, c.num_blocks(), 1, 1, false, DType::kF32,
                                           "adamw", Device::Cpu());
  const int64_t taken = after.allocated_bytes - before.allocated_bytes;
  EXPECT_GE(taken, n.params + n.grads);
  EXPECT_LE(taken, n.params + n.grads + 2 * static_cast<int64_t>(CachingAllocator::kRoundBytes));
  EXPECT_EQ(after.reserved_bytes - before.reserved_bytes, taken) << "left in the cache";
}

// A step of M micro-batches on a stage as the pipeline runs it (PeakOfAStep): the whole model,
// a last stage, a first stage and a middle one. The estimate with its temporaries and the ops'
// scratch against the allocator's peak: at least the estimate, and above it by no more than
// what the estimate leaves out (PeakSlack).
TEST(EstimateStageMemory, PeakOfAStepMatchesTheAllocator) {
  for (const ModelConfig& c : Configs()) {
    const int n = c.num_blocks();
    for (const auto& [begin, end] :
         std::vector<std::pair<int, int>>{{0, n}, {2, n}, {0, 2}, {1, 3}}) {
      for (int M : {1, 3}) {
        SCOPED_TRACE(c.ToString() + " " + AttentionName(c.attention) + " blocks " +
                     std::to_string(begin) + " to " + std::to_string(end) + ", " +
                     std::to_string(M) + " micro-batches");
        ExpectPeakOfAStepMatchesTheEstimate(c, begin, end, /*B=*/64, M, Device::Cpu(), DType::kF32);
      }
    }
  }
}

TEST(EstimateStageMemory, StagesAddUpAndRecomputeKeepsOneMicroBatch) {
  const ModelConfig c = Small("gpt");
  const int n = c.num_blocks();
  const MemoryNeed whole =
      EstimateStageMemory(c, 0, n, 4, 2, false, DType::kF32, "adamw", Device::Cpu());
  const MemoryNeed a =
      EstimateStageMemory(c, 0, 2, 4, 2, false, DType::kF32, "adamw", Device::Cpu());
  const MemoryNeed b =
      EstimateStageMemory(c, 2, n, 4, 2, false, DType::kF32, "adamw", Device::Cpu());
  // The (4, 8, 16) f32 output of the first stage moves to the second, per micro-batch: the
  // second holds it as its input, the first no longer.
  const int64_t input = 4 * 8 * 16 * 4;
  auto held = [](const MemoryNeed& n) { return n.total() - n.workspace; };
  EXPECT_EQ(held(a) + held(b), held(whole));
  // Temporaries peak in one block at a time: the second stage's largest (the last layer's
  // backward, on top of what the head's backward freed) is the whole model's too; the first
  // stage's last layer has nothing after it to free, so its peak is no lower.
  EXPECT_EQ(b.workspace, whole.workspace);
  EXPECT_GT(whole.workspace, 0);
  EXPECT_GE(a.workspace, whole.workspace);
  const MemoryNeed one =
      EstimateStageMemory(c, 0, n, 4, 1, false, DType::kF32, "adamw", Device::Cpu());
  EXPECT_EQ(whole.activations, 2 * one.activations);
  const MemoryNeed re =
      EstimateStageMemory(c, 0, n, 4, 2, true, DType::kF32, "adamw", Device::Cpu());
  EXPECT_EQ(re.activations, one.activations);
  EXPECT_EQ(re.in_flight, 2);
  const MemoryNeed re_b =
      EstimateStageMemory(c, 2, n, 4, 2, true, DType::kF32, "adamw", Device::Cpu());
  EXPECT_EQ(re_b.activations, 2 * input + (b.activations - 2 * input) / 2);
  // bf16: a 16-bit copy of the weights, and 16-bit activations but for the f32 statistics,
  // probabilities and losses.
  const MemoryNeed half =
      EstimateStageMemory(c, 0, n, 4, 1, false, DType::kBF16, "adamw", Device::Cpu());
  EXPECT_EQ(half.params, one.params * 3 / 2);
  EXPECT_LT(half.activations, one.activations);
  EXPECT_GT(half.activations, one.activations / 2);
}

// Tied, the whole model holds the table once and a pipeline's last stage holds a copy: the
// estimate counts what each stage allocates, by hand from the shapes.
TEST(EstimateStageMemory, TiedEmbeddingsCountTheLastStagesCopy) {
  ModelConfig untied = Small("gpt"), tied = Small("gpt");
  tied.tie_embeddings = true;
  const int n = tied.num_blocks();
  const int64_t table = int64_t{tied.vocab} * tied.d_model;
  auto f32_grads = [&](const ModelConfig& c, int begin, int end) {
    return EstimateStageMemory(c, begin, end, 2, 1, false, DType::kF32, "adamw", Device::Cpu())
        .grads;
  };
  EXPECT_EQ(f32_grads(tied, 0, n), 4 * (untied.num_params() - table));
  for (int k = 1; k < n; ++k) {
    // The last stage's copy takes the place of the untied head's weight: the same size.
    EXPECT_EQ(f32_grads(tied, k, n), f32_grads(untied, k, n)) << k;
    EXPECT_EQ(f32_grads(tied, 0, k) + f32_grads(tied, k, n), 4 * (tied.num_params() + table));
    auto last = *Stage::Create(tied, k, n, Device::Cpu(), 1);
    EXPECT_EQ(f32_grads(tied, k, n), 4 * last->layout().numel()) << k;
  }
}

TEST(EstimateStageMemory, StandardAttentionGrowsWithTheSquareOfTheSequence) {
  ModelConfig c = *ModelPreset("gpt-tiny");
  auto activations = [&](int seq_len, Attention a) {
    c.seq_len = seq_len;
    c.attention = a;
    return EstimateStageMemory(c, 0, c.num_blocks(), 8, 1, false, DType::kF32, "adamw",
                               Device::Cpu())
        .activations;
  };
  // (B, NH, T, T) f32 probabilities in each of 8 layers: 8 * 4 * 1e10 * 4 bytes each.
  EXPECT_GE(activations(100000, Attention::kStandard), 8 * int64_t{8 * 4} * 100000 * 100000 * 4);
  EXPECT_GT(activations(100000, Attention::kStandard),
            90 * activations(10000, Attention::kStandard));
  EXPECT_EQ(activations(100000, Attention::kFlash), 10 * activations(10000, Attention::kFlash));
}

TEST(CheckMemory, RefusesWithTheFiguresAndTheFix) {
  MemoryNeed n;
  n.params = n.grads = 1 << 20;
  n.optimizer = 2 << 20;
  n.activations = int64_t{3} << 30;
  n.in_flight = 4;
  EXPECT_TRUE(CheckMemory(n, n.total(), "rank 0", "cpu").ok());
  EXPECT_TRUE(CheckMemory(n, -1, "rank 0", "cpu").ok());  // unknown: not checked
  const absl::Status s =
      ExplainOutOfMemory(CheckMemory(n, int64_t{1} << 30, "rank 2", "cuda:2"), '_');
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("not enough memory for rank 2: at least 3.0 GB is needed"));
  EXPECT_THAT(s.message(), HasSubstr("activations 3.0 GB for 4 micro-batches held at once"));
  EXPECT_THAT(s.message(), HasSubstr("cuda:2 has 1.0 GB available"));
  EXPECT_THAT(s.message(), HasSubstr("--seq_len"));
  EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos);
}

// System memory with nothing to give, so the allocator reports out of memory.
class NoMemory : public SystemMemory {
 public:
  absl::StatusOr<void*> Allocate(size_t) override { return nullptr; }
  void Free(void*, size_t) override {}
  Device device() const override { return Device::Cpu(); }
  std::string name() const override { return "none"; }
};

TEST(ExplainOutOfMemory, SaysWhatNeedsLess) {
  CachingAllocator allocator(std::make_unique<NoMemory>(), {});
  const absl::Status oom = allocator.Allocate(1 << 20).status();
  ASSERT_EQ(oom.code(), absl::StatusCode::kResourceExhausted) << oom;

  const absl::Status launcher = ExplainOutOfMemory(oom, '-');
  EXPECT_EQ(launcher.code(), absl::StatusCode::kResourceExhausted);
  const std::string m(launcher.message());
  EXPECT_EQ(m.rfind(std::string(oom.message()), 0), 0u) << m;  // the allocator's words first
  for (const char* flag : {"--batch", "--seq-len", "--micro-batches", "--attention=flash"}) {
    EXPECT_NE(m.find(flag), std::string::npos) << flag << " in: " << m;
  }
  const std::string train(ExplainOutOfMemory(oom, '_').message());
  EXPECT_NE(train.find("--seq_len"), std::string::npos) << train;
  EXPECT_NE(train.find("--micro_batches"), std::string::npos) << train;

  // Other failures, a refused oversized coordinator message among them, pass unchanged.
  const absl::Status big = absl::ResourceExhaustedError("message of 3 MB over the 2 MB limit");
  EXPECT_EQ(ExplainOutOfMemory(big, '-'), big);
  const absl::Status other = absl::InternalError("out of memory? no: a kernel failed");
  EXPECT_EQ(ExplainOutOfMemory(other, '-'), other);
  EXPECT_TRUE(ExplainOutOfMemory(absl::OkStatus(), '-').ok());
}

TEST(AllocatableBytes, CountTheAllocatorsCachedBlocks) {
  EXPECT_GT(AvailableMemoryBytes(Device::Cpu()), int64_t{16} << 20);
  // A freed block stays cached in the allocator, ready for the next allocation.
  Allocator& alloc = **GetAllocator(Device::Cpu());
  { Tensor t = *Tensor::Empty({int64_t{64} << 20}, DType::kF32, Device::Cpu()); }
  const AllocatorStats st = alloc.stats();
  const int64_t cached = st.reserved_bytes - st.allocated_bytes;
  EXPECT_GE(cached, int64_t{256} << 20);
  // Host memory moves under other processes: allow 64 MB between two reads.
  const int64_t system = AvailableMemoryBytes(Device::Cpu());
  EXPECT_NEAR(static_cast<double>(AllocatableBytes(Device::Cpu()) - system),
              static_cast<double>(cached), 64 << 20);
}

}  // namespace
}  // namespace tandem
