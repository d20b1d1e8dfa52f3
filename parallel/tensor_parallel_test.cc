// Run under mpirun on 2, 4 and 8 ranks (tensor_parallel_test_np2, _np4, _np8): tensor
// parallelism (model/tensor_parallel.h) against one worker on the same global batch and seed,
// losses within 1e-5 relative and every rank's part of each weight within the parity
// tolerance of the same part of one worker's: T over every rank (data strategy), T=2 beside
// data parallelism and beside a pipeline (1F1B and ZB-H1), tied embeddings, recompute, the
// validation loss, resumes across T (checkpoints hold whole tensors), and on 8 ranks
// T=2 x D=2 x K=2 with ZeRO-1. And one stage's forward and
// backward against the whole model's, which a dropped collective or a skipped max breaks.
#include <algorithm>
#include <cstdio>
#include <utility>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "comm/mpi_test_main.h"
#include "gtest/gtest.h"
#include "model/stage.h"
#include "parallel/parity_testing.h"
#include "parallel/process_groups.h"
#include "runtime/allocator.h"
#include "runtime/ops.h"

namespace tandem {
namespace {

Communicator* comm = nullptr;
constexpr int kSteps = 10;
constexpr double kWeightTolerance = 1e-4;  // absolute, as the hybrid layouts'

// The parity model with 4 heads (d_model 16), so that T = 2 and T = 4 split it.
TrainConfig Config(const std::string& optimizer, int micro_batches) {
  TrainConfig c = ParityConfig(ModelKind::kGpt, micro_batches, optimizer, kSteps);
  c.model.n_head = 4;
  return c;
}

ParallelConfig Layout(int tp, StrategyKind strategy, int micro_batches,
                      const std::string& optimizer = "adamw") {
  ParallelConfig pc;
  pc.train = Config(optimizer, micro_batches);
  pc.strategy = strategy;
  pc.tensor_parallel = tp;
  pc.bucket_bytes = 4096;
  return pc;
}

void Check(const ParallelConfig& pc, const std::string& name) {
  CheckParity(pc, comm, name, kWeightTolerance);
}

TEST(TensorParallelTest, EveryRankOneStage) {
  const int T = comm->world_size();
  if (T > 4) GTEST_SKIP() << "the model's 4 heads split over at most 4 ranks";
  for (const std::string& opt : {"sgd", "adamw"}) {
    for (int mbs : {1, 2}) {
      Check(Layout(T, StrategyKind::kData, mbs, opt),
            absl::StrFormat("T=%d data mb=%d", T, mbs));
    }
  }
  ParallelConfig recompute = Layout(T, StrategyKind::kData, 2);
  recompute.recompute = true;
  Check(recompute, absl::StrFormat("T=%d recompute", T));
  ParallelConfig tied = Layout(T, StrategyKind::kData, 1);
  tied.train.model.tie_embeddings = true;
  Check(tied, absl::StrFormat("T=%d tied", T));
  for (int mbs : {1, 2}) {
    ParallelConfig sp = Layout(T, StrategyKind::kData, mbs);
    sp.sequence_parallel = true;
    sp.recompute = mbs == 2;
    Check(sp, absl::StrFormat("T=%d sequence parallel mb=%d recompute=%d", T, mbs, mbs == 2));
  }
  ParallelConfig tied_sp = tied;
  tied_sp.sequence_parallel = true;
  Check(tied_sp, absl::StrFormat("T=%d tied sequence parallel", T));
}

TEST(TensorParallelTest, BesideDataParallelism) {
  if (comm->world_size() != 4) GTEST_SKIP() << "T=2 x D=2 takes 4 ranks";
  for (int zero : {0, 1}) {
    for (bool sp : {false, true}) {
      ParallelConfig pc = Layout(2, StrategyKind::kData, 2);
      pc.zero = zero;
      pc.sequence_parallel = sp;
      Check(pc, absl::StrFormat("T=2 x D=2 data zero=%d sequence parallel=%d", zero, sp));
    }
  }
}

TEST(TensorParallelTest, BesideAPipeline) {
  if (comm->world_size() != 4) GTEST_SKIP() << "T=2 x K=2 takes 4 ranks";
  for (const char* schedule : {"1f1b", "zb-h1"}) {
    for (bool tied : {false, true}) {
      for (bool sp : {false, true}) {
        ParallelConfig pc = Layout(2, StrategyKind::kPipeline, 4);
        pc.schedule = schedule;
        pc.train.model.tie_embeddings = tied;
        pc.sequence_parallel = sp;
        Check(pc, absl::StrFormat("T=2 x K=2 %s tied=%d sequence parallel=%d", schedule, tied,
                                  sp));
      }
    }
  }
}

TEST(TensorParallelTest, ValidationLoss) {
  if (comm->world_size() != 4) GTEST_SKIP() << "T=2 x K=2 takes 4 ranks";
  ParallelConfig pc = Layout(2, StrategyKind::kPipeline, 4);
  pc.schedule = "1f1b";
  pc.sequence_parallel = true;
  pc.train.val_fraction = 0.1;
  pc.train.eval_every = 5;
  pc.train.eval_batches = 2;
  CheckValidationParity(TrainOneWorkerValidated(pc.train), pc, comm,
                        "T=2 x K=2 sequence parallel validation");
}

TEST(TensorParallelTest, EveryAxisWithZeroOne) {
  if (comm->world_size() != 8) GTEST_SKIP() << "T=2 x D=2 x K=2 takes 8 ranks";
  ParallelConfig pc = Layout(2, StrategyKind::kPipeline, 4);
  pc.schedule = "1f1b";
  pc.data_parallel = 2;
  pc.zero = 1;
  Check(pc, "T=2 x D=2 x K=2 1f1b zero=1");
  pc.sequence_parallel = true;
  pc.schedule = "zb-h1";
  Check(pc, "T=2 x D=2 x K=2 zb-h1 zero=1 sequence parallel");
}

// Checkpoints hold whole tensors: a T=2 x K=2 run resumes as one worker, and one worker's
// checkpoint as T over every rank, each with the losses and weights of one worker's
// uninterrupted run (within the parity tolerance: the reductions' order changes with T).
TEST(TensorParallelTest, ResumeAcrossTensorParallelism) {
  const int world = comm->world_size();
  if (world != 4) GTEST_SKIP() << "T=2 x K=2 and T=4 take 4 ranks";
  ParallelConfig one = Layout(1, StrategyKind::kData, 1);
  ParallelConfig t2k2 = Layout(2, StrategyKind::kPipeline, 4);
  t2k2.schedule = "1f1b";
  ParallelConfig t4 = Layout(4, StrategyKind::kData, 1);
  t4.data_parallel = world;  // over every rank (CheckResume's convention)
  CheckResume(t2k2, one, comm, kWeightTolerance, "T=2 x K=2 into one worker");
  CheckResume(one, t4, comm, kWeightTolerance, "one worker into T=4");
  ParallelConfig tied = t2k2;
  tied.train.model.tie_embeddings = true;
  ParallelConfig tied_one = one;
  tied_one.train.model.tie_embeddings = true;
  CheckResume(tied, tied_one, comm, kWeightTolerance, "tied T=2 x K=2 into one worker");
}

// Stopped and resumed in the same layout, a run gives the losses of one never stopped, bit for
// bit: the checkpoint's whole tensors cut again into the same parts, the same reductions.
TEST(TensorParallelTest, ResumeInTheSameLayoutIsBitwise) {
  if (comm->world_size() != 4) GTEST_SKIP() << "T=2 x D=2 with ZeRO-1 takes 4 ranks";
  ParallelConfig pc = Layout(2, StrategyKind::kData, 2);
  pc.zero = 1;
  const Trained whole = TrainDistributed(pc, comm, kSteps);
  const std::string save = absl::StrFormat("%s/same-layout", std::getenv("TEST_TMPDIR"));
  if (comm->rank() == 0) std::filesystem::create_directories(save);
  auto barrier = comm->Barrier();
  ASSERT_TRUE(barrier.ok() && (*barrier)->Wait(absl::Minutes(2)).ok());
  TrainDistributed(pc, comm, kSteps / 2, "", save);
  const Trained resumed = TrainDistributed(
      pc, comm, kSteps / 2, absl::StrFormat("%s/step-%06d", save, kSteps / 2));
  ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(kSteps / 2));
  for (int i = 0; i < kSteps / 2; ++i) {
    EXPECT_EQ(resumed.losses[i], whole.losses[kSteps / 2 + i]) << "step " << kSteps / 2 + i;
  }
  for (const auto& [name, values] : resumed.params) {
    EXPECT_EQ(values, whole.params.at(name)) << name;
  }
}

// The memory check's estimate against the allocator, on every tensor-parallel layout of this
// world: each rank's parameters are its parts' (the estimate's bytes, exactly), and the peak of
// the allocator's requested bytes over a second step (the first warms its cache), above what
// was live before, is the estimate's activations and temporaries within 10% (and 4 KiB, for
// the smallest stages). The layouts: T over every rank, T=2 x D=2 and T=2 x K=2 (1F1B).
TEST(TensorParallelTest, MemoryEstimateIsTheAllocatorsPeak) {
  const int world = comm->world_size();
  std::vector<std::pair<std::string, ParallelConfig>> layouts;
  if (world <= 4) layouts.push_back({"T over every rank", Layout(world, StrategyKind::kData, 1)});
  if (world == 4) {
    layouts.push_back({"T=2 x D=2", Layout(2, StrategyKind::kData, 1)});
    ParallelConfig pipe = Layout(2, StrategyKind::kPipeline, 4);
    pipe.schedule = "1f1b";
    layouts.push_back({"T=2 x K=2 1f1b", pipe});
  }
  const size_t plain = layouts.size();
  for (size_t i = 0; i < plain; ++i) {
    ParallelConfig sp = layouts[i].second;
    sp.sequence_parallel = true;
    layouts.push_back({layouts[i].first + ", sequence parallel", sp});
  }
  if (layouts.empty()) GTEST_SKIP() << "no tensor-parallel layout checked on " << world;
  for (const auto& [name, pc] : layouts) {
    SCOPED_TRACE(name);
    auto t = DistributedTrainer::Create(pc, comm);
    ASSERT_TRUE(t.ok()) << t.status();
    const MemoryNeed need = (*t)->memory().need;
    EXPECT_EQ(need.params, static_cast<int64_t>((*t)->stage().params().flat().bytes()));
    Allocator* cpu = *GetAllocator(Device::Cpu());
    ASSERT_TRUE((*t)->Step().ok());
    const int64_t peak = PeakRequestedDuring(*cpu, [&] { EXPECT_TRUE((*t)->Step().ok()); });
    const double estimate = static_cast<double>(need.activations + need.workspace);
    std::printf("%s, rank %d: peak %lld bytes, estimate %.0f (%+.1f%%)\n", name.c_str(),
                comm->rank(), static_cast<long long>(peak), estimate,
                100 * (peak - estimate) / estimate);
    std::fflush(stdout);
    EXPECT_NEAR(static_cast<double>(peak), estimate, 0.10 * estimate + 4096)
        << "rank " << comm->rank() << ": the allocator's peak against the estimate";
  }
}

// ---- one stage against the whole model --------------------------------------------------------

// The tensor-parallel group of every rank, forwarding to the real one but for the collective a
// mutation drops: the `drop`-th of the pass (0-based, of any kind), or with `drop_max` every
// max. Counts the collectives it is asked for.
class MutatedGroup : public TensorGroup {
 public:
  MutatedGroup(TensorGroup* real, int drop, bool drop_max)
      : real_(real), drop_(drop), drop_max_(drop_max) {}
  absl::Status AllReduceSum(Stream& s, const Tensor& t, const char* what) override {
    if (Dropped()) return absl::OkStatus();
    return real_->AllReduceSum(s, t, what);
  }
  absl::Status AllReduceMax(Stream& s, const Tensor& t, const char* what) override {
    if (Dropped() || drop_max_) return absl::OkStatus();
    return real_->AllReduceMax(s, t, what);
  }
  // A dropped gather or reduce-scatter leaves its output unwritten: what the allocator's
  // block held before, which may happen to be the right values (the same rows gathered in
  // forward), so it is poisoned here.
  absl::Status AllGather(Stream& s, const Tensor& all, const Tensor& mine,
                         const char* what) override {
    if (Dropped()) return ops::Fill(s, all, 1e3f);
    return real_->AllGather(s, all, mine, what);
  }
  absl::Status ReduceScatterSum(Stream& s, const Tensor& mine, const Tensor& all,
                                const char* what) override {
    if (Dropped()) return ops::Fill(s, mine, 1e3f);
    return real_->ReduceScatterSum(s, mine, all, what);
  }
  int calls() const { return calls_; }

