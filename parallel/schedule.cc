#include "parallel/schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "parallel/stage_replay.h"

namespace tandem {
namespace {

const char* Code(ActionType t) {
  switch (t) {
    case ActionType::kForward: return "F";
    case ActionType::kBackward: return "B";
    case ActionType::kWeightGradient: return "W";
    case ActionType::kSendActivation: return "SA";
    case ActionType::kRecvActivation: return "RA";
    case ActionType::kSendGradient: return "SG";
    case ActionType::kRecvGradient: return "RG";
    case ActionType::kOptimizerStep: return "OPT";
  }
  return "?";
}

Action F(int m, int chunk = 0) { return {ActionType::kForward, m, chunk}; }
Action B(int m, int chunk = 0) { return {ActionType::kBackward, m, chunk}; }
Action W(int m) { return {ActionType::kWeightGradient, m}; }

}  // namespace

StagePlace PlaceStage(int global_stage, int ranks) {
  return {global_stage % ranks, global_stage / ranks};
}

int GlobalStage(int stage, int chunk, int ranks) { return chunk * ranks + stage; }

std::string ActionText(int stage, const Action& a) {
  if (a.type == ActionType::kOptimizerStep) return absl::StrCat(stage, "OPT");
  std::string text = absl::StrCat(stage, Code(a.type), a.micro_batch);
  if (a.chunk != 0) absl::StrAppend(&text, "c", a.chunk);
  return text;
}

absl::StatusOr<Action> ParseAction(absl::string_view text, int* stage) {
  // The end of the run of characters from `from` that `is` accepts.
  auto span = [&](size_t from, bool (*is)(unsigned char)) {
    while (from < text.size() && is(static_cast<unsigned char>(text[from]))) ++from;
    return from;
  };
  const size_t i = span(0, absl::ascii_isdigit);  // STAGE: text[0, i)
  const size_t j = span(i, absl::ascii_isalpha);  // TYPE: text[i, j)
  const size_t k = span(j, absl::ascii_isdigit);  // MICROBATCH: text[j, k)
  const absl::string_view code = text.substr(i, j - i);
  int mb = -1, chunk = 0;
  bool ok = i > 0 && absl::SimpleAtoi(text.substr(0, i), stage);
  if (code == "OPT") {
    ok = ok && j == text.size();
  } else {
    ok = ok && absl::SimpleAtoi(text.substr(j, k - j), &mb);
    // [c CHUNK]
    if (k < text.size()) {
      ok = ok && text[k] == 'c' && span(k + 1, absl::ascii_isdigit) == text.size() &&
           absl::SimpleAtoi(text.substr(k + 1), &chunk);
    }
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bad action '%s': use STAGE TYPE MICROBATCH [c CHUNK] like 1F0, 0SA3 or 1B3c1, or 2OPT",
        text));
  }
  for (ActionType t : {ActionType::kForward, ActionType::kBackward,
                       ActionType::kWeightGradient, ActionType::kSendActivation,
                       ActionType::kRecvActivation, ActionType::kSendGradient,
                       ActionType::kRecvGradient, ActionType::kOptimizerStep}) {
    if (code == Code(t)) return Action{t, mb, chunk};
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "bad action '%s': the type is one of F, B, W, SA, RA, SG, RG, OPT", text));
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

PipelineSchedule ZeroBubbleH1Schedule(int stages, int micro_batches) {
  PipelineSchedule s{stages, micro_batches, std::vector<std::vector<Action>>(stages)};
  for (int st = 0; st < stages; ++st) {
    std::vector<Action>& a = s.actions[st];
    int f = 0, b = 0, w = 0;
    // The first stage runs whole backwards; the others keep `st` Ws pending.
    auto weight = [&] {
      if (st > 0) a.push_back(W(w++));
    };
    for (int i = 0; i < stages - st - 1 && f < micro_batches; ++i) a.push_back(F(f++));
    for (int i = 0; i < st && f < micro_batches; ++i) {  // Ws deferred
      a.push_back(F(f++));
      a.push_back(B(b++));
    }
    while (f < micro_batches) {  // steady state: one forward, one backward, one W
      a.push_back(F(f++));
      a.push_back(B(b++));
      weight();
    }
    while (b < micro_batches) {  // cool-down
      a.push_back(B(b++));
      weight();
    }
    while (st > 0 && w < micro_batches) weight();  // the deferred Ws fill the end
  }
  return s;
}

namespace {

// Interleaved 1F1B's warm-up forwards on stage `st` (Megatron's): 2(K - st - 1) + (v - 1)K, or
// every forward when M = K.
int InterleavedWarmup(int stages, int chunks, int micro_batches, int st) {
  const int total = micro_batches * chunks;
  if (micro_batches == stages) return total;
  return std::min(total, 2 * (stages - st - 1) + (chunks - 1) * stages);
}

}  // namespace

