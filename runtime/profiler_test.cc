#include "runtime/profiler.h"

#include "gtest/gtest.h"
#include "runtime/ops.h"

namespace tandem {
namespace {

TEST(ProfilerTest, OpsAreCountedOnlyWhenEnabled) {
  Stream& s = **Stream::Compute(Device::Cpu());
  Tensor x = *Tensor::FromVector({1, 2, 3}, {3});
  Profiler::Reset();
  ASSERT_TRUE(ops::Scale(s, x, 2.0f).ok());
  EXPECT_TRUE(Profiler::OpTable().empty());
  Profiler::Enable(true);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ops::Scale(s, x, 2.0f).ok());
  ASSERT_TRUE(ops::Fill(s, x, 1.0f).ok());
  Profiler::Enable(false);
  std::vector<OpStat> table = Profiler::OpTable();
  ASSERT_EQ(table.size(), 2u);
  int64_t scale_count = 0;
  for (const OpStat& o : table) {
    if (o.name == "Scale") scale_count = o.count;
    EXPECT_GE(o.total_seconds, 0);
  }
  EXPECT_EQ(scale_count, 3);
  EXPECT_NE(Profiler::FormatOpTable(table).find("Scale"), std::string::npos);
}

TEST(ProfilerTest, SpansBecomeChromeTraceEvents) {
  Profiler::Reset();
  Profiler::Enable(true);
  { SpanScope a("forward 2", "compute", 2); }
  { SpanScope b("all_reduce #7 (f32 x 8, sum)", "comm", -1, 7, 1); }
  Profiler::Enable(false);
  std::vector<TraceEvent> ev = Profiler::Events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].micro_batch, 2);
  EXPECT_EQ(ev[1].sequence, 7);
  EXPECT_GE(ev[1].start_us, ev[0].start_us);
  const std::string json = Profiler::ChromeTrace(ev, 3, "rank \"3\"");
  EXPECT_NE(json.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(json.find("\"pid\": 3, \"tid\": 1"), std::string::npos);
  EXPECT_NE(json.find("\"name\": \"forward 2\""), std::string::npos);
  EXPECT_NE(json.find("rank \\\"3\\\""), std::string::npos);  // escaped
  EXPECT_NE(json.find("\"sequence\": 7"), std::string::npos);
}

}  // namespace
}  // namespace tandem
