// What the launcher makes of the workers' measurements: following and reading the per-step
// metrics files (<run_dir>/metrics/rank-<r>.jsonl, parallel/metrics.h), per-rank totals and
// throughput, run.json (written atomically), and the summary table printed at the end.
#ifndef TANDEM_LAUNCHER_RUN_REPORT_H_
#define TANDEM_LAUNCHER_RUN_REPORT_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/format.h"
#include "parallel/job.h"
#include "parallel/metrics.h"  // StepRecord, ParseMetricsLine

namespace tandem {
namespace launcher {

// Follows one metrics file as a worker appends to it: each ReadNew() returns the complete
// lines added since the last call (a line still being written waits for its end). A missing
// file reads as empty.
class MetricsTail {
 public:
  explicit MetricsTail(std::string path) : path_(std::move(path)) {}
  // Lines that do not parse are skipped, their problem appended to `errors` if given.
  std::vector<StepRecord> ReadNew(std::vector<std::string>* errors = nullptr);

 private:
  std::string path_;
  int64_t offset_ = 0;
  std::string partial_;
};

// Every record of a metrics file, one per step in step order (a step written twice, as
// after a resume into the same run directory, keeps its last record).
std::vector<StepRecord> ReadMetricsFile(const std::string& path,
                                        std::vector<std::string>* errors = nullptr);
// Records in step order, one per step (the last one given for a step wins).
std::vector<StepRecord> ByStep(const std::vector<StepRecord>& records);

// Drops the records of step `from` and later from a metrics file, which a run resumed from
// step `from` writes again (a missing file is left missing). The file is replaced atomically.
absl::Status TruncateMetricsFile(const std::string& path, int from);

// Drops the records of step `from` and later from every rank's metrics file under `run_dir`
// (rank-0.jsonl, rank-1.jsonl, ... while they exist): what a run starting at step `from` (0,
// or its checkpoint's) writes again.
absl::Status TruncateRunMetrics(const std::string& run_dir, int from);
// Ranks 0..workers-1's records under `run_dir`, each as ReadMetricsFile reads them.
std::vector<std::vector<StepRecord>> ReadRunMetrics(const std::string& run_dir, int workers);

// Per-rank sums over the steps run.
struct RankTotals {
  int rank = 0;
  int steps = 0;
  double compute_seconds = 0;
  double comm_seconds = 0;  // the communicator's busy time
  double exposed_comm_seconds = 0;
  double tensor_comm_seconds = 0;  // waiting for tensor-parallel collectives
  double bubble_seconds = 0;
  double optimizer_seconds = 0;
  double step_seconds = 0;
  int64_t comm_bytes = 0;
  int64_t peak_memory_bytes = 0;
  int64_t peak_activation_bytes = 0;  // peak - parameters, gradients and optimizer state
  int64_t optimizer_bytes = 0;        // the optimizer state it keeps (ZeRO-1: its shard)
  int peak_in_flight = 0;
  // Whether the step times were split into compute, communication, bubble and optimizer (a
  // one-device run measures only whole steps).
  bool breakdown = false;
  // The median over the steps of the host synchronizations in a step: 1 when the loss is
  // read every step (--log-every=1), 0 when it is read less often.
  double host_syncs_per_step = 0;
  // Share of communication time hidden behind compute (1 - waited / busy, the waits for
  // tensor-parallel collectives counted); -1 when the busy time is not measured.
  double hidden_comm_share() const {
    if (comm_seconds <= 0) return -1;
    return std::max(0.0, 1.0 - (exposed_comm_seconds + tensor_comm_seconds) / comm_seconds);
  }
  // Pipeline bubble: the share of the step's pipeline (all but the gradient norm and the
  // optimizer step) spent waiting on another stage, as SimulateSchedule's bubble counts it.
  double bubble_fraction() const {
    const double pipeline = step_seconds - optimizer_seconds;
    return pipeline > 0 ? bubble_seconds / pipeline : 0;
  }
};
RankTotals Totals(int rank, const std::vector<StepRecord>& steps);

// Steps left out of averages as warm-up, when later ones exist.
inline constexpr int kWarmupSteps = 2;
// How many of `n` steps (in step order) are left out as warm-up: kWarmupSteps when later
// ones exist, else none.
inline size_t WarmupStepsOf(size_t n) {
  return n > static_cast<size_t>(kWarmupSteps) ? kWarmupSteps : 0;
}
// The slowest rank's seconds for each step every rank completed, in step order, warm-up
// steps left out: of the rank whose mean step is the longest (ranks that wait for each other
// take turns being slowest in a step, so the slowest in every step would add up to more
// than any rank took).
std::vector<double> CountedStepSeconds(const std::vector<std::vector<StepRecord>>& ranks);
// The mean of CountedStepSeconds; 0 when there are none.
double MeanStepSeconds(const std::vector<std::vector<StepRecord>>& ranks);
// Tokens per second of the whole job: batch * seq_len per step over MeanStepSeconds.
double TokensPerSecond(const std::vector<std::vector<StepRecord>>& ranks, int64_t tokens_per_step);

// Everything run.json and the summary say about one run.
struct RunRecord {
  JobConfig job;
  int seq_len = 0;                 // the model's, after the preset
  std::string exit = "ok";         // "ok", or why the run ended otherwise
  int failed_rank = -1;
  std::string failure;             // how the failed rank ended, if known
  std::string abort_reason;        // the coordinator's, if the job was aborted
  double wall_seconds = 0;
  int restarts = 0;                // times the job was restarted after a failure
  // Per rank, by step: the steps of earlier runs into the same directory (that this one
  // resumed) too, so that run.json has one loss per step; the figures of this run (step
  // times, totals, throughput) are of the steps from `first_step`, the step it started at.
  std::vector<std::vector<StepRecord>> ranks;
  int first_step = 0;
};

// run.json's text.
std::string RunJson(const RunRecord& r);
// Writes it to <run_dir>/run.json, atomically.
absl::Status WriteRunJson(const RunRecord& r);
// The table printed at the end: one row per rank, then loss, throughput, wall time, run dir.
std::string SummaryTable(const RunRecord& r);

// Number formats shared by the progress line and the summary.
// "48,000" (rounded to an integer).
std::string FormatThousands(double v);
// "0:42", "12:05", "1:02:03"; "-" for a negative or non-finite time.
std::string FormatDuration(double seconds);


}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_RUN_REPORT_H_
