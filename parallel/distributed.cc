#include "parallel/distributed.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/block.h"
#include "model/hf_gpt2.h"
#include "model/sharded_checkpoint.h"
#include "parallel/pipeline_executor.h"
#include "parallel/step_phases.h"
#include "runtime/allocator.h"
#include "runtime/host_sync.h"
#include "runtime/ops.h"
#include "runtime/profiler.h"
#include "runtime/status.h"

namespace tandem {
namespace {

// Where each phase of a step (parallel/step_phases.h) goes in the trace and in StepTiming.
const char* TraceCategory(int phase) {
  switch (phase) {
    case kCompute:
    case kComputePart: return "compute";
    case kOptimizer: return "optimizer";
    default: return "idle";
  }
}

void AddPhase(const StreamTimeline::Phase& p, StepTiming* t) {
  switch (p.kind) {
    case kCompute:
    case kComputePart: t->compute_seconds += p.seconds; break;
    case kTensorComm: t->tensor_comm_seconds += p.seconds; break;
    case kExposedComm: t->exposed_comm_seconds += p.seconds; break;
    case kBubble: t->bubble_seconds += p.seconds; break;
    case kOptimizer: t->optimizer_seconds += p.seconds; break;
    case kInput: t->input_seconds += p.seconds; break;
  }
}

}  // namespace

absl::StatusOr<std::vector<BlockTime>> MeasureBlockTimes(const ModelConfig& model, Device device,
                                                         DType compute, int rows, uint64_t seed) {
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(device));
  return MeasureBlockTimes(model, device, compute, rows, seed, *s);
}

absl::StatusOr<std::unique_ptr<BlockPasses>> BlockPasses::Create(const ModelConfig& model,
                                                                 Device device, DType compute,
                                                                 int rows, uint64_t seed) {
  auto p = std::make_unique<BlockPasses>();
  for (int b = 0; b < model.num_blocks(); ++b) {
    ASSIGN_OR_RETURN(std::unique_ptr<Stage> st,
                     Stage::Create(model, b, b + 1, device, seed, compute));
    p->stages_.push_back(std::move(st));
  }
  const TokenDataset data = TokenDataset::Synthetic(int64_t{rows} * model.seq_len * 4 + 1,
                                                    model.seq_len, model.vocab, seed);
  ASSIGN_OR_RETURN(p->mb_,
                   MakeMicroBatch(data, DataOrder(data.num_samples(), seed), 0, 0, rows,
                                  model.seq_len, device, 1.0f / (rows * model.seq_len)));
  return p;
}

absl::Status BlockPasses::Run(Stream& s, StreamTimeline* timeline) {
  const int n = static_cast<int>(stages_.size());
  auto mark = [&](int kind, const char* name) {
    return timeline == nullptr ? absl::OkStatus() : timeline->Mark(kind, name);
  };
  std::vector<Tensor> outs(n + 1);
  for (int b = 0; b < n; ++b) {
    RETURN_IF_ERROR(stages_[b]->Forward(s, 0, mb_, outs[b], &outs[b + 1]));
    RETURN_IF_ERROR(mark(3 * b, "forward"));
  }
  Tensor d;
  for (int b = n - 1; b >= 0; --b) {
    Tensor dx;
    RETURN_IF_ERROR(stages_[b]->BackwardInput(s, 0, mb_, d, &dx));
    RETURN_IF_ERROR(mark(3 * b + 1, "backward input"));
    RETURN_IF_ERROR(stages_[b]->BackwardWeights(s, 0, mb_));
    RETURN_IF_ERROR(mark(3 * b + 2, "backward weights"));
    d = dx;
  }
  return s.Synchronize();
}

