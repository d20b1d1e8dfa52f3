// Hostfiles: Open MPI's format parsed, bad lines named, slots summed; the coordinator's
// default address for a hostfile of this host only is loopback.
#include "launcher/hostfile.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace launcher {
namespace {

using ::testing::HasSubstr;

TEST(Hostfile, Parses) {
  auto h = ParseHostfile(
      "# two nodes\n"
      "node1 slots=4 max_slots=8\n"
      "\n"
      "  10.0.0.2   slots=2   # the second\n");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->size(), 2u);
  EXPECT_EQ((*h)[0].host, "node1");
  EXPECT_EQ((*h)[0].slots, 4);
  EXPECT_EQ((*h)[1].host, "10.0.0.2");
  EXPECT_EQ((*h)[1].slots, 2);
  EXPECT_EQ(TotalSlots(*h), 6);
  auto no_slots = ParseHostfile("a\nb slots=2\n");
  ASSERT_TRUE(no_slots.ok());
  EXPECT_EQ(TotalSlots(*no_slots), -1);
}

TEST(Hostfile, BadLinesAreNamed) {
  auto bad = ParseHostfile("node1 slots=4\nnode2 slots=many\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 2: 'slots=many'"));
  EXPECT_FALSE(ParseHostfile("node1 cpus=4\n").ok());
  EXPECT_FALSE(ParseHostfile("# nothing\n\n").ok());
}

TEST(Hostfile, CoordinatorOnLoopbackWhenEveryHostIsThisOne) {
  auto h = DefaultCoordinatorHost(*ParseHostfile("localhost slots=2\n127.0.0.1 slots=2\n"));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, "127.0.0.1");
}

}  // namespace
}  // namespace launcher
}  // namespace tandem
