// Pipeline schedules as data (after PyTorch's pipelining schedules and torchgpipe): a list
// of actions per stage. Generators are pure functions of (stages, micro-batches); a separate
// pass inserts the sends and receives; the validator simulates every stage before a job
// starts and rejects a schedule that would deadlock or miss a step, printing the
// stage-by-step grid with the failing step marked. Text form of an action: "1F0" is stage 1,
// forward of micro-batch 0; also B (backward), W (weight gradient), SA/RA (send/receive
// activation), SG/RG (send/receive gradient) and "1OPT" (optimizer step).
//
// Model chunks (interleaved schedules): each stage (a row of the schedule, one pipeline rank)
// may hold `chunks` model chunks, and an action names its chunk after a "c": "1B3c1" is stage
// 1's backward of micro-batch 3 on its chunk 1. Chunk 0 is written without the suffix
// ("1B3c0" reads as "1B3"), so a schedule of one chunk reads as before. With K stages the
// model has K * chunks global stages, placed as Megatron's loop placement does: global stage
// g runs on stage g mod K as its chunk g div K (PlaceStage), so activations go from stage K-1
// back to stage 0 at each chunk's end.
//
// B and W: a B computes the gradient the previous global stage needs. When the same stage
// also runs a W for that micro-batch and chunk, B computes the input gradient (and the
// LayerNorms' and the head's parameter gradients) and W, which needs no communication and may
// come any time after its B, adds the other linear layers' weight gradients (zero-bubble's split:
// Stage::BackwardInput / BackwardWeights); without a W, B is the whole backward.
#ifndef TANDEM_PARALLEL_SCHEDULE_H_
#define TANDEM_PARALLEL_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

enum class ActionType {
  kForward,
  kBackward,
  kWeightGradient,
  kSendActivation,
  kRecvActivation,
  kSendGradient,
  kRecvGradient,
  kOptimizerStep,
};

