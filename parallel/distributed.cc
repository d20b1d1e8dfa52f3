#include "parallel/distributed.h"

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
#include "runtime/host_sync.h"
#include "runtime/ops.h"
#include "runtime/profiler.h"
#include "runtime/status.h"

namespace tandem {
namespace {

// How long ranks wait for the others to write their checkpoint shards (at least): the
// default timeout of torch.distributed's process groups.
constexpr absl::Duration kCheckpointWriteTimeout = absl::Minutes(30);

// The phases of a step on the compute stream (StreamTimeline kinds), and where each goes in
// StepTiming and in the trace.
enum Phase { kCompute, kExposedComm, kBubble, kOptimizer, kInput };

const char* TraceCategory(int phase) {
  switch (phase) {
    case kCompute: return "compute";
    case kOptimizer: return "optimizer";
    default: return "idle";
  }
}

void AddPhase(const StreamTimeline::Phase& p, StepTiming* t) {
  switch (p.kind) {
    case kCompute: t->compute_seconds += p.seconds; break;
    case kExposedComm: t->exposed_comm_seconds += p.seconds; break;
    case kBubble: t->bubble_seconds += p.seconds; break;
    case kOptimizer: t->optimizer_seconds += p.seconds; break;
    case kInput: t->input_seconds += p.seconds; break;
  }
}

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
    // Each block's forward and backward between events on the stream: the device's time.
    ASSIGN_OR_RETURN(StreamTimeline timeline, StreamTimeline::Start(*s));
    std::vector<Tensor> outs(n + 1);
    for (int b = 0; b < n; ++b) {
      RETURN_IF_ERROR(stages[b]->Forward(*s, 0, mb, outs[b], &outs[b + 1]));
      RETURN_IF_ERROR(timeline.Mark(b, "forward"));
    }
    Tensor d;
    for (int b = n - 1; b >= 0; --b) {
      Tensor dx;
      RETURN_IF_ERROR(stages[b]->Backward(*s, 0, mb, d, &dx));
      RETURN_IF_ERROR(timeline.Mark(b, "backward"));
      d = dx;
    }
    RETURN_IF_ERROR(s->Synchronize());
    ASSIGN_OR_RETURN(std::vector<StreamTimeline::Phase> phases, timeline.Phases());
    for (int b = 0; b < n; ++b) runs[b].push_back(0);
    for (const StreamTimeline::Phase& p : phases) runs[p.kind].back() += p.seconds;
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
  const int64_t rows = t.batch / t.micro_batches;
  // A tensor crossing a stage boundary, for one micro-batch.
  const int64_t boundary = rows * t.model.seq_len * t.model.d_model *
                           static_cast<int64_t>(DTypeSize(t.dtype));
  std::vector<MemoryNeed> needs;
  for (int r = 0; r < world_size; ++r) {
    MemoryNeed n = EstimateStageMemory(t.model, bounds[r], bounds[r + 1], rows,
                                       PeakInFlight(s, r), c.recompute, t.dtype,
                                       t.optimizer.kind, t.device);
    // The host issues a whole step ahead of the device, and each send keeps its tensor until
    // the compute stream waited for it at the step's end (Work::WaitOn): every micro-batch's
    // output (a stage before the last) and input gradient (a stage after the first) at once.
    const int directions = (r + 1 < world_size ? 1 : 0) + (r > 0 ? 1 : 0);
    n.activations += directions * int64_t{t.micro_batches} * boundary;
    needs.push_back(n);
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
  ASSIGN_OR_RETURN(t->input_, InputPrefetcher::Create(c.train.device));
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

absl::Status DistributedTrainer::WaitOn(Work& w, Stream& s, const char* what) {
  absl::Status st = w.WaitOn(s, c_.timeout);
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrFormat("rank %d, step %d, waiting for %s: %s",
                                                 comm_->rank(), step_, what, st.message()));
}

absl::StatusOr<MicroBatch> DistributedTrainer::LoadMicroBatch(int64_t row_begin, int64_t rows) {
  const TrainConfig& t = c_.train;
  return input_->Load(data_, order_, int64_t{step_} * t.batch, row_begin, rows, t.model.seq_len,
                      scaler_.scale() / static_cast<float>(int64_t{t.batch} * t.model.seq_len));
}

absl::Status DistributedTrainer::DataParallelPass(Stream& s, Tensor* loss_sum, Pending* p) {
  const TrainConfig& tc = c_.train;
  StepTiming* t = &p->timing;
  StreamTimeline& timeline = *p->timeline;
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
  auto load = [&](int m) { return LoadMicroBatch(comm_->rank() * share + m * rows, rows); };
  ASSIGN_OR_RETURN(MicroBatch next_mb, load(0));
  for (int m = 0; m < tc.micro_batches; ++m) {
    MicroBatch mb = std::move(next_mb);
    // The next micro-batch's copy runs while this one computes.
    if (m + 1 < tc.micro_batches) {
      ASSIGN_OR_RETURN(next_mb, load(m + 1));
    }
    const bool last = m == tc.micro_batches - 1;
    RETURN_IF_ERROR(InputPrefetcher::WaitFor(s, mb));
    RETURN_IF_ERROR(timeline.Mark(kInput, absl::StrCat("input ", m), m));
    Tensor losses, dx;
    RETURN_IF_ERROR(stage_->Forward(s, m, mb, Tensor(), &losses));
    RETURN_IF_ERROR(AccumulateLoss(s, *loss_sum, losses, scratch));
    RETURN_IF_ERROR(timeline.Mark(kCompute, absl::StrCat("forward ", m), m));
    // Gradient accumulation communicates only after the last micro-batch's gradients: each
    // bucket's all-reduce is issued once backward has issued its last gradient, and runs
    // after that work (the communicator orders it after the compute stream).
    auto block_done = [&](int block) -> absl::Status {
      if (!last || !c_.overlap) return absl::OkStatus();
      while (next < buckets_.size() && buckets_[next].ready_block >= block) {
        RETURN_IF_ERROR(issue(next++));
      }
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(stage_->Backward(s, m, mb, Tensor(), &dx, block_done));
    RETURN_IF_ERROR(timeline.Mark(kCompute, absl::StrCat("backward ", m), m));
  }
  while (next < buckets_.size()) RETURN_IF_ERROR(issue(next++));
  // The optimizer's work waits on the stream for every bucket; the host does not.
  for (auto& w : pending) RETURN_IF_ERROR(WaitOn(*w, s, w->description().c_str()));
  return timeline.Mark(kExposedComm, "wait for gradients");
}

absl::Status DistributedTrainer::PipelinePass(Stream& s, Tensor* loss_sum, Pending* p) {
  const TrainConfig& tc = c_.train;
  StepTiming* t = &p->timing;
  StreamTimeline& timeline = *p->timeline;
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
  // Micro-batch m's tokens and targets, their copy queued on first use.
  auto batch = [&](int m) -> absl::StatusOr<MicroBatch*> {
    auto it = batches.find(m);
    if (it == batches.end()) {
      ASSIGN_OR_RETURN(MicroBatch mb, LoadMicroBatch(m * rows, rows));
      it = batches.emplace(m, std::move(mb)).first;
    }
    return &it->second;
  };
  // The next compute action's micro-batch after action i, loaded ahead of it.
  auto prefetch_after = [&](size_t i) -> absl::Status {
    for (size_t j = i + 1; j < actions.size(); ++j) {
      if (actions[j].type == ActionType::kForward || actions[j].type == ActionType::kBackward) {
        return batch(actions[j].micro_batch).status();
      }
    }
    return absl::OkStatus();
  };
  // The stream waits for micro-batch m's receive, a phase of bubble of its own.
  auto wait_for = [&](std::map<int, std::shared_ptr<Work>>& ready, int m,
                      const char* what) -> absl::Status {
    auto it = ready.find(m);
    if (it == ready.end()) return absl::OkStatus();
    RETURN_IF_ERROR(WaitOn(*it->second, s, what));
    ready.erase(it);
    return timeline.Mark(kBubble, absl::StrCat("wait ", m), m);
  };
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
      RETURN_IF_ERROR(prefetch_after(i));
      RETURN_IF_ERROR(InputPrefetcher::WaitFor(s, *mb));
      RETURN_IF_ERROR(timeline.Mark(kInput, absl::StrCat("input ", m), m));
      Tensor y;
      RETURN_IF_ERROR(stage_->Forward(s, m, *mb, act_in[m], &y));
      act_in.erase(m);
      if (stage_->is_last()) {
        RETURN_IF_ERROR(AccumulateLoss(s, *loss_sum, y, scratch));
      } else {
        outputs[m] = y;
      }
      RETURN_IF_ERROR(timeline.Mark(kCompute, absl::StrCat("forward ", m), m));
    } else if (a.type == ActionType::kBackward) {
      RETURN_IF_ERROR(wait_for(grad_ready, m, "a gradient from the next stage"));
      ASSIGN_OR_RETURN(MicroBatch * mb, batch(m));
      RETURN_IF_ERROR(prefetch_after(i));
      Tensor dx;
      RETURN_IF_ERROR(stage_->Backward(s, m, *mb, grad_in[m], &dx));
      grad_in.erase(m);
      batches.erase(m);
      if (!stage_->is_first()) input_grads[m] = dx;
      RETURN_IF_ERROR(timeline.Mark(kCompute, absl::StrCat("backward ", m), m));
    }
    ++i;  // the optimizer step is the caller's
  }
  // Every transfer finished before the step's end on the stream: waiting for a neighbour's
  // last gradient or for the sends to be taken is the pipeline's bubble too.
  for (auto& w : all) RETURN_IF_ERROR(WaitOn(*w, s, w->description().c_str()));
  return timeline.Mark(kBubble, "wait for transfers");
}

absl::Status DistributedTrainer::Issue(const std::function<bool()>& stop_requested) {
  const int64_t syncs_before = HostSync::Count();
  const TrainConfig& tc = c_.train;
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(tc.device));
  Pending p;
  p.report.step = step_;
  p.report.lr = LearningRate(tc.optimizer, step_);
  p.first_sequence = comm_->last_issued_sequence();
  ASSIGN_OR_RETURN(StreamTimeline timeline, StreamTimeline::Start(*s));
  p.timeline = std::make_unique<StreamTimeline>(std::move(timeline));
  stage_->ResetPeakInFlight();
  // [0]: this rank's summed token losses, [1]: its share of the squared gradient norm,
  // [2]: 1 if this rank asks to stop after this step (summed: any rank's wish counts),
  // [3]: the gradients' factor (unscaling and clipping), computed on the device.
  ASSIGN_OR_RETURN(Tensor buffer, Tensor::Empty({4}, DType::kF32, tc.device));
  RETURN_IF_ERROR(ZeroFill(buffer, *s));
  ASSIGN_OR_RETURN(p.reduced, buffer.View(0, {3}));
  ASSIGN_OR_RETURN(Tensor loss_sum, buffer.View(0, {1}));
  ASSIGN_OR_RETURN(Tensor sumsq, buffer.View(1, {1}));
  ASSIGN_OR_RETURN(Tensor scale, buffer.View(3, {1}));
  if (c_.strategy == StrategyKind::kData) {
    RETURN_IF_ERROR(DataParallelPass(*s, &loss_sum, &p));
  } else {
    RETURN_IF_ERROR(PipelinePass(*s, &loss_sum, &p));
  }
  RETURN_IF_ERROR(ops::SumSquaresAccumulate(*s, sumsq, stage_->grads().flat()));
  const int world = comm_->world_size();
  if (c_.strategy == StrategyKind::kData) {
    // The gradients are the same on every rank after the all-reduce, and so is their norm;
    // reducing it too would only add rounding. Give every rank the same share.
    RETURN_IF_ERROR(ops::Scale(*s, sumsq, 1.0f / world));
  }
  if (stop_requested && stop_requested()) {
    ASSIGN_OR_RETURN(Tensor flag, buffer.View(2, {1}));
    RETURN_IF_ERROR(ops::Fill(*s, flag, 1.0f));
  }
  RETURN_IF_ERROR(p.timeline->Mark(kOptimizer, "gradient norm"));
  {
    ASSIGN_OR_RETURN(auto w, comm_->AllReduce(p.reduced));
    RETURN_IF_ERROR(WaitOn(*w, *s, "the reduction of the step's loss and gradient norm"));
  }
  RETURN_IF_ERROR(p.timeline->Mark(kExposedComm, "reduce loss"));
  RETURN_IF_ERROR(
      IssueStepEnd(*s, tc, *stage_, optimizer_, scaler_.scale(), step_, sumsq, scale));
  // The values the host reads, in memory it reads without another copy.
  ASSIGN_OR_RETURN(p.host, Tensor::Empty({3}, DType::kF32, Device::Cpu(), HostMemoryKind::kPinned));
  RETURN_IF_ERROR(Copy(p.host, p.reduced, *s));
  RETURN_IF_ERROR(p.timeline->Mark(kOptimizer, "optimizer"));
  p.timing.last_sequence = comm_->last_issued_sequence();
  p.timing.peak_in_flight = stage_->peak_in_flight();
  p.timing.host_syncs = HostSync::Count() - syncs_before;
  pending_.push_back(std::move(p));
  ++step_;
  // f16's loss scale for the next step depends on this step's verdict.
  if (scaler_.enabled()) RETURN_IF_ERROR(ReadPending());
  return absl::OkStatus();
}

