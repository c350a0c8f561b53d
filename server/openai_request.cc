#include "server/openai_request.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/prompt_text.h"

namespace dcf::server {
namespace {

using Json = nlohmann::json;

absl::Status Bad(absl::string_view param, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(param, ": ", what));
}

const char* TypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "integer";
    case Json::value_t::number_float: return "number";
    case Json::value_t::string: return "string";
    case Json::value_t::array: return "array";
    case Json::value_t::object: return "object";
    default: return "value";
  }
}

absl::Status WrongType(absl::string_view param, absl::string_view want, const Json& v) {
  return Bad(param, absl::StrCat("must be ", want, ", got ", TypeName(v)));
}

// Path-tracking SAX handler: run over a body the DOM parser refused, it says where.
class PathFinder {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  bool null() { return Value(); }
  bool boolean(bool) { return Value(); }
  bool number_integer(number_integer_t) { return Value(); }
  bool number_unsigned(number_unsigned_t) { return Value(); }
  bool number_float(number_float_t, const string_t&) { return Value(); }
  bool string(string_t&) { return Value(); }
  bool binary(binary_t&) { return Value(); }
  bool start_object(std::size_t) {
    Value();
    stack_.push_back({false, -1, ""});
    return true;
  }
  bool key(string_t& k) {
    stack_.back().key = k;
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    Value();
    stack_.push_back({true, -1, ""});
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception&) {
    // An error inside an array happens before its element was counted.
    if (!stack_.empty() && stack_.back().array) ++stack_.back().index;
    path_ = Path();
    return false;
  }
  const std::string& path() const { return path_; }

 private:
  struct Level {
    bool array;
    int index;
    std::string key;
  };
  bool Value() {
    if (!stack_.empty() && stack_.back().array) ++stack_.back().index;
    return true;
  }
  std::string Path() const {
    std::string p;
    for (const Level& l : stack_) {
      if (l.array) {
        absl::StrAppend(&p, "[", std::max(0, l.index), "]");
      } else if (!l.key.empty()) {
        absl::StrAppend(&p, p.empty() ? "" : ".", l.key);
      }
    }
    return p;
  }
  std::vector<Level> stack_;
  std::string path_;
};

// A body's parse error says where and what, within this many bytes each: nlohmann's text
// quotes what it last read (an unterminated string: all of it), and the path of a body of
// N unclosed `[` is 3N bytes, which the error's message and param both carry (the probe: a
// 300 KB body drew a 1.8 MB answer).
constexpr size_t kMaxParseErrorPart = 200;

// `s` cut to at most `max` bytes (at a UTF-8 character's start) and marked "...".
std::string Clip(std::string s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
  return s + "...";
}

// `s`'s last `max` bytes at most (from a UTF-8 character's start), marked "...": a path's
// end says where the error is.
std::string ClipFront(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t from = s.size() - max;
  while (from < s.size() && (static_cast<unsigned char>(s[from]) & 0xC0) == 0x80) ++from;
  return "..." + s.substr(from);
}

// nlohmann's what() without its "[json.exception.parse_error.101] " tag.
std::string ParserText(absl::string_view m) {
  if (absl::StartsWith(m, "[json.exception.")) {
    const size_t end = m.find("] ");
    if (end != absl::string_view::npos) m.remove_prefix(end + 2);
  }
  return Clip(std::string(m), kMaxParseErrorPart);
}

absl::StatusOr<Json> ParseBody(absl::string_view body) {
  Json json = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (!json.is_discarded()) {
    if (!json.is_object()) return Bad("body", absl::StrCat("must be a JSON object, got ", TypeName(json)));
    return json;
  }
  // Say what and where.
  std::string what = "is not valid JSON";
  try {
    (void)Json::parse(body.begin(), body.end());
  } catch (const Json::parse_error& e) {
    const std::string m = e.what();
    const bool utf8 = absl::StrContains(m, "UTF-8") || absl::StrContains(m, "utf-8");
    what = utf8 ? absl::StrCat("is not valid UTF-8 (byte ", e.byte, " of the body)")
                : absl::StrCat("is not valid JSON (", ParserText(m), ")");
  } catch (const Json::exception& e) {
    // Not a parse_error: out_of_range.406, a number beyond a double (1e400), which
    // otherwise escaped and ended the process.
    what = absl::StrCat("is not valid JSON (", ParserText(e.what()), ")");
  }
  PathFinder finder;
  Json::sax_parse(body.begin(), body.end(), &finder);
  return Bad(finder.path().empty() ? "body" : ClipFront(finder.path(), kMaxParseErrorPart), what);
}

