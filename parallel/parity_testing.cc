#include "parallel/parity_testing.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace tandem {

TrainConfig ParityConfig(ModelKind kind, int micro_batches, const std::string& optimizer,
                         int steps) {
  TrainConfig c;
  c.model = *ModelPreset(kind == ModelKind::kGpt ? "gpt" : "mlp");
  c.model.n_layer = 3;
  c.model.d_model = 16;
  c.model.n_head = 2;
  c.model.seq_len = 8;
  c.batch = 24;
  c.micro_batches = micro_batches;
  c.steps = steps;
  c.optimizer.kind = optimizer;
  c.optimizer.lr = 1e-2f;
  c.optimizer.warmup_steps = 3;
  c.optimizer.total_steps = steps;
  c.optimizer.weight_decay = 0.05f;
  c.synthetic_data = false;
  c.seed = 42;
  return c;
}

Trained Collect(const Stage& st, std::vector<float> losses) {
  Trained r;
  r.losses = std::move(losses);
  std::vector<float> flat = *st.params().flat().ToFloatVector();
  for (const ParamEntry& e : st.layout().entries()) {
    r.params[e.spec.name] = std::vector<float>(flat.begin() + e.offset,
                                               flat.begin() + e.offset + e.spec.shape.numel());
    r.specs[e.spec.name] = e.spec;
  }
  return r;
}

Trained TrainOneWorker(TrainConfig c) {
  c.micro_batches = 1;
  auto t = Trainer::Create(c);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  std::vector<float> losses, norms;
  EXPECT_TRUE((*t)->Run([&](const StepReport& r) {
                    losses.push_back(r.loss);
                    norms.push_back(r.grad_norm);
                  }).ok());
  Trained r = Collect((*t)->stage(), losses);
  r.grad_norms = norms;
  return r;
}

Trained TrainDistributed(const ParallelConfig& pc, Communicator* comm, int steps,
                         const std::string& resume, const std::string& save_dir) {
  auto t = DistributedTrainer::Create(pc, comm);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  if (!resume.empty()) {
    absl::Status s = (*t)->LoadCheckpoint(resume);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return {};
  }
  std::vector<float> losses, norms;
  for (int i = 0; i < steps; ++i) {
    auto r = (*t)->Step();
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    losses.push_back(r->loss);
    norms.push_back(r->grad_norm);
  }
  if (!save_dir.empty()) {
    absl::Status s = (*t)->SaveCheckpoint(save_dir);
    EXPECT_TRUE(s.ok()) << s;
  }
  Trained trained = Collect((*t)->stage(), losses);
  trained.grad_norms = norms;
  return trained;
}

Validated TrainOneWorkerValidated(TrainConfig c) {
  c.micro_batches = 1;
  Validated v;
  auto t = Trainer::Create(c);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return v;
  EXPECT_TRUE((*t)->Run([&](const StepReport& r) {
                 v.losses.push_back(r.loss);
                 if (r.val_loss) v.val.push_back({r.step + 1, *r.val_loss});
               }).ok());
  return v;
}

Validated TrainDistributedValidated(const ParallelConfig& pc, Communicator* comm) {
  Validated v;
  auto t = DistributedTrainer::Create(pc, comm);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return v;
  for (int i = 0; i < pc.train.steps; ++i) {
    auto r = (*t)->Step();
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return v;
    v.losses.push_back(r->loss);
    if (!pc.train.EvalDue(i + 1)) continue;
    absl::StatusOr<float> val = (*t)->Evaluate();
    EXPECT_TRUE(val.ok()) << val.status();
    if (!val.ok()) return v;
    v.val.push_back({i + 1, *val});
  }
  return v;
}

void CheckValidationParity(const Validated& one, const ParallelConfig& pc, Communicator* comm,
                           const std::string& name) {
  SCOPED_TRACE(name);
  const Validated many = TrainDistributedValidated(pc, comm);
  ASSERT_EQ(many.val.size(), one.val.size());
  for (size_t i = 0; i < one.val.size(); ++i) {
    EXPECT_EQ(many.val[i].first, one.val[i].first);
    EXPECT_NEAR(many.val[i].second, one.val[i].second, 1e-5 * std::fabs(one.val[i].second))
        << "validation " << i << " on rank " << comm->rank();
  }
  ParallelConfig plain = pc;
  plain.train.eval_every = 0;
  EXPECT_EQ(many.losses, TrainDistributedValidated(plain, comm).losses)
      << "rank " << comm->rank();
  ExpectClose(one.losses, many.losses, name + " losses", 0, comm->rank());
}

void ExpectClose(const std::vector<float>& want, const std::vector<float>& got,
                 const std::string& what, double weight_tol, int rank, bool absolute) {
  ASSERT_EQ(want.size(), got.size()) << what;
  float scale = 0;
  for (float w : want) scale = std::max(scale, std::fabs(w));
  if (absolute) scale = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = weight_tol > 0 ? weight_tol * scale : 1e-5 * std::fabs(want[i]) + 1e-7;
    ASSERT_NEAR(got[i], want[i], tol) << what << " element " << i << " on rank " << rank;
  }
}

