#include "parallel/distributed.h"

#include <chrono>
#include <cmath>
#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "model/sharded_checkpoint.h"
#include "runtime/allocator.h"
#include "runtime/ops.h"
#include "runtime/profiler.h"
#include "runtime/status.h"

namespace tandem {
namespace {

// How long ranks wait for the others to write their checkpoint shards (at least): the
// default timeout of torch.distributed's process groups.
constexpr absl::Duration kCheckpointWriteTimeout = absl::Minutes(30);

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Seconds spent in a scope, added to *acc.
class Timer {
 public:
  explicit Timer(double* acc) : acc_(acc), start_(Now()) {}
  ~Timer() {
    if (acc_) *acc_ += Now() - start_;
  }

 private:
  double* acc_;
  double start_;
};

// The schedule a pipeline follows; model parallelism is GPipe over its one micro-batch.
absl::StatusOr<PipelineSchedule> StrategySchedule(const ParallelConfig& c, int world) {
  const std::string schedule = c.strategy == StrategyKind::kModel ? "gpipe" : c.schedule;
  return MakeSchedule(schedule, world, c.train.micro_batches);
}

}  // namespace

absl::StatusOr<StrategyKind> ParseStrategy(absl::string_view name) {
  if (name == "data") return StrategyKind::kData;
  if (name == "model") return StrategyKind::kModel;
  if (name == "pipeline") return StrategyKind::kPipeline;
  return absl::InvalidArgumentError(
      absl::StrFormat("--strategy=%s: use data, model or pipeline", name));
}

const char* StrategyName(StrategyKind k) {
  switch (k) {
    case StrategyKind::kData: return "data";
    case StrategyKind::kModel: return "model";
    case StrategyKind::kPipeline: return "pipeline";
  }
  return "?";
}

absl::StatusOr<std::vector<double>> MeasureBlockSeconds(const ModelConfig& model, Device device,
                                                        DType compute, int rows, uint64_t seed) {
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(device));
  const int n = model.num_blocks();
  // One single-block stage per block, chained, so each block is timed on its own.
  std::vector<std::unique_ptr<Stage>> stages;
  for (int b = 0; b < n; ++b) {
    ASSIGN_OR_RETURN(std::unique_ptr<Stage> st,
                     Stage::Create(model, b, b + 1, device, seed, compute));
    stages.push_back(std::move(st));
  }
  const TokenDataset data = TokenDataset::Synthetic(int64_t{rows} * model.seq_len * 4 + 1,
                                                    model.seq_len, model.vocab, seed);
  ASSIGN_OR_RETURN(MicroBatch mb,
                   MakeMicroBatch(data, DataOrder(data.num_samples(), seed), 0, 0, rows,
                                  model.seq_len, device, 1.0f / (rows * model.seq_len)));
  constexpr int kRuns = 4;  // the first is a warm-up
  std::vector<std::vector<double>> runs(n);
  for (int r = 0; r < kRuns; ++r) {
    std::vector<Tensor> outs(n + 1);
    for (int b = 0; b < n; ++b) {
      const double t0 = Now();
      RETURN_IF_ERROR(stages[b]->Forward(*s, 0, mb, outs[b], &outs[b + 1]));
      RETURN_IF_ERROR(s->Synchronize());
      runs[b].push_back(Now() - t0);
    }
    Tensor d;
    for (int b = n - 1; b >= 0; --b) {
      const double t0 = Now();
      Tensor dx;
      RETURN_IF_ERROR(stages[b]->Backward(*s, 0, mb, d, &dx));
      RETURN_IF_ERROR(s->Synchronize());
      runs[b].back() += Now() - t0;
      d = dx;
    }
  }
  std::vector<double> seconds(n);
  for (int b = 0; b < n; ++b) {
    std::vector<double> v(runs[b].begin() + 1, runs[b].end());
    std::sort(v.begin(), v.end());
    seconds[b] = v[v.size() / 2];
  }
  return seconds;
}

