// dcformer-cli: command-line client of dcformer-server.
//
//   dcformer-cli generate --prompt "Hello" [--max-new-tokens 32] [--temperature 0] [--json]
//   dcformer-cli generate --prompt-ids 1,2,3 --max-new-tokens 8
//   dcformer-cli tokenize --prompt "Hello"      dcformer-cli detokenize --prompt-ids 1,2,3
//   dcformer-cli info                            dcformer-cli health [--service NAME]
//
// Common flags: --target host:port, --api-key-file, --tls / --tls-ca / --tls-cert / --tls-key
// / --tls-server-name, --timeout (e.g. 30s), --wait-ready[=TIMEOUT] (first wait up to TIMEOUT,
// default 60s, for the server to listen and report SERVING). generate streams text to stdout
// as it arrives (token ids, comma-separated, when the response carries no text); the finish
// reason and usage go to stderr. --json prints each response message as one JSON line instead.
// Exit codes: 0 success, 1 RPC failure (code and message on stderr), NOT_SERVING or a server
// not ready within --wait-ready, 2 usage.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client_channel.h"
#include "client/wait_ready.h"
#include "dcformer/v1/dcformer.grpc.pb.h"
#include "engine/common/flag_names.h"
#include "engine/common/id_list.h"
#include "engine/common/status_macros.h"
#include "engine/common/utf8.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "server address host:port");
ABSL_FLAG(std::string, api_key_file, "", "file whose first line is the API key");
ABSL_FLAG(bool, tls, false, "use TLS (system roots unless --tls-ca)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificate(s) to verify the server");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mTLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM client private key (mTLS)");
ABSL_FLAG(std::string, tls_server_name, "", "name to verify in the server certificate");
ABSL_FLAG(absl::Duration, timeout, absl::ZeroDuration(), "call deadline, e.g. 30s; 0 = none");
ABSL_FLAG(absl::Duration, wait_ready, absl::ZeroDuration(),
          "first wait up to this long (bare --wait-ready: 60s) for the server to listen and its "
          "health to report SERVING (a server still loading its model), then make the call; "
          "0 = fail at once when it is not ready");
ABSL_FLAG(std::string, prompt, "", "prompt text (generate, tokenize)");
ABSL_FLAG(std::string, prompt_ids, "", "prompt as comma-separated token ids");
ABSL_FLAG(std::string, request_id, "", "request id to send (echoed back)");
ABSL_FLAG(int, max_new_tokens, 0, "tokens to generate (default: the server's)");
ABSL_FLAG(double, temperature, 1.0, "sampling temperature; 0 = greedy");
ABSL_FLAG(int, top_k, 0, "top-k sampling (0 = off)");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling mass");
ABSL_FLAG(double, min_p, 0.0, "min-p sampling");
ABSL_FLAG(double, repetition_penalty, 1.0, "repetition penalty (1 = off)");
ABSL_FLAG(double, presence_penalty, 0.0, "presence penalty");
ABSL_FLAG(double, frequency_penalty, 0.0, "frequency penalty");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings, comma-separated");
ABSL_FLAG(std::string, stop_token_ids, "", "stop token ids, comma-separated");
ABSL_FLAG(bool, ignore_eos, false, "keep generating after EOS");
ABSL_FLAG(bool, logprobs, false, "request logprobs (shown with --json)");
ABSL_FLAG(int, top_logprobs, 0, "request this many alternatives per token (shown with --json)");
ABSL_FLAG(bool, text, true, "ask for text (--notext: token ids only)");
ABSL_FLAG(bool, json, false, "print each response message as one JSON line");
ABSL_FLAG(bool, skip_special_tokens, false, "detokenize: leave out special tokens");
ABSL_FLAG(std::string, service, "", "health: service name ('' = whole server)");

