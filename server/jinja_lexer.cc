#include "server/jinja_lexer.h"

#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dcf::server::jinja {

absl::Status At(int line, int column, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("chat template line ", line, ", column ", column, ": ", what));
}

namespace {

// The line and column of successive offsets of one source, each found from the last (so
// that a template of n tags is split in O(size), not O(n * size)).
class Positions {
 public:
  // src[0] is at `line`, `column`.
  explicit Positions(absl::string_view src, int line = 1, int column = 1)
      : src_(src), line_(line), column_(column) {}

  // Offsets must not decrease from one call to the next.
  std::pair<int, int> At(size_t offset) {
    for (; at_ < offset && at_ < src_.size(); ++at_) {
      if (src_[at_] == '\n') {
        ++line_;
        column_ = 1;
      } else {
        ++column_;
      }
    }
    return {line_, column_};
  }

 private:
  absl::string_view src_;
  size_t at_ = 0;
  int line_, column_;
};

}  // namespace

absl::StatusOr<std::vector<Piece>> Split(absl::string_view src) {
  std::vector<Piece> out;
  Positions positions(src);
  size_t pos = 0;
  bool trim_next = false;       // a '-' closed the previous tag: strip leading whitespace
  bool trim_newline = false;    // trim_blocks: drop one newline after a block tag
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    while (open != absl::string_view::npos && open + 1 < src.size() &&
           src[open + 1] != '{' && src[open + 1] != '%' && src[open + 1] != '#') {
      open = src.find('{', open + 1);
    }
    if (open + 1 >= src.size()) open = absl::string_view::npos;
    std::string text(src.substr(pos, open == absl::string_view::npos ? absl::string_view::npos
                                                                        : open - pos));
    if (trim_newline && !text.empty() && text[0] == '\n') text.erase(0, 1);
    if (trim_next) text = std::string(absl::StripLeadingAsciiWhitespace(text));
    trim_newline = trim_next = false;
    if (open == absl::string_view::npos) {
      if (!text.empty()) out.push_back({Piece::Kind::kText, text});
      break;
    }
    const char type = src[open + 1];
    const bool minus = open + 2 < src.size() && src[open + 2] == '-';
    const bool plus = open + 2 < src.size() && src[open + 2] == '+';
    if (minus) {
      text = std::string(absl::StripTrailingAsciiWhitespace(text));
    } else if (type != '{' && !plus) {
      // lstrip_blocks: whitespace from the start of the line to a block tag goes.
      const size_t nl = text.find_last_of('\n');
      const size_t line_start = nl == std::string::npos ? 0 : nl + 1;
      const bool at_line_start = nl != std::string::npos || !out.empty() || pos == 0;
      if (at_line_start &&
          text.find_first_not_of(" \t", line_start) == std::string::npos) {
        text.erase(line_start);
      }
    }
    if (!text.empty()) out.push_back({Piece::Kind::kText, text});
    const char close_char = type == '{' ? '}' : type == '%' ? '%' : '#';
    const std::string close = absl::StrCat(std::string(1, close_char), "}");
    const size_t inner = open + 2 + (minus || plus ? 1 : 0);
    const size_t end = src.find(close, inner);
    const auto [line, column] = positions.At(open);
    if (end == absl::string_view::npos) {
      return At(line, column, absl::StrCat("'{", std::string(1, type), "' is never closed"));
    }
    size_t inner_end = end;
    bool close_minus = false;
    if (inner_end > inner && src[inner_end - 1] == '-') {
      close_minus = true;
      --inner_end;
    }
    if (type != '#') {
      const auto [inner_line, inner_column] = positions.At(inner);
      out.push_back({type == '{' ? Piece::Kind::kOutput : Piece::Kind::kStatement,
                     std::string(src.substr(inner, inner_end - inner)), line, column,
                     inner_line, inner_column});
    }
    trim_next = close_minus;
    trim_newline = type != '{';
    pos = end + 2;
  }
  return out;
}

absl::StatusOr<std::vector<Token>> Tokenize(const Piece& piece) {
  std::vector<Token> out;
  const std::string& s = piece.text;
  size_t i = 0;
  // The template positions of s's characters (a tag may span lines).
  Positions positions(s, piece.inner_line, piece.inner_column);
  while (i < s.size()) {
    const char c = s[i];
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    Token t;
    std::tie(t.line, t.column) = positions.At(i);
    if (absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (absl::ascii_isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      t.type = Token::Type::kName;
      t.text = s.substr(i, j - i);
      i = j;
    } else if (absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool dot = false;
      while (j < s.size() && (absl::ascii_isdigit(static_cast<unsigned char>(s[j])) ||
                              (s[j] == '.' && !dot && j + 1 < s.size() &&
                               absl::ascii_isdigit(static_cast<unsigned char>(s[j + 1]))))) {
        dot |= s[j] == '.';
        ++j;
      }
      t.type = dot ? Token::Type::kFloat : Token::Type::kInt;
      t.text = s.substr(i, j - i);
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string value;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          switch (e) {
            case 'n': value += '\n'; break;
            case 't': value += '\t'; break;
            case 'r': value += '\r'; break;
            case '\\': value += '\\'; break;
            case '\'': value += '\''; break;
            case '"': value += '"'; break;
            default: value += '\\'; value += e; break;
          }
        } else {
          value += s[j];
        }
      }
      if (j >= s.size()) return At(t.line, t.column, "a string is never closed");
      t.type = Token::Type::kString;
      t.text = std::move(value);
      i = j + 1;
    } else {
      static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "(", ")", "[", "]", "{",
                                   "}",  ",",  ":",  ".",  "|",  "~",  "+", "-", "*", "/", "%",
                                   "<",  ">",  "="};
      bool matched = false;
      for (const char* op : kOps) {
        if (absl::StartsWith(absl::string_view(s).substr(i), op)) {
          t.type = Token::Type::kOp;
          t.text = op;
          i += t.text.size();
          matched = true;
          break;
        }
      }
      if (!matched) return At(t.line, t.column, absl::StrCat("unexpected character '", std::string(1, c), "'"));
      if (t.text == "**") return At(t.line, t.column, "'**' is not supported");
    }
    out.push_back(std::move(t));
  }
  Token end;
  std::tie(end.line, end.column) = positions.At(s.size());
  out.push_back(end);
  return out;
}

}  // namespace dcf::server::jinja