absl::StatusOr<std::vector<double>> TimeBlocks(const ParallelConfig& c) {
  const TrainConfig& t = c.train;
  RETURN_IF_ERROR(t.Validate());
  ASSIGN_OR_RETURN(
      std::vector<double> seconds,
      MeasureBlockSeconds(t.model, t.device, t.dtype, t.batch / t.micro_batches, t.seed));
  // The process that timed may live on beside the workers: it keeps nothing cached.
  ASSIGN_OR_RETURN(Allocator * allocator, GetAllocator(t.device));
  allocator->EmptyCache();
  return seconds;
}

absl::StatusOr<std::string> BalancedSizes(const std::vector<double>& seconds, int world) {
  ASSIGN_OR_RETURN(StageBounds b, BalancedPartition(seconds, world));
  std::string sizes;
  for (int s = 0; s < world; ++s) absl::StrAppend(&sizes, s ? "," : "", b[s + 1] - b[s]);
  return sizes;
}

absl::StatusOr<std::string> ResolveBalance(const ParallelConfig& c, int world) {
  if (c.balance != "time" || c.strategy == StrategyKind::kData) return c.balance;
  ASSIGN_OR_RETURN(std::vector<double> seconds, TimeBlocks(c));
  return BalancedSizes(seconds, world);
}

absl::StatusOr<StageBounds> PlanStages(const ParallelConfig& c, int world) {
  const TrainConfig& t = c.train;
  RETURN_IF_ERROR(t.Validate());
  const int blocks = t.model.num_blocks();
  if (c.strategy == StrategyKind::kData) {
    if (t.batch % (world * t.micro_batches) != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--batch=%d is not divisible by %d workers x %d micro-batch%s; data parallelism "
          "gives every worker an equal share of every micro-batch: use a --batch that is a "
          "multiple of %d",
          t.batch, world, t.micro_batches, t.micro_batches == 1 ? "" : "es",
          world * t.micro_batches));
    }
    if (c.bucket_bytes < 1) {
      return absl::InvalidArgumentError("--bucket-mb must be positive");
    }
    return StageBounds{0, blocks};
  }
  if (c.strategy == StrategyKind::kModel && t.micro_batches != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--micro-batches=%d with --strategy=model: model parallelism runs one batch at a "
        "time; use --strategy=pipeline for micro-batches",
        t.micro_batches));
  }
  StageBounds bounds;
  if (c.balance == "params") {
    std::vector<double> cost;
    for (const auto& b : BuildBlocks(t.model)) {
      double n = 0;
      for (const ParamSpec& p : b->Params()) n += p.shape.numel();
      cost.push_back(n);
    }
    ASSIGN_OR_RETURN(bounds, BalancedPartition(cost, world));
  } else if (c.balance == "time") {
    ASSIGN_OR_RETURN(std::string sizes, ResolveBalance(c, world));
    ASSIGN_OR_RETURN(bounds, ExplicitPartition(sizes, blocks, world));
  } else {
    ASSIGN_OR_RETURN(bounds, ExplicitPartition(c.balance, blocks, world));
  }
  ASSIGN_OR_RETURN(PipelineSchedule s, StrategySchedule(c, world));
  RETURN_IF_ERROR(ValidateSchedule(s));
  return bounds;
}

absl::StatusOr<std::vector<MemoryNeed>> RankMemoryNeeds(const ParallelConfig& c,
                                                        const StageBounds& bounds, int world_size) {
  const TrainConfig& t = c.train;
  if (c.strategy == StrategyKind::kData) {
    // Every rank: the whole model, its share of the batch, one micro-batch after another.
    return std::vector<MemoryNeed>(
        world_size,
        EstimateStageMemory(t.model, 0, bounds.back(), t.batch / world_size / t.micro_batches,
                            /*in_flight=*/1, c.recompute, t.dtype, t.optimizer.kind, t.device));
  }
  ASSIGN_OR_RETURN(PipelineSchedule s, StrategySchedule(c, world_size));
  std::vector<MemoryNeed> needs;
  for (int r = 0; r < world_size; ++r) {
    needs.push_back(EstimateStageMemory(t.model, bounds[r], bounds[r + 1],
                                        t.batch / t.micro_batches, PeakInFlight(s, r), c.recompute,
                                        t.dtype, t.optimizer.kind, t.device));
  }
  return needs;
}