PipelineSchedule InterleavedSchedule(int stages, int chunks, int micro_batches) {
  PipelineSchedule s{stages, micro_batches, std::vector<std::vector<Action>>(stages), chunks};
  const int K = stages, v = chunks, total = micro_batches * chunks;
  // The k-th forward (or backward) of a stage, as Megatron's get_model_chunk_id: runs of K
  // micro-batches go through the chunks in turn, forwards from the first chunk, backwards
  // from the last.
  auto nth = [&](int k, bool forward) {
    const int group = k % (K * v), chunk = group / K;
    return Action{forward ? ActionType::kForward : ActionType::kBackward,
                  k / (K * v) * K + group % K, forward ? chunk : v - 1 - chunk};
  };
  for (int st = 0; st < stages; ++st) {
    std::vector<Action>& a = s.actions[st];
    const int warmup = InterleavedWarmup(K, v, micro_batches, st);
    int f = 0, b = 0;
    for (; f < warmup; ++f) a.push_back(nth(f, true));
    while (f < total) {  // steady state: one forward, one backward
      a.push_back(nth(f++, true));
      a.push_back(nth(b++, false));
    }
    while (b < total) a.push_back(nth(b++, false));  // cool-down
  }
  return s;
}

PipelineSchedule InsertCommunication(const PipelineSchedule& compute) {
  const int K = compute.stages;
  PipelineSchedule s{K, compute.micro_batches, std::vector<std::vector<Action>>(K),
                     compute.chunks};
  const int last = K * compute.chunks - 1;  // the last global stage
  for (int st = 0; st < K; ++st) {
    std::vector<Action>& out = s.actions[st];
    // A receive goes before the weight gradients just before its compute action, so that it
    // joins the transfers before them in one run (the Ws then run while it arrives).
    auto receive = [&](ActionType type, int m, int chunk) {
      auto at = out.end();
      while (at != out.begin() && (at - 1)->type == ActionType::kWeightGradient) --at;
      out.insert(at, Action{type, m, chunk});
    };
    for (const Action& a : compute.actions[st]) {
      const int g = GlobalStage(st, a.chunk, K);
      const int m = a.micro_batch;
      if (a.type == ActionType::kForward) {
        if (g > 0) receive(ActionType::kRecvActivation, m, a.chunk);
        out.push_back(a);
        if (g < last) out.push_back({ActionType::kSendActivation, m, a.chunk});
      } else if (a.type == ActionType::kBackward) {
        if (g < last) receive(ActionType::kRecvGradient, m, a.chunk);
        out.push_back(a);
        if (g > 0) out.push_back({ActionType::kSendGradient, m, a.chunk});
      } else if (a.type != ActionType::kOptimizerStep) {
        out.push_back(a);
      }
    }
    out.push_back({ActionType::kOptimizerStep, -1});
  }
  return s;
}

namespace {

// Interleaved 1F1B's transfers, placed as Megatron's batched exchanges are: a stage receives
// its first forward's input before it starts; after each warm-up forward it sends that
// forward's output and receives the next forward's input (after the last warm-up forward
// also the first backward's gradient); after each steady-state forward and backward pair it
// sends both results and receives the next pair's inputs; after each cool-down backward it
// sends its result and receives the next backward's gradient. Both neighbours then post each
// link's transfers in runs that pair up, in both directions at once (with 2 stages, one
// neighbour is both).
PipelineSchedule InterleavedExchanges(const PipelineSchedule& compute) {
  const int K = compute.stages, last = K * compute.chunks - 1;
  PipelineSchedule s{K, compute.micro_batches, std::vector<std::vector<Action>>(K),
                     compute.chunks};
  for (int st = 0; st < K; ++st) {
    const std::vector<Action>& in = compute.actions[st];
    std::vector<Action> fwd, bwd;  // in order
    for (const Action& a : in) (a.type == ActionType::kForward ? fwd : bwd).push_back(a);
    std::vector<Action>& out = s.actions[st];
    auto global = [&](const Action& a) { return GlobalStage(st, a.chunk, K); };
    auto send = [&](const Action& a) {
      if (a.type == ActionType::kForward && global(a) < last) {
        out.push_back({ActionType::kSendActivation, a.micro_batch, a.chunk});
      }
      if (a.type == ActionType::kBackward && global(a) > 0) {
        out.push_back({ActionType::kSendGradient, a.micro_batch, a.chunk});
      }
    };
    auto receive_for = [&](const std::vector<Action>& list, size_t k) {
      if (k >= list.size()) return;
      const Action& a = list[k];
      if (a.type == ActionType::kForward && global(a) > 0) {
        out.push_back({ActionType::kRecvActivation, a.micro_batch, a.chunk});
      }
      if (a.type == ActionType::kBackward && global(a) < last) {
        out.push_back({ActionType::kRecvGradient, a.micro_batch, a.chunk});
      }
    };
    // The compute order is warm-up forwards, then forward-backward pairs, then backwards.
    const size_t warmup = static_cast<size_t>(
        InterleavedWarmup(K, compute.chunks, compute.micro_batches, st));
    size_t f = 0, b = 0;
    receive_for(fwd, 0);
    for (; f < warmup; ++f) {
      out.push_back(fwd[f]);
      send(fwd[f]);
      receive_for(fwd, f + 1);
      if (f + 1 == warmup) receive_for(bwd, 0);
    }
    for (; f < fwd.size(); ++f, ++b) {
      out.push_back(fwd[f]);
      out.push_back(bwd[b]);
      send(fwd[f]);
      send(bwd[b]);
      receive_for(fwd, f + 1);
      receive_for(bwd, b + 1);
    }
    for (; b < bwd.size(); ++b) {
      out.push_back(bwd[b]);
      send(bwd[b]);
      receive_for(bwd, b + 1);
    }
    out.push_back({ActionType::kOptimizerStep, -1});
  }
  return s;
}

}  // namespace

