// The comparison report: reading run directories, the figures and rules behind the
// recommendations, the step timelines cut from the merged traces, and the three writers.
#include "tools/report.h"

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
#include "launcher/report.h"
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

std::string StrategyColor(const std::string& name) {
  if (name == "baseline") return "#8c8c8c";
  if (name == "data") return "#4e79a7";
  if (name == "model") return "#f28e2b";
  if (name == "gpipe") return "#59a14f";
  if (name == "1f1b") return "#b07aa1";
  return "#76b7b2";
}

double Share(double part, double whole) { return whole > 0 ? part / whole : 0; }

SpanKind KindOf(const TraceEvent& e) {
  if (e.category == "comm") return SpanKind::kComm;
  if (e.category == "optimizer") return SpanKind::kOptimizer;
  if (e.category == "idle") {
    return e.name == "wait for gradients" || e.name == "reduce loss" ? SpanKind::kExposedComm
                                                                     : SpanKind::kBubble;
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
  if (d.workers < 1) return absl::InvalidArgumentError(dir + "/run.json: no workers");
  for (int r = 0; r < d.workers; ++r) {
    absl::StatusOr<std::vector<StepMetrics>> m = ReadMetrics(MetricsPath(dir, r));
    if (!m.ok()) return m.status();
    d.ranks.push_back(std::move(*m));
  }
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
  f.workers = run.workers;
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
    rf.activation_bytes =
        std::max<int64_t>(0, rf.peak_bytes - rf.param_bytes - rf.grad_bytes - rf.optimizer_bytes);
    f.compute_seconds += rf.compute_seconds / run.ranks.size();
    f.exposed_comm_seconds += rf.exposed_comm_seconds / run.ranks.size();
    f.bubble_seconds += rf.bubble_seconds / run.ranks.size();
    f.peak_bytes = std::max(f.peak_bytes, rf.peak_bytes);
    f.activation_bytes = std::max(f.activation_bytes, rf.activation_bytes);
    f.ranks.push_back(rf);
  }
  f.final_loss = run.losses.empty() ? kNaN : run.losses.back();
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

std::vector<std::string> Recommend(std::vector<Figures>* figures, int host_cores) {
  std::vector<Figures>& all = *figures;
  std::vector<std::string> summary;
  const Figures* base = !all.empty() && all[0].name == "baseline" && all[0].ran ? &all[0] : nullptr;
  std::vector<Figures*> cand;
  for (Figures& f : all) {
    if (&f != base && f.ran && f.tokens_per_second > 0) cand.push_back(&f);
  }
  double max_abs_loss = 0;
  if (base != nullptr) max_abs_loss = std::fabs(base->final_loss);
  auto off_parity = [&](const Figures& f) {
    return std::isfinite(f.max_loss_deviation) &&
           f.max_loss_deviation > kLossTolerance * std::max(1.0, max_abs_loss);
  };
  const Figures* fastest = nullptr;
  const Figures* smallest = nullptr;
  for (const Figures* f : cand) {
    if (fastest == nullptr || f->tokens_per_second > fastest->tokens_per_second) fastest = f;
    if (smallest == nullptr || f->peak_bytes < smallest->peak_bytes) smallest = f;
  }
  const Figures* gpipe = nullptr;
  for (const Figures* f : cand) {
    if (f->name == "gpipe") gpipe = f;
  }

  for (Figures& f : all) {
    if (&f == base) {
      f.recommendation = "reference: one worker, the same global batch, seed and steps";
      continue;
    }
    if (!f.ran) {
      f.recommendation = absl::StrCat("could not run: ", FirstLine(f.error));
      continue;
    }
    if (fastest == nullptr) continue;
    std::string verdict, reason;
    const double speed = Share(f.tokens_per_second, fastest->tokens_per_second);
    const double memory = Share(static_cast<double>(fastest->peak_bytes), f.peak_bytes);
    if (&f == fastest) {
      verdict = &f == smallest ? "fastest, and the least memory per rank" : "fastest";
      reason = std::isfinite(f.speedup)
                   ? absl::StrFormat("%s one worker's speed, %s scaling efficiency",
                                     Ratio(f.speedup), Percent(f.efficiency))
                   : absl::StrFormat("%s tokens/s", Thousands(f.tokens_per_second));
    } else if (f.peak_bytes < kMemorySaving * fastest->peak_bytes) {
      verdict = &f == smallest ? "least memory per rank" : "saves memory";
      reason = absl::StrFormat("%s less peak memory per rank than %s (%s vs %s) at %s its speed",
                               Ratio(memory), fastest->label, Bytes(f.peak_bytes),
                               Bytes(fastest->peak_bytes), Ratio(speed));
    } else {
      verdict = "not recommended here";
      reason = absl::StrFormat("%s %s's speed with %s its peak memory per rank", Ratio(speed),
                               fastest->label, Ratio(Share(f.peak_bytes, fastest->peak_bytes)));
    }
    std::vector<std::string> clauses = {reason};
    if (f.name == "1f1b" && gpipe != nullptr && f.activation_bytes > 0) {
      clauses.push_back(
          absl::StrFormat("vs GPipe: %s less activation memory at %s its speed",
                          Ratio(Share(gpipe->activation_bytes, f.activation_bytes)),
                          Ratio(Share(f.tokens_per_second, gpipe->tokens_per_second))));
    }
    const double bubble = Share(f.bubble_seconds, f.step_seconds);
    if (bubble > 0.3 && f.name != "data" && f.name != "baseline") {
      clauses.push_back(absl::StrFormat("the bubble is %s of its step%s", Percent(bubble),
                                        f.name == "model" ? " (pipeline micro-batches fill it)"
                                                          : " (more --micro-batches shrink it)"));
    }
    const double exposed = Share(f.exposed_comm_seconds, f.step_seconds);
    if (exposed > 0.25) {
      clauses.push_back(absl::StrFormat("%s of its step waits for all-reduces", Percent(exposed)));
    }
    if (f.step_variation > kNoisy) {
      clauses.push_back(
          absl::StrFormat("its step times varied %s around their mean", Percent(f.step_variation)));
    }
    if (off_parity(f)) {
      verdict = "check first";
      clauses.insert(clauses.begin(),
                     absl::StrFormat("its losses differ from one worker's by up to %.2g",
                                     f.max_loss_deviation));
    }
    f.recommendation = absl::StrCat(verdict, ": ", absl::StrJoin(clauses, "; "));
  }

  if (fastest == nullptr) {
    summary.push_back("No strategy completed a run; see each strategy's message below.");
  } else {
    const std::string against =
        std::isfinite(fastest->speedup)
            ? absl::StrFormat(", %s one worker (%s scaling efficiency over %d workers)",
                              Ratio(fastest->speedup), Percent(fastest->efficiency),
                              fastest->workers)
            : "";
    summary.push_back(absl::StrFormat("Fastest: %s, %s tokens/s%s.", fastest->label,
                                      Thousands(fastest->tokens_per_second), against));
    const bool saves =
        smallest != fastest && smallest->peak_bytes < kMemorySaving * fastest->peak_bytes;
    if (saves) {
      summary.push_back(absl::StrFormat(
          "Least memory per rank: %s, %s peak on its largest rank, %s less than %s, at %s its "
          "speed.",
          smallest->label, Bytes(smallest->peak_bytes),
          Ratio(Share(fastest->peak_bytes, smallest->peak_bytes)), fastest->label,
          Ratio(Share(smallest->tokens_per_second, fastest->tokens_per_second))));
    } else {
      summary.push_back(absl::StrFormat("Least memory per rank: %s as well (%s peak).",
                                        fastest->label, Bytes(fastest->peak_bytes)));
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
    summary.push_back(choice + ".");
  }
  if (base != nullptr) {
    std::vector<std::string> off;
    double worst = 0;
    int steps = 0;
    for (const Figures* f : cand) {
      if (off_parity(*f)) {
        off.push_back(absl::StrFormat("%s (%.2g)", f->label, f->max_loss_deviation));
      }
      if (std::isfinite(f->max_loss_deviation)) worst = std::max(worst, f->max_loss_deviation);
      steps = std::max(steps, f->steps);
    }
    if (!cand.empty() && off.empty() && worst == 0) {
      summary.push_back(absl::StrFormat(
          "Losses: every strategy matches one worker's exactly at every one of %d steps.", steps));
    } else if (!cand.empty() && off.empty()) {
      summary.push_back(absl::StrFormat(
          "Losses: every strategy within %.2g of one worker's at every one of %d steps.", worst,
          steps));
    } else if (!off.empty()) {
      summary.push_back(absl::StrCat("Losses differ from one worker's beyond ",
                                     absl::StrFormat("%g", kLossTolerance),
                                     " relative: ", absl::StrJoin(off, ", "),
                                     "; check parity before trusting these numbers."));
    }
  }
  std::vector<std::string> noisy;
  for (const Figures& f : all) {
    if (f.ran && f.step_variation > kNoisy) {
      noisy.push_back(absl::StrFormat("%s %s", f.label, Percent(f.step_variation)));
    }
  }
  if (!noisy.empty()) {
    summary.push_back(absl::StrCat(
        "Noisy timings: step times varied around their mean (", absl::StrJoin(noisy, ", "),
        "), as when other work shares the host; rerun before trusting a close ranking."));
  }
  int workers = 0;
  for (const Figures* f : cand) workers = std::max(workers, f->workers);
  if (host_cores > 0 && workers > host_cores) {
    summary.push_back(absl::StrFormat(
        "Host: %d workers shared %d CPU cores, so workers also waited for a core; the "
        "speed-ups measure the runtime's overheads more than scaling. One device per worker "
        "gives scaling figures.",
        workers, host_cores));
  }
  for (const Figures& f : all) {
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
  if (run.strategy == "data" && run.workers > 1) {
    const int64_t grads =
        run.ranks.empty() || run.ranks[0].empty() ? 0 : run.ranks[0].back().grad_bytes;
    if (!run.overlap) return "With --no-overlap every gradient all-reduce starts after backward.";
    if (grads > 0 && grads <= run.bucket_mb * (1 << 20)) {
      return absl::StrFormat(
          "The gradients (%s) fit in one bucket of --bucket-mb=%g, so their all-reduce can "
          "only start when backward ends; with buckets smaller than the gradients, the "
          "communication lane shows all-reduces running while backward still computes.",
          Bytes(grads), run.bucket_mb);
    }
    return "Gradient buckets are all-reduced as backward produces them: the communication "
           "lanes show all-reduces running while backward still computes; red is what is left "
           "to wait for after backward.";
  }
  if (run.strategy == "model") {
    return "One batch through the stages in turn: each stage waits (grey) while the others "
           "compute.";
  }
  if (run.strategy == "pipeline") {
    return absl::StrFormat(
        "%d micro-batches through %d stages, %s schedule: grey is the bubble, a stage waiting "
        "for its neighbour's activations or gradients.",
        run.micro_batches, run.workers, run.schedule == "1f1b" ? "1F1B" : "GPipe");
  }
  return "";
}

absl::StatusOr<GanttSpec> StepTimeline(const RunData& run, int step, const std::string& title) {
  if (run.traces.empty()) {
    return absl::NotFoundError(absl::StrCat(run.dir, ": no traces (run without --profile)"));
  }
  struct Window {
    double start = 0, end = 0;
  };
  std::vector<Window> windows;
  for (const launcher::RankTrace& t : run.traces) {
    std::vector<const TraceEvent*> opt;
    for (const TraceEvent& e : t.events) {
      if (e.thread == 0 && e.category == "optimizer") opt.push_back(&e);
    }
    if (static_cast<int>(opt.size()) <= step) {
      return absl::NotFoundError(
          absl::StrFormat("%s: rank %d's trace has %d optimizer steps, not %d", run.dir, t.rank,
                          opt.size(), step + 1));
    }
    Window w;
    w.start = step > 0 ? opt[step - 1]->start_us + opt[step - 1]->duration_us
                       : (t.events.empty() ? 0 : t.events.front().start_us);
    w.end = opt[step]->start_us + opt[step]->duration_us;
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
    g.rows.push_back(absl::StrCat("rank ", t.rank));
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
      span.kind = KindOf(e);
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

std::string ResultsHeader() {
  return "| strategy | workers | micro-batches | tokens/s | speed-up | scaling efficiency | "
         "step | compute | exposed comm | bubble | peak memory (largest rank) | final loss | "
         "max loss deviation | recommendation |\n"
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
         "---: | --- |\n";
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
    if (!f.ran) {
      absl::StrAppendFormat(&out, "| %s | - | - | - | - | - | - | - | - | - | - | - | - | %s |\n",
                            Cell(f.label), Cell(f.recommendation));
      continue;
    }
    absl::StrAppendFormat(
        &out, "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %.4f | %s | %s |\n",
        Cell(f.label), f.workers, f.micro_batches, Thousands(f.tokens_per_second), Ratio(f.speedup),
        Percent(f.efficiency), Millis(f.step_seconds), Millis(f.compute_seconds),
        Millis(f.exposed_comm_seconds), Millis(f.bubble_seconds), Bytes(f.peak_bytes), f.final_loss,
        LossDeviation(f), Cell(f.recommendation));
  }
  out +=
      "\nThe step column is the slowest rank's mean step (throughput's); compute, exposed "
      "communication and bubble are means over the ranks; the tables below give each rank.\n\n";
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
  for (const std::string& n : r.notes) absl::StrAppend(&out, "- ", n, "\n");
  if (!r.notes.empty()) out += "\n";
  out +=
      "## Per rank\n\n"
      "| strategy | rank | step | compute | exposed comm | bubble | optimizer | other | peak "
      "memory | parameters | gradients | optimizer state | activations |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
      "|\n";
  for (const Figures& f : r.figures) {
    for (const RankFigures& rf : f.ranks) {
      absl::StrAppendFormat(
          &out, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
          Cell(f.label), rf.rank, Millis(rf.step_seconds), Millis(rf.compute_seconds),
          Millis(rf.exposed_comm_seconds), Millis(rf.bubble_seconds), Millis(rf.optimizer_seconds),
          Millis(rf.other_seconds), Bytes(rf.peak_bytes), Bytes(rf.param_bytes),
          Bytes(rf.grad_bytes), Bytes(rf.optimizer_bytes), Bytes(rf.activation_bytes));
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
      s["final_loss"] = JsonNumber(f.final_loss);
      s["max_loss_deviation"] = JsonNumber(f.max_loss_deviation);
      Json losses = Json::array();
      for (double l : e.run.losses) losses.push_back(JsonNumber(l));
      s["losses"] = std::move(losses);
      Json ranks = Json::array();
      for (const RankFigures& rf : f.ranks) {
        ranks.push_back({{"rank", rf.rank},
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
      "<th>micro-batches</th><th>tokens/s</th><th>speed-up</th><th>scaling efficiency</th>"
      "<th>step</th><th>compute</th><th>exposed comm</th><th>bubble</th>"
      "<th>peak memory (largest rank)</th><th>final loss</th><th>max loss deviation</th>"
      "<th>recommendation</th></tr>\n";
  for (const Figures& f : r.figures) {
    if (!f.ran) {
      absl::StrAppendFormat(&out, "<tr><td>%s</td><td colspan=\"12\"></td><td>%s</td></tr>\n",
                            HtmlEscape(f.label), HtmlEscape(f.recommendation));
      continue;
    }
    absl::StrAppendFormat(
        &out,
        "<tr><td>%s</td><td class=\"n\">%d</td><td class=\"n\">%d</td><td class=\"n\">%s</td>"
        "<td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td>"
        "<td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td>"
        "<td class=\"n\">%s</td><td class=\"n\">%.4f</td><td class=\"n\">%s</td><td>%s</td></tr>\n",
        HtmlEscape(f.label), f.workers, f.micro_batches, Thousands(f.tokens_per_second),
        Ratio(f.speedup), Percent(f.efficiency), Millis(f.step_seconds), Millis(f.compute_seconds),
        Millis(f.exposed_comm_seconds), Millis(f.bubble_seconds), Bytes(f.peak_bytes), f.final_loss,
        LossDeviation(f), HtmlEscape(f.recommendation));
  }
  out += "</table>\n";
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
  if (!r.notes.empty()) {
    out += "<ul>\n";
    for (const std::string& n : r.notes) absl::StrAppend(&out, "<li>", HtmlEscape(n), "</li>\n");
    out += "</ul>\n";
  }
  out +=
      "<h2>Per rank</h2>\n<table>\n<tr><th>strategy</th><th>rank</th><th>step</th>"
      "<th>compute</th><th>exposed comm</th><th>bubble</th><th>optimizer</th><th>other</th>"
      "<th>peak memory</th><th>parameters</th><th>gradients</th><th>optimizer state</th>"
      "<th>activations</th></tr>\n";
  for (const Figures& f : r.figures) {
    for (const RankFigures& rf : f.ranks) {
      absl::StrAppendFormat(
          &out,
          "<tr><td>%s</td><td class=\"n\">%d</td><td class=\"n\">%s</td><td class=\"n\">%s</td>"
          "<td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td>"
          "<td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td>"
          "<td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td></tr>\n",
          HtmlEscape(f.label), rf.rank, Millis(rf.step_seconds), Millis(rf.compute_seconds),
          Millis(rf.exposed_comm_seconds), Millis(rf.bubble_seconds), Millis(rf.optimizer_seconds),
          Millis(rf.other_seconds), Bytes(rf.peak_bytes), Bytes(rf.param_bytes),
          Bytes(rf.grad_bytes), Bytes(rf.optimizer_bytes), Bytes(rf.activation_bytes));
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