 private:
  bool Dropped() { return calls_++ == drop_; }
  TensorGroup* real_;
  int drop_, calls_ = 0;
  bool drop_max_;
};

struct Pass {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> grads;  // by name
  std::map<std::string, ParamSpec> specs;
};

// One micro-batch forward and backward through a stage of every block: the whole model
// (group null), or this rank's part over `group`.
Pass RunStage(const ModelConfig& model, TensorGroup* group, bool sequence = false) {
  TensorParallel tp;
  if (group != nullptr) tp = {comm->world_size(), comm->rank(), group, sequence};
  auto st = Stage::Create(model, {{0, model.num_blocks()}}, Device::Cpu(), 7, DType::kF32, tp);
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok()) return {};
  Stream& s = *Stream::Compute(Device::Cpu()).value();
  const int64_t B = 2, T = model.seq_len;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[i] = static_cast<int32_t>((i * 37 + 11) % model.vocab);
    targets[i] = static_cast<int32_t>((i * 53 + 5) % model.vocab);
  }
  MicroBatch mb;
  mb.tokens = *Tensor::FromInts(tokens, {B, T});
  mb.targets = *Tensor::FromInts(targets, {B, T});
  mb.dloss_scale = 1.0f / (B * T);
  Tensor losses, dx;
  const absl::Status forward = (*st)->Forward(s, 0, mb, Tensor(), &losses);
  EXPECT_TRUE(forward.ok()) << forward;
  const absl::Status backward = (*st)->Backward(s, 0, mb, Tensor(), &dx);
  EXPECT_TRUE(backward.ok()) << backward;
  EXPECT_TRUE(s.Synchronize().ok());
  Pass p;
  p.losses = *losses.ToFloatVector();
  const std::vector<float> g = *(*st)->grads().flat().ToFloatVector();
  for (const ParamEntry& e : (*st)->layout().entries()) {
    p.grads[e.spec.name].assign(g.begin() + e.offset, g.begin() + e.offset + e.spec.shape.numel());
    p.specs[e.spec.name] = e.spec;
  }
  return p;
}

