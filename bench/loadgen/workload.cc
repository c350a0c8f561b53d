#include "bench/loadgen/workload.h"

#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/logging.h"
#include "nlohmann/json.hpp"

namespace dcf::loadgen {
namespace {

absl::Status LineError(absl::string_view name, int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ":", line, ": ", what));
}

// An integer JSON value that fits int32 (JSON numbers such as 3.0 or 1e9 are refused).
bool AsInt32(const nlohmann::json& v, int32_t* out) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) return false;
    *out = static_cast<int32_t>(u);
    return true;
  }
  const int64_t i = v.get<int64_t>();
  if (i < std::numeric_limits<int32_t>::min() || i > std::numeric_limits<int32_t>::max()) {
    return false;
  }
  *out = static_cast<int32_t>(i);
  return true;
}

}  // namespace

std::string LengthRange::ToString() const {
  return fixed() ? absl::StrCat(min) : absl::StrCat(min, ":", max);
}

absl::StatusOr<LengthRange> ParseLengthRange(absl::string_view flag, absl::string_view text) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", text, "' ", why, " (give N or MIN:MAX, tokens >= 1)"));
  };
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  if (parts.size() > 2) return bad("has more than one ':'");
  LengthRange r;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[0]), &r.min)) {
    return bad("is not a length");
  }
  r.max = r.min;
  if (parts.size() == 2 && !absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[1]), &r.max)) {
    return bad("is not a length range");
  }
  if (r.min < 1) return bad("must be at least 1");
  if (r.max < r.min) return bad("has MAX below MIN");
  return r;
}

absl::StatusOr<std::vector<FilePrompt>> ParsePromptsJsonl(absl::string_view name,
                                                          absl::string_view content) {
  std::vector<FilePrompt> prompts;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return LineError(name, line_no, "not valid JSON");
    if (!j.is_object()) return LineError(name, line_no, "not a JSON object");
    FilePrompt p;
    const bool has_text = j.contains("text");
    const bool has_ids = j.contains("token_ids");
    if (has_text == has_ids) {
      return LineError(name, line_no, "give exactly one of \"text\" and \"token_ids\"");
    }
    if (has_text) {
      if (!j["text"].is_string() || j["text"].get<std::string>().empty()) {
        return LineError(name, line_no, "\"text\" must be a non-empty string");
      }
      p.text = j["text"].get<std::string>();
    } else {
      const nlohmann::json& ids = j["token_ids"];
      if (!ids.is_array() || ids.empty()) {
        return LineError(name, line_no, "\"token_ids\" must be a non-empty array of integers");
      }
      for (size_t i = 0; i < ids.size(); ++i) {
        int32_t id;
        if (!AsInt32(ids[i], &id)) {
          return LineError(name, line_no, absl::StrCat("\"token_ids\"[", i, "] is not an int32"));
        }
        p.token_ids.push_back(id);
      }
    }
    if (j.contains("max_new_tokens")) {
      int32_t n;
      if (!AsInt32(j["max_new_tokens"], &n) || n < 1) {
        return LineError(name, line_no, "\"max_new_tokens\" must be an integer >= 1");
      }
      p.max_new_tokens = n;
    }
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": no prompts (JSONL, one per line)"));
  }
  return prompts;
}

absl::StatusOr<std::vector<FilePrompt>> LoadPromptsFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::stringstream s;
  s << in.rdbuf();
  return ParsePromptsJsonl(path, s.str());
}

Workload::Workload(RandomPromptOptions random, std::vector<FilePrompt> prompts, uint64_t seed)
    : random_(random), prompts_(std::move(prompts)), rng_(seed) {
  if (prompts_.empty()) {
    DCF_CHECK(random_.vocab_size >= 1 && random_.prefix_groups >= 1 &&
              random_.shared_prefix_tokens >= 0 && random_.chat_turns >= 0);
    // Drawn first, so that the prefixes depend on the seed only.
    if (random_.shared_prefix_tokens > 0) {
      prefixes_.resize(random_.prefix_groups);
      for (auto& p : prefixes_) AppendRandom(random_.shared_prefix_tokens, &p);
    }
  }
}

Workload Workload::RandomTokens(LengthRange input, LengthRange output, int vocab_size,
                                uint64_t seed) {
  RandomPromptOptions o;
  o.input = input;
  o.output = output;
  o.vocab_size = vocab_size;
  return Random(o, seed);
}

Workload Workload::Random(const RandomPromptOptions& options, uint64_t seed) {
  return Workload(options, {}, seed);
}

Workload Workload::FromFile(std::vector<FilePrompt> prompts, LengthRange output, uint64_t seed) {
  DCF_CHECK(!prompts.empty());
  RandomPromptOptions o;
  o.output = output;
  return Workload(o, std::move(prompts), seed);
}

int Workload::Uniform(LengthRange range) {
  if (range.fixed()) return range.min;
  const uint64_t span = static_cast<uint64_t>(range.max - range.min) + 1;
  return range.min + static_cast<int>(rng_() % span);  // bias < span / 2^64: negligible
}

void Workload::AppendRandom(int n, std::vector<int32_t>* ids) {
  for (int i = 0; i < n; ++i) ids->push_back(static_cast<int32_t>(rng_() % random_.vocab_size));
}

PromptSpec Workload::Next() {
  PromptSpec spec;
  if (prompts_.empty()) {
    if (!prefixes_.empty()) {
      spec.prefix_group = static_cast<int>(rng_() % prefixes_.size());
      spec.token_ids = prefixes_[spec.prefix_group];
    }
    AppendRandom(Uniform(random_.input), &spec.token_ids);
    spec.max_new_tokens = Uniform(random_.output);
    if (is_chat()) spec.turn = 1;
    return spec;
  }
  const FilePrompt& p = prompts_[next_prompt_];
  next_prompt_ = (next_prompt_ + 1) % prompts_.size();
  spec.text = p.text;
  spec.token_ids = p.token_ids;
  spec.max_new_tokens = p.max_new_tokens > 0 ? p.max_new_tokens : Uniform(random_.output);
  return spec;
}

std::optional<PromptSpec> Workload::NextTurn(const PromptSpec& previous,
                                             const std::vector<int32_t>& output) {
  if (!is_chat() || previous.turn < 1 || previous.turn >= random_.chat_turns) return std::nullopt;
  PromptSpec spec;
  spec.prefix_group = previous.prefix_group;
  spec.turn = previous.turn + 1;
  spec.token_ids = previous.token_ids;
  spec.token_ids.insert(spec.token_ids.end(), output.begin(), output.end());
  AppendRandom(Uniform(random_.input), &spec.token_ids);
  spec.max_new_tokens = Uniform(random_.output);
  return spec;
}

}  // namespace dcf::loadgen
