#include "server/jinja_renderer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/jinja_builtins.h"
#include "server/jinja_lexer.h"

namespace dcf::server::jinja {
namespace {

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
  // What one render may make in all: the bytes of every string value it computes (each copy
  // counts: a name's string is copied when read) and of every list it builds. Bounds the time
  // of copying as well as memory (2^20 iterations each copying a 16 MiB string would take
  // hours); the walks over shared values have their own allowance (kMaxWalkSteps).
  static constexpr size_t kMaxBytesMade = size_t{256} << 20;

  absl::Status Fail(int line, int column, absl::string_view what) { return At(line, column, what); }
  absl::Status Fail(const Expr& e, absl::string_view what) { return Fail(e.line, e.column, what); }
  static Site SiteOf(const Expr& e) { return Site{e.line, e.column}; }

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
        return Append(n.text, out);
      case Node::Kind::kOutput: {
        absl::StatusOr<Value> v = Eval(*n.expr);
        if (!v.ok()) return v.status();
        std::string text = ToText(*v);
        if (WalkAllowance::Exhausted()) return WalksSpent(n.line, n.column);
        return Append(text, out);
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
        // A namespace holding a namespace could come to hold itself: a cycle, which printing
        // would follow forever (Value::depth).
        const bool holds = HoldsNamespace(*v);
        if (WalkAllowance::Exhausted()) return WalksSpent(n.line, n.column);
        if (holds) return Fail(n.line, n.column, "a namespace attribute cannot hold a namespace");
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
        if (iterable->kind == Value::Kind::kString && iterable->s.size() > kMaxIterations) {
          return Fail(n.line, n.column, "too many iterations");
        }
        List items;
        if (iterable->kind == Value::Kind::kList) {
          items = *iterable->list;
          if (absl::Status s = Made(n.line, n.column, ListBytes(items)); !s.ok()) return s;
        } else if (iterable->kind == Value::Kind::kDict) {
          for (const auto& [k, v] : *iterable->dict) {
            WalkAllowance::SpendCopy(k.size());  // a copy of the key
            items.push_back(Value::Str(k));
          }
          if (WalkAllowance::Exhausted()) return WalksSpent(n.line, n.column);
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

  absl::Status Append(absl::string_view text, std::string* out) {
    if (out->size() + text.size() > kMaxStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat template: the rendered prompt would be longer than ", kMaxStringBytes >> 20,
          " MiB"));
    }
    out->append(text.data(), text.size());
    return absl::OkStatus();
  }

  // The bytes a copy of `items` holds: its Values and the strings directly in them.
  static size_t ListBytes(const List& items) {
    size_t bytes = items.size() * sizeof(Value);
    for (const Value& v : items) bytes += v.s.size();
    return bytes;
  }

  // Counts `bytes` more made by this render; refused past kMaxBytesMade.
  absl::Status Made(int line, int column, size_t bytes) {
    made_ += bytes;
    if (made_ <= kMaxBytesMade) return absl::OkStatus();
    return Fail(line, column, absl::StrCat("the template made more than ", kMaxBytesMade >> 20,
                                           " MiB of strings and lists"));
  }

  // At most 1 KiB of `text` (an error message's quote of a value).
  static std::string Short(std::string text) {
    constexpr size_t kMax = 1024;
    if (text.size() > kMax) text = absl::StrCat(text.substr(0, kMax), "... (", text.size(), " bytes)");
    return text;
  }

  absl::Status WalksSpent(int line, int column) {
    return Fail(line, column, absl::StrCat("the template took more than ", kMaxWalkSteps,
                                           " steps printing, comparing or searching values"));
  }

  // Spends a walk step per value (false once the allowance is spent).
  static bool HoldsNamespace(const Value& v) {
    if (!WalkAllowance::Spend(1)) return false;
    if (v.kind == Value::Kind::kList) {
      for (const Value& item : *v.list) {
        if (HoldsNamespace(item)) return true;
      }
    } else if (v.kind == Value::Kind::kDict) {
      if (v.is_namespace) return true;
      for (const auto& [k, item] : *v.dict) {
        if (HoldsNamespace(item)) return true;
      }
    }
    return false;
  }

