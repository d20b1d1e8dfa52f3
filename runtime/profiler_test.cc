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

const OpStat* Find(const std::vector<OpStat>& table, const std::string& name) {
  for (const OpStat& o : table) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

TEST(ProfilerTest, OpsRecordTheLeastWorkTheyMustDo) {
  Stream& s = **Stream::Compute(Device::Cpu());
  auto zeros = [](Shape shape) {
    return *Tensor::FromVector(std::vector<float>(shape.numel(), 0.0f), shape);
  };
  Tensor a = zeros({3, 4}), b = zeros({4, 5}), out = zeros({3, 5});
  Tensor x = zeros({10}), y = zeros({10});
  // LinearBackward without dinp: inp (N 6, C 4), weight (OC 2, C 4), dout (6, 2).
  Tensor inp = zeros({6, 4}), weight = zeros({2, 4}), dout = zeros({6, 2});
  Tensor dweight = zeros({2, 4}), dbias = zeros({2});
  Profiler::Reset();
  Profiler::Enable(true);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(ops::Matmul(s, out, a, b, false, false, 1, 0).ok());
  ASSERT_TRUE(ops::Axpy(s, y, 2.0f, x).ok());
  ASSERT_TRUE(ops::LinearBackward(s, Tensor(), dweight, dbias, dout, inp, weight).ok());
  Profiler::Enable(false);
  const std::vector<OpStat> table = Profiler::OpTable();

  const OpStat* matmul = Find(table, "Matmul");
  ASSERT_NE(matmul, nullptr);
  EXPECT_EQ(matmul->flops, 2 * (2.0 * 3 * 5 * 4));       // two calls of 2 m n k
  EXPECT_EQ(matmul->bytes, 2 * ((12 + 20 + 15) * 4.0));  // a and b read, out written
  const OpStat* axpy = Find(table, "Axpy");
  ASSERT_NE(axpy, nullptr);
  EXPECT_EQ(axpy->flops, 0);
  EXPECT_EQ(axpy->bytes, (10 + 2 * 10) * 4.0);  // x read; y read and written
  const OpStat* linear = Find(table, "LinearBackward");
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(linear->flops, 2.0 * 6 * 4 * 2);  // dweight += dout^T inp only
  // dout and inp read; dweight and dbias accumulated (read and written).
  EXPECT_EQ(linear->bytes, (12 + 24) * 4.0 + 2 * (8 + 2) * 4.0);

  const std::string text = Profiler::FormatOpTable(table);
  EXPECT_NE(text.find("GFLOP/s"), std::string::npos) << text;
  EXPECT_NE(text.find("GB/s"), std::string::npos) << text;
  EXPECT_GT(matmul->flops_per_second(), 0);
  EXPECT_EQ(axpy->flops_per_second(), 0);
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
