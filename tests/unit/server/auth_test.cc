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

TEST(ApiKeyCheckerTest, ReloadSwapsKeysAndKeepsTheLastGoodOnes) {
  const std::string path = ::testing::TempDir() + "/reload_keys.txt";
  std::ofstream(path) << "old\n";
  auto checker = ApiKeyChecker::FromFile(path);
  ASSERT_TRUE(checker.ok()) << checker.status();
  ApiKeyChecker& c = **checker;
  auto same = c.Reload();
  ASSERT_TRUE(same.ok());
  EXPECT_FALSE(*same);
  std::ofstream(path) << "old\nnew\n";
  auto changed = c.Reload();
  ASSERT_TRUE(changed.ok());
  EXPECT_TRUE(*changed);
  EXPECT_TRUE(c.CheckHeader("Bearer new").ok());
  EXPECT_TRUE(c.CheckHeader("Bearer old").ok());
  std::ofstream(path) << "new\n";
  ASSERT_TRUE(c.Reload().ok());
  EXPECT_FALSE(c.CheckHeader("Bearer old").ok());
  // An emptied file, a key with a space, a deleted file: errors, and "new" stays in force.
  for (const char* bad : {"# nothing\n", "has space\n"}) {
    std::ofstream(path) << bad;
    EXPECT_EQ(c.Reload().status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  std::remove(path.c_str());
  EXPECT_EQ(c.Reload().status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(c.CheckHeader("Bearer new").ok());
  EXPECT_EQ(c.num_keys(), 1);
  auto fixed = ApiKeyChecker::FromKeys({"k"});
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ((*fixed)->Reload().status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace dcf::server
