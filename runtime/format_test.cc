#include "runtime/format.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(FormatBytes, PicksTheUnit) {
  EXPECT_EQ(FormatBytes(512 << 10), "512 KB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 19), "1.5 MB");
  EXPECT_EQ(FormatBytes(512 << 20), "512 MB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 29), "1.5 GB");
  EXPECT_EQ(FormatBytes(int64_t{5} << 39), "2.5 TB");
  EXPECT_EQ(FormatBytes(-1), "-");
}

}  // namespace
}  // namespace tandem
