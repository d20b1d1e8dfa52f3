// The comparison's figures and rules: each run's figures against the one-worker baseline,
// the rules that rank the runs and recommend one (fastest, least memory, the choice between
// them, ZeRO-1, loss parity, validation, noise, the host), a measured step's timeline, and
// the report those make (BuildReport); comparison_writers.cc writes it out.
#include "tools/comparison.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "launcher/run_report.h"
#include "runtime/files.h"
#include "runtime/json.h"

namespace tandem {
namespace tools {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Losses further than this (relative) from one worker's are called out.
constexpr double kLossTolerance = 1e-4;
// Step times varying more than this (standard deviation / mean) are called noisy.
constexpr double kNoisy = 0.25;
// A strategy "saves memory" when its largest rank's peak is below this share of another's.
constexpr double kMemorySaving = 0.95;

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / v.size();
}

std::string FirstLine(const std::string& s) {
  const std::string t(absl::StripAsciiWhitespace(s));
  const size_t nl = t.find('\n');
  return nl == std::string::npos ? t : t.substr(0, nl);
}

// A fixed colour per strategy; a hybrid layout "d{D}k{K}-{schedule}" gets a hue chosen by
// its layout (the same for the same D and K in every report), GPipe the darkest shade, 1F1B
// the lightest and ZB-H1 the one between.
std::string StrategyColor(const std::string& name) {
  static const std::map<std::string, std::string> kFixed = {
      {"baseline", "#8c8c8c"}, {"data", "#4e79a7"},  {"data-zero1", "#a0cbe8"},
      {"model", "#f28e2b"},    {"gpipe", "#59a14f"}, {"1f1b", "#b07aa1"},
      {"zb-h1", "#8cd17d"},
  };
  if (const auto it = kFixed.find(name); it != kFixed.end()) return it->second;
  // {GPipe, 1F1B, ZB-H1} shades.
  static const char* const kHybrid[][3] = {
      {"#e15759", "#ff9d9a", "#f07a79"}, {"#9c755f", "#d7b5a6", "#b99582"},
      {"#edc948", "#f1e2a1", "#efd574"}, {"#499894", "#86bcb6", "#67aaa5"},
      {"#d37295", "#fabfd2", "#e698b3"}, {"#79706e", "#bab0ac", "#99908d"},
  };
  const size_t dash = name.find('-');
  if (name.size() > 1 && name[0] == 'd' && dash != std::string::npos) {
    uint32_t hash = 2166136261u;  // FNV-1a of the layout, "d2k2"
    for (char c : name.substr(0, dash)) hash = (hash ^ static_cast<unsigned char>(c)) * 16777619u;
    const auto& shades = kHybrid[hash % (sizeof(kHybrid) / sizeof(kHybrid[0]))];
    const std::string schedule = name.substr(dash + 1);
    return shades[schedule == "1f1b" ? 1 : schedule == "zb-h1" ? 2 : 0];
  }
  return "#76b7b2";
}

// "GPipe", "1F1B" or "ZB-H1" for a schedule's flag value.
std::string ScheduleName(const std::string& schedule) {
  if (schedule == "1f1b") return "1F1B";
  if (schedule == "zb-h1") return "ZB-H1";
  return "GPipe";
}

double Share(double part, double whole) { return whole > 0 ? part / whole : 0; }

// A span of a run whose grid has `stages` stages.
SpanKind KindOf(const TraceEvent& e, int stages) {
  if (e.category == "comm") return SpanKind::kComm;
  if (e.category == "optimizer") return SpanKind::kOptimizer;
  if (e.category == "idle") {
    // The waits the workers count as exposed communication (ZeRO-1's "gather parameters":
    // its all-gather; "reduce loss" but on a pipeline, where it is the wait for the last
    // stage); the others are a pipeline's bubble.
    const bool exposed = e.name == "wait for gradients" || e.name == "gather parameters" ||
                         (e.name == "reduce loss" && stages == 1);
    return exposed ? SpanKind::kExposedComm : SpanKind::kBubble;
  }
  if (absl::StartsWith(e.name, "forward")) return SpanKind::kForward;
  if (absl::StartsWith(e.name, "backward")) return SpanKind::kBackward;
  return SpanKind::kCompute;
}

}  // namespace

// ---- figures ----

