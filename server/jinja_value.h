// The values a chat template computes with (part of the interpreter behind chat_template.h):
// Jinja's undefined, none, booleans, integers, floats, strings, lists and dicts, and the
// conversions every stage of the interpreter shares: truth, printing, JSON, equality.
//
// Lists and dicts are reference types, as in Python: copying a Value shares its list or dict
// (a namespace() set inside a loop is seen after it). A Value is not synchronised: one render
// owns the values it makes; the literals of a parsed template are only read.
// None of these functions fails: every kind has a truth value, a text and a JSON form; the
// walks among them are bounded by the render's WalkAllowance instead (a partial result).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json_fwd.hpp"

namespace dcf::server::jinja {

// The bounds of one render (docs/OPENAI_API.md, "Chat templates"), so that a template cannot
// make a request take the server's memory or minutes: every string value, and the rendered
// prompt, at most kMaxStringBytes; every list at most kMaxListItems items (range(), split,
// list concatenation; a loop at most that many iterations in all).
inline constexpr size_t kMaxStringBytes = size_t{16} << 20;
inline constexpr size_t kMaxListItems = size_t{1} << 20;
// The values one render may visit in walks over the values it computes (printing, tojson,
// ==, `in`, the namespace check). Lists are shared, not copied, so a template of a few lines
// can name a value of 8^10 items (each level a list of eight names of the level below):
// bounding the values a render makes does not bound the walks over them.
inline constexpr int64_t kMaxWalkSteps = int64_t{1} << 26;

// This thread's allowance of walk steps while it lives (RenderTemplate holds one per
// render); the walks below spend it, one step per value visited and one per 64 bytes they
// copy or compare (SpendSearch: a substring search). Once spent, every walk
// stops early with a partial result (printing cut short, == false, JSON null), so a render
// must check Exhausted() after any walk and refuse itself. With no allowance on the thread
// (outside a render) walks are unbounded. Not copyable; nests (the outer one comes back).
class WalkAllowance {
 public:
  explicit WalkAllowance(int64_t steps);
  ~WalkAllowance();
  WalkAllowance(const WalkAllowance&) = delete;
  WalkAllowance& operator=(const WalkAllowance&) = delete;

  // Takes `steps` from this thread's allowance: false (and from then on Exhausted()) when it
  // does not hold them; always true with no allowance.
  static bool Spend(int64_t steps);
  // A value of `bytes` bytes visited and copied (a string printed or made JSON, a dict key
  // copied): one step, and one per 64 bytes.
  static bool SpendCopy(size_t bytes);
  // A search for a `needle`-byte string in a `haystack`-byte one (find, in, split, replace,
  // strip's characters): one step per 64 positions times one per 8 bytes of the needle, a
  // bound on a plain search's comparisons (a needle of 2^17 bytes in 2^18 could take seconds).
  static bool SpendSearch(size_t haystack, size_t needle);
  static bool Exhausted();

 private:
  int64_t left_;
  WalkAllowance* outer_;
};

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
  // How deep lists and dicts nest in this value: 0 for a scalar, 1 + its deepest item's for a
  // list or dict, as made (a namespace's attributes may be set later, but never to a value
  // holding a namespace, so values stay acyclic and at most one namespace's depth deeper).
  // The renderer refuses values deeper than kMaxNesting: printing, comparing and freeing one
  // recurses by its depth.
  int depth = 0;

  static Value None() { return Of(Kind::kNone); }
  static Value Bool(bool v) { Value x = Of(Kind::kBool); x.b = v; return x; }
  static Value Int(int64_t v) { Value x = Of(Kind::kInt); x.i = v; return x; }
  static Value Float(double v) { Value x = Of(Kind::kFloat); x.f = v; return x; }
  static Value Str(std::string v) { Value x = Of(Kind::kString); x.s = std::move(v); return x; }
  static Value MakeList(List v) {
    Value x = Of(Kind::kList);
    for (const Value& item : v) x.depth = std::max(x.depth, item.depth);
    ++x.depth;
    x.list = std::make_shared<List>(std::move(v));
    return x;
  }
  static Value MakeDict(Dict v) {
    Value x = Of(Kind::kDict);
    for (const auto& [key, item] : v) x.depth = std::max(x.depth, item.depth);
    ++x.depth;
    x.dict = std::make_shared<Dict>(std::move(v));
    return x;
  }
  bool defined() const { return kind != Kind::kUndefined; }
  bool number() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  double AsDouble() const { return kind == Kind::kInt ? static_cast<double>(i) : f; }

 private:
  // Not Value{kind}: that aggregate initialisation warns (-Wmissing-field-initializers) in
  // every file that includes this header.
  static Value Of(Kind kind) {
    Value x;
    x.kind = kind;
    return x;
  }
};

// "undefined", "none", "boolean", "integer", "float", "string", "list", "dict": the names
// error messages give a kind.
const char* KindName(Value::Kind k);

// Jinja's truth: undefined, none, false, 0, 0.0 and empty strings, lists and dicts are false.
bool Truthy(const Value& v);

// What {{ v }} prints, as Python's str(): undefined prints nothing, none "None", booleans
// "True"/"False", a float ".0" more when it has no '.' or exponent, lists and dicts their
// items in Repr ("['a', 1]", "{'k': 'v'}"). Never more than kMaxStringBytes + 1 bytes: a
// longer text is cut there (as soon as it gets there, not after it is built), so the caller's
// bound on strings refuses it. Spends a walk step per value (WalkAllowance).
std::string ToText(const Value& v);

// Python's repr(): a string in single quotes, anything else as ToText (and bounded as it is).
std::string Repr(const Value& v);

// The tojson filter's JSON (undefined becomes null; dict keys in their sorted order). Spends
// a walk step per value; stops (the rest null) once what it built passes kMaxStringBytes
// (its strings and keys, and 48 bytes a value: a JSON node's size), and then sets *cut.
nlohmann::ordered_json ToJson(const Value& v, bool* cut = nullptr);

// Jinja's ==: numbers by value (1 == 1.0; true == 1), lists and dicts item by item, values of
// other different kinds never equal; undefined equals undefined and none equals none. Spends
// a walk step per pair of values compared (false once the allowance is spent).
bool Equal(const Value& a, const Value& b);

}  // namespace dcf::server::jinja