absl::StatusOr<PipelineSchedule> MakeSchedule(absl::string_view name, int stages,
                                              int micro_batches, int chunks) {
  if (stages < 1 || micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a pipeline needs at least 1 stage and 1 micro-batch (got %d and %d)", stages,
        micro_batches));
  }
  if (name != "interleaved" && chunks != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d virtual stages need --schedule=interleaved; '%s' runs one model chunk a stage",
        chunks, name));
  }
  auto finish = [](const PipelineSchedule& compute) {
    return HoistReceives(InsertCommunication(compute));
  };
  if (name == "gpipe") return finish(GpipeSchedule(stages, micro_batches));
  if (name == "1f1b") return finish(OneFOneBSchedule(stages, micro_batches));
  if (name == "zb-h1") return finish(ZeroBubbleH1Schedule(stages, micro_batches));
  if (name == "interleaved") {
    if (chunks < 2 || stages < 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the interleaved schedule needs 2 stages or more and --virtual-stages of 2 or more "
          "(got %d stages, %d virtual stages); one chunk a stage is --schedule=1f1b",
          stages, chunks));
    }
    if (micro_batches % stages != 0) {
      const int below = micro_batches / stages * stages;
      return absl::InvalidArgumentError(absl::StrFormat(
          "the interleaved schedule takes micro-batches in runs of one per stage: "
          "--micro-batches=%d is not a multiple of the %d stages; use %s%d",
          micro_batches, stages, below > 0 ? absl::StrCat(below, " or ") : "",
          below + stages));
    }
    return HoistReceives(InterleavedExchanges(InterleavedSchedule(stages, chunks, micro_batches)));
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown schedule '%s': use gpipe, 1f1b, zb-h1 or interleaved", name));
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

namespace {

// (from, to, is_gradient) of a transfer on stage st, from and to as global stages.
std::tuple<int, int, bool> LinkOf(const PipelineSchedule& s, int st, const Action& a) {
  const int g = GlobalStage(st, a.chunk, s.stages);
  switch (a.type) {
    case ActionType::kSendActivation:
      return std::make_tuple(g, g + 1, false);
    case ActionType::kRecvActivation:
      return std::make_tuple(g - 1, g, false);
    case ActionType::kSendGradient:
      return std::make_tuple(g, g - 1, true);
    default:
      return std::make_tuple(g + 1, g, true);  // kRecvGradient
  }
}

// The global stage on the other end of a transfer on stage st; -1 past either end.
int PeerGlobalStage(const PipelineSchedule& s, int st, const Action& a) {
  const auto [from, to, gradient] = LinkOf(s, st, a);
  const int peer = from == GlobalStage(st, a.chunk, s.stages) ? to : from;
  return peer >= 0 && peer < s.stages * s.chunks ? peer : -1;
}

// The stage on the other end of a transfer on stage st; -1 past either end.
int PeerOf(const PipelineSchedule& s, int st, const Action& a) {
  const int peer = PeerGlobalStage(s, st, a);
  return peer < 0 ? -1 : PlaceStage(peer, s.stages).stage;
}

bool IsSend(const Action& a) {
  return a.type == ActionType::kSendActivation || a.type == ActionType::kSendGradient;
}

// The index, on the peer stage, of the transfer matching action i of stage st; -1 if none.
int Counterpart(const PipelineSchedule& s, int st, int i) {
  const Action& x = s.actions[st][i];
  const int peer_global = PeerGlobalStage(s, st, x);
  if (peer_global < 0) return -1;
  const StagePlace peer = PlaceStage(peer_global, s.stages);
  ActionType want;
  switch (x.type) {
    case ActionType::kSendActivation:
      want = ActionType::kRecvActivation;
      break;
    case ActionType::kRecvActivation:
      want = ActionType::kSendActivation;
      break;
    case ActionType::kSendGradient:
      want = ActionType::kRecvGradient;
      break;
    default:
      want = ActionType::kSendGradient;
      break;
  }
  const auto& a = s.actions[peer.stage];
  for (size_t j = 0; j < a.size(); ++j) {
    if (a[j] == Action{want, x.micro_batch, peer.chunk}) return static_cast<int>(j);
  }
  return -1;
}

}  // namespace