Figures ComputeFigures(const Entry& e, const Entry* baseline) {
  Figures f;
  f.name = e.name;
  f.label = e.label;
  f.ran = e.ran;
  f.error = e.error;
  f.speedup = f.efficiency = f.max_loss_deviation = kNaN;
  if (!e.ran) return f;
  const RunData& run = e.run;
  f.strategy = run.strategy;
  f.schedule = run.strategy == "pipeline" ? run.schedule : "";
  f.workers = run.workers;
  f.replicas = run.grid.replicas;
  f.stages = run.grid.stages;
  f.tensors = run.grid.tensors;
  f.zero = run.zero;
  f.micro_batches = run.micro_batches;
  f.steps = run.ranks.empty() ? 0 : static_cast<int>(run.ranks[0].size());
  const std::vector<double> steps = launcher::CountedStepSeconds(run.ranks);
  f.step_seconds = Mean(steps);
  if (f.step_seconds > 0) {
    double var = 0;
    for (double x : steps) var += (x - f.step_seconds) * (x - f.step_seconds) / steps.size();
    f.step_variation = std::sqrt(var) / f.step_seconds;
  }
  f.tokens_per_second = f.step_seconds > 0 ? run.tokens_per_step / f.step_seconds : 0;
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    const std::vector<StepMetrics>& steps = run.ranks[r];
    RankFigures rf;
    rf.rank = static_cast<int>(r);
    rf.replica = run.grid.ReplicaOf(rf.rank);
    rf.stage = run.grid.StageOf(rf.rank);
    const size_t first = launcher::WarmupStepsOf(steps.size());
    const double n = static_cast<double>(steps.size() - first);
    for (size_t i = first; i < steps.size(); ++i) {
      rf.step_seconds += steps[i].seconds / n;
      rf.compute_seconds += steps[i].compute / n;
      rf.exposed_comm_seconds += steps[i].exposed_comm / n;
      rf.tensor_comm_seconds += steps[i].tensor_comm / n;
      rf.bubble_seconds += steps[i].bubble / n;
      rf.optimizer_seconds += steps[i].optimizer / n;
    }
    rf.other_seconds =
        std::max(0.0, rf.step_seconds - rf.compute_seconds - rf.exposed_comm_seconds -
                          rf.tensor_comm_seconds - rf.bubble_seconds - rf.optimizer_seconds);
    for (const StepMetrics& s : steps) rf.peak_bytes = std::max(rf.peak_bytes, s.peak_bytes);
    if (!steps.empty()) {
      rf.param_bytes = steps.back().param_bytes;
      rf.grad_bytes = steps.back().grad_bytes;
      rf.optimizer_bytes = steps.back().optimizer_bytes;
    }
    if (r < run.optimizer_state_bytes.size()) rf.optimizer_bytes = run.optimizer_state_bytes[r];
    rf.activation_bytes =
        std::max<int64_t>(0, rf.peak_bytes - rf.param_bytes - rf.grad_bytes - rf.optimizer_bytes);
    f.compute_seconds += rf.compute_seconds / run.ranks.size();
    f.exposed_comm_seconds += rf.exposed_comm_seconds / run.ranks.size();
    f.tensor_comm_seconds += rf.tensor_comm_seconds / run.ranks.size();
    f.bubble_seconds += rf.bubble_seconds / run.ranks.size();
    f.peak_bytes = std::max(f.peak_bytes, rf.peak_bytes);
    f.activation_bytes = std::max(f.activation_bytes, rf.activation_bytes);
    f.optimizer_bytes = std::max(f.optimizer_bytes, rf.optimizer_bytes);
    f.ranks.push_back(rf);
  }
  f.final_loss = run.losses.empty() ? kNaN : run.losses.back();
  if (!run.val_losses.empty()) {
    f.final_val_step = run.val_losses.back().first;
    f.final_val_loss = run.val_losses.back().second;
  }
  if (baseline != nullptr && baseline->ran) {
    const RunData& b = baseline->run;
    const double base_step = launcher::MeanStepSeconds(b.ranks);
    const double base_tps = base_step > 0 ? b.tokens_per_step / base_step : 0;
    if (base_tps > 0) {
      f.speedup = f.tokens_per_second / base_tps;
      f.efficiency = f.speedup / std::max(1, f.workers);
    }
    const size_t n = std::min(b.losses.size(), run.losses.size());
    if (n > 0) {
      f.max_loss_deviation = 0;
      for (size_t i = 0; i < n; ++i) {
        f.max_loss_deviation =
            std::max(f.max_loss_deviation, std::fabs(run.losses[i] - b.losses[i]));
      }
    }
  }
  return f;
}

