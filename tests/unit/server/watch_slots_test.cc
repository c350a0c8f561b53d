#include "server/watch_slots.h"

#include <optional>

#include "gtest/gtest.h"

namespace dcf::server {
namespace {

TEST(WatchSlotsTest, AdmitsUpToTheBoundsWithoutClosingAnything) {
  WatchSlots slots(/*max_total=*/4, /*max_per_peer=*/2);
  EXPECT_EQ(slots.Add(1, "a"), std::nullopt);
  EXPECT_EQ(slots.Add(2, "a"), std::nullopt);
  EXPECT_EQ(slots.Add(3, "b"), std::nullopt);
  EXPECT_EQ(slots.Add(4, "c"), std::nullopt);
  EXPECT_EQ(slots.size(), 4);
  EXPECT_EQ(slots.from("a"), 2);
}

TEST(WatchSlotsTest, AnAddressAtItsBoundGivesUpItsOldest) {
  WatchSlots slots(100, 3);
  for (uint64_t id = 1; id <= 3; ++id) slots.Add(id, "flood");
  EXPECT_EQ(slots.Add(4, "flood"), 1u);  // the oldest of its own
  EXPECT_EQ(slots.Add(5, "flood"), 2u);
  EXPECT_EQ(slots.from("flood"), 3);
  EXPECT_EQ(slots.Add(6, "other"), std::nullopt);  // others are not touched
  EXPECT_EQ(slots.size(), 4);
}

TEST(WatchSlotsTest, WhenAllAreTakenTheHeaviestAddressMakesRoom) {
  WatchSlots slots(/*max_total=*/6, /*max_per_peer=*/10);
  slots.Add(1, "lb");
  slots.Add(2, "flood");
  slots.Add(3, "flood");
  slots.Add(4, "client");
  slots.Add(5, "flood");
  slots.Add(6, "client");
  // A newcomer from a new address (a load balancer's check) gets in: the flood, which holds
  // the most, closes its oldest.
  EXPECT_EQ(slots.Add(7, "new"), 2u);
  EXPECT_EQ(slots.from("flood"), 2);
  // "client" and "flood" now hold two each: the first of them in order gives way.
  EXPECT_EQ(slots.Add(8, "new"), 4u);
  EXPECT_EQ(slots.from("client"), 1);
  // "flood" and "new" hold two each.
  EXPECT_EQ(slots.Add(9, "lb"), 3u);
  EXPECT_EQ(slots.from("lb"), 2);
  EXPECT_EQ(slots.from("flood"), 1);
  EXPECT_EQ(slots.size(), 6);
}

TEST(WatchSlotsTest, RemoveFreesASlotAndIgnoresUnknownIds) {
  WatchSlots slots(2, 2);
  slots.Add(1, "a");
  slots.Add(2, "a");
  EXPECT_EQ(slots.Add(3, "a"), 1u);
  slots.Remove(1);  // already closed to make room: ignored
  EXPECT_EQ(slots.size(), 2);
  slots.Remove(2);
  EXPECT_EQ(slots.size(), 1);
  EXPECT_EQ(slots.Add(4, "b"), std::nullopt);
  slots.Remove(99);
  EXPECT_EQ(slots.size(), 2);
}

// A flood of many connections from one address can never keep out a stream of another.
TEST(WatchSlotsTest, AFloodNeverKeepsANewcomerOut) {
  WatchSlots slots(/*max_total=*/64, /*max_per_peer=*/16);
  uint64_t id = 0;
  for (int i = 0; i < 1000; ++i) slots.Add(++id, "flood-" + std::to_string(i % 8));
  EXPECT_EQ(slots.size(), 64);
  for (int i = 0; i < 10; ++i) {
    const std::optional<uint64_t> victim = slots.Add(++id, "client-" + std::to_string(i));
    ASSERT_TRUE(victim.has_value());
    EXPECT_EQ(slots.from("client-" + std::to_string(i)), 1);
  }
  // Every client still holds its stream: the floods gave way, not the clients.
  for (int i = 0; i < 10; ++i) EXPECT_EQ(slots.from("client-" + std::to_string(i)), 1);
}

}  // namespace
}  // namespace dcf::server