std::vector<std::vector<std::vector<int>>> ExchangeGroups(const PipelineSchedule& s) {
  const int S = static_cast<int>(s.actions.size());
  // Each communication action's run (consecutive communication actions), per stage.
  std::vector<std::vector<int>> run(S);
  for (int st = 0; st < S; ++st) {
    int r = -1;
    bool in_run = false;
    for (const Action& a : s.actions[st]) {
      if (a.is_communication() && !in_run) ++r;
      in_run = a.is_communication();
      run[st].push_back(in_run ? r : -1);
    }
  }
  std::vector<std::vector<std::vector<int>>> groups(S);
  for (int st = 0; st < S; ++st) {
    const auto& a = s.actions[st];
    for (size_t i = 0; i < a.size();) {
      if (!a[i].is_communication()) {
        ++i;
        continue;
      }
      // With several chunks a stage, the whole run is one group (Megatron's batched
      // exchanges), whichever peers it talks to.
      if (s.chunks > 1) {
        groups[st].emplace_back();
        for (; i < a.size() && a[i].is_communication(); ++i) {
          groups[st].back().push_back(static_cast<int>(i));
        }
        continue;
      }
      // This run, split by (peer, the peer's run of the counterpart).
      std::vector<std::pair<int, int>> keys;
      std::vector<std::vector<int>> split;
      for (; i < a.size() && a[i].is_communication(); ++i) {
        const int peer = PeerOf(s, st, a[i]);
        const int j = Counterpart(s, st, static_cast<int>(i));
        const std::pair<int, int> key =
            j < 0 ? std::make_pair(-1, static_cast<int>(i)) : std::make_pair(peer, run[peer][j]);
        size_t k = 0;
        while (k < keys.size() && keys[k] != key) ++k;
        if (k == keys.size()) {
          keys.push_back(key);
          split.emplace_back();
        }
        split[k].push_back(static_cast<int>(i));
      }
      for (auto& g : split) groups[st].push_back(std::move(g));
    }
  }
  return groups;
}

absl::Status ValidateSchedule(const PipelineSchedule& s) {
  return SimulateSchedule(s, ScheduleDurations{}).status();
}

namespace {

// An invalid schedule's error: why, and the grid with each stage's mark.
absl::Status Invalid(const PipelineSchedule& s, const std::string& why,
                     const std::vector<int>& marks) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid pipeline schedule: ", why, "\n", ScheduleGrid(s, marks)));
}

// The durations fit the schedule: [stages][chunks] (or none), per-action rows no longer than
// their stage's actions, nothing negative; and several chunks only on 2 stages or more.
absl::Status CheckShape(const PipelineSchedule& s, const ScheduleDurations& d) {
  const int S = s.stages, V = s.chunks;
  if (static_cast<int>(s.actions.size()) != S) return Invalid(s, "wrong number of stages", {});
  if (V < 1) return Invalid(s, absl::StrFormat("%d chunks per stage: at least 1", V), {});
  bool durations_ok = d.transfer >= 0 && d.handover >= 0 &&
                      (d.per_stage.empty() || static_cast<int>(d.per_stage.size()) == S);
  for (const auto& chunks : d.per_stage) {
    durations_ok = durations_ok && static_cast<int>(chunks.size()) == V;
    for (const ComputeSeconds& c : chunks) {
      durations_ok = durations_ok && c.forward >= 0 && c.backward >= 0 && c.weight >= 0;
    }
  }
  if (!durations_ok) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "durations for a schedule of %d stages x %d chunks: give %d rows of %d (or none), and "
        "no negative time",
        S, V, S, V));
  }
  bool per_action_ok = d.per_action.empty() || static_cast<int>(d.per_action.size()) == S;
  for (int st = 0; st < static_cast<int>(d.per_action.size()) && per_action_ok; ++st) {
    per_action_ok = d.per_action[st].size() <= s.actions[st].size();
  }
  if (!per_action_ok) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "per-action durations for a schedule of %d stages: give %d rows (or none), each no "
        "longer than its stage's actions",
        S, S));
  }
  if (V > 1 && S < 2) {
    return Invalid(s, "several chunks need at least 2 stages (one stage would send to itself)",
                   {});
  }
  return absl::OkStatus();
}