std::string Layout(const Figures& f) {
  if (!f.ran) return "-";
  return absl::StrFormat("%s%d x %d%s", f.tensors > 1 ? absl::StrFormat("T=%d, ", f.tensors) : "",
                         f.replicas, f.stages, f.zero == 1 ? ", ZeRO-1" : "");
}

namespace {

// What the recommendation rules rank: the runs that completed with a throughput, the baseline
// apart, and the fastest and the smallest of them.
struct Standing {
  const Figures* base = nullptr;
  std::vector<const Figures*> runs;
  const Figures* fastest = nullptr;
  const Figures* smallest = nullptr;  // the least peak memory on its largest rank
  double loss_scale = 1;              // losses compare relative to max(1, |baseline's loss|)

  // Whether f's losses are further from one worker's than kLossTolerance allows.
  bool OffParity(const Figures& f) const {
    return std::isfinite(f.max_loss_deviation) &&
           f.max_loss_deviation > kLossTolerance * loss_scale;
  }
  // The first completed run `pick` accepts, or nullptr.
  template <typename Pick>
  const Figures* Find(Pick pick) const {
    for (const Figures* f : runs) {
      if (pick(*f)) return f;
    }
    return nullptr;
  }
};

Standing RankRuns(const std::vector<Figures>& all) {
  Standing s;
  if (!all.empty() && all[0].name == "baseline" && all[0].ran) s.base = &all[0];
  for (const Figures& f : all) {
    if (&f != s.base && f.ran && f.tokens_per_second > 0) s.runs.push_back(&f);
  }
  if (s.base != nullptr) s.loss_scale = std::max(1.0, std::fabs(s.base->final_loss));
  for (const Figures* f : s.runs) {
    if (s.fastest == nullptr || f->tokens_per_second > s.fastest->tokens_per_second) s.fastest = f;
    if (s.smallest == nullptr || f->peak_bytes < s.smallest->peak_bytes) s.smallest = f;
  }
  return s;
}

bool SameLayout(const Figures& a, const Figures& b) {
  return a.strategy == b.strategy && a.replicas == b.replicas && a.stages == b.stages &&
         a.tensors == b.tensors;
}

// The verdict on `f` against the fastest run, and its reason.
std::pair<std::string, std::string> Verdict(const Figures& f, const Standing& s) {
  const Figures& fastest = *s.fastest;
  const double speed = Share(f.tokens_per_second, fastest.tokens_per_second);
  if (&f == &fastest) {
    return {&f == s.smallest ? "fastest, and the least memory per rank" : "fastest",
            std::isfinite(f.speedup)
                ? absl::StrFormat("%s one worker's speed, %s scaling efficiency", Ratio(f.speedup),
                                  Percent(f.efficiency))
                : absl::StrFormat("%s tokens/s", Thousands(f.tokens_per_second))};
  }
  if (f.peak_bytes < kMemorySaving * fastest.peak_bytes) {
    return {&f == s.smallest ? "least memory per rank" : "saves memory",
            absl::StrFormat("%s less peak memory per rank than %s (%s vs %s) at %s its speed",
                            Ratio(Share(fastest.peak_bytes, f.peak_bytes)), fastest.label,
                            Bytes(f.peak_bytes), Bytes(fastest.peak_bytes), Ratio(speed))};
  }
  return {"not recommended here",
          absl::StrFormat("%s %s's speed with %s its peak memory per rank", Ratio(speed),
                          fastest.label, Ratio(Share(f.peak_bytes, fastest.peak_bytes)))};
}

// `f` against the run it is best compared with: 1F1B against GPipe of the same layout, a
// hybrid layout against the one pipeline of its schedule, ZeRO-1 against the same layout
// without it.
std::vector<std::string> Comparisons(const Figures& f, const Standing& s) {
  std::vector<std::string> out;
  if (f.schedule == "1f1b" && f.activation_bytes > 0) {
    const Figures* gpipe = s.Find([&](const Figures& g) {
      return SameLayout(f, g) && g.schedule == "gpipe" && g.zero == f.zero;
    });
    if (gpipe != nullptr) {
      out.push_back(absl::StrFormat("vs GPipe: %s less activation memory at %s its speed",
                                    Ratio(Share(gpipe->activation_bytes, f.activation_bytes)),
                                    Ratio(Share(f.tokens_per_second, gpipe->tokens_per_second))));
    }
  }
  if (f.schedule == "zb-h1" && f.activation_bytes > 0) {
    const Figures* onef1b = s.Find([&](const Figures& g) {
      return SameLayout(f, g) && g.schedule == "1f1b" && g.zero == f.zero;
    });
    if (onef1b != nullptr) {
      out.push_back(absl::StrFormat(
          "vs 1F1B: %s its speed with %s its activation memory",
          Ratio(Share(f.tokens_per_second, onef1b->tokens_per_second)),
          Ratio(Share(f.activation_bytes, onef1b->activation_bytes))));
    }
  }
  if (f.strategy == "pipeline" && f.replicas > 1 && f.stages > 1) {
    const Figures* one = s.Find([&](const Figures& g) {
      return g.strategy == "pipeline" && g.schedule == f.schedule && g.replicas == 1 && g.zero == 0;
    });
    if (one != nullptr) {
      out.push_back(absl::StrFormat("vs %s: %s its speed with %s its peak memory per rank",
                                    one->label,
                                    Ratio(Share(f.tokens_per_second, one->tokens_per_second)),
                                    Ratio(Share(f.peak_bytes, one->peak_bytes))));
    }
  }
  if (f.zero == 1) {
    const Figures* plain = s.Find([&](const Figures& g) {
      return SameLayout(f, g) && g.schedule == f.schedule && g.zero == 0;
    });
    if (plain != nullptr && f.optimizer_bytes > 0) {
      out.push_back(
          absl::StrFormat("vs %s: %s less optimizer state per rank (%s vs %s) at %s its speed",
                          plain->label, Ratio(Share(plain->optimizer_bytes, f.optimizer_bytes)),
                          Bytes(f.optimizer_bytes), Bytes(plain->optimizer_bytes),
                          Ratio(Share(f.tokens_per_second, plain->tokens_per_second))));
    }
  }
  return out;
}

// Where `f`'s step goes that deserves a word: a large bubble, exposed communication, noise.
std::vector<std::string> StepRemarks(const Figures& f) {
  std::vector<std::string> out;
  const double bubble = Share(f.bubble_seconds, f.step_seconds);
  if (bubble > 0.3 && (f.strategy == "model" || f.strategy == "pipeline")) {
    out.push_back(absl::StrFormat("the bubble is %s of its step%s", Percent(bubble),
                                  f.strategy == "model" ? " (pipeline micro-batches fill it)"
                                                        : " (more --micro-batches shrink it)"));
  }
  const double exposed = Share(f.exposed_comm_seconds, f.step_seconds);
  if (exposed > 0.25) {
    out.push_back(absl::StrFormat("%s of its step waits for %s", Percent(exposed),
                                  f.zero == 1 ? "reduce-scatters and all-gathers" : "all-reduces"));
  }
  if (f.step_variation > kNoisy) {
    out.push_back(
        absl::StrFormat("its step times varied %s around their mean", Percent(f.step_variation)));
  }
  return out;
}

// One run's recommendation: a short verdict with its reasons.
std::string RunRecommendation(const Figures& f, const Standing& s) {
  if (&f == s.base) return "reference: one worker, the same global batch, seed and steps";
  if (!f.ran) return absl::StrCat("could not run: ", FirstLine(f.error));
  if (s.fastest == nullptr) return "";
  auto [verdict, reason] = Verdict(f, s);
  std::vector<std::string> clauses = {reason};
  for (std::vector<std::string> more : {Comparisons(f, s), StepRemarks(f)}) {
    clauses.insert(clauses.end(), more.begin(), more.end());
  }
  if (s.OffParity(f)) {
    verdict = "check first";
    clauses.insert(
        clauses.begin(),
        absl::StrFormat("its losses differ from one worker's by up to %.2g", f.max_loss_deviation));
  }
  return absl::StrCat(verdict, ": ", absl::StrJoin(clauses, "; "));
}

// The fastest, the least memory per rank, and the choice between them.
std::vector<std::string> RankingLines(const Standing& s) {
  const Figures* fastest = s.fastest;
  const Figures* smallest = s.smallest;
  if (fastest == nullptr) {
    return {"No strategy completed a run; see each strategy's message below."};
  }
  std::vector<std::string> out;
  const std::string against =
      std::isfinite(fastest->speedup)
          ? absl::StrFormat(", %s one worker (%s scaling efficiency over %d workers)",
                            Ratio(fastest->speedup), Percent(fastest->efficiency), fastest->workers)
          : "";
  out.push_back(absl::StrFormat("Fastest: %s, %s tokens/s%s.", fastest->label,
                                Thousands(fastest->tokens_per_second), against));
  const bool saves =
      smallest != fastest && smallest->peak_bytes < kMemorySaving * fastest->peak_bytes;
  if (saves) {
    out.push_back(absl::StrFormat(
        "Least memory per rank: %s, %s peak on its largest rank, %s less than %s, at %s its "
        "speed.",
        smallest->label, Bytes(smallest->peak_bytes),
        Ratio(Share(fastest->peak_bytes, smallest->peak_bytes)), fastest->label,
        Ratio(Share(smallest->tokens_per_second, fastest->tokens_per_second))));
  } else {
    out.push_back(absl::StrFormat("Least memory per rank: %s as well (%s peak).", fastest->label,
                                  Bytes(fastest->peak_bytes)));
  }
  std::string choice;
  if (std::isfinite(fastest->speedup) && fastest->speedup < 1) {
    choice = absl::StrFormat(
        "Recommendation: on this host one worker is fastest (every strategy below 1x); of "
        "the parallel strategies %s",
        fastest->label);
  } else {
    choice = absl::StrFormat("Recommendation: %s", fastest->label);
  }
  if (saves) {
    absl::StrAppendFormat(&choice, "; %s when memory per device is the limit", smallest->label);
  }
  out.push_back(choice + ".");
  return out;
}

// ZeRO-1's optimizer state per rank against plain data parallel's, as the runs measured it;
// "" without both.
std::string ZeroLine(const Standing& s) {
  const Figures* zero =
      s.Find([](const Figures& f) { return f.strategy == "data" && f.zero == 1; });
  const Figures* plain =
      s.Find([](const Figures& f) { return f.strategy == "data" && f.zero == 0 && f.workers > 1; });
  if (zero == nullptr || plain == nullptr || zero->optimizer_bytes <= 0) return "";
  return absl::StrFormat(
      "ZeRO-1: %s of optimizer state on its largest rank against %s's %s (%s less, each rank "
      "keeping 1/%d of it); peak memory per rank %s against %s, at %s its speed.",
      Bytes(zero->optimizer_bytes), plain->label, Bytes(plain->optimizer_bytes),
      Ratio(Share(plain->optimizer_bytes, zero->optimizer_bytes)), zero->replicas,
      Bytes(zero->peak_bytes), Bytes(plain->peak_bytes),
      Ratio(Share(zero->tokens_per_second, plain->tokens_per_second)));
}

// Loss parity against one worker; "" without a baseline or a run.
std::string LossLine(const Standing& s) {
  if (s.base == nullptr || s.runs.empty()) return "";
  std::vector<std::string> off;
  double worst = 0;
  int steps = 0;
  for (const Figures* f : s.runs) {
    if (s.OffParity(*f))
      off.push_back(absl::StrFormat("%s (%.2g)", f->label, f->max_loss_deviation));
    if (std::isfinite(f->max_loss_deviation)) worst = std::max(worst, f->max_loss_deviation);
    steps = std::max(steps, f->steps);
  }
  if (!off.empty()) {
    return absl::StrCat(
        "Losses differ from one worker's beyond ", absl::StrFormat("%g", kLossTolerance),
        " relative: ", absl::StrJoin(off, ", "), "; check parity before trusting these numbers.");
  }
  if (worst == 0) {
    return absl::StrFormat(
        "Losses: every strategy matches one worker's exactly at every one of %d steps.", steps);
  }
  return absl::StrFormat(
      "Losses: every strategy within %.2g of one worker's at every one of %d steps.", worst, steps);
}

// Each run's last validation loss; "" where no run evaluated one.
std::string ValidationLine(const std::vector<Figures>& all) {
  std::vector<std::string> runs;
  for (const Figures& f : all) {
    if (f.ran && f.final_val_step > 0) {
      runs.push_back(absl::StrFormat("%s %.4f (after step %d)", f.label, f.final_val_loss,
                                     f.final_val_step));
    }
  }
  if (runs.empty()) return "";
  return absl::StrCat("Final validation loss: ", absl::StrJoin(runs, ", "), ".");
}

std::string NoisyLine(const std::vector<Figures>& all) {
  std::vector<std::string> noisy;
  for (const Figures& f : all) {
    if (f.ran && f.step_variation > kNoisy) {
      noisy.push_back(absl::StrFormat("%s %s", f.label, Percent(f.step_variation)));
    }
  }
  if (noisy.empty()) return "";
  return absl::StrCat("Noisy timings: step times varied around their mean (",
                      absl::StrJoin(noisy, ", "),
                      "), as when other work shares the host; rerun before trusting a close "
                      "ranking.");
}

// What sharing the host's `host_cores` cores means for the figures; "" when they did not.
std::string HostLine(const Standing& s, int host_cores) {
  int workers = 0;
  for (const Figures* f : s.runs) workers = std::max(workers, f->workers);
  if (host_cores <= 0 || workers <= host_cores) return "";
  return absl::StrFormat(
      "Host: %d workers shared %d CPU cores, so workers also waited for a core; the "
      "speed-ups measure the runtime's overheads more than scaling. One device per worker "
      "gives scaling figures.",
      workers, host_cores);
}

}  // namespace

