// The comparison's writers: the report as markdown (charts as SVG files beside it), JSON and
// one self-contained HTML file, and the formats their cells use.
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
    "the slowest rank's. Tensor-parallel wait: the stream waiting for the all-reduces of "
    "tensor parallelism's layers, on every layer's critical path. Speed-up = tokens/s / the "
    "one-worker baseline's; scaling efficiency = "
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
    "replica), with tensor parallelism (T=2, ...) each stage's blocks split over T neighbouring ranks "
    "(rank = (stage x D + replica) x T + tensor rank); ZeRO-1 shards the optimizer state over "
    "the D replicas. Optimizer state: the "
    "bytes the largest rank keeps, as each run measured it.";

std::string ResultsHeader() {
  return "| strategy | workers | layout (D x K) | micro-batches | tokens/s | speed-up | "
         "scaling efficiency | step | compute | exposed comm | tensor-parallel wait | bubble | "
         "peak memory (largest rank) | optimizer state (largest rank) | final loss | max loss "
         "deviation | recommendation |\n"
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
         "---: | ---: | ---: | ---: | --- |\n";
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
          f.tensors > 1 ? Millis(f.tensor_comm_seconds) : "-",
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
      s["tensor_parallel_wait_seconds"] = JsonNumber(f.tensor_comm_seconds);
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
                         {"tensor_parallel_wait_seconds", JsonNumber(rf.tensor_comm_seconds)},
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
      "<th>tensor-parallel wait</th><th>bubble</th><th>peak memory (largest rank)</th><th>optimizer state (largest "
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
