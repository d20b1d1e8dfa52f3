// StepHandovers: each receive set against the action that sent it, on one clock, where the
// receiving stream was already waiting when the sender ended.
#include <algorithm>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "parallel/distributed.h"
#include "parallel/schedule.h"

namespace tandem {
namespace {

using Times = std::vector<std::vector<StepTiming::ActionTimes>>;

std::vector<double> Sorted(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// 1F1B on 2 stages, one micro-batch: stage 0's F0 then B0, stage 1's F0 then B0 (µs).
TEST(StepHandoversTest, OneMicroBatchByHand) {
  const PipelineSchedule s = *MakeSchedule("1f1b", 2, 1);
  // Stage 0's F0 ends at 10; stage 1, waiting since 5, resumes at 13 (3 µs). Stage 1's B0
  // ends at 35; stage 0, waiting since 30, resumes at 42 (7 µs).
  Times t = {{{-1, -1, 10}, {30, 42, 60}}, {{5, 13, 20}, {-1, -1, 35}}};
  std::vector<double> h = Sorted(StepHandovers(s, t));
  ASSERT_EQ(h.size(), 2u);
  EXPECT_NEAR(h[0], 3e-6, 1e-15);
  EXPECT_NEAR(h[1], 7e-6, 1e-15);
  // Stage 0 reached its wait only at 36, after the gradient's sender ended: no handover.
  t[0][1] = {36, 42, 60};
  h = StepHandovers(s, t);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_NEAR(h[0], 3e-6, 1e-15);
  // A stage's times missing: its receives and the receives from it are skipped.
  t[0][1] = {30, 42, 60};
  EXPECT_EQ(StepHandovers(s, t).size(), 2u);
  EXPECT_TRUE(StepHandovers(s, {t[0]}).empty());
}

// Interleaved 1F1B, K = 2 stages of v = 2 chunks, M = 4, and ZB-H1 on 3 stages: global stage
// g runs on stage g mod K as chunk g div K, so a forward on global stage g receives from
// g - 1's forward and a backward (or B) from g + 1's. Every action ends at a time that names
// it, every receiving stream waits from time 0 and resumes a distinct delay after the end of
// the sender this test places by that rule, so each handover is that delay only if the
// sender was matched right.
TEST(StepHandoversTest, SendersPlacedAcrossChunks) {
  for (const auto& [name, K, M, v] :
       std::vector<std::tuple<const char*, int, int, int>>{{"interleaved", 2, 4, 2},
                                                           {"zb-h1", 3, 6, 1}}) {
    const PipelineSchedule s = *MakeSchedule(name, K, M, v);
    auto end_of = [](int stage, ActionType type, int chunk, int mb) {
      return 1e6 * (stage + 1) + 1e4 * static_cast<int>(type) + 1e3 * chunk + 10.0 * mb;
    };
    Times t(K);
    std::vector<double> expected;
    for (int st = 0; st < K; ++st) {
      for (const Action& a : s.actions[st]) {
        if (!a.is_compute()) continue;
        StepTiming::ActionTimes x;
        x.end_us = end_of(st, a.type, a.chunk, a.micro_batch);
        const int g = a.chunk * K + st;
        const int from = a.type == ActionType::kForward ? g - 1
                         : a.type == ActionType::kBackward ? g + 1
                                                           : -1;
        if (from >= 0 && from < K * v) {
          const double delay = static_cast<double>(t[st].size() + 1 + 100 * st);
          x.wait_us = 0;
          x.resumed_us = end_of(from % K, a.type, from / K, a.micro_batch) + delay;
          expected.push_back(1e-6 * delay);
        }
        t[st].push_back(x);
      }
    }
    const std::vector<double> h = Sorted(StepHandovers(s, t));
    expected = Sorted(expected);
    ASSERT_EQ(h.size(), expected.size()) << name;
    for (size_t i = 0; i < h.size(); ++i) EXPECT_NEAR(h[i], expected[i], 1e-12) << name;
  }
}

}  // namespace
}  // namespace tandem
