// The comparison report: reading run directories, the figures and rules behind the
// recommendations, the step timelines cut from the merged traces, and the three writers.
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

// A rank's metrics, one record per step; unlike the launcher's live view, a missing file or
// a line that does not parse is an error here.
absl::StatusOr<std::vector<StepMetrics>> ReadMetrics(const std::string& path) {
  if (!PathExists(path)) return absl::NotFoundError(absl::StrFormat("cannot read %s", path));
  std::vector<std::string> errors;
  std::vector<StepMetrics> out = launcher::ReadMetricsFile(path, &errors);
  if (!errors.empty()) return absl::InvalidArgumentError(errors.front());
  return out;
}

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

std::string HtmlEscape(absl::string_view s) { return XmlEscape(s); }

// Markdown table cells: no pipes or newlines.
std::string Cell(absl::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out.push_back(c);
  }
  return out;
}

std::string LossDeviation(const Figures& f) {
  if (!std::isfinite(f.max_loss_deviation)) return "-";
  return absl::StrFormat("%.2g", f.max_loss_deviation);
}

// D x K from run.json's "replicas" and "stages"; a run.json from before them had data
// parallel's D = workers, the others' --data-parallel (1 then).
absl::Status ReadGrid(const Json& run, RunData* d) {
  const int fallback = d->strategy == "data" ? d->workers : d->data_parallel;
  d->grid.replicas = static_cast<int>(NumberOr(run, "replicas", fallback));
  d->grid.stages = static_cast<int>(NumberOr(run, "stages", d->workers / std::max(1, fallback)));
  if (d->grid.replicas < 1 || d->grid.stages < 1 || d->grid.ranks() != d->workers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s/run.json: %d replicas x %d stages is not its %d workers", d->dir,
                        d->grid.replicas, d->grid.stages, d->workers));
  }
  return absl::OkStatus();
}

// Each rank's optimizer state as run.json gives it ("optimizer_state_bytes" per rank), else
// the largest its metrics lines give.
void ReadOptimizerState(const Json& run, RunData* d) {
  d->optimizer_state_bytes.assign(d->ranks.size(), 0);
  for (size_t r = 0; r < d->ranks.size(); ++r) {
    for (const StepMetrics& s : d->ranks[r]) {
      d->optimizer_state_bytes[r] = std::max(d->optimizer_state_bytes[r], s.optimizer_bytes);
    }
  }
  const auto ranks = run.find("ranks");
  if (ranks == run.end() || !ranks->is_array()) return;
  for (const Json& k : *ranks) {
    const int r = static_cast<int>(NumberOr(k, "rank", -1));
    if (r < 0 || r >= static_cast<int>(d->ranks.size()) || !k.contains("optimizer_state_bytes")) {
      continue;
    }
    d->optimizer_state_bytes[r] = static_cast<int64_t>(NumberOr(k, "optimizer_state_bytes", 0));
  }
}

}  // namespace

// ---- formats ----

std::string Bytes(int64_t b) {
  if (b < 0) return "-";
  const double kb = static_cast<double>(b) / 1024, mb = kb / 1024, gb = mb / 1024;
  if (gb >= 1) return absl::StrFormat("%.2f GB", gb);
  if (mb >= 100) return absl::StrFormat("%.0f MB", mb);
  if (mb >= 1) return absl::StrFormat("%.1f MB", mb);
  return absl::StrFormat("%.0f KB", kb);
}

std::string Thousands(double v) { return launcher::FormatThousands(v); }

std::string Ratio(double v) {
  if (!std::isfinite(v)) return "-";
  return absl::StrFormat(v >= 10 ? "%.0fx" : "%.2fx", v);
}

std::string Percent(double v) {
  if (!std::isfinite(v)) return "-";
  return absl::StrFormat("%.0f%%", 100 * v);
}