std::vector<std::string> Recommend(std::vector<Figures>* figures, int host_cores) {
  const Standing s = RankRuns(*figures);
  for (Figures& f : *figures) f.recommendation = RunRecommendation(f, s);
  std::vector<std::string> summary = RankingLines(s);
  for (const std::string& line :
       {ZeroLine(s), LossLine(s), ValidationLine(*figures), NoisyLine(*figures),
        HostLine(s, host_cores)}) {
    if (!line.empty()) summary.push_back(line);
  }
  for (const Figures& f : *figures) {
    if (!f.ran) summary.push_back(absl::StrCat(f.label, " could not run: ", FirstLine(f.error)));
  }
  return summary;
}

// ---- timelines ----

int TimelineStep(const RunData& run) {
  const int steps = run.ranks.empty() ? 0 : static_cast<int>(run.ranks[0].size());
  return steps >= 2 ? steps - 2 : 0;
}

std::string TimelineCaption(const RunData& run) {
  const ProcessGrid& grid = run.grid;
  if (grid.tensors > 1) {
    return absl::StrFormat(
        "Tensor parallelism over %d neighbouring ranks (%d replica%s x %d stage%s); rows are "
        "rank (replica, tensor rank, stage). Each layer's forward and backward all-reduce their "
        "partial outputs and input gradients over the tensor-parallel group, inside the compute "
        "spans (the stream waits for them between matmuls).",
        grid.tensors, grid.replicas, grid.replicas == 1 ? "" : "s", grid.stages,
        grid.stages == 1 ? "" : "s");
  }
  const bool zero = run.zero == 1;
  // ZeRO-1 reduce-scatters the gradients (each rank keeps its shard's), then all-gathers the
  // parameters each rank updated.
  const std::string reduce = zero ? "reduce-scatter" : "all-reduce";
  const std::string zero_note =
      zero ? absl::StrFormat(
                 " ZeRO-1: each rank keeps 1/%d of the optimizer state and updates its shard of "
                 "the parameters, so the gradients are reduce-scattered instead of all-reduced, "
                 "and after the optimizer each rank waits (red) for the all-gather of the "
                 "parameters its peers updated.",
                 grid.replicas)
           : "";
  if (run.strategy == "data" && run.workers > 1) {
    const int64_t grads =
        run.ranks.empty() || run.ranks[0].empty() ? 0 : run.ranks[0].back().grad_bytes;
    if (!run.overlap) {
      return absl::StrFormat("With --no-overlap every gradient %s starts after backward.%s", reduce,
                             zero_note);
    }
    if (grads > 0 && grads <= run.bucket_mb * (1 << 20)) {
      return absl::StrFormat(
          "The gradients (%s) fit in one bucket of --bucket-mb=%g, so their %s can only start "
          "when backward ends; with buckets smaller than the gradients, the communication lane "
          "shows %ss running while backward still computes.%s",
          Bytes(grads), run.bucket_mb, reduce, reduce, zero_note);
    }
    return absl::StrFormat(
        "Gradient buckets are %s as backward produces them: the communication lanes show %ss "
        "running while backward still computes; red is what is left to wait for after "
        "backward.%s",
        zero ? "reduce-scattered" : "all-reduced", reduce, zero_note);
  }
  if (run.strategy == "model" && !grid.hybrid()) {
    return "One batch through the stages in turn: each stage waits (grey) while the others "
           "compute.";
  }
  const std::string schedule = ScheduleName(run.schedule);
  if (grid.hybrid()) {
    const std::string flow = run.strategy == "model"
                                 ? "each replica's batch through its stages in turn"
                                 : absl::StrFormat("%d micro-batches per replica, %s schedule",
                                                   run.micro_batches, schedule);
    return absl::StrFormat(
               "%d replicas of a %d-stage pipeline, %s; rows are rank (replica, stage), a "
               "stage's replicas on neighbouring ranks. Grey is the bubble, a stage waiting "
               "for its neighbour's activations or gradients; the communication lane shows "
               "each stage's gradients %s among its %d replicas during its last backward.",
               grid.replicas, grid.stages, flow, zero ? "reduce-scattered" : "all-reduced",
               grid.replicas) +
           zero_note;
  }
  if (run.strategy == "pipeline") {
    return absl::StrFormat(
        "%d micro-batches through %d stages, %s schedule: grey is the bubble, a stage waiting "
        "for its neighbour's activations or gradients.",
        run.micro_batches, run.workers, schedule);
  }
  return "";
}

