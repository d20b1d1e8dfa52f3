#include "parallel/schedule.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"

namespace tandem {
namespace {

const char* Code(ActionType t) {
  switch (t) {
    case ActionType::kForward: return "F";
    case ActionType::kBackward: return "B";
    case ActionType::kSendActivation: return "SA";
    case ActionType::kRecvActivation: return "RA";
    case ActionType::kSendGradient: return "SG";
    case ActionType::kRecvGradient: return "RG";
    case ActionType::kOptimizerStep: return "OPT";
  }
  return "?";
}

Action F(int m) { return {ActionType::kForward, m}; }
Action B(int m) { return {ActionType::kBackward, m}; }

}  // namespace

std::string ActionText(int stage, const Action& a) {
  if (a.type == ActionType::kOptimizerStep) return absl::StrCat(stage, "OPT");
  return absl::StrCat(stage, Code(a.type), a.micro_batch);
}

absl::StatusOr<Action> ParseAction(absl::string_view text, int* stage) {
  size_t i = 0;
  while (i < text.size() && absl::ascii_isdigit(text[i])) ++i;
  size_t j = i;
  while (j < text.size() && absl::ascii_isalpha(text[j])) ++j;
  int mb = -1;
  const absl::string_view code = text.substr(i, j - i);
  if (i == 0 || !absl::SimpleAtoi(text.substr(0, i), stage) ||
      (code != "OPT" && (j == text.size() || !absl::SimpleAtoi(text.substr(j), &mb))) ||
      (code == "OPT" && j != text.size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad action '%s': use STAGE TYPE MICROBATCH like 1F0 or 0SA3, or 2OPT", text));
  }
  for (ActionType t : {ActionType::kForward, ActionType::kBackward, ActionType::kSendActivation,
                       ActionType::kRecvActivation, ActionType::kSendGradient,
                       ActionType::kRecvGradient, ActionType::kOptimizerStep}) {
    if (code == Code(t)) return Action{t, mb};
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "bad action '%s': the type is one of F, B, SA, RA, SG, RG, OPT", text));
}

PipelineSchedule GpipeSchedule(int stages, int micro_batches) {
  PipelineSchedule s{stages, micro_batches, std::vector<std::vector<Action>>(stages)};
  for (int st = 0; st < stages; ++st) {
    for (int m = 0; m < micro_batches; ++m) s.actions[st].push_back(F(m));
    for (int m = micro_batches - 1; m >= 0; --m) s.actions[st].push_back(B(m));
  }
  return s;
}

PipelineSchedule OneFOneBSchedule(int stages, int micro_batches) {
  PipelineSchedule s{stages, micro_batches, std::vector<std::vector<Action>>(stages)};
  for (int st = 0; st < stages; ++st) {
    const int warmup = std::min(stages - st - 1, micro_batches);
    std::vector<Action>& a = s.actions[st];
    int f = 0, b = 0;
    for (; f < warmup; ++f) a.push_back(F(f));
    while (f < micro_batches) {  // steady state: one forward, one backward
      a.push_back(F(f++));
      a.push_back(B(b++));
    }
    while (b < micro_batches) a.push_back(B(b++));  // cool-down
  }
  return s;
}

PipelineSchedule InsertCommunication(const PipelineSchedule& compute) {
  PipelineSchedule s{compute.stages, compute.micro_batches,
                     std::vector<std::vector<Action>>(compute.stages)};
  const int last = compute.stages - 1;
  for (int st = 0; st < compute.stages; ++st) {
    std::vector<Action>& out = s.actions[st];
    for (const Action& a : compute.actions[st]) {
      if (a.type == ActionType::kForward) {
        if (st > 0) out.push_back({ActionType::kRecvActivation, a.micro_batch});
        out.push_back(a);
        if (st < last) out.push_back({ActionType::kSendActivation, a.micro_batch});
      } else if (a.type == ActionType::kBackward) {
        if (st < last) out.push_back({ActionType::kRecvGradient, a.micro_batch});
        out.push_back(a);
        if (st > 0) out.push_back({ActionType::kSendGradient, a.micro_batch});
      } else if (a.type != ActionType::kOptimizerStep) {
        out.push_back(a);
      }
    }
    out.push_back({ActionType::kOptimizerStep, -1});
  }
  return s;
}

absl::StatusOr<PipelineSchedule> MakeSchedule(absl::string_view name, int stages,
                                              int micro_batches) {
  if (stages < 1 || micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a pipeline needs at least 1 stage and 1 micro-batch (got %d and %d)", stages,
        micro_batches));
  }
  if (name == "gpipe") return InsertCommunication(GpipeSchedule(stages, micro_batches));
  if (name == "1f1b") return InsertCommunication(OneFOneBSchedule(stages, micro_batches));
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown schedule '%s': use gpipe or 1f1b", name));
}

