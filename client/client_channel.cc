#include "client/client_channel.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string_view>

#include <openssl/ssl.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/file_util.h"
#include "proto/rpc/grpc_log.h"

namespace dcf::client {
namespace {

absl::StatusOr<std::string> ReadFile(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--", flag, ": ", text.status().message()));
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
  out.tls_ = tls;
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
  if (options.max_reconnect_backoff > absl::ZeroDuration()) {
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(options.max_reconnect_backoff));
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(ms, 100));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::min(ms, 100));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ms);
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

void InstallClientGrpcLogging() { rpc::InstallGrpcLogSink(/*print=*/false); }

std::string DescribeRpcError(const grpc::Status& status, bool tls) {
  std::string out = absl::StrCat(StatusCodeName(status.error_code()), ": ", status.error_message());
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return out;
  // What gRPC 1.51 says when the two ends disagree about TLS: a TLS server closes a plaintext
  // connection ("Socket closed"); a plaintext server answers the TLS handshake with bytes that
  // are no TLS record ("wrong version number"); an untrusted or misnamed certificate fails
  // verification.
  const std::string& m = status.error_message();
  const size_t unhinted = out.size();
  if (!tls && absl::StrContains(m, "Socket closed")) {
    absl::StrAppend(&out, " (the server may require TLS: try --tls or --tls-ca FILE)");
  } else if (tls && absl::StrContains(m, "certificate verify failed")) {
    absl::StrAppend(&out,
                    " (the server's certificate is not signed by a trusted CA or does not "
                    "name the target: check --tls-ca and --tls-server-name)");
  } else if (tls && absl::StrContains(m, "wrong version number")) {
    absl::StrAppend(&out, " (the server may not use TLS: try without --tls and --tls-ca)");
  }
  // No hint above: what gRPC logged may explain it (a TLS file it could not use).
  const std::string logged = rpc::FirstGrpcError();
  if (out.size() == unhinted && !logged.empty() && !absl::StrContains(m, logged)) {
    absl::StrAppend(&out, " (gRPC: ", logged, ")");
  }
  return out;
}

}  // namespace dcf::client