absl::StatusOr<std::vector<BlockTime>> MeasureBlockTimes(const ModelConfig& model, Device device,
                                                         DType compute, int rows, uint64_t seed,
                                                         Stream& stream) {
  const int n = model.num_blocks();
  // One single-block stage per block, chained, so each block is timed on its own.
  ASSIGN_OR_RETURN(std::unique_ptr<BlockPasses> passes,
                   BlockPasses::Create(model, device, compute, rows, seed));
  constexpr int kRuns = 4;  // the first is a warm-up
  // runs[3 * b + part]: block b's forward (part 0), B (1) and W (2), one entry per run.
  std::vector<std::vector<double>> runs(3 * n);
  for (int r = 0; r < kRuns; ++r) {
    // Each part between events on the stream: the device's time.
    ASSIGN_OR_RETURN(StreamTimeline timeline, StreamTimeline::Start(stream));
    RETURN_IF_ERROR(passes->Run(stream, &timeline));
    ASSIGN_OR_RETURN(std::vector<StreamTimeline::Phase> phases, timeline.Phases());
    for (std::vector<double>& v : runs) v.push_back(0);
    for (const StreamTimeline::Phase& p : phases) runs[p.kind].back() += p.seconds;
  }
  auto median = [&](int k) {
    std::vector<double> v(runs[k].begin() + 1, runs[k].end());
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const std::vector<std::unique_ptr<Block>> blocks = BuildBlocks(model);
  std::vector<BlockTime> times(n);
  for (int b = 0; b < n; ++b) {
    times[b] = {blocks[b]->name(), median(3 * b), median(3 * b + 1), median(3 * b + 2)};
  }
  return times;
}

absl::StatusOr<std::vector<double>> MeasureBlockSeconds(const ModelConfig& model, Device device,
                                                        DType compute, int rows, uint64_t seed) {
  ASSIGN_OR_RETURN(std::vector<BlockTime> times,
                   MeasureBlockTimes(model, device, compute, rows, seed));
  std::vector<double> seconds;
  for (const BlockTime& t : times) seconds.push_back(t.total());
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

std::vector<double> StepHandovers(const PipelineSchedule& s,
                                  const std::vector<std::vector<StepTiming::ActionTimes>>& times) {
  const int K = s.stages;
  // Per stage, each compute action's index among its compute actions, by (type, chunk,
  // micro-batch).
  std::vector<std::map<std::tuple<ActionType, int, int>, size_t>> index(K);
  for (int st = 0; st < K; ++st) {
    for (const Action& a : s.actions[st]) {
      if (!a.is_compute()) continue;
      index[st].emplace(std::make_tuple(a.type, a.chunk, a.micro_batch), index[st].size());
    }
  }
  auto at = [&](int st, size_t i) -> const StepTiming::ActionTimes* {
    return st < static_cast<int>(times.size()) && i < times[st].size() ? &times[st][i] : nullptr;
  };
  std::vector<double> seconds;
  for (int st = 0; st < K; ++st) {
    for (const auto& [key, i] : index[st]) {
      const auto [type, chunk, mb] = key;
      const StepTiming::ActionTimes* r = at(st, i);
      if (r == nullptr || r->wait_us < 0) continue;
      // The sender: the global stage before (an activation) or after (a gradient).
      const int from = GlobalStage(st, chunk, K) + (type == ActionType::kForward ? -1 : 1);
      if (from < 0 || from >= K * s.chunks) continue;
      const StagePlace p = PlaceStage(from, K);
      const auto j = index[p.stage].find(std::make_tuple(type, p.chunk, mb));
      if (j == index[p.stage].end()) continue;
      const StepTiming::ActionTimes* sender = at(p.stage, j->second);
      if (sender == nullptr || r->wait_us > sender->end_us) continue;
      seconds.push_back(1e-6 * (r->resumed_us - sender->end_us));
    }
  }
  return seconds;
}

absl::StatusOr<std::unique_ptr<DistributedTrainer>> DistributedTrainer::Create(
    const ParallelConfig& c, Communicator* comm) {
  ASSIGN_OR_RETURN(JobLayout layout, ResolveLayout(c, comm->world_size()));
  if (comm->device() != c.train.device) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the communicator is on %s but training on %s", comm->device().ToString(),
        c.train.device.ToString()));
  }
  const int rank = comm->rank();
  ASSIGN_OR_RETURN(MemoryCheck memory,
                   CheckDeviceMemory(layout.memory[rank], c.train.device,
                                     absl::StrFormat("rank %d's training step", rank)));
  ASSIGN_OR_RETURN(TokenDataset data, LoadDataset(c.train));
  std::unique_ptr<DistributedTrainer> t(new DistributedTrainer(c, comm, std::move(data)));
  t->layout_ = std::move(layout);
  t->memory_ = memory;
  const ProcessGrid& grid = t->layout_.grid;
  t->replica_ = grid.ReplicaOf(rank);
  t->stage_index_ = grid.StageOf(rank);
  t->tensor_ = grid.TensorOf(rank);
  ASSIGN_OR_RETURN(t->groups_, MakeProcessGroups(t->layout_, c.train.model.tie_embeddings, comm));
  TensorParallel tp;
  if (grid.tensors > 1) {
    t->tensor_group_ = std::make_unique<CommTensorGroup>(t->groups_.tp.get(), c.timeout,
                                                         t->Where());
    tp = {grid.tensors, t->tensor_, t->tensor_group_.get(), c.sequence_parallel};
  }
  ASSIGN_OR_RETURN(t->stage_, Stage::Create(c.train.model, t->layout_.ChunkRanges(t->stage_index_),
                                            c.train.device, c.train.seed, c.train.dtype, tp));
  t->norm_ranges_ = NormRanges(*t->stage_);
  // --init-from: every rank takes its stage's parameters (its parts of them) from the file,
  // by name.
  if (!c.train.init_from.empty()) {
    RETURN_IF_ERROR(InitFromSafetensors(c.train.init_from, *t->stage_));
  }
  t->stage_->set_recompute(c.recompute);
  ASSIGN_OR_RETURN(t->sync_, GradientSync::Create(*t->stage_, t->groups_.dp, c.bucket_bytes,
                                                 c.zero, t->groups_.embed != nullptr));
  ASSIGN_OR_RETURN(t->optimizer_,
                   Optimizer::Create(c.train.optimizer, t->stage_->layout(),
                                     t->sync_.shard_begin(), t->sync_.shard_end(),
                                     c.train.device));
  ASSIGN_OR_RETURN(t->input_, InputPrefetcher::Create(c.train.device));
  ASSIGN_OR_RETURN(t->val_, LoadValidation(c.train, t->data_));
  if (t->replicated()) {
    // Every replica starts from the first replica's weights.
    ASSIGN_OR_RETURN(auto w, t->groups_.dp->Broadcast(t->stage_->params().flat()));
    RETURN_IF_ERROR(t->Wait(*w, "the broadcast of the first replica's parameters"));
    ASSIGN_OR_RETURN(Stream * s, Stream::Compute(c.train.device));
    RETURN_IF_ERROR(t->stage_->ParamsChanged(*s));
  }
  if (t->layout_.pipelined()) RETURN_IF_ERROR(t->ConnectNeighbours());
  if (!c.train.resume.empty()) {
    return absl::InvalidArgumentError(
        "resume a distributed run with LoadCheckpoint(prefix), not TrainConfig::resume");
  }
  return t;
}

