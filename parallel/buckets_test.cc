#include "parallel/buckets.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

ParamLayout Layout(const std::vector<int64_t>& sizes) {
  std::vector<ParamSpec> specs;
  for (size_t i = 0; i < sizes.size(); ++i) specs.push_back({"p" + std::to_string(i), {sizes[i]}});
  return ParamLayout(specs);
}

TEST(BucketsTest, ExactTable) {
  // Four parameters of 100, 50, 200 and 10 floats (400, 200, 800, 40 bytes), two blocks.
  ParamLayout l = Layout({100, 50, 200, 10});
  std::vector<Bucket> b = PlanBuckets(l, {0, 0, 1, 1}, 500);
  ASSERT_EQ(b.size(), 2u);
  // Reverse order: p3 (40 B) + p2 (800 B) reach 500 B -> bucket [p2, p3].
  EXPECT_EQ(b[0].first_param, 2);
  EXPECT_EQ(b[0].last_param, 3);
  EXPECT_EQ(b[0].begin, 150);
  EXPECT_EQ(b[0].end, 360);
  EXPECT_EQ(b[0].ready_block, 1);
  // Then p1 (200 B) + p0 (400 B).
  EXPECT_EQ(b[1].first_param, 0);
  EXPECT_EQ(b[1].last_param, 1);
  EXPECT_EQ(b[1].begin, 0);
  EXPECT_EQ(b[1].end, 150);
  EXPECT_EQ(b[1].ready_block, 0);
}

TEST(BucketsTest, TinyBucketsHoldOneParameterEach) {
  ParamLayout l = Layout({3, 4, 5});
  std::vector<Bucket> b = PlanBuckets(l, {0, 1, 2}, 1);
  ASSERT_EQ(b.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(b[i].first_param, 2 - i);
    EXPECT_EQ(b[i].last_param, 2 - i);
    EXPECT_EQ(b[i].ready_block, 2 - i);
  }
}

TEST(BucketsTest, HugeBucketHoldsEverything) {
  ParamLayout l = Layout({3, 4, 5});
  std::vector<Bucket> b = PlanBuckets(l, {0, 0, 1}, int64_t{1} << 40);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].begin, 0);
  EXPECT_EQ(b[0].end, 12);
  EXPECT_EQ(b[0].ready_block, 0);
}

TEST(BucketsTest, BucketsTileTheBufferWithoutGapsOrOverlap) {
  ParamLayout l = Layout({7, 1, 33, 2, 90, 5, 5, 64});
  std::vector<int> blocks = {0, 0, 1, 1, 2, 2, 3, 3};
  for (int64_t bytes : {1, 16, 100, 300, 1000}) {
    std::vector<Bucket> b = PlanBuckets(l, blocks, bytes);
    int64_t expect_end = l.numel();
    for (const Bucket& x : b) {
      EXPECT_EQ(x.end, expect_end);
      EXPECT_LT(x.begin, x.end);
      expect_end = x.begin;
    }
    EXPECT_EQ(expect_end, 0);
  }
}

}  // namespace
}  // namespace tandem
