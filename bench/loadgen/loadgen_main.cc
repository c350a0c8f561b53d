// dcformer-loadgen: load generator for dcformer-server (streaming Generate over gRPC).
//
//   dcformer-loadgen --target HOST:PORT --concurrency 8 --num-requests 200      closed loop
//   dcformer-loadgen --rate 1,2,4 --duration 60s --plot-out sweep.png          open-loop sweep
//
// Each run sends --warmup-requests first (not reported), then --num-requests (default 100)
// or, with --duration, as many as fit in that time; a list of concurrencies or rates runs one
// run per value. Results: a table on stdout, --json-out FILE (schema in bench/README.md),
// --plot-out FILE.png (latency vs throughput over the runs, with gnuplot).
// Exit codes: 0 done, 1 the target is unreachable or a report cannot be written, 2 bad flags
// or a bad --prompts-file, 3 a run's failed requests (counted by status code in the report)
// were more than --max-error-rate of its measured requests (default 0: any failure),
// 130 interrupted (Ctrl-C; the runs so far are still reported).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "bench/loadgen/latency_plot.h"
#include "bench/loadgen/load_runner.h"
#include "bench/loadgen/progress_line.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/workload.h"
#include "client/client_channel.h"
#include "dcformer/v1/dcformer.grpc.pb.h"
#include "engine/common/flag_names.h"
#include "engine/common/status_macros.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "server address host:port");
ABSL_FLAG(std::string, protocol, "grpc",
          "grpc: streaming Generate calls on --target; openai: streamed POST /v1/completions on "
          "--http-target (the server's --http-port; plaintext), same prompts and options. "
          "--target is still asked for the model's info");
ABSL_FLAG(std::string, http_target, "", "the OpenAI-compatible front's host:port (--protocol openai)");
ABSL_FLAG(std::string, api_key_file, "", "file whose first line is the API key");
ABSL_FLAG(bool, tls, false, "use TLS (system roots unless --tls-ca)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificate(s) to verify the server");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mTLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM client private key (mTLS)");
ABSL_FLAG(std::string, tls_server_name, "", "name to verify in the server certificate");
ABSL_FLAG(absl::Duration, timeout, absl::ZeroDuration(),
          "deadline of each Generate call, e.g. 60s; 0 = none");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(10),
          "how long to wait for the target to accept a connection before giving up");
ABSL_FLAG(std::string, concurrency, "",
          "closed loop: calls kept in flight; a comma-separated list runs a sweep (1,2,4,8)");
ABSL_FLAG(std::string, rate, "",
          "open loop: Poisson arrivals per second; a comma-separated list runs a sweep (1,2,4)");
ABSL_FLAG(int64_t, num_requests, 0, "measured requests per run (default 100 unless --duration)");
ABSL_FLAG(absl::Duration, duration, absl::ZeroDuration(),
          "per run, send measured requests for this long (e.g. 60s) instead of --num-requests");
ABSL_FLAG(int64_t, warmup_requests, 0, "requests sent first in each run and left out of results");
ABSL_FLAG(std::string, input_tokens, "128",
          "prompt length of random prompts: N, or MIN:MAX for uniform lengths");
ABSL_FLAG(std::string, output_tokens, "64",
          "max_new_tokens: N, or MIN:MAX for uniform lengths (a --prompts-file line may set it)");
ABSL_FLAG(std::string, prompts_file, "",
          "JSONL prompts, one object per line: {\"text\": ...} or {\"token_ids\": [...]}, "
          "optional \"max_new_tokens\"; used in order, cycling");
ABSL_FLAG(int, shared_prefix_tokens, 0,
          "random prompts start with one of --prefix-groups fixed random prefixes of this many "
          "tokens (a shared system prompt), then --input-tokens random tokens");
