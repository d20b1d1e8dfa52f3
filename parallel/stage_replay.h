// What one stage's row of a pipeline schedule does with its buffers during a step, replayed
// from the schedule alone: the one statement of when each receive's tensor, each sent tensor,
// each micro-batch's activations and each deferred W's stash is taken and given back. The
// executor (parallel/pipeline_executor.h) follows the same rules and, given a log, records
// the same events as it goes; the memory estimate (parallel/layout.h) walks the replay for
// the moment the stage holds most, and SimulateSchedule times it. A test runs the executor
// on every schedule generator and compares its log with the replay, event for event.
//
// The rules, which are the executor's:
//   - a run of transfers posts its exchange groups in order (ExchangeGroups); each group takes
//     its transfers' tensors (a receive's buffer, or the tensor a send carries) when posted;
//   - a forward or backward that needs a receive first has the stream wait for that receive's
//     group and every group posted before it (the communicator finishes them in order): those
//     groups are done, and the tensors their sends carried go back;
//   - a forward takes its micro-batch's activations on its chunk; a backward gives them back,
//     and where a W follows (zero-bubble's split) takes what the W reads (the stash), which
//     the W gives back; a receive's buffer goes back once the action that read it is issued;
//   - at the step's end every group still outstanding is done, and its sends' tensors go back.
#ifndef TANDEM_PARALLEL_STAGE_REPLAY_H_
#define TANDEM_PARALLEL_STAGE_REPLAY_H_

#include <string>
#include <vector>

#include "parallel/schedule.h"

namespace tandem {

enum class ReplayKind {
  kGroupPosted,  // `group` issued (after its transfers' buffers were taken)
  kGroupDone,    // the stream waited for `group` (after its sends' tensors went back)
  kActionStart,  // compute action `action` issued
  kActionEnd,
  kAcquire,      // `buffer` for (chunk, micro_batch) taken
  kRelease,      // given back
};

enum class ReplayBuffer { kNone, kReceived, kSent, kActivations, kStash };

struct ReplayEvent {
  ReplayKind kind;
  ReplayBuffer buffer = ReplayBuffer::kNone;
  int action = -1;  // the index in the stage's actions: the compute action, or the transfer
  int group = -1;   // the exchange group (posted, done, and a transfer's buffers)
  int chunk = 0, micro_batch = -1;
  bool operator==(const ReplayEvent& o) const {
    return kind == o.kind && buffer == o.buffer && action == o.action && group == o.group &&
           chunk == o.chunk && micro_batch == o.micro_batch;
  }
};

// "acquire received 3c1 (action 7, group 2)", for test messages.
std::string ReplayEventText(const ReplayEvent& e);

// Stage `stage` of `s`, whose exchange groups are `groups` (ExchangeGroups(s)[stage]).
std::vector<ReplayEvent> ReplayStage(const PipelineSchedule& s,
                                     const std::vector<std::vector<int>>& groups, int stage);

}  // namespace tandem

#endif  // TANDEM_PARALLEL_STAGE_REPLAY_H_