// Typed reads of optional fields: absent and null mean "not given".
class Fields {
 public:
  explicit Fields(const Json& object) : o_(object) {}

  const Json* Get(const char* name) const {
    auto it = o_.find(name);
    if (it == o_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  absl::StatusOr<std::optional<bool>> Bool(const char* name) const {
    const Json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return WrongType(name, "a boolean", *v);
    return v->get<bool>();
  }
  absl::StatusOr<std::optional<double>> Number(const char* name) const {
    const Json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return WrongType(name, "a number", *v);
    const double d = v->get<double>();
    if (!std::isfinite(d)) return Bad(name, "must be finite");
    return d;
  }
  absl::StatusOr<std::optional<int64_t>> Integer(const char* name, int64_t lo, int64_t hi) const {
    const Json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
      return Bad(name, absl::StrCat("must be at most ", hi));
    }
    if (!v->is_number_integer()) return WrongType(name, "an integer", *v);
    const int64_t i = v->get<int64_t>();
    if (i < lo) return Bad(name, absl::StrCat("must be at least ", lo, ", got ", i));
    if (i > hi) return Bad(name, absl::StrCat("must be at most ", hi, ", got ", i));
    return i;
  }
  absl::StatusOr<std::optional<std::string>> String(const char* name) const {
    const Json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return WrongType(name, "a string", *v);
    return v->get<std::string>();
  }

 private:
  const Json& o_;
};

#define DCF_ASSIGN(lhs, expr)              \
  do {                                     \
    auto dcf_value = (expr);               \
    if (!dcf_value.ok()) return dcf_value.status(); \
    lhs = *std::move(dcf_value);           \
  } while (0)

absl::Status ParseTokenIds(const Json& v, const std::string& param, std::vector<int32_t>* out) {
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& id = v[i];
    const std::string at = absl::StrCat(param, "[", i, "]");
    if (!id.is_number_integer()) return WrongType(at, "a token id (integer)", id);
    const int64_t x = id.get<int64_t>();
    if (id.is_number_unsigned() && id.get<uint64_t>() > INT32_MAX) return Bad(at, "is not a token id");
    if (x < 0 || x > INT32_MAX) return Bad(at, absl::StrCat("is not a token id: ", x));
    out->push_back(static_cast<int32_t>(x));
  }
  return absl::OkStatus();
}

// prompt: a string, an array of strings, an array of token ids, or an array of such arrays.
absl::Status ParsePrompts(const Json* v, std::vector<OpenAiPrompt>* out) {
  if (v == nullptr) return Bad("prompt", "is required");
  if (v->is_string()) {
    out->push_back({true, v->get<std::string>(), {}});
    return absl::OkStatus();
  }
  if (!v->is_array()) return WrongType("prompt", "a string or an array", *v);
  if (v->empty()) return Bad("prompt", "is an empty array");
  if ((*v)[0].is_number()) {
    OpenAiPrompt p;
    p.is_text = false;
    if (absl::Status s = ParseTokenIds(*v, "prompt", &p.token_ids); !s.ok()) return s;
    out->push_back(std::move(p));
    return absl::OkStatus();
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& e = (*v)[i];
    const std::string at = absl::StrCat("prompt[", i, "]");
    if (e.is_string()) {
      out->push_back({true, e.get<std::string>(), {}});
    } else if (e.is_array()) {
      OpenAiPrompt p;
      p.is_text = false;
      if (absl::Status s = ParseTokenIds(e, at, &p.token_ids); !s.ok()) return s;
      out->push_back(std::move(p));
    } else {
      return WrongType(at, "a string or an array of token ids", e);
    }
  }
  return absl::OkStatus();
}