ABSL_FLAG(int, prefix_groups, 1, "how many different shared prefixes (--shared-prefix-tokens)");
ABSL_FLAG(int, chat_turns, 0,
          "multi-turn chat: conversations of this many turns, each resending the previous "
          "prompt and its output plus --input-tokens new tokens; TTFT is reported per turn");
ABSL_FLAG(std::string, cache_salt, "", "cache_salt of every request (prefix-cache isolation)");
ABSL_FLAG(int, vocab_size, 0,
          "random prompt ids are drawn from [0, N); default: the model's (GetModelInfo)");
ABSL_FLAG(uint64_t, workload_seed, 1, "seed of the random prompts, lengths and arrival times");
ABSL_FLAG(double, temperature, 1.0, "sampling temperature (sent only when given); 0 = greedy");
ABSL_FLAG(int, top_k, 0, "top-k sampling (sent only when given)");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling mass (sent only when given)");
ABSL_FLAG(double, min_p, 0.0, "min-p sampling (sent only when given)");
ABSL_FLAG(double, repetition_penalty, 1.0, "repetition penalty (sent only when given)");
ABSL_FLAG(double, presence_penalty, 0.0, "presence penalty (sent only when given)");
ABSL_FLAG(double, frequency_penalty, 0.0, "frequency penalty (sent only when given)");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed of every request (sent only when given)");
ABSL_FLAG(bool, ignore_eos, true,
          "keep generating after EOS, so every request streams exactly max_new_tokens");
ABSL_FLAG(bool, text, true, "ask for text with the tokens (sent only when given; --notext: ids)");
ABSL_FLAG(std::string, json_out, "", "write the results as JSON to this file");
ABSL_FLAG(std::string, plot_out, "", "write a PNG of latency vs throughput over the runs");
ABSL_FLAG(bool, progress, true, "show a progress bar on stderr when it is a terminal");
ABSL_FLAG(double, max_error_rate, 0,
          "exit 3 when more than this fraction of a run's measured requests failed (0: any "
          "failure; 1: never); the reports are written either way");

namespace {

namespace v1 = ::dcformer::v1;
using dcf::loadgen::LoadSpec;

constexpr char kProgram[] = "dcformer-loadgen";
constexpr int64_t kDefaultNumRequests = 100;

std::atomic<bool> g_interrupted{false};

void OnSigint(int) { g_interrupted.store(true); }

int Usage(absl::string_view message) {
  std::cerr << kProgram << ": " << message << "\n";
  return 2;
}

int Fail(absl::string_view message) {
  std::cerr << kProgram << ": " << message << "\n";
  return 1;
}

// The loads of the runs: one per value of --concurrency or --rate.
absl::StatusOr<std::vector<LoadSpec>> ParseLoads() {
  const std::string concurrency = absl::GetFlag(FLAGS_concurrency);
  const std::string rate = absl::GetFlag(FLAGS_rate);
  if (concurrency.empty() == rate.empty()) {
    return absl::InvalidArgumentError(
        "give --concurrency N (closed loop) or --rate R (open loop, Poisson arrivals per "
        "second), not both; a comma-separated list runs a sweep");
  }
  std::vector<LoadSpec> loads;
  const bool closed = !concurrency.empty();
  for (absl::string_view piece : absl::StrSplit(closed ? concurrency : rate, ',')) {
    piece = absl::StripAsciiWhitespace(piece);
    LoadSpec load;
    if (closed) {
      load.mode = LoadSpec::Mode::kClosed;
      if (!absl::SimpleAtoi(piece, &load.concurrency) || load.concurrency < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--concurrency: '", piece, "' is not an integer >= 1"));
      }
    } else {
      load.mode = LoadSpec::Mode::kOpen;
      if (!absl::SimpleAtod(piece, &load.rate) || !(load.rate > 0) || !std::isfinite(load.rate)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--rate: '", piece, "' is not a rate > 0 (requests per second)"));
      }
    }
    loads.push_back(load);
  }
  return loads;
}

// The parent directory of `path` exists and is writable.
bool CanWrite(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  return access(dir.c_str(), W_OK) == 0;
}

// The options every request carries; sampling fields only when their flag was given.
v1::GenerateRequest RequestTemplate(const absl::flat_hash_set<std::string>& given) {
  v1::GenerateRequest r;
  v1::SamplingParams* s = r.mutable_sampling();
  if (given.contains("temperature")) s->set_temperature(absl::GetFlag(FLAGS_temperature));
  if (given.contains("top_k")) s->set_top_k(absl::GetFlag(FLAGS_top_k));
  if (given.contains("top_p")) s->set_top_p(absl::GetFlag(FLAGS_top_p));
  if (given.contains("min_p")) s->set_min_p(absl::GetFlag(FLAGS_min_p));
  if (given.contains("repetition_penalty")) {
    s->set_repetition_penalty(absl::GetFlag(FLAGS_repetition_penalty));
  }
  if (given.contains("presence_penalty")) {
    s->set_presence_penalty(absl::GetFlag(FLAGS_presence_penalty));
  }
  if (given.contains("frequency_penalty")) {
    s->set_frequency_penalty(absl::GetFlag(FLAGS_frequency_penalty));
  }
  if (given.contains("seed")) s->set_seed(absl::GetFlag(FLAGS_seed));
  r.mutable_stopping()->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  r.set_cache_salt(absl::GetFlag(FLAGS_cache_salt));
  if (given.contains("text")) r.mutable_output()->set_return_text(absl::GetFlag(FLAGS_text));
  return r;
}

nlohmann::ordered_json RangeJson(const dcf::loadgen::LengthRange& r) {
  return {{"min", r.min}, {"max", r.max}};
}

// The sampling fields that were set (proto field names), e.g. {"temperature": 0}.
nlohmann::ordered_json SamplingJson(const v1::SamplingParams& sampling) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(sampling, &json, options);
  return nlohmann::ordered_json::parse(json, nullptr, /*allow_exceptions=*/false);
}

