// Pipeline schedules as data (after PyTorch's pipelining schedules and torchgpipe): a list
// of actions per stage. Generators are pure functions of (stages, micro-batches); a separate
// pass inserts the sends and receives; the validator simulates every stage before a job
// starts and rejects a schedule that would deadlock or miss a step, printing the
// stage-by-step grid with the failing step marked. Text form of an action: "1F0" is stage 1,
// forward of micro-batch 0; also B (backward), SA/RA (send/receive activation), SG/RG
// (send/receive gradient) and "1OPT" (optimizer step).
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
  kSendActivation,
  kRecvActivation,
  kSendGradient,
  kRecvGradient,
  kOptimizerStep,
};

struct Action {
  ActionType type;
  int micro_batch = -1;  // -1 for the optimizer step
  bool is_communication() const {
    return type != ActionType::kForward && type != ActionType::kBackward &&
           type != ActionType::kOptimizerStep;
  }
  bool operator==(const Action& o) const {
    return type == o.type && micro_batch == o.micro_batch;
  }
};

struct PipelineSchedule {
  int stages = 0;
  int micro_batches = 0;
  std::vector<std::vector<Action>> actions;  // per stage, in execution order
};

// "1F0", "0SA3", "2OPT".
std::string ActionText(int stage, const Action& a);
// Parses one action's text; the stage it names goes to *stage.
absl::StatusOr<Action> ParseAction(absl::string_view text, int* stage);

// GPipe: every stage runs all forwards, then all backwards (in reverse micro-batch order),
// then the optimizer step. Compute actions only.
PipelineSchedule GpipeSchedule(int stages, int micro_batches);
// 1F1B (PipeDream-flush): stage s runs min(stages - s - 1, M) warm-up forwards, then
// alternates one forward and one backward, then the remaining backwards (cool-down), so at
// most stages - s micro-batches are in flight on stage s. Compute actions only.
PipelineSchedule OneFOneBSchedule(int stages, int micro_batches);
// "gpipe" or "1f1b", with communication inserted, the receives hoisted (HoistReceives) and
// the optimizer step appended.
absl::StatusOr<PipelineSchedule> MakeSchedule(absl::string_view name, int stages,
                                              int micro_batches);

// Adds RecvActivation before every forward and SendActivation after it (except at the ends
// of the pipeline), RecvGradient before every backward and SendGradient after it, and one
// OptimizerStep at the end of every stage.
PipelineSchedule InsertCommunication(const PipelineSchedule& compute);

// Moves each receive one compute action earlier, wherever the schedule stays valid: a stage
// then posts the receive for its next micro-batch before it computes the current one, and
// the transfer runs while that computes (on GPUs and CPU workers alike, a stage's transfers
// run in its order, each after the compute issued before it). Greedy, stage by stage and in
// order; a move is kept only if ValidateSchedule still accepts the whole schedule (it
// refuses, e.g., a receive that would come before a send its peer needs first).
PipelineSchedule HoistReceives(const PipelineSchedule& s);

// The groups each stage issues its transfers in, as action indices: every run of consecutive
// communication actions, split by the run of the peer stage that holds each transfer's
// counterpart, in order of first appearance. Each group then exchanges with one peer, and the
// peer groups the counterparts alike: NCCL needs that (a group's transfers finish together,
// and two ranks connect inside the first group in which they exchange), so two neighbours
// grouping one link's transfers differently could wait on each other for ever. A transfer
// without a counterpart (an invalid schedule) is a group of its own.
std::vector<std::vector<std::vector<int>>> ExchangeGroups(const PipelineSchedule& s);

// Checks counts (one forward and one backward per micro-batch and stage, one optimizer step,
// last), that both ends of every link post its transfers in the same micro-batch order (the
// k-th send matches the k-th receive), and simulates all stages: a stage reaching a run of
// transfers posts its ExchangeGroups at once and goes on; each stage's posted groups run one
// after the other, and a group completes only together with its counterpart group on the
// peer, when both are the first unfinished group of their stage; a forward or backward waits
// for the receive it needs. A schedule that stalls or mismatches is an error whose message
// holds the grid with "<-- ERROR HERE" at each stuck stage's step.
absl::Status ValidateSchedule(const PipelineSchedule& s);

// The stage-by-step grid (one column per stage).
std::string ScheduleGrid(const PipelineSchedule& s, const std::vector<int>& marks = {});

// Peak number of micro-batches whose activations a stage holds at once.
int PeakInFlight(const PipelineSchedule& s, int stage);

}  // namespace tandem

#endif  // TANDEM_PARALLEL_SCHEDULE_H_
