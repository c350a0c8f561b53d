#include "engine/serving/stop_checker.h"

#include "gtest/gtest.h"

namespace dcf {
namespace {

TEST(StopStringMatcherTest, MatchAcrossPieces) {
  StopStringMatcher m({"END"}, false);
  EXPECT_EQ(m.Push("abc E"), "abc ");  // "E" could start "END": held back
  EXPECT_EQ(m.held(), 1u);
  EXPECT_EQ(m.Push("N"), "");
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.Push("Dxyz"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.Push("more"), "");
}

TEST(StopStringMatcherTest, IncludeStopString) {
  StopStringMatcher m({"END"}, true);
  EXPECT_EQ(m.Push("abEN"), "ab");
  EXPECT_EQ(m.Push("D!"), "END");
  EXPECT_TRUE(m.matched());
}

TEST(StopStringMatcherTest, FalseStartIsReleased) {
  StopStringMatcher m({"END"}, false);
  EXPECT_EQ(m.Push("xEN"), "x");
  EXPECT_EQ(m.Push("Q"), "ENQ");
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.Push("E"), "");
  EXPECT_EQ(m.Flush(), "E");
}

TEST(StopStringMatcherTest, EarliestOfSeveral) {
  StopStringMatcher m({"cd", "bcde"}, true);
  EXPECT_EQ(m.Push("ab"), "a");  // "b" may start "bcde"
  EXPECT_EQ(m.Push("cdef"), "bcde");  // "bcde" starts before "cd"
  EXPECT_TRUE(m.matched());
}

TEST(StopStringMatcherTest, MatchInsideOnePiece) {
  StopStringMatcher m({"\n\n"}, false);
  EXPECT_EQ(m.Push("line\n\nrest"), "line");
  EXPECT_TRUE(m.matched());
}

TEST(StopStringMatcherTest, NoStopStringsPassThrough) {
  StopStringMatcher m({}, false);
  EXPECT_EQ(m.Push("abc"), "abc");
  EXPECT_EQ(m.Flush(), "");
}

}  // namespace
}  // namespace dcf