absl::Status ParseMessages(const Json* v, std::vector<ChatMessage>* out) {
  if (v == nullptr) return Bad("messages", "is required");
  if (!v->is_array()) return WrongType("messages", "an array", *v);
  if (v->empty()) return Bad("messages", "must hold at least one message");
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& m = (*v)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return WrongType(at, "an object", m);
    ChatMessage message;
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Bad(at + ".role", "must be a string (system, developer, user or assistant)");
    }
    message.role = role->get<std::string>();
    if (message.role == "developer") message.role = "system";  // OpenAI's newer name
    if (message.role == "tool" || message.role == "function") {
      return Bad(at + ".role", absl::StrCat("'", message.role, "' messages are not supported "
                                                              "(this server has no tool calls)"));
    }
    if (message.role != "system" && message.role != "user" && message.role != "assistant") {
      return Bad(at + ".role", absl::StrCat("unknown role '", message.role, "'"));
    }
    for (const char* refused : {"tool_calls", "function_call", "audio"}) {
      auto f = m.find(refused);
      if (f != m.end() && !f->is_null() && !(f->is_array() && f->empty())) {
        return Bad(at + "." + refused, "is not supported");
      }
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      // OpenAI requires content but for an assistant message (which may carry only tool
      // calls, refused above).
      if (message.role != "assistant") {
        return Bad(at + ".content", absl::StrCat("is required for a ", message.role, " message"));
      }
      message.content.clear();
    } else if (content->is_string()) {
      message.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Content parts: only text.
      for (size_t j = 0; j < content->size(); ++j) {
        const Json& part = (*content)[j];
        const std::string pat = absl::StrCat(at, ".content[", j, "]");
        if (!part.is_object()) return WrongType(pat, "an object", part);
        auto type = part.find("type");
        if (type == part.end() || !type->is_string()) return Bad(pat + ".type", "must be a string");
        if (*type != "text") {
          return Bad(pat + ".type", absl::StrCat("'", type->get<std::string>(),
                                                 "' content is not supported (text only)"));
        }
        auto text = part.find("text");
        if (text == part.end() || !text->is_string()) return Bad(pat + ".text", "must be a string");
        message.content += text->get<std::string>();
      }
    } else {
      return WrongType(at + ".content", "a string or an array of content parts", *content);
    }
    out->push_back(std::move(message));
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const Json* v, std::vector<std::string>* out) {
  if (v == nullptr) return absl::OkStatus();
  if (v->is_string()) {
    out->push_back(v->get<std::string>());
    return absl::OkStatus();
  }
  if (!v->is_array()) return WrongType("stop", "a string or an array of strings", *v);
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) {
      return WrongType(absl::StrCat("stop[", i, "]"), "a string", (*v)[i]);
    }
    out->push_back((*v)[i].get<std::string>());
  }
  return absl::OkStatus();
}

