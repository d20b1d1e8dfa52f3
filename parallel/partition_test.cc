#include "parallel/partition.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(PartitionTest, EqualCostsSplitEvenly) {
  EXPECT_EQ(*BalancedPartition(std::vector<double>(8, 1.0), 4), (StageBounds{0, 2, 4, 6, 8}));
  EXPECT_EQ(*BalancedPartition(std::vector<double>(3, 1.0), 3), (StageBounds{0, 1, 2, 3}));
  EXPECT_EQ(*BalancedPartition(std::vector<double>(5, 1.0), 1), (StageBounds{0, 5}));
}

TEST(PartitionTest, MinimizesTheLargestStage) {
  // A heavy embedding and head (as in a GPT with a big vocabulary) get stages of their own.
  EXPECT_EQ(*BalancedPartition({10, 1, 1, 1, 1, 10}, 3), (StageBounds{0, 1, 5, 6}));
  // Brute force over every split of 7 blocks into 3 stages agrees on the optimum.
  const std::vector<double> c = {3, 1, 4, 1, 5, 9, 2};
  double best = 1e9;
  for (int a = 1; a < 7; ++a)
    for (int b = a + 1; b < 7; ++b) {
      double s0 = 0, s1 = 0, s2 = 0;
      for (int i = 0; i < 7; ++i) (i < a ? s0 : i < b ? s1 : s2) += c[i];
      best = std::min(best, std::max({s0, s1, s2}));
    }
  StageBounds got = *BalancedPartition(c, 3);
  double worst = 0;
  for (int s = 0; s < 3; ++s) {
    double sum = 0;
    for (int i = got[s]; i < got[s + 1]; ++i) sum += c[i];
    worst = std::max(worst, sum);
  }
  EXPECT_EQ(worst, best);
}

TEST(PartitionTest, MoreStagesThanBlocksIsRefused) {
  auto r = BalancedPartition(std::vector<double>(4, 1.0), 5);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("5 stages but the model has only 4 blocks"),
            std::string::npos);
}

TEST(PartitionTest, Explicit) {
  EXPECT_EQ(*ExplicitPartition("3,3,2", 8, 3), (StageBounds{0, 3, 6, 8}));
  auto sum = ExplicitPartition("3,3,3", 8, 3);
  ASSERT_FALSE(sum.ok());
  EXPECT_NE(sum.status().message().find("sums to 9 blocks but the model has 8"), std::string::npos);
  EXPECT_FALSE(ExplicitPartition("3,5", 8, 3).ok());
  EXPECT_FALSE(ExplicitPartition("3,0,5", 8, 3).ok());
  EXPECT_FALSE(ExplicitPartition("3,x,5", 8, 3).ok());
}

}  // namespace
}  // namespace tandem
