// The strategy comparison report: run directories (run.json, per-rank metrics, traces) read
// into plain structs (comparison_runs.cc), the figures per strategy against the one-worker
// baseline, rule-based recommendations and timelines of one measured step
// (comparison_figures.cc), and the markdown, JSON and HTML writers (comparison_writers.cc).
#ifndef TANDEM_TOOLS_COMPARISON_H_
#define TANDEM_TOOLS_COMPARISON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "launcher/run_report.h"
#include "launcher/trace_merge.h"
#include "parallel/grid.h"
#include "tools/svg.h"

namespace tandem {
namespace tools {

// One rank's line for one step (worker/worker.cc writes them).
using StepMetrics = StepRecord;

// A run directory as the launcher leaves it.
struct RunData {
  std::string dir;
  std::string strategy;   // data, model, pipeline
  std::string schedule;   // gpipe, 1f1b (pipeline)
  int data_parallel = 1;  // --data-parallel: replicas of a pipeline or model split
  int zero = 0;           // 1: ZeRO-1, the optimizer state sharded over the replicas
  // D replicas x K stages (data parallel: every worker a replica); a run.json from before
  // replicas: data parallel D = workers, the others K = workers.
  ProcessGrid grid;
  std::string model;
  std::string device;
  std::string seed;
  std::string exit = "ok";
  int workers = 0;
  int batch = 0;
  int steps = 0;
  int micro_batches = 1;
  double bucket_mb = 25;  // data parallel's gradient buckets
  bool overlap = true;    // data parallel: all-reduce during backward
  int64_t tokens_per_step = 0;
  std::vector<double> losses;                   // the global batch's, per step (rank 0's)
  std::vector<std::pair<int, double>> val_losses;  // [steps trained, validation loss]
  std::vector<std::vector<StepMetrics>> ranks;  // per rank, in step order
  // Per rank, as run.json measured it (ZeRO-1: the rank's shard); without it in run.json, the
  // rank's largest in its metrics.
  std::vector<int64_t> optimizer_state_bytes;
  // Per rank, on rank 0's clock (launcher::ClockOffsetsUs); empty when not profiled.
  std::vector<launcher::RankTrace> traces;
};

// Reads <dir>/run.json, <dir>/metrics/rank-<r>.jsonl and, where present,
// <dir>/traces/rank-<r>.json. A missing run.json or metrics file is an error.
absl::StatusOr<RunData> ReadRun(const std::string& dir);

// One entry of the comparison: a run, or why it could not run.
struct Entry {
  // File-name safe: "baseline", "data", "data-zero1", "model", "gpipe", "1f1b", and hybrid
  // layouts "d{D}k{K}-gpipe", "d{D}k{K}-1f1b".
  std::string name;
  std::string label;  // "one worker", "data parallel", "2 replicas x 2-stage GPipe", ...
  bool ran = false;
  std::string error;  // the launcher's message when !ran
  RunData run;
};

// Per-step means of one rank (warm-up steps left out, as for throughput).
struct RankFigures {
  int rank = 0;
  int replica = 0;
  int stage = 0;
  double step_seconds = 0;
  double compute_seconds = 0;
  double exposed_comm_seconds = 0;
  double tensor_comm_seconds = 0;  // waiting for tensor-parallel collectives
  double bubble_seconds = 0;
  double optimizer_seconds = 0;
  double other_seconds = 0;  // the rest of the step: data loading, bookkeeping
  int64_t peak_bytes = 0;
  int64_t param_bytes = 0;
  int64_t grad_bytes = 0;
  int64_t optimizer_bytes = 0;   // run.json's optimizer state of the rank (ZeRO-1: its shard)
  int64_t activation_bytes = 0;  // peak - the three above, at least 0 (includes workspace)
};

struct Figures {
  std::string name;
  std::string label;
  bool ran = false;
  std::string error;
  std::string strategy;  // data, model, pipeline
  std::string schedule;  // gpipe, 1f1b (pipeline)
  int workers = 0;
  int replicas = 1;  // D
  int stages = 1;    // K
  int tensors = 1;   // T
  int zero = 0;      // 1: ZeRO-1
  int micro_batches = 1;
  int steps = 0;              // completed
  double step_seconds = 0;    // the slowest rank's mean step, warm-up left out
  double step_variation = 0;  // their standard deviation / mean: high on a busy host
  double tokens_per_second = 0;
  double speedup = 0;          // tokens/s over the baseline's
  double efficiency = 0;       // speed-up / workers
  double compute_seconds = 0;  // per step, mean over ranks
  double exposed_comm_seconds = 0;
  double tensor_comm_seconds = 0;
  double bubble_seconds = 0;
  int64_t peak_bytes = 0;        // the largest rank's
  int64_t activation_bytes = 0;  // the largest rank's
  int64_t optimizer_bytes = 0;   // the largest rank's optimizer state
  double final_loss = 0;
  double max_loss_deviation = 0;  // max over steps of |loss - baseline loss|; NaN: no baseline
  // The last validation loss and the steps trained before it; step 0: none evaluated.
  double final_val_loss = 0;
  int final_val_step = 0;
  std::vector<RankFigures> ranks;
  std::string recommendation;  // a short verdict with its reason
};

// The figures of `e` against `baseline` (nullptr, or not ran: speed-up and deviation unset).
Figures ComputeFigures(const Entry& e, const Entry* baseline);

// "2 x 2" (D replicas x K stages), "4 x 1, ZeRO-1", with tensor parallelism "T=2, 2 x 1"; "-"
// for a run that did not run.
std::string Layout(const Figures& f);

// Fills each strategy's recommendation and returns the report's summary lines: the fastest,
// the least memory per rank, the choice between them, ZeRO-1's optimizer state against plain
// data parallel's, loss parity, each run's final validation loss (where evaluated), and what
// the host (with `host_cores` cores) means for the
// numbers. figures[0] is the baseline.
std::vector<std::string> Recommend(std::vector<Figures>* figures, int host_cores);

// The events of one training step of a profiled run, as a timeline: each rank's step runs
// from the end of its previous step to the end of its own, a step ending with its "reduce
// loss" wait and the "optimizer" spans after it; times are on rank 0's clock, from the
// earliest rank's step start. A row per rank, "rank 2", or in a hybrid layout
// "rank 2 (0, 1)": its (replica, stage). Fails when the run has no traces or fewer steps
// than `step` + 1.
absl::StatusOr<GanttSpec> StepTimeline(const RunData& run, int step, const std::string& title);
// The step the report draws: the second-to-last (the last may overlap shutdown), else 0.
int TimelineStep(const RunData& run);
// What a strategy's timeline shows, from its settings (e.g. whether the gradients fit in one
// bucket, so their all-reduce cannot overlap backward; a hybrid layout's rows by replica and
// stage; ZeRO-1's collectives).
std::string TimelineCaption(const RunData& run);

struct Chart {
  std::string file;  // "throughput.svg"
  std::string title;
  std::string svg;
  std::string caption;  // what to look for in it
};

struct Report {
  std::string model;
  std::string device;
  int gpus = 0;
  int batch = 0;
  int steps = 0;
  std::string seed;
  int host_cores = 0;
  std::string command;           // how it was made
  std::string created;           // local time
  std::vector<Entry> entries;    // baseline first
  std::vector<Figures> figures;  // one per entry
  std::vector<std::string> summary;
  std::vector<std::string> run_notes;  // about which runs there are (no hybrid layout for N)
  std::vector<Chart> charts;           // throughput, step time, memory
  std::vector<Chart> timelines;        // one per profiled strategy that ran
  std::vector<std::string> notes;      // timelines that could not be drawn, and why
};

// Figures, recommendations and charts for `entries` (the first is the baseline), each
// strategy on `gpus` workers. The run settings (model, batch, ...) come from the first entry
// that ran.
Report BuildReport(std::vector<Entry> entries, int gpus, int host_cores, const std::string& command,
                   const std::string& created);

// "Strategy comparison: gpt-tiny on 4 workers", or that no run completed.
std::string ReportTitle(const Report& r);

std::string MarkdownReport(const Report& r);  // links the charts' files beside it
std::string JsonReport(const Report& r);
std::string HtmlReport(const Report& r);  // one self-contained file, charts inlined

// Writes report.md, report.json, report.html and every chart's SVG into `dir`.
absl::Status WriteReport(const Report& r, const std::string& dir);

// Formats: "12.3 MB" (binary units), "3,100", "1.80x", "45%", "12.3 ms".
std::string Bytes(int64_t b);
std::string Thousands(double v);
std::string Ratio(double v);
std::string Percent(double v);
std::string Millis(double seconds);

}  // namespace tools
}  // namespace tandem

#endif  // TANDEM_TOOLS_COMPARISON_H_
