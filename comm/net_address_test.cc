// Host addresses: loopback is local and routes to itself, names resolve, host:port splits.
#include "comm/net_address.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(NetAddress, Loopback) {
  EXPECT_TRUE(IsLocalIpv4("127.0.0.1"));
  EXPECT_TRUE(IsLocalIpv4("127.3.2.1"));
  EXPECT_FALSE(IsLocalIpv4("not an address"));
  auto src = RouteSourceIpv4("127.0.0.1");
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ(*src, "127.0.0.1");
  EXPECT_FALSE(RouteSourceIpv4("nope").ok());
}

TEST(NetAddress, Resolve) {
  EXPECT_EQ(*ResolveIpv4("10.1.2.3"), "10.1.2.3");
  auto local = ResolveIpv4("localhost");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(IsLocalIpv4(*local));
  EXPECT_FALSE(ResolveIpv4("no-such-host.invalid").ok());
  const std::string mine = ThisHostIpv4();
  if (!mine.empty()) {
    EXPECT_TRUE(IsLocalIpv4(mine)) << mine;
  }
}

TEST(NetAddress, SplitHostPort) {
  std::string host;
  int port = -1;
  ASSERT_TRUE(SplitHostPort("10.0.0.1:5000", &host, &port).ok());
  EXPECT_EQ(host, "10.0.0.1");
  EXPECT_EQ(port, 5000);
  ASSERT_TRUE(SplitHostPort("node7", &host, &port).ok());
  EXPECT_EQ(host, "node7");
  EXPECT_EQ(port, 0);
  EXPECT_FALSE(SplitHostPort("node7:http", &host, &port).ok());
  EXPECT_FALSE(SplitHostPort("node7:70000", &host, &port).ok());
  EXPECT_FALSE(SplitHostPort(":5000", &host, &port).ok());
}

}  // namespace
}  // namespace tandem