absl::Status DistributedTrainer::ConnectNeighbours() {
  const int rank = groups_.pp->rank(), world = groups_.pp->world_size();
  if (world == 1) return absl::OkStatus();
  const TrainConfig& tc = c_.train;
  const Shape activation =
      stage_->BoundaryShape(tc.batch / layout_.grid.replicas / tc.micro_batches);
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(tc.device));
  std::vector<PeerTransfer> group;
  ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(activation, tc.dtype, tc.device));
  RETURN_IF_ERROR(ZeroFill(out, *s));
  // Under an interleaved schedule the last stage also sends to the first (each chunk's end
  // goes on to the next chunk), so the stages form a ring.
  std::set<int> peers;
  for (int peer : {rank - 1, rank + 1}) {
    if (layout_.schedule.chunks > 1) peer = (peer + world) % world;
    if (peer >= 0 && peer < world) peers.insert(peer);
  }
  for (int peer : peers) {
    ASSIGN_OR_RETURN(Tensor in, Tensor::Empty(activation, tc.dtype, tc.device));
    group.push_back(PeerTransfer::Send(out, peer));
    group.push_back(PeerTransfer::Recv(in, peer));
  }
  // The transfers' tensors stay referenced by the work until it completes.
  ASSIGN_OR_RETURN(std::unique_ptr<Work> w, groups_.pp->SendRecv(group));
  return Wait(*w, "the first exchange with the neighbouring stages");
}

absl::Status DistributedTrainer::Wait(Work& w, const char* what, absl::Duration timeout) {
  absl::Status s = w.Wait(timeout);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrFormat("%s, step %d, waiting for %s: %s", Where(),
                                                step_, what, s.message()));
}