// "micro-batch 3", and with several chunks "micro-batch 3 on chunk 1".
std::string MicroBatchText(const PipelineSchedule& s, int m, int c) {
  return s.chunks == 1 ? absl::StrCat("micro-batch ", m)
                       : absl::StrCat("micro-batch ", m, " on chunk ", c);
}

// Each stage's counts and order: one forward and one backward per micro-batch and chunk, at
// most one weight gradient, after its backward; micro-batches and chunks in range; no
// transfer to a neighbour a global stage does not have; the optimizer step once, last.
absl::Status CheckCounts(const PipelineSchedule& s) {
  const int S = s.stages, M = s.micro_batches, V = s.chunks;
  // Per stage, indexed by chunk * M + micro-batch.
  for (int st = 0; st < S; ++st) {
    std::vector<int> fwd(V * M, -1), bwd(V * M, -1), wgt(V * M, -1);
    const auto& a = s.actions[st];
    std::vector<int> mark(S, -1);
    for (size_t i = 0; i < a.size(); ++i) {
      mark[st] = static_cast<int>(i);
      const Action& x = a[i];
      const int at = static_cast<int>(i);
      if (x.type == ActionType::kOptimizerStep) {
        if (i + 1 != a.size()) {
          return Invalid(s, absl::StrFormat("stage %d: the optimizer step is not last", st), mark);
        }
        continue;
      }
      if (x.micro_batch < 0 || x.micro_batch >= M) {
        return Invalid(s, absl::StrFormat("stage %d: micro-batch %d out of range [0, %d)", st,
                                    x.micro_batch, M),
                    mark);
      }
      if (x.chunk < 0 || x.chunk >= V) {
        return Invalid(s, absl::StrFormat("stage %d: chunk %d out of range [0, %d) in %s", st, x.chunk,
                                    V, ActionText(st, x)),
                    mark);
      }
      const int g = GlobalStage(st, x.chunk, S);
      const bool first = g == 0, last = g == S * V - 1;
      if ((first && x.type == ActionType::kRecvActivation) || (last && x.type == ActionType::kSendActivation) ||
          (last && x.type == ActionType::kRecvGradient) || (first && x.type == ActionType::kSendGradient)) {
        return Invalid(s, absl::StrFormat("stage %d has no neighbour for %s", st, ActionText(st, x)), mark);
      }
      const int k = x.chunk * M + x.micro_batch;
      const std::string mb = MicroBatchText(s, x.micro_batch, x.chunk);
      auto refuse = [&](const std::string& why) {
        return Invalid(s, absl::StrFormat("stage %d: %s", st, why), mark);
      };
      if (x.type == ActionType::kForward) {
        if (fwd[k] >= 0) return refuse(absl::StrCat("forward of ", mb, " twice"));
        fwd[k] = at;
      }
      if (x.type == ActionType::kBackward) {
        if (fwd[k] < 0) return refuse(absl::StrCat("backward of ", mb, " before its forward"));
        if (bwd[k] >= 0) return refuse(absl::StrCat("backward of ", mb, " twice"));
        bwd[k] = at;
      }
      if (x.type == ActionType::kWeightGradient) {
        if (bwd[k] < 0) {
          return refuse(absl::StrCat("weight gradient of ", mb, " before its backward"));
        }
        if (wgt[k] >= 0) return refuse(absl::StrCat("weight gradient of ", mb, " twice"));
        wgt[k] = at;
      }
      // A send carries what a compute action made: the activation its forward made, the
      // input gradient its backward (or B) made.
      if (x.type == ActionType::kSendActivation && fwd[k] < 0) {
        return refuse(absl::StrCat("activation of ", mb, " sent before its forward"));
      }
      if (x.type == ActionType::kSendGradient && bwd[k] < 0) {
        return refuse(absl::StrCat("gradient of ", mb, " sent before its backward"));
      }
    }
    for (int k = 0; k < V * M; ++k) {
      if (fwd[k] < 0 || bwd[k] < 0) {
        return Invalid(s, absl::StrFormat("stage %d never runs the %s of %s", st,
                                    fwd[k] < 0 ? "forward" : "backward", MicroBatchText(s, k % M, k / M)),
                    {});
      }
    }
    if (a.empty() || a.back().type != ActionType::kOptimizerStep) {
      return Invalid(s, absl::StrFormat("stage %d has no optimizer step", st), {});
    }
  }
  return absl::OkStatus();
}

