#include "parallel/pipeline_executor.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/trainer.h"
#include "parallel/step_phases.h"
#include "runtime/status.h"

namespace tandem {
namespace {

// "3", and with several chunks "3 chunk 1", for the timeline's phase names.
std::string On(const Action& a, int chunks) {
  return chunks == 1 ? absl::StrCat(a.micro_batch)
                     : absl::StrCat(a.micro_batch, " chunk ", a.chunk);
}

}  // namespace

PipelineExecutor::PipelineExecutor(const PipelineSchedule& schedule,
                                   const std::vector<std::vector<int>>& groups, int stage,
                                   PipelineStepIO io)
    : schedule_(schedule),
      groups_(groups),
      actions_(schedule.actions[stage]),
      stage_index_(stage),
      io_(std::move(io)) {
  const int K = schedule.stages;
  next_ = (stage + 1) % K;
  prev_ = (stage + K - 1) % K;
  // The micro-batches whose backward this stage splits: a B with a W for the same
  // micro-batch and chunk computes the input gradient (and the LayerNorms' and the head's
  // parameter gradients), and the W adds the other linear layers' weight gradients.
  split_ = DeferredWeights(schedule, stage);
  // Each chunk's last action writing parameter gradients (a whole backward or a W: under
  // GPipe and 1F1B the last micro-batch's backward, under ZB-H1 the stage's last W)
  // completes them: the data-parallel buckets of its blocks go out during it. And the last
  // action reading each micro-batch's tokens, after which they go.
  last_gradient_of_.assign(schedule.chunks, 0);
  last_use_.assign(schedule.micro_batches, 0);
  for (size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    if (a.type == ActionType::kWeightGradient ||
        (a.type == ActionType::kBackward && !split_[key(a)])) {
      last_gradient_of_[a.chunk] = i;
    }
    if (a.is_compute()) last_use_[a.micro_batch] = i;
  }
}

std::function<absl::Status(int)> PipelineExecutor::GradientsReady(size_t i) const {
  const bool last = std::find(last_gradient_of_.begin(), last_gradient_of_.end(), i) !=
                    last_gradient_of_.end();
  return last ? io_.gradients_ready : nullptr;
}

absl::StatusOr<MicroBatch*> PipelineExecutor::Batch(int m) {
  auto it = batches_.find(m);
  if (it == batches_.end()) {
    ASSIGN_OR_RETURN(MicroBatch mb, io_.load(m));
    it = batches_.emplace(m, std::move(mb)).first;
  }
  return &it->second;
}

absl::Status PipelineExecutor::PrefetchAfter(size_t i) {
  for (size_t j = i + 1; j < actions_.size(); ++j) {
    if (actions_[j].type == ActionType::kForward || actions_[j].type == ActionType::kBackward) {
      return Batch(actions_[j].micro_batch).status();
    }
  }
  return absl::OkStatus();
}

void PipelineExecutor::Log(ReplayKind kind, ReplayBuffer buffer, int action, int group) const {
  if (io_.log == nullptr) return;
  ReplayEvent e{kind, buffer, action, group};
  if (buffer != ReplayBuffer::kNone) {
    e.chunk = actions_[action].chunk;
    e.micro_batch = actions_[action].micro_batch;
  }
  io_.log->push_back(e);
}

absl::Status PipelineExecutor::WaitThrough(size_t end, const char* what) {
  for (; waited_ < end; ++waited_) {
    const bool own = waited_ + 1 == end && what != nullptr;
    RETURN_IF_ERROR(
        io_.wait_on(*works_[waited_], own ? what : works_[waited_]->description().c_str()));
    for (int k : groups_[waited_]) {
      const ActionType t = actions_[k].type;
      if (t == ActionType::kSendActivation || t == ActionType::kSendGradient) {
        Log(ReplayKind::kRelease, ReplayBuffer::kSent, k, static_cast<int>(waited_));
      }
    }
    Log(ReplayKind::kGroupDone, ReplayBuffer::kNone, -1, static_cast<int>(waited_));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PipelineExecutor::WaitFor(std::map<int, size_t>& ready, const Action& a,
                                              const char* what) {
  auto it = ready.find(key(a));
  if (it == ready.end()) return -1;
  // The communicator runs its operations in issue order, so every group issued before this
  // receive's has finished too: the stream waits on them as well (at no cost), which lets the
  // groups of sends alone, that nothing else waits on, give their tensors back now rather
  // than at the step's end (a middle stage of 4 kept every one of its 2M sends).
  const size_t group = it->second;
  RETURN_IF_ERROR(WaitThrough(group + 1, what));
  ready.erase(it);
  RETURN_IF_ERROR(
      io_.timeline->Mark(kBubble, absl::StrCat("wait ", a.micro_batch), a.micro_batch));
  return static_cast<int>(group);
}

absl::Status PipelineExecutor::IssueGroup(size_t g) {
  const std::vector<int>& indices = groups_[g];
  const Stage& st = *io_.stage;
  const Shape boundary = st.BoundaryShape(io_.rows);
  const DType dtype = io_.dtype;
  const Device device = st.device();
  std::vector<PeerTransfer> group;
  std::vector<std::pair<std::map<int, size_t>*, int>> receives;
  for (int k : indices) {
    const int m = key(actions_[k]);
    switch (actions_[k].type) {
      case ActionType::kSendActivation:
      case ActionType::kSendGradient: {
        // What the forward (an activation) or backward (an input gradient) made; a validated
        // schedule sends only after it.
        const bool activation = actions_[k].type == ActionType::kSendActivation;
        std::map<int, Tensor>& made = activation ? outputs_ : input_grads_;
        const auto it = made.find(m);
        if (it == made.end()) {
          return absl::InternalError(absl::StrCat(
              "stage ", stage_index_, " sends ", ActionText(stage_index_, actions_[k]),
              " before the action that makes it"));
        }
        group.push_back(PeerTransfer::Send(it->second, activation ? next_ : prev_));
        made.erase(it);
        break;
      }
      case ActionType::kRecvActivation: {
        ASSIGN_OR_RETURN(act_in_[m], Tensor::Empty(boundary, dtype, device));
        group.push_back(PeerTransfer::Recv(act_in_[m], prev_));
        receives.push_back({&act_ready_, m});
        break;
      }
      default: {  // kRecvGradient
        ASSIGN_OR_RETURN(grad_in_[m], Tensor::Empty(boundary, dtype, device));
        group.push_back(PeerTransfer::Recv(grad_in_[m], next_));
        receives.push_back({&grad_ready_, m});
        break;
      }
    }
    comm_bytes_ += static_cast<int64_t>(group.back().tensor.bytes());
    Log(ReplayKind::kAcquire,
        group.back().kind == PeerTransfer::Kind::kRecv ? ReplayBuffer::kReceived
                                                       : ReplayBuffer::kSent,
        k, static_cast<int>(g));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Work> w, io_.pp->SendRecv(group));
  for (auto& [ready, m] : receives) (*ready)[m] = works_.size();
  works_.push_back(std::move(w));
  Log(ReplayKind::kGroupPosted, ReplayBuffer::kNone, -1, static_cast<int>(g));
  return absl::OkStatus();
}

absl::StatusOr<MicroBatch*> PipelineExecutor::Start(size_t i, std::map<int, size_t>& ready,
                                                    const char* what, int* received) {
  ASSIGN_OR_RETURN(*received, WaitFor(ready, actions_[i], what));
  Log(ReplayKind::kActionStart, ReplayBuffer::kNone, static_cast<int>(i), -1);
  ASSIGN_OR_RETURN(MicroBatch * mb, Batch(actions_[i].micro_batch));
  RETURN_IF_ERROR(PrefetchAfter(i));
  return mb;
}

absl::Status PipelineExecutor::Forward(size_t i) {
  const Action& a = actions_[i];
  const int m = a.micro_batch, c = a.chunk, k = key(a);
  const int at = static_cast<int>(i);
  Stage& st = *io_.stage;
  Stream& s = *io_.stream;
  const std::string on = On(a, schedule_.chunks);
  int received = -1;
  ASSIGN_OR_RETURN(MicroBatch * mb,
                   Start(i, act_ready_, "an activation from the previous stage", &received));
  RETURN_IF_ERROR(InputPrefetcher::WaitFor(s, *mb));
  RETURN_IF_ERROR(io_.timeline->Mark(kInput, absl::StrCat("input ", on), m));
  Tensor y;
  RETURN_IF_ERROR(st.Forward(s, m, *mb, act_in_[k], &y, c));
  Log(ReplayKind::kAcquire, ReplayBuffer::kActivations, at, -1);
  act_in_.erase(k);
  if (received >= 0) Log(ReplayKind::kRelease, ReplayBuffer::kReceived, at, received);
  if (st.chunk_is_last(c)) {
    RETURN_IF_ERROR(AccumulateLoss(s, io_.loss_sum, y, scratch_));
  } else {
    outputs_[k] = y;
  }
  Log(ReplayKind::kActionEnd, ReplayBuffer::kNone, at, -1);
  return io_.timeline->Mark(kCompute, absl::StrCat("forward ", on), m);
}

absl::Status PipelineExecutor::Backward(size_t i) {
  const Action& a = actions_[i];
  const int m = a.micro_batch, c = a.chunk, k = key(a);
  const int at = static_cast<int>(i);
  Stage& st = *io_.stage;
  Stream& s = *io_.stream;
  int received = -1;
  ASSIGN_OR_RETURN(MicroBatch * mb,
                   Start(i, grad_ready_, "a gradient from the next stage", &received));
  Tensor dx;
  if (split_[k]) {
    // The input gradient (and the LayerNorms' and head's gradients); what the W reads stays
    // with the stage (and the micro-batch's tokens here) until it runs.
    RETURN_IF_ERROR(st.BackwardInput(s, m, *mb, grad_in_[k], &dx, c));
  } else {
    RETURN_IF_ERROR(st.Backward(s, m, *mb, grad_in_[k], &dx, GradientsReady(i), c));
  }
  Log(ReplayKind::kRelease, ReplayBuffer::kActivations, at, -1);
  if (split_[k]) Log(ReplayKind::kAcquire, ReplayBuffer::kStash, at, -1);
  grad_in_.erase(k);
  if (received >= 0) Log(ReplayKind::kRelease, ReplayBuffer::kReceived, at, received);
  if (!st.chunk_is_first(c)) input_grads_[k] = dx;
  Log(ReplayKind::kActionEnd, ReplayBuffer::kNone, at, -1);
  return io_.timeline->Mark(kCompute, absl::StrCat("backward ", On(a, schedule_.chunks)), m);
}

absl::Status PipelineExecutor::WeightGradient(size_t i) {
  const Action& a = actions_[i];
  const int at = static_cast<int>(i);
  Log(ReplayKind::kActionStart, ReplayBuffer::kNone, at, -1);
  ASSIGN_OR_RETURN(MicroBatch * mb, Batch(a.micro_batch));
  RETURN_IF_ERROR(io_.stage->BackwardWeights(*io_.stream, a.micro_batch, *mb, GradientsReady(i),
                                             a.chunk));
  Log(ReplayKind::kRelease, ReplayBuffer::kStash, at, -1);
  Log(ReplayKind::kActionEnd, ReplayBuffer::kNone, at, -1);
  return io_.timeline->Mark(kCompute,
                            absl::StrCat("backward weights ", On(a, schedule_.chunks)),
                            a.micro_batch);
}

absl::Status PipelineExecutor::Run() {
  if (io_.stage->is_last()) {  // the last stage sums its losses here
    ASSIGN_OR_RETURN(scratch_, Tensor::Empty({1}, DType::kF32, io_.stage->device()));
  }
  size_t next_group = 0;
  for (size_t i = 0; i < actions_.size();) {
    const Action& a = actions_[i];
    if (a.is_communication()) {
      // Every group of this run of transfers, then on to the next compute action.
      while (i < actions_.size() && actions_[i].is_communication()) ++i;
      while (next_group < groups_.size() && groups_[next_group].front() < static_cast<int>(i)) {
        RETURN_IF_ERROR(IssueGroup(next_group++));
      }
      continue;
    }
    switch (a.type) {
      case ActionType::kForward: RETURN_IF_ERROR(Forward(i)); break;
      case ActionType::kBackward: RETURN_IF_ERROR(Backward(i)); break;
      case ActionType::kWeightGradient: RETURN_IF_ERROR(WeightGradient(i)); break;
      default: break;  // the optimizer step is the trainer's
    }
    if (a.is_compute()) {
      computed_.push_back(a);
      if (i == last_use_[a.micro_batch]) batches_.erase(a.micro_batch);
    }
    ++i;
  }
  // Every transfer finished before the step's end on the stream: waiting for a neighbour's
  // last gradient or for the sends to be taken is the pipeline's bubble too.
  RETURN_IF_ERROR(WaitThrough(works_.size(), nullptr));
  return io_.timeline->Mark(kBubble, "wait for transfers");
}

}  // namespace tandem
