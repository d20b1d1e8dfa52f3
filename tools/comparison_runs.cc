// The comparison's reading: a run directory as the launcher leaves it (run.json, every rank's
// metrics lines, its traces where profiled) read into RunData; a missing or unreadable file
// is an error naming it.
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

// A rank's metrics, one record per step; unlike the launcher's live view, a missing file or
// a line that does not parse is an error here.
absl::StatusOr<std::vector<StepMetrics>> ReadMetrics(const std::string& path) {
  if (!PathExists(path)) return absl::NotFoundError(absl::StrFormat("cannot read %s", path));
  std::vector<std::string> errors;
  std::vector<StepMetrics> out = launcher::ReadMetricsFile(path, &errors);
  if (!errors.empty()) return absl::InvalidArgumentError(errors.front());
  return out;
}

// D x K from run.json's "replicas" and "stages"; a run.json from before them had data
// parallel's D = workers, the others' --data-parallel (1 then).
absl::Status ReadGrid(const Json& run, RunData* d) {
  const int fallback = d->strategy == "data" ? d->workers : d->data_parallel;
  d->grid.replicas = static_cast<int>(NumberOr(run, "replicas", fallback));
  d->grid.stages = static_cast<int>(NumberOr(run, "stages", d->workers / std::max(1, fallback)));
  d->grid.tensors = static_cast<int>(NumberOr(run, "tensors", 1));
  if (d->grid.replicas < 1 || d->grid.stages < 1 || d->grid.tensors < 1 ||
      d->grid.ranks() != d->workers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s/run.json: %d tensor ranks x %d replicas x %d stages is not its %d workers", d->dir,
        d->grid.tensors, d->grid.replicas, d->grid.stages, d->workers));
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

}  // namespace tools
}  // namespace tandem
