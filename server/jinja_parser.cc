#include "server/jinja_parser.h"

#include <algorithm>
#include <cstdint>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/jinja_builtins.h"

namespace dcf::server::jinja {
namespace {

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
  absl::StatusOr<ExprPtr> Parse() {
    return Nested([this] { return Conditional(); });
  }

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

  // `parse` one level deeper into the parser's recursion: refused past kMaxNesting, at the
  // token it would start at, before the recursion can exhaust the stack.
  absl::StatusOr<ExprPtr> Nested(const std::function<absl::StatusOr<ExprPtr>()>& parse) {
    if (depth_ >= kMaxNesting) return Fail(Peek(), "nested too deeply");
    ++depth_;
    absl::StatusOr<ExprPtr> e = parse();
    --depth_;
    return e;
  }

  // `e` with its children in place: its height, refused past kMaxNesting at e's place.
  absl::StatusOr<ExprPtr> Sealed(ExprPtr e) {
    int below = 0;
    for (const ExprPtr& a : e->args) {
      if (a != nullptr) below = std::max(below, a->height);
    }
    for (const auto& [k, a] : e->kwargs) below = std::max(below, a->height);
    e->height = below + 1;
    if (e->height > kMaxNesting) return At(e->line, e->column, "nested too deeply");
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
      absl::StatusOr<ExprPtr> other = Nested([this] { return Conditional(); });
      if (!other.ok()) return other;
      e->args.push_back(std::move(*other));
    }
    return Sealed(std::move(e));
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
      left = Sealed(std::move(e));
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
    absl::StatusOr<ExprPtr> operand = Nested([this] { return Not(); });
    if (!operand.ok()) return operand;
    ExprPtr e = Make(Expr::Kind::kNot, at);
    e->args.push_back(std::move(*operand));
    return Sealed(std::move(e));
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
        left = Sealed(std::move(e));
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
      left = Sealed(std::move(e));
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
      absl::StatusOr<ExprPtr> operand = Nested([this] { return Unary(); });
      if (!operand.ok()) return operand;
      ExprPtr e = Make(Expr::Kind::kNeg, at);
      e->args.push_back(std::move(*operand));
      return Sealed(std::move(e));
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
      value = Sealed(std::move(e));
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
        value = Sealed(std::move(e));
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
        value = Sealed(std::move(e));
      } else if (IsOp("(")) {
        ExprPtr e = Make(Expr::Kind::kCall, Peek());
        e->args.push_back(std::move(*value));
        if (absl::Status s = Arguments(e.get()); !s.ok()) return s;
        value = Sealed(std::move(e));
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
          return Sealed(std::move(e));
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
          return Sealed(std::move(e));
        }
        return Fail(t, absl::StrCat("unexpected '", t.text, "'"));
      case Token::Type::kEnd:
        return Fail(t, "an expression is missing");
    }
    return Fail(t, "unexpected token");
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;  // Nested() calls in progress
};

// ---------------------------------------------------------------------------------------
// Parsing statements

// Refuses filters and tests outside the subset (jinja_builtins.h) anywhere in `e`.
absl::Status CheckNames(const Expr& e) {
  if (e.kind == Expr::Kind::kFilter) {
    if (absl::StatusOr<FilterFn> f = FindFilter({e.line, e.column}, e.name); !f.ok()) {
      return f.status();
    }
  }
  if (e.kind == Expr::Kind::kTest) {
    if (absl::StatusOr<TestFn> t = FindTest({e.line, e.column}, e.name); !t.ok()) {
      return t.status();
    }
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

  // Opens the body of the block statement `p`: refused past kMaxNesting; the caller leaves it
  // (--depth_) once its end tag is parsed. An error ends the parse, so it need not.
  absl::Status Enter(const Piece& p) {
    if (depth_ >= kMaxNesting) return At(p.line, p.column, "nested too deeply");
    ++depth_;
    return absl::OkStatus();
  }

  absl::Status ExpectEnd(ExprParser* parser) {
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
    if (absl::Status s = ExpectEnd(parser); !s.ok()) return s;
    if (absl::Status s = CheckNames(**iterable); !s.ok()) return s;
    n->expr = std::move(*iterable);
    if (absl::Status s = Enter(p); !s.ok()) return s;
    std::string stop;
    if (absl::Status s = ParseBody(&n->body, {"endfor", "else"}, &stop); !s.ok()) return s;
    if (stop == "else") {
      if (absl::Status s = ParseBody(&n->else_body, {"endfor"}, &stop); !s.ok()) return s;
    }
    --depth_;
    out->push_back(std::move(n));
    return absl::OkStatus();
  }

  absl::Status ParseIf(ExprParser* parser, const Piece& p, NodeList* out) {
    auto n = std::make_unique<Node>();
    n->kind = Node::Kind::kIf;
    n->line = p.line;
    n->column = p.column;
    if (absl::Status s = Enter(p); !s.ok()) return s;
    while (true) {
      absl::StatusOr<ExprPtr> cond = parser->Parse();
      if (!cond.ok()) return cond.status();
      if (absl::Status s = ExpectEnd(parser); !s.ok()) return s;
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
    --depth_;
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
    if (absl::Status s = ExpectEnd(parser); !s.ok()) return s;
    if (absl::Status s = CheckNames(**value); !s.ok()) return s;
    n->expr = std::move(*value);
    out->push_back(std::move(n));
    return absl::OkStatus();
  }

  std::vector<Piece> pieces_;
  size_t pos_ = 0;
  std::unique_ptr<ExprParser> stop_parser_;
  std::vector<std::unique_ptr<ExprParser>> kept_;
  int depth_ = 0;  // block statements open around the current piece
};

}  // namespace

absl::Status ParseTemplate(std::vector<Piece> pieces, NodeList* out) {
  TemplateParser parser(std::move(pieces));
  return parser.ParseAll(out);
}

}  // namespace dcf::server::jinja
