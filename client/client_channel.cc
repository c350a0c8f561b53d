#include "client/client_channel.h"

#include <chrono>
#include <string_view>

#include <openssl/ssl.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/file_util.h"

namespace dcf::client {
namespace {

absl::StatusOr<std::string> ReadFile(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat("--", flag, ": ", text.status().message()));
  }
  return text;
}

}  // namespace

absl::StatusOr<ClientChannel> ClientChannel::Create(const ChannelOptions& options) {
  // OpenSSL's atexit cleanup would free its global state while a gRPC thread may still be
  // handshaking (a channel whose connection failed keeps retrying): the process exited with
  // SIGSEGV about once in 100 failed TLS connects (grpc/grpc#38539; gRPC 1.83 makes the same
  // call). It must come before anything else initializes OpenSSL.
  OPENSSL_init_ssl(OPENSSL_INIT_NO_ATEXIT, nullptr);
  ClientChannel out;
  out.timeout_ = options.timeout;
  if (!options.api_key_file.empty()) {
    absl::StatusOr<std::string> text = ReadFile("api-key-file", options.api_key_file);
    if (!text.ok()) return text.status();
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || absl::StartsWith(line, "#")) continue;
      out.api_key_ = std::string(line);
      break;
    }
    if (out.api_key_.empty()) {
      return absl::InvalidArgumentError("--api-key-file: the file contains no key");
    }
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  const bool tls = options.tls || !options.tls_ca.empty() || !options.tls_cert.empty();
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca.empty()) {
      absl::StatusOr<std::string> ca = ReadFile("tls-ca", options.tls_ca);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
    }
    if (options.tls_cert.empty() != options.tls_key.empty()) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
    }
    if (!options.tls_cert.empty()) {
      absl::StatusOr<std::string> cert = ReadFile("tls-cert", options.tls_cert);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadFile("tls-key", options.tls_key);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  out.channel_ = grpc::CreateCustomChannel(options.target, credentials, args);
  return out;
}

void ClientChannel::Prepare(grpc::ClientContext* context) const {
  if (!api_key_.empty()) context->AddMetadata("authorization", "Bearer " + api_key_);
  if (timeout_ > absl::ZeroDuration()) {
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::microseconds(absl::ToInt64Microseconds(timeout_)));
  }
}

std::string StatusCodeName(grpc::StatusCode code) {
  static constexpr std::string_view kNames[] = {"OK",
                                                "CANCELLED",
                                                "UNKNOWN",
                                                "INVALID_ARGUMENT",
                                                "DEADLINE_EXCEEDED",
                                                "NOT_FOUND",
                                                "ALREADY_EXISTS",
                                                "PERMISSION_DENIED",
                                                "RESOURCE_EXHAUSTED",
                                                "FAILED_PRECONDITION",
                                                "ABORTED",
                                                "OUT_OF_RANGE",
                                                "UNIMPLEMENTED",
                                                "INTERNAL",
                                                "UNAVAILABLE",
                                                "DATA_LOSS",
                                                "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  if (i >= 0 && i < static_cast<int>(std::size(kNames))) return std::string(kNames[i]);
  return absl::StrCat("CODE_", i);
}

}  // namespace dcf::client
