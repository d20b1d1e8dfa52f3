// Tests of reading a worker's Chrome trace back, the clock alignment on the
// loss all-reduce, the merged trace of a run directory and the op tables.
#include "launcher/trace_merge.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/test_trace.h"
#include "runtime/json.h"
#include "runtime/test_files.h"

namespace tandem {
namespace launcher {
namespace {

using ::testing::HasSubstr;

TEST(TraceTest, ReadsBackWhatTheProfilerWrites) {
  std::vector<TraceEvent> events = {
      Event("backward 1", "compute", 50, 20, 1),
      Event("forward 1", "compute", 10, 5, 1),
      Event("all_reduce #3 (\"sum\")", "comm", 55, 30, -1, 1, 3),
  };
  absl::StatusOr<RankTrace> t = ParseChromeTrace(Profiler::ChromeTrace(events, 2, "rank 2"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->rank, 2);
  ASSERT_EQ(t->events.size(), 3u);
  EXPECT_EQ(t->events[0].name, "forward 1");  // sorted by start
  EXPECT_EQ(t->events[1].name, "backward 1");
  EXPECT_EQ(t->events[2].name, "all_reduce #3 (\"sum\")");
  EXPECT_EQ(t->events[2].thread, 1);
  EXPECT_EQ(t->events[2].sequence, 3);
  EXPECT_EQ(t->events[2].category, "comm");
  EXPECT_EQ(t->events[1].micro_batch, 1);
  EXPECT_DOUBLE_EQ(t->events[1].duration_us, 20);
  EXPECT_FALSE(ParseChromeTrace("{\"other\": 1}").ok());
}

TEST(TraceTest, ClockOffsetsAlignTheLossReduction) {
  RankTrace r0, r1, r2;
  r0.rank = 0;
  r1.rank = 1;
  r2.rank = 2;
  // Rank 1's clock started 1000 us after rank 0's; one noisy step; rank 2 has no sync spans.
  r0.events = {Event("reduce loss", "idle", 100, 10), Event("reduce loss", "idle", 300, 10),
               Event("reduce loss", "idle", 500, 10)};
  r1.events = {Event("reduce loss", "idle", -900, 10), Event("reduce loss", "idle", -700, 50),
               Event("reduce loss", "idle", -500, 10)};
  r2.events = {Event("forward 0", "compute", 0, 10)};
  const std::vector<double> off = ClockOffsetsUs({r0, r1, r2});
  ASSERT_EQ(off.size(), 3u);
  EXPECT_DOUBLE_EQ(off[0], 0);
  EXPECT_DOUBLE_EQ(off[1], 1000);
  EXPECT_DOUBLE_EQ(off[2], 0);
  EXPECT_DOUBLE_EQ(Shifted(r1, off[1]).events[0].start_us, 100);
}

// Ranks of one host share its monotonic clock: the trace's clock metadata puts them on rank
// 0's exactly (the loss reduction's ends, 1000 us apart here, are not used); a rank of
// another boot is aligned on the loss reduction.
TEST(TraceTest, ClockOffsetsOnOneHostAreTheOriginsDifference) {
  RankTrace r0, r1, r2;
  r0.rank = 0;
  r1.rank = 1;
  r2.rank = 2;
  r0.clock = {"boot-a", 5000};
  r1.clock = {"boot-a", 6250.5};
  r2.clock = {"boot-b", 99};
  r0.events = {Event("reduce loss", "idle", 100, 10), Event("reduce loss", "idle", 300, 10)};
  r1.events = {Event("reduce loss", "idle", -900, 10), Event("reduce loss", "idle", -700, 10)};
  r2.events = {Event("reduce loss", "idle", 40, 10), Event("reduce loss", "idle", 240, 10)};
  const std::vector<double> off = ClockOffsetsUs({r0, r1, r2});
  ASSERT_EQ(off.size(), 3u);
  EXPECT_DOUBLE_EQ(off[0], 0);
  EXPECT_DOUBLE_EQ(off[1], 1250.5);
  EXPECT_DOUBLE_EQ(off[2], 60);
}

TEST(TraceTest, AWorkersTraceCarriesItsClock) {
  const TraceClock mine = Profiler::Clock();
  if (mine.domain.empty()) GTEST_SKIP() << "no boot id on this host";
  std::vector<TraceEvent> events = {Event("forward 1", "compute", 10, 5, 1)};
  absl::StatusOr<RankTrace> t = ParseChromeTrace(Profiler::ChromeTrace(events, 0, "rank 0"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->clock.domain, mine.domain);
  EXPECT_NEAR(t->clock.origin_us, mine.origin_us, 0.001);
  EXPECT_GT(mine.origin_us, 0);
}

TEST(TraceTest, MergesARunDirectory) {
  const std::string dir = FreshTestDir("run");
  mkdir((dir + "/traces").c_str(), 0755);
  for (int r = 0; r < 2; ++r) {
    std::vector<TraceEvent> ev = {Event("forward 0", "compute", 10 + 500 * r, 5, 0),
                                  Event("reduce loss", "idle", 20 + 500 * r, 5)};
    // Rank 1's clock started 500 us before rank 0's, on the same host.
    const TraceClock clock{"boot-x", 1000.0 - 500 * r};
    std::ofstream(absl::StrFormat("%s/traces/rank-%d.json", dir, r))
        << Profiler::ChromeTrace({TraceProcess{r, absl::StrCat("rank ", r), &ev, clock}});
    std::ofstream(absl::StrFormat("%s/traces/ops-rank-%d.txt", dir, r))
        << "op  count  total ms  mean us\nMatMul  3  1.00  333.3\n";
  }
  ASSERT_TRUE(MergeRunTraces(dir, 2).ok());
  absl::StatusOr<Json> merged = ReadJsonFile(dir + "/trace.json");
  ASSERT_TRUE(merged.ok()) << merged.status();
  int complete = 0, names = 0;
  for (const Json& e : (*merged)["traceEvents"]) {
    if (StringOr(e, "ph", "") == "X") {
      ++complete;
      // Rank 1's events land on rank 0's clock.
      if (StringOr(e, "name", "") == "forward 0") {
        EXPECT_DOUBLE_EQ(NumberOr(e, "ts", -1), 10);
      }
    }
    if (StringOr(e, "name", "") == "process_name") ++names;
  }
  EXPECT_EQ(complete, 4);
  EXPECT_EQ(names, 2);
  // One event a line, keys in Chrome's order.
  EXPECT_THAT(ReadAll(dir + "/trace.json"),
              HasSubstr("\n    {\"ph\": \"X\", \"name\": \"forward 0\", \"cat\": \"compute\", "
                        "\"pid\": 1, \"tid\": 0, \"ts\": 10, \"dur\": 5, \"args\": "
                        "{\"micro_batch\": 0, \"sequence\": -1}},\n"));

  const std::string tables = OpTables(dir, 3);  // rank 2 has none: left out
  EXPECT_THAT(tables, HasSubstr("op table, rank 0:\nop  count"));
  EXPECT_THAT(tables, HasSubstr("op table, rank 1:\n"));
  EXPECT_FALSE(absl::StrContains(tables, "rank 2"));

  EXPECT_FALSE(MergeRunTraces(dir, 3).ok());  // rank 2's trace is missing
  const std::string out_path = dir + "/out.txt", err_path = dir + "/err.txt";
  std::FILE* out = std::fopen(out_path.c_str(), "w");
  std::FILE* err = std::fopen(err_path.c_str(), "w");
  FinishProfile(dir, 3, out, err);
  std::fclose(out);
  std::fclose(err);
  EXPECT_THAT(ReadAll(out_path), HasSubstr("op table, rank 1:"));
  EXPECT_THAT(ReadAll(err_path), HasSubstr("launcher: no merged trace:"));
}

}  // namespace
}  // namespace launcher
}  // namespace tandem