nlohmann::ordered_json ModelJson(const std::optional<v1::GetModelInfoResponse>& info) {
  if (!info.has_value()) return nullptr;
  return {{"name", info->model_name()},       {"architecture", info->architecture()},
          {"backend", info->backend()},       {"dtype", info->dtype()},
          {"vocab_size", info->vocab_size()}, {"context_length", info->context_length()},
          {"num_layers", info->num_layers()}, {"hidden_size", info->hidden_size()}};
}

// Everything the command line asks for, checked before anything is sent.
struct Config {
  std::vector<LoadSpec> loads;
  dcf::loadgen::RunLimits limits;
  dcf::loadgen::LengthRange input;
  dcf::loadgen::LengthRange output;
  int shared_prefix_tokens = 0;
  int prefix_groups = 1;
  int chat_turns = 0;
  std::string prompts_file;
  std::vector<dcf::loadgen::FilePrompt> file_prompts;  // empty: random prompts
  int vocab_size = 0;                                  // --vocab-size; 0: the model's
  uint64_t workload_seed = 0;
  v1::GenerateRequest request_template;
  dcf::client::ChannelOptions channel;
  absl::Duration connect_timeout;
  std::string json_out;
  std::string plot_out;
  double max_error_rate = 0;

  std::string WorkloadText() const {
    if (!file_prompts.empty()) {
      return absl::StrCat(
          dcf::loadgen::CountOf(static_cast<int64_t>(file_prompts.size()), "prompt"), " from ",
          prompts_file);
    }
    std::string text = absl::StrCat("random prompts of ", input.ToString(), " tokens");
    if (shared_prefix_tokens > 0) {
      absl::StrAppend(&text, " after one of ", prefix_groups, " shared prefixes of ",
                      shared_prefix_tokens, " tokens");
    }
    if (chat_turns > 0) {
      absl::StrAppend(&text, ", in chats of ", chat_turns,
                      " turns (each resends the conversation)");
    }
    return text;
  }
  // The longest prompt + output a request may reach.
  int MaxRequestTokens() const {
    const int turns = std::max(1, chat_turns);
    return shared_prefix_tokens + turns * (input.max + output.max);
  }
  dcf::loadgen::RandomPromptOptions RandomOptions(int vocab) const {
    dcf::loadgen::RandomPromptOptions o;
    o.input = input;
    o.output = output;
    o.vocab_size = vocab;
    o.shared_prefix_tokens = shared_prefix_tokens;
    o.prefix_groups = prefix_groups;
    o.chat_turns = chat_turns;
    return o;
  }
};