namespace {

namespace v1 = ::dcformer::v1;

// Flags given on the command line, so that unset sampling flags stay unset in the request
// instead of sending the defaults.
absl::flat_hash_set<std::string>& GivenFlags() {
  static auto* given = new absl::flat_hash_set<std::string>();
  return *given;
}

bool Specified(absl::string_view name) { return GivenFlags().contains(name); }

int Usage(absl::string_view message) {
  std::cerr << "dcformer-cli: " << message << "\n";
  return 2;
}

int RpcFailed(const grpc::Status& status, const dcf::client::ClientChannel& channel) {
  std::cerr << "dcformer-cli: RPC failed: " << dcf::client::DescribeRpcError(status, channel.tls())
            << "\n";
  return 1;
}

// Protobuf would log an error and send invalid UTF-8 in a string field anyway (the server
// then rejects it): refuse it here, naming the flag.
absl::Status CheckUtf8(absl::string_view flag, absl::string_view value) {
  const size_t bad = dcf::FirstInvalidUtf8(std::string_view(value.data(), value.size()));
  if (bad == std::string_view::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, ": is not valid UTF-8 (byte ", bad, ")"));
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

absl::StatusOr<v1::GenerateRequest> BuildGenerateRequest() {
  v1::GenerateRequest request;
  RETURN_IF_ERROR(CheckUtf8("request-id", absl::GetFlag(FLAGS_request_id)));
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  if (Specified("prompt_ids")) {
    absl::StatusOr<std::vector<int32_t>> ids =
        dcf::ParseIdList("prompt-ids", absl::GetFlag(FLAGS_prompt_ids));
    if (!ids.ok()) return ids.status();
    request.mutable_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
  } else if (Specified("prompt")) {
    RETURN_IF_ERROR(CheckUtf8("prompt", absl::GetFlag(FLAGS_prompt)));
    request.set_text(absl::GetFlag(FLAGS_prompt));
  } else {
    return absl::InvalidArgumentError("give --prompt or --prompt-ids");
  }
  v1::SamplingParams* s = request.mutable_sampling();
  if (Specified("temperature")) s->set_temperature(absl::GetFlag(FLAGS_temperature));
  if (Specified("top_k")) s->set_top_k(absl::GetFlag(FLAGS_top_k));
  if (Specified("top_p")) s->set_top_p(absl::GetFlag(FLAGS_top_p));
  if (Specified("min_p")) s->set_min_p(absl::GetFlag(FLAGS_min_p));
  if (Specified("repetition_penalty")) {
    s->set_repetition_penalty(absl::GetFlag(FLAGS_repetition_penalty));
  }
  if (Specified("presence_penalty")) s->set_presence_penalty(absl::GetFlag(FLAGS_presence_penalty));
  if (Specified("frequency_penalty")) {
    s->set_frequency_penalty(absl::GetFlag(FLAGS_frequency_penalty));
  }
  if (Specified("seed")) s->set_seed(absl::GetFlag(FLAGS_seed));
  v1::StoppingCriteria* stop = request.mutable_stopping();
  if (Specified("max_new_tokens")) stop->set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  for (const std::string& s : absl::GetFlag(FLAGS_stop)) {
    RETURN_IF_ERROR(CheckUtf8("stop", s));
    stop->add_stop_strings(s);
  }
  absl::StatusOr<std::vector<int32_t>> stop_ids =
      dcf::ParseIdList("stop-token-ids", absl::GetFlag(FLAGS_stop_token_ids));
  if (!stop_ids.ok()) return stop_ids.status();
  stop->mutable_stop_token_ids()->Add(stop_ids->begin(), stop_ids->end());
  stop->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  v1::OutputOptions* out = request.mutable_output();
  out->set_logprobs(absl::GetFlag(FLAGS_logprobs));
  out->set_top_logprobs(absl::GetFlag(FLAGS_top_logprobs));
  if (Specified("text")) out->set_return_text(absl::GetFlag(FLAGS_text));
  return request;
}

int Generate(const dcf::client::ClientChannel& channel) {
  absl::StatusOr<v1::GenerateRequest> request = BuildGenerateRequest();
  if (!request.ok()) return Usage(request.status().message());
  auto stub = v1::TextGeneration::NewStub(channel.channel());
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json && !request->output().has_return_text()) {
    // Without --text/--notext the server returns text exactly when the model has a
    // tokenizer. Ask which, so that a model without one still prints its token ids; when the
    // question fails, leave the field unset and let Generate report the error.
    grpc::ClientContext info_context;
    channel.Prepare(&info_context);
    v1::GetModelInfoResponse info;
    if (stub->GetModelInfo(&info_context, v1::GetModelInfoRequest(), &info).ok() &&
        !info.has_tokenizer()) {
      request->mutable_output()->set_return_text(false);
    }
  }
  // Token ids are printed only when the request asked for no text: in text mode a message
  // may carry ids whose text is still held back (stop strings, partial UTF-8), and printing
  // them would mix ids into the text.
  const bool print_ids =
      request->output().has_return_text() && !request->output().return_text();
  grpc::ClientContext context;
  channel.Prepare(&context);
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&context, *request);
  v1::GenerateResponse response;
  bool first_id = true;
  bool printed_anything = false;
  v1::GenerateResponse final_message;
  while (reader->Read(&response)) {
    if (json) {
      std::cout << ToJson(response) << "\n" << std::flush;
    } else if (!print_ids && !response.text().empty()) {
      std::cout << response.text() << std::flush;
      printed_anything = true;
    } else if (print_ids && response.token_ids_size() > 0) {
      for (int32_t id : response.token_ids()) {
        std::cout << (first_id ? "" : ",") << id;
        first_id = false;
      }
      std::cout << std::flush;
      printed_anything = true;
    }
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) final_message = response;
  }
  grpc::Status status = reader->Finish();
  if (!json && printed_anything) std::cout << "\n" << std::flush;
  if (!json && final_message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    std::cerr << "[" << v1::FinishReason_Name(final_message.finish_reason())
              << " prompt_tokens=" << final_message.usage().prompt_tokens()
              << " generated_tokens=" << final_message.usage().generated_tokens() << "]\n";
  }
  if (!status.ok()) return RpcFailed(status, channel);
  return 0;
}