std::string Millis(double seconds) {
  if (!std::isfinite(seconds)) return "-";
  const double ms = seconds * 1e3;
  return absl::StrFormat(ms >= 100 ? "%.0f ms" : ms >= 10 ? "%.1f ms" : "%.2f ms", ms);
}

// ---- reading ----

absl::StatusOr<RunData> ReadRun(const std::string& dir) {
  absl::StatusOr<Json> run = ReadJsonFile(dir + "/run.json");
  if (!run.ok()) return run.status();
  if (!run->is_object()) return absl::InvalidArgumentError(dir + "/run.json: not an object");
  RunData d;
  d.dir = dir;
  const Json c = run->value("config", Json::object());
  d.strategy = StringOr(*run, "strategy", StringOr(c, "strategy", ""));
  d.schedule = StringOr(c, "schedule", "");
  d.data_parallel = static_cast<int>(NumberOr(c, "data_parallel", 1));
  d.zero = static_cast<int>(NumberOr(c, "zero", 0));
  d.model = StringOr(c, "model", "");
  d.seed = StringOr(c, "seed", "");
  d.device = StringOr(*run, "device", StringOr(c, "device", ""));
  d.exit = StringOr(*run, "exit", "ok");
  d.workers = static_cast<int>(NumberOr(*run, "workers", NumberOr(c, "workers", 0)));
  d.batch = static_cast<int>(NumberOr(c, "batch", 0));
  d.steps = static_cast<int>(NumberOr(c, "steps", 0));
  d.micro_batches = static_cast<int>(NumberOr(*run, "micro_batches", 1));
  d.bucket_mb = NumberOr(c, "bucket_mb", 25);
  d.overlap = NumberOr(c, "overlap", 1) != 0;
  d.tokens_per_step = static_cast<int64_t>(NumberOr(*run, "tokens_per_step", 0));
  if (const auto l = run->find("losses"); l != run->end() && l->is_array()) {
    // null: a step without a loss (nan or infinite).
    for (const Json& v : *l) d.losses.push_back(v.is_number() ? v.get<double>() : kNaN);
  }
  if (const auto l = run->find("val_losses"); l != run->end() && l->is_array()) {
    for (const Json& v : *l) {
      if (!v.is_array() || v.size() != 2 || !v[0].is_number()) continue;
      d.val_losses.push_back({v[0].get<int>(), v[1].is_number() ? v[1].get<double>() : kNaN});
    }
  }
  if (d.workers < 1) return absl::InvalidArgumentError(dir + "/run.json: no workers");
  if (absl::Status s = ReadGrid(*run, &d); !s.ok()) return s;
  for (int r = 0; r < d.workers; ++r) {
    absl::StatusOr<std::vector<StepMetrics>> m = ReadMetrics(MetricsPath(dir, r));
    if (!m.ok()) return m.status();
    d.ranks.push_back(std::move(*m));
  }
  ReadOptimizerState(*run, &d);
  if (d.losses.empty()) {
    for (const StepMetrics& s : d.ranks[0]) d.losses.push_back(s.loss);
  }
  if (PathExists(dir + "/traces/rank-0.json")) {
    absl::StatusOr<std::vector<launcher::RankTrace>> traces =
        launcher::ReadAlignedTraces(dir, d.workers);
    if (!traces.ok()) return traces.status();
    d.traces = std::move(*traces);
  }
  return d;
}

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
      rf.bubble_seconds += steps[i].bubble / n;
      rf.optimizer_seconds += steps[i].optimizer / n;
    }
    rf.other_seconds =
        std::max(0.0, rf.step_seconds - rf.compute_seconds - rf.exposed_comm_seconds -
                          rf.bubble_seconds - rf.optimizer_seconds);
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
  return absl::StrFormat("%d x %d%s", f.replicas, f.stages, f.zero == 1 ? ", ZeRO-1" : "");
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
  return a.strategy == b.strategy && a.replicas == b.replicas && a.stages == b.stages;
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
    g.rows.push_back(run.grid.hybrid()
                         ? absl::StrFormat("rank %d (%d, %d)", t.rank, run.grid.ReplicaOf(t.rank),
                                           run.grid.StageOf(t.rank))
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

namespace {

std::string Intro(const Report& r) {
  if (r.model.empty()) return "No run completed; each run's message is below.";
  return absl::StrFormat(
      "Model %s on %s, global batch %d, %d steps, seed %s; every strategy on %d workers, the "
      "baseline on one; host with %d cores. %s",
      r.model, r.device.empty() ? "-" : r.device, r.batch, r.steps, r.seed.empty() ? "-" : r.seed,
      r.gpus, r.host_cores,
      launcher::WarmupStepsOf(r.steps) > 0
          ? absl::StrFormat("Throughput and per-step means leave out the first %d steps "
                            "(warm-up).",
                            launcher::WarmupStepsOf(r.steps))
          : "With so few steps, throughput and per-step means count every step, the first "
            "(warm-up) too.");
}

constexpr char kMeasured[] =
    "Every number comes from the workers' own measurements: per-step metrics lines (step time; "
    "compute = forward and backward; exposed communication = waiting for all-reduces of "
    "gradients and of the loss; pipeline bubble = waiting for a neighbouring stage's "
    "activations or gradients) and the profiler's trace events, which the timelines draw "
    "unchanged. Tokens/s = global batch x sequence length / step time, the step time being "
    "the slowest rank's. Speed-up = tokens/s / the one-worker baseline's; scaling efficiency = "
    "speed-up / workers. Memory per rank: the allocator's peak; parameters, gradients and "
    "optimizer state as the worker counts them; activations (with workspace) = peak - those "
    "three. The step's last wait, for the all-reduce of the loss, counts as exposed "
    "communication: in model and pipeline parallel it is where later stages wait for the first "
    "stage's backward. Loss deviation = the largest |loss - baseline loss| over the steps. Ranks' "
    "trace "
    "clocks are aligned on the all-reduce of the loss that ends every step.";

constexpr char kResultsNote[] =
    "The step column is the slowest rank's mean step (throughput's); compute, exposed "
    "communication and bubble are means over the ranks; the tables below give each rank. "
    "Layout: D data-parallel replicas x K pipeline stages (data parallel is D x 1, model "
    "parallel and a pipeline 1 x K; a rank's place is (replica, stage), rank = stage x D + "
    "replica); ZeRO-1 shards the optimizer state over the D replicas. Optimizer state: the "
    "bytes the largest rank keeps, as each run measured it.";

std::string ResultsHeader() {
  return "| strategy | workers | layout (D x K) | micro-batches | tokens/s | speed-up | "
         "scaling efficiency | step | compute | exposed comm | bubble | peak memory (largest "
         "rank) | optimizer state (largest rank) | final loss | max loss deviation | "
         "recommendation |\n"
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
         "---: | ---: | ---: | --- |\n";
}

// The results table's cells between the strategy and the recommendation.
std::vector<std::string> ResultCells(const Figures& f) {
  return {absl::StrCat(f.workers),
          Layout(f),
          absl::StrCat(f.micro_batches),
          Thousands(f.tokens_per_second),
          Ratio(f.speedup),
          Percent(f.efficiency),
          Millis(f.step_seconds),
          Millis(f.compute_seconds),
          Millis(f.exposed_comm_seconds),
          Millis(f.bubble_seconds),
          Bytes(f.peak_bytes),
          Bytes(f.optimizer_bytes),
          absl::StrFormat("%.4f", f.final_loss),
          LossDeviation(f)};
}

// The per-rank table's cells after the strategy: the rank, its (replica, stage), its figures.
std::vector<std::string> RankCells(const RankFigures& rf) {
  return {absl::StrCat(rf.rank),
          absl::StrFormat("(%d, %d)", rf.replica, rf.stage),
          Millis(rf.step_seconds),
          Millis(rf.compute_seconds),
          Millis(rf.exposed_comm_seconds),
          Millis(rf.bubble_seconds),
          Millis(rf.optimizer_seconds),
          Millis(rf.other_seconds),
          Bytes(rf.peak_bytes),
          Bytes(rf.param_bytes),
          Bytes(rf.grad_bytes),
          Bytes(rf.optimizer_bytes),
          Bytes(rf.activation_bytes)};
}

// Bullets, and a blank line after them; "" for none.
std::string MarkdownList(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& n : items) absl::StrAppend(&out, "- ", n, "\n");
  return items.empty() ? out : out + "\n";
}

std::string HtmlList(const std::vector<std::string>& items) {
  if (items.empty()) return "";
  std::string out = "<ul>\n";
  for (const std::string& n : items) absl::StrAppend(&out, "<li>", HtmlEscape(n), "</li>\n");
  return out + "</ul>\n";
}

// A markdown table row.
std::string MarkdownRow(const std::vector<std::string>& cells) {
  std::string out = "|";
  for (const std::string& c : cells) absl::StrAppend(&out, " ", Cell(c), " |");
  return out + "\n";
}

// An HTML table row of `css` class: the first cell as text, the others right-aligned numbers.
std::string HtmlRow(const std::string& css, const std::string& first,
                    const std::vector<std::string>& numbers) {
  std::string out = absl::StrFormat("<tr class=\"%s\"><td>%s</td>", css, HtmlEscape(first));
  for (const std::string& v : numbers) {
    absl::StrAppend(&out, "<td class=\"n\">", HtmlEscape(v), "</td>");
  }
  return out + "</tr>\n";
}

}  // namespace