void ExpectSameWeights(const Trained& want, const Trained& got, const std::string& what,
                       double weight_tol, int rank, bool absolute) {
  EXPECT_FALSE(got.params.empty()) << what;
  for (const auto& [param, values] : got.params) {
    auto it = want.params.find(param);
    ASSERT_NE(it, want.params.end()) << what << ": " << param;
    auto spec = got.specs.find(param);
    if (spec != got.specs.end() && spec->second.shard.split()) {
      ASSERT_EQ(it->second.size(), spec->second.WholeShape().numel()) << what << ": " << param;
      std::vector<float> part(values.size());
      ExtractShard(spec->second, it->second.data(), part.data());
      ExpectClose(part, values, what + " " + param, weight_tol, rank, absolute);
      continue;
    }
    ExpectClose(it->second, values, what + " " + param, weight_tol, rank, absolute);
  }
}

double WeightTolerance(const std::string& optimizer) {
  return optimizer == "sgd" ? 1e-5 : 1e-3;
}

void CheckResume(const ParallelConfig& first, const ParallelConfig& second,
                 Communicator* comm, double weight_abs_tol, const std::string& name) {
  const int steps = first.train.steps;
  SCOPED_TRACE(name);
  const int rank = comm->rank();
  const Trained whole = TrainOneWorker(first.train);
  // One rank alone is data parallelism on one worker.
  auto alone = comm->Split(rank, 0, "this rank alone", {rank});
  ASSERT_TRUE(alone.ok()) << alone.status();
  auto run = [&](const ParallelConfig& pc, const std::string& resume, const std::string& save) {
    const bool one = pc.strategy == StrategyKind::kData && pc.data_parallel == 1 &&
                     pc.zero == 0 && comm->world_size() > 1;
    if (one && rank != 0) return Trained{};
    return TrainDistributed(pc, one ? alone->get() : comm, steps / 2, resume, save);
  };
  static int runs = 0;  // the same directory on every rank (TEST_TMPDIR is shared)
  const std::string save = absl::StrFormat("%s/resume-%d", std::getenv("TEST_TMPDIR"), ++runs);
  if (rank == 0) ASSERT_TRUE(std::filesystem::create_directories(save));
  {
    auto made = comm->Barrier();
    ASSERT_TRUE(made.ok() && (*made)->Wait(absl::Minutes(2)).ok());
  }
  run(first, "", save);
  auto barrier = comm->Barrier();
  ASSERT_TRUE(barrier.ok() && (*barrier)->Wait(absl::Minutes(2)).ok());
  const Trained resumed =
      run(second, absl::StrFormat("%s/step-%06d", save, steps / 2), "");
  if (resumed.losses.empty()) return;  // a rank outside the one-worker run
  ExpectClose(std::vector<float>(whole.losses.begin() + steps / 2, whole.losses.end()),
              resumed.losses, name + " losses", 0, rank);
  ExpectSameWeights(whole, resumed, name, weight_abs_tol, rank, /*absolute=*/true);
}

void ExpectTiedCopiesEqual(const ParallelConfig& pc, Communicator* comm, const Trained& got) {
  const ProcessGrid grid = ResolveLayout(pc, comm->world_size())->grid;
  if (!pc.train.model.tie_embeddings || grid.stages == 1) return;
  const int rank = comm->rank(), replica = grid.ReplicaOf(rank), stage = grid.StageOf(rank);
  const int tensor = grid.TensorOf(rank);
  if (stage != 0 && stage != grid.stages - 1) return;
  auto it = got.params.find("embed.wte");
  ASSERT_NE(it, got.params.end()) << "rank " << rank << " holds no embed.wte";
  const std::vector<float>& mine = it->second;
  // The first stage's table to its replica's last stage, which compares it with its copy.
  const Tensor t = *Tensor::FromVector(mine, {static_cast<int64_t>(mine.size())});
  auto w = stage == 0 ? comm->Send(t, grid.RankOf(replica, grid.stages - 1, tensor))
                      : comm->Recv(t, grid.RankOf(replica, 0, tensor));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Wait(absl::Minutes(2)).ok());
  if (stage == 0) return;
  EXPECT_EQ(*t.ToFloatVector(), mine) << "replica " << replica
                                      << ": the last stage's copy of embed.wte differs from the "
                                         "first stage's";
}

void CheckParity(const ParallelConfig& pc, Communicator* comm, const std::string& name,
                 double weight_abs_tol) {
  SCOPED_TRACE(absl::StrFormat("%s %s on %d ranks", name, pc.train.optimizer.kind,
                               comm->world_size()));
  Trained one = TrainOneWorker(pc.train);
  Trained many = TrainDistributed(pc, comm, pc.train.steps);
  ExpectTiedCopiesEqual(pc, comm, many);
  // The norm counts each parameter once (a tied table's copy not twice).
  // (Within 1e-3 of the largest: AdamW turns rounding into visible changes, as in weights.)
  ExpectClose(one.grad_norms, many.grad_norms, name + " gradient norms", 1e-3, comm->rank());
  ExpectClose(one.losses, many.losses, name + " losses", 0, comm->rank());
  if (weight_abs_tol > 0) {
    ExpectSameWeights(one, many, name, weight_abs_tol, comm->rank(), /*absolute=*/true);
  } else {
    ExpectSameWeights(one, many, name, WeightTolerance(pc.train.optimizer.kind), comm->rank());
  }
}

}  // namespace tandem
