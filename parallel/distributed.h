// Training across ranks with one of three interchangeable strategies, all over the same
// Stage, optimizer and data order as one worker (model/trainer.h):
//   data parallel: every rank holds the whole model and a contiguous share of each global
//     batch; gradient buckets are all-reduced (summed: the loss is already scaled by the
//     global token count) while backward still runs, on the last micro-batch only;
//   pipeline: each rank holds one stage of a balanced split and runs a validated schedule
//     (GPipe, 1F1B, ZB-H1, or interleaved 1F1B, where it holds v model chunks) with
//     asynchronous sends and receives; with --data-parallel=D,
//     D replicas of the pipeline (parallel/grid.h) each take a share of the batch, and each
//     stage's D ranks all-reduce its gradients in buckets during the last action writing
//     them (the last backward, or under ZB-H1 the last W);
//   model parallel: the pipeline with one micro-batch.
// With tied embeddings a pipeline's last stage holds a copy of the token table for its head;
// each step the first and last stage of a replica sum the two gradients (the embedding
// group) before the data-parallel reduction, so both copies stay equal, and the gradient
// norm counts the table once.
// With ZeRO-1 (zero = 1; data parallel or D >= 2) each data-parallel rank keeps the optimizer
// state of one contiguous shard of the stage's flat buffer: the buckets are reduce-scattered
// instead of all-reduced, each rank updates its shard, and the updated parameters are
// all-gathered bucket by bucket, each as soon as its part is updated.
// Every rank calls Issue() and Read() in lockstep; they are collective.
#ifndef TANDEM_PARALLEL_DISTRIBUTED_H_
#define TANDEM_PARALLEL_DISTRIBUTED_H_

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "model/input.h"
#include "model/trainer.h"
#include "parallel/buckets.h"
#include "parallel/grid.h"
#include "parallel/gradient_sync.h"
#include "parallel/layout.h"
#include "parallel/process_groups.h"
#include "parallel/partition.h"
#include "parallel/schedule.h"
#include "runtime/timeline.h"

namespace tandem {

// Seconds one block takes for a micro-batch: its forward, its backward's input gradient (B,
// Stage::BackwardInput) and its weight gradient (W, Stage::BackwardWeights); B + W is the
// whole backward.
struct BlockTime {
  std::string name;
  double forward = 0;
  double backward = 0;
  double weight = 0;
  double total() const { return forward + backward + weight; }
};
// Each block of `model` on `device`, computing in `compute` (the run's --dtype), timed alone
// for one micro-batch of `rows` samples by events on the stream (the median of a few runs
// after a warm-up).
absl::StatusOr<std::vector<BlockTime>> MeasureBlockTimes(const ModelConfig& model, Device device,
                                                         DType compute, int rows, uint64_t seed);
// The same on `stream`, a CPU stream of the caller's (the planner times on an immediate stream
// per thread while other threads compute beside it).
absl::StatusOr<std::vector<BlockTime>> MeasureBlockTimes(const ModelConfig& model, Device device,
                                                         DType compute, int rows, uint64_t seed,
                                                         Stream& stream);
// What MeasureBlockTimes runs: every block of `model` as a single-block stage, chained, and one
// micro-batch of `rows` synthetic samples.
class BlockPasses {
 public:
  static absl::StatusOr<std::unique_ptr<BlockPasses>> Create(const ModelConfig& model,
                                                             Device device, DType compute,
                                                             int rows, uint64_t seed);
  // Every block's forward, first to last, then from the last each block's B and W; with a
  // timeline, each part marked 3 * block + (0 forward, 1 B, 2 W).
  absl::Status Run(Stream& s, StreamTimeline* timeline);

