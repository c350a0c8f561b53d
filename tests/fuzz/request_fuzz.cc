// libFuzzer target over raw request bytes, as a client puts them on the wire: parsing
// (server/request_parser.h), conversion (server/proto_convert.h) and the engine's validation
// (engine/serving/request_validator.h), with the GPT-2 tokenizer for text prompts and no model.
// The first input byte picks the message: even = GenerateRequest, odd = TokenizeRequest.
// Properties (a violation aborts, which libFuzzer reports as a crash):
//  * nothing crashes, leaks or trips a sanitizer;
//  * every rejection is INVALID_ARGUMENT or OUT_OF_RANGE and carries a message;
//  * whatever parses holds only valid UTF-8 in its string fields;
//  * a parsed TokenizeRequest always encodes;
//  * protobuf never logs (a client must not be able to fill the server's log).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"
#include "dcformer/v1/dcformer.pb.h"
#include "engine/serving/request_validator.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/common/utf8.h"
#include "google/protobuf/stubs/logging.h"
#include "server/proto_convert.h"
#include "server/request_parser.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

const dcf::Tokenizer& Gpt2() { return dcf::fuzz::Gpt2(); }

void Check(bool cond, const char* what, const absl::Status& status = absl::OkStatus()) {
  dcf::fuzz::Check(cond, "request_fuzz", what, status);
}

void CheckRejection(const absl::Status& s, const char* stage) {
  dcf::fuzz::CheckRejection(s, "request_fuzz", stage);
}

void FuzzGenerate(absl::string_view bytes) {
  dcformer::v1::GenerateRequest request;
  const absl::Status parsed = dcf::server::ParseRequestBytes(bytes, &request);
  if (!parsed.ok()) return CheckRejection(parsed, "parse");
  Check(dcf::IsValidUtf8(request.text()), "parsed text is valid UTF-8");
  Check(dcf::IsValidUtf8(request.request_id()), "parsed request_id is valid UTF-8");
  for (const std::string& s : request.stopping().stop_strings()) {
    Check(dcf::IsValidUtf8(s), "parsed stop string is valid UTF-8");
  }
  const dcf::RequestLimits limits = dcf::fuzz::Gpt2Limits();
  absl::StatusOr<dcf::GenerationRequest> converted =
      dcf::server::ToEngineRequest(request, limits);
  if (!converted.ok()) return CheckRejection(converted.status(), "convert");
  const absl::Status valid = dcf::ValidateRequest(*converted, limits);
  if (!valid.ok()) CheckRejection(valid, "validate");
}

void FuzzTokenize(absl::string_view bytes) {
  dcformer::v1::TokenizeRequest request;
  const absl::Status parsed = dcf::server::ParseRequestBytes(bytes, &request);
  if (!parsed.ok()) return CheckRejection(parsed, "parse");
  Check(dcf::IsValidUtf8(request.text()), "parsed text is valid UTF-8");
  Check(Gpt2().Encode(request.text()).ok(), "a parsed TokenizeRequest encodes");
}

}  // namespace

static void AbortOnProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                        const std::string& message) {
  std::fprintf(stderr, "request_fuzz: protobuf logged %s:%d: %s\n", file, line, message.c_str());
  std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool handler_set = [] {
    google::protobuf::SetLogHandler(&AbortOnProtobufLog);
    return true;
  }();
  (void)handler_set;
  if (size == 0) return 0;
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    FuzzGenerate(bytes);
  } else {
    FuzzTokenize(bytes);
  }
  return 0;
}
