// dcformer-loadgen: load generator for dcformer-server (streaming Generate over gRPC).
//
//   dcformer-loadgen --target HOST:PORT --concurrency 8 --num-requests 200      closed loop
//   dcformer-loadgen --rate 1,2,4 --duration 60s --plot-out sweep.png          open-loop sweep
//
// Each run sends --warmup-requests first (not reported), then --num-requests (default 100)
// or, with --duration, as many as fit in that time; a list of concurrencies or rates runs one
// run per value. Results: a table on stdout, --json-out FILE (schema in bench/README.md),
// --plot-out FILE.png (latency vs throughput over the runs, with gnuplot).
// Exit codes: 0 done (failed requests are results, counted by status code), 1 the target is
// unreachable or a report cannot be written, 2 bad flags or a bad --prompts-file,
// 130 interrupted (Ctrl-C; the runs so far are still reported).
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/loadgen/latency_plot.h"
#include "bench/loadgen/load_runner.h"
#include "bench/loadgen/progress_line.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/workload.h"
#include "client/client_channel.h"
#include "dcformer/v1/dcformer.grpc.pb.h"
#include "engine/common/flag_names.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "server address host:port");
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

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "load generator for dcformer-server\n"
      "  dcformer-loadgen [--target host:port] --concurrency N[,N...] | --rate R[,R...] ...\n"
      "see bench/README.md");
  // --help lists this tool's flags (absl matches flag files against the program name).
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "bench/loadgen/");
  };
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<std::string> arg_storage;
  std::vector<char*> args = dcf::NormalizeFlagNames(argc, argv, arg_storage);
  // absl would exit 1 on a bad flag: check first, so that every usage error exits 2.
  if (absl::Status s = dcf::CheckFlagArgs(argc, args.data()); !s.ok()) {
    return Usage(absl::StrCat(s.message(), " (--help lists the flags)"));
  }
  const absl::flat_hash_set<std::string> given = dcf::GivenFlagNames(argc, args.data());
  std::vector<char*> rest = absl::ParseCommandLine(argc, args.data());
  if (rest.size() > 1) return Usage(absl::StrCat("unexpected argument '", rest[1], "'"));

  // Flags, all checked before anything is sent.
  absl::StatusOr<std::vector<LoadSpec>> loads = ParseLoads();
  if (!loads.ok()) return Usage(loads.status().message());
  dcf::loadgen::RunLimits limits;
  limits.num_requests = absl::GetFlag(FLAGS_num_requests);
  limits.duration = absl::GetFlag(FLAGS_duration);
  limits.warmup_requests = absl::GetFlag(FLAGS_warmup_requests);
  if (given.contains("num_requests") && given.contains("duration")) {
    return Usage("give --num-requests or --duration, not both");
  }
  if (given.contains("num_requests") && limits.num_requests < 1) {
    return Usage("--num-requests must be at least 1");
  }
  if (given.contains("duration") && limits.duration <= absl::ZeroDuration()) {
    return Usage("--duration must be positive, e.g. 30s");
  }
  if (!given.contains("duration")) {
    limits.duration = absl::ZeroDuration();
    if (!given.contains("num_requests")) limits.num_requests = kDefaultNumRequests;
  }
  if (limits.warmup_requests < 0) return Usage("--warmup-requests must be >= 0");
  if (absl::GetFlag(FLAGS_timeout) < absl::ZeroDuration()) return Usage("--timeout must be >= 0");
  if (absl::GetFlag(FLAGS_connect_timeout) <= absl::ZeroDuration()) {
    return Usage("--connect-timeout must be positive");
  }
  absl::StatusOr<dcf::loadgen::LengthRange> output_range =
      dcf::loadgen::ParseLengthRange("output-tokens", absl::GetFlag(FLAGS_output_tokens));
  if (!output_range.ok()) return Usage(output_range.status().message());
  absl::StatusOr<dcf::loadgen::LengthRange> input_range =
      dcf::loadgen::ParseLengthRange("input-tokens", absl::GetFlag(FLAGS_input_tokens));
  if (!input_range.ok()) return Usage(input_range.status().message());
  const std::string prompts_file = absl::GetFlag(FLAGS_prompts_file);
  std::vector<dcf::loadgen::FilePrompt> file_prompts;
  if (!prompts_file.empty()) {
    if (given.contains("input_tokens")) {
      return Usage("--input-tokens applies to random prompts, not to --prompts-file");
    }
    if (given.contains("vocab_size")) {
      return Usage("--vocab-size applies to random prompts, not to --prompts-file");
    }
    absl::StatusOr<std::vector<dcf::loadgen::FilePrompt>> loaded =
        dcf::loadgen::LoadPromptsFile(prompts_file);
    if (!loaded.ok()) return Usage(absl::StrCat("--prompts-file: ", loaded.status().message()));
    file_prompts = std::move(*loaded);
  }
  if (given.contains("vocab_size") && absl::GetFlag(FLAGS_vocab_size) < 1) {
    return Usage("--vocab-size must be at least 1");
  }
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  const std::string plot_out = absl::GetFlag(FLAGS_plot_out);
  if (!json_out.empty() && !CanWrite(json_out)) {
    return Usage(absl::StrCat("--json-out: cannot write into the directory of '", json_out, "'"));
  }
  if (!plot_out.empty()) {
    if (!CanWrite(plot_out)) {
      return Usage(absl::StrCat("--plot-out: cannot write into the directory of '", plot_out, "'"));
    }
    if (absl::Status s = dcf::loadgen::CheckGnuplot(); !s.ok()) return Fail(s.message());
  }
  dcf::client::ChannelOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.tls = absl::GetFlag(FLAGS_tls);
  options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  options.api_key_file = absl::GetFlag(FLAGS_api_key_file);
  options.timeout = absl::GetFlag(FLAGS_timeout);
  absl::StatusOr<dcf::client::ClientChannel> channel = dcf::client::ClientChannel::Create(options);
  if (!channel.ok()) return Usage(channel.status().message());

  // The target must accept a connection; its model info gives the vocabulary for random
  // prompts. A failed GetModelInfo (e.g. a wrong API key) ends the run only when the
  // workload needs it, so that a load of failing calls can still be measured.
  const absl::Duration connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  if (!channel->channel()->WaitForConnected(absl::ToChronoTime(absl::Now() + connect_timeout))) {
    return Fail(absl::StrCat("cannot connect to ", options.target, " within ",
                             absl::FormatDuration(connect_timeout),
                             " (is dcformer-server running there? with TLS, check --tls-ca and "
                             "--tls-server-name)"));
  }
  std::optional<v1::GetModelInfoResponse> info;
  {
    auto stub = v1::TextGeneration::NewStub(channel->channel());
    grpc::ClientContext context;
    channel->Prepare(&context);
    context.set_deadline(absl::ToChronoTime(absl::Now() + connect_timeout));
    v1::GetModelInfoResponse response;
    const grpc::Status status = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &response);
    if (status.ok()) {
      info = response;
    } else {
      const std::string why =
          absl::StrCat("GetModelInfo on ", options.target,
                       " failed: ", dcf::client::StatusCodeName(status.error_code()), ": ",
                       status.error_message());
      if (file_prompts.empty() && !given.contains("vocab_size")) {
        return Fail(absl::StrCat(why,
                                 " (random prompts need the vocabulary size: fix the call "
                                 "or give --vocab-size)"));
      }
      std::cerr << kProgram << ": warning: " << why << "\n";
    }
  }
  const int vocab_size = given.contains("vocab_size") ? absl::GetFlag(FLAGS_vocab_size)
                                                      : (info ? info->vocab_size() : 0);
  if (info.has_value() && file_prompts.empty() &&
      input_range->max + output_range->max > info->context_length()) {
    std::cerr << kProgram << ": warning: prompts of up to " << input_range->max << " tokens plus "
              << output_range->max << " new tokens exceed the model context ("
              << info->context_length() << "): such requests fail with OUT_OF_RANGE\n";
  }

  const uint64_t workload_seed = absl::GetFlag(FLAGS_workload_seed);
  std::string workload_text =
      file_prompts.empty() ? absl::StrCat("random prompts of ", input_range->ToString(), " tokens")
                           : absl::StrCat(file_prompts.size(), " prompts from ", prompts_file);
  std::cout << kProgram << ": " << options.target;
  if (info.has_value()) {
    std::cout << ", model " << info->model_name() << " (" << info->backend() << ", vocab "
              << info->vocab_size() << ", context " << info->context_length() << ")";
  }
  std::cout << "\n  " << workload_text << ", max_new_tokens " << output_range->ToString()
            << (absl::GetFlag(FLAGS_ignore_eos) ? " (ignore_eos)" : "") << "; per run "
            << (limits.num_requests > 0
                    ? absl::StrCat(limits.num_requests, " requests")
                    : absl::StrCat(absl::FormatDuration(limits.duration), " of requests"))
            << " after " << limits.warmup_requests << " warm-up\n\n"
            << std::flush;

  struct sigaction action = {};
  action.sa_handler = OnSigint;
  action.sa_flags = SA_RESETHAND;  // a second Ctrl-C ends the process at once
  sigaction(SIGINT, &action, nullptr);

  const bool show_progress = absl::GetFlag(FLAGS_progress) && isatty(STDERR_FILENO);
  const v1::GenerateRequest runner_template = RequestTemplate(given);
  dcf::loadgen::LoadRunner runner(&*channel, runner_template);
  std::vector<dcf::loadgen::RunResult> results;
  for (const LoadSpec& load : *loads) {
    if (g_interrupted.load()) break;
    dcf::loadgen::Workload workload =
        file_prompts.empty()
            ? dcf::loadgen::Workload::RandomTokens(*input_range, *output_range, vocab_size,
                                                   workload_seed)
            : dcf::loadgen::Workload::FromFile(file_prompts, *output_range, workload_seed);
    const std::string label = load.Label();
    auto on_progress = [&](const dcf::loadgen::RunProgress& p) {
      if (show_progress) std::cerr << "\r" << dcf::loadgen::ProgressLine(label, p) << "\x1b[K";
    };
    results.push_back(
        runner.Run(load, limits, &workload, workload_seed, &g_interrupted, on_progress));
    if (show_progress) std::cerr << "\r\x1b[K" << std::flush;
    dcf::loadgen::PrintRun(std::cout, results.back());
    std::cout << "\n" << std::flush;
  }
  if (results.size() > 1) dcf::loadgen::PrintSweepSummary(std::cout, results);

  int rc = g_interrupted.load() ? 130 : 0;
  if (!json_out.empty()) {
    nlohmann::ordered_json doc;
    doc["schema_version"] = dcf::loadgen::kJsonSchemaVersion;
    doc["tool"] = kProgram;
    doc["target"] = options.target;
    doc["model"] = ModelJson(info);
    nlohmann::ordered_json w;
    w["prompts"] = file_prompts.empty() ? "random" : "file";
    w["prompts_file"] = file_prompts.empty() ? nlohmann::ordered_json(nullptr)
                                             : nlohmann::ordered_json(prompts_file);
    w["input_tokens"] =
        file_prompts.empty() ? RangeJson(*input_range) : nlohmann::ordered_json(nullptr);
    w["output_tokens"] = RangeJson(*output_range);
    w["ignore_eos"] = absl::GetFlag(FLAGS_ignore_eos);
    w["sampling"] = SamplingJson(runner_template.sampling());
    w["return_text"] = runner_template.output().has_return_text()
                           ? nlohmann::ordered_json(runner_template.output().return_text())
                           : nlohmann::ordered_json(nullptr);
    w["workload_seed"] = workload_seed;
    w["num_requests"] =
        limits.num_requests > 0 ? nlohmann::ordered_json(limits.num_requests) : nullptr;
    w["duration_s"] = limits.num_requests > 0
                          ? nlohmann::ordered_json(nullptr)
                          : nlohmann::ordered_json(absl::ToDoubleSeconds(limits.duration));
    w["warmup_requests"] = limits.warmup_requests;
    doc["workload"] = w;
    doc["runs"] = nlohmann::ordered_json::array();
    for (const auto& r : results) doc["runs"].push_back(dcf::loadgen::RunToJson(r));
    if (absl::Status s = dcf::loadgen::WriteJsonFile(json_out, doc); !s.ok()) {
      rc = Fail(s.message());
    }
  }
  if (!plot_out.empty() && !results.empty()) {
    const std::string title =
        absl::StrCat(kProgram, ": ", info ? info->model_name() : options.target, ", ",
                     workload_text, ", max_new_tokens ", output_range->ToString());
    if (absl::Status s = dcf::loadgen::WriteLatencyPlot(plot_out, title, results); !s.ok()) {
      rc = Fail(s.message());
    }
  }
  return rc;
}