struct Action {
  ActionType type;
  int micro_batch = -1;  // -1 for the optimizer step
  int chunk = 0;         // the stage's model chunk, in [0, PipelineSchedule::chunks)
  bool is_compute() const {
    return type == ActionType::kForward || type == ActionType::kBackward ||
           type == ActionType::kWeightGradient;
  }
  bool is_communication() const { return !is_compute() && type != ActionType::kOptimizerStep; }
  bool operator==(const Action& o) const {
    return type == o.type && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

struct PipelineSchedule {
  int stages = 0;
  int micro_batches = 0;
  std::vector<std::vector<Action>> actions;  // per stage, in execution order
  int chunks = 1;                            // model chunks per stage
};

// Where global stage `global_stage` of a model split into ranks * chunks stages runs:
// stage global_stage mod ranks, as its chunk global_stage div ranks (Megatron's loop
// placement). GlobalStage is the inverse.
struct StagePlace {
  int stage;
  int chunk;
  bool operator==(const StagePlace& o) const { return stage == o.stage && chunk == o.chunk; }
};
StagePlace PlaceStage(int global_stage, int ranks);
int GlobalStage(int stage, int chunk, int ranks);

// "1F0", "0SA3", "1W3c1", "2OPT".
std::string ActionText(int stage, const Action& a);
// Parses one action's text; the stage it names goes to *stage. ActionText(ParseAction(t))
// gives t back, except that an explicit "c0" is dropped.
absl::StatusOr<Action> ParseAction(absl::string_view text, int* stage);

// GPipe: every stage runs all forwards, then all backwards (in reverse micro-batch order),
// then the optimizer step. Compute actions only.
PipelineSchedule GpipeSchedule(int stages, int micro_batches);
// 1F1B (PipeDream-flush): stage s runs min(stages - s - 1, M) warm-up forwards, then
// alternates one forward and one backward, then the remaining backwards (cool-down), so at
// most stages - s micro-batches are in flight on stage s. Compute actions only.
PipelineSchedule OneFOneBSchedule(int stages, int micro_batches);
// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): 1F1B's forwards and backwards in
// 1F1B's order, with the backward split on every stage but the first: stage s runs each
// micro-batch's B where 1F1B runs its backward and its W s backwards later (oldest first),
// the last s Ws filling the cool-down, where 1F1B's stage s waits. The first stage's Bs stay
// whole backwards (no W). Compute actions only.
PipelineSchedule ZeroBubbleH1Schedule(int stages, int micro_batches);
// Interleaved 1F1B (Narayanan et al., 2021; Megatron-LM's virtual pipeline): each stage holds
// `chunks` model chunks (global stage g on stage g mod K as chunk g div K, PlaceStage). The
// micro-batches go in runs of K: each run's forwards through chunk 0, then chunk 1, and so on,
// and the backwards likewise from the last chunk down. Stage s runs
// 2(K - s - 1) + (chunks - 1)K warm-up forwards (all of them when M = K), then alternates one
// forward and one backward, then the cool-down, as Megatron's
// forward_backward_pipelining_with_interleaving. With equal chunks the bubble is
// (K-1)/(chunks * M + K - 1) of the step. Needs M a multiple of K. Compute actions only.
PipelineSchedule InterleavedSchedule(int stages, int chunks, int micro_batches);
// "gpipe", "1f1b", "zb-h1" or "interleaved" (with `chunks` model chunks a stage, 2 or more;
// every other schedule takes 1), with communication inserted, the receives hoisted
// (HoistReceives) and the optimizer step appended; an error in one line for what a schedule
// cannot run.
absl::StatusOr<PipelineSchedule> MakeSchedule(absl::string_view name, int stages,
                                              int micro_batches, int chunks = 1);

// Adds RecvActivation before every forward and SendActivation after it (except at the ends
// of the pipeline: the first and last global stages), RecvGradient before every backward and
// SendGradient after it, each on the forward's or backward's chunk, and one OptimizerStep at
// the end of every stage. Weight gradients need no transfer; a receive goes before the Ws
// just before its forward or backward, joining the run of transfers before them.
PipelineSchedule InsertCommunication(const PipelineSchedule& compute);

// Moves each receive one compute action earlier, wherever the schedule stays valid: a stage
// then posts the receive for its next micro-batch before it computes the current one, and
// the transfer runs while that computes (on GPUs and CPU workers alike, a stage's transfers
// run in its order, each after the compute issued before it). Greedy, stage by stage and in
// order; a move is kept only if ValidateSchedule still accepts the whole schedule (it
// refuses, e.g., a receive that would come before a send its peer needs first) and the step
// it times (SimulateSchedule, every F, B and W one unit) is no longer: a receive posted early
// heads its stage's queue of transfers until the peer sends, and a send queued behind it
// waits too (ZB-H1 on 3 stages or more would otherwise lose its textbook bubble).
PipelineSchedule HoistReceives(const PipelineSchedule& s);

// The groups each stage issues its transfers in, as action indices: every run of consecutive
// communication actions, split by the run of the peer stage that holds each transfer's
// counterpart, in order of first appearance. Each group then exchanges with one peer, and the
// peer groups the counterparts alike, so a run's transfers with two neighbours never wait on
// each other. With several chunks a stage (interleaved), where a stage sends to and receives
// from both neighbours around the ring after each step, each run is one group, as Megatron
// batches them: its transfers progress together, whichever peers they go to (one NCCL group;
// one MPI Waitall), so no neighbour waits for another's earlier group. A transfer without a
// counterpart (an invalid schedule) is a group of its own.
std::vector<std::vector<std::vector<int>>> ExchangeGroups(const PipelineSchedule& s);
// One stage's row of ExchangeGroups turned around: for each of its `actions` actions the
// index of the group holding it, -1 for a compute action.
std::vector<int> GroupOfActions(const std::vector<std::vector<int>>& groups, size_t actions);

// Checks counts (one forward and one backward per micro-batch, chunk and stage, at most one
// weight gradient, after its backward; chunks in range, and several only on 2 stages or more;
// one optimizer step, last), that both ends of every pair of stages post the transfers from
// one to the other in the same order (the k-th send matches the k-th receive), and simulates
// all stages: a stage reaching a run of transfers posts its ExchangeGroups at once and goes
// on; each stage's posted groups run one after the other; a transfer completes once the
// groups holding its two ends are each the first unfinished group of its stage, and a group
// once all its transfers have; a forward or backward waits for the receive it needs, a weight
// gradient for its backward. A schedule that stalls or mismatches is an error whose message
// holds the grid with "<-- ERROR HERE" at each stuck stage's step.
absl::Status ValidateSchedule(const PipelineSchedule& s);

// How long a stage's compute actions on one chunk take (any unit, the same for all).
// Zero-bubble's convention: `backward` is a B that computes the input gradient and
// `weight` its W, so a B without a W for its micro-batch (a whole backward) takes
// backward + weight. Where a schedule never splits the backward, backward may hold the whole
// of it and weight 0.
struct ComputeSeconds {
  double forward = 0;
  double backward = 0;
  double weight = 0;
  // Compute action `x`'s seconds: a B whose W is its own action (`deferred`) takes
  // `backward`, a whole backward backward + weight.
  double Of(const Action& x, bool deferred) const;
};

struct ScheduleDurations {
  // [stage][chunk]; empty: every action takes no time.
  std::vector<std::vector<ComputeSeconds>> per_stage;
  // Each transfer: an exchange group of n transfers takes n * transfer.
  double transfer = 0;
  // Each exchange group's fixed cost on top, whatever it carries: the time to hand a group
  // from one stage's stream to the other's beyond moving its bytes (on CPU workers, the
  // threads woken on the way; strategy_bench measures it in the steps).
  double handover = 0;
  // [stage][index in the stage's actions]: a compute action's own duration (as a run
  // measured it: one step replayed with each action's time), in place of per_stage's for
  // its kind; empty, or negative for an action, where per_stage's holds. A whole backward's
  // entry is its whole time.
  std::vector<std::vector<double>> per_action;
  // Every stage and chunk alike.
  static ScheduleDurations Uniform(int stages, int chunks, ComputeSeconds c) {
    return {std::vector<std::vector<ComputeSeconds>>(stages,
                                                     std::vector<ComputeSeconds>(chunks, c))};
  }
};

// One step of a schedule, timed (optimizer step excluded).
struct SimulatedStep {
  std::vector<double> busy;  // per stage, the time it computed
  double makespan = 0;       // from the first action to the last stage's end
  // The mean over stages of (makespan - busy) / makespan: the share of the step a stage
  // waits on a neighbour, as the runtime measures it (strategy_bench, launcher/run_report).
  double bubble_fraction = 0;
};

// ValidateSchedule's simulation with time, over each stage's replay (parallel/stage_replay.h:
// the groups a stage posts and the waits its stream makes, as the executor runs them): each
// compute action starts once the stage is free and what it needs is there (the receive it
// waits for, or for a W its B) and takes its duration; a transfer's two ends meet once the
// groups holding them are both posted and both stages' earlier groups done, and a group
// completes once all its transfers' ends have met, plus its transfer time (n transfers: n
// times the transfer) and the handover; a stage's step ends once its last compute action
// and its last transfer have. The step ends when the
// last stage's does: a stage's time until then that it does not compute is its bubble. An
// invalid schedule, or durations not shaped [stages][chunks], is the error ValidateSchedule
// gives.
absl::StatusOr<SimulatedStep> SimulateSchedule(const PipelineSchedule& s,
                                               const ScheduleDurations& d);

// The stage-by-step grid (one column per stage).
std::string ScheduleGrid(const PipelineSchedule& s, const std::vector<int>& marks = {});

// Peak number of micro-batches whose activations a stage holds at once, over all its chunks
// (from the forward to the backward, whole or B: Stage::in_flight).
int PeakInFlight(const PipelineSchedule& s, int stage);
// Peak number of micro-batches whose W is pending on a stage at once (from the B to the W:
// Stage::weights_pending), each keeping what its W reads. The two peaks need not fall at
// the same moment: their sum bounds what the stage holds from above.
int PeakPendingWeights(const PipelineSchedule& s, int stage);
// Whether `stage` runs a W of its own for micro-batch m on chunk c (its B then computes the
// input gradient and W the rest), indexed by c * micro_batches + m.
std::vector<bool> DeferredWeights(const PipelineSchedule& s, int stage);

}  // namespace tandem

#endif  // TANDEM_PARALLEL_SCHEDULE_H_
