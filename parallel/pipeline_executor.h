// One stage's row of a pipeline schedule, run for one training step (after PyTorch
// pipelining's _perform_action: one method per action type). The executor owns the step's
// transfer buffers, as gloo's algorithms hold theirs: the activations to send and the input
// gradients, the tensors receives fill, the exchange groups' works, and the micro-batches'
// tokens. The schedule says everything else:
//   - a run of transfers posts its exchange groups (ExchangeGroups: both neighbours group the
//     same transfers alike), each one SendRecv whose receives become ready together;
//   - a forward waits on the stream for its activation's receive, a backward (or B) for its
//     gradient's; the communicator finishes groups in issue order, so the stream waits on
//     every earlier group too, and their sent tensors go back to the allocator then;
//   - a whole backward or a W that writes a chunk's last parameter gradients hands each
//     block to the gradient synchronization as it completes (overlap with backward);
//   - the step ends with the stream waiting for every group still outstanding.
// Every wait is the stream's; the host never blocks here.
#ifndef TANDEM_PARALLEL_PIPELINE_EXECUTOR_H_
#define TANDEM_PARALLEL_PIPELINE_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "model/input.h"
#include "model/stage.h"
#include "parallel/schedule.h"
#include "parallel/stage_replay.h"
#include "runtime/timeline.h"

namespace tandem {

struct PipelineStepIO {
  Stage* stage = nullptr;
  Communicator* pp = nullptr;  // this replica's pipeline: rank = stage
  Stream* stream = nullptr;
  StreamTimeline* timeline = nullptr;
  Tensor loss_sum;             // the last stage's token losses are summed here
  int64_t rows = 0;            // a micro-batch's
  DType dtype = DType::kF32;   // the activations' and gradients' between stages
  // Micro-batch m's tokens and targets, their copy to the device queued.
  std::function<absl::StatusOr<MicroBatch>(int m)> load;
  // The stream waits for `w` (with the trainer's place and step in an error).
  std::function<absl::Status(Work& w, const char* what)> wait_on;
  // Called with each block whose backward completed the chunk's last gradients (null: the
  // gradients are reduced after the pass).
  std::function<absl::Status(int block)> gradients_ready;
  // Where given, every buffer taken and given back, group posted and done and compute action
  // issued, as they happen (ReplayStage says what they must be).
  std::vector<ReplayEvent>* log = nullptr;
};

class PipelineExecutor {
 public:
  // Stage `stage` of `schedule` with its `groups` (ExchangeGroups(schedule)[stage]).
  PipelineExecutor(const PipelineSchedule& schedule, const std::vector<std::vector<int>>& groups,
                   int stage, PipelineStepIO io);
  // Every action of the row, in order; then the stream waits for every transfer.
  absl::Status Run();
  // Bytes sent and received, and the compute actions in the order they were issued.
  int64_t comm_bytes() const { return comm_bytes_; }
  const std::vector<Action>& computed() const { return computed_; }

 private:
  int key(const Action& a) const { return a.chunk * schedule_.micro_batches + a.micro_batch; }
  absl::Status Forward(size_t i);
  absl::Status Backward(size_t i);
  absl::Status WeightGradient(size_t i);
  // Exchange group `g` as one SendRecv.
  absl::Status IssueGroup(size_t g);
  // The stream waits for the receive `ready` holds for action `a` and every group before it;
  // returns that receive's group, or -1 where the action received nothing.
  absl::StatusOr<int> WaitFor(std::map<int, size_t>& ready, const Action& a, const char* what);
  // The stream waits for every group before `end`; their sends' tensors go back.
  absl::Status WaitThrough(size_t end, const char* what);
  // Records an event where a log was given.
  void Log(ReplayKind kind, ReplayBuffer buffer, int action, int group) const;
  // A forward's or backward's start: the stream waits for what it receives from `ready`
  // (*received: that receive's group, or -1), the start is logged, and its micro-batch is
  // loaded, the next compute action's prefetched.
  absl::StatusOr<MicroBatch*> Start(size_t i, std::map<int, size_t>& ready, const char* what,
                                    int* received);
  // Micro-batch m's tokens, loaded on first use; and the next compute action's after i.
  absl::StatusOr<MicroBatch*> Batch(int m);
  absl::Status PrefetchAfter(size_t i);
  // The gradient hand-over for action i: set where it writes a chunk's last gradients.
  std::function<absl::Status(int)> GradientsReady(size_t i) const;

  const PipelineSchedule& schedule_;
  const std::vector<std::vector<int>>& groups_;
  const std::vector<Action>& actions_;
  const int stage_index_;
  PipelineStepIO io_;
  int next_ = 0, prev_ = 0;          // the neighbours (around the ring when interleaved)
  std::vector<bool> split_;          // per key: B and W split (DeferredWeights)
  std::vector<size_t> last_gradient_of_;  // per chunk: the last action writing its gradients
  std::vector<size_t> last_use_;     // per micro-batch: the last compute action reading it
  Tensor scratch_;                   // the last stage's loss accumulation
  // The step's buffers, by key: activations to send, input gradients to send, and the
  // tensors receives fill (activations and gradients).
  std::map<int, Tensor> outputs_, input_grads_, act_in_, grad_in_;
  // The exchange groups' works in issue order (works_[g] is group g's); a receive's group, by
  // key; the stream waited on works_[0, waited_).
  std::vector<std::unique_ptr<Work>> works_;
  std::map<int, size_t> act_ready_, grad_ready_;
  size_t waited_ = 0;
  std::map<int, MicroBatch> batches_;
  int64_t comm_bytes_ = 0;
  std::vector<Action> computed_;
};

}  // namespace tandem

#endif  // TANDEM_PARALLEL_PIPELINE_EXECUTOR_H_
