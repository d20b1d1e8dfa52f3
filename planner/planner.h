// The planner: predicts every parallel layout's step time and memory for N devices from
// measured parts, without running them. A layout is D data-parallel replicas of a K-stage
// pipeline (K = 1: data parallel) with a schedule (interleaved: with v model chunks a stage,
// 2 to 4, each at least a block), M micro-batches, recomputation, ZeRO-1 and a gradient bucket
// size. Its prediction:
//   compute   each block's forward, input-gradient (B) and weight-gradient (W) seconds for a
//             micro-batch, from a BlockProfile measured here or read from a file written on the
//             target hardware, at the micro-batch's rows (BlockProfile::BlocksAt: timed at
//             each row count the layouts run, or scaled from one);
//   pipeline  the schedule simulated with those durations (SimulateSchedule; per chunk under
//             interleaving), each stage's activations sent to the next in a transfer timed
//             by the link model, and for CPU workers each exchange group taking the link's
//             measured handover;
//   tensor    under tensor parallelism (T ranks a stage) each block's times over T, and each
//             layer's collectives on its critical path by the tensor-parallel link's model: in
//             forward and in B two all-reduces of the micro-batch's activations (sequence
//             parallelism: an all-gather and a reduce-scatter each, and three all-gathers
//             more in B), the embedding's one in forward, the head's one in B;
//   gradients the data-parallel all-reduce (ZeRO-1: reduce-scatter, then the all-gather of the
//             updated parameters) of each stage's buckets, by an alpha-beta model of the link
//             (ring algorithms), overlapped with the step's last backward as DDP does;
//   step end  each rank's parameters (under ZeRO-1 its shard) times the optimizer's measured
//             seconds per parameter, and the step overhead (what a measured one-worker step
//             takes beyond its blocks and optimizer), a stage's share by its parameters;
//   memory    the launcher's estimator (JobLayout::memory), the most of any rank;
//   sharing   CPU workers: blocks timed beside as many threads computing the same as the
//             run has workers on the host's cores; where more workers run than the host has
//             cores, the step simulated with the ranks that compute at each moment sharing
//             the cores (SharedCoresStep), its compute and its end alike, each pipeline
//             rank waiting on its neighbour keeping a share of a core from them
//             (waiting_share, fitted on the host to a measured pipeline step).
// The parts: link_model.cc (LinkModel), block_profile.cc (BlockProfile), shared_cores.cc
// (SharedCoresStep and the waiting share's fit) and planner.cc (Predict, MakePlan).
#ifndef TANDEM_PLANNER_PLANNER_H_
#define TANDEM_PLANNER_PLANNER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "parallel/distributed.h"