 private:
  std::vector<std::unique_ptr<Stage>> stages_;
  MicroBatch mb_;
};
// Their totals, forward + backward: the cost --balance=time splits.
absl::StatusOr<std::vector<double>> MeasureBlockSeconds(const ModelConfig& model, Device device,
                                                        DType compute, int rows, uint64_t seed);
// MeasureBlockSeconds for the job `c` describes (its model, device and dtype, one
// micro-batch), the memory it took returned to the device afterwards: what --balance=time
// balances (LayoutInputs::block_seconds).
absl::StatusOr<std::vector<double>> TimeBlocks(const ParallelConfig& c);
// Per-step measurements of one rank. The times are the compute stream's, measured by events
// recorded on it between the step's phases (runtime/timeline.h), never by host clocks: on a
// GPU they are the device's time, whatever the host was doing.
struct StepTiming {
  double compute_seconds = 0;        // forward and backward
  double comm_seconds = 0;           // the communicator's busy time on the step's operations
  double exposed_comm_seconds = 0;   // the stream waiting for gradient or loss reductions
  // Tensor parallelism: the stream waiting for the blocks' collectives over the group, on the
  // critical path of every layer (not in compute_seconds, nor in exposed_comm_seconds).
  double tensor_comm_seconds = 0;
  // Pipeline: waiting on another stage (for an activation or gradient, for a send to be
  // taken, or at the step's end for the last stage to finish).
  double bubble_seconds = 0;
  double optimizer_seconds = 0;      // gradient norm, clipping and the update
  double input_seconds = 0;          // waiting for a micro-batch's copy to the device
  int64_t comm_bytes = 0;            // bytes all-reduced or sent
  uint64_t last_sequence = 0;        // the communicator's last collective sequence number
  int peak_in_flight = 0;            // most micro-batches whose activations were held
  // Pipeline: each forward, backward (B) and weight gradient (W) the stage ran, in order,
  // with its seconds on the stream, a forward's with its input wait (time the stage spent
  // neither computing nor waiting on another stage).
  std::vector<std::pair<Action, double>> action_seconds;
  // Pipeline: when each of those actions ran, in microseconds since this process's
  // TimeOrigin() (its offset on the host's monotonic clock, which the host's ranks share, puts
  // them on one clock: TraceClock::origin_us): where its stream reached the wait for its input
  // from another stage and resumed after it (both -1 where the action received none), and
  // where it ended. strategy_bench sets each receive against its sender's end.
  struct ActionTimes {
    double wait_us = -1, resumed_us = -1, end_us = 0;
  };
  std::vector<ActionTimes> action_times;
  // Host synchronizations during the step's issue and, for the step whose end the host read
  // the losses at, that read (runtime/host_sync.h).
  int64_t host_syncs = 0;
};

// The handovers of one measured pipeline step of schedule `s`: `times[st]` is stage st's
// StepTiming::action_times (its compute actions in the schedule's order), every stage's on
// one clock. A handover is one stage's compute action ending and the neighbour's stream,
// already waiting for what that action sends, resuming: for each action that received from
// another stage (the previous global stage's forward, or the next one's backward or B) and
// whose stream reached that wait no later than the sender's end, the resumption less that
// end, in seconds. It is what the step pays for each transfer on its critical path: the bytes
// moved and, on CPU workers, the threads woken on the way. Stages or actions missing from
// `times` are skipped.
std::vector<double> StepHandovers(const PipelineSchedule& s,
                                  const std::vector<std::vector<StepTiming::ActionTimes>>& times);

// A step read on the host: its report and timing.
struct CompletedStep {
  StepReport report;
  StepTiming timing;
};

class DistributedTrainer {
 public:
  // `comm` must outlive the trainer; its rank and world size decide this rank's part.
  static absl::StatusOr<std::unique_ptr<DistributedTrainer>> Create(const ParallelConfig& c,
                                                                    Communicator* comm);
  // Issues one global step on every rank (collective) and returns without waiting for it:
  // the host runs ahead of the device, and synchronizes only in Read. Every wait on
  // communication is the stream's (Work::WaitOn). `stop_requested`, if given, says whether
  // this rank wishes to stop after this step (a SIGTERM, the launcher's request); it is asked
  // once forward and backward are issued, and the answer travels with the step's own loss
  // reduction, so every rank learns at the same read whether any rank asked (stop_agreed())
  // without another collective. Under f16 each step is read at once (the loss scaler's
  // verdict decides the next step's scale).
  absl::Status Issue(const std::function<bool()>& stop_requested = nullptr);
  // The steps issued and not read yet, in order, with their losses, norms and timings: one
  // host synchronization (none when nothing is pending). Every rank reads at the same steps.
  absl::StatusOr<std::vector<CompletedStep>> Read();
  // Issue, then Read: one step, read at once. The report's loss is the global batch's.
  absl::StatusOr<StepReport> Step(StepTiming* timing = nullptr,
                                  const std::function<bool()>& stop_requested = nullptr);
  // Collective, between steps: the validation loss of the current weights on every rank,
  // forward only (no gradient, no update, the training's state untouched). Each data-parallel
  // replica takes its share of each validation batch; a pipeline passes each micro-batch
  // forward through its stages (receive, forward, send) and its last stage sums the losses;
  // the sum is reduced over the job, so every rank returns the same mean. Requires
  // validation in the config. Issues after the steps issued so far and reads the result (one
  // host synchronization).
  absl::StatusOr<float> Evaluate();
  // True once a step read ended with some rank asking to stop; the same on every rank.
  bool stop_agreed() const { return stop_agreed_; }
  // Steps issued so far (the next step's 0-based index).
  int step() const { return step_; }
  const Stage& stage() const { return *stage_; }
  // What this rank was checked to need before it allocated anything (JobLayout::memory).
  const MemoryCheck& memory() const { return memory_; }
  // Bytes of the optimizer state tensors this rank holds (AdamW: m and v), under ZeRO-1 those
  // of its shard only.
  int64_t optimizer_state_bytes() const {
    int64_t bytes = 0;
    for (const Tensor* t : {&optimizer_.state0(), &optimizer_.state1()}) {
      if (t->defined()) bytes += static_cast<int64_t>(t->bytes());
    }
    return bytes;
  }
  // Collective: writes this rank's shard (data parallel: rank 0 only), gathers every
  // shard's size and checksum, and rank 0 writes the manifest last; returns on every rank
  // once the checkpoint is complete. An error on any rank fails it on every rank.
  absl::Status SaveCheckpoint(const std::string& dir);
  // Loads this rank's part from checkpoint `prefix` ("<dir>/step-NNNNNN"), whatever
  // strategy and world size wrote it: parameters and optimizer state by name.
  absl::Status LoadCheckpoint(const std::string& prefix);

