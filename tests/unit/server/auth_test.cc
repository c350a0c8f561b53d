#include "server/auth.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/match.h"
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
  EXPECT_FALSE(same->changed);
  EXPECT_EQ(same->bad_lines, "");
  std::ofstream(path) << "old\nnew\n";
  auto changed = c.Reload();
  ASSERT_TRUE(changed.ok());
  EXPECT_TRUE(changed->changed);
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

// The review's case: revoking "old" while another line is bad (a key with a space, a stray
// control character) must still revoke it; the bad lines are named by number, never shown.
TEST(ApiKeyCheckerTest, ReloadRevokesAKeyEvenWhenAnotherLineIsBad) {
  const std::string path = ::testing::TempDir() + "/revoke_keys.txt";
  std::ofstream(path) << "old\nnew\n";
  auto checker = ApiKeyChecker::FromFile(path);
  ASSERT_TRUE(checker.ok()) << checker.status();
  ApiKeyChecker& c = **checker;
  std::ofstream(path) << "# old revoked\nnew\nsecret with-space\n\nbell\a-key\nthird\n";
  auto reloaded = c.Reload();
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_TRUE(reloaded->changed);
  EXPECT_TRUE(absl::StrContains(reloaded->bad_lines, "lines 3, 5 are not a key"))
      << reloaded->bad_lines;
  EXPECT_FALSE(absl::StrContains(reloaded->bad_lines, "secret")) << "content leaked";
  EXPECT_FALSE(absl::StrContains(reloaded->bad_lines, "bell")) << "content leaked";
  EXPECT_EQ(c.CheckHeader("Bearer old").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(c.CheckHeader("Bearer new").ok());
  EXPECT_TRUE(c.CheckHeader("Bearer third").ok());
  EXPECT_FALSE(c.CheckHeader("Bearer secret with-space").ok());
  EXPECT_EQ(c.num_keys(), 2);
  // Fixed: no bad line reported any more.
  std::ofstream(path) << "new\nthird\n";
  reloaded = c.Reload();
  ASSERT_TRUE(reloaded.ok());
  EXPECT_FALSE(reloaded->changed);
  EXPECT_EQ(reloaded->bad_lines, "");
  // At startup a bad line is an error, named by number.
  std::ofstream(path) << "good\nbad key\n";
  auto strict = ApiKeyChecker::FromFile(path);
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(strict.status().message(), "line 2 is not a key"))
      << strict.status();
  EXPECT_FALSE(absl::StrContains(strict.status().message(), "bad key"));
  std::remove(path.c_str());
}

TEST(ApiKeyCheckerTest, IgnoresAUtf8ByteOrderMark) {
  const std::string path = ::testing::TempDir() + "/bom_keys.txt";
  std::ofstream(path, std::ios::binary) << "\xEF\xBB\xBF" "first\r\nsecond\r\n";
  auto checker = ApiKeyChecker::FromFile(path);
  ASSERT_TRUE(checker.ok()) << checker.status();
  EXPECT_TRUE((*checker)->CheckHeader("Bearer first").ok());
  EXPECT_TRUE((*checker)->CheckHeader("Bearer second").ok());
  std::ofstream(path, std::ios::binary) << "\xEF\xBB\xBF" "second\n";
  auto reloaded = (*checker)->Reload();
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ(reloaded->bad_lines, "");
  EXPECT_FALSE((*checker)->CheckHeader("Bearer first").ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace dcf::server