absl::Status DistributedTrainer::WaitOn(Work& w, Stream& s, const char* what) {
  absl::Status st = w.WaitOn(s, c_.timeout);
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrFormat("%s, step %d, waiting for %s: %s", Where(),
                                                 step_, what, st.message()));
}

absl::StatusOr<MicroBatch> DistributedTrainer::LoadMicroBatch(int64_t row_begin, int64_t rows) {
  const TrainConfig& t = c_.train;
  return input_->Load(data_, order_, int64_t{step_} * t.batch, row_begin, rows, t.model.seq_len,
                      scaler_.scale() / static_cast<float>(int64_t{t.batch} * t.model.seq_len));
}

absl::Status DistributedTrainer::ReduceEmbeddingGrads(Stream& s, Pending* p) {
  if (groups_.embed == nullptr) return absl::OkStatus();
  // The table is parameter 0 of both stages' buffers (StageParams puts the copy first).
  ASSIGN_OR_RETURN(Tensor g, stage_->Grad(0, s));
  // Two addends: each rank's sum is the same bits. The data-parallel reduction of the
  // table's bucket, then the norm and the optimizer, wait for it on the stream.
  ASSIGN_OR_RETURN(std::unique_ptr<Work> w, groups_.embed->AllReduce(g));
  p->timing.comm_bytes += static_cast<int64_t>(g.bytes());
  RETURN_IF_ERROR(WaitOn(*w, s, "the sum of the tied embedding's gradients"));
  return p->timeline->Mark(kExposedComm, "sum tied embedding");
}

absl::Status DistributedTrainer::WaitForBuckets(Stream& s, Pending* p) {
  RETURN_IF_ERROR(sync_.WaitAll(StreamWaiter(s), &p->timing.comm_bytes));
  return p->timeline->Mark(kExposedComm, "wait for gradients");
}

std::string DistributedTrainer::Where() const {
  const int rank = comm_->rank();
  if (!layout_.grid.hybrid()) return absl::StrCat("rank ", rank);
  return absl::StrCat("rank ", rank, " ", layout_.grid.Place(rank));
}

std::vector<Communicator*> DistributedTrainer::Comms() const { return groups_.All(comm_); }

absl::Status DistributedTrainer::DataParallelPass(Stream& s, Tensor* loss_sum, Pending* p) {
  const TrainConfig& tc = c_.train;
  StreamTimeline& timeline = *p->timeline;
  const int64_t share = tc.batch / layout_.grid.replicas;
  const int64_t rows = share / tc.micro_batches;
  ASSIGN_OR_RETURN(Tensor scratch, Tensor::Empty({1}, DType::kF32, tc.device));
  auto load = [&](int m) { return LoadMicroBatch(replica_ * share + m * rows, rows); };
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
    // Gradient accumulation communicates only after the last micro-batch's gradients.
    auto block_done = [&](int block) -> absl::Status {
      if (!last || !c_.overlap || !replicated()) return absl::OkStatus();
      return sync_.IssueReadyAt(block, &p->timing.comm_bytes);
    };
    RETURN_IF_ERROR(stage_->Backward(s, m, mb, Tensor(), &dx, block_done));
    RETURN_IF_ERROR(timeline.Mark(kCompute, absl::StrCat("backward ", m), m));
  }
  if (!replicated()) return absl::OkStatus();
  return WaitForBuckets(s, p);
}

absl::Status DistributedTrainer::PipelinePass(Stream& s, Tensor* loss_sum, Pending* p) {
  const TrainConfig& tc = c_.train;
  // This replica's share of the batch, in M micro-batches.
  const int64_t share = tc.batch / layout_.grid.replicas;
  PipelineStepIO io;
  io.stage = stage_.get();
  io.pp = groups_.pp;
  io.stream = &s;
  io.timeline = p->timeline.get();
  io.loss_sum = *loss_sum;
  io.rows = share / tc.micro_batches;
  io.dtype = tc.dtype;
  io.load = [this, share, rows = io.rows](int m) {
    return LoadMicroBatch(replica_ * share + m * rows, rows);
  };
  io.wait_on = StreamWaiter(s);
  if (c_.overlap && replicated()) {
    io.gradients_ready = [this, p](int block) { return sync_.IssueReadyAt(block, &p->timing.comm_bytes); };
  }
  const int rank = groups_.pp->rank();  // this replica's stage
  PipelineExecutor executor(layout_.schedule, layout_.exchange_groups[rank], rank, std::move(io));
  const absl::Status ran = executor.Run();
  p->timing.comm_bytes += executor.comm_bytes();
  p->computed.insert(p->computed.end(), executor.computed().begin(), executor.computed().end());
  RETURN_IF_ERROR(ran);
  // After every send: the last stage's stream must not wait for the first stage's backward
  // before the gradients that backward needs went out.
  RETURN_IF_ERROR(ReduceEmbeddingGrads(s, p));
  if (!replicated()) return absl::OkStatus();
  return WaitForBuckets(s, p);
}