namespace {

// Where each step of a rank's trace ends: its "reduce loss" wait (the all-reduce of the loss
// ends every step) or, when later, the "optimizer" spans after it (ZeRO-1 has two, around its
// all-gather). Other optimizer-category spans ("gradient norm") come before the loss.
std::vector<double> StepEnds(const launcher::RankTrace& t) {
  std::vector<const TraceEvent*> lane;
  for (const TraceEvent& e : t.events) {
    if (e.thread == 0) lane.push_back(&e);
  }
  std::stable_sort(lane.begin(), lane.end(), [](const TraceEvent* a, const TraceEvent* b) {
    return a->start_us < b->start_us;
  });
  std::vector<double> ends;
  for (const TraceEvent* e : lane) {
    const double end = e->start_us + e->duration_us;
    if (e->name == "reduce loss") {
      ends.push_back(end);
    } else if (e->name == "optimizer" && !ends.empty()) {
      ends.back() = std::max(ends.back(), end);
    }
  }
  return ends;
}

}  // namespace

absl::StatusOr<GanttSpec> StepTimeline(const RunData& run, int step, const std::string& title) {
  if (run.traces.empty()) {
    return absl::NotFoundError(absl::StrCat(run.dir, ": no traces (run without --profile)"));
  }
  struct Window {
    double start = 0, end = 0;
  };
  std::vector<Window> windows;
  for (const launcher::RankTrace& t : run.traces) {
    const std::vector<double> ends = StepEnds(t);
    if (static_cast<int>(ends.size()) <= step) {
      return absl::NotFoundError(absl::StrFormat("%s: rank %d's trace has %d steps, not %d",
                                                 run.dir, t.rank, ends.size(), step + 1));
    }
    Window w;
    w.start = step > 0 ? ends[step - 1] : (t.events.empty() ? 0 : t.events.front().start_us);
    w.end = ends[step];
    windows.push_back(w);
  }
  double t0 = windows[0].start, t1 = windows[0].end;
  for (const Window& w : windows) {
    t0 = std::min(t0, w.start);
    t1 = std::max(t1, w.end);
  }
  GanttSpec g;
  g.title = title;
  g.end_ms = (t1 - t0) / 1e3;
  for (size_t r = 0; r < run.traces.size(); ++r) {
    const launcher::RankTrace& t = run.traces[r];
    const Window& w = windows[r];
    const ProcessGrid& grid = run.grid;
    g.rows.push_back(grid.tensors > 1
                         ? absl::StrFormat("rank %d (%d, %d, %d)", t.rank, grid.ReplicaOf(t.rank),
                                           grid.TensorOf(t.rank), grid.StageOf(t.rank))
                     : grid.hybrid()
                         ? absl::StrFormat("rank %d (%d, %d)", t.rank, grid.ReplicaOf(t.rank),
                                           grid.StageOf(t.rank))
                         : absl::StrCat("rank ", t.rank));
    for (const TraceEvent& e : t.events) {
      const double s = e.start_us, end = e.start_us + e.duration_us;
      const bool comm = e.thread != 0;
      // Compute-lane spans belong to the step they start in; communication overlapping the
      // step is shown clipped to it.
      const bool in = comm ? (end > w.start && s < w.end) : (s >= w.start - 1 && s < w.end);
      if (!in) continue;
      GanttSpan span;
      span.row = static_cast<int>(r);
      span.comm_lane = comm;
      span.start_ms = (std::max(s, w.start) - t0) / 1e3;
      span.end_ms = (std::min(end, w.end) - t0) / 1e3;
      span.kind = KindOf(e, run.grid.stages);
      if ((span.kind == SpanKind::kForward || span.kind == SpanKind::kBackward) &&
          e.micro_batch >= 0) {
        span.text = absl::StrCat(e.micro_batch);
      }
      span.tooltip = absl::StrFormat("rank %d: %s, %.2f ms at %.2f ms", t.rank, e.name,
                                     e.duration_us / 1e3, (s - t0) / 1e3);
      g.spans.push_back(std::move(span));
    }
  }
  return g;
}