 private:
  DistributedTrainer(const ParallelConfig& c, Communicator* comm, TokenDataset d)
      : c_(c), comm_(comm), data_(std::move(d)), order_(TrainingSamples(c.train, data_),
                                                         c.train.seed),
        scaler_(c.train.dtype == DType::kF16) {}
  // One step issued and not read yet.
  struct Pending {
    StepReport report;  // the host's part: step and learning rate
    Tensor reduced;     // [summed token losses, squared gradient norm, stop flag] on the device
    Tensor host;        // the same, copied to pinned host memory at the step's end
    std::unique_ptr<StreamTimeline> timeline;
    StepTiming timing;  // the host's figures: bytes, sequence numbers, in flight, host syncs
    // Pipeline: the schedule's compute actions in the order of the timeline's compute phases.
    std::vector<Action> computed;
    // Its operations on each of Comms() are (first_sequences[i], last_sequences[i]].
    std::vector<uint64_t> first_sequences, last_sequences;
  };
  // The step's four numbers on the device (Issue): the summed token losses, the squared
  // gradient norm, the stop flag (the first three reduced over the job in one all-reduce),
  // and the gradients' factor.
  struct StepValues {
    Tensor loss_sum, sumsq, stop, scale;
  };
  // Issue's parts, in order: the step's bookkeeping and numbers zeroed; the squared gradient
  // norm of what this rank holds (the tied table's copy not counted); the reduction of the
  // step's numbers; the update (under ZeRO-1 the shard's, then the gathers) and the numbers'
  // copy to the host.
  absl::Status BeginStep(Stream& s, Pending* p, StepValues* v);
  absl::Status GradientNorm(Stream& s, const Tensor& sumsq);
  static std::vector<ElementRange> NormRanges(const Stage& stage);
  absl::Status ReduceStepValues(Stream& s, Pending* p);
  absl::Status StepEnd(Stream& s, const StepValues& v, Pending* p);
  absl::StatusOr<MicroBatch> LoadMicroBatch(int64_t row_begin, int64_t rows);
  // Reads the pending steps into read_ (one synchronization).
  absl::Status ReadPending();
  // Pipeline and model parallel: one exchange of an activation's bytes with each
  // neighbouring stage, both ways at once on both sides, before the first step. NCCL
  // connects two ranks the first time they exchange, and a rank cannot start a group whose
  // receive from a neighbour is not connected until that neighbour sends to it: without
  // this, a GPipe stage's first [send activation, receive gradient] group waits for the
  // next stage's first gradient, which waits for that activation.
  absl::Status ConnectNeighbours();
  absl::Status DataParallelPass(Stream& s, Tensor* loss_sum, Pending* p);
  absl::Status PipelinePass(Stream& s, Tensor* loss_sum, Pending* p);
  // Tied embeddings across stages: sums the first stage's table gradient and the last
  // stage's copy's over the embedding group (both then hold the sum, so their updates stay
  // equal), before the table's data-parallel bucket; the stream waits for it. A no-op on
  // other stages and without tying.
  absl::Status ReduceEmbeddingGrads(Stream& s, Pending* p);
  // The stream waits for every bucket's reduction (exposed communication).
  absl::Status WaitForBuckets(Stream& s, Pending* p);
  // The stream `s` waits, as WaitOn: for the executor and the gradient synchronization.
  GradientSync::StreamWait StreamWaiter(Stream& s) {
    return [this, &s](Work& w, const char* what) { return WaitOn(w, s, what); };
  }
  // "rank 3", or in a hybrid grid "rank 3 (replica 1, stage 1)", for messages.
  std::string Where() const;
  // The job's communicator and the groups split from it.
  std::vector<Communicator*> Comms() const;
  // ZeRO-1 with more than one replica to shard over (with one it is the plain update).
  bool zero() const { return sync_.zero(); }
  bool replicated() const { return sync_.replicated(); }
  // The host waits up to c_.timeout, or up to `timeout` (set-up and checkpoints only).
  absl::Status Wait(Work& w, const char* what) { return Wait(w, what, c_.timeout); }
  absl::Status Wait(Work& w, const char* what, absl::Duration timeout);
  // The stream `s` waits for `w`, up to c_.timeout; the host goes on.
  absl::Status WaitOn(Work& w, Stream& s, const char* what);
  // Stage `stage`'s shard file under checkpoint `prefix` (data parallel: the one file).
  std::string ShardName(const std::string& prefix, int stage) const;
  // The optimizer's state for the whole stage: its own, or under ZeRO-1 gathered from the
  // shards (collective among the stage's data-parallel ranks).
  absl::StatusOr<std::vector<Tensor>> GatherOptimizerState();
  // Under tensor parallelism: the whole tensors of the stage's flat `arrays` (its parameters,
  // then the optimizer's state), each rank's parts gathered over the tensor-parallel group and
  // put in their places, on the host, laid out by `*whole` (collective over the group).
  absl::StatusOr<std::vector<Tensor>> GatherTensorParallel(const std::vector<Tensor>& arrays,
                                                           std::unique_ptr<ParamLayout>* whole);

