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
#include "openssl/bio.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/x509.h"

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

// A self-signed certificate for the PEM key `key_pem`, valid from now + `from` to now + `until`
// (the openssl CLI of Debian 12 cannot date a certificate in the past).
std::string CertificateFor(const std::string& key_pem, const char* cn, absl::Duration from,
                           absl::Duration until) {
  BIO* key_bio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  BIO_free(key_bio);
  EXPECT_NE(key, nullptr);
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 7);
  X509_gmtime_adj(X509_getm_notBefore(cert), absl::ToInt64Seconds(from));
  X509_gmtime_adj(X509_getm_notAfter(cert), absl::ToInt64Seconds(until));
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn),
                             -1, -1, 0);
  X509_set_issuer_name(cert, name);
  EXPECT_GT(X509_sign(cert, key, EVP_sha256()), 0);
  BIO* out = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(out, cert);
  char* data = nullptr;
  const long n = BIO_get_mem_data(out, &data);
  std::string pem(data, n > 0 ? static_cast<size_t>(n) : 0);
  BIO_free(out);
  X509_free(cert);
  EVP_PKEY_free(key);
  return pem;
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

// The review's case: a certificate expired 30 days ago was reloaded over a valid one and
// served. Neither an expired nor a not-yet-valid one may replace a valid certificate; when
// the one in force is outside its period too, the new one is taken.
TEST_F(TlsFilesTest, ReloadNeverPutsACertificateOutsideItsPeriodOverAValidOne) {
  const std::string b_key = Read(Path("b.key"));
  const std::string expired =
      CertificateFor(b_key, "expired", -absl::Hours(24 * 60), -absl::Hours(24 * 30));
  const std::string future =
      CertificateFor(b_key, "future", absl::Hours(24), absl::Hours(24 * 30));
  Write(Path("period.key"), Read(Path("a.key")));
  Write(Path("period.pem"), Read(Path("a.pem")));
  auto files = TlsFiles::Create({Path("period.key"), Path("period.pem"), ""});
  ASSERT_TRUE(files.ok()) << files.status();
  const std::string first = Read((*files)->identity_path());
  Write(Path("period.key"), b_key);
  Write(Path("period.pem"), expired);
  auto refused = (*files)->Reload();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "--tls-cert: certificate 'CN = expired' is expired since"))
      << refused.status();
  Write(Path("period.pem"), future);
  refused = (*files)->Reload();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "is valid only from"))
      << refused.status();
  EXPECT_EQ(Read((*files)->identity_path()), first);
  EXPECT_EQ((*files)->certificate().subject, "CN = a");
  // A valid one is still taken.
  const std::string valid = CertificateFor(b_key, "valid", -absl::Hours(1), absl::Hours(24));
  Write(Path("period.pem"), valid);
  auto taken = (*files)->Reload();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_TRUE(*taken);
  EXPECT_EQ((*files)->certificate().subject, "CN = valid");
  // Starting with an expired certificate (the server warns), a not-yet-valid one replaces
  // it: no worse, and the next fix is not blocked.
  Write(Path("period.pem"), expired);
  auto stale = TlsFiles::Create({Path("period.key"), Path("period.pem"), ""});
  ASSERT_TRUE(stale.ok()) << stale.status();
  Write(Path("period.pem"), future);
  auto replaced = (*stale)->Reload();
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ((*stale)->certificate().subject, "CN = future");
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
