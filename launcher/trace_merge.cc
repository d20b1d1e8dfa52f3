// Reading the workers' Chrome traces back, aligning their clocks on the per-step loss
// all-reduce, writing the merged trace, and printing the op tables at the end of a --profile
// run.
#include "launcher/trace_merge.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/files.h"
#include "runtime/json.h"

namespace tandem {
namespace launcher {

namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

absl::StatusOr<RankTrace> ParseChromeTrace(absl::string_view text) {
  absl::StatusOr<Json> doc = ParseJson(text);
  if (!doc.ok()) return doc.status();
  const auto events = doc->find("traceEvents");
  if (events == doc->end() || !events->is_array()) {
    return absl::InvalidArgumentError("not a Chrome trace: no \"traceEvents\" array");
  }
  RankTrace t;
  bool have_pid = false;
  for (const Json& e : *events) {
    if (!e.is_object()) continue;
    if (!have_pid && e.contains("pid")) {
      t.rank = static_cast<int>(NumberOr(e, "pid", 0));
      have_pid = true;
    }
    if (StringOr(e, "ph", "") == "M" && StringOr(e, "name", "") == "clock") {
      if (const auto args = e.find("args"); args != e.end()) {
        t.clock.domain = StringOr(*args, "domain", "");
        t.clock.origin_us = NumberOr(*args, "origin_us", -1);
      }
    }
    if (StringOr(e, "ph", "") != "X") continue;
    TraceEvent ev;
    ev.name = StringOr(e, "name", "");
    ev.category = StringOr(e, "cat", "");
    ev.start_us = NumberOr(e, "ts", 0);
    ev.duration_us = NumberOr(e, "dur", 0);
    ev.thread = static_cast<int>(NumberOr(e, "tid", 0));
    if (const auto args = e.find("args"); args != e.end()) {
      ev.micro_batch = static_cast<int>(NumberOr(*args, "micro_batch", -1));
      ev.sequence = static_cast<int64_t>(NumberOr(*args, "sequence", -1));
    }
    t.events.push_back(std::move(ev));
  }
  std::stable_sort(t.events.begin(), t.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_us < b.start_us;
  });
  return t;
}

absl::StatusOr<RankTrace> ReadRankTrace(const std::string& run_dir, int rank) {
  const std::string path = absl::StrFormat("%s/traces/rank-%d.json", run_dir, rank);
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<RankTrace> t = ParseChromeTrace(*text);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", t.status().message()));
  t->rank = rank;
  return t;
}

std::vector<double> ClockOffsetsUs(const std::vector<RankTrace>& ranks) {
  auto sync_points = [](const RankTrace& t) {
    std::vector<double> ends;
    for (const TraceEvent& e : t.events) {
      if (e.name == "reduce loss") ends.push_back(e.start_us + e.duration_us);
    }
    return ends;
  };
  std::vector<double> offsets(ranks.size(), 0.0);
  if (ranks.empty()) return offsets;
  const std::vector<double> ref = sync_points(ranks[0]);
  const TraceClock& zero = ranks[0].clock;
  for (size_t r = 1; r < ranks.size(); ++r) {
    const TraceClock& c = ranks[r].clock;
    if (!zero.domain.empty() && c.domain == zero.domain && zero.origin_us >= 0 &&
        c.origin_us >= 0) {
      offsets[r] = c.origin_us - zero.origin_us;
      continue;
    }
    const std::vector<double> mine = sync_points(ranks[r]);
    std::vector<double> diffs;
    for (size_t i = 0; i < std::min(ref.size(), mine.size()); ++i)
      diffs.push_back(ref[i] - mine[i]);
    offsets[r] = Median(diffs);
  }
  return offsets;
}

RankTrace Shifted(const RankTrace& trace, double offset_us) {
  RankTrace out = trace;
  for (TraceEvent& e : out.events) e.start_us += offset_us;
  return out;
}

std::string MergedChromeTrace(const std::vector<RankTrace>& ranks) {
  std::vector<TraceProcess> processes;
  for (const RankTrace& t : ranks) {
    processes.push_back(TraceProcess{t.rank, absl::StrFormat("rank %d", t.rank), &t.events});
  }
  return Profiler::ChromeTrace(processes);
}

absl::StatusOr<std::vector<RankTrace>> ReadAlignedTraces(const std::string& run_dir,
                                                         int workers) {
  std::vector<RankTrace> ranks;
  for (int r = 0; r < workers; ++r) {
    absl::StatusOr<RankTrace> t = ReadRankTrace(run_dir, r);
    if (!t.ok()) return t.status();
    ranks.push_back(std::move(*t));
  }
  const std::vector<double> offsets = ClockOffsetsUs(ranks);
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = Shifted(ranks[r], offsets[r]);
  return ranks;
}

absl::Status MergeRunTraces(const std::string& run_dir, int workers) {
  absl::StatusOr<std::vector<RankTrace>> ranks = ReadAlignedTraces(run_dir, workers);
  if (!ranks.ok()) return ranks.status();
  return WriteFileAtomically(absl::StrCat(run_dir, "/trace.json"), MergedChromeTrace(*ranks));
}

std::string OpTables(const std::string& run_dir, int workers) {
  std::string out;
  for (int r = 0; r < workers; ++r) {
    absl::StatusOr<std::string> table =
        ReadWholeFile(absl::StrFormat("%s/traces/ops-rank-%d.txt", run_dir, r));
    if (!table.ok() || table->empty()) continue;
    absl::StrAppendFormat(&out, "op table, rank %d:\n%s", r, *table);
    if (out.back() != '\n') out += '\n';
  }
  return out;
}

void FinishProfile(const std::string& run_dir, int workers, std::FILE* out, std::FILE* err) {
  const std::string tables = OpTables(run_dir, workers);
  if (!tables.empty()) std::fprintf(out, "\n%s", tables.c_str());
  absl::Status merged = MergeRunTraces(run_dir, workers);
  if (merged.ok()) {
    std::fprintf(out,
                 "trace       %s/trace.json (Perfetto or chrome://tracing; one lane per rank)\n",
                 run_dir.c_str());
  } else {
    std::fprintf(err, "launcher: no merged trace: %s\n", std::string(merged.message()).c_str());
  }
  std::fflush(out);
  std::fflush(err);
}

}  // namespace launcher
}  // namespace tandem
