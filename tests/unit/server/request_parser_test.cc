#include "server/request_parser.h"

#include <string>

#include "dcformer/v1/dcformer.pb.h"
#include "gtest/gtest.h"

namespace dcf::server {
namespace {

namespace v1 = ::dcformer::v1;

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

TEST(RequestParserTest, ParsesValidRequests) {
  v1::GenerateRequest in;
  in.set_text("héllo");
  in.mutable_stopping()->add_stop_strings("\xe2\x98\xba");
  v1::GenerateRequest out;
  ASSERT_TRUE(ParseRequestBytes(in.SerializeAsString(), &out).ok());
  EXPECT_EQ(out.text(), "héllo");
  EXPECT_EQ(out.stopping().stop_strings(0), "\xe2\x98\xba");
}

TEST(RequestParserTest, InvalidUtf8NamesTheField) {
  v1::GenerateRequest out;
  // The bytes: text = "Hello \xff\xfe \xc3".
  absl::Status s = ParseRequestBytes(
      Bytes({0x12, 0x0a, 'H', 'e', 'l', 'l', 'o', ' ', 0xff, 0xfe, ' ', 0xc3}), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "prompt.text: is not valid UTF-8 (byte 6)");
  // Nested and repeated: stopping { stop_strings: "ok", stop_strings: "a\x80" }.
  s = ParseRequestBytes(Bytes({0x2a, 0x08, 0x12, 0x02, 'o', 'k', 0x12, 0x02, 'a', 0x80}), &out);
  EXPECT_EQ(s.message(), "stopping.stop_strings[1]: is not valid UTF-8 (byte 1)");
  v1::TokenizeRequest tok;
  s = ParseRequestBytes(Bytes({0x0a, 0x02, 0xc0, 0xaf}), &tok);  // an overlong '/'
  EXPECT_EQ(s.message(), "text: is not valid UTF-8 (byte 0)");
}

TEST(RequestParserTest, MalformedBytesAreInvalidArgument) {
  v1::GenerateRequest out;
  for (const std::string& bytes : {Bytes({0xff, 0xff, 0xff, 0xff, 0x0f}),
                                   Bytes({0x12, 0x07, 0xa3, 0x30}),  // truncated string
                                   Bytes({0x2a, 0x05, 0x12})}) {     // truncated message
    const absl::Status s = ParseRequestBytes(bytes, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("not a valid dcformer.v1.GenerateRequest"), std::string::npos)
        << s.message();
  }
}

TEST(RequestParserTest, UnknownFieldsAreSkipped) {
  v1::GenerateRequest out;
  // field 99 (varint), field 100 (bytes with invalid UTF-8: not a string field of ours).
  const absl::Status s = ParseRequestBytes(
      Bytes({0x98, 0x06, 0x01, 0xa2, 0x06, 0x01, 0xff, 0x12, 0x01, 'x'}), &out);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(out.text(), "x");
}

}  // namespace
}  // namespace dcf::server