  // Every value an expression computes passes here: a string is bounded and counted, and so
  // is a list the expression built (not one it only names: lists are shared, not copied).
  absl::StatusOr<Value> Eval(const Expr& e) {
    absl::StatusOr<Value> v = Compute(e);
    if (!v.ok()) return v;
    // A walk inside (printing, ==, `in`, tojson) ran out of the render's allowance: its
    // result is partial.
    if (WalkAllowance::Exhausted()) return WalksSpent(e.line, e.column);
    if (v->depth > kMaxNesting) return Fail(e, "a value nested too deeply");
    if (v->kind == Value::Kind::kString) {
      if (absl::Status s = CheckStringBytes(SiteOf(e), v->s.size()); !s.ok()) return s;
      if (absl::Status s = Made(e.line, e.column, v->s.size()); !s.ok()) return s;
    } else if (v->kind == Value::Kind::kList && e.kind != Expr::Kind::kName &&
               e.kind != Expr::Kind::kAttr && e.kind != Expr::Kind::kItem &&
               e.kind != Expr::Kind::kBinary) {  // list + list counts itself, before copying
      if (absl::Status s = Made(e.line, e.column, ListBytes(*v->list)); !s.ok()) return s;
    }
    return v;
  }

  absl::StatusOr<Value> Compute(const Expr& e) {
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
          absl::StatusOr<std::string> key = KeyOf(SiteOf(*e.args[i]), *k);
          if (!key.ok()) return key.status();
          d[*std::move(key)] = *std::move(v);
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
        if (v->kind == Value::Kind::kInt) {
          if (v->i == INT64_MIN) return Fail(e, "integer overflow in '-'");
          return Value::Int(-v->i);
        }
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
      return Fail(e, absl::StrCat("'", Short(ToText(key)), "' of an undefined value"));
    }
    if (base.kind == Value::Kind::kDict) {
      absl::StatusOr<std::string> k = KeyOf(SiteOf(e), key);
      if (!k.ok()) return k.status();
      auto it = base.dict->find(*k);
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
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      if (base.kind == Value::Kind::kList) {
        items.push_back((*base.list)[i]);
      } else {
        text += base.s[i];
      }
      // Past int64 is past the stop too (a step near INT64_MAX): the slice ends there.
      if (__builtin_add_overflow(i, step, &i)) break;
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
    if (op == "~") {
      std::string a = ToText(*l), b = ToText(*r);
      if (absl::Status s = CheckStringBytes(SiteOf(e), a.size() + b.size()); !s.ok()) return s;
      return Value::Str(std::move(a) + b);
    }
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r->kind == Value::Kind::kString) {
        if (l->kind == Value::Kind::kString) {
          // Eval refuses the render once the allowance is spent; the search is skipped then.
          found = WalkAllowance::SpendSearch(r->s.size(), l->s.size()) &&
                  absl::StrContains(r->s, l->s);
        }
      } else if (r->kind == Value::Kind::kList) {
        for (size_t i = 0; i < r->list->size() && !found; ++i) found = Equal((*r->list)[i], *l);
      } else if (r->kind == Value::Kind::kDict) {
        absl::StatusOr<std::string> key = KeyOf(SiteOf(e), *l);
        if (!key.ok()) return key.status();
        found = r->dict->count(*key) > 0;
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
        if (absl::Status s = CheckStringBytes(SiteOf(e), l->s.size() + r->s.size()); !s.ok()) {
          return s;
        }
        return Value::Str(l->s + r->s);
      }
      if (l->kind == Value::Kind::kList && r->kind == Value::Kind::kList) {
        if (absl::Status s = CheckListItems(SiteOf(e), l->list->size() + r->list->size());
            !s.ok()) {
          return s;
        }
        if (absl::Status s = Made(e.line, e.column, ListBytes(*l->list) + ListBytes(*r->list));
            !s.ok()) {
          return s;
        }
        List items = *l->list;
        items.insert(items.end(), r->list->begin(), r->list->end());
        return Value::MakeList(std::move(items));
      }
    }
    if (!l->number() || !r->number()) {
      return Fail(e, absl::StrCat("'", op, "' of a ", KindName(l->kind), " and a ",
                                  KindName(r->kind)));
    }
    if (l->kind == Value::Kind::kInt && r->kind == Value::Kind::kInt) {
      return IntArithmetic(e, op, l->i, r->i);
    }
    if (op == "+") return Value::Float(l->AsDouble() + r->AsDouble());
    if (op == "-") return Value::Float(l->AsDouble() - r->AsDouble());
    if (op == "*") return Value::Float(l->AsDouble() * r->AsDouble());
    if (r->AsDouble() == 0) return Fail(e, "division by zero");
    if (op == "/") return Value::Float(l->AsDouble() / r->AsDouble());
    if (op == "//") return Value::Float(std::floor(l->AsDouble() / r->AsDouble()));
    if (op == "%") return Value::Float(std::fmod(l->AsDouble(), r->AsDouble()));
    return Fail(e, absl::StrCat("unknown operator '", op, "'"));
  }

  // Integer + - * / // % with Python's floor semantics. Python's integers are unbounded;
  // these are int64, so a result outside int64 is an error ("integer overflow") rather than a
  // wrapped value (or, for INT64_MIN // -1, the process's death by SIGFPE).
  absl::StatusOr<Value> IntArithmetic(const Expr& e, const std::string& op, int64_t a, int64_t b) {
    int64_t out = 0;
    bool overflow = false;
    if (op == "+") {
      overflow = __builtin_add_overflow(a, b, &out);
    } else if (op == "-") {
      overflow = __builtin_sub_overflow(a, b, &out);
    } else if (op == "*") {
      overflow = __builtin_mul_overflow(a, b, &out);
    } else if (op == "/" || op == "//" || op == "%") {
      if (b == 0) return Fail(e, "division by zero");
      if (op == "/") return Value::Float(static_cast<double>(a) / static_cast<double>(b));
      if (b == -1) {  // a / -1 traps for INT64_MIN; a % -1 is 0 for every a
        if (op == "%") return Value::Int(0);
        overflow = __builtin_sub_overflow(int64_t{0}, a, &out);
      } else if (op == "//") {
        out = a / b;
        if ((a % b != 0) && ((a < 0) != (b < 0))) --out;
      } else {
        out = a % b;
        if (out != 0 && ((out < 0) != (b < 0))) out += b;
      }
    } else {
      return Fail(e, absl::StrCat("unknown operator '", op, "'"));
    }
    if (overflow) return Fail(e, absl::StrCat("integer overflow in '", op, "'"));
    return Value::Int(out);
  }

  absl::StatusOr<Value> EvalTest(const Expr& e) {
    absl::StatusOr<Value> v = Eval(*e.args[0]);
    if (!v.ok()) return v;
    absl::StatusOr<TestFn> test = FindTest(SiteOf(e), e.name);
    if (!test.ok()) return test.status();
    absl::StatusOr<bool> r = (*test)(SiteOf(e), *v);
    if (!r.ok()) return r.status();
    return Value::Bool(e.negate ? !*r : *r);
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
    absl::StatusOr<FilterFn> filter = FindFilter(SiteOf(e), e.name);
    if (!filter.ok()) return filter.status();
    return (*filter)(SiteOf(e), *v, *args);
  }

  absl::StatusOr<Value> EvalCall(const Expr& e) {
    const Expr& callee = *e.args[0];
    absl::StatusOr<std::vector<Value>> args = EvalArgs(e, 1);
    if (!args.ok()) return args.status();
    if (callee.kind == Expr::Kind::kAttr) {
      absl::StatusOr<Value> self = Eval(*callee.args[0]);
      if (!self.ok()) return self;
      if (self->kind == Value::Kind::kString) {
        return StringMethod(SiteOf(e), self->s, callee.name, *args);
      }
      if (self->kind == Value::Kind::kDict && !self->is_namespace) {
        return DictMethod(SiteOf(e), *self, callee.name, *args);
      }
      return Fail(e, absl::StrCat("a ", KindName(self->kind), " has no method '", callee.name, "'"));
    }
    if (callee.kind != Expr::Kind::kName) return Fail(e, "only named functions can be called");
    if (callee.name == "raise_exception") {
      return absl::InvalidArgumentError(absl::StrCat(
          "the chat template refused the messages: ",
          args->empty() ? "" : Short(ToText((*args)[0]))));
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
      for (int64_t i = b[0]; b[2] > 0 ? i < b[1] : i > b[1];) {
        if (items.size() >= kMaxIterations) return Fail(e, "range too long");
        items.push_back(Value::Int(i));
        // Past int64 is past the stop too: the range ends there.
        if (__builtin_add_overflow(i, b[2], &i)) break;
      }
      return Value::MakeList(std::move(items));
    }
    return Fail(e, absl::StrCat("the function '", callee.name, "' is not supported"));
  }

  std::vector<Dict> scopes_;
  int64_t iterations_ = 0;
  size_t made_ = 0;  // bytes made so far (Made)
};

}  // namespace

absl::Status RenderTemplate(const NodeList& body, Dict globals, std::string* out) {
  WalkAllowance walks(kMaxWalkSteps);
  Renderer renderer(std::move(globals));
  return renderer.Run(body, out);
}

}  // namespace dcf::server::jinja