absl::Status DistributedTrainer::BeginStep(Stream& s, Pending* p, StepValues* v) {
  const TrainConfig& tc = c_.train;
  p->report.step = step_;
  p->report.lr = LearningRate(tc.optimizer, step_);
  for (Communicator* c : Comms()) p->first_sequences.push_back(c->last_issued_sequence());
  sync_.StartStep();
  ASSIGN_OR_RETURN(StreamTimeline timeline, StreamTimeline::Start(s));
  p->timeline = std::make_unique<StreamTimeline>(std::move(timeline));
  if (tensor_group_ != nullptr) tensor_group_->set_timeline(p->timeline.get());
  stage_->ResetPeakInFlight();
  // [0]: this rank's summed token losses, [1]: its share of the squared gradient norm,
  // [2]: 1 if this rank asks to stop after this step (summed: any rank's wish counts),
  // [3]: the gradients' factor (unscaling and clipping), computed on the device.
  ASSIGN_OR_RETURN(Tensor buffer, Tensor::Empty({4}, DType::kF32, tc.device));
  RETURN_IF_ERROR(ZeroFill(buffer, s));
  ASSIGN_OR_RETURN(p->reduced, buffer.View(0, {3}));
  ASSIGN_OR_RETURN(v->loss_sum, buffer.View(0, {1}));
  ASSIGN_OR_RETURN(v->sumsq, buffer.View(1, {1}));
  ASSIGN_OR_RETURN(v->stop, buffer.View(2, {1}));
  ASSIGN_OR_RETURN(v->scale, buffer.View(3, {1}));
  return absl::OkStatus();
}

std::vector<ElementRange> DistributedTrainer::NormRanges(const Stage& stage) {
  // The norm counts the tied table once: the first stage's, not the last stage's copy (the
  // first elements of its buffer); and a parameter every rank of a tensor-parallel group
  // holds whole, once: on the group's first rank.
  const bool first_tensor_rank = stage.tensor_parallel().rank == 0;
  return PickedRanges(
      stage.layout(),
      [first_tensor_rank](const ParamSpec& s) { return s.shard.split() || first_tensor_rank; },
      stage.embedding_copy_numel());
}

absl::Status DistributedTrainer::GradientNorm(Stream& s, const Tensor& sumsq) {
  // Under ZeRO-1 each rank holds the reduced gradients of its shard only; the shards' sums of
  // squares add up to the stage's.
  const int64_t shard_begin = sync_.shard_begin(), shard_end = sync_.shard_end();
  for (const ElementRange& r : norm_ranges_) {
    const int64_t begin = std::max(r.begin, shard_begin), end = std::min(r.end, shard_end);
    if (end <= begin) continue;
    ASSIGN_OR_RETURN(Tensor counted, sync_.ReducedGrads(begin, end));
    RETURN_IF_ERROR(ops::SumSquaresAccumulate(s, sumsq, counted));
  }
  if (zero() || !replicated()) return absl::OkStatus();
  // The stage's gradients are the same on each of its D ranks after the all-reduce, and so
  // is their norm; reducing it too would only add rounding. Each takes a 1/D share.
  return ops::Scale(s, sumsq, 1.0f / layout_.grid.replicas);
}

