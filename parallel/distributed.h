// Training across ranks with one of three interchangeable strategies, all over the same
// Stage, optimizer and data order as one worker (model/trainer.h):
//   data parallel: every rank holds the whole model and a contiguous share of each global
//     batch; gradient buckets are all-reduced (summed: the loss is already scaled by the
//     global token count) while backward still runs, on the last micro-batch only;
//   pipeline: rank r holds stage r of a balanced split and runs a validated schedule
//     (GPipe or 1F1B) with asynchronous sends and receives;
//   model parallel: the pipeline with one micro-batch.
// Every rank calls Step() in lockstep; it is collective.
#ifndef TANDEM_PARALLEL_DISTRIBUTED_H_
#define TANDEM_PARALLEL_DISTRIBUTED_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "model/input.h"
#include "model/trainer.h"
#include "parallel/buckets.h"
#include "parallel/partition.h"
#include "parallel/schedule.h"
#include "runtime/timeline.h"

namespace tandem {

enum class StrategyKind { kData, kModel, kPipeline };
absl::StatusOr<StrategyKind> ParseStrategy(absl::string_view name);
const char* StrategyName(StrategyKind k);

struct ParallelConfig {
  TrainConfig train;
  StrategyKind strategy = StrategyKind::kData;
  std::string schedule = "gpipe";    // pipeline: gpipe or 1f1b
  std::string balance = "params";    // pipeline: params, or explicit sizes "3,3,2"
  int64_t bucket_bytes = 25 << 20;   // data parallel
  bool overlap = true;               // data parallel: all-reduce during backward
  bool recompute = false;            // keep only stage inputs; recompute forward in backward
  absl::Duration timeout = absl::Minutes(5);  // any one wait for communication
};

// Checks that the strategy fits the model and world size (batch divisible, stages <= blocks,
// schedule valid), before any worker starts. Returns the stage bounds (pipeline / model) or
// {0, num_blocks} (data parallel).
absl::StatusOr<StageBounds> PlanStages(const ParallelConfig& c, int world_size);

// Forward + backward seconds of each block of `model` on `device`, computing in `compute`
// (the run's --dtype), for one micro-batch of `rows` samples (the median of a few runs after
// a warm-up): the cost --balance=time splits.
absl::StatusOr<std::vector<double>> MeasureBlockSeconds(const ModelConfig& model, Device device,
                                                        DType compute, int rows, uint64_t seed);
// MeasureBlockSeconds for the job `c` describes (its model, device and dtype, one
// micro-batch), the memory it took returned to the device afterwards.
absl::StatusOr<std::vector<double>> TimeBlocks(const ParallelConfig& c);
// Explicit stage sizes ("3,3,2") that balance the per-block `seconds` over `world_size` stages.
absl::StatusOr<std::string> BalancedSizes(const std::vector<double>& seconds, int world_size);
// The --balance a job hands its workers: "time" is measured here, once, and turned into
// explicit stage sizes so every rank gets the same split; other values as given.
absl::StatusOr<std::string> ResolveBalance(const ParallelConfig& c, int world_size);

// What each of `world_size` ranks must hold during a step (model/memory.h), given the stage
// bounds PlanStages returned: its stage's model state and the activations of as many
// micro-batches as its schedule holds at once.
absl::StatusOr<std::vector<MemoryNeed>> RankMemoryNeeds(const ParallelConfig& c,
                                                        const StageBounds& bounds, int world_size);

// Per-step measurements of one rank. The times are the compute stream's, measured by events
// recorded on it between the step's phases (runtime/timeline.h), never by host clocks: on a
// GPU they are the device's time, whatever the host was doing.
struct StepTiming {
  double compute_seconds = 0;        // forward and backward
  double comm_seconds = 0;           // the communicator's busy time on the step's operations
  double exposed_comm_seconds = 0;   // the stream waiting for gradient or loss reductions
  double bubble_seconds = 0;         // pipeline: waiting for activations or gradients
  double optimizer_seconds = 0;      // gradient norm, clipping and the update
  double input_seconds = 0;          // waiting for a micro-batch's copy to the device
  int64_t comm_bytes = 0;            // bytes all-reduced or sent
  uint64_t last_sequence = 0;        // the communicator's last collective sequence number
  int peak_in_flight = 0;            // most micro-batches whose activations were held
  // Host synchronizations during the step's issue and, for the step whose end the host read
  // the losses at, that read (runtime/host_sync.h).
  int64_t host_syncs = 0;
};

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
  // True once a step read ended with some rank asking to stop; the same on every rank.
  bool stop_agreed() const { return stop_agreed_; }
  // Steps issued so far (the next step's 0-based index).
  int step() const { return step_; }
  const Stage& stage() const { return *stage_; }
  // What this rank was checked to need before it allocated anything (RankMemoryNeeds).
  const MemoryCheck& memory() const { return memory_; }
  // Collective: writes this rank's shard (data parallel: rank 0 only), gathers every
  // shard's size and checksum, and rank 0 writes the manifest last; returns on every rank
  // once the checkpoint is complete. An error on any rank fails it on every rank.
  absl::Status SaveCheckpoint(const std::string& dir);
  // Loads this rank's part from checkpoint `prefix` ("<dir>/step-NNNNNN"), whatever
  // strategy and world size wrote it: parameters and optimizer state by name.
  absl::Status LoadCheckpoint(const std::string& prefix);