// Both ends of each pair of stages post the transfers from one to the other in the same
// order (the k-th send matches the k-th receive).
absl::Status CheckPairing(const PipelineSchedule& s) {
  const int S = s.stages, V = s.chunks;
  // Per (from stage, to stage), each transfer as (is gradient, micro-batch, sending global
  // stage).
  using Transfer = std::tuple<bool, int, int>;
  std::map<std::pair<int, int>, std::pair<std::vector<Transfer>, std::vector<Transfer>>> order;
  for (int st = 0; st < S; ++st) {
    for (const Action& x : s.actions[st]) {
      if (!x.is_communication()) continue;
      const auto [from, to, gradient] = LinkOf(s, st, x);
      auto& [sent, recv] = order[{PlaceStage(from, S).stage, PlaceStage(to, S).stage}];
      (IsSend(x) ? sent : recv).push_back({gradient, x.micro_batch, from});
    }
  }
  for (const auto& [link, sides] : order) {
    if (sides.first == sides.second) continue;
    // With one chunk, a pair of stages carries one kind of transfer, listed by micro-batch;
    // with several, each transfer reads "activation 3 from chunk 1".
    const bool gradients = std::get<0>(
        sides.first.empty() ? sides.second.front() : sides.first.front());
    bool mixed = false;
    for (const auto* side : {&sides.first, &sides.second}) {
      for (const Transfer& t : *side) mixed = mixed || std::get<0>(t) != gradients;
    }
    auto list = [&](const std::vector<Transfer>& ts) {
      return absl::StrJoin(ts, ",", [&](std::string* out, const Transfer& t) {
        const auto [gradient, m, from] = t;
        if (V == 1) return absl::StrAppend(out, m);
        absl::StrAppend(out, gradient ? "gradient " : "activation ", m, " from chunk ",
                        PlaceStage(from, S).chunk);
      });
    };
    return Invalid(s, 
        absl::StrFormat("the %s from stage %d to stage %d are sent in %sorder %s and received "
                        "in order %s (transfers on a link match in order)",
                        mixed ? "transfers" : gradients ? "gradients" : "activations",
                        link.first, link.second, V == 1 ? "micro-batch " : "",
                        list(sides.first), list(sides.second)),
        {});
  }
  return absl::OkStatus();
}

// The step timed over every stage's replay (stage_replay.h): a stage posts its groups as its
// replay reaches them; each stage's posted groups run one after the other; a transfer
// completes once the groups holding its two ends are each the first unfinished group of its
// stage, and a group once all its transfers have, plus its transfer time and the handover.
// Where the replay has the stream wait for a group, the stage waits until it is done; a
// compute action then takes its duration, once what it needs has arrived.
class TimedReplay {
 public:
  TimedReplay(const PipelineSchedule& s, const ScheduleDurations& d);
  absl::StatusOr<SimulatedStep> Run();

 private:
  static constexpr double kNotYet = -1;
  using Times = std::vector<std::vector<double>>;
  double Seconds(int st, size_t i) const;
  // Stage st's replay as far as it can go now; whether it moved.
  bool Advance(int st);
  // Stage st's first posted group's transfers met where their other ends are first too, and
  // the group completed once all have; whether anything moved.
  absl::StatusOr<bool> CompleteFront(int st);
  absl::Status Deadlock() const;

  const PipelineSchedule& s_;
  const ScheduleDurations& d_;
  const int S_, M_, V_;
  std::vector<std::vector<bool>> split_;
  std::vector<std::vector<std::vector<int>>> groups_;
  std::vector<std::vector<int>> group_of_;
  std::vector<std::vector<ReplayEvent>> replay_;
  // The clock: each stage's time where it stands, when each of its groups was posted and
  // completed (kNotYet until then), and when its last group completed.
  std::vector<double> now_, queue_free_;
  std::vector<size_t> at_;  // the next event of each stage's replay
  std::vector<std::deque<int>> posted_;
  Times posted_at_, done_at_, transferred_;
  // Per stage, by chunk * M + micro-batch: when the activation or gradient arrived.
  Times act_at_, grad_at_;
  SimulatedStep out_;
};

