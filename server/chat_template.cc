#include "server/chat_template.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/file_util.h"
#include "nlohmann/json.hpp"
#include "server/jinja_lexer.h"
#include "server/jinja_parser.h"
#include "server/jinja_renderer.h"
#include "server/jinja_value.h"

// The interpreter is split by stage, in namespace jinja: values (jinja_value.h), the lexer
// (jinja_lexer.h), the syntax tree and its parser (jinja_parser.h), the renderer
// (jinja_renderer.h). This file is the public face: parsing, rendering and finding a model's
// template.

namespace dcf::server {

using jinja::Dict;
using jinja::List;
using jinja::Value;

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(absl::string_view source) {
  absl::StatusOr<std::vector<jinja::Piece>> pieces = jinja::Split(source);
  if (!pieces.ok()) return pieces.status();
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  if (absl::Status s = jinja::ParseTemplate(*std::move(pieces), &t->body_); !s.ok()) return s;
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs) const {
  Dict globals;
  List messages;
  for (const ChatMessage& m : inputs.messages) {
    messages.push_back(Value::MakeDict({{"role", Value::Str(m.role)},
                                        {"content", Value::Str(m.content)}}));
  }
  globals["messages"] = Value::MakeList(std::move(messages));
  globals["add_generation_prompt"] = Value::Bool(inputs.add_generation_prompt);
  globals["bos_token"] = Value::Str(inputs.bos_token);
  globals["eos_token"] = Value::Str(inputs.eos_token);
  std::string out;
  if (absl::Status s = jinja::RenderTemplate(body_, std::move(globals), &out); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::string> LoadChatTemplateSource(const std::string& model_dir,
                                                   const std::string& explicit_path,
                                                   std::string* bos, std::string* eos) {
  absl::StatusOr<std::string> config =
      ReadSmallFile(model_dir + "/tokenizer_config.json", kMaxTokenizerConfigBytes);
  if (!config.ok() && !absl::IsNotFound(config.status())) return config.status();
  nlohmann::json json;
  if (config.ok()) {
    json = nlohmann::json::parse(*config, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_dir, "/tokenizer_config.json is not valid JSON"));
    }
    auto token = [&](const char* key, std::string* out) {
      if (!json.is_object() || !json.contains(key)) return;
      const nlohmann::json& v = json[key];
      if (v.is_string()) *out = v.get<std::string>();
      if (v.is_object() && v.contains("content") && v["content"].is_string()) {
        *out = v["content"].get<std::string>();
      }
    };
    token("bos_token", bos);
    token("eos_token", eos);
  }
  if (!explicit_path.empty()) {
    absl::StatusOr<std::string> text = ReadSmallFile(explicit_path, kMaxChatTemplateFileBytes);
    if (!text.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chat-template: ", text.status().message()));
    }
    return text;
  }
  absl::StatusOr<std::string> jinja =
      ReadSmallFile(model_dir + "/chat_template.jinja", kMaxChatTemplateFileBytes);
  if (jinja.ok() || !absl::IsNotFound(jinja.status())) return jinja;
  if (config.ok() && json.is_object() && json.contains("chat_template")) {
    const nlohmann::json& t = json["chat_template"];
    if (t.is_string()) return t.get<std::string>();
    if (t.is_array()) {
      std::string names;
      for (const nlohmann::json& named : t) {
        if (!named.is_object() || !named.contains("name") || !named["name"].is_string() ||
            !named.contains("template") || !named["template"].is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              model_dir, "/tokenizer_config.json: chat_template is a list whose items are not "
                         "all {\"name\": string, \"template\": string}"));
        }
        const std::string name = named["name"].get<std::string>();
        if (name == "default") return named["template"].get<std::string>();
        absl::StrAppend(&names, names.empty() ? "" : ", ", name);
      }
      // As transformers: named templates without a default leave the model no chat template
      // of its own (a client there must name one; here --chat-template does).
      return absl::NotFoundError(absl::StrCat(
          model_dir, "/tokenizer_config.json names chat templates (", names,
          ") but none \"default\"; --chat-template FILE serves one"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir, "/tokenizer_config.json: chat_template is neither a string nor "
                                "a list of named templates"));
  }
  return absl::NotFoundError(absl::StrCat("no chat template in ", model_dir,
                                          " (chat_template.jinja or tokenizer_config.json)"));
}

}  // namespace dcf::server
