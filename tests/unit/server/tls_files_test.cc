#include "server/tls_files.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dcf::server {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Two self-signed key/certificate pairs made by the openssl CLI (scripts/setup.sh installs it).
class TlsFilesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Per process: CTest runs the cases of this suite in parallel processes.
    dir_ = new std::string(absl::StrCat(::testing::TempDir(), "/tls_files_test_", getpid()));
    const std::string cmd = absl::StrCat(
        "mkdir -p ", *dir_, " && cd ", *dir_,
        " && for n in a b; do openssl req -x509 -newkey rsa:2048 -nodes -days 2 -keyout $n.key"
        " -out $n.pem -subj /CN=$n >/dev/null 2>&1 || exit 1; done");
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }
  static std::string* dir_;
};
std::string* TlsFilesTest::dir_ = nullptr;

TEST_F(TlsFilesTest, ValidatesThePair) {
  auto info = ValidateKeyCertPair(Read(Path("a.key")), Read(Path("a.pem")));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->subject, "CN = a");
  EXPECT_GT(info->not_after, absl::Now() + absl::Hours(24));
  EXPECT_LT(info->not_before, absl::Now() + absl::Minutes(1));
  auto mismatch = ValidateKeyCertPair(Read(Path("b.key")), Read(Path("a.pem")));
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(mismatch.status().message(), "not the key of the --tls-cert"));
  auto no_key = ValidateKeyCertPair("garbage", Read(Path("a.pem")));
  EXPECT_TRUE(absl::StartsWith(no_key.status().message(), "--tls-key:")) << no_key.status();
  auto no_cert = ValidateKeyCertPair(Read(Path("a.key")), Read(Path("a.key")));
  EXPECT_TRUE(absl::StartsWith(no_cert.status().message(), "--tls-cert:")) << no_cert.status();
  EXPECT_TRUE(ValidateCaBundle(Read(Path("a.pem")) + Read(Path("b.pem"))).ok());
  EXPECT_FALSE(ValidateCaBundle("").ok());
  EXPECT_FALSE(ValidateCaBundle(Read(Path("a.key"))).ok());
}

TEST_F(TlsFilesTest, CopiesHoldOnlyValidatedMaterialAndBadReloadsKeepTheLast) {
  Write(Path("live.key"), Read(Path("a.key")));
  Write(Path("live.pem"), Read(Path("a.pem")));
  auto files = TlsFiles::Create({Path("live.key"), Path("live.pem"), Path("a.pem")});
  ASSERT_TRUE(files.ok()) << files.status();
  const std::string identity = (*files)->identity_path();
  EXPECT_TRUE(absl::StartsWith(identity, "/proc/self/fd/")) << identity;
  const std::string first = Read(identity);
  EXPECT_TRUE(absl::StrContains(first, Read(Path("a.key"))));
  EXPECT_TRUE(absl::StrContains(first, Read(Path("a.pem"))));
  EXPECT_EQ(Read((*files)->client_ca_path()), Read(Path("a.pem")));
  auto same = (*files)->Reload();
  ASSERT_TRUE(same.ok());
  EXPECT_FALSE(*same);
  // Garbage, a key of another certificate, a deleted file: refused, the copy unchanged.
  Write(Path("live.key"), "garbage");
  EXPECT_FALSE((*files)->Reload().ok());
  Write(Path("live.key"), Read(Path("b.key")));
  EXPECT_FALSE((*files)->Reload().ok());
  std::remove(Path("live.key").c_str());
  EXPECT_EQ((*files)->Reload().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Read(identity), first);
  EXPECT_EQ((*files)->certificate().subject, "CN = a");
  // A whole new pair replaces the copy under the same path.
  Write(Path("live.key"), Read(Path("b.key")));
  Write(Path("live.pem"), Read(Path("b.pem")));
  auto changed = (*files)->Reload();
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_TRUE(absl::StrContains(Read(identity), Read(Path("b.pem"))));
  EXPECT_EQ((*files)->certificate().subject, "CN = b");
}

TEST_F(TlsFilesTest, StartupNamesTheBadFlag) {
  EXPECT_EQ(TlsFiles::Create({Path("a.key"), Path("missing.pem"), ""}).status().code(),
            absl::StatusCode::kNotFound);
  auto mismatch = TlsFiles::Create({Path("b.key"), Path("a.pem"), ""});
  EXPECT_TRUE(absl::StartsWith(mismatch.status().message(), "--tls-key:")) << mismatch.status();
  auto bad_ca = TlsFiles::Create({Path("a.key"), Path("a.pem"), Path("a.key")});
  EXPECT_TRUE(absl::StartsWith(bad_ca.status().message(), "--tls-client-ca:")) << bad_ca.status();
}

}  // namespace
}  // namespace dcf::server
