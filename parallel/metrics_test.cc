// Tests of the metrics line: what a worker writes reads back the same, floats bit for bit, and
// the lines of older or other writers (spacing, strings, nulls, missing fields) still read.
#include "parallel/metrics.h"

#include <cmath>
#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"
#include "runtime/test_files.h"

namespace tandem {
namespace {

StepRecord Full() {
  StepRecord r;
  r.step = 3;
  r.loss = 5.48474979f;
  r.lr = 0.0003f;
  r.grad_norm = 2.72441864f;
  r.seconds = 0.0003914;
  r.compute = 0.00027;
  r.comm = 0.0001;
  r.exposed_comm = 0.000041;
  r.bubble = 0;
  r.optimizer = 0.000072;
  r.input = 0.000001;
  r.host_syncs = 1;
  r.peak_in_flight = 2;
  r.comm_bytes = 169472;
  r.sequence = 5;
  r.allocated_bytes = 677888;
  r.peak_bytes = 1135104;
  r.param_bytes = 1000;
  r.grad_bytes = 1000;
  r.optimizer_bytes = 2000;
  return r;
}

TEST(MetricsLine, TheWorkersLine) {
  EXPECT_EQ(MetricsLine(Full()),
            "{\"step\": 3, \"loss\": 5.48475, \"seconds\": 0.000391, \"compute\": 0.00027, "
            "\"comm\": 0.0001, \"exposed_comm\": 4.1e-05, \"bubble\": 0, \"optimizer\": 7.2e-05, "
            "\"input\": 1e-06, \"host_syncs\": 1, \"peak_in_flight\": 2, \"comm_bytes\": 169472, "
            "\"sequence\": 5, \"lr\": 0.0003, \"grad_norm\": 2.7244186, \"skipped\": false, "
            "\"allocated_bytes\": 677888, \"peak_bytes\": 1135104, \"param_bytes\": 1000, "
            "\"grad_bytes\": 1000, \"optimizer_bytes\": 2000}");
}

// A step with a validation loss carries it after its loss, in full; a step without one has
// no such field, and reads back without one.
TEST(MetricsLine, ValidationLossOnlyWhereEvaluated) {
  StepRecord r = Full();
  EXPECT_EQ(MetricsLine(r).find("val_loss"), std::string::npos);
  EXPECT_FALSE(ParseMetricsLine(MetricsLine(r))->val_loss.has_value());
  StepReport report;
  report.step = 3;
  report.loss = 5.48474979f;
  report.val_loss = 2.71828175f;
  r = StepRecordOf(report);
  const std::string line = MetricsLine(r);
  EXPECT_EQ(line.rfind("{\"step\": 3, \"loss\": 5.48475, \"val_loss\": 2.7182817, ", 0), 0u)
      << line;
  absl::StatusOr<StepRecord> back = ParseMetricsLine(line);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->val_loss.has_value());
  EXPECT_EQ(static_cast<float>(*back->val_loss), 2.71828175f);
}

TEST(MetricsLine, ReadsBackTheSame) {
  const StepRecord w = Full();
  absl::StatusOr<StepRecord> r = ParseMetricsLine(MetricsLine(w));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 3);
  // The step's floats bit for bit.
  EXPECT_EQ(static_cast<float>(r->loss), static_cast<float>(w.loss));
  EXPECT_EQ(static_cast<float>(r->lr), 0.0003f);
  EXPECT_EQ(static_cast<float>(r->grad_norm), static_cast<float>(w.grad_norm));
  EXPECT_DOUBLE_EQ(r->seconds, 0.000391);
  EXPECT_TRUE(r->breakdown);
  EXPECT_DOUBLE_EQ(r->compute, 0.00027);
  EXPECT_DOUBLE_EQ(r->exposed_comm, 0.000041);
  EXPECT_DOUBLE_EQ(r->optimizer, 0.000072);
  EXPECT_EQ(r->host_syncs, 1);
  EXPECT_EQ(r->peak_in_flight, 2);
  EXPECT_EQ(r->comm_bytes, 169472);
  EXPECT_EQ(r->sequence, 5);
  EXPECT_FALSE(r->skipped);
  EXPECT_EQ(r->allocated_bytes, 677888);
  EXPECT_EQ(r->peak_bytes, 1135104);
  EXPECT_EQ(r->optimizer_bytes, 2000);
  // Written again, the same line.
  EXPECT_EQ(MetricsLine(*r), MetricsLine(w));
}

TEST(MetricsLine, EveryFloatLossReadsBackBitForBit) {
  for (float loss = 1e-6f; loss < 20; loss = std::nextafter(loss * 1.01f, 100.0f)) {
    StepRecord w;
    w.loss = loss;
    w.grad_norm = loss * 3;
    absl::StatusOr<StepRecord> r = ParseMetricsLine(MetricsLine(w));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(static_cast<float>(r->loss), loss) << MetricsLine(w);
    ASSERT_EQ(static_cast<float>(r->grad_norm), loss * 3) << MetricsLine(w);
  }
}