TimedReplay::TimedReplay(const PipelineSchedule& s, const ScheduleDurations& d)
    : s_(s), d_(d), S_(s.stages), M_(s.micro_batches), V_(s.chunks) {
  groups_ = ExchangeGroups(s);
  for (int st = 0; st < S_; ++st) {
    split_.push_back(DeferredWeights(s, st));
    group_of_.push_back(GroupOfActions(groups_[st], s.actions[st].size()));
    replay_.push_back(ReplayStage(s, groups_[st], st));
    posted_at_.emplace_back(groups_[st].size(), 0);
    done_at_.emplace_back(groups_[st].size(), kNotYet);
    transferred_.emplace_back(s.actions[st].size(), kNotYet);
  }
  now_.assign(S_, 0);
  queue_free_.assign(S_, 0);
  at_.assign(S_, 0);
  posted_.resize(S_);
  act_at_.assign(S_, std::vector<double>(V_ * M_, kNotYet));
  grad_at_ = act_at_;
  out_.busy.assign(S_, 0);
}

double TimedReplay::Seconds(int st, size_t i) const {
  const Action& x = s_.actions[st][i];
  if (!d_.per_action.empty() && i < d_.per_action[st].size() && d_.per_action[st][i] >= 0) {
    return d_.per_action[st][i];
  }
  if (d_.per_stage.empty()) return 0.0;
  return d_.per_stage[st][x.chunk].Of(x, split_[st][x.chunk * M_ + x.micro_batch]);
}

bool TimedReplay::Advance(int st) {
  bool moved = false;
  for (; at_[st] < replay_[st].size(); ++at_[st], moved = true) {
    const ReplayEvent& e = replay_[st][at_[st]];
    if (e.kind == ReplayKind::kGroupPosted) {
      posted_[st].push_back(e.group);
      posted_at_[st][e.group] = now_[st];
    } else if (e.kind == ReplayKind::kGroupDone) {
      if (done_at_[st][e.group] < 0) break;
      now_[st] = std::max(now_[st], done_at_[st][e.group]);
    } else if (e.kind == ReplayKind::kActionStart) {
      // What the action needs from another stage must have arrived (a schedule that never
      // receives it stalls here).
      const Action& x = s_.actions[st][e.action];
      const int k = x.chunk * M_ + x.micro_batch, g = GlobalStage(st, x.chunk, S_);
      const double needs = x.type == ActionType::kForward && g > 0 ? act_at_[st][k]
                           : x.type == ActionType::kBackward && g < S_ * V_ - 1
                               ? grad_at_[st][k]
                               : 0;
      if (needs < 0) break;
      const double took = Seconds(st, e.action);
      now_[st] = std::max(now_[st], needs) + took;
      out_.busy[st] += took;
    }
  }
  return moved;
}

absl::StatusOr<bool> TimedReplay::CompleteFront(int st) {
  if (posted_[st].empty()) return false;
  const int g = posted_[st].front();
  const double active = std::max(posted_at_[st][g], queue_free_[st]);
  bool moved = false, all = true;
  for (int i : groups_[st][g]) {
    if (transferred_[st][i] >= 0) continue;
    const int peer = PeerOf(s_, st, s_.actions[st][i]);
    const int j = Counterpart(s_, st, i);
    if (j < 0) {
      std::vector<int> mark(S_, -1);
      mark[st] = i;
      return Invalid(s_,
                     absl::StrFormat("%s has no counterpart on the neighbouring stage",
                                     ActionText(st, s_.actions[st][i])),
                     mark);
    }
    const int h = group_of_[peer][j];
    if (posted_[peer].empty() || posted_[peer].front() != h) {
      all = false;
      continue;
    }
    const double met = std::max(active, std::max(posted_at_[peer][h], queue_free_[peer]));
    transferred_[st][i] = transferred_[peer][j] = met;
    moved = true;
  }
  if (!all) return moved;
  double end = active;
  for (int i : groups_[st][g]) end = std::max(end, transferred_[st][i]);
  end += d_.transfer * static_cast<double>(groups_[st][g].size()) + d_.handover;
  for (int i : groups_[st][g]) {
    const Action& y = s_.actions[st][i];
    const int k = y.chunk * M_ + y.micro_batch;
    if (y.type == ActionType::kRecvActivation) act_at_[st][k] = end;
    if (y.type == ActionType::kRecvGradient) grad_at_[st][k] = end;
  }
  done_at_[st][g] = queue_free_[st] = end;
  posted_[st].pop_front();
  return true;
}

absl::Status TimedReplay::Deadlock() const {
  std::vector<int> mark(S_, -1);
  for (int st = 0; st < S_; ++st) {
    if (!posted_[st].empty()) {
      mark[st] = groups_[st][posted_[st].front()].front();
    } else if (at_[st] < replay_[st].size()) {
      mark[st] = replay_[st][at_[st]].action;
    }
  }
  return Invalid(s_, "deadlock: no stage can make progress", mark);
}

