#include "parallel/stage_replay.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {

std::string ReplayEventText(const ReplayEvent& e) {
  static const char* kKinds[] = {"posted", "done", "start", "end", "acquire", "release"};
  static const char* kBuffers[] = {"", "received", "sent", "activations", "stash"};
  std::string s = kKinds[static_cast<int>(e.kind)];
  if (e.buffer != ReplayBuffer::kNone) {
    absl::StrAppendFormat(&s, " %s %dc%d", kBuffers[static_cast<int>(e.buffer)], e.micro_batch,
                          e.chunk);
  }
  if (e.action >= 0) absl::StrAppend(&s, " (action ", e.action, ")");
  if (e.group >= 0) absl::StrAppend(&s, " (group ", e.group, ")");
  return s;
}

std::vector<ReplayEvent> ReplayStage(const PipelineSchedule& s,
                                     const std::vector<std::vector<int>>& groups, int stage) {
  const std::vector<Action>& actions = s.actions[stage];
  const std::vector<bool> deferred = DeferredWeights(s, stage);
  const int M = s.micro_batches;
  std::vector<ReplayEvent> out;
  auto buffer_event = [&](ReplayKind kind, ReplayBuffer b, const Action& a, int action,
                          int group) {
    out.push_back({kind, b, action, group, a.chunk, a.micro_batch});
  };
  // The group each receive is in, by (gradient?, chunk * M + micro-batch).
  std::map<std::pair<bool, int>, int> received_in;
  size_t posted = 0, waited = 0;  // groups [0, posted) issued, [0, waited) done
  auto done_through = [&](size_t last) {
    for (; waited <= last && waited < posted; ++waited) {
      for (int i : groups[waited]) {
        if (actions[i].type == ActionType::kSendActivation ||
            actions[i].type == ActionType::kSendGradient) {
          buffer_event(ReplayKind::kRelease, ReplayBuffer::kSent, actions[i], i,
                       static_cast<int>(waited));
        }
      }
      out.push_back({ReplayKind::kGroupDone, ReplayBuffer::kNone, -1, static_cast<int>(waited)});
    }
  };
  for (size_t i = 0; i < actions.size();) {
    const Action& a = actions[i];
    if (a.is_communication()) {
      while (i < actions.size() && actions[i].is_communication()) ++i;
      for (; posted < groups.size() && groups[posted].front() < static_cast<int>(i); ++posted) {
        const int g = static_cast<int>(posted);
        for (int k : groups[posted]) {
          const Action& t = actions[k];
          const bool receive = t.type == ActionType::kRecvActivation ||
                               t.type == ActionType::kRecvGradient;
          if (receive) {
            received_in[{t.type == ActionType::kRecvGradient, t.chunk * M + t.micro_batch}] = g;
          }
          buffer_event(ReplayKind::kAcquire, receive ? ReplayBuffer::kReceived : ReplayBuffer::kSent,
                       t, k, g);
        }
        out.push_back({ReplayKind::kGroupPosted, ReplayBuffer::kNone, -1, g});
      }
      continue;
    }
    if (!a.is_compute()) {  // the optimizer step: the trainer's
      ++i;
      continue;
    }
    const int at = static_cast<int>(i);
    const int key = a.chunk * M + a.micro_batch;
    int received = -1;  // the group of the receive the action reads
    if (a.type != ActionType::kWeightGradient) {
      const auto r = received_in.find({a.type == ActionType::kBackward, key});
      if (r != received_in.end()) {
        received = r->second;
        received_in.erase(r);
        done_through(received);
      }
    }
    out.push_back({ReplayKind::kActionStart, ReplayBuffer::kNone, at});
    if (a.type == ActionType::kForward) {
      buffer_event(ReplayKind::kAcquire, ReplayBuffer::kActivations, a, at, -1);
    } else if (a.type == ActionType::kBackward) {
      buffer_event(ReplayKind::kRelease, ReplayBuffer::kActivations, a, at, -1);
      if (deferred[key]) buffer_event(ReplayKind::kAcquire, ReplayBuffer::kStash, a, at, -1);
    } else {
      buffer_event(ReplayKind::kRelease, ReplayBuffer::kStash, a, at, -1);
    }
    if (received >= 0) buffer_event(ReplayKind::kRelease, ReplayBuffer::kReceived, a, at, received);
    out.push_back({ReplayKind::kActionEnd, ReplayBuffer::kNone, at});
    ++i;
  }
  if (posted > 0) done_through(posted - 1);
  return out;
}

}  // namespace tandem