// InvalidArgument naming the flag (or FILE:LINE of the prompts file) for a bad command line.
absl::StatusOr<Config> ParseConfig(const absl::flat_hash_set<std::string>& given) {
  Config c;
  ASSIGN_OR_RETURN(c.loads, ParseLoads());
  const bool num_requests_given = given.contains("num_requests");
  const bool duration_given = given.contains("duration");
  if (num_requests_given && duration_given) {
    return absl::InvalidArgumentError("give --num-requests or --duration, not both");
  }
  c.limits.warmup_requests = absl::GetFlag(FLAGS_warmup_requests);
  if (duration_given) {
    c.limits.duration = absl::GetFlag(FLAGS_duration);
    if (c.limits.duration <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("--duration must be positive, e.g. 30s");
    }
  } else {
    c.limits.num_requests =
        num_requests_given ? absl::GetFlag(FLAGS_num_requests) : kDefaultNumRequests;
    if (c.limits.num_requests < 1) {
      return absl::InvalidArgumentError("--num-requests must be at least 1");
    }
  }
  if (c.limits.warmup_requests < 0) {
    return absl::InvalidArgumentError("--warmup-requests must be >= 0");
  }
  ASSIGN_OR_RETURN(c.output, dcf::loadgen::ParseLengthRange("output-tokens",
                                                            absl::GetFlag(FLAGS_output_tokens)));
  ASSIGN_OR_RETURN(
      c.input, dcf::loadgen::ParseLengthRange("input-tokens", absl::GetFlag(FLAGS_input_tokens)));
  c.prompts_file = absl::GetFlag(FLAGS_prompts_file);
  c.shared_prefix_tokens = absl::GetFlag(FLAGS_shared_prefix_tokens);
  c.prefix_groups = absl::GetFlag(FLAGS_prefix_groups);
  c.chat_turns = absl::GetFlag(FLAGS_chat_turns);
  if (c.shared_prefix_tokens < 0) {
    return absl::InvalidArgumentError("--shared-prefix-tokens must be >= 0");
  }
  if (c.prefix_groups < 1) return absl::InvalidArgumentError("--prefix-groups must be >= 1");
  if (given.contains("prefix_groups") && c.shared_prefix_tokens == 0) {
    return absl::InvalidArgumentError("--prefix-groups needs --shared-prefix-tokens");
  }
  if (c.chat_turns < 0) return absl::InvalidArgumentError("--chat-turns must be >= 0");
  if (!c.prompts_file.empty()) {
    for (const char* flag :
         {"input_tokens", "vocab_size", "shared_prefix_tokens", "prefix_groups", "chat_turns"}) {
      if (given.contains(flag)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", absl::StrReplaceAll(flag, {{"_", "-"}}),
                         " applies to random prompts, not to --prompts-file"));
      }
    }
    absl::StatusOr<std::vector<dcf::loadgen::FilePrompt>> loaded =
        dcf::loadgen::LoadPromptsFile(c.prompts_file);
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompts-file: ", loaded.status().message()));
    }
    c.file_prompts = std::move(*loaded);
  }
  if (given.contains("vocab_size")) {
    c.vocab_size = absl::GetFlag(FLAGS_vocab_size);
    if (c.vocab_size < 1) return absl::InvalidArgumentError("--vocab-size must be at least 1");
  }
  c.workload_seed = absl::GetFlag(FLAGS_workload_seed);
  c.request_template = RequestTemplate(given);
  c.channel.target = absl::GetFlag(FLAGS_target);
  c.channel.tls = absl::GetFlag(FLAGS_tls);
  c.channel.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  c.channel.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  c.channel.tls_key = absl::GetFlag(FLAGS_tls_key);
  c.channel.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  c.channel.api_key_file = absl::GetFlag(FLAGS_api_key_file);
  c.channel.timeout = absl::GetFlag(FLAGS_timeout);
  if (c.channel.timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--timeout must be >= 0");
  }
  c.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  if (c.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--connect-timeout must be positive");
  }
  c.json_out = absl::GetFlag(FLAGS_json_out);
  c.plot_out = absl::GetFlag(FLAGS_plot_out);
  c.max_error_rate = absl::GetFlag(FLAGS_max_error_rate);
  if (!(c.max_error_rate >= 0 && c.max_error_rate <= 1)) {
    return absl::InvalidArgumentError("--max-error-rate must be in [0, 1]");
  }
  for (const auto& [flag, path] :
       {std::pair{"--json-out", c.json_out}, {"--plot-out", c.plot_out}}) {
    if (!path.empty() && !CanWrite(path)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": cannot write into the directory of '", path, "'"));
    }
  }
  return c;
}

