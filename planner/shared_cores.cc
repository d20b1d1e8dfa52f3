// The shared-cores model: CPU workers on fewer cores than workers, the ranks that compute at
// each moment sharing the cores (ShareRate, SharedCoresStep, SharedCoresEnd), and the
// waiting share fitted to a measured pipeline step (WaitingShareProbe, FitWaitingShare,
// HeldOutReason).
#include "planner/shared_cores.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "parallel/schedule.h"
#include "planner/planner.h"
#include "runtime/status.h"

namespace tandem {

double ShareRate(int n, double cores, int waiting, double waiting_share) {
  const double load = n + waiting * waiting_share;
  return load <= cores ? 1.0 : cores / load;
}

namespace {

// Processor sharing from `t`: the ranks marked `active` work through what they have `left`
// at ShareRate(how many, cores, waiting, waiting_share) each until the first of them is done
// or `horizon` comes, which is returned (infinity: none active and no horizon); `left` is
// what remains then.
double ShareUntil(std::vector<double>& left, const std::vector<bool>& active, double cores,
                  double t, double horizon, int waiting = 0, double waiting_share = 0) {
  const int n = static_cast<int>(std::count(active.begin(), active.end(), true));
  const double rate = ShareRate(n, cores, waiting, waiting_share);
  double next = horizon;
  for (size_t i = 0; i < left.size(); ++i) {
    if (active[i]) next = std::min(next, t + left[i] / rate);
  }
  if (std::isinf(next)) return next;
  for (size_t i = 0; i < left.size(); ++i) {
    if (active[i]) left[i] -= rate * (next - t);
  }
  return next;
}

}  // namespace

double SharedCoresStep(const PipelineSchedule& s, const ScheduleDurations& d, double cores,
                       double waiting_share) {
  const int S = s.stages, M = s.micro_batches, V = s.chunks;
  constexpr double kNotYet = -1;
  // A transfer by (is gradient, micro-batch, sending global stage): when its send and its
  // receive were posted.
  using Key = std::tuple<bool, int, int>;
  std::map<Key, std::pair<double, double>> posted;
  auto key = [&](int st, const Action& a) -> Key {
    const int g = GlobalStage(st, a.chunk, S);
    switch (a.type) {
      case ActionType::kSendActivation: return {false, a.micro_batch, g};
      case ActionType::kRecvActivation: return {false, a.micro_batch, g - 1};
      case ActionType::kSendGradient: return {true, a.micro_batch, g};
      default: return {true, a.micro_batch, g + 1};  // kRecvGradient
    }
  };
  auto arrived = [&](const Key& k) {
    const auto it = posted.find(k);
    if (it == posted.end() || it->second.first < 0 || it->second.second < 0) return kNotYet;
    return std::max(it->second.first, it->second.second) + d.transfer + d.handover;
  };
  std::vector<std::vector<bool>> split(S);
  for (int st = 0; st < S; ++st) split[st] = DeferredWeights(s, st);
  std::vector<std::vector<double>> fwd_end(S, std::vector<double>(V * M, kNotYet)),
      bwd_end = fwd_end;
  // When compute action x of stage st can start; kNotYet while that is not known.
  auto ready = [&](int st, const Action& x) {
    const int k = x.chunk * M + x.micro_batch, g = GlobalStage(st, x.chunk, S);
    if (x.type == ActionType::kWeightGradient) return bwd_end[st][k];
    if (x.type == ActionType::kForward) return g > 0 ? arrived({false, x.micro_batch, g - 1}) : 0;
    const double grad = g < S * V - 1 ? arrived({true, x.micro_batch, g + 1}) : 0;
    return fwd_end[st][k] < 0 || grad < 0 ? kNotYet : std::max(fwd_end[st][k], grad);
  };
  auto seconds = [&](int st, const Action& x) {
    return d.per_stage[st][x.chunk].Of(x, split[st][x.chunk * M + x.micro_batch]);
  };
  std::vector<size_t> pc(S, 0);
  std::vector<double> left(S, kNotYet);  // the running compute action's work left
  double t = 0, end = 0;
  for (;;) {
    // Every stage goes on at t as far as it can: posts its transfers, starts what is ready.
    for (bool progress = true; progress;) {
      progress = false;
      for (int st = 0; st < S; ++st) {
        while (left[st] < 0 && pc[st] < s.actions[st].size()) {
          const Action& x = s.actions[st][pc[st]];
          if (x.is_communication()) {
            auto& [send, recv] = posted.emplace(key(st, x), std::make_pair(kNotYet, kNotYet))
                                     .first->second;
            (x.type == ActionType::kSendActivation || x.type == ActionType::kSendGradient
                 ? send
                 : recv) = t;
          } else if (x.is_compute()) {
            const double at = ready(st, x);
            if (at < 0 || at > t) break;
            left[st] = seconds(st, x);
          }
          if (left[st] < 0) ++pc[st];  // a started compute action moves on when it ends
          progress = true;
        }
      }
    }
    // The next moment something changes: a compute action ends or a transfer arrives.
    std::vector<bool> computing(S);
    double arrival = std::numeric_limits<double>::infinity();
    int waiting = 0;
    for (int st = 0; st < S; ++st) {
      computing[st] = left[st] >= 0;
      if (!computing[st] && pc[st] < s.actions[st].size()) {
        ++waiting;
        const double at = ready(st, s.actions[st][pc[st]]);
        if (at > t) arrival = std::min(arrival, at);
      }
    }
    const double next = ShareUntil(left, computing, cores, t, arrival, waiting, waiting_share);
    if (std::isinf(next)) break;  // all done (a validated schedule never stalls)
    for (int st = 0; st < S; ++st) {
      if (!computing[st] || left[st] > 1e-12 * next) continue;
      const Action& x = s.actions[st][pc[st]];
      if (x.type == ActionType::kForward) fwd_end[st][x.chunk * M + x.micro_batch] = next;
      if (x.type == ActionType::kBackward) bwd_end[st][x.chunk * M + x.micro_batch] = next;
      left[st] = kNotYet;
      ++pc[st];
      end = next;
    }
    t = next;
  }
  for (const auto& [k, ends] : posted) end = std::max(end, arrived(k));
  return end;
}

double SharedCoresEnd(const std::vector<double>& release, const std::vector<double>& work,
                      const std::vector<double>& after, double cores) {
  const size_t n = release.size();
  std::vector<double> left = work;
  std::vector<bool> done(n, false);
  double t = 0, end = 0;
  for (size_t finished = 0; finished < n;) {
    std::vector<bool> computing(n);
    double released = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < n; ++i) {
      computing[i] = !done[i] && release[i] <= t;
      if (!done[i] && release[i] > t) released = std::min(released, release[i]);
    }
    const double next = ShareUntil(left, computing, cores, t, released);
    for (size_t i = 0; i < n; ++i) {
      if (!computing[i] || left[i] > 1e-12 * next) continue;
      done[i] = true;
      ++finished;
      end = std::max(end, next + after[i]);
    }
    t = next;
  }
  return end;
}

