#include "server/log_text.h"

#include <string>

#include "gtest/gtest.h"

namespace dcf::server {
namespace {

TEST(LogValueTest, PlainValuesStayAsTheyAre) {
  EXPECT_EQ(LogValue("req-7"), "req-7");
  EXPECT_EQ(LogValue("a.b_c:d/e@f+g-h"), "a.b_c:d/e@f+g-h");
}

TEST(LogValueTest, EverythingElseIsQuotedAndEscaped) {
  EXPECT_EQ(LogValue(""), "\"\"");
  EXPECT_EQ(LogValue("a b"), "\"a b\"");
  EXPECT_EQ(LogValue("x\noutcome=ok"), "\"x\\x0aoutcome=ok\"");
  EXPECT_EQ(LogValue("\x1b[31m"), "\"\\x1b[31m\"");
  EXPECT_EQ(LogValue("q\"\\"), "\"q\\\"\\\\\"");
  EXPECT_EQ(LogValue("\xff"), "\"\\xff\"");
}

TEST(LogValueTest, LongValuesAreCut) {
  const std::string id(200000, 'z');
  const std::string logged = LogValue(id, 16);
  EXPECT_EQ(logged, "\"zzzzzzzzzzzzzzzz\"...(200000 bytes)");
  EXPECT_EQ(LogValue(std::string(16, 'z'), 16), std::string(16, 'z'));
}

}  // namespace
}  // namespace dcf::server