template <typename Request, typename Response, typename Method>
int Unary(const dcf::client::ClientChannel& channel, const Request& request, Response* response,
          Method method) {
  auto stub = v1::TextGeneration::NewStub(channel.channel());
  grpc::ClientContext context;
  channel.Prepare(&context);
  grpc::Status status = ((*stub).*method)(&context, request, response);
  if (!status.ok()) return RpcFailed(status, channel);
  return 0;
}

int Tokenize(const dcf::client::ClientChannel& channel) {
  if (!Specified("prompt")) return Usage("tokenize needs --prompt");
  if (absl::Status s = CheckUtf8("prompt", absl::GetFlag(FLAGS_prompt)); !s.ok()) {
    return Usage(s.message());
  }
  v1::TokenizeRequest request;
  request.set_text(absl::GetFlag(FLAGS_prompt));
  v1::TokenizeResponse response;
  if (int rc = Unary(channel, request, &response, &v1::TextGeneration::Stub::Tokenize)) return rc;
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(response) << "\n";
  } else {
    std::cout << absl::StrJoin(response.token_ids(), ",") << "\n";
  }
  return 0;
}

int Detokenize(const dcf::client::ClientChannel& channel) {
  absl::StatusOr<std::vector<int32_t>> ids =
      dcf::ParseIdList("prompt-ids", absl::GetFlag(FLAGS_prompt_ids));
  if (!ids.ok()) return Usage(ids.status().message());
  v1::DetokenizeRequest request;
  request.mutable_token_ids()->Add(ids->begin(), ids->end());
  request.set_skip_special_tokens(absl::GetFlag(FLAGS_skip_special_tokens));
  v1::DetokenizeResponse response;
  if (int rc = Unary(channel, request, &response, &v1::TextGeneration::Stub::Detokenize)) {
    return rc;
  }
  std::cout << (absl::GetFlag(FLAGS_json) ? ToJson(response) : response.text()) << "\n";
  return 0;
}

int Info(const dcf::client::ClientChannel& channel) {
  v1::GetModelInfoResponse response;
  if (int rc = Unary(channel, v1::GetModelInfoRequest(), &response,
                     &v1::TextGeneration::Stub::GetModelInfo)) {
    return rc;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(response) << "\n";
  } else {
    std::cout << response.DebugString();
  }
  return 0;
}

int Health(const dcf::client::ClientChannel& channel) {
  auto stub = grpc::health::v1::Health::NewStub(channel.channel());
  grpc::ClientContext context;
  channel.Prepare(&context);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return RpcFailed(status, channel);
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())
            << "\n";
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> arg_storage;
  std::vector<char*> rest = dcf::ParseToolCommandLine(
      argc, argv,
      "client of dcformer-server\n"
      "  dcformer-cli generate|tokenize|detokenize|info|health [--target host:port] "
      "[--wait-ready[=60s]] ...",
      arg_storage, &GivenFlags(),
      {{"wait_ready", absl::FormatDuration(dcf::client::kDefaultWaitReady)}});
  if (rest.size() != 2) {
    return Usage("give one command: generate, tokenize, detokenize, info or health");
  }
  const std::string command = rest[1];
  dcf::client::InstallClientGrpcLogging();
  dcf::client::ChannelOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.tls = absl::GetFlag(FLAGS_tls);
  options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  options.api_key_file = absl::GetFlag(FLAGS_api_key_file);
  options.timeout = absl::GetFlag(FLAGS_timeout);
  const absl::Duration wait_ready = absl::GetFlag(FLAGS_wait_ready);
  if (wait_ready < absl::ZeroDuration()) return Usage("--wait-ready must be >= 0");
  if (wait_ready > absl::ZeroDuration()) options.max_reconnect_backoff = absl::Seconds(1);
  absl::StatusOr<dcf::client::ClientChannel> channel = dcf::client::ClientChannel::Create(options);
  if (!channel.ok()) return Usage(channel.status().message());
  if (command != "generate" && command != "tokenize" && command != "detokenize" &&
      command != "info" && command != "health") {
    return Usage(absl::StrCat("unknown command '", command, "'"));
  }
  if (wait_ready > absl::ZeroDuration()) {
    // `health` waits for the service it asks about; the other commands for TextGeneration.
    const std::string service = command == "health"
                                    ? absl::GetFlag(FLAGS_service)
                                    : std::string(v1::TextGeneration::service_full_name());
    if (absl::Status s =
            dcf::client::WaitUntilServing(*channel, options.target, service, wait_ready);
        !s.ok()) {
      std::cerr << "dcformer-cli: " << s.message() << "\n";
      return 1;
    }
  }
  if (command == "generate") return Generate(*channel);
  if (command == "tokenize") return Tokenize(*channel);
  if (command == "detokenize") return Detokenize(*channel);
  if (command == "info") return Info(*channel);
  if (command == "health") return Health(*channel);
  return Usage(absl::StrCat("unknown command '", command, "'"));
}