namespace tandem {

// One alpha-beta pair: a message of n bytes takes latency_s + n / bytes_per_s.
struct AlphaBeta {
  double latency_s = 0;
  double bytes_per_s = 0;  // 0: none given
  double Message(double bytes) const { return latency_s + bytes / bytes_per_s; }
};

// The alpha-beta (Hockney) model of a link: a message of n bytes takes alpha + n / bandwidth.
// Collectives over p ranks use the ring algorithms' step counts (NCCL's and Open MPI's for
// large messages): all-reduce 2(p-1) steps of n/p bytes, reduce-scatter and all-gather p-1.
struct LinkModel {
  double latency_s = 0;    // alpha
  double bytes_per_s = 0;  // bandwidth
  // CPU workers: what a pipeline's transfer on its critical path takes beyond SendRecv's
  // alpha-beta time: the threads woken on the way from one stage's stream to the next on a
  // host whose cores compute (the sender's communication thread, the receiver's, the
  // receiving stream's), which all-reduces timed among idle workers do not see. Measured in a
  // pipeline's steps (strategy_bench handover); 0 where none was (a --link for hardware not
  // here). Each exchange group of the simulated schedule takes it once (ScheduleDurations),
  // each transfer of the shared-core one (which has no groups).
  double handover_s = 0;
  // The reduce-scatter's and the all-gather's own pairs, where each was timed on the ranks
  // (FitLinkToRing over its p-1 steps; compare --plan on this host): within one host's shared
  // memory neither costs the ring's half of an all-reduce (Open MPI on 2 workers here: a
  // reduce-scatter of 8 MB took 1.9 times an all-reduce's time, an all-gather 0.3 times).
  // Without a bandwidth, the ring over the link's own pair.
  AlphaBeta reduce_scatter, all_gather;
  double SendRecv(double bytes) const;
  double AllReduce(double bytes, int ranks) const;
  double ReduceScatter(double bytes, int ranks) const;
  double AllGather(double bytes, int ranks) const;
  // "12.5 GB/s, 3.0 us", ", handover 250 us" where it has one, and the reduce-scatter's and
  // all-gather's own pairs where they have them ("; reduce-scatter 3.1 GB/s, 40 us").
  std::string ToString() const;
};

// "bandwidth_GBps,latency_us[,handover_us]", e.g. "450,3" (NVLink 4 within a node), "50,5"
// (400 Gb/s InfiniBand across nodes), "50,5,20" with a handover (LinkModel::handover_s, 0 if
// not given); the bandwidth positive and the times not negative, or an error saying the form.
absl::StatusOr<LinkModel> ParseLink(absl::string_view text);

// One timed message: `bytes` in `seconds`.
struct LinkSample {
  double bytes = 0;
  double seconds = 0;
};
// The fit of seconds = alpha + bytes / bandwidth to samples of at least two sizes, least
// squares of the relative error; an error where the fit is not physical (a bandwidth that is
// not positive).
absl::StatusOr<LinkModel> FitLink(const std::vector<LinkSample>& samples);
// The link under ring collectives of `bytes` over `ranks` timed as `samples`, each `steps`
// messages of bytes/ranks (an all-reduce 2(ranks-1), a reduce-scatter or all-gather
// ranks-1): FitLink's over those messages.
absl::StatusOr<LinkModel> FitLinkToRing(const std::vector<LinkSample>& samples, int ranks,
                                        int steps);

// Per-block times of one model on one kind of device, and the optimizer's seconds per
// parameter; written by a measurement (MeasureBlockProfile) or by hand for hardware not here,
// where `source` says how the figures were made.
struct BlockProfile {
  std::string model;   // the ModelConfig's ToString(): a profile fits only its model
  std::string device;  // e.g. "cpu", "NVIDIA H200"
  std::string dtype;   // the compute dtype's name
  int rows = 1;        // samples per micro-batch the times are for
  std::vector<BlockTime> blocks;  // each block's, for `rows` samples
  // The blocks timed again at other row counts (rows -> each block's times, as `blocks`).
  std::map<int, std::vector<BlockTime>> more_rows;
  double optimizer_per_param = 0;  // seconds per parameter of one optimizer step
  // A one-worker step's time outside its blocks and optimizer (the gradients' norm and
  // zeroing, the loss's sum, the gradient factor, the input), measured at `rows`; 0: none.
  double step_overhead = 0;
  // The threads that computed the same blocks beside the timing (a run's other workers on
  // the host's cores, sharing its caches and memory bandwidth); 0: timed alone.
  int peers = 0;
  // How far the last of `spread_threads` threads computing a pass of the blocks each, started
  // at once on the host's cores, finishes behind perfect sharing (their CPU time spread evenly
  // over the cores), as a share of it (the median of a few rounds); 0: not measured. CPU
  // workers that share cores finish their compute apart, and each step waits for the last at
  // its collectives.
  double finish_spread = 0;
  int spread_threads = 0;
  std::string source;
  // Each block's times for a micro-batch of `r` rows: those measured at `r`; between two
  // measured row counts the line through them; beyond the measured ones the line through the
  // nearest two (at least 0); with one row count, proportional to the rows.
  std::vector<BlockTime> BlocksAt(double r) const;
};

// How far the last of some threads started at once ends (`wall`, each thread's seconds from
// its own start to its end) behind perfect sharing of `cores` cores: their CPU time
// (`cpu`, each thread's own clock, in the same order) spread evenly over the cores, and no
// sooner than the longest thread's, as a share of it; 0 if not behind, or if the two lists
// differ in length. MeasureBlockProfile's finish spread is its median over rounds.
double FinishBehindSharing(const std::vector<double>& wall, const std::vector<double>& cpu,
                           int cores);

// One step of the validated schedule `s` with durations `d` (per_stage, transfer, handover)
// where its stages share `cores` cores: at each moment every stage that computes progresses
// at `cores` / (stages computing + `waiting_share` x stages waiting), at most 1, where a
// stage waiting on a transfer takes `waiting_share` of a computing stage's turn on the cores
// (PlanRequest::waiting_share). A stage done with its compute actions is not counted: it
// waits on the step's collectives, which the step's end (after the last compute) models.
// Each transfer takes d.transfer and d.handover from when both its ends are posted (no queue
// of exchange groups, as SimulateSchedule has: CPU workers' transfers are small beside their
// compute). Returns when the last compute action or transfer ends.
double SharedCoresStep(const PipelineSchedule& s, const ScheduleDurations& d, double cores,
                       double waiting_share = 0);

// The micro-batch row counts MakePlan's layouts of r.gpus ranks run, batch / gpus first, then
// the others from the largest down (among them a model-parallel replica's whole batch in one
// micro-batch, which the line through smaller ones missed: gpt-tiny's 8 and 16 rows 9% and
// 4% over their timings from 2 and 4 rows): the ones to time the blocks at.
std::vector<int> MicroBatchRows(int batch, int gpus);

// MeasureBlockTimes at each of `rows` (rows[0] is the profile's `rows`, the others go to
// more_rows), in five rounds over them, each part's median, while `peers` threads (CPU only)
// compute the same blocks at the same rows beside it, each on its own thread as a worker; one
// optimizer step over the whole model's parameters, timed alike but alone, and the step
// overhead: in each round, two one-worker training steps (Trainer, one micro-batch of rows[0],
// synthetic data) right after the blocks at rows[0] are timed alone, less those blocks' and
// the optimizer's time; the median of the rounds', at least 0. With `crowd` >= 2 (CPU only),
// the finish spread of that many threads at rows[0] too, three rounds of it after each of the
// five (after one more that warms up), the median of the fifteen.
absl::StatusOr<BlockProfile> MeasureBlockProfile(const ModelConfig& model, Device device,
                                                 DType compute, const std::vector<int>& rows,
                                                 absl::string_view optimizer, uint64_t seed,
                                                 int peers = 0, int crowd = 0);
// Block times for hardware not here, derived from each block's FLOPs for `rows` samples at
// `mfu` of a `tflops` peak (a layer: forward 24 C^2 + 4 T C FLOPs a token, B 24 C^2 + 8 T C,
// W 24 C^2; the head 2 C V forward and 4 C V B, its W none (its B computes its dW); the
// embedding's lookups and scatter-add, and the optimizer's AdamW pass (28 bytes a
// parameter), as memory traffic at `tbps` TB/s).
absl::StatusOr<BlockProfile> DeriveBlockProfile(const ModelConfig& model, DType compute, int rows,
                                                double tflops, double mfu, double tbps);

// --block-times files: JSON (Write gives Read's input back).
absl::StatusOr<BlockProfile> ReadBlockProfile(const std::string& path);
absl::Status WriteBlockProfile(const BlockProfile& p, const std::string& path);

// One layout of N ranks.
struct Layout {
  StrategyKind strategy = StrategyKind::kData;
  int data_parallel = 1;  // D
  int stages = 1;         // K
  std::string schedule;   // pipeline: gpipe, 1f1b, zb-h1 or interleaved; "" otherwise
  int virtual_stages = 1; // interleaved: model chunks v per stage
  int micro_batches = 1;  // M
  bool recompute = false;
  int zero = 0;
  int64_t bucket_bytes = 25 << 20;
  std::string balance = "params";  // the stage sizes the prediction assumed ("3,3,2")
  int tensor_parallel = 1;         // T: each stage over T ranks (T x D x K = N)
  bool sequence_parallel = false;  // T >= 2
  // "d2k2 1f1b M=4 zero1 recompute bucket 4 MB", "d1k2 interleaved v=2 M=4", with tensor
  // parallelism "t2 d2k2 1f1b M=4 sp"
  std::string Name() const;
  // The launcher flags that run it: --strategy, --schedule, --virtual-stages, --data-parallel,
  // --micro-batches, --zero, --recompute, --bucket-mb, --balance, --tensor-parallel,
  // --sequence-parallel.
  std::vector<std::string> LauncherFlags() const;
};

struct Prediction {
  Layout layout;
  double step_s = 0;
  // Parts of the step on its slowest path: compute, pipeline bubble (the stage's wait on its
  // neighbours), exposed gradient communication and the step's end: the optimizer (with
  // ZeRO-1's all-gather) and the step overhead (BlockProfile::step_overhead, the stage's share
  // by its parameters).
  double compute_s = 0, bubble_s = 0, exposed_comm_s = 0, optimizer_s = 0;
  // Tensor parallelism: the slowest path's waits for the blocks' collectives over the
  // tensor-parallel link, on the critical path (not in compute_s).
  double tensor_comm_s = 0;
  // CPU workers on fewer cores than workers: what the step takes on top of the step with a
  // core each, the ranks computing at each moment sharing the cores.
  double sharing_s = 0;
  // Several ranks: the step's wait for the last of them to finish its compute, the profile's
  // finish spread of the time the slowest path computes (compute_s + sharing_s).
  double spread_s = 0;
  int64_t memory_bytes = 0;  // the rank that needs the most
  // The largest cost besides compute, as a share of the step: "exposed all-reduce 31% of the
  // step"; "compute bound" where none is above 5%.
  std::string Reason() const;
};

struct PlanRequest {
  ParallelConfig base;       // the model, global batch, dtype, device, optimizer, seed
  int gpus = 1;              // N
  int host_cores = 0;        // CPU workers: the cores they share (0: each has its own)
  // CPU workers on fewer cores than workers: the share of a computing rank's turn on the
  // cores that a pipeline rank waiting on its neighbour takes (SharedCoresStep), fitted on
  // this host to a measured pipeline step; 0: a waiting rank takes none.
  double waiting_share = 0;
  std::string waiting_share_source;  // how it was had ("fitted to ...", "--waiting-share")
  // The layout waiting_share was fitted on (WaitingShareProbe's), where it was fitted here:
  // a check of the plan runs no layout of its shape (HeldOutReason).
  std::optional<Layout> waiting_share_fit;
  int64_t device_memory = -1;  // bytes per device; -1: not checked
  BlockProfile profile;
  LinkModel link;
  // The link within a node, which tensor parallelism's collectives take (--tp-link); without
  // a bandwidth, `link`.
  LinkModel tp_link;
  // Tensor parallelism stays within a node: T a power of two dividing the heads and at most
  // this (1: none enumerated).
  int gpus_per_node = 8;
  // The choices enumerated beside D x K and the schedules.
  std::vector<int64_t> bucket_bytes = {int64_t{25} << 20};
  // CPU workers on fewer cores than workers: the steps are simulated sharing the cores.
  bool SharesCores() const { return host_cores > 0 && gpus > host_cores; }
};

struct Plan {
  // Fitting layouts, fastest first; equal steps: faster without core sharing, then fewer
  // micro-batches, then less memory first.
  std::vector<Prediction> ranked;
  int considered = 0;              // layouts enumerated
  // Layouts left out, counted by reason ("needs 152 GB per device, more than 141 GB": by
  // the reason's kind, e.g. "does not fit in device memory").
  std::map<std::string, int> dropped;
  // The fastest of each kind, "data parallel", "pipeline", "model parallel", as its index in
  // `ranked` (absent where none fits).
  std::map<std::string, size_t> best_pure;
};

// One layout's prediction; an error where the layout cannot run (batch not divisible, more
// stages than blocks, an invalid schedule), as the launcher would refuse it.
absl::StatusOr<Prediction> Predict(const PlanRequest& r, const Layout& layout);

// Every layout of r.gpus ranks: T x D x K = N, T a power of two up to r.gpus_per_node dividing
// the heads (T >= 2 with sequence parallelism off and on); for K >= 2 each schedule; M among the divisors
// of the replica's batch (for K >= 2, 1 for the model-parallel split and from 2 up to 8K for the
// pipelines); recomputation off and on; ZeRO-1 off and on
// where D >= 2; each bucket size where D >= 2. An error for a request nothing can satisfy
// (no layout fits, or the profile is not for the request's model), in one line.
absl::StatusOr<Plan> MakePlan(const PlanRequest& r);

// The layout to fit PlanRequest::waiting_share to where CPU workers outnumber the host's
// cores: of `plan`'s, the 1F1B pipeline over the most stages, its micro-batches nearest 2K
// (strategy_bench handover's shape), without ZeRO-1 or recomputation: the layout whose
// ranks wait on their neighbours the most at once. None where the plan has no pipeline.
std::optional<Layout> WaitingShareProbe(const Plan& plan);

// A waiting share from 0 to 1 at which r's prediction of `probe` takes `measured_s`, by
// bisection between a share predicting a shorter step and one predicting a longer one (a
// slower stage can move work into another's idle time, so the step need not grow strictly
// with the share): 0 where even 0 predicts a longer step, 1 where even 1 predicts a shorter
// one; an error where the probe cannot be predicted.
absl::StatusOr<double> FitWaitingShare(PlanRequest r, const Layout& probe, double measured_s);

// Why a run of `l` cannot check predictions whose waiting share was fitted on `fitted`: ""
// where it can. The fitted layout itself ("the waiting share was fitted on it") and every
// layout of its shape, the same D replicas of K >= 2 stages, whatever its schedule,
// micro-batches, recomputation, ZeRO-1 or buckets ("its shape d1k4 is the one the waiting
// share was fitted on (d1k4 1f1b M=8); it differs from it only in schedule and
// micro-batches"): their steps wait as the fit's did, so the fit has absorbed what the model
// leaves out of them and their error says little of the model.
std::string HeldOutReason(const Layout& fitted, const Layout& l);

}  // namespace tandem

#endif  // TANDEM_PLANNER_PLANNER_H_