absl::Status DistributedTrainer::ReduceStepValues(Stream& s, Pending* p) {
  ASSIGN_OR_RETURN(auto w, comm_->AllReduce(p->reduced));
  RETURN_IF_ERROR(WaitOn(*w, s, "the reduction of the step's loss and gradient norm"));
  // On a pipeline, this is where the stages that finished first wait for the last one (its
  // three numbers take microseconds): the bubble's end, as a schedule's makespan counts it.
  return p->timeline->Mark(layout_.grid.stages > 1 ? kBubble : kExposedComm, "reduce loss");
}

absl::Status DistributedTrainer::StepEnd(Stream& s, const StepValues& v, Pending* p) {
  const TrainConfig& tc = c_.train;
  if (zero()) {
    RETURN_IF_ERROR(sync_.ZeroStepEnd(s, optimizer_, tc.optimizer, scaler_.scale(),
                                      step_, v.sumsq, v.scale, StreamWaiter(s), *p->timeline,
                                      &p->timing.comm_bytes));
  } else {
    RETURN_IF_ERROR(
        IssueStepEnd(s, tc, *stage_, optimizer_, scaler_.scale(), step_, v.sumsq, v.scale));
  }
  // The values the host reads, in memory it reads without another copy.
  ASSIGN_OR_RETURN(p->host,
                   Tensor::Empty({3}, DType::kF32, Device::Cpu(), HostMemoryKind::kPinned));
  RETURN_IF_ERROR(Copy(p->host, p->reduced, s));
  return p->timeline->Mark(kOptimizer, "optimizer");
}

absl::Status DistributedTrainer::Issue(const std::function<bool()>& stop_requested) {
  const int64_t syncs_before = HostSync::Count();
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(c_.train.device));
  Pending p;
  StepValues v;
  RETURN_IF_ERROR(BeginStep(*s, &p, &v));
  // Forward and backward of every micro-batch, the gradients reduced as they complete.
  if (layout_.pipelined()) {
    RETURN_IF_ERROR(PipelinePass(*s, &v.loss_sum, &p));
  } else {
    RETURN_IF_ERROR(DataParallelPass(*s, &v.loss_sum, &p));
  }
  // Every rank of a tensor-parallel group computed the same losses: its first counts them.
  if (tensor_ > 0) RETURN_IF_ERROR(ops::Fill(*s, v.loss_sum, 0.0f));
  RETURN_IF_ERROR(GradientNorm(*s, v.sumsq));
  if (stop_requested && stop_requested()) RETURN_IF_ERROR(ops::Fill(*s, v.stop, 1.0f));
  RETURN_IF_ERROR(p.timeline->Mark(kOptimizer, "gradient norm"));
  RETURN_IF_ERROR(ReduceStepValues(*s, &p));
  RETURN_IF_ERROR(StepEnd(*s, v, &p));
  for (Communicator* c : Comms()) p.last_sequences.push_back(c->last_issued_sequence());
  p.timing.last_sequence = comm_->last_issued_sequence();
  if (tensor_group_ != nullptr) p.timing.comm_bytes += tensor_group_->TakeBytes();
  p.timing.peak_in_flight = stage_->peak_in_flight();
  p.timing.host_syncs = HostSync::Count() - syncs_before;
  pending_.push_back(std::move(p));
  ++step_;
  // f16's loss scale for the next step depends on this step's verdict.
  if (scaler_.enabled()) RETURN_IF_ERROR(ReadPending());
  return absl::OkStatus();
}