// Fields of features this server does not have: refused when given with a value that asks
// for them (OpenAI's own defaults pass).
absl::Status RefuseUnsupported(const Json& o, OpenAiApi api) {
  auto given = [&](const char* name) -> const Json* {
    auto it = o.find(name);
    if (it == o.end() || it->is_null()) return nullptr;
    return &*it;
  };
  for (const char* name : {"tools", "functions", "logit_bias", "audio", "prediction",
                           "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                           "response_format", "tool_choice", "function_call", "modalities",
                           "suffix", "best_of", "min_tokens", "prompt_logprobs",
                           "web_search_options"}) {
    const Json* v = given(name);
    if (v == nullptr) continue;
    const std::string n = name;
    // Values that ask for nothing beyond what we do.
    if ((n == "tools" || n == "functions") && v->is_array() && v->empty()) continue;
    if (n == "logit_bias" && v->is_object() && v->empty()) continue;
    if (n == "tool_choice" && v->is_string() && *v == "none") continue;
    if (n == "function_call" && v->is_string() && *v == "none") continue;
    if (n == "response_format" && v->is_object() && v->value("type", "") == "text") continue;
    if (n == "modalities" && *v == Json::array({"text"})) continue;
    if (n == "suffix" && v->is_string() && v->get<std::string>().empty()) continue;
    if (n == "best_of" && v->is_number_integer() && v->get<int64_t>() == 1) continue;
    if (n == "min_tokens" && v->is_number_integer() && v->get<int64_t>() == 0) continue;
    if (n == "suffix" && api != OpenAiApi::kCompletions) continue;
    return Bad(name, "is not supported by this server");
  }
  // vLLM's chat extras that change the prompt: a request's own template, variables for the
  // template, continuing the last message instead of starting a new turn, documents for the
  // template, special tokens added to the rendered prompt, the last message echoed, the
  // multimodal processor's arguments; and OpenAI's reasoning_effort, which vLLM hands to the
  // template of a reasoning model.
  if (api == OpenAiApi::kChatCompletions) {
    for (const char* name :
         {"chat_template", "chat_template_kwargs", "continue_final_message", "documents",
          "add_special_tokens", "echo", "mm_processor_kwargs", "reasoning_effort"}) {
      const Json* v = given(name);
      if (v == nullptr) continue;
      const std::string n = name;
      if ((n == "chat_template_kwargs" || n == "mm_processor_kwargs") && v->is_object() &&
          v->empty()) {
        continue;
      }
      if (n == "documents" && v->is_array() && v->empty()) continue;
      if ((n == "continue_final_message" || n == "add_special_tokens" || n == "echo") &&
          v->is_boolean() && !v->get<bool>()) {
        continue;
      }
      return Bad(name, "is not supported by this server (the server renders its own chat "
                       "template, --chat-template, with messages and add_generation_prompt only)");
    }
  }
  if (const Json* so = given("stream_options"); so != nullptr && so->is_object()) {
    auto c = so->find("continuous_usage_stats");
    if (c != so->end() && c->is_boolean() && c->get<bool>()) {
      return Bad("stream_options.continuous_usage_stats", "is not supported by this server");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiApi api, absl::string_view body) {
  absl::StatusOr<Json> parsed = ParseBody(body);
  if (!parsed.ok()) return parsed.status();
  const Json& o = *parsed;
  const Fields f(o);
  OpenAiRequest r;
  r.api = api;
  if (absl::Status s = RefuseUnsupported(o, api); !s.ok()) return s;
  std::optional<std::string> model;
  DCF_ASSIGN(model, f.String("model"));
  if (!model.has_value()) return Bad("model", "is required");
  r.model = *model;
  if (api == OpenAiApi::kCompletions) {
    if (absl::Status s = ParsePrompts(f.Get("prompt"), &r.prompts); !s.ok()) return s;
  } else {
    if (absl::Status s = ParseMessages(f.Get("messages"), &r.messages); !s.ok()) return s;
    std::optional<bool> add;
    DCF_ASSIGN(add, f.Bool("add_generation_prompt"));
    r.add_generation_prompt = add.value_or(true);
  }
  std::optional<int64_t> n;
  DCF_ASSIGN(n, f.Integer("n", 1, kMaxOpenAiChoices));
  r.n = static_cast<int>(n.value_or(1));
  if (static_cast<int64_t>(std::max<size_t>(1, r.prompts.size())) * r.n > kMaxOpenAiChoices) {
    return Bad("n", absl::StrCat("prompts x n must be at most ", kMaxOpenAiChoices));
  }
  std::optional<bool> flag;
  DCF_ASSIGN(flag, f.Bool("stream"));
  r.stream = flag.value_or(false);
  if (const Json* so = f.Get("stream_options")) {
    if (!so->is_object()) return WrongType("stream_options", "an object", *so);
    auto usage = so->find("include_usage");
    if (usage != so->end() && !usage->is_null()) {
      if (!usage->is_boolean()) return WrongType("stream_options.include_usage", "a boolean", *usage);
      r.include_usage = usage->get<bool>();
    }
    if (!r.stream) return Bad("stream_options", "is only allowed with stream: true");
  }
  // max_tokens; chat also takes max_completion_tokens (OpenAI's newer name), which wins.
  std::optional<int64_t> max_tokens;
  DCF_ASSIGN(max_tokens, f.Integer("max_tokens", 1, INT32_MAX));
  if (api == OpenAiApi::kChatCompletions) {
    std::optional<int64_t> mct;
    DCF_ASSIGN(mct, f.Integer("max_completion_tokens", 1, INT32_MAX));
    if (mct.has_value()) {
      max_tokens = mct;
      r.max_tokens_param = "max_completion_tokens";
    }
  }
  r.max_tokens = max_tokens;
  // Sampling: absent keeps the engine's defaults, which are OpenAI's (temperature 1, top_p 1).
  std::optional<double> d;
  DCF_ASSIGN(d, f.Number("temperature"));
  if (d) r.sampling.temperature = static_cast<float>(*d);
  DCF_ASSIGN(d, f.Number("top_p"));
  if (d) r.sampling.top_p = static_cast<float>(*d);
  DCF_ASSIGN(d, f.Number("min_p"));
  if (d) r.sampling.min_p = static_cast<float>(*d);
  DCF_ASSIGN(d, f.Number("repetition_penalty"));
  if (d) r.sampling.repetition_penalty = static_cast<float>(*d);
  DCF_ASSIGN(d, f.Number("presence_penalty"));
  if (d) r.sampling.presence_penalty = static_cast<float>(*d);
  DCF_ASSIGN(d, f.Number("frequency_penalty"));
  if (d) r.sampling.frequency_penalty = static_cast<float>(*d);
  std::optional<int64_t> i;
  // vLLM: top_k -1 (or 0) means off.
  DCF_ASSIGN(i, f.Integer("top_k", -1, INT32_MAX));
  if (i) r.sampling.top_k = *i <= 0 ? 0 : static_cast<int32_t>(*i);
  DCF_ASSIGN(i, f.Integer("seed", INT64_MIN, INT64_MAX));
  if (i) r.sampling.seed = static_cast<uint64_t>(*i);
  if (absl::Status s = ParseStop(f.Get("stop"), &r.stop); !s.ok()) return s;
  if (const Json* ids = f.Get("stop_token_ids")) {
    if (!ids->is_array()) return WrongType("stop_token_ids", "an array of token ids", *ids);
    if (absl::Status s = ParseTokenIds(*ids, "stop_token_ids", &r.stop_token_ids); !s.ok()) {
      return s;
    }
  }
  DCF_ASSIGN(flag, f.Bool("include_stop_str_in_output"));
  r.include_stop_str_in_output = flag.value_or(false);
  DCF_ASSIGN(flag, f.Bool("ignore_eos"));
  r.ignore_eos = flag.value_or(false);
  DCF_ASSIGN(flag, f.Bool("speculate"));
  r.speculate = flag.value_or(true);
  std::optional<std::string> user;
  DCF_ASSIGN(user, f.String("user"));  // type-checked, then dropped: it is logged nowhere
  std::optional<std::string> salt;
  DCF_ASSIGN(salt, f.String("cache_salt"));
  r.cache_salt = salt.value_or("");
  if (api == OpenAiApi::kCompletions) {
    DCF_ASSIGN(flag, f.Bool("echo"));
    r.echo = flag.value_or(false);
    DCF_ASSIGN(i, f.Integer("logprobs", 0, kMaxTopLogprobs));
    if (i) {
      r.logprobs = true;
      r.top_logprobs = static_cast<int>(*i);
    }
    if (r.echo && r.logprobs) {
      return Bad("echo", "with logprobs needs the prompt's log-probabilities, which this server "
                         "does not compute");
    }
  } else {
    DCF_ASSIGN(flag, f.Bool("logprobs"));
    r.logprobs = flag.value_or(false);
    DCF_ASSIGN(i, f.Integer("top_logprobs", 0, kMaxTopLogprobs));
    if (i) {
      if (!r.logprobs) return Bad("top_logprobs", "needs logprobs: true");
      r.top_logprobs = static_cast<int>(*i);
    }
  }
  return r;
}

namespace {

// The OpenAI names of the engine's fields (request_validator.h, sampling_params.h).
std::string OpenAiField(absl::string_view engine_field, const OpenAiRequest& r, int prompt) {
  const bool chat = r.api == OpenAiApi::kChatCompletions;
  if (absl::ConsumePrefix(&engine_field, "sampling.")) return std::string(engine_field);
  if (engine_field == "stopping.max_new_tokens") return r.max_tokens_param;
  if (absl::ConsumePrefix(&engine_field, "stopping.stop_strings")) {
    return absl::StrCat("stop", engine_field);
  }
  if (absl::ConsumePrefix(&engine_field, "stopping.stop_token_ids")) {
    return absl::StrCat("stop_token_ids", engine_field);
  }
  if (engine_field == "output.top_logprobs") return chat ? "top_logprobs" : "logprobs";
  // A group of requests (Engine::CheckQueueable): the choices of one or more prompts.
  if (engine_field == "requests") return r.n > 1 ? "n" : chat ? "messages" : "prompt";
  if (absl::ConsumePrefix(&engine_field, "prompt_tokens")) {
    if (chat) return "messages";
    return r.prompts.size() > 1 ? absl::StrCat("prompt[", prompt, "]", engine_field)
                                : absl::StrCat("prompt", engine_field);
  }
  return std::string(engine_field);
}

}  // namespace

absl::Status InOpenAiTerms(const absl::Status& s, const OpenAiRequest& r, int prompt) {
  const absl::string_view m = s.message();
  const size_t colon = m.find(": ");
  if (colon == absl::string_view::npos) return s;
  return absl::Status(s.code(), absl::StrCat(OpenAiField(m.substr(0, colon), r, prompt),
                                             m.substr(colon)));
}

absl::StatusOr<OpenAiPlan> PlanOpenAiRequest(const OpenAiRequest& r, const RequestLimits& limits,
                                             const ChatTemplateContext& chat) {
  OpenAiPlan plan;
  std::vector<OpenAiPrompt> prompts = r.prompts;
  if (r.api == OpenAiApi::kChatCompletions) {
    if (chat.chat_template == nullptr) {
      return Bad("messages", "this model has no chat template (use /v1/completions)");
    }
    ChatTemplateInputs inputs;
    inputs.messages = r.messages;
    inputs.add_generation_prompt = r.add_generation_prompt;
    inputs.bos_token = chat.bos_token;
    inputs.eos_token = chat.eos_token;
    absl::StatusOr<std::string> text = chat.chat_template->Render(inputs);
    if (!text.ok()) return Bad("messages", text.status().message());
    prompts = {OpenAiPrompt{true, *std::move(text), {}}};
  }
  for (size_t p = 0; p < prompts.size(); ++p) {
    std::vector<int32_t> ids;
    const std::string field =
        r.api == OpenAiApi::kChatCompletions ? "messages"
        : prompts.size() > 1 ? absl::StrCat("prompt[", p, "]")
                             : "prompt";
    if (prompts[p].is_text) {
      absl::StatusOr<std::vector<int32_t>> encoded =
          EncodeTextPrompt(prompts[p].text, limits, field, "send token ids");
      if (!encoded.ok()) return encoded.status();
      ids = *std::move(encoded);
      plan.prompt_texts.push_back(prompts[p].text);
    } else {
      ids = prompts[p].token_ids;
      std::string text;
      if (r.echo && limits.tokenizer != nullptr) {
        if (absl::Status s = ValidateTokenIds(field, ids, limits.vocab_size); !s.ok()) return s;
        absl::StatusOr<std::string> decoded = limits.tokenizer->Decode(ids, false);
        if (decoded.ok()) text = *std::move(decoded);
      }
      plan.prompt_texts.push_back(std::move(text));
    }
    if (ids.empty()) return Bad(field, "is empty");
    plan.prompt_tokens.push_back(static_cast<int>(ids.size()));
    const int prompt_len = static_cast<int>(ids.size());
    if (!r.max_tokens.has_value() && prompt_len >= limits.context &&
        prompt_len <= limits.max_prompt_tokens) {
      // The client set no max_tokens: what leaves no room is the prompt (the validator would
      // name max_tokens, with the default this function chose).
      return InOpenAiTerms(
          absl::OutOfRangeError(absl::StrCat("prompt_tokens: ", prompt_len,
                                             " tokens fill the model's context of ",
                                             limits.context, " tokens: no room to generate")),
          r, static_cast<int>(p));
    }
    for (int i = 0; i < r.n; ++i) {
      GenerationRequest g;
      g.prompt_tokens = ids;
      g.sampling = r.sampling;
      if (r.sampling.seed.has_value()) g.sampling.seed = *r.sampling.seed + static_cast<uint64_t>(i);
      if (r.max_tokens.has_value()) {
        g.stopping.max_new_tokens = static_cast<int32_t>(*r.max_tokens);
      } else if (r.api == OpenAiApi::kCompletions) {
        // OpenAI's legacy default, within what the context leaves.
        g.stopping.max_new_tokens = std::max(
            1, std::min({16, limits.max_new_tokens_limit, limits.context - prompt_len}));
      } else {
        g.stopping.max_new_tokens = limits.DefaultMaxNewTokens(prompt_len);
      }
      g.stopping.stop_strings = r.stop;
      g.stopping.stop_token_ids = r.stop_token_ids;
      g.stopping.include_stop_string = r.include_stop_str_in_output;
      g.stopping.ignore_eos = r.ignore_eos;
      g.speculate = r.speculate;
      g.cache_salt = r.cache_salt;
      g.output.logprobs = r.logprobs;
      g.output.top_logprobs = std::max(0, r.top_logprobs);
      g.output.text = limits.tokenizer != nullptr;
      if (absl::Status s = ValidateRequest(g, limits); !s.ok()) {
        return InOpenAiTerms(s, r, static_cast<int>(p));
      }
      plan.requests.push_back(std::move(g));
    }
  }
  return plan;
}

std::string OpenAiParam(const absl::Status& status) {
  const absl::string_view m = status.message();
  const size_t colon = m.find(": ");
  if (colon == absl::string_view::npos || colon == 0) return "";
  const absl::string_view path = m.substr(0, colon);
  for (char c : path) {
    if (c == ' ') return "";  // a sentence, not a path
  }
  return std::string(path);
}

}  // namespace dcf::server