std::optional<Layout> WaitingShareProbe(const Plan& plan) {
  std::optional<Layout> best;
  auto distance = [](const Layout& l) { return std::abs(l.micro_batches - 2 * l.stages); };
  for (const Prediction& p : plan.ranked) {
    const Layout& l = p.layout;
    if (l.strategy != StrategyKind::kPipeline || l.schedule != "1f1b" || l.zero ||
        l.recompute) {
      continue;
    }
    if (!best || l.stages > best->stages ||
        (l.stages == best->stages && distance(l) < distance(*best))) {
      best = l;
    }
  }
  return best;
}

absl::StatusOr<double> FitWaitingShare(PlanRequest r, const Layout& probe, double measured_s) {
  auto step = [&](double w) -> absl::StatusOr<double> {
    r.waiting_share = w;
    ASSIGN_OR_RETURN(Prediction p, Predict(r, probe));
    return p.step_s;
  };
  double lo = 0, hi = 1;
  ASSIGN_OR_RETURN(double at_lo, step(lo));
  if (at_lo >= measured_s) return lo;
  ASSIGN_OR_RETURN(double at_hi, step(hi));
  if (at_hi <= measured_s) return hi;
  while (hi - lo > 1e-4) {
    const double mid = (lo + hi) / 2;
    ASSIGN_OR_RETURN(double at, step(mid));
    (at < measured_s ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

std::string HeldOutReason(const Layout& fitted, const Layout& l) {
  if (l.Name() == fitted.Name()) return "the waiting share was fitted on it";
  if (l.stages < 2 || l.stages != fitted.stages || l.data_parallel != fitted.data_parallel) {
    return "";
  }
  std::vector<std::string> differ;
  if (l.strategy != fitted.strategy || l.schedule != fitted.schedule ||
      l.virtual_stages != fitted.virtual_stages) {
    differ.push_back("schedule");
  }
  if (l.micro_batches != fitted.micro_batches) differ.push_back("micro-batches");
  if (l.recompute != fitted.recompute) differ.push_back("recomputation");
  if (l.zero != fitted.zero) differ.push_back("ZeRO-1");
  if (l.bucket_bytes != fitted.bucket_bytes && l.data_parallel > 1) differ.push_back("buckets");
  if (l.balance != fitted.balance) differ.push_back("balance");
  std::string what = differ.empty() ? "nothing the name shows" : differ.back();
  if (differ.size() >= 2) {
    differ.pop_back();
    what = absl::StrCat(absl::StrJoin(differ, ", "), " and ", what);
  }
  return absl::StrFormat(
      "its shape d%dk%d is the one the waiting share was fitted on (%s); it differs from it "
      "only in %s",
      l.data_parallel, l.stages, fitted.Name(), what);
}

}  // namespace tandem