absl::StatusOr<float> DistributedTrainer::Evaluate() {
  if (!val_) return absl::FailedPreconditionError("no validation data to evaluate on");
  // An evaluation's collectives are no step's (and a step that failed to issue left none).
  if (tensor_group_ != nullptr) tensor_group_->set_timeline(nullptr);
  const TrainConfig& tc = c_.train;
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(tc.device));
  ASSIGN_OR_RETURN(Tensor loss_sum, Tensor::Empty({1}, DType::kF32, tc.device));
  ASSIGN_OR_RETURN(Tensor scratch, Tensor::Empty({1}, DType::kF32, tc.device));
  RETURN_IF_ERROR(ZeroFill(loss_sum, *s));
  // The training's micro-batch size, whose activations were checked to fit.
  const int64_t share = tc.batch / layout_.grid.replicas;
  const int64_t rows = share / tc.micro_batches;
  const int rank = layout_.grid.stages > 1 ? groups_.pp->rank() : 0;
  // Sends in flight, each holding its activation: at most a step's micro-batches (GPipe's
  // most), so a validation holds no more than the training.
  std::deque<std::unique_ptr<Work>> sends;
  RETURN_IF_ERROR(ForEachValidationMicroBatch(
      tc, *val_, *input_, replica_ * share, share, rows,
      [&](const MicroBatch& mb) -> absl::Status {
        // Each of the stage's chunks in turn (interleaved: around the ring of stages).
        const int K = layout_.grid.stages, chunks = stage_->num_chunks();
        for (int c = 0; c < chunks; ++c) {
          Tensor x;
          if (!stage_->chunk_is_first(c)) {
            ASSIGN_OR_RETURN(x, Tensor::Empty(stage_->BoundaryShape(rows), tc.dtype, tc.device));
            ASSIGN_OR_RETURN(std::unique_ptr<Work> w, groups_.pp->Recv(x, (rank + K - 1) % K));
            RETURN_IF_ERROR(
                WaitOn(*w, *s, "an activation from the previous stage (validation)"));
          }
          RETURN_IF_ERROR(InputPrefetcher::WaitFor(*s, mb));
          Tensor y;
          RETURN_IF_ERROR(stage_->Evaluate(*s, mb, x, &y, c));
          if (stage_->chunk_is_last(c)) {
            RETURN_IF_ERROR(AccumulateLoss(*s, loss_sum, y, scratch));
            continue;
          }
          ASSIGN_OR_RETURN(std::unique_ptr<Work> w, groups_.pp->Send(y, (rank + 1) % K));
          sends.push_back(std::move(w));
          if (static_cast<int>(sends.size()) <= tc.micro_batches * chunks) continue;
          RETURN_IF_ERROR(WaitOn(*sends.front(), *s, "an activation's send (validation)"));
          sends.pop_front();
        }
        return absl::OkStatus();
      }));
  for (auto& w : sends) {
    RETURN_IF_ERROR(WaitOn(*w, *s, "an activation's send to the next stage (validation)"));
  }
  // Only last stages hold losses (the others add 0), and of a tensor-parallel group its first
  // rank: one sum over the job reaches every rank.
  if (tensor_ > 0) RETURN_IF_ERROR(ops::Fill(*s, loss_sum, 0.0f));
  ASSIGN_OR_RETURN(std::unique_ptr<Work> w, comm_->AllReduce(loss_sum));
  RETURN_IF_ERROR(WaitOn(*w, *s, "the reduction of the validation loss"));
  std::vector<float> v;
  {
    ExpectedHostSync reading;
    absl::StatusOr<std::vector<float>> read = loss_sum.ToFloatVector();
    if (!read.ok()) {
      return absl::Status(read.status().code(),
                          absl::StrFormat("%s, validation after step %d: %s", Where(), step_,
                                          read.status().message()));
    }
    v = *read;
  }
  return ValidationLoss(tc, *val_, v[0]);
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
      return absl::Status(st.code(), absl::StrFormat("%s, steps %d-%d: %s", Where(),
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
    size_t computed = 0;
    double input = 0;  // the input wait before the next compute action
    StepTiming::ActionTimes times;  // the next compute action's
    for (const StreamTimeline::Phase& phase : phases) {
      AddPhase(phase, &done.timing);
      // A compute action's parts before and during its tensor-parallel collectives are its own.
      if (phase.kind == kInput || phase.kind == kComputePart || phase.kind == kTensorComm) {
        input += phase.seconds;
      }
      if (phase.kind == kBubble && phase.micro_batch >= 0) {  // its receive's wait
        times.wait_us = phase.start_us;
        times.resumed_us = phase.start_us + phase.seconds * 1e6;
      }
      if (phase.kind == kCompute && computed < p.computed.size()) {
        done.timing.action_seconds.push_back({p.computed[computed++], input + phase.seconds});
        times.end_us = phase.start_us + phase.seconds * 1e6;
        done.timing.action_times.push_back(times);
        input = 0;
        times = {};
      }
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
    const std::vector<Communicator*> comms = Comms();
    for (size_t i = 0; i < comms.size(); ++i) {
      done.timing.comm_seconds += comms[i]->busy_seconds_through(p.last_sequences[i]) -
                                  comms[i]->busy_seconds_through(p.first_sequences[i]);
    }
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

}  // namespace tandem
