// --profile's end of a run: the workers' Chrome traces (<run_dir>/traces/rank-<r>.json) read
// back, put on one clock and merged into <run_dir>/trace.json (one process lane per rank),
// and the per-rank op tables printed.
#ifndef TANDEM_LAUNCHER_TRACE_MERGE_H_
#define TANDEM_LAUNCHER_TRACE_MERGE_H_

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/profiler.h"

namespace tandem {
namespace launcher {

// One worker's trace: its complete ("X") events sorted by start, on its own clock (each
// worker measures from its own process start).
struct RankTrace {
  int rank = 0;
  std::vector<TraceEvent> events;
  TraceClock clock;  // the trace's "clock" metadata; an empty domain where it has none
};

// A worker's trace file's text (runtime/profiler.h's ChromeTrace); the rank is the pid.
absl::StatusOr<RankTrace> ParseChromeTrace(absl::string_view text);
// <run_dir>/traces/rank-<rank>.json.
absl::StatusOr<RankTrace> ReadRankTrace(const std::string& run_dir, int rank);

// Microseconds to add to each rank's timestamps to put it on rank 0's clock. A rank on rank
// 0's host (the same clock domain) is put there exactly: the difference of their origins.
// Otherwise: every step ends with an all-reduce of the loss that every rank leaves together
// ("reduce loss" spans), so the offset of rank r is the median over steps of (rank 0's end of
// that span - rank r's), as close as the ranks' streams wake after it (tens of microseconds
// on a busy host); 0 for a rank without such spans.
std::vector<double> ClockOffsetsUs(const std::vector<RankTrace>& ranks);
// `trace` with every event shifted by `offset_us`.
RankTrace Shifted(const RankTrace& trace, double offset_us);

// One Chrome trace of all ranks (already on one clock): process r is "rank r", sorted by
// rank, with its compute (thread 0) and communication (thread 1) lanes.
std::string MergedChromeTrace(const std::vector<RankTrace>& ranks);

// Reads the traces of ranks 0..workers-1 under `run_dir`, each shifted onto rank 0's clock
// (ClockOffsetsUs). Fails when a rank's trace is missing or unreadable.
absl::StatusOr<std::vector<RankTrace>> ReadAlignedTraces(const std::string& run_dir,
                                                         int workers);

// Reads the traces of ranks 0..workers-1 under `run_dir`, aligns their clocks and writes
// <run_dir>/trace.json. Fails when a rank's trace is missing or unreadable.
absl::Status MergeRunTraces(const std::string& run_dir, int workers);

// The op tables the workers saved (<run_dir>/traces/ops-rank-<r>.txt, sorted by total
// time), each under an "op table, rank r" line; ranks without one are left out.
std::string OpTables(const std::string& run_dir, int workers);

// What the launcher does at the end of a --profile run: merges the traces into
// <run_dir>/trace.json and prints the op tables to `out`; problems (a failed run leaves no
// traces) are reported on `err` as "launcher: ..." lines. Never fails the run.
void FinishProfile(const std::string& run_dir, int workers, std::FILE* out, std::FILE* err);

}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_TRACE_MERGE_H_