std::string ReportTitle(const Report& r) {
  if (r.model.empty()) {
    return absl::StrFormat("Strategy comparison on %d workers: no run completed", r.gpus);
  }
  return absl::StrFormat("Strategy comparison: %s on %d workers", r.model, r.gpus);
}

std::string MarkdownReport(const Report& r) {
  std::string out = absl::StrCat("# ", ReportTitle(r), "\n\n");
  if (!r.created.empty()) absl::StrAppend(&out, "Made ", r.created);
  if (!r.command.empty()) absl::StrAppend(&out, " by `", r.command, "`");
  if (!r.created.empty() || !r.command.empty()) out += ".\n\n";
  absl::StrAppend(&out, Intro(r), "\n\n## Recommendation\n\n");
  for (const std::string& s : r.summary) absl::StrAppend(&out, "- ", s, "\n");
  absl::StrAppend(&out, "\n## Results\n\n", ResultsHeader());
  for (const Figures& f : r.figures) {
    std::vector<std::string> cells = {f.label};
    for (const std::string& c : ResultCells(f)) cells.push_back(f.ran ? c : "-");
    cells.push_back(f.recommendation);
    out += MarkdownRow(cells);
  }
  absl::StrAppend(&out, "\n", kResultsNote, "\n\n");
  out += MarkdownList(r.run_notes);
  for (const Chart& c : r.charts) absl::StrAppendFormat(&out, "![%s](%s)\n\n", c.title, c.file);
  out +=
      "## One training step, per rank\n\n"
      "Drawn from the trace events the workers recorded: a row per rank (forward and backward "
      "per micro-batch, waits) and below it the rank's communication lane (collectives and "
      "transfers while they run).\n\n";
  for (const Chart& c : r.timelines) {
    absl::StrAppendFormat(&out, "![%s](%s)\n\n", c.title, c.file);
    if (!c.caption.empty()) absl::StrAppend(&out, "*", c.caption, "*\n\n");
  }
  out += MarkdownList(r.notes);
  out +=
      "## Per rank\n\n"
      "| strategy | rank | (replica, stage) | step | compute | exposed comm | bubble | optimizer "
      "| other | peak memory | parameters | gradients | optimizer state | activations |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
      "| ---: |\n";
  for (const Figures& f : r.figures) {
    for (const RankFigures& rf : f.ranks) {
      std::vector<std::string> cells = {f.label};
      for (std::string& c : RankCells(rf)) cells.push_back(std::move(c));
      out += MarkdownRow(cells);
    }
  }
  out += "\n## Runs\n\n";
  for (const Entry& e : r.entries) {
    if (e.ran) {
      const std::string trace = e.run.dir + "/trace.json";
      absl::StrAppendFormat(&out, "- %s: `%s` (%s)%s\n", e.label, e.run.dir, e.run.exit,
                            PathExists(trace) ? absl::StrCat(", merged trace `", trace, "`") : "");
    } else {
      absl::StrAppendFormat(&out, "- %s: could not run:\n\n  ```\n", e.label);
      for (absl::string_view l : absl::StrSplit(absl::StripAsciiWhitespace(e.error), '\n')) {
        absl::StrAppend(&out, "  ", l, "\n");
      }
      out += "  ```\n";
    }
  }
  absl::StrAppend(&out, "\n## How these figures are measured\n\n", kMeasured, "\n");
  return out;
}