 private:
  DistributedTrainer(const ParallelConfig& c, Communicator* comm, TokenDataset d)
      : c_(c), comm_(comm), data_(std::move(d)), order_(data_.num_samples(), c.train.seed),
        scaler_(c.train.dtype == DType::kF16) {}
  // One step issued and not read yet.
  struct Pending {
    StepReport report;  // the host's part: step and learning rate
    Tensor reduced;     // [summed token losses, squared gradient norm, stop flag] on the device
    Tensor host;        // the same, copied to pinned host memory at the step's end
    std::unique_ptr<StreamTimeline> timeline;
    StepTiming timing;  // the host's figures: bytes, sequence numbers, in flight, host syncs
    uint64_t first_sequence = 0;  // its operations are (first_sequence, timing.last_sequence]
  };
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
  // The host waits up to c_.timeout, or up to `timeout` (set-up and checkpoints only).
  absl::Status Wait(Work& w, const char* what) { return Wait(w, what, c_.timeout); }
  absl::Status Wait(Work& w, const char* what, absl::Duration timeout);
  // The stream `s` waits for `w`, up to c_.timeout; the host goes on.
  absl::Status WaitOn(Work& w, Stream& s, const char* what);
  // The model blocks rank `rank` holds, [begin, end): all of them under data parallelism.
  std::pair<int, int> BlockRange(int rank) const;
  // Rank `rank`'s shard file under checkpoint `prefix` (data parallel: the one file).
  std::string ShardName(const std::string& prefix, int rank) const;

  ParallelConfig c_;
  Communicator* comm_;
  TokenDataset data_;
  DataOrder order_;
  std::unique_ptr<Stage> stage_;
  Optimizer optimizer_;
  LossScaler scaler_;
  StageBounds bounds_;
  std::vector<Bucket> buckets_;
  PipelineSchedule schedule_;
  std::vector<std::vector<int>> exchange_groups_;  // this stage's (ExchangeGroups)
  MemoryCheck memory_;
  int step_ = 0;
  bool stop_agreed_ = false;
  std::unique_ptr<InputPrefetcher> input_;
  std::deque<Pending> pending_;          // issued, not read
  std::vector<CompletedStep> read_;      // read, not returned yet (f16)
};

}  // namespace tandem

#endif  // TANDEM_PARALLEL_DISTRIBUTED_H_
