#include "server/chat_template.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/common/file_util.h"
#include "nlohmann/json.hpp"

namespace dcf::server {
namespace {

// ---------------------------------------------------------------------------------------
// Values

struct Value;
using List = std::vector<Value>;
using Dict = std::map<std::string, Value>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;  // shared: lists and dicts (namespaces) are reference types
  std::shared_ptr<Dict> dict;
  bool is_namespace = false;

  static Value None() { return Value{Kind::kNone}; }
  static Value Bool(bool v) { Value x{Kind::kBool}; x.b = v; return x; }
  static Value Int(int64_t v) { Value x{Kind::kInt}; x.i = v; return x; }
  static Value Float(double v) { Value x{Kind::kFloat}; x.f = v; return x; }
  static Value Str(std::string v) { Value x{Kind::kString}; x.s = std::move(v); return x; }
  static Value MakeList(List v) {
    Value x{Kind::kList};
    x.list = std::make_shared<List>(std::move(v));
    return x;
  }
  static Value MakeDict(Dict v) {
    Value x{Kind::kDict};
    x.dict = std::make_shared<Dict>(std::move(v));
    return x;
  }
  bool defined() const { return kind != Kind::kUndefined; }
  bool number() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  double AsDouble() const { return kind == Kind::kInt ? static_cast<double>(i) : f; }
};

const char* KindName(Value::Kind k) {
  switch (k) {
    case Value::Kind::kUndefined: return "undefined";
    case Value::Kind::kNone: return "none";
    case Value::Kind::kBool: return "boolean";
    case Value::Kind::kInt: return "integer";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "string";
    case Value::Kind::kList: return "list";
    case Value::Kind::kDict: return "dict";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.b;
    case Value::Kind::kInt: return v.i != 0;
    case Value::Kind::kFloat: return v.f != 0;
    case Value::Kind::kString: return !v.s.empty();
    case Value::Kind::kList: return !v.list->empty();
    case Value::Kind::kDict: return !v.dict->empty();
  }
  return false;
}

std::string Repr(const Value& v);

std::string ToText(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.b ? "True" : "False";
    case Value::Kind::kInt: return absl::StrCat(v.i);
    case Value::Kind::kFloat: {
      std::string s = absl::StrCat(v.f);
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
      return s;
    }
    case Value::Kind::kString: return v.s;
    case Value::Kind::kList: {
      std::vector<std::string> parts;
      for (const Value& e : *v.list) parts.push_back(Repr(e));
      return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
    }
    case Value::Kind::kDict: {
      std::vector<std::string> parts;
      for (const auto& [k, e] : *v.dict) parts.push_back(absl::StrCat("'", k, "': ", Repr(e)));
      return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
    }
  }
  return "";
}

std::string Repr(const Value& v) {
  return v.kind == Value::Kind::kString ? absl::StrCat("'", v.s, "'") : ToText(v);
}

nlohmann::ordered_json ToJson(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return nullptr;
    case Value::Kind::kBool: return v.b;
    case Value::Kind::kInt: return v.i;
    case Value::Kind::kFloat: return v.f;
    case Value::Kind::kString: return v.s;
    case Value::Kind::kList: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const Value& e : *v.list) a.push_back(ToJson(e));
      return a;
    }
    case Value::Kind::kDict: {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& [k, e] : *v.dict) o[k] = ToJson(e);
      return o;
    }
  }
  return nullptr;
}

bool Equal(const Value& a, const Value& b) {
  if (a.number() && b.number()) return a.AsDouble() == b.AsDouble();
  if (a.kind != b.kind) {
    return a.kind == Value::Kind::kBool && b.number() ? a.b == (b.AsDouble() != 0)
           : b.kind == Value::Kind::kBool && a.number() ? b.b == (a.AsDouble() != 0)
                                                        : false;
  }
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kBool: return a.b == b.b;
    case Value::Kind::kString: return a.s == b.s;
    case Value::Kind::kList: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        if (!Equal((*a.list)[i], (*b.list)[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, e] : *a.dict) {
        auto it = b.dict->find(k);
        if (it == b.dict->end() || !Equal(e, it->second)) return false;
      }
      return true;
    }
    default: return false;
  }
}

// ---------------------------------------------------------------------------------------
// Tokens of the expressions inside tags

struct Token {
  enum class Type { kName, kString, kInt, kFloat, kOp, kEnd };
  Type type = Type::kEnd;
  std::string text;
  int line = 1, column = 1;
};

absl::Status At(int line, int column, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("chat template line ", line, ", column ", column, ": ", what));
}

// ---------------------------------------------------------------------------------------
// The syntax tree

struct Expr {
  enum class Kind {
    kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kNot, kNeg, kBinary, kCond,
    kList, kDict
  };
  Kind kind;
  int line = 1, column = 1;
  Value literal;
  std::string name;  // kName, kAttr (the attribute), kFilter, kTest, kBinary (the operator)
  std::vector<std::unique_ptr<Expr>> args;  // operands, call/filter/test arguments, elements
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  bool negate = false;  // kTest: `is not`
  bool has_slice[3] = {false, false, false};
};
using ExprPtr = std::unique_ptr<Expr>;

}  // namespace

struct ChatTemplate::Node {
  enum class Kind { kText, kOutput, kFor, kIf, kSet };
  Kind kind;
  int line = 1, column = 1;
  std::string text;                  // kText
  ExprPtr expr;                      // kOutput, kFor (iterable), kSet (value)
  std::vector<std::string> targets;  // kFor loop variables; kSet: name [, attribute]
  std::vector<std::unique_ptr<Node>> body, else_body;
  std::vector<std::pair<ExprPtr, std::vector<std::unique_ptr<Node>>>> branches;  // kIf
};