absl::StatusOr<std::unique_ptr<DistributedTrainer>> DistributedTrainer::Create(
    const ParallelConfig& c, Communicator* comm) {
  ASSIGN_OR_RETURN(StageBounds bounds, PlanStages(c, comm->world_size()));
  if (comm->device() != c.train.device) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the communicator is on %s but training on %s", comm->device().ToString(),
        c.train.device.ToString()));
  }
  const int rank = comm->rank();
  ASSIGN_OR_RETURN(std::vector<MemoryNeed> needs, RankMemoryNeeds(c, bounds, comm->world_size()));
  ASSIGN_OR_RETURN(MemoryCheck memory,
                   CheckDeviceMemory(needs[rank], c.train.device,
                                     absl::StrFormat("rank %d's training step", rank)));
  ASSIGN_OR_RETURN(TokenDataset data, LoadDataset(c.train));
  std::unique_ptr<DistributedTrainer> t(new DistributedTrainer(c, comm, std::move(data)));
  t->bounds_ = bounds;
  t->memory_ = memory;
  const bool data_parallel = c.strategy == StrategyKind::kData;
  const auto [begin, end] = t->BlockRange(rank);
  ASSIGN_OR_RETURN(t->stage_, Stage::Create(c.train.model, begin, end, c.train.device,
                                            c.train.seed, c.train.dtype));
  t->stage_->set_recompute(c.recompute);
  ASSIGN_OR_RETURN(t->optimizer_, Optimizer::Create(c.train.optimizer,
                                                    t->stage_->layout().numel(),
                                                    c.train.device));
  if (data_parallel) {
    t->buckets_ = PlanBuckets(t->stage_->layout(), t->stage_->ParamBlocks(), c.bucket_bytes);
    // Every replica starts from rank 0's weights.
    ASSIGN_OR_RETURN(auto w, comm->Broadcast(t->stage_->params().flat()));
    RETURN_IF_ERROR(t->Wait(*w, "the broadcast of rank 0's parameters"));
    ASSIGN_OR_RETURN(Stream * s, Stream::Compute(c.train.device));
    RETURN_IF_ERROR(t->stage_->ParamsChanged(*s));
  } else {
    ASSIGN_OR_RETURN(t->schedule_, StrategySchedule(c, comm->world_size()));
    t->exchange_groups_ = ExchangeGroups(t->schedule_)[rank];
    RETURN_IF_ERROR(t->ConnectNeighbours());
  }
  if (!c.train.resume.empty()) {
    return absl::InvalidArgumentError(
        "resume a distributed run with LoadCheckpoint(prefix), not TrainConfig::resume");
  }
  return t;
}

absl::Status DistributedTrainer::ConnectNeighbours() {
  const int rank = comm_->rank(), world = comm_->world_size();
  if (world == 1) return absl::OkStatus();
  const TrainConfig& tc = c_.train;
  const Shape activation{tc.batch / tc.micro_batches, tc.model.seq_len, tc.model.d_model};
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(tc.device));
  std::vector<PeerTransfer> group;
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(activation, tc.dtype, tc.device));
  RETURN_IF_ERROR(ZeroFill(out, *s));
  for (int peer : {rank - 1, rank + 1}) {
    if (peer < 0 || peer >= world) continue;
    ASSIGN_OR_RETURN(Tensor in, Tensor::Empty(activation, tc.dtype, tc.device));
    group.push_back(PeerTransfer::Send(out, peer));
    group.push_back(PeerTransfer::Recv(in, peer));
  }
  // The transfers' tensors stay referenced by the work until it completes.
  ASSIGN_OR_RETURN(std::unique_ptr<Work> w, comm_->SendRecv(group));
  return Wait(*w, "the first exchange with the neighbouring stages");
}

absl::Status DistributedTrainer::Wait(Work& w, const char* what, absl::Duration timeout) {
  absl::Status s = w.Wait(timeout);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrFormat("rank %d, step %d, waiting for %s: %s",
                                                comm_->rank(), step_, what, s.message()));
}