  ParallelConfig c_;
  Communicator* comm_;  // the job's
  JobLayout layout_;
  int replica_ = 0, stage_index_ = 0, tensor_ = 0;  // this rank's place in the grid
  ProcessGroups groups_;  // the groups split from comm_ (parallel/process_groups.h)
  // Tensor parallelism: the blocks' collectives over groups_.tp; null without.
  std::unique_ptr<CommTensorGroup> tensor_group_;
  // The parts of the stage's flat gradient buffer this rank's norm counts: all but a last
  // stage's copy of the tied table, and under tensor parallelism the replicated parameters
  // (the same on every rank of the group) on its first rank only.
  std::vector<ElementRange> norm_ranges_;
  TokenDataset data_;
  DataOrder order_;
  std::optional<ValidationSet> val_;
  std::unique_ptr<Stage> stage_;
  Optimizer optimizer_;
  LossScaler scaler_;
  GradientSync sync_;  // buckets, overlap and ZeRO-1 (parallel/gradient_sync.h)
  MemoryCheck memory_;
  int step_ = 0;
  bool stop_agreed_ = false;
  std::unique_ptr<InputPrefetcher> input_;
  std::deque<Pending> pending_;          // issued, not read
  std::vector<CompletedStep> read_;      // read, not returned yet (f16)
};

}  // namespace tandem

#endif  // TANDEM_PARALLEL_DISTRIBUTED_H_