namespace {

using Node = ChatTemplate::Node;
using NodeList = std::vector<std::unique_ptr<Node>>;

// ---------------------------------------------------------------------------------------
// Lexing the template into text and tags

struct Piece {
  enum class Kind { kText, kOutput, kStatement } kind;
  std::string text;  // text, or the tag's inside
  int line, column;
};

std::pair<int, int> Position(absl::string_view src, size_t offset) {
  int line = 1, column = 1;
  for (size_t i = 0; i < offset && i < src.size(); ++i) {
    if (src[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

absl::StatusOr<std::vector<Piece>> Split(absl::string_view src) {
  std::vector<Piece> out;
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
      if (!text.empty()) out.push_back({Piece::Kind::kText, text, 0, 0});
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
    if (!text.empty()) out.push_back({Piece::Kind::kText, text, 0, 0});
    const char close_char = type == '{' ? '}' : type == '%' ? '%' : '#';
    const std::string close = absl::StrCat(std::string(1, close_char), "}");
    const size_t inner = open + 2 + (minus || plus ? 1 : 0);
    const size_t end = src.find(close, inner);
    const auto [line, column] = Position(src, open);
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
      out.push_back({type == '{' ? Piece::Kind::kOutput : Piece::Kind::kStatement,
                     std::string(src.substr(inner, inner_end - inner)), line, column});
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
  auto column = [&](size_t at) { return piece.column + 2 + static_cast<int>(at); };
  while (i < s.size()) {
    const char c = s[i];
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    Token t;
    t.line = piece.line;
    t.column = column(i);
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
  end.line = piece.line;
  end.column = column(s.size());
  out.push_back(end);
  return out;
}

// ---------------------------------------------------------------------------------------
// Parsing expressions

class ExprParser {
 public:
  explicit ExprParser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  absl::StatusOr<ExprPtr> ParseAll() {
    absl::StatusOr<ExprPtr> e = Parse();
    if (!e.ok()) return e;
    if (Peek().type != Token::Type::kEnd) return Fail(Peek(), "unexpected '" + Peek().text + "'");
    return e;
  }
  absl::StatusOr<ExprPtr> Parse() { return Conditional(); }

  const Token& Peek(size_t ahead = 0) const { return t_[std::min(pos_ + ahead, t_.size() - 1)]; }
  const Token& Next() { return t_[std::min(pos_++, t_.size() - 1)]; }
  bool IsOp(const char* op) const { return Peek().type == Token::Type::kOp && Peek().text == op; }
  bool IsName(const char* n) const { return Peek().type == Token::Type::kName && Peek().text == n; }
  bool AtEnd() const { return Peek().type == Token::Type::kEnd; }
  absl::Status Fail(const Token& t, absl::string_view what) const {
    return At(t.line, t.column, what);
  }
  absl::Status Expect(const char* op) {
    if (!IsOp(op)) return Fail(Peek(), absl::StrCat("expected '", op, "'"));
    ++pos_;
    return absl::OkStatus();
  }

 private:
  ExprPtr Make(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }

  absl::StatusOr<ExprPtr> Conditional() {
    absl::StatusOr<ExprPtr> value = Or();
    if (!value.ok() || !IsName("if")) return value;
    const Token& at = Next();
    absl::StatusOr<ExprPtr> cond = Or();
    if (!cond.ok()) return cond;
    ExprPtr e = Make(Expr::Kind::kCond, at);
    e->args.push_back(std::move(*cond));
    e->args.push_back(std::move(*value));
    if (IsName("else")) {
      Next();
      absl::StatusOr<ExprPtr> other = Conditional();
      if (!other.ok()) return other;
      e->args.push_back(std::move(*other));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Binary(std::function<absl::StatusOr<ExprPtr>()> operand,
                                 std::function<bool()> at_op) {
    absl::StatusOr<ExprPtr> left = operand();
    while (left.ok() && at_op()) {
      const Token& op = Next();
      absl::StatusOr<ExprPtr> right = operand();
      if (!right.ok()) return right;
      ExprPtr e = Make(Expr::Kind::kBinary, op);
      e->name = op.text;
      e->args.push_back(std::move(*left));
      e->args.push_back(std::move(*right));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> Or() {
    return Binary([this] { return And(); }, [this] { return IsName("or"); });
  }
  absl::StatusOr<ExprPtr> And() {
    return Binary([this] { return Not(); }, [this] { return IsName("and"); });
  }
  absl::StatusOr<ExprPtr> Not() {
    if (!IsName("not")) return Compare();
    const Token& at = Next();
    absl::StatusOr<ExprPtr> operand = Not();
    if (!operand.ok()) return operand;
    ExprPtr e = Make(Expr::Kind::kNot, at);
    e->args.push_back(std::move(*operand));
    return e;
  }

  absl::StatusOr<ExprPtr> Compare() {
    absl::StatusOr<ExprPtr> left = Concat();
    while (left.ok()) {
      if (IsName("is")) {
        const Token& at = Next();
        ExprPtr e = Make(Expr::Kind::kTest, at);
        if (IsName("not")) {
          Next();
          e->negate = true;
        }
        if (Peek().type != Token::Type::kName) return Fail(Peek(), "expected a test name");
        e->name = Next().text;
        e->args.push_back(std::move(*left));
        if (IsOp("(")) {
          Next();
          while (!IsOp(")")) {
            absl::StatusOr<ExprPtr> a = Parse();
            if (!a.ok()) return a;
            e->args.push_back(std::move(*a));
            if (!IsOp(",")) break;
            Next();
          }
          if (absl::Status s = Expect(")"); !s.ok()) return s;
        } else if (Peek().type == Token::Type::kString || Peek().type == Token::Type::kInt ||
                   IsName("none") || IsName("None")) {
          absl::StatusOr<ExprPtr> a = Primary();  // `is sameas none`, `is equalto 3`
          if (!a.ok()) return a;
          e->args.push_back(std::move(*a));
        }
        left = std::move(e);
        continue;
      }
      std::string op;
      if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">=")) {
        op = Peek().text;
      } else if (IsName("in")) {
        op = "in";
      } else if (IsName("not") && Peek(1).type == Token::Type::kName && Peek(1).text == "in") {
        op = "not in";
        Next();
      } else {
        break;
      }
      const Token& at = Next();
      absl::StatusOr<ExprPtr> right = Concat();
      if (!right.ok()) return right;
      ExprPtr e = Make(Expr::Kind::kBinary, at);
      e->name = op;
      e->args.push_back(std::move(*left));
      e->args.push_back(std::move(*right));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> Concat() {
    return Binary([this] { return Additive(); }, [this] { return IsOp("~"); });
  }
  absl::StatusOr<ExprPtr> Additive() {
    return Binary([this] { return Multiplicative(); },
                  [this] { return IsOp("+") || IsOp("-"); });
  }
  absl::StatusOr<ExprPtr> Multiplicative() {
    return Binary([this] { return Unary(); },
                  [this] { return IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%"); });
  }
  absl::StatusOr<ExprPtr> Unary() {
    if (IsOp("-")) {
      const Token& at = Next();
      absl::StatusOr<ExprPtr> operand = Unary();
      if (!operand.ok()) return operand;
      ExprPtr e = Make(Expr::Kind::kNeg, at);
      e->args.push_back(std::move(*operand));
      return e;
    }
    return Filtered();
  }

  absl::Status Arguments(Expr* e) {
    if (absl::Status s = Expect("("); !s.ok()) return s;
    while (!IsOp(")")) {
      if (Peek().type == Token::Type::kName && Peek(1).type == Token::Type::kOp &&
          Peek(1).text == "=") {
        std::string key = Next().text;
        Next();
        absl::StatusOr<ExprPtr> v = Parse();
        if (!v.ok()) return v.status();
        e->kwargs.emplace_back(std::move(key), std::move(*v));
      } else {
        absl::StatusOr<ExprPtr> v = Parse();
        if (!v.ok()) return v.status();
        e->args.push_back(std::move(*v));
      }
      if (!IsOp(",")) break;
      Next();
    }
    return Expect(")");
  }

  absl::StatusOr<ExprPtr> Filtered() {
    absl::StatusOr<ExprPtr> value = Postfix();
    while (value.ok() && IsOp("|")) {
      Next();
      if (Peek().type != Token::Type::kName) return Fail(Peek(), "expected a filter name");
      const Token& name = Next();
      ExprPtr e = Make(Expr::Kind::kFilter, name);
      e->name = name.text;
      e->args.push_back(std::move(*value));
      if (IsOp("(")) {
        if (absl::Status s = Arguments(e.get()); !s.ok()) return s;
      }
      value = std::move(e);
    }
    return value;
  }

  absl::StatusOr<ExprPtr> Postfix() {
    absl::StatusOr<ExprPtr> value = Primary();
    while (value.ok()) {
      if (IsOp(".")) {
        Next();
        if (Peek().type != Token::Type::kName) return Fail(Peek(), "expected an attribute name");
        const Token& name = Next();
        ExprPtr e = Make(Expr::Kind::kAttr, name);
        e->name = name.text;
        e->args.push_back(std::move(*value));
        value = std::move(e);
      } else if (IsOp("[")) {
        const Token& at = Next();
        ExprPtr index[3];
        bool slice = false;
        bool has[3] = {false, false, false};
        for (int part = 0; part < 3; ++part) {
          if (!IsOp(":") && !IsOp("]")) {
            absl::StatusOr<ExprPtr> v = Parse();
            if (!v.ok()) return v;
            index[part] = std::move(*v);
            has[part] = true;
          }
          if (!IsOp(":")) break;
          Next();
          slice = true;
        }
        if (absl::Status s = Expect("]"); !s.ok()) return s;
        ExprPtr e = Make(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, at);
        e->args.push_back(std::move(*value));
        if (slice) {
          for (int part = 0; part < 3; ++part) {
            e->has_slice[part] = has[part];
            e->args.push_back(has[part] ? std::move(index[part]) : nullptr);
          }
        } else {
          if (!has[0]) return Fail(at, "an empty subscript");
          e->args.push_back(std::move(index[0]));
        }
        value = std::move(e);
      } else if (IsOp("(")) {
        ExprPtr e = Make(Expr::Kind::kCall, Peek());
        e->args.push_back(std::move(*value));
        if (absl::Status s = Arguments(e.get()); !s.ok()) return s;
        value = std::move(e);
      } else {
        break;
      }
    }
    return value;
  }

  absl::StatusOr<ExprPtr> Primary() {
    const Token& t = Next();
    switch (t.type) {
      case Token::Type::kString: {
        ExprPtr e = Make(Expr::Kind::kLiteral, t);
        std::string s = t.text;
        while (Peek().type == Token::Type::kString) s += Next().text;  // 'a' 'b'
        e->literal = Value::Str(std::move(s));
        return e;
      }
      case Token::Type::kInt: {
        ExprPtr e = Make(Expr::Kind::kLiteral, t);
        int64_t v = 0;
        if (!absl::SimpleAtoi(t.text, &v)) return Fail(t, "an integer out of range");
        e->literal = Value::Int(v);
        return e;
      }
      case Token::Type::kFloat: {
        ExprPtr e = Make(Expr::Kind::kLiteral, t);
        double v = 0;
        absl::SimpleAtod(t.text, &v);
        e->literal = Value::Float(v);
        return e;
      }
      case Token::Type::kName: {
        ExprPtr e = Make(Expr::Kind::kLiteral, t);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case Token::Type::kOp:
        if (t.text == "(") {
          absl::StatusOr<ExprPtr> inner = Parse();
          if (!inner.ok()) return inner;
          if (absl::Status s = Expect(")"); !s.ok()) return s;
          return inner;
        }
        if (t.text == "[") {
          ExprPtr e = Make(Expr::Kind::kList, t);
          while (!IsOp("]")) {
            absl::StatusOr<ExprPtr> v = Parse();
            if (!v.ok()) return v;
            e->args.push_back(std::move(*v));
            if (!IsOp(",")) break;
            Next();
          }
          if (absl::Status s = Expect("]"); !s.ok()) return s;
          return e;
        }
        if (t.text == "{") {
          ExprPtr e = Make(Expr::Kind::kDict, t);
          while (!IsOp("}")) {
            absl::StatusOr<ExprPtr> k = Parse();
            if (!k.ok()) return k;
            if (absl::Status s = Expect(":"); !s.ok()) return s;
            absl::StatusOr<ExprPtr> v = Parse();
            if (!v.ok()) return v;
            e->args.push_back(std::move(*k));
            e->args.push_back(std::move(*v));
            if (!IsOp(",")) break;
            Next();
          }
          if (absl::Status s = Expect("}"); !s.ok()) return s;
          return e;
        }
        return Fail(t, absl::StrCat("unexpected '", t.text, "'"));
      case Token::Type::kEnd:
        return Fail(t, "an expression is missing");
    }
    return Fail(t, "unexpected token");
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------
// Parsing statements

const std::vector<std::string>& KnownFilters() {
  static const auto* f = new std::vector<std::string>{
      "trim", "length", "count", "upper", "lower", "capitalize", "title", "default", "d",
      "tojson", "string", "int", "join", "first", "last", "list", "reverse", "replace", "items"};
  return *f;
}
const std::vector<std::string>& KnownTests() {
  static const auto* t = new std::vector<std::string>{
      "defined", "undefined", "none", "string", "number", "integer", "float", "boolean",
      "mapping", "sequence", "iterable", "true", "false", "odd", "even"};
  return *t;
}

// Refuses filters and tests outside the subset anywhere in `e`.
absl::Status CheckNames(const Expr& e) {
  auto known = [](const std::vector<std::string>& list, const std::string& n) {
    return std::find(list.begin(), list.end(), n) != list.end();
  };
  if (e.kind == Expr::Kind::kFilter && !known(KnownFilters(), e.name)) {
    return At(e.line, e.column, absl::StrCat("the filter '", e.name, "' is not supported"));
  }
  if (e.kind == Expr::Kind::kTest && !known(KnownTests(), e.name)) {
    return At(e.line, e.column, absl::StrCat("the test '", e.name, "' is not supported"));
  }
  for (const ExprPtr& a : e.args) {
    if (a != nullptr) {
      if (absl::Status s = CheckNames(*a); !s.ok()) return s;
    }
  }
  for (const auto& [k, a] : e.kwargs) {
    if (absl::Status s = CheckNames(*a); !s.ok()) return s;
  }
  return absl::OkStatus();
}

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  absl::Status ParseAll(NodeList* out) {
    std::string end;
    if (absl::Status s = ParseBody(out, {}, &end); !s.ok()) return s;
    return absl::OkStatus();
  }

 private:
  // Parses nodes until a statement whose keyword is in `stops` (returned in *stop with its
  // tokens left in stop_parser_), or the end of the template (then stops must be empty).
  absl::Status ParseBody(NodeList* out, const std::vector<std::string>& stops, std::string* stop) {
    while (pos_ < pieces_.size()) {
      const Piece& p = pieces_[pos_++];
      if (p.kind == Piece::Kind::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->text = p.text;
        out->push_back(std::move(n));
        continue;
      }
      absl::StatusOr<std::vector<Token>> tokens = Tokenize(p);
      if (!tokens.ok()) return tokens.status();
      auto parser = std::make_unique<ExprParser>(*std::move(tokens));
      if (p.kind == Piece::Kind::kOutput) {
        absl::StatusOr<ExprPtr> e = parser->ParseAll();
        if (!e.ok()) return e.status();
        if (absl::Status s = CheckNames(**e); !s.ok()) return s;
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->expr = std::move(*e);
        out->push_back(std::move(n));
        continue;
      }
      const Token keyword = parser->Next();
      if (keyword.type != Token::Type::kName) return At(p.line, p.column, "a statement is missing");
      if (std::find(stops.begin(), stops.end(), keyword.text) != stops.end()) {
        *stop = keyword.text;
        stop_parser_ = std::move(parser);
        return absl::OkStatus();
      }
      absl::Status s;
      if (keyword.text == "for") {
        s = ParseFor(parser.get(), p, out);
      } else if (keyword.text == "if") {
        s = ParseIf(parser.get(), p, out);
      } else if (keyword.text == "set") {
        s = ParseSet(parser.get(), p, out);
      } else if (keyword.text == "endfor" || keyword.text == "endif" || keyword.text == "elif" ||
                 keyword.text == "else") {
        return At(p.line, p.column, absl::StrCat("'", keyword.text, "' without its opening tag"));
      } else {
        return At(p.line, p.column, absl::StrCat("the tag '", keyword.text, "' is not supported"));
      }
      if (!s.ok()) return s;
    }
    if (!stops.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template: the template ends before its '", stops.front(), "'"));
    }
    return absl::OkStatus();
  }

  absl::Status ExpectEnd(ExprParser* parser, const Piece& p) {
    if (!parser->AtEnd()) {
      return parser->Fail(parser->Peek(), absl::StrCat("unexpected '", parser->Peek().text, "'"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseFor(ExprParser* parser, const Piece& p, NodeList* out) {
    auto n = std::make_unique<Node>();
    n->kind = Node::Kind::kFor;
    n->line = p.line;
    n->column = p.column;
    while (true) {
      if (parser->Peek().type != Token::Type::kName) {
        return parser->Fail(parser->Peek(), "expected a loop variable");
      }
      n->targets.push_back(parser->Next().text);
      if (!parser->IsOp(",")) break;
      parser->Next();
    }
    if (!parser->IsName("in")) return parser->Fail(parser->Peek(), "expected 'in'");
    parser->Next();
    absl::StatusOr<ExprPtr> iterable = parser->Parse();
    if (!iterable.ok()) return iterable.status();
    if ((*iterable)->kind == Expr::Kind::kCond || parser->IsName("recursive")) {
      return parser->Fail(parser->Peek(), "loop filters and recursive loops are not supported");
    }
    if (absl::Status s = ExpectEnd(parser, p); !s.ok()) return s;
    if (absl::Status s = CheckNames(**iterable); !s.ok()) return s;
    n->expr = std::move(*iterable);
    std::string stop;
    if (absl::Status s = ParseBody(&n->body, {"endfor", "else"}, &stop); !s.ok()) return s;
    if (stop == "else") {
      if (absl::Status s = ParseBody(&n->else_body, {"endfor"}, &stop); !s.ok()) return s;
    }
    out->push_back(std::move(n));
    return absl::OkStatus();
  }

  absl::Status ParseIf(ExprParser* parser, const Piece& p, NodeList* out) {
    auto n = std::make_unique<Node>();
    n->kind = Node::Kind::kIf;
    n->line = p.line;
    n->column = p.column;
    while (true) {
      absl::StatusOr<ExprPtr> cond = parser->Parse();
      if (!cond.ok()) return cond.status();
      if (absl::Status s = ExpectEnd(parser, p); !s.ok()) return s;
      if (absl::Status s = CheckNames(**cond); !s.ok()) return s;
      NodeList body;
      std::string stop;
      if (absl::Status s = ParseBody(&body, {"elif", "else", "endif"}, &stop); !s.ok()) return s;
      n->branches.emplace_back(std::move(*cond), std::move(body));
      if (stop == "endif") break;
      if (stop == "else") {
        if (absl::Status s = ParseBody(&n->else_body, {"endif"}, &stop); !s.ok()) return s;
        break;
      }
      parser = stop_parser_.get();  // elif: its condition follows in the same tag
      kept_.push_back(std::move(stop_parser_));
    }
    out->push_back(std::move(n));
    return absl::OkStatus();
  }

  absl::Status ParseSet(ExprParser* parser, const Piece& p, NodeList* out) {
    auto n = std::make_unique<Node>();
    n->kind = Node::Kind::kSet;
    n->line = p.line;
    n->column = p.column;
    if (parser->Peek().type != Token::Type::kName) {
      return parser->Fail(parser->Peek(), "expected a variable name");
    }
    n->targets.push_back(parser->Next().text);
    if (parser->IsOp(".")) {
      parser->Next();
      if (parser->Peek().type != Token::Type::kName) {
        return parser->Fail(parser->Peek(), "expected an attribute name");
      }
      n->targets.push_back(parser->Next().text);
    }
    if (!parser->IsOp("=")) {
      return parser->Fail(parser->Peek(), "only 'set name = value' is supported (no set blocks)");
    }
    parser->Next();
    absl::StatusOr<ExprPtr> value = parser->Parse();
    if (!value.ok()) return value.status();
    if (absl::Status s = ExpectEnd(parser, p); !s.ok()) return s;
    if (absl::Status s = CheckNames(**value); !s.ok()) return s;
    n->expr = std::move(*value);
    out->push_back(std::move(n));
    return absl::OkStatus();
  }

  std::vector<Piece> pieces_;
  size_t pos_ = 0;
  std::unique_ptr<ExprParser> stop_parser_;
  std::vector<std::unique_ptr<ExprParser>> kept_;
};

// ---------------------------------------------------------------------------------------
// Rendering

class Renderer {
 public:
  explicit Renderer(Dict globals) { scopes_.push_back(std::move(globals)); }

  absl::Status Run(const NodeList& nodes, std::string* out) {
    for (const std::unique_ptr<Node>& n : nodes) {
      if (absl::Status s = Exec(*n, out); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  static constexpr int kMaxIterations = 1 << 20;

  absl::Status Fail(int line, int column, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template line ", line, ", column ", column, ": ", what));
  }
  absl::Status Fail(const Expr& e, absl::string_view what) { return Fail(e.line, e.column, what); }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value();
  }

  absl::Status Exec(const Node& n, std::string* out) {
    switch (n.kind) {
      case Node::Kind::kText:
        out->append(n.text);
        return absl::OkStatus();
      case Node::Kind::kOutput: {
        absl::StatusOr<Value> v = Eval(*n.expr);
        if (!v.ok()) return v.status();
        out->append(ToText(*v));
        return absl::OkStatus();
      }
      case Node::Kind::kSet: {
        absl::StatusOr<Value> v = Eval(*n.expr);
        if (!v.ok()) return v.status();
        if (n.targets.size() == 1) {
          scopes_.back()[n.targets[0]] = *std::move(v);
          return absl::OkStatus();
        }
        Value ns = Lookup(n.targets[0]);
        if (ns.kind != Value::Kind::kDict || !ns.is_namespace) {
          return Fail(n.line, n.column,
                      absl::StrCat("'", n.targets[0], "' is not a namespace()"));
        }
        (*ns.dict)[n.targets[1]] = *std::move(v);
        return absl::OkStatus();
      }
      case Node::Kind::kIf: {
        for (const auto& [cond, body] : n.branches) {
          absl::StatusOr<Value> c = Eval(*cond);
          if (!c.ok()) return c.status();
          if (Truthy(*c)) return Run(body, out);
        }
        return Run(n.else_body, out);
      }
      case Node::Kind::kFor: {
        absl::StatusOr<Value> iterable = Eval(*n.expr);
        if (!iterable.ok()) return iterable.status();
        List items;
        if (iterable->kind == Value::Kind::kList) {
          items = *iterable->list;
        } else if (iterable->kind == Value::Kind::kDict) {
          for (const auto& [k, v] : *iterable->dict) items.push_back(Value::Str(k));
        } else if (iterable->kind == Value::Kind::kString) {
          for (char c : iterable->s) items.push_back(Value::Str(std::string(1, c)));
        } else if (iterable->defined() && iterable->kind != Value::Kind::kNone) {
          return Fail(*n.expr, absl::StrCat("cannot loop over a ", KindName(iterable->kind)));
        }
        if (items.empty()) return Run(n.else_body, out);
        const int64_t length = static_cast<int64_t>(items.size());
        for (int64_t i = 0; i < length; ++i) {
          if (++iterations_ > kMaxIterations) return Fail(n.line, n.column, "too many iterations");
          Dict scope;
          if (n.targets.size() == 1) {
            scope[n.targets[0]] = items[i];
          } else {
            const Value& item = items[i];
            if (item.kind != Value::Kind::kList || item.list->size() != n.targets.size()) {
              return Fail(n.line, n.column, "cannot unpack the loop item");
            }
            for (size_t t = 0; t < n.targets.size(); ++t) scope[n.targets[t]] = (*item.list)[t];
          }
          Dict loop;
          loop["index"] = Value::Int(i + 1);
          loop["index0"] = Value::Int(i);
          loop["revindex"] = Value::Int(length - i);
          loop["revindex0"] = Value::Int(length - i - 1);
          loop["first"] = Value::Bool(i == 0);
          loop["last"] = Value::Bool(i == length - 1);
          loop["length"] = Value::Int(length);
          if (i > 0) loop["previtem"] = items[i - 1];
          if (i + 1 < length) loop["nextitem"] = items[i + 1];
          scope["loop"] = Value::MakeDict(std::move(loop));
          scopes_.push_back(std::move(scope));
          absl::Status s = Run(n.body, out);
          // Jinja scoping: `set` inside a loop does not leak out of it (namespaces do).
          scopes_.pop_back();
          if (!s.ok()) return s;
        }
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: return Lookup(e.name);
      case Expr::Kind::kList: {
        List items;
        for (const ExprPtr& a : e.args) {
          absl::StatusOr<Value> v = Eval(*a);
          if (!v.ok()) return v;
          items.push_back(*std::move(v));
        }
        return Value::MakeList(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          absl::StatusOr<Value> k = Eval(*e.args[i]);
          if (!k.ok()) return k;
          absl::StatusOr<Value> v = Eval(*e.args[i + 1]);
          if (!v.ok()) return v;
          d[ToText(*k)] = *std::move(v);
        }
        return Value::MakeDict(std::move(d));
      }
      case Expr::Kind::kAttr:
      case Expr::Kind::kItem: {
        absl::StatusOr<Value> base = Eval(*e.args[0]);
        if (!base.ok()) return base;
        Value key = Value::Str(e.name);
        if (e.kind == Expr::Kind::kItem) {
          absl::StatusOr<Value> k = Eval(*e.args[1]);
          if (!k.ok()) return k;
          key = *std::move(k);
        }
        return Index(e, *base, key);
      }
      case Expr::Kind::kSlice: {
        absl::StatusOr<Value> base = Eval(*e.args[0]);
        if (!base.ok()) return base;
        int64_t bounds[3] = {0, 0, 1};
        bool given[3] = {false, false, false};
        for (int part = 0; part < 3; ++part) {
          if (!e.has_slice[part]) continue;
          absl::StatusOr<Value> v = Eval(*e.args[1 + part]);
          if (!v.ok()) return v;
          if (v->kind == Value::Kind::kNone) continue;
          if (v->kind != Value::Kind::kInt) return Fail(e, "slice bounds must be integers");
          bounds[part] = v->i;
          given[part] = true;
        }
        return Slice(e, *base, bounds, given);
      }
      case Expr::Kind::kNot: {
        absl::StatusOr<Value> v = Eval(*e.args[0]);
        if (!v.ok()) return v;
        return Value::Bool(!Truthy(*v));
      }
      case Expr::Kind::kNeg: {
        absl::StatusOr<Value> v = Eval(*e.args[0]);
        if (!v.ok()) return v;
        if (v->kind == Value::Kind::kInt) return Value::Int(-v->i);
        if (v->kind == Value::Kind::kFloat) return Value::Float(-v->f);
        return Fail(e, absl::StrCat("cannot negate a ", KindName(v->kind)));
      }
      case Expr::Kind::kCond: {
        absl::StatusOr<Value> c = Eval(*e.args[0]);
        if (!c.ok()) return c;
        if (Truthy(*c)) return Eval(*e.args[1]);
        if (e.args.size() > 2) return Eval(*e.args[2]);
        return Value();
      }
      case Expr::Kind::kBinary: return EvalBinary(e);
      case Expr::Kind::kTest: return EvalTest(e);
      case Expr::Kind::kFilter: return EvalFilter(e);
      case Expr::Kind::kCall: return EvalCall(e);
    }
    return Value();
  }

  absl::StatusOr<Value> Index(const Expr& e, const Value& base, const Value& key) {
    if (!base.defined()) {
      return Fail(e, absl::StrCat("'", ToText(key), "' of an undefined value"));
    }
    if (base.kind == Value::Kind::kDict) {
      auto it = base.dict->find(ToText(key));
      return it == base.dict->end() ? Value() : it->second;
    }
    if (key.kind == Value::Kind::kInt &&
        (base.kind == Value::Kind::kList || base.kind == Value::Kind::kString)) {
      const int64_t size = base.kind == Value::Kind::kList
                               ? static_cast<int64_t>(base.list->size())
                               : static_cast<int64_t>(base.s.size());
      int64_t i = key.i < 0 ? key.i + size : key.i;
      if (i < 0 || i >= size) return Value();
      return base.kind == Value::Kind::kList ? (*base.list)[i]
                                             : Value::Str(std::string(1, base.s[i]));
    }
    return Value();  // an attribute the value does not have: undefined
  }

  absl::StatusOr<Value> Slice(const Expr& e, const Value& base, int64_t b[3], bool given[3]) {
    if (base.kind != Value::Kind::kList && base.kind != Value::Kind::kString) {
      return Fail(e, absl::StrCat("cannot slice a ", KindName(base.kind)));
    }
    const int64_t size = base.kind == Value::Kind::kList ? static_cast<int64_t>(base.list->size())
                                                         : static_cast<int64_t>(base.s.size());
    const int64_t step = given[2] ? b[2] : 1;
    if (step == 0) return Fail(e, "a slice step of 0");
    auto clamp = [&](int64_t v, int64_t lo, int64_t hi) {
      if (v < 0) v += size;
      return std::max(lo, std::min(hi, v));
    };
    int64_t start = given[0] ? clamp(b[0], step > 0 ? 0 : -1, step > 0 ? size : size - 1)
                             : (step > 0 ? 0 : size - 1);
    int64_t stop = given[1] ? clamp(b[1], step > 0 ? 0 : -1, step > 0 ? size : size - 1)
                            : (step > 0 ? size : -1);
    List items;
    std::string text;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (base.kind == Value::Kind::kList) {
        items.push_back((*base.list)[i]);
      } else {
        text += base.s[i];
      }
    }
    return base.kind == Value::Kind::kList ? Value::MakeList(std::move(items))
                                           : Value::Str(std::move(text));
  }

  absl::StatusOr<Value> EvalBinary(const Expr& e) {
    absl::StatusOr<Value> l = Eval(*e.args[0]);
    if (!l.ok()) return l;
    if (e.name == "and") {
      if (!Truthy(*l)) return l;
      return Eval(*e.args[1]);
    }
    if (e.name == "or") {
      if (Truthy(*l)) return l;
      return Eval(*e.args[1]);
    }
    absl::StatusOr<Value> r = Eval(*e.args[1]);
    if (!r.ok()) return r;
    const std::string& op = e.name;
    if (op == "==") return Value::Bool(Equal(*l, *r));
    if (op == "!=") return Value::Bool(!Equal(*l, *r));
    if (op == "~") return Value::Str(ToText(*l) + ToText(*r));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r->kind == Value::Kind::kString) {
        found = l->kind == Value::Kind::kString && absl::StrContains(r->s, l->s);
      } else if (r->kind == Value::Kind::kList) {
        for (const Value& v : *r->list) found = found || Equal(v, *l);
      } else if (r->kind == Value::Kind::kDict) {
        found = r->dict->count(ToText(*l)) > 0;
      } else {
        return Fail(e, absl::StrCat("'in' of a ", KindName(r->kind)));
      }
      return Value::Bool(op == "in" ? found : !found);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int cmp;
      if (l->number() && r->number()) {
        cmp = l->AsDouble() < r->AsDouble() ? -1 : l->AsDouble() > r->AsDouble() ? 1 : 0;
      } else if (l->kind == Value::Kind::kString && r->kind == Value::Kind::kString) {
        cmp = l->s.compare(r->s);
      } else {
        return Fail(e, absl::StrCat("cannot compare a ", KindName(l->kind), " with a ",
                                    KindName(r->kind)));
      }
      return Value::Bool(op == "<" ? cmp < 0 : op == ">" ? cmp > 0 : op == "<=" ? cmp <= 0 : cmp >= 0);
    }
    if (op == "+") {
      if (l->kind == Value::Kind::kString && r->kind == Value::Kind::kString) {
        return Value::Str(l->s + r->s);
      }
      if (l->kind == Value::Kind::kList && r->kind == Value::Kind::kList) {
        List items = *l->list;
        items.insert(items.end(), r->list->begin(), r->list->end());
        return Value::MakeList(std::move(items));
      }
    }
    if (!l->number() || !r->number()) {
      return Fail(e, absl::StrCat("'", op, "' of a ", KindName(l->kind), " and a ",
                                  KindName(r->kind)));
    }
    const bool ints = l->kind == Value::Kind::kInt && r->kind == Value::Kind::kInt;
    if (op == "+") return ints ? Value::Int(l->i + r->i) : Value::Float(l->AsDouble() + r->AsDouble());
    if (op == "-") return ints ? Value::Int(l->i - r->i) : Value::Float(l->AsDouble() - r->AsDouble());
    if (op == "*") return ints ? Value::Int(l->i * r->i) : Value::Float(l->AsDouble() * r->AsDouble());
    if (r->AsDouble() == 0) return Fail(e, "division by zero");
    if (op == "/") return Value::Float(l->AsDouble() / r->AsDouble());
    if (op == "//") {
      if (ints) {
        int64_t q = l->i / r->i;
        if ((l->i % r->i != 0) && ((l->i < 0) != (r->i < 0))) --q;
        return Value::Int(q);
      }
      return Value::Float(std::floor(l->AsDouble() / r->AsDouble()));
    }
    if (op == "%") {
      if (ints) {
        int64_t m = l->i % r->i;
        if (m != 0 && ((m < 0) != (r->i < 0))) m += r->i;
        return Value::Int(m);
      }
      return Value::Float(std::fmod(l->AsDouble(), r->AsDouble()));
    }
    return Fail(e, absl::StrCat("unknown operator '", op, "'"));
  }

  absl::StatusOr<Value> EvalTest(const Expr& e) {
    absl::StatusOr<Value> v = Eval(*e.args[0]);
    if (!v.ok()) return v;
    const std::string& t = e.name;
    bool r = false;
    if (t == "defined") r = v->defined();
    else if (t == "undefined") r = !v->defined();
    else if (t == "none") r = v->kind == Value::Kind::kNone;
    else if (t == "string") r = v->kind == Value::Kind::kString;
    else if (t == "number") r = v->number();
    else if (t == "integer") r = v->kind == Value::Kind::kInt;
    else if (t == "float") r = v->kind == Value::Kind::kFloat;
    else if (t == "boolean") r = v->kind == Value::Kind::kBool;
    else if (t == "true") r = v->kind == Value::Kind::kBool && v->b;
    else if (t == "false") r = v->kind == Value::Kind::kBool && !v->b;
    else if (t == "mapping") r = v->kind == Value::Kind::kDict;
    else if (t == "sequence" || t == "iterable") {
      r = v->kind == Value::Kind::kList || v->kind == Value::Kind::kString ||
          v->kind == Value::Kind::kDict;
    } else if (t == "odd" || t == "even") {
      if (v->kind != Value::Kind::kInt) return Fail(e, "odd/even of a non-integer");
      r = (v->i % 2 != 0) == (t == "odd");
    }
    return Value::Bool(e.negate ? !r : r);
  }

  absl::StatusOr<std::vector<Value>> EvalArgs(const Expr& e, size_t from) {
    std::vector<Value> out;
    for (size_t i = from; i < e.args.size(); ++i) {
      absl::StatusOr<Value> v = Eval(*e.args[i]);
      if (!v.ok()) return v.status();
      out.push_back(*std::move(v));
    }
    return out;
  }

  absl::StatusOr<Value> EvalFilter(const Expr& e) {
    absl::StatusOr<Value> v = Eval(*e.args[0]);
    if (!v.ok()) return v;
    absl::StatusOr<std::vector<Value>> args = EvalArgs(e, 1);
    if (!args.ok()) return args.status();
    const std::string& f = e.name;
    const Value& x = *v;
    if (f == "default" || f == "d") {
      const bool falsy = args->size() > 1 && Truthy((*args)[1]);
      if (!x.defined() || (falsy && !Truthy(x))) return args->empty() ? Value::Str("") : (*args)[0];
      return x;
    }
    if (f == "trim") return Value::Str(std::string(absl::StripAsciiWhitespace(ToText(x))));
    if (f == "upper") return Value::Str(absl::AsciiStrToUpper(ToText(x)));
    if (f == "lower") return Value::Str(absl::AsciiStrToLower(ToText(x)));
    if (f == "capitalize" || f == "title") return StringMethod(e, Value::Str(ToText(x)), f, {});
    if (f == "string") return Value::Str(ToText(x));
    if (f == "tojson") return Value::Str(ToJson(x).dump());
    if (f == "int") {
      if (x.kind == Value::Kind::kInt) return x;
      if (x.kind == Value::Kind::kFloat) return Value::Int(static_cast<int64_t>(x.f));
      int64_t i = 0;
      return Value::Int(absl::SimpleAtoi(ToText(x), &i) ? i : 0);
    }
    if (f == "length" || f == "count") {
      if (x.kind == Value::Kind::kString) return Value::Int(static_cast<int64_t>(x.s.size()));
      if (x.kind == Value::Kind::kList) return Value::Int(static_cast<int64_t>(x.list->size()));
      if (x.kind == Value::Kind::kDict) return Value::Int(static_cast<int64_t>(x.dict->size()));
      if (!x.defined()) return Value::Int(0);
      return Fail(e, absl::StrCat("length of a ", KindName(x.kind)));
    }
    if (f == "join") {
      if (x.kind != Value::Kind::kList) return Fail(e, "join of a non-list");
      std::vector<std::string> parts;
      for (const Value& item : *x.list) parts.push_back(ToText(item));
      return Value::Str(absl::StrJoin(parts, args->empty() ? "" : ToText((*args)[0])));
    }
    if (f == "first" || f == "last") {
      if (x.kind == Value::Kind::kList) {
        if (x.list->empty()) return Value();
        return f == "first" ? x.list->front() : x.list->back();
      }
      if (x.kind == Value::Kind::kString && !x.s.empty()) {
        return Value::Str(std::string(1, f == "first" ? x.s.front() : x.s.back()));
      }
      return Value();
    }
    if (f == "list") {
      if (x.kind == Value::Kind::kList) return x;
      List items;
      if (x.kind == Value::Kind::kString) {
        for (char c : x.s) items.push_back(Value::Str(std::string(1, c)));
      } else if (x.kind == Value::Kind::kDict) {
        for (const auto& [k, item] : *x.dict) items.push_back(Value::Str(k));
      }
      return Value::MakeList(std::move(items));
    }
    if (f == "reverse") {
      if (x.kind == Value::Kind::kList) return Value::MakeList(List(x.list->rbegin(), x.list->rend()));
      return Value::Str(std::string(x.s.rbegin(), x.s.rend()));
    }
    if (f == "replace") return StringMethod(e, Value::Str(ToText(x)), "replace", *args);
    if (f == "items") return DictMethod(e, x, "items", {});
    return Fail(e, absl::StrCat("the filter '", f, "' is not supported"));
  }

  absl::StatusOr<Value> StringMethod(const Expr& e, const Value& s, const std::string& name,
                                     const std::vector<Value>& args) {
    const std::string& text = s.s;
    auto arg = [&](size_t i) { return i < args.size() ? ToText(args[i]) : std::string(); };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const std::string chars = args.empty() ? std::string(" \t\n\r\f\v") : arg(0);
      size_t b = 0, en = text.size();
      if (name != "rstrip") b = text.find_first_not_of(chars) == std::string::npos ? text.size() : text.find_first_not_of(chars);
      if (name != "lstrip") {
        const size_t last = text.find_last_not_of(chars);
        en = last == std::string::npos ? b : std::max(b, last + 1);
      }
      return Value::Str(text.substr(b, en - b));
    }
    if (name == "startswith") return Value::Bool(absl::StartsWith(text, arg(0)));
    if (name == "endswith") return Value::Bool(absl::EndsWith(text, arg(0)));
    if (name == "upper") return Value::Str(absl::AsciiStrToUpper(text));
    if (name == "lower") return Value::Str(absl::AsciiStrToLower(text));
    if (name == "replace") return Value::Str(absl::StrReplaceAll(text, {{arg(0), arg(1)}}));
    if (name == "capitalize") {
      std::string out = absl::AsciiStrToLower(text);
      if (!out.empty()) out[0] = absl::ascii_toupper(out[0]);
      return Value::Str(out);
    }
    if (name == "title") {
      std::string out = text;
      bool start = true;
      for (char& c : out) {
        c = start ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
        start = !absl::ascii_isalpha(static_cast<unsigned char>(c));
      }
      return Value::Str(out);
    }
    if (name == "split") {
      List parts;
      if (args.empty()) {
        for (absl::string_view p : absl::StrSplit(text, absl::ByAnyChar(" \t\n\r"), absl::SkipEmpty())) {
          parts.push_back(Value::Str(std::string(p)));
        }
      } else {
        for (absl::string_view p : absl::StrSplit(text, arg(0))) parts.push_back(Value::Str(std::string(p)));
      }
      return Value::MakeList(std::move(parts));
    }
    return Fail(e, absl::StrCat("strings have no method '", name, "' here"));
  }

  absl::StatusOr<Value> DictMethod(const Expr& e, const Value& d, const std::string& name,
                                   const std::vector<Value>& args) {
    if (d.kind != Value::Kind::kDict) return Fail(e, absl::StrCat("'", name, "' of a ", KindName(d.kind)));
    if (name == "get") {
      auto it = d.dict->find(args.empty() ? std::string() : ToText(args[0]));
      if (it != d.dict->end()) return it->second;
      return args.size() > 1 ? args[1] : Value::None();
    }
    List out;
    for (const auto& [k, v] : *d.dict) {
      if (name == "items") out.push_back(Value::MakeList({Value::Str(k), v}));
      else if (name == "keys") out.push_back(Value::Str(k));
      else if (name == "values") out.push_back(v);
      else return Fail(e, absl::StrCat("dicts have no method '", name, "' here"));
    }
    return Value::MakeList(std::move(out));
  }

  absl::StatusOr<Value> EvalCall(const Expr& e) {
    const Expr& callee = *e.args[0];
    absl::StatusOr<std::vector<Value>> args = EvalArgs(e, 1);
    if (!args.ok()) return args.status();
    if (callee.kind == Expr::Kind::kAttr) {
      absl::StatusOr<Value> self = Eval(*callee.args[0]);
      if (!self.ok()) return self;
      if (self->kind == Value::Kind::kString) return StringMethod(e, *self, callee.name, *args);
      if (self->kind == Value::Kind::kDict && !self->is_namespace) {
        return DictMethod(e, *self, callee.name, *args);
      }
      return Fail(e, absl::StrCat("a ", KindName(self->kind), " has no method '", callee.name, "'"));
    }
    if (callee.kind != Expr::Kind::kName) return Fail(e, "only named functions can be called");
    if (callee.name == "raise_exception") {
      return absl::InvalidArgumentError(absl::StrCat(
          "the chat template refused the messages: ", args->empty() ? "" : ToText((*args)[0])));
    }
    if (callee.name == "namespace") {
      Dict d;
      for (const auto& [k, v] : e.kwargs) {
        absl::StatusOr<Value> value = Eval(*v);
        if (!value.ok()) return value;
        d[k] = *std::move(value);
      }
      Value ns = Value::MakeDict(std::move(d));
      ns.is_namespace = true;
      return ns;
    }
    if (callee.name == "range") {
      int64_t b[3] = {0, 0, 1};
      if (args->empty() || args->size() > 3) return Fail(e, "range takes 1 to 3 integers");
      for (const Value& a : *args) {
        if (a.kind != Value::Kind::kInt) return Fail(e, "range takes integers");
      }
      if (args->size() == 1) {
        b[1] = (*args)[0].i;
      } else {
        b[0] = (*args)[0].i;
        b[1] = (*args)[1].i;
        if (args->size() == 3) b[2] = (*args)[2].i;
      }
      if (b[2] == 0) return Fail(e, "range step 0");
      List items;
      for (int64_t i = b[0]; b[2] > 0 ? i < b[1] : i > b[1]; i += b[2]) {
        if (items.size() >= kMaxIterations) return Fail(e, "range too long");
        items.push_back(Value::Int(i));
      }
      return Value::MakeList(std::move(items));
    }
    return Fail(e, absl::StrCat("the function '", callee.name, "' is not supported"));
  }

  std::vector<Dict> scopes_;
  int64_t iterations_ = 0;
};

}  // namespace

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(absl::string_view source) {
  absl::StatusOr<std::vector<Piece>> pieces = Split(source);
  if (!pieces.ok()) return pieces.status();
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  TemplateParser parser(*std::move(pieces));
  if (absl::Status s = parser.ParseAll(&t->body_); !s.ok()) return s;
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
  Renderer renderer(std::move(globals));
  std::string out;
  if (absl::Status s = renderer.Run(body_, &out); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::string> LoadChatTemplateSource(const std::string& model_dir,
                                                   const std::string& explicit_path,
                                                   std::string* bos, std::string* eos) {
  absl::StatusOr<std::string> config = ReadFileToString(model_dir + "/tokenizer_config.json");
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
    absl::StatusOr<std::string> text = ReadFileToString(explicit_path);
    if (!text.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chat-template: ", text.status().message()));
    }
    return text;
  }
  absl::StatusOr<std::string> jinja = ReadFileToString(model_dir + "/chat_template.jinja");
  if (jinja.ok()) return jinja;
  if (config.ok() && json.is_object() && json.contains("chat_template")) {
    const nlohmann::json& t = json["chat_template"];
    if (t.is_string()) return t.get<std::string>();
    if (t.is_array()) {
      for (const nlohmann::json& named : t) {
        if (named.is_object() && named.value("name", "") == "default" &&
            named.contains("template") && named["template"].is_string()) {
          return named["template"].get<std::string>();
        }
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir, "/tokenizer_config.json: chat_template is neither a string nor "
                                "a list holding a template named \"default\""));
  }
  return absl::NotFoundError(absl::StrCat("no chat template in ", model_dir,
                                          " (chat_template.jinja or tokenizer_config.json)"));
}

}  // namespace dcf::server