std::string JsonReport(const Report& r) {
  Json j;
  j["model"] = r.model;
  j["device"] = r.device;
  j["gpus"] = r.gpus;
  j["batch"] = r.batch;
  j["steps"] = r.steps;
  j["seed"] = r.seed;
  j["host_cores"] = r.host_cores;
  j["warmup_steps_excluded"] = launcher::WarmupStepsOf(r.steps);
  j["command"] = r.command;
  j["created"] = r.created;
  j["summary"] = r.summary;
  Json strategies = Json::array();
  for (size_t i = 0; i < r.figures.size(); ++i) {
    const Figures& f = r.figures[i];
    const Entry& e = r.entries[i];
    Json s;
    s["name"] = f.name;
    s["label"] = f.label;
    s["ran"] = f.ran;
    if (!f.ran) s["error"] = f.error;
    s["recommendation"] = f.recommendation;
    if (f.ran) {
      s["run_dir"] = e.run.dir;
      s["strategy"] = e.run.strategy;
      s["schedule"] = e.run.strategy == "pipeline" ? e.run.schedule : "";
      s["exit"] = e.run.exit;
      s["workers"] = f.workers;
      s["replicas"] = f.replicas;
      s["stages"] = f.stages;
      s["zero"] = f.zero;
      s["micro_batches"] = f.micro_batches;
      s["steps_completed"] = f.steps;
      s["tokens_per_second"] = JsonNumber(f.tokens_per_second);
      s["speedup"] = JsonNumber(f.speedup);
      s["scaling_efficiency"] = JsonNumber(f.efficiency);
      s["step_seconds"] = JsonNumber(f.step_seconds);
      s["step_variation"] = JsonNumber(f.step_variation);
      s["compute_seconds"] = JsonNumber(f.compute_seconds);
      s["exposed_comm_seconds"] = JsonNumber(f.exposed_comm_seconds);
      s["bubble_seconds"] = JsonNumber(f.bubble_seconds);
      s["peak_bytes"] = f.peak_bytes;
      s["activation_bytes"] = f.activation_bytes;
      s["optimizer_state_bytes"] = f.optimizer_bytes;
      s["final_loss"] = JsonNumber(f.final_loss);
      s["max_loss_deviation"] = JsonNumber(f.max_loss_deviation);
      if (f.final_val_step > 0) {
        s["final_val_loss"] = JsonNumber(f.final_val_loss);
        s["final_val_step"] = f.final_val_step;
      }
      Json losses = Json::array();
      for (double l : e.run.losses) losses.push_back(JsonNumber(l));
      s["losses"] = std::move(losses);
      Json ranks = Json::array();
      for (const RankFigures& rf : f.ranks) {
        ranks.push_back({{"rank", rf.rank},
                         {"replica", rf.replica},
                         {"stage", rf.stage},
                         {"step_seconds", JsonNumber(rf.step_seconds)},
                         {"compute_seconds", JsonNumber(rf.compute_seconds)},
                         {"exposed_comm_seconds", JsonNumber(rf.exposed_comm_seconds)},
                         {"bubble_seconds", JsonNumber(rf.bubble_seconds)},
                         {"optimizer_seconds", JsonNumber(rf.optimizer_seconds)},
                         {"other_seconds", JsonNumber(rf.other_seconds)},
                         {"peak_bytes", rf.peak_bytes},
                         {"param_bytes", rf.param_bytes},
                         {"grad_bytes", rf.grad_bytes},
                         {"optimizer_bytes", rf.optimizer_bytes},
                         {"activation_bytes", rf.activation_bytes}});
      }
      s["ranks"] = std::move(ranks);
      for (const Chart& c : r.timelines) {
        if (c.file == absl::StrCat("timeline-", f.name, ".svg")) {
          s["timeline"] = c.file;
          s["timeline_step"] = TimelineStep(e.run);
        }
      }
    }
    strategies.push_back(std::move(s));
  }
  j["strategies"] = std::move(strategies);
  Json charts = Json::array();
  for (const Chart& c : r.charts) charts.push_back(c.file);
  j["charts"] = std::move(charts);
  j["notes"] = r.notes;
  j["run_notes"] = r.run_notes;
  return JsonText(j, JsonLayout::kObjects) + "\n";
}