absl::StatusOr<MicroBatch> DistributedTrainer::LoadMicroBatch(int64_t row_begin, int64_t rows) {
  const TrainConfig& t = c_.train;
  return MakeMicroBatch(data_, order_, int64_t{step_} * t.batch, row_begin, rows,
                        t.model.seq_len, t.device,
                        scaler_.scale() / static_cast<float>(int64_t{t.batch} * t.model.seq_len));
}

absl::Status DistributedTrainer::DataParallelPass(Stream& s, Tensor* loss_sum, StepTiming* t) {
  const TrainConfig& tc = c_.train;
  const int world = comm_->world_size();
  const int64_t share = tc.batch / world;
  const int64_t rows = share / tc.micro_batches;
  std::vector<std::unique_ptr<Work>> pending;
  size_t next = 0;
  ASSIGN_OR_RETURN(Tensor scratch, Tensor::Empty({1}, DType::kF32, tc.device));
  auto issue = [&](size_t i) -> absl::Status {
    ASSIGN_OR_RETURN(Tensor g, stage_->grads().flat().View(
                                   buckets_[i].begin, {buckets_[i].end - buckets_[i].begin}));
    ASSIGN_OR_RETURN(auto w, comm_->AllReduce(g));
    t->comm_bytes += static_cast<int64_t>(g.bytes());
    pending.push_back(std::move(w));
    return absl::OkStatus();
  };
  for (int m = 0; m < tc.micro_batches; ++m) {
    ASSIGN_OR_RETURN(MicroBatch mb, LoadMicroBatch(comm_->rank() * share + m * rows, rows));
    const bool last = m == tc.micro_batches - 1;
    Timer compute(&t->compute_seconds);
    Tensor losses, dx;
    {
      SpanScope span(absl::StrCat("forward ", m), "compute", m);
      RETURN_IF_ERROR(stage_->Forward(s, m, mb, Tensor(), &losses));
      RETURN_IF_ERROR(AccumulateLoss(s, *loss_sum, losses, scratch));
    }
    // Gradient accumulation communicates only after the last micro-batch's gradients.
    auto block_done = [&](int block) -> absl::Status {
      if (!last || !c_.overlap) return absl::OkStatus();
      while (next < buckets_.size() && buckets_[next].ready_block >= block) {
        RETURN_IF_ERROR(issue(next++));
      }
      return absl::OkStatus();
    };
    SpanScope span(absl::StrCat("backward ", m), "compute", m);
    RETURN_IF_ERROR(stage_->Backward(s, m, mb, Tensor(), &dx, block_done));
  }
  while (next < buckets_.size()) RETURN_IF_ERROR(issue(next++));
  Timer exposed(&t->exposed_comm_seconds);
  SpanScope span("wait for gradients", "idle");
  for (auto& w : pending) RETURN_IF_ERROR(Wait(*w, w->description().c_str()));
  return absl::OkStatus();
}

