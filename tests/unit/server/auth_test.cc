#include "server/auth.h"

#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"

namespace dcf::server {
namespace {

TEST(ApiKeyCheckerTest, AcceptsBearerKeysAndRejectsOthers) {
  auto checker = ApiKeyChecker::FromKeys({"alpha-1", "beta-2"});
  ASSERT_TRUE(checker.ok());
  EXPECT_TRUE((*checker)->CheckHeader("Bearer alpha-1").ok());
  EXPECT_TRUE((*checker)->CheckHeader("bearer beta-2").ok());
  EXPECT_TRUE((*checker)->CheckHeader("  Bearer   beta-2  ").ok());
  for (const char* bad : {"", "alpha-1", "Bearer", "Bearer ", "Bearer alpha-", "Bearer alpha-12",
                          "Basic alpha-1", "Bearer ALPHA-1"}) {
    absl::Status s = (*checker)->CheckHeader(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << bad;
    EXPECT_EQ(std::string(s.message()).find("alpha-1"), std::string::npos) << "key leaked";
  }
}

TEST(ApiKeyCheckerTest, ChecksMetadata) {
  auto checker = ApiKeyChecker::FromKeys({"k"});
  ASSERT_TRUE(checker.ok());
  std::multimap<grpc::string_ref, grpc::string_ref> md;
  EXPECT_EQ((*checker)->Check(md).code(), absl::StatusCode::kUnauthenticated);
  md.emplace("authorization", "Bearer k");
  EXPECT_TRUE((*checker)->Check(md).ok());
}

TEST(ApiKeyCheckerTest, FileSkipsCommentsAndBlankLines) {
  const std::string path = ::testing::TempDir() + "/keys.txt";
  {
    std::ofstream out(path);
    out << "# comment\n\n  first-key  \nsecond\n";
  }
  auto checker = ApiKeyChecker::FromFile(path);
  ASSERT_TRUE(checker.ok()) << checker.status();
  EXPECT_TRUE((*checker)->CheckHeader("Bearer first-key").ok());
  EXPECT_TRUE((*checker)->CheckHeader("Bearer second").ok());
  EXPECT_FALSE((*checker)->CheckHeader("Bearer # comment").ok());
  {
    std::ofstream out(path);
    out << "# only a comment\n";
  }
  EXPECT_EQ(ApiKeyChecker::FromFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ApiKeyChecker::FromFile(path + ".missing").status().code(),
            absl::StatusCode::kNotFound);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace dcf::server