// Waits for the target to accept a connection and asks for its model info. The info is
// nullopt when GetModelInfo fails but the workload does not need it (prompts from a file, or
// --vocab-size): a load of failing calls, e.g. with a wrong API key, can still be measured.
// Unavailable when the target cannot be reached, FailedPrecondition when the info is needed.
absl::StatusOr<std::optional<v1::GetModelInfoResponse>> Connect(
    const Config& config, const dcf::client::ClientChannel& channel) {
  const std::string& target = config.channel.target;
  if (!channel.channel()->WaitForConnected(
          absl::ToChronoTime(absl::Now() + config.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to ", target, " within ", absl::FormatDuration(config.connect_timeout),
        " (is dcformer-server running there? with TLS, check --tls-ca and "
        "--tls-server-name)"));
  }
  auto stub = v1::TextGeneration::NewStub(channel.channel());
  grpc::ClientContext context;
  channel.Prepare(&context);
  context.set_deadline(absl::ToChronoTime(absl::Now() + config.connect_timeout));
  v1::GetModelInfoResponse info;
  const grpc::Status status = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
  if (status.ok()) return info;
  const std::string why = absl::StrCat(
      "GetModelInfo on ", target, " failed: ", dcf::client::StatusCodeName(status.error_code()),
      ": ", status.error_message());
  if (config.file_prompts.empty() && config.vocab_size == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        why, " (random prompts need the vocabulary size: fix the call or give --vocab-size)"));
  }
  std::cerr << kProgram << ": warning: " << why << "\n";
  return std::nullopt;
}

void PrintHeader(const Config& c, const std::optional<v1::GetModelInfoResponse>& info) {
  std::cout << kProgram << ": " << c.channel.target;
  if (info.has_value()) {
    std::cout << ", model " << info->model_name() << " (" << info->backend() << ", vocab "
              << info->vocab_size() << ", context " << info->context_length() << ")";
  }
  std::cout << "\n  " << c.WorkloadText() << ", max_new_tokens " << c.output.ToString()
            << (c.request_template.stopping().ignore_eos() ? " (ignore_eos)" : "") << "; per run "
            << (c.limits.num_requests > 0
                    ? dcf::loadgen::CountOf(c.limits.num_requests, "request")
                    : absl::StrCat(absl::FormatDuration(c.limits.duration), " of requests"))
            << " after " << c.limits.warmup_requests << " warm-up\n\n"
            << std::flush;
  if (info.has_value() && c.file_prompts.empty() &&
      c.MaxRequestTokens() > info->context_length()) {
    std::cerr << kProgram << ": warning: requests of up to " << c.MaxRequestTokens()
              << " tokens (prompt and new tokens) exceed the model context ("
              << info->context_length() << "): such requests fail with OUT_OF_RANGE\n";
  }
}