absl::Status DistributedTrainer::PipelinePass(Stream& s, Tensor* loss_sum, StepTiming* t) {
  const TrainConfig& tc = c_.train;
  const int rank = comm_->rank();
  const int M = tc.micro_batches;
  const int64_t rows = tc.batch / M, T = tc.model.seq_len, C = tc.model.d_model;
  const std::vector<Action>& actions = schedule_.actions[rank];
  std::map<int, Tensor> outputs, input_grads, act_in, grad_in;
  std::map<int, std::shared_ptr<Work>> act_ready, grad_ready;
  std::vector<std::shared_ptr<Work>> all;
  std::map<int, MicroBatch> batches;
  Tensor scratch;  // the last stage sums its losses here
  if (stage_->is_last()) {
    ASSIGN_OR_RETURN(scratch, Tensor::Empty({1}, DType::kF32, tc.device));
  }
  auto batch = [&](int m) -> absl::StatusOr<MicroBatch*> {
    auto it = batches.find(m);
    if (it == batches.end()) {
      ASSIGN_OR_RETURN(MicroBatch mb, LoadMicroBatch(m * rows, rows));
      it = batches.emplace(m, std::move(mb)).first;
    }
    return &it->second;
  };
  auto wait_for = [&](std::map<int, std::shared_ptr<Work>>& ready, int m,
                      const char* what) -> absl::Status {
    auto it = ready.find(m);
    if (it == ready.end()) return absl::OkStatus();
    Timer bubble(&t->bubble_seconds);
    SpanScope span(absl::StrCat("wait ", m), "idle", m);
    RETURN_IF_ERROR(Wait(*it->second, what));
    ready.erase(it);
    return absl::OkStatus();
  };
  // This stage's transfers in the groups the validator simulated (ExchangeGroups): each run
  // of transfers split so that the neighbour groups the same transfers alike.
  // One of this stage's exchange groups (ExchangeGroups: both neighbours group the same
  // transfers alike) as one SendRecv; its receives become ready together.
  auto issue_group = [&](const std::vector<int>& indices) -> absl::Status {
    std::vector<PeerTransfer> group;
    std::vector<std::pair<std::map<int, std::shared_ptr<Work>>*, int>> receives;
    for (int k : indices) {
      const int m = actions[k].micro_batch;
      switch (actions[k].type) {
        case ActionType::kSendActivation:
          group.push_back(PeerTransfer::Send(outputs[m], rank + 1));
          outputs.erase(m);
          break;
        case ActionType::kSendGradient:
          group.push_back(PeerTransfer::Send(input_grads[m], rank - 1));
          input_grads.erase(m);
          break;
        case ActionType::kRecvActivation: {
          ASSIGN_OR_RETURN(act_in[m], Tensor::Empty({rows, T, C}, tc.dtype, tc.device));
          group.push_back(PeerTransfer::Recv(act_in[m], rank - 1));
          receives.push_back({&act_ready, m});
          break;
        }
        default: {  // kRecvGradient
          ASSIGN_OR_RETURN(grad_in[m], Tensor::Empty({rows, T, C}, tc.dtype, tc.device));
          group.push_back(PeerTransfer::Recv(grad_in[m], rank + 1));
          receives.push_back({&grad_ready, m});
          break;
        }
      }
      t->comm_bytes += static_cast<int64_t>(group.back().tensor.bytes());
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Work> w, comm_->SendRecv(group));
    std::shared_ptr<Work> shared(std::move(w));
    for (auto& [ready, m] : receives) (*ready)[m] = shared;
    all.push_back(shared);
    return absl::OkStatus();
  };
  size_t next_group = 0;
  for (size_t i = 0; i < actions.size();) {
    const Action& a = actions[i];
    if (a.is_communication()) {
      // Every group of this run of transfers, then on to the next compute action.
      while (i < actions.size() && actions[i].is_communication()) ++i;
      while (next_group < exchange_groups_.size() &&
             exchange_groups_[next_group].front() < static_cast<int>(i)) {
        RETURN_IF_ERROR(issue_group(exchange_groups_[next_group++]));
      }
      continue;
    }
    const int m = a.micro_batch;
    if (a.type == ActionType::kForward) {
      RETURN_IF_ERROR(wait_for(act_ready, m, "an activation from the previous stage"));
      ASSIGN_OR_RETURN(MicroBatch * mb, batch(m));
      Timer compute(&t->compute_seconds);
      SpanScope span(absl::StrCat("forward ", m), "compute", m);
      Tensor y;
      RETURN_IF_ERROR(stage_->Forward(s, m, *mb, act_in[m], &y));
      act_in.erase(m);
      if (stage_->is_last()) {
        RETURN_IF_ERROR(AccumulateLoss(s, *loss_sum, y, scratch));
      } else {
        outputs[m] = y;
      }
    } else if (a.type == ActionType::kBackward) {
      RETURN_IF_ERROR(wait_for(grad_ready, m, "a gradient from the next stage"));
      ASSIGN_OR_RETURN(MicroBatch * mb, batch(m));
      Timer compute(&t->compute_seconds);
      SpanScope span(absl::StrCat("backward ", m), "compute", m);
      Tensor dx;
      RETURN_IF_ERROR(stage_->Backward(s, m, *mb, grad_in[m], &dx));
      grad_in.erase(m);
      batches.erase(m);
      if (!stage_->is_first()) input_grads[m] = dx;
    }
    ++i;  // the optimizer step is the caller's
  }
  Timer bubble(&t->bubble_seconds);
  SpanScope span("wait for transfers", "idle");
  for (auto& w : all) RETURN_IF_ERROR(Wait(*w, w->description().c_str()));
  return absl::OkStatus();
}