std::string ScheduleGrid(const PipelineSchedule& s, const std::vector<int>& marks) {
  size_t rows = 0;
  for (const auto& a : s.actions) rows = std::max(rows, a.size());
  std::string out = "step";
  for (int st = 0; st < s.stages; ++st) out += absl::StrFormat(" | %-7s", absl::StrCat("stage ", st));
  out += "\n";
  for (size_t r = 0; r < rows; ++r) {
    out += absl::StrFormat("%4d", r);
    std::string note;
    for (int st = 0; st < s.stages; ++st) {
      const bool has = r < s.actions[st].size();
      out += absl::StrFormat(" | %-7s", has ? ActionText(st, s.actions[st][r]) : "");
      if (st < static_cast<int>(marks.size()) && marks[st] == static_cast<int>(r)) {
        note += absl::StrCat(" <-- ERROR HERE (stage ", st, ")");
      }
    }
    out += note + "\n";
  }
  return out;
}

absl::Status ValidateSchedule(const PipelineSchedule& s) {
  auto fail = [&](const std::string& why, const std::vector<int>& marks) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid pipeline schedule: ", why, "\n", ScheduleGrid(s, marks)));
  };
  const int S = s.stages, M = s.micro_batches;
  if (static_cast<int>(s.actions.size()) != S) return fail("wrong number of stages", {});
  // Static checks: counts, order of forward and backward, the optimizer step last.
  for (int st = 0; st < S; ++st) {
    std::vector<int> fwd(M, -1), bwd(M, -1);
    const auto& a = s.actions[st];
    std::vector<int> mark(S, -1);
    for (size_t i = 0; i < a.size(); ++i) {
      mark[st] = static_cast<int>(i);
      const Action& x = a[i];
      if (x.type == ActionType::kOptimizerStep) {
        if (i + 1 != a.size()) return fail(absl::StrFormat("stage %d: the optimizer step is not last", st), mark);
        continue;
      }
      if (x.micro_batch < 0 || x.micro_batch >= M) {
        return fail(absl::StrFormat("stage %d: micro-batch %d out of range [0, %d)", st, x.micro_batch, M), mark);
      }
      const bool first = st == 0, last = st == S - 1;
      if ((first && x.type == ActionType::kRecvActivation) || (last && x.type == ActionType::kSendActivation) ||
          (last && x.type == ActionType::kRecvGradient) || (first && x.type == ActionType::kSendGradient)) {
        return fail(absl::StrFormat("stage %d has no neighbour for %s", st, ActionText(st, x)), mark);
      }
      if (x.type == ActionType::kForward) {
        if (fwd[x.micro_batch] >= 0) return fail(absl::StrFormat("stage %d: forward of micro-batch %d twice", st, x.micro_batch), mark);
        fwd[x.micro_batch] = static_cast<int>(i);
      }
      if (x.type == ActionType::kBackward) {
        if (fwd[x.micro_batch] < 0) return fail(absl::StrFormat("stage %d: backward of micro-batch %d before its forward", st, x.micro_batch), mark);
        if (bwd[x.micro_batch] >= 0) return fail(absl::StrFormat("stage %d: backward of micro-batch %d twice", st, x.micro_batch), mark);
        bwd[x.micro_batch] = static_cast<int>(i);
      }
    }
    for (int m = 0; m < M; ++m) {
      if (fwd[m] < 0 || bwd[m] < 0) {
        return fail(absl::StrFormat("stage %d never runs the %s of micro-batch %d", st,
                                    fwd[m] < 0 ? "forward" : "backward", m), {});
      }
    }
    if (a.empty() || a.back().type != ActionType::kOptimizerStep) {
      return fail(absl::StrFormat("stage %d has no optimizer step", st), {});
    }
  }
  // Simulation. Links: (from, to, is_gradient). Counters of posted sends/receives per link.
  struct Link { std::vector<int> sent, recv; };  // micro-batches in posting order
  std::map<std::tuple<int, int, bool>, Link> links;
  std::vector<size_t> pc(S, 0);
  std::vector<std::vector<bool>> have_act(S, std::vector<bool>(M, false));
  std::vector<std::vector<bool>> have_grad(S, std::vector<bool>(M, false));
  std::vector<std::vector<bool>> fwd_done(S, std::vector<bool>(M, false));
  // Group posted by each stage: [pc, end) of communication actions, and for each transfer
  // its index on its link.
  std::vector<size_t> group_end(S, 0);
  std::vector<std::vector<int>> group_index(S);
  auto link_of = [&](int st, const Action& a) {
    switch (a.type) {
      case ActionType::kSendActivation: return std::make_tuple(st, st + 1, false);
      case ActionType::kRecvActivation: return std::make_tuple(st - 1, st, false);
      case ActionType::kSendGradient: return std::make_tuple(st, st - 1, true);
      default: return std::make_tuple(st + 1, st, true);  // kRecvGradient
    }
  };
  auto is_send = [](const Action& a) {
    return a.type == ActionType::kSendActivation || a.type == ActionType::kSendGradient;
  };
  for (;;) {
    bool progress = false, done = true;
    for (int st = 0; st < S; ++st) {
      const auto& a = s.actions[st];
      if (pc[st] >= a.size()) continue;
      done = false;
      const Action& x = a[pc[st]];
      if (x.is_communication()) {
        if (group_end[st] > pc[st]) continue;  // already posted
        size_t e = pc[st];
        group_index[st].clear();
        while (e < a.size() && a[e].is_communication()) {
          Link& l = links[link_of(st, a[e])];
          std::vector<int>& side = is_send(a[e]) ? l.sent : l.recv;
          group_index[st].push_back(static_cast<int>(side.size()));
          side.push_back(a[e].micro_batch);
          ++e;
        }
        group_end[st] = e;
        progress = true;
        continue;
      }
      const int m = x.micro_batch;
      bool ready = true;
      if (x.type == ActionType::kForward) ready = st == 0 || have_act[st][m];
      if (x.type == ActionType::kBackward) ready = fwd_done[st][m] && (st == S - 1 || have_grad[st][m]);
      if (!ready) continue;
      if (x.type == ActionType::kForward) fwd_done[st][m] = true;
      ++pc[st];
      progress = true;
    }
    // Complete every posted group whose transfers all have their peer posted.
    for (int st = 0; st < S; ++st) {
      if (group_end[st] <= pc[st]) continue;
      const auto& a = s.actions[st];
      bool all = true;
      for (size_t i = pc[st]; i < group_end[st]; ++i) {
        const Link& l = links[link_of(st, a[i])];
        const int k = group_index[st][i - pc[st]];
        const std::vector<int>& other = is_send(a[i]) ? l.recv : l.sent;
        if (k >= static_cast<int>(other.size())) {
          all = false;
          continue;
        }
        if (other[k] != a[i].micro_batch) {
          std::vector<int> mark(S, -1);
          mark[st] = static_cast<int>(i);
          return fail(absl::StrFormat("%s is matched with micro-batch %d on the other side (transfers on a link match in order)",
                                      ActionText(st, a[i]), other[k]), mark);
        }
      }
      if (!all) continue;
      for (size_t i = pc[st]; i < group_end[st]; ++i) {
        if (a[i].type == ActionType::kRecvActivation) have_act[st][a[i].micro_batch] = true;
        if (a[i].type == ActionType::kRecvGradient) have_grad[st][a[i].micro_batch] = true;
      }
      pc[st] = group_end[st];
      progress = true;
    }
    if (done) return absl::OkStatus();
    if (!progress) {
      std::vector<int> mark(S, -1);
      for (int st = 0; st < S; ++st) {
        if (pc[st] < s.actions[st].size()) mark[st] = static_cast<int>(pc[st]);
      }
      return fail("deadlock: no stage can make progress", mark);
    }
  }
}

int PeakInFlight(const PipelineSchedule& s, int stage) {
  int now = 0, peak = 0;
  for (const Action& a : s.actions[stage]) {
    if (a.type == ActionType::kForward) peak = std::max(peak, ++now);
    if (a.type == ActionType::kBackward) --now;
  }
  return peak;
}

}  // namespace tandem
