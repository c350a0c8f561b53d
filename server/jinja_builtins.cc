#include "server/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "server/jinja_lexer.h"

namespace dcf::server::jinja {
namespace {

absl::Status Fail(const Site& at, absl::string_view what) { return At(at.line, at.column, what); }

// ToText of x, refused when it is past kMaxStringBytes (ToText cuts it there: a cut text must
// not reach a filter that could shrink it back under the bound, e.g. trim or replace).
absl::StatusOr<std::string> Text(const Site& at, const Value& x) {
  std::string text = ToText(x);
  if (absl::Status s = CheckStringBytes(at, text.size()); !s.ok()) return s;
  return text;
}

// ---------------------------------------------------------------------------------------
// Filters

absl::StatusOr<Value> Default(const Site&, const Value& x, const std::vector<Value>& args) {
  const bool falsy = args.size() > 1 && Truthy(args[1]);
  if (!x.defined() || (falsy && !Truthy(x))) return args.empty() ? Value::Str("") : args[0];
  return x;
}

// Jinja's `int(default=0)`: Python's int(x), else int(float(x)) ("42.9" gives 42), else the
// default; a NaN gives the default too. Python's integers are unbounded and these are int64:
// a number that parses but lies outside int64 ('99999999999999999999', 1e300, inf) is an
// error, not the default (Jinja gives the big number, or an OverflowError for inf).
absl::StatusOr<Value> Int(const Site& at, const Value& x, const std::vector<Value>& args) {
  const Value fallback = args.empty() ? Value::Int(0) : args[0];
  if (x.kind == Value::Kind::kInt) return x;
  if (x.kind == Value::Kind::kBool) return Value::Int(x.b ? 1 : 0);
  double f = 0;
  if (x.kind == Value::Kind::kFloat) {
    f = x.f;
  } else if (x.kind == Value::Kind::kString) {
    int64_t i = 0;
    if (absl::SimpleAtoi(x.s, &i)) return Value::Int(i);
    if (!absl::SimpleAtod(x.s, &f)) return fallback;
  } else {
    return fallback;
  }
  if (std::isnan(f)) return fallback;
  // [-2^63, 2^63): both bounds are exact doubles; truncation toward zero, as Python's int().
  if (!(f >= -9223372036854775808.0 && f < 9223372036854775808.0)) {
    return Fail(at, "int of a number outside the 64-bit integers");
  }
  return Value::Int(static_cast<int64_t>(f));
}

absl::StatusOr<Value> Length(const Site& at, const Value& x, const std::vector<Value>&) {
  if (x.kind == Value::Kind::kString) return Value::Int(static_cast<int64_t>(x.s.size()));
  if (x.kind == Value::Kind::kList) return Value::Int(static_cast<int64_t>(x.list->size()));
  if (x.kind == Value::Kind::kDict) return Value::Int(static_cast<int64_t>(x.dict->size()));
  if (!x.defined()) return Value::Int(0);
  return Fail(at, absl::StrCat("length of a ", KindName(x.kind)));
}

absl::StatusOr<Value> Join(const Site& at, const Value& x, const std::vector<Value>& args) {
  if (x.kind != Value::Kind::kList) return Fail(at, "join of a non-list");
  std::vector<std::string> parts;
  std::string separator;
  if (!args.empty()) {
    absl::StatusOr<std::string> t = Text(at, args[0]);
    if (!t.ok()) return t.status();
    separator = *std::move(t);
  }
  size_t bytes = 0;
  for (const Value& item : *x.list) {
    parts.push_back(ToText(item));
    bytes += parts.back().size() + (parts.size() > 1 ? separator.size() : 0);
    if (absl::Status s = CheckStringBytes(at, bytes); !s.ok()) return s;
  }
  return Value::Str(absl::StrJoin(parts, separator));
}

// The filter that is the string method `name` of x's text (Text), e.g. `x | upper`.
absl::StatusOr<Value> MethodOfText(const Site& at, const Value& x, absl::string_view name,
                                   const std::vector<Value>& args) {
  absl::StatusOr<std::string> t = Text(at, x);
  if (!t.ok()) return t.status();
  return StringMethod(at, *t, name, args);
}

// The `first` (first is true) or `last` filter.
Value FirstOrLast(bool first, const Value& x) {
  if (x.kind == Value::Kind::kList) {
    if (x.list->empty()) return Value();
    return first ? x.list->front() : x.list->back();
  }
  if (x.kind == Value::Kind::kString && !x.s.empty()) {
    return Value::Str(std::string(1, first ? x.s.front() : x.s.back()));
  }
  return Value();
}

absl::StatusOr<Value> ToList(const Site& at, const Value& x, const std::vector<Value>&) {
  if (x.kind == Value::Kind::kList) return x;
  List items;
  if (x.kind == Value::Kind::kString) {
    if (absl::Status s = CheckListItems(at, x.s.size()); !s.ok()) return s;
    for (char c : x.s) items.push_back(Value::Str(std::string(1, c)));
  } else if (x.kind == Value::Kind::kDict) {
    for (const auto& [k, item] : *x.dict) items.push_back(Value::Str(k));
  }
  return Value::MakeList(std::move(items));
}

absl::StatusOr<Value> Reverse(const Site&, const Value& x, const std::vector<Value>&) {
  if (x.kind == Value::Kind::kList) return Value::MakeList(List(x.list->rbegin(), x.list->rend()));
  return Value::Str(std::string(x.s.rbegin(), x.s.rend()));
}

// ---------------------------------------------------------------------------------------
// Tests

absl::StatusOr<bool> OddOrEven(const Site& at, const Value& v, bool odd) {
  if (v.kind != Value::Kind::kInt) return Fail(at, "odd/even of a non-integer");
  return (v.i % 2 != 0) == odd;
}

template <Value::Kind kKind>
absl::StatusOr<bool> IsKind(const Site&, const Value& v) {
  return v.kind == kKind;
}

absl::StatusOr<bool> IsSequence(const Site&, const Value& v) {
  return v.kind == Value::Kind::kList || v.kind == Value::Kind::kString ||
         v.kind == Value::Kind::kDict;
}

}  // namespace

const std::map<std::string, FilterFn, std::less<>>& Filters() {
  using Args = const std::vector<Value>&;
  static const auto* filters = new std::map<std::string, FilterFn, std::less<>>{
      {"trim", [](const Site& at, const Value& x, Args) -> absl::StatusOr<Value> {
         absl::StatusOr<std::string> t = Text(at, x);
         if (!t.ok()) return t.status();
         return Value::Str(std::string(absl::StripAsciiWhitespace(*t)));
       }},
      {"length", Length},
      {"count", Length},
      {"upper", [](const Site& at, const Value& x, Args) {
         return MethodOfText(at, x, "upper", {});
       }},
      {"lower", [](const Site& at, const Value& x, Args) {
         return MethodOfText(at, x, "lower", {});
       }},
      {"capitalize", [](const Site& at, const Value& x, Args) {
         return MethodOfText(at, x, "capitalize", {});
       }},
      {"title", [](const Site& at, const Value& x, Args) {
         return MethodOfText(at, x, "title", {});
       }},
      {"default", Default},
      {"d", Default},
      {"tojson", [](const Site& at, const Value& x, Args) -> absl::StatusOr<Value> {
         bool cut = false;
         nlohmann::ordered_json j = ToJson(x, &cut);
         if (cut) return CheckStringBytes(at, kMaxStringBytes + 1);
         // Invalid UTF-8 (a byte slice of a character, a reversed string) is replaced by
         // U+FFFD: dump() threw on it, and nothing caught it (the server aborted).
         return Value::Str(
             j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
       }},
      {"string", [](const Site&, const Value& x, Args) -> absl::StatusOr<Value> {
         return Value::Str(ToText(x));
       }},
      {"int", Int},
      {"join", Join},
      {"first", [](const Site&, const Value& x, Args) -> absl::StatusOr<Value> {
         return FirstOrLast(true, x);
       }},
      {"last", [](const Site&, const Value& x, Args) -> absl::StatusOr<Value> {
         return FirstOrLast(false, x);
       }},
      {"list", ToList},
      {"reverse", Reverse},
      {"replace", [](const Site& at, const Value& x, Args args) {
         return MethodOfText(at, x, "replace", args);
       }},
      {"items", [](const Site& at, const Value& x, Args) {
         return DictMethod(at, x, "items", {});
       }},
  };
  return *filters;
}

const std::map<std::string, TestFn, std::less<>>& Tests() {
  using Result = absl::StatusOr<bool>;
  static const auto* tests = new std::map<std::string, TestFn, std::less<>>{
      {"defined", [](const Site&, const Value& v) -> Result { return v.defined(); }},
      {"undefined", [](const Site&, const Value& v) -> Result { return !v.defined(); }},
      {"none", IsKind<Value::Kind::kNone>},
      {"string", IsKind<Value::Kind::kString>},
      {"number", [](const Site&, const Value& v) -> Result { return v.number(); }},
      {"integer", IsKind<Value::Kind::kInt>},
      {"float", IsKind<Value::Kind::kFloat>},
      {"boolean", IsKind<Value::Kind::kBool>},
      {"mapping", IsKind<Value::Kind::kDict>},
      {"sequence", IsSequence},
      {"iterable", IsSequence},
      {"true",
       [](const Site&, const Value& v) -> Result { return v.kind == Value::Kind::kBool && v.b; }},
      {"false",
       [](const Site&, const Value& v) -> Result { return v.kind == Value::Kind::kBool && !v.b; }},
      {"odd", [](const Site& at, const Value& v) { return OddOrEven(at, v, true); }},
      {"even", [](const Site& at, const Value& v) { return OddOrEven(at, v, false); }},
  };
  return *tests;
}

namespace {

// The one lookup of both tables: `kind` names the table in the error ("filter", "test").
template <typename Table>
absl::StatusOr<typename Table::mapped_type> Find(const Table& table, const Site& at,
                                                 absl::string_view kind, absl::string_view name) {
  auto it = table.find(name);
  if (it == table.end()) {
    return Fail(at, absl::StrCat("the ", kind, " '", name, "' is not supported"));
  }
  return it->second;
}

}  // namespace

absl::Status CheckStringBytes(const Site& at, size_t bytes) {
  if (bytes <= kMaxStringBytes) return absl::OkStatus();
  return Fail(at, absl::StrCat("a string longer than ", kMaxStringBytes >> 20, " MiB"));
}

absl::Status CheckListItems(const Site& at, size_t items) {
  if (items <= kMaxListItems) return absl::OkStatus();
  return Fail(at, absl::StrCat("a list of more than ", kMaxListItems, " items"));
}

absl::StatusOr<FilterFn> FindFilter(const Site& at, absl::string_view name) {
  return Find(Filters(), at, "filter", name);
}

absl::StatusOr<TestFn> FindTest(const Site& at, absl::string_view name) {
  return Find(Tests(), at, "test", name);
}

absl::StatusOr<Value> StringMethod(const Site& at, const std::string& text,
                                   absl::string_view name, const std::vector<Value>& args) {
  std::vector<std::string> texts;
  for (const Value& a : args) {
    absl::StatusOr<std::string> t = Text(at, a);
    if (!t.ok()) return t.status();
    texts.push_back(*std::move(t));
  }
  auto arg = [&](size_t i) { return i < texts.size() ? texts[i] : std::string(); };
  // The searches below (strip's characters, replace, split) spend the render's walk allowance
  // by their worst case; Eval refuses the render once it is spent.
  if ((name == "strip" || name == "lstrip" || name == "rstrip" || name == "replace" ||
       name == "split") &&
      !WalkAllowance::SpendSearch(text.size(), args.empty() ? 1 : arg(0).size())) {
    return Value();  // not searched: the allowance is spent, and Eval refuses the render
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const std::string chars = args.empty() ? std::string(" \t\n\r\f\v") : arg(0);
    size_t b = 0, en = text.size();
    if (name != "rstrip") {
      b = text.find_first_not_of(chars) == std::string::npos ? text.size()
                                                             : text.find_first_not_of(chars);
    }
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
  if (name == "replace") {
    const std::string from = arg(0), to = arg(1);
    if (!from.empty() && to.size() > from.size()) {  // the result grows: its size first
      size_t count = 0;
      for (size_t p = text.find(from); p != std::string::npos;
           p = text.find(from, p + from.size())) {
        ++count;
      }
      // count <= text.size() and to.size() <= kMaxStringBytes: no overflow in size_t.
      if (absl::Status s = CheckStringBytes(at, text.size() + count * (to.size() - from.size()));
          !s.ok()) {
        return s;
      }
    }
    return Value::Str(absl::StrReplaceAll(text, {{from, to}}));
  }
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
      for (absl::string_view p :
           absl::StrSplit(text, absl::ByAnyChar(" \t\n\r"), absl::SkipEmpty())) {
        parts.push_back(Value::Str(std::string(p)));
        if (absl::Status s = CheckListItems(at, parts.size()); !s.ok()) return s;
      }
    } else {
      for (absl::string_view p : absl::StrSplit(text, arg(0))) {
        parts.push_back(Value::Str(std::string(p)));
        if (absl::Status s = CheckListItems(at, parts.size()); !s.ok()) return s;
      }
    }
    return Value::MakeList(std::move(parts));
  }
  return Fail(at, absl::StrCat("strings have no method '", name, "' here"));
}

absl::StatusOr<std::string> KeyOf(const Site& at, const Value& key) {
  if (key.kind == Value::Kind::kList || key.kind == Value::Kind::kDict) {
    return Fail(at, absl::StrCat("a ", KindName(key.kind), " cannot be a dict key"));
  }
  return Text(at, key);
}

absl::StatusOr<Value> DictMethod(const Site& at, const Value& d, absl::string_view name,
                                 const std::vector<Value>& args) {
  if (d.kind != Value::Kind::kDict) {
    return Fail(at, absl::StrCat("'", name, "' of a ", KindName(d.kind)));
  }
  if (name == "get") {
    std::string key;
    if (!args.empty()) {
      absl::StatusOr<std::string> k = KeyOf(at, args[0]);
      if (!k.ok()) return k.status();
      key = *std::move(k);
    }
    auto it = d.dict->find(key);
    if (it != d.dict->end()) return it->second;
    return args.size() > 1 ? args[1] : Value::None();
  }
  // Checked before the items, so that an empty dict refuses it too.
  if (name != "items" && name != "keys" && name != "values") {
    return Fail(at, absl::StrCat("dicts have no method '", name, "' here"));
  }
  List out;
  for (const auto& [k, v] : *d.dict) {
    // A copy of the key (of up to 16 MiB) for each: spent, as Eval counts only a list's own
    // strings, not those inside items()'s pairs.
    if (!WalkAllowance::SpendCopy(k.size())) return Value();
    if (name == "items") out.push_back(Value::MakeList({Value::Str(k), v}));
    else if (name == "keys") out.push_back(Value::Str(k));
    else out.push_back(v);
  }
  return Value::MakeList(std::move(out));
}

}  // namespace dcf::server::jinja