absl::Status DistributedTrainer::ReadPending() {
  if (pending_.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(c_.train.device));
  const int64_t syncs_before = HostSync::Count();
  {
    // The one host synchronization: every pending step's values, and its events, are final.
    ExpectedHostSync reading;
    absl::Status st = s->Synchronize();
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrFormat("rank %d, steps %d-%d: %s", comm_->rank(),
                                                     pending_.front().report.step + 1,
                                                     pending_.back().report.step + 1,
                                                     st.message()));
    }
  }
  pending_.back().timing.host_syncs += HostSync::Count() - syncs_before;
  for (Pending& p : pending_) {
    const float* v = p.host.data<float>();
    CompletedStep done;
    done.report = ReportStep(c_.train, scaler_, p.report.step, v[0], v[1]);
    done.timing = p.timing;
    if (v[2] > 0.5f) stop_agreed_ = true;
    ASSIGN_OR_RETURN(std::vector<StreamTimeline::Phase> phases, p.timeline->Phases());
    for (const StreamTimeline::Phase& phase : phases) {
      AddPhase(phase, &done.timing);
      if (Profiler::enabled()) {
        TraceEvent e;
        e.name = phase.name;
        e.category = TraceCategory(phase.kind);
        e.start_us = phase.start_us;
        e.duration_us = phase.seconds * 1e6;
        e.micro_batch = phase.micro_batch;
        Profiler::RecordEvent(std::move(e));
      }
    }
    // The stream's time from where the step's work began to its end.
    ASSIGN_OR_RETURN(float ms, p.timeline->end().ElapsedMsSince(p.timeline->start()));
    done.report.seconds = ms * 1e-3;
    done.timing.comm_seconds = comm_->busy_seconds_through(p.timing.last_sequence) -
                               comm_->busy_seconds_through(p.first_sequence);
    read_.push_back(std::move(done));
  }
  pending_.clear();
  Profiler::Collect();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CompletedStep>> DistributedTrainer::Read() {
  RETURN_IF_ERROR(ReadPending());
  std::vector<CompletedStep> out;
  out.swap(read_);
  return out;
}

absl::StatusOr<StepReport> DistributedTrainer::Step(StepTiming* timing,
                                                    const std::function<bool()>& stop_requested) {
  RETURN_IF_ERROR(Issue(stop_requested));
  ASSIGN_OR_RETURN(std::vector<CompletedStep> done, Read());
  if (done.empty()) return absl::InternalError("a step issued but not read");
  if (timing != nullptr) *timing = done.back().timing;
  return done.back().report;
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
  if (!pending_.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint at step %d with %d steps not read: Read() them first (their losses decide "
        "whether the weights are worth keeping)",
        step_, pending_.size()));
  }
  // Reading the weights and waiting for the other ranks' shards: the synchronizations a
  // checkpoint must make.
  ExpectedHostSync checkpoint;
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
  if (!pending_.empty()) {
    return absl::FailedPreconditionError("checkpoint loaded with steps not read: Read() first");
  }
  return LoadShardedTrainingState(prefix, c_.train, *stage_, &optimizer_, &scaler_, &step_);
}

}  // namespace tandem