// ---- the report ----

Report BuildReport(std::vector<Entry> entries, int gpus, int host_cores, const std::string& command,
                   const std::string& created) {
  Report r;
  r.gpus = gpus;
  r.host_cores = host_cores;
  r.command = command;
  r.created = created;
  r.entries = std::move(entries);
  for (const Entry& e : r.entries) {
    if (!e.ran) continue;
    r.model = e.run.model;
    r.device = e.run.device;
    r.batch = e.run.batch;
    r.steps = e.run.steps;
    r.seed = e.run.seed;
    break;
  }
  const Entry* base =
      !r.entries.empty() && r.entries[0].name == "baseline" ? &r.entries[0] : nullptr;
  for (const Entry& e : r.entries) r.figures.push_back(ComputeFigures(e, base));
  r.summary = Recommend(&r.figures, host_cores);

  // Throughput.
  BarChartSpec tp;
  tp.title = "Throughput (tokens/s, higher is better)";
  tp.unit = "tokens/s";
  for (const Figures& f : r.figures) {
    if (!f.ran) continue;
    Bar b;
    b.label = f.label;
    b.value = f.tokens_per_second;
    b.color = StrategyColor(f.name);
    b.value_text =
        std::isfinite(f.speedup) && f.name != "baseline"
            ? absl::StrFormat("%s (%s)", Thousands(f.tokens_per_second), Ratio(f.speedup))
            : Thousands(f.tokens_per_second);
    tp.bars.push_back(b);
  }
  r.charts.push_back({"throughput.svg", tp.title, BarChartSvg(tp)});

  // Step time per rank.
  StackedBarChartSpec st;
  st.title = "Step time per rank (mean per step)";
  st.unit = "ms";
  st.series = {{"compute", SpanKindColor(SpanKind::kBackward)},
               {"exposed communication", SpanKindColor(SpanKind::kExposedComm)},
               {"pipeline bubble", SpanKindColor(SpanKind::kBubble)},
               {"optimizer", SpanKindColor(SpanKind::kOptimizer)},
               {"other", "#e9d8a6"}};
  // Memory per rank.
  StackedBarChartSpec mem;
  mem.title = "Peak memory per rank";
  mem.unit = "MB";
  mem.series = {{"parameters", "#4e79a7"},
                {"gradients", "#f28e2b"},
                {"optimizer state", "#59a14f"},
                {"activations and workspace", "#b07aa1"}};
  for (const Figures& f : r.figures) {
    if (!f.ran) continue;
    BarGroup tg, mg;
    tg.label = mg.label = f.label;
    for (const RankFigures& rf : f.ranks) {
      const std::string label = absl::StrCat("r", rf.rank);
      tg.bars.push_back(
          {label,
           {rf.compute_seconds * 1e3, rf.exposed_comm_seconds * 1e3, rf.bubble_seconds * 1e3,
            rf.optimizer_seconds * 1e3, rf.other_seconds * 1e3}});
      const double mb = 1 << 20;
      mg.bars.push_back({label,
                         {rf.param_bytes / mb, rf.grad_bytes / mb, rf.optimizer_bytes / mb,
                          rf.activation_bytes / mb}});
    }
    st.groups.push_back(tg);
    mem.groups.push_back(mg);
  }
  r.charts.push_back({"step-time.svg", st.title, StackedBarChartSvg(st)});
  r.charts.push_back({"memory.svg", mem.title, StackedBarChartSvg(mem)});

  // One step per strategy, as measured.
  for (const Entry& e : r.entries) {
    if (!e.ran) continue;
    const int step = TimelineStep(e.run);
    const std::string title =
        absl::StrFormat("%s: step %d of %d, per rank (%d micro-batch%s)", e.label, step + 1,
                        static_cast<int>(e.run.ranks[0].size()), e.run.micro_batches,
                        e.run.micro_batches == 1 ? "" : "es");
    absl::StatusOr<GanttSpec> g = StepTimeline(e.run, step, title);
    if (!g.ok()) {
      r.notes.push_back(absl::StrCat("No timeline for ", e.label, ": ", g.status().message()));
      continue;
    }
    r.timelines.push_back(
        {absl::StrCat("timeline-", e.name, ".svg"), title, GanttSvg(*g), TimelineCaption(e.run)});
  }
  return r;
}

}  // namespace tools
}  // namespace tandem
