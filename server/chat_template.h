// Chat templates: the Jinja templates Hugging Face models carry (tokenizer_config.json's
// "chat_template", or chat_template.jinja), rendered by a small, strict interpreter of the
// Jinja subset those templates use. Debian 12 packages no C++ Jinja engine; this one covers
// what HF chat templates actually use and refuses everything else when the template is loaded
// (the server then does not start), never silently at render time.
//
// Supported (docs/OPENAI_API.md, "Chat templates", lists it for users):
//   - {{ expr }}, {% stmt %}, {# comment #}, whitespace control with '-' ({%- -%}, {{- -}}), and
//     HF's environment settings trim_blocks and lstrip_blocks;
//   - statements: for x in expr (loop.index, index0, revindex, revindex0, first, last, length,
//     previtem, nextitem; `for a, b in d.items()`), if / elif / else, set name = expr,
//     set ns.attr = expr;
//   - expressions: string, integer, float, boolean and none literals (true/True, none/None),
//     lists [a, b], dicts {k: v}, names, attribute and item access, slices [a:b:c], calls,
//     `a if c else b`, or, and, not, == != < > <= >=, in, not in, is [not] <test>, + - * / // %,
//     ~ (concatenation), unary -;
//   - filters: trim, length / count, upper, lower, capitalize, title, default / d, tojson,
//     string, int, join, first, last, list, reverse, replace, items;
//   - tests: defined, undefined, none, string, number, integer, float, boolean, mapping,
//     sequence, iterable, true, false, odd, even;
//   - functions: raise_exception(message), namespace(...), range(...); string methods strip,
//     lstrip, rstrip, startswith, endswith, upper, lower, split, replace, title, capitalize;
//     dict methods get, items, keys, values.
// Not supported (refused at load, naming line and column): macros, call blocks, filter
// blocks, include/import/extends, blocks, `with`, `break`/`continue`, other filters and tests,
// and nesting deeper than jinja::kMaxNesting (64) statements or expression levels
// ("nested too deeply"; an operator chain `a ~ b ~ c` counts one level per operator), so
// that no template that loads can exhaust a thread's stack when it renders.
//
// Undefined values follow Jinja's default: printing one prints nothing, testing it is false,
// but its attributes or items are an error. Integers are int64, not Python's unbounded ones:
// an operation whose result leaves int64 (+ - * // %, unary -, `int` of a larger number) is
// a render error naming its place, never a wrapped value; otherwise `int` is Jinja's (int(x),
// else int(float(x)), else its default, 0). A render error (raise_exception included) is an
// InvalidArgument whose message the server returns to the client.
//
// Thread-safety: a ChatTemplate is immutable once parsed; Render may run on many threads.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dcf::server {

namespace jinja {
struct Node;  // the parsed template (jinja_parser.h)
}  // namespace jinja

struct ChatMessage {
  std::string role;     // system, user, assistant
  std::string content;  // the message's text
};

struct ChatTemplateInputs {
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
};

class ChatTemplate {
 public:
  // Parses `source`. InvalidArgument "chat template line L, column C: ..." when it uses
  // anything outside the subset or is malformed.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(absl::string_view source);
  ~ChatTemplate();

  // The prompt text for `inputs`; InvalidArgument when the template fails (its own
  // raise_exception, an undefined attribute, a type error).
  absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const;

 private:
  ChatTemplate() = default;
  std::vector<std::unique_ptr<jinja::Node>> body_;
};

// The largest template file (--chat-template, chat_template.jinja) and tokenizer_config.json
// read: real ones are tens of KiB (a tokenizer_config.json with many added tokens, a few MiB).
inline constexpr size_t kMaxChatTemplateFileBytes = size_t{1} << 20;
inline constexpr size_t kMaxTokenizerConfigBytes = size_t{16} << 20;

// Where a served model's template comes from: `explicit_path` (--chat-template) when set;
// else <model_dir>/chat_template.jinja; else tokenizer_config.json's "chat_template" (a
// string, or a list of {name, template} from which "default" is taken). NotFound when there
// is none, also when the list names no "default" (transformers then has no template
// either). Also reads tokenizer_config.json's bos_token / eos_token (strings or
// {"content": ...}) into `*bos` and `*eos` when present. Each file must be a regular file
// within the limits above (InvalidArgument otherwise: a FIFO or /dev/zero must not hang
// start-up).
absl::StatusOr<std::string> LoadChatTemplateSource(const std::string& model_dir,
                                                   const std::string& explicit_path,
                                                   std::string* bos, std::string* eos);

}  // namespace dcf::server