absl::StatusOr<StepReport> DistributedTrainer::Step(StepTiming* timing,
                                                    const std::function<bool()>& stop_requested) {
  const double start = Now();
  StepTiming local;
  StepTiming* t = timing ? timing : &local;
  *t = StepTiming();
  const double busy_start = comm_->busy_seconds();
  stage_->ResetPeakInFlight();
  const TrainConfig& tc = c_.train;
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(tc.device));
  // [0]: this rank's summed token losses, [1]: its share of the squared gradient norm,
  // [2]: 1 if this rank asks to stop after this step (summed: any rank's wish counts).
  ASSIGN_OR_RETURN(Tensor reduced, Tensor::Empty({3}, DType::kF32, tc.device));
  RETURN_IF_ERROR(ZeroFill(reduced, *s));
  ASSIGN_OR_RETURN(Tensor loss_sum, reduced.View(0, {1}));
  ASSIGN_OR_RETURN(Tensor sumsq, reduced.View(1, {1}));
  if (c_.strategy == StrategyKind::kData) {
    RETURN_IF_ERROR(DataParallelPass(*s, &loss_sum, t));
  } else {
    RETURN_IF_ERROR(PipelinePass(*s, &loss_sum, t));
  }
  RETURN_IF_ERROR(ops::SumSquaresAccumulate(*s, sumsq, stage_->grads().flat()));
  const int world = comm_->world_size();
  if (c_.strategy == StrategyKind::kData) {
    // The gradients are the same on every rank after the all-reduce, and so is their norm;
    // reducing it too would only add rounding. Give every rank the same share.
    RETURN_IF_ERROR(ops::Scale(*s, sumsq, 1.0f / world));
  }
  if (stop_requested && stop_requested()) {
    ASSIGN_OR_RETURN(Tensor flag, reduced.View(2, {1}));
    RETURN_IF_ERROR(ops::Fill(*s, flag, 1.0f));
  }
  {
    Timer exposed(&t->exposed_comm_seconds);
    SpanScope span("reduce loss", "idle");
    ASSIGN_OR_RETURN(auto w, comm_->AllReduce(reduced));
    RETURN_IF_ERROR(Wait(*w, "the reduction of the step's loss and gradient norm"));
  }
  ASSIGN_OR_RETURN(std::vector<float> v, reduced.ToFloatVector());
  stop_agreed_ = v[2] > 0.5f;
  const double opt_start = Now();
  SpanScope opt_span("optimizer", "optimizer");
  ASSIGN_OR_RETURN(StepReport r, FinishStep(*s, tc, *stage_, optimizer_, scaler_, step_, v[0], v[1]));
  RETURN_IF_ERROR(s->Synchronize());
  t->optimizer_seconds = Now() - opt_start;
  t->last_sequence = comm_->last_issued_sequence();
  t->comm_seconds = comm_->busy_seconds() - busy_start;
  t->peak_in_flight = stage_->peak_in_flight();
  ++step_;
  r.seconds = Now() - start;
  return r;
}

std::pair<int, int> DistributedTrainer::BlockRange(int rank) const {
  if (c_.strategy == StrategyKind::kData) return {0, bounds_.back()};
  return {bounds_[rank], bounds_[rank + 1]};
}

std::string DistributedTrainer::ShardName(const std::string& prefix, int rank) const {
  if (c_.strategy == StrategyKind::kData) return prefix + ".ckpt";
  return absl::StrFormat("%s.stage-%d.ckpt", prefix, rank);
}