std::string HtmlReport(const Report& r) {
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  absl::StrAppend(&out, "<title>", HtmlEscape(ReportTitle(r)), "</title>\n");
  out +=
      "<style>\n"
      "body{font-family:Helvetica,Arial,sans-serif;margin:24px auto;max-width:1120px;"
      "color:#222;padding:0 16px}\n"
      "h1{font-size:24px;margin-bottom:4px}h2{font-size:19px;margin-top:32px;"
      "border-bottom:1px solid #ddd;padding-bottom:4px}\n"
      "p.meta{color:#555;font-size:13px}\n"
      "table{border-collapse:collapse;font-size:12.5px;margin:8px 0 16px}\n"
      "th,td{border:1px solid #ddd;padding:4px 7px;vertical-align:top}"
      "th{background:#f3f3f3;text-align:left}\n"
      "td.n{text-align:right;white-space:nowrap}\n"
      "tr.fig td{border-bottom:0}tr.rec td{border-top:0;color:#444;padding-bottom:8px}\n"
      "ul.rec li{margin:4px 0}\n"
      "figcaption{font-size:13px;color:#444;margin-top:4px}\n"
      "figure{margin:12px 0 22px}figure svg{max-width:100%;height:auto;"
      "border:1px solid #eee}\n"
      "pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}\n"
      "</style>\n</head>\n<body>\n";
  absl::StrAppend(&out, "<h1>", HtmlEscape(ReportTitle(r)), "</h1>\n");
  if (!r.created.empty() || !r.command.empty()) {
    absl::StrAppendFormat(
        &out, "<p class=\"meta\">Made %s%s</p>\n", HtmlEscape(r.created),
        r.command.empty() ? "" : absl::StrCat(" by <code>", HtmlEscape(r.command), "</code>"));
  }
  absl::StrAppend(&out, "<p>", HtmlEscape(Intro(r)),
                  "</p>\n<h2>Recommendation</h2>\n<ul class=\"rec\">\n");
  for (const std::string& s : r.summary) absl::StrAppend(&out, "<li>", HtmlEscape(s), "</li>\n");
  out +=
      "</ul>\n<h2>Results</h2>\n<table>\n<tr><th>strategy</th><th>workers</th>"
      "<th>layout (D x K)</th><th>micro-batches</th><th>tokens/s</th><th>speed-up</th>"
      "<th>scaling efficiency</th><th>step</th><th>compute</th><th>exposed comm</th>"
      "<th>bubble</th><th>peak memory (largest rank)</th><th>optimizer state (largest "
      "rank)</th><th>final loss</th><th>max loss deviation</th></tr>\n";
  // Each run's recommendation in a row of its own under its figures, as wide as the table.
  for (const Figures& f : r.figures) {
    const size_t columns = ResultCells(f).size();
    if (f.ran) {
      out += HtmlRow("fig", f.label, ResultCells(f));
      absl::StrAppendFormat(&out, "<tr class=\"rec\"><td></td><td colspan=\"%d\">%s</td></tr>\n",
                            columns, HtmlEscape(f.recommendation));
    } else {
      absl::StrAppendFormat(&out, "<tr><td>%s</td><td colspan=\"%d\">%s</td></tr>\n",
                            HtmlEscape(f.label), columns, HtmlEscape(f.recommendation));
    }
  }
  absl::StrAppend(&out, "</table>\n<p>", HtmlEscape(kResultsNote), "</p>\n");
  out += HtmlList(r.run_notes);
  for (const Chart& c : r.charts) absl::StrAppend(&out, "<figure>\n", c.svg, "</figure>\n");
  out +=
      "<h2>One training step, per rank</h2>\n<p>Drawn from the trace events the "
      "workers recorded: a row per rank (forward and backward per micro-batch, waits) and "
      "below it the rank's communication lane (collectives and transfers while they run). "
      "Hover a rectangle for its event.</p>\n";
  for (const Chart& c : r.timelines) {
    absl::StrAppend(&out, "<figure>\n", c.svg);
    if (!c.caption.empty())
      absl::StrAppend(&out, "<figcaption>", HtmlEscape(c.caption), "</figcaption>\n");
    out += "</figure>\n";
  }
  out += HtmlList(r.notes);
  out +=
      "<h2>Per rank</h2>\n<table>\n<tr><th>strategy</th><th>rank</th>"
      "<th>(replica, stage)</th><th>step</th>"
      "<th>compute</th><th>exposed comm</th><th>bubble</th><th>optimizer</th><th>other</th>"
      "<th>peak memory</th><th>parameters</th><th>gradients</th><th>optimizer state</th>"
      "<th>activations</th></tr>\n";
  for (const Figures& f : r.figures) {
    for (const RankFigures& rf : f.ranks) {
      out += HtmlRow("rank", f.label, RankCells(rf));
    }
  }
  out += "</table>\n<h2>Runs</h2>\n<ul>\n";
  for (const Entry& e : r.entries) {
    if (e.ran) {
      const std::string trace = e.run.dir + "/trace.json";
      absl::StrAppendFormat(
          &out, "<li>%s: <code>%s</code> (%s)%s</li>\n", HtmlEscape(e.label), HtmlEscape(e.run.dir),
          HtmlEscape(e.run.exit),
          PathExists(trace) ? absl::StrCat(", merged trace <code>", HtmlEscape(trace), "</code>")
                            : "");
    } else {
      absl::StrAppendFormat(&out, "<li>%s: could not run<pre>%s</pre></li>\n", HtmlEscape(e.label),
                            HtmlEscape(absl::StripAsciiWhitespace(e.error)));
    }
  }
  absl::StrAppend(&out, "</ul>\n<h2>How these figures are measured</h2>\n<p>",
                  HtmlEscape(kMeasured), "</p>\n</body>\n</html>\n");
  return out;
}

absl::Status WriteReport(const Report& r, const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> files = {
      {"report.md", MarkdownReport(r)},
      {"report.json", JsonReport(r)},
      {"report.html", HtmlReport(r)},
  };
  for (const Chart& c : r.charts) files.push_back({c.file, c.svg});
  for (const Chart& c : r.timelines) files.push_back({c.file, c.svg});
  for (const auto& [name, content] : files) {
    absl::Status s = WriteFileAtomically(absl::StrCat(dir, "/", name), content);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tools
}  // namespace tandem
