// The server's TLS material as gRPC reads it: validated in-memory copies of --tls-key,
// --tls-cert and --tls-client-ca, so that gRPC never sees a file it cannot use.
//
// gRPC's FileWatcherCertificateProvider re-reads its files every --tls-reload-interval and
// takes whatever it finds: a garbage file, a key of another certificate or a deleted file
// break every new handshake, with only a log line of its own. Here the server reads the
// files instead, validates them (PEM that parses, the key is the certificate's, the CA file
// holds certificates), and hands gRPC copies that hold only validated material: memory files
// (memfd) named /proc/self/fd/N, the key and its certificate chain in one file, so that a
// rotation replaces both at once. A reload that finds bad material keeps the last good copy
// in force (the caller logs and counts it); so does one whose certificate is expired or not
// yet valid while the one in force is valid now.
//
// Thread-safety: Reload and the accessors are for one thread (the server's reload thread
// and, before that, Start).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dcf::server {

struct CertificateInfo {
  std::string subject;  // one line, e.g. "CN=server"
  absl::Time not_before;
  absl::Time not_after;
};

// The first certificate of `cert_pem` (a chain) and its check against `key_pem`.
// InvalidArgument naming the flag (--tls-key / --tls-cert) for PEM that does not parse, and
// "--tls-key: the private key is not the key of the --tls-cert certificate" for a mismatch.
absl::StatusOr<CertificateInfo> ValidateKeyCertPair(std::string_view key_pem,
                                                    std::string_view cert_pem);
// InvalidArgument ("--tls-client-ca: ...") unless `pem` holds at least one certificate and
// nothing that fails to parse.
absl::Status ValidateCaBundle(std::string_view pem);

class TlsFiles {
 public:
  struct Paths {
    std::string key, cert, client_ca;  // client_ca may be empty (no mTLS)
  };
  // Reads and validates the files; the error names the flag (a missing file is NotFound).
  static absl::StatusOr<std::unique_ptr<TlsFiles>> Create(Paths paths);
  ~TlsFiles();
  TlsFiles(const TlsFiles&) = delete;
  TlsFiles& operator=(const TlsFiles&) = delete;

  // Paths of the validated copies, for FileWatcherCertificateProvider (key and certificate
  // are the same file). client_ca_path() is empty without --tls-client-ca.
  const std::string& identity_path() const { return identity_path_; }
  const std::string& client_ca_path() const { return client_ca_path_; }
  const CertificateInfo& certificate() const { return certificate_; }

  // Re-reads the files. True when they changed and the copies now hold the new material,
  // false when nothing changed; an error when the files are bad (the last good copies stay):
  // FailedPrecondition ("--tls-cert: certificate '...' is expired since ..." / "is valid only
  // from ...") for a certificate outside its validity period replacing one inside it.
  absl::StatusOr<bool> Reload();

 private:
  TlsFiles() = default;
  Paths paths_;
  int identity_fd_ = -1;
  int client_ca_fd_ = -1;
  std::string identity_path_, client_ca_path_;
  std::string identity_pem_, client_ca_pem_;  // what the copies hold now
  CertificateInfo certificate_;
};

}  // namespace dcf::server