absl::Status DistributedTrainer::SaveCheckpoint(const std::string& dir) {
  const int rank = comm_->rank(), world = comm_->world_size();
  const bool writes = c_.strategy != StrategyKind::kData || rank == 0;
  const std::string prefix = CheckpointPrefixFor(dir, step_);
  const std::string path = ShardName(prefix, rank);
  absl::Status saved = absl::OkStatus();
  CheckpointFileInfo info;
  if (writes) {
    const std::map<std::string, std::string> extra = {
        {"strategy", StrategyName(c_.strategy)},
        {"world_size", absl::StrCat(world)},
        {"rank", absl::StrCat(rank)}};
    saved = SaveTrainingState(path, c_.train, *stage_, optimizer_, scaler_, step_, extra, &info);
  }
  // Every rank's outcome, size and checksum: {state (1 written, 0 none, -1 failed),
  // bytes low, bytes high, checksum low, checksum high} as 32-bit integers.
  constexpr int kFields = 5;
  const uint64_t bytes = static_cast<uint64_t>(info.bytes);
  const std::vector<int32_t> mine = {
      !saved.ok() ? -1 : (writes ? 1 : 0), static_cast<int32_t>(bytes & 0xffffffffu),
      static_cast<int32_t>(bytes >> 32), static_cast<int32_t>(info.checksum & 0xffffffffu),
      static_cast<int32_t>(info.checksum >> 32)};
  ASSIGN_OR_RETURN(Tensor in, Tensor::FromInts(mine, {kFields}, c_.train.device));
  ASSIGN_OR_RETURN(Tensor all, Tensor::Empty({int64_t{kFields} * world}, DType::kI32,
                                             c_.train.device));
  {
    // Ranks that write nothing wait here while the others write: as long as writing takes
    // (a large model on a network file system can take minutes), not one collective's timeout.
    ASSIGN_OR_RETURN(auto w, comm_->AllGather(all, in));
    RETURN_IF_ERROR(
        Wait(*w, "every rank's checkpoint shard", std::max(c_.timeout, kCheckpointWriteTimeout)));
  }
  if (!saved.ok()) return saved;
  ASSIGN_OR_RETURN(std::vector<int32_t> v, all.ToIntVector());
  for (int r = 0; r < world; ++r) {
    if (v[r * kFields] < 0) {
      return absl::InternalError(absl::StrFormat(
          "step %d: rank %d could not write its checkpoint shard (see its log); no manifest "
          "written",
          step_, r));
    }
  }
  absl::Status manifest = absl::OkStatus();
  if (rank == 0) {
    Manifest m;
    for (int r = 0; r < world; ++r) {
      const int32_t* f = v.data() + r * kFields;
      if (f[0] == 0) continue;
      ShardRecord s;
      s.file = ShardName(CheckpointName(step_), r);
      std::tie(s.block_begin, s.block_end) = BlockRange(r);
      s.bytes = static_cast<int64_t>(static_cast<uint32_t>(f[1]) |
                                     (static_cast<uint64_t>(static_cast<uint32_t>(f[2])) << 32));
      s.checksum = static_cast<uint32_t>(f[3]) |
                   (static_cast<uint64_t>(static_cast<uint32_t>(f[4])) << 32);
      m.shards.push_back(s);
    }
    m.step = step_;
    m.strategy = StrategyName(c_.strategy);
    m.world_size = world;
    m.model = c_.train.model.ToString();
    m.optimizer = c_.train.optimizer.kind;
    m.batch = c_.train.batch;
    m.seed = c_.train.seed;
    manifest = WriteManifest(prefix, m);
  }
  // Nobody goes on (or exits, when preempted) before the manifest is written.
  ASSIGN_OR_RETURN(auto w, comm_->Barrier());
  RETURN_IF_ERROR(Wait(*w, "the checkpoint's manifest"));
  return manifest;
}

absl::Status DistributedTrainer::LoadCheckpoint(const std::string& prefix) {
  return LoadShardedTrainingState(prefix, c_.train, *stage_, &optimizer_, &scaler_, &step_);
}

}  // namespace tandem