absl::StatusOr<SimulatedStep> TimedReplay::Run() {
  for (;;) {
    bool progress = false, done = true;
    for (int st = 0; st < S_; ++st) {
      progress = Advance(st) || progress;
      if (at_[st] < replay_[st].size() || !posted_[st].empty()) done = false;
    }
    for (int st = 0; st < S_; ++st) {
      const absl::StatusOr<bool> moved = CompleteFront(st);
      if (!moved.ok()) return moved.status();
      progress = progress || *moved;
    }
    if (done) {
      // A stage's step ends once its last compute action and its last transfer have; all
      // stages end together (the step's end is a reduction over every rank), and what a stage
      // did not spend computing until then it waited.
      for (int st = 0; st < S_; ++st) {
        out_.makespan = std::max({out_.makespan, now_[st], queue_free_[st]});
      }
      for (int st = 0; st < S_; ++st) {
        out_.bubble_fraction += out_.makespan > 0 ? (1 - out_.busy[st] / out_.makespan) / S_ : 0;
      }
      return out_;
    }
    if (!progress) return Deadlock();
  }
}
}  // namespace

absl::StatusOr<SimulatedStep> SimulateSchedule(const PipelineSchedule& s,
                                               const ScheduleDurations& d) {
  // The static checks first, each only once the one before holds.
  absl::Status checked = CheckShape(s, d);
  if (checked.ok()) checked = CheckCounts(s);
  if (checked.ok()) checked = CheckPairing(s);
  if (!checked.ok()) return checked;
  return TimedReplay(s, d).Run();
}

PipelineSchedule HoistReceives(const PipelineSchedule& s) {
  PipelineSchedule out = s;
  // The yardstick a move must not lengthen: the step with every F, B and W one unit long.
  const ScheduleDurations unit = ScheduleDurations::Uniform(s.stages, s.chunks, {1, 1, 1});
  const absl::StatusOr<SimulatedStep> before = SimulateSchedule(out, unit);
  if (!before.ok()) return out;  // invalid already: nothing to keep valid
  double makespan = before->makespan;
  for (int st = 0; st < out.stages; ++st) {
    for (size_t i = 0; i < out.actions[st].size(); ++i) {
      const Action a = out.actions[st][i];
      if (a.type != ActionType::kRecvActivation && a.type != ActionType::kRecvGradient) continue;
      // The compute action before this receive's run: the receive goes just before it.
      size_t p = i;
      while (p > 0 && !out.actions[st][p - 1].is_compute()) --p;
      if (p == 0) continue;
      --p;
      PipelineSchedule moved = out;
      std::vector<Action>& row = moved.actions[st];
      row.erase(row.begin() + static_cast<std::ptrdiff_t>(i));
      row.insert(row.begin() + static_cast<std::ptrdiff_t>(p), a);
      const absl::StatusOr<SimulatedStep> after = SimulateSchedule(moved, unit);
      if (after.ok() && after->makespan <= makespan) {
        makespan = after->makespan;
        out = std::move(moved);
      }
    }
  }
  return out;
}

int PeakInFlight(const PipelineSchedule& s, int stage) {
  int now = 0, peak = 0;
  for (const Action& a : s.actions[stage]) {
    if (a.type == ActionType::kForward) peak = std::max(peak, ++now);
    if (a.type == ActionType::kBackward) --now;
  }
  return peak;
}

int PeakPendingWeights(const PipelineSchedule& s, int stage) {
  int now = 0, peak = 0;
  const std::vector<bool> split = DeferredWeights(s, stage);
  for (const Action& a : s.actions[stage]) {
    if (a.type == ActionType::kBackward && split[a.chunk * s.micro_batches + a.micro_batch]) {
      peak = std::max(peak, ++now);
    }
    if (a.type == ActionType::kWeightGradient) --now;
  }
  return peak;
}

std::vector<int> GroupOfActions(const std::vector<std::vector<int>>& groups, size_t actions) {
  std::vector<int> group_of(actions, -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int i : groups[g]) group_of[i] = static_cast<int>(g);
  }
  return group_of;
}

std::vector<bool> DeferredWeights(const PipelineSchedule& s, int stage) {
  std::vector<bool> split(s.chunks * s.micro_batches, false);
  for (const Action& a : s.actions[stage]) {
    if (a.type != ActionType::kWeightGradient) continue;
    split[a.chunk * s.micro_batches + a.micro_batch] = true;
  }
  return split;
}

double ComputeSeconds::Of(const Action& x, bool deferred) const {
  if (x.type == ActionType::kForward) return forward;
  if (x.type == ActionType::kWeightGradient) return weight;
  return deferred ? backward : backward + weight;
}

}  // namespace tandem