// How far `got` (this rank's parts) is from `want` (the whole model's): the largest
// difference of a loss, relative, and of a gradient element, relative to its tensor's
// largest magnitude.
double Distance(const Pass& want, const Pass& got) {
  double worst = 0;
  for (size_t i = 0; i < want.losses.size() && i < got.losses.size(); ++i) {
    worst = std::max(worst, std::fabs(got.losses[i] - want.losses[i]) /
                                std::max(1e-12, double{std::fabs(want.losses[i])}));
  }
  if (got.losses.size() != want.losses.size()) worst = INFINITY;
  for (const auto& [name, values] : got.grads) {
    const ParamSpec& spec = got.specs.at(name);
    std::vector<float> part(values.size());
    ExtractShard(spec, want.grads.at(name).data(), part.data());
    double scale = 1e-12;
    for (float v : part) scale = std::max(scale, double{std::fabs(v)});
    for (size_t i = 0; i < part.size(); ++i) {
      const double d = std::fabs(values[i] - part[i]) / scale;
      worst = std::max(worst, std::isfinite(d) ? d : INFINITY);
    }
  }
  return worst;
}

TEST(TensorParallelTest, AStageIsTheWholeModelAndEveryCollectiveCounts) {
  const int T = comm->world_size();
  if (T > 4) GTEST_SKIP() << "the model's 4 heads split over at most 4 ranks";
  ModelConfig model = Config("sgd", 1).model;
  model.tie_embeddings = true;
  const Pass whole = RunStage(model, nullptr);
  ParallelConfig pc = Layout(T, StrategyKind::kData, 1);
  auto layout = ResolveLayout(pc, T);
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto groups = MakeProcessGroups(*layout, model.tie_embeddings, comm);
  ASSERT_TRUE(groups.ok()) << groups.status();
  CommTensorGroup real(groups->tp.get(), absl::Minutes(1), "rank");
  for (bool sequence : {false, true}) {
    SCOPED_TRACE(sequence ? "sequence parallel" : "tensor parallel");
    MutatedGroup intact(&real, -1, false);
    EXPECT_LT(Distance(whole, RunStage(model, &intact, sequence)), 1e-5) << "T=" << T;
    // Without sequence parallelism: a sum in the embedding, 2 in each layer's forward and 2 in
    // its backward (1 + 3 x 4), the head's max, its loss's sum and its backward's. With it: the
    // embedding's reduce-scatter and all-gather, each layer's 4 in forward and 7 in backward
    // (the LayerNorms' sum among them), the head's gather, max, sum, reduce-scatter and sum.
    EXPECT_EQ(intact.calls(), sequence ? 2 + 3 * 11 + 5 : 1 + 3 * 4 + 3);
    for (int drop = 0; drop < intact.calls(); ++drop) {
      MutatedGroup mutant(&real, drop, false);
      EXPECT_GT(Distance(whole, RunStage(model, &mutant, sequence)), 1e-3)
          << "T=" << T << ": dropping collective " << drop << " went unnoticed";
    }
    MutatedGroup no_max(&real, -1, true);
    EXPECT_GT(Distance(whole, RunStage(model, &no_max, sequence)), 1e-3)
        << "T=" << T << ": skipping the vocabulary-parallel max went unnoticed";
  }
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::RunMpiTests(argc, argv, &tandem::comm); }
