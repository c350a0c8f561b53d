#include "server/tls_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/file_util.h"
#include "openssl/bio.h"
#include "openssl/err.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/x509.h"

namespace dcf::server {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

BioPtr MemBio(std::string_view pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// OpenSSL's reason for the last failure, and the error queue cleared.
std::string SslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no PEM block of that kind";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

absl::Time AsnTime(const ASN1_TIME* t) {
  struct tm tm = {};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&tm));
}

// The certificate's subject as one line ("CN=server, O=...").
std::string Subject(X509* cert) {
  BioPtr out(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(out.get(), X509_get_subject_name(cert), 0, XN_FLAG_ONELINE & ~ASN1_STRFLGS_ESC_MSB);
  char* data = nullptr;
  const long n = BIO_get_mem_data(out.get(), &data);
  return std::string(data, n > 0 ? static_cast<size_t>(n) : 0);
}

absl::StatusOr<std::string> ReadFlagFile(const char* flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--", flag, ": ", text.status().message()));
  }
  return text;
}

// A memory file holding `content`, close-on-exec; -1 with errno on failure.
int MemoryFile(const char* name, std::string_view content) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return -1;
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int saved = errno;
      close(fd);
      errno = saved;
      return -1;
    }
    done += static_cast<size_t>(n);
  }
  return fd;
}

// Makes `*fd` a memory file holding `content`: the first time a new one, then in place of the
// old one (dup3 swaps what /proc/self/fd/N names in one step, so gRPC reads old or new, never
// a mix or a partial write).
absl::Status ReplaceMemoryFile(const char* name, std::string_view content, int* fd) {
  const int fresh = MemoryFile(name, content);
  if (fresh < 0) {
    return absl::InternalError(absl::StrCat("memfd_create(", name, "): ", std::strerror(errno)));
  }
  if (*fd < 0) {
    *fd = fresh;
    return absl::OkStatus();
  }
  if (dup3(fresh, *fd, O_CLOEXEC) < 0) {
    const int saved = errno;
    close(fresh);
    return absl::InternalError(absl::StrCat("dup3: ", std::strerror(saved)));
  }
  close(fresh);
  return absl::OkStatus();
}

bool ValidAt(const CertificateInfo& cert, absl::Time t) {
  return cert.not_before <= t && t <= cert.not_after;
}

}  // namespace

absl::StatusOr<CertificateInfo> ValidateKeyCertPair(std::string_view key_pem,
                                                    std::string_view cert_pem) {
  ERR_clear_error();
  BioPtr key_bio = MemBio(key_pem);
  PkeyPtr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, const_cast<char*>("")));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key: no usable PEM private key (", SslError(), ")"));
  }
  BioPtr cert_bio = MemBio(cert_pem);
  X509Ptr cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, const_cast<char*>("")));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-cert: no usable PEM certificate (", SslError(), ")"));
  }
  // The rest of the chain must parse too (gRPC would stop at the first bad one).
  while (true) {
    X509Ptr next(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, const_cast<char*>("")));
    if (next != nullptr) continue;
    const unsigned long e = ERR_peek_last_error();
    ERR_clear_error();
    if (e != 0 && ERR_GET_REASON(e) != PEM_R_NO_START_LINE) {
      return absl::InvalidArgumentError(
          "--tls-cert: a certificate of the chain after the first does not parse");
    }
    break;
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        "--tls-key: the private key is not the key of the --tls-cert certificate");
  }
  CertificateInfo info;
  info.subject = Subject(cert.get());
  info.not_before = AsnTime(X509_get0_notBefore(cert.get()));
  info.not_after = AsnTime(X509_get0_notAfter(cert.get()));
  return info;
}

absl::Status ValidateCaBundle(std::string_view pem) {
  ERR_clear_error();
  BioPtr bio = MemBio(pem);
  int count = 0;
  while (true) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, const_cast<char*>("")));
    if (cert != nullptr) {
      ++count;
      continue;
    }
    const unsigned long e = ERR_peek_last_error();
    ERR_clear_error();
    if (e != 0 && ERR_GET_REASON(e) != PEM_R_NO_START_LINE) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-client-ca: certificate ", count + 1, " does not parse"));
    }
    break;
  }
  if (count == 0) return absl::InvalidArgumentError("--tls-client-ca: holds no PEM certificate");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TlsFiles>> TlsFiles::Create(Paths paths) {
  std::unique_ptr<TlsFiles> files(new TlsFiles());
  files->paths_ = std::move(paths);
  absl::StatusOr<bool> loaded = files->Reload();
  if (!loaded.ok()) return loaded.status();
  files->identity_path_ = absl::StrCat("/proc/self/fd/", files->identity_fd_);
  if (files->client_ca_fd_ >= 0) {
    files->client_ca_path_ = absl::StrCat("/proc/self/fd/", files->client_ca_fd_);
  }
  return files;
}

TlsFiles::~TlsFiles() {
  if (identity_fd_ >= 0) close(identity_fd_);
  if (client_ca_fd_ >= 0) close(client_ca_fd_);
}

absl::StatusOr<bool> TlsFiles::Reload() {
  absl::StatusOr<std::string> cert = ReadFlagFile("tls-cert", paths_.cert);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFlagFile("tls-key", paths_.key);
  if (!key.ok()) return key.status();
  absl::StatusOr<CertificateInfo> info = ValidateKeyCertPair(*key, *cert);
  if (!info.ok()) return info.status();
  // Never an expired or not-yet-valid certificate over one that is valid now: every client
  // would refuse it. (At startup, or when the one in force is outside its period too, the new
  // one is taken: it cannot be worse, and the server logs its period.)
  const absl::Time now = absl::Now();
  if (!identity_pem_.empty() && ValidAt(certificate_, now) && !ValidAt(*info, now)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tls-cert: certificate '", info->subject, "' is ",
        info->not_after < now ? "expired since " : "valid only from ",
        absl::FormatTime(info->not_after < now ? info->not_after : info->not_before,
                         absl::UTCTimeZone())));
  }
  std::string ca;
  if (!paths_.client_ca.empty()) {
    absl::StatusOr<std::string> read = ReadFlagFile("tls-client-ca", paths_.client_ca);
    if (!read.ok()) return read.status();
    if (absl::Status s = ValidateCaBundle(*read); !s.ok()) return s;
    ca = *std::move(read);
  }
  // gRPC reads the key and the chain from this one file (PEM readers skip the other kind).
  std::string identity = absl::StrCat(*key, absl::EndsWith(*key, "\n") ? "" : "\n", *cert);
  bool changed = false;
  if (identity != identity_pem_ || identity_fd_ < 0) {
    if (absl::Status s = ReplaceMemoryFile("dcformer-tls-identity", identity, &identity_fd_);
        !s.ok()) {
      return s;
    }
    identity_pem_ = std::move(identity);
    certificate_ = *std::move(info);
    changed = true;
  }
  if (!paths_.client_ca.empty() && (ca != client_ca_pem_ || client_ca_fd_ < 0)) {
    if (absl::Status s = ReplaceMemoryFile("dcformer-tls-client-ca", ca, &client_ca_fd_);
        !s.ok()) {
      return s;
    }
    client_ca_pem_ = std::move(ca);
    changed = true;
  }
  return changed;
}

}  // namespace dcf::server
