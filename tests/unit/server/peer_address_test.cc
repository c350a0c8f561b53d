#include "server/peer_address.h"

#include "gtest/gtest.h"

namespace dcf::server {
namespace {

TEST(PeerAddressTest, DropsThePort) {
  EXPECT_EQ(PeerAddress("ipv4:127.0.0.1:53412"), "ipv4:127.0.0.1");
  EXPECT_EQ(PeerAddress("ipv4:10.1.2.3:1"), "ipv4:10.1.2.3");
  EXPECT_EQ(PeerAddress("ipv6:[::1]:50051"), "ipv6:[::1]");
  EXPECT_EQ(PeerAddress("ipv6:%5B::1%5D:50051"), "ipv6:[::1]");  // gRPC's URI escaping
  EXPECT_EQ(PeerAddress("ipv6:[fe80::1:2]:443"), "ipv6:[fe80::1:2]");
}

TEST(PeerAddressTest, TwoConnectionsOfOneClientShareTheirAddress) {
  EXPECT_EQ(PeerAddress("ipv4:192.168.0.9:40000"), PeerAddress("ipv4:192.168.0.9:40001"));
  EXPECT_NE(PeerAddress("ipv4:192.168.0.9:40000"), PeerAddress("ipv4:192.168.0.19:40000"));
}

TEST(PeerAddressTest, KeepsWhatItDoesNotKnow) {
  EXPECT_EQ(PeerAddress("unix:/tmp/s"), "unix:/tmp/s");
  EXPECT_EQ(PeerAddress("fd:7"), "fd:7");
  EXPECT_EQ(PeerAddress("ipv4:1.2.3.4"), "ipv4:1.2.3.4");
  EXPECT_EQ(PeerAddress(""), "");
}

}  // namespace
}  // namespace dcf::server