// The --json-out document (schema in bench/README.md).
nlohmann::ordered_json ReportJson(const Config& c,
                                  const std::optional<v1::GetModelInfoResponse>& info,
                                  const std::vector<dcf::loadgen::RunResult>& results) {
  using Json = nlohmann::ordered_json;
  const bool random = c.file_prompts.empty();
  Json doc;
  doc["schema_version"] = dcf::loadgen::kJsonSchemaVersion;
  doc["tool"] = kProgram;
  doc["target"] = c.channel.target;
  doc["model"] = ModelJson(info);
  Json& w = doc["workload"];
  w["prompts"] = random ? "random" : "file";
  w["prompts_file"] = random ? Json(nullptr) : Json(c.prompts_file);
  w["input_tokens"] = random ? RangeJson(c.input) : Json(nullptr);
  w["shared_prefix_tokens"] = c.shared_prefix_tokens;
  w["prefix_groups"] = c.shared_prefix_tokens > 0 ? Json(c.prefix_groups) : Json(nullptr);
  w["chat_turns"] = c.chat_turns > 0 ? Json(c.chat_turns) : Json(nullptr);
  w["cache_salt"] = !c.request_template.cache_salt().empty();
  w["output_tokens"] = RangeJson(c.output);
  w["ignore_eos"] = c.request_template.stopping().ignore_eos();
  w["sampling"] = SamplingJson(c.request_template.sampling());
  w["return_text"] = c.request_template.output().has_return_text()
                         ? Json(c.request_template.output().return_text())
                         : Json(nullptr);
  w["workload_seed"] = c.workload_seed;
  const bool counted = c.limits.num_requests > 0;
  w["num_requests"] = counted ? Json(c.limits.num_requests) : Json(nullptr);
  w["duration_s"] = counted ? Json(nullptr) : Json(absl::ToDoubleSeconds(c.limits.duration));
  w["warmup_requests"] = c.limits.warmup_requests;
  doc["runs"] = Json::array();
  for (const auto& r : results) doc["runs"].push_back(dcf::loadgen::RunToJson(r));
  return doc;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> arg_storage;
  absl::flat_hash_set<std::string> given;
  std::vector<char*> rest = dcf::ParseToolCommandLine(
      argc, argv,
      "load generator for dcformer-server\n"
      "  dcformer-loadgen [--target host:port] --concurrency N[,N...] | --rate R[,R...] ...\n"
      "see bench/README.md",
      arg_storage, &given);
  if (rest.size() > 1) return Usage(absl::StrCat("unexpected argument '", rest[1], "'"));
  dcf::client::InstallClientGrpcLogging();  // failures are reported (and counted) from the calls' status
  absl::StatusOr<Config> config = ParseConfig(given);
  if (!config.ok()) return Usage(config.status().message());
  absl::StatusOr<dcf::client::ClientChannel> channel =
      dcf::client::ClientChannel::Create(config->channel);
  if (!channel.ok()) return Usage(channel.status().message());
  if (!config->plot_out.empty()) {
    if (absl::Status s = dcf::loadgen::CheckGnuplot(); !s.ok()) return Fail(s.message());
  }
  absl::StatusOr<std::optional<v1::GetModelInfoResponse>> info = Connect(*config, *channel);
  if (!info.ok()) return Fail(info.status().message());
  PrintHeader(*config, *info);

  struct sigaction action = {};
  action.sa_handler = OnSigint;
  action.sa_flags = SA_RESETHAND;  // a second Ctrl-C ends the process at once
  sigaction(SIGINT, &action, nullptr);

  const int vocab_size =
      config->vocab_size > 0 ? config->vocab_size : (info->has_value() ? (*info)->vocab_size() : 0);
  const bool show_progress = absl::GetFlag(FLAGS_progress) && isatty(STDERR_FILENO);
  dcf::loadgen::LoadRunner runner(&*channel, config->request_template);
  const std::string protocol = absl::GetFlag(FLAGS_protocol);
  if (protocol == "openai") {
    dcf::loadgen::HttpTarget http;
    const std::string target = absl::GetFlag(FLAGS_http_target);
    const size_t colon = target.rfind(':');
    if (colon == std::string::npos || !absl::SimpleAtoi(target.substr(colon + 1), &http.port)) {
      return Usage("--protocol openai needs --http-target host:port");
    }
    http.host = target.substr(0, colon);
    if (config->chat_turns > 0) {
      // A turn resends the tokens streamed; the SSE events carry text, not token ids.
      return Usage("--chat-turns needs --protocol grpc");
    }
    if (!info->has_value()) return Fail("--protocol openai: GetModelInfo failed, no model name");
    http.model = (*info)->model_name();
    if (!config->channel.api_key_file.empty()) {
      std::ifstream keys(config->channel.api_key_file);
      std::getline(keys, http.api_key);
      http.api_key = std::string(absl::StripAsciiWhitespace(http.api_key));
    }
    std::cout << "protocol openai: http://" << target << "/v1/completions\n";
    runner.UseHttp(std::move(http));
  } else if (protocol != "grpc") {
    return Usage("--protocol must be grpc or openai");
  }
  std::vector<dcf::loadgen::RunResult> results;
  for (const LoadSpec& load : config->loads) {
    if (g_interrupted.load()) break;
    // Every run starts from the same seed: the same prompts, the same arrival pattern.
    dcf::loadgen::Workload workload =
        config->file_prompts.empty()
            ? dcf::loadgen::Workload::Random(config->RandomOptions(vocab_size),
                                             config->workload_seed)
            : dcf::loadgen::Workload::FromFile(config->file_prompts, config->output,
                                               config->workload_seed);
    const std::string label = load.Label();
    auto on_progress = [&](const dcf::loadgen::RunProgress& p) {
      if (show_progress) std::cerr << "\r" << dcf::loadgen::ProgressLine(label, p) << "\x1b[K";
    };
    results.push_back(runner.Run(load, config->limits, &workload, config->workload_seed,
                                 &g_interrupted, on_progress));
    if (show_progress) std::cerr << "\r\x1b[K" << std::flush;
    dcf::loadgen::PrintRun(std::cout, results.back());
    std::cout << "\n" << std::flush;
  }
  if (results.size() > 1) dcf::loadgen::PrintSweepSummary(std::cout, results);

  int rc = g_interrupted.load() ? 130 : 0;
  for (const dcf::loadgen::RunResult& r : results) {
    if (r.requests == 0 ||
        static_cast<double>(r.failed) <= config->max_error_rate * static_cast<double>(r.requests)) {
      continue;
    }
    std::cerr << kProgram << ": run " << r.load.Label() << ": " << r.failed << " of "
              << dcf::loadgen::CountOf(r.requests, "request") << " failed, more than "
              << "--max-error-rate " << config->max_error_rate << " allows\n";
    if (rc == 0) rc = 3;
  }
  if (!config->json_out.empty()) {
    if (absl::Status s =
            dcf::loadgen::WriteJsonFile(config->json_out, ReportJson(*config, *info, results));
        !s.ok()) {
      rc = Fail(s.message());
    }
  }
  if (!config->plot_out.empty() && !results.empty()) {
    const std::string title = absl::StrCat(
        kProgram, ": ", info->has_value() ? (*info)->model_name() : config->channel.target, ", ",
        config->WorkloadText(), ", max_new_tokens ", config->output.ToString());
    if (absl::Status s = dcf::loadgen::WriteLatencyPlot(config->plot_out, title, results);
        !s.ok()) {
      rc = Fail(s.message());
    }
  }
  return rc;
}
