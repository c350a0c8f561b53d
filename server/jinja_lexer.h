// The lexer of the chat-template interpreter (chat_template.h): Split cuts a template into
// literal text and tags, applying whitespace control ('-' and '+' in tags) and HF's
// trim_blocks / lstrip_blocks; Tokenize cuts one tag's inside into the tokens the expression
// parser reads. Comments ({# #}) are dropped here.
//
// Errors are InvalidArgument "chat template line L, column C: ..." (At, the one format of
// every positioned template error, at load and at render). Pure functions: thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dcf::server::jinja {

// A run of literal text, or the inside of a {{ }} (kOutput) or {% %} (kStatement) tag without
// its delimiters, its opening '-' or '+' and its closing '-'; line and column are the tag's
// opening '{', inner_line and inner_column its inside's first character (0 for text).
struct Piece {
  enum class Kind { kText, kOutput, kStatement } kind;
  std::string text;  // text, or the tag's inside
  int line = 0, column = 0;
  int inner_line = 0, inner_column = 0;
};

// A token inside a tag; a kString token's text is the unescaped literal.
struct Token {
  enum class Type { kName, kString, kInt, kFloat, kOp, kEnd };
  Type type = Type::kEnd;
  std::string text;
  int line = 1, column = 1;
};

// InvalidArgument "chat template line <line>, column <column>: <what>".
absl::Status At(int line, int column, absl::string_view what);

// The template's text and tags in order; text pieces already trimmed. Error: a tag never
// closed ('{{', '{%' or '{#').
absl::StatusOr<std::vector<Piece>> Split(absl::string_view src);

// The tokens of an output or statement piece, ending with one kEnd token; positions are the
// template's (a tag may span lines). String literals are unescaped (\n \t \r \\ \' \"). Errors: a string never
// closed, a character no token starts with, '**'.
absl::StatusOr<std::vector<Token>> Tokenize(const Piece& piece);

}  // namespace dcf::server::jinja