TEST(MetricsLine, OneDeviceStepLeavesTheBreakdownOut) {
  StepRecord w = Full();
  w.breakdown = false;
  const std::string line = MetricsLine(w);
  EXPECT_EQ(line.find("compute"), std::string::npos) << line;
  EXPECT_EQ(line.find("bubble"), std::string::npos) << line;
  EXPECT_EQ(line.rfind("{\"step\": 3, \"loss\": 5.48475, \"seconds\": 0.000391, \"host_syncs\"",
                       0),
            0u)
      << line;
  absl::StatusOr<StepRecord> r = ParseMetricsLine(line);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->breakdown);
  EXPECT_EQ(r->compute, 0);
}

TEST(MetricsLine, NotFiniteIsNull) {
  StepRecord w;
  w.step = 2;
  w.loss = NAN;
  w.grad_norm = INFINITY;
  const std::string line = MetricsLine(w);
  EXPECT_EQ(line.rfind("{\"step\": 2, \"loss\": null, ", 0), 0u) << line;
  EXPECT_NE(line.find("\"grad_norm\": null"), std::string::npos) << line;
  // A null loss reads as no loss.
  absl::StatusOr<StepRecord> r = ParseMetricsLine(line);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(std::isnan(r->loss));
  EXPECT_TRUE(std::isnan(r->grad_norm));
}

TEST(ParseMetricsLine, OlderLinesSpacingAndStrings) {
  // As workers wrote it before: 9 digits, %.6f times, %.6g learning rate and norm.
  absl::StatusOr<StepRecord> r = ParseMetricsLine(
      "{\"step\": 3, \"loss\": 5.48474979, \"seconds\": 0.000391, \"compute\": 0.000270, "
      "\"exposed_comm\": 0.000041, \"bubble\": 0.000000, \"optimizer\": 0.000072, "
      "\"comm_bytes\": 169472, \"sequence\": 5, \"lr\": 0.0003, \"grad_norm\": 2.7244, "
      "\"skipped\": false, \"allocated_bytes\": 677888, \"peak_bytes\": 1135104}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->loss, 5.48474979);
  EXPECT_DOUBLE_EQ(r->compute, 0.000270);
  EXPECT_EQ(r->peak_bytes, 1135104);
  r = ParseMetricsLine("  {\"step\":1,\"loss\":2.5,\"seconds\":1e-3,\"note\":\"a, \\\"b\\\" }\"} ");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 1);
  EXPECT_DOUBLE_EQ(r->seconds, 1e-3);
  EXPECT_EQ(r->host_syncs, 0);  // missing: 0
}

TEST(ParseMetricsLine, Errors) {
  EXPECT_FALSE(ParseMetricsLine("").ok());
  EXPECT_FALSE(ParseMetricsLine("not json").ok());
  EXPECT_FALSE(ParseMetricsLine("[1, 2]").ok());
  EXPECT_FALSE(ParseMetricsLine("{\"step\": 1, \"loss\": 2").ok());
  EXPECT_FALSE(ParseMetricsLine("{\"step\": 1, \"loss\": x, \"seconds\": 1}").ok());
  EXPECT_FALSE(ParseMetricsLine("{\"step\": 1, \"seconds\": 1}").ok());  // no loss
  EXPECT_FALSE(ParseMetricsLine("{\"step\": 1, \"loss\": \"2\", \"seconds\": 1}").ok());
  EXPECT_FALSE(ParseMetricsLine("{\"step\": 1, \"loss\": 1, \"seconds\": 1} trailing").ok());
}

TEST(MetricsWriter, AppendsLines) {
  const std::string path = FreshTestPath("rank-0.jsonl");
  std::ofstream(path) << "{\"step\": 0, \"loss\": 5, \"seconds\": 1}\n";
  {
    MetricsWriter w(path);
    StepRecord r;
    r.step = 1;
    r.loss = 4;
    ASSERT_TRUE(w.Append(r).ok());
    // Flushed at once: readable while the writer is open.
    const std::string both =
        "{\"step\": 0, \"loss\": 5, \"seconds\": 1}\n{\"step\": 1, \"loss\": 4, \"seconds\": 0,";
    EXPECT_EQ(ReadAll(path).substr(0, both.size()), both);
  }
  EXPECT_EQ(MetricsPath("/r", 3), "/r/metrics/rank-3.jsonl");
  MetricsWriter bad("/nonexistent/dir/rank-0.jsonl");
  EXPECT_FALSE(bad.Append(StepRecord()).ok());
}

}  // namespace
}  // namespace tandem
