#include "server/jinja_value.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace dcf::server::jinja {

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

namespace {

// The allowance of the walks on this thread (innermost), or null.
thread_local WalkAllowance* g_allowance = nullptr;

// Appends at most up to kMaxStringBytes + 1 bytes in all (ToText's cut), spending a walk step
// per 64 bytes.
void Put(absl::string_view text, std::string* out) {
  const size_t room = kMaxStringBytes + 1 - std::min(out->size(), kMaxStringBytes + 1);
  const size_t n = std::min(room, text.size());
  if (!WalkAllowance::Spend(static_cast<int64_t>(n >> 6))) return;
  out->append(text.data(), n);
}

// What one JSON value costs ToJson's bound besides its strings (a node of nlohmann's tree).
constexpr size_t kJsonNodeBytes = 48;

// ToText (repr false) or Repr (true) of v appended to out; stops once out is cut.
void Print(const Value& v, bool repr, std::string* out) {
  if (out->size() > kMaxStringBytes || !WalkAllowance::Spend(1)) return;
  switch (v.kind) {
    case Value::Kind::kUndefined: return;
    case Value::Kind::kNone: return Put("None", out);
    case Value::Kind::kBool: return Put(v.b ? "True" : "False", out);
    case Value::Kind::kInt: return Put(absl::StrCat(v.i), out);
    case Value::Kind::kFloat: {
      std::string s = absl::StrCat(v.f);
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
      return Put(s, out);
    }
    case Value::Kind::kString:
      if (repr) Put("'", out);
      Put(v.s, out);
      if (repr) Put("'", out);
      return;
    case Value::Kind::kList: {
      Put("[", out);
      for (size_t i = 0; i < v.list->size() && out->size() <= kMaxStringBytes; ++i) {
        if (i > 0) Put(", ", out);
        Print((*v.list)[i], true, out);
      }
      return Put("]", out);
    }
    case Value::Kind::kDict: {
      Put("{", out);
      bool first = true;
      for (const auto& [k, e] : *v.dict) {
        if (out->size() > kMaxStringBytes) break;
        if (!first) Put(", ", out);
        first = false;
        Put("'", out);
        Put(k, out);
        Put("': ", out);
        Print(e, true, out);
      }
      return Put("}", out);
    }
  }
}

// ToJson's walk: `bytes` counts the strings and values made so far.
nlohmann::ordered_json Json(const Value& v, size_t* bytes) {
  const size_t text = v.kind == Value::Kind::kString ? v.s.size() : 0;
  if (*bytes > kMaxStringBytes || !WalkAllowance::SpendCopy(text)) {
    return nullptr;
  }
  *bytes += kJsonNodeBytes + text;
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return nullptr;
    case Value::Kind::kBool: return v.b;
    case Value::Kind::kInt: return v.i;
    case Value::Kind::kFloat: return v.f;
    case Value::Kind::kString: return v.s;
    case Value::Kind::kList: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const Value& e : *v.list) {
        if (*bytes > kMaxStringBytes) break;
        a.push_back(Json(e, bytes));
      }
      return a;
    }
    case Value::Kind::kDict: {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& [k, e] : *v.dict) {
        if (*bytes > kMaxStringBytes) break;
        *bytes += k.size();
        o[k] = Json(e, bytes);
      }
      return o;
    }
  }
  return nullptr;
}

}  // namespace

WalkAllowance::WalkAllowance(int64_t steps) : left_(steps), outer_(g_allowance) {
  g_allowance = this;
}

WalkAllowance::~WalkAllowance() { g_allowance = outer_; }

bool WalkAllowance::Spend(int64_t steps) {
  WalkAllowance* a = g_allowance;
  if (a == nullptr) return true;
  if (a->left_ < steps) {
    a->left_ = -1;  // Exhausted from now on, even for a smaller request
    return false;
  }
  a->left_ -= steps;
  return true;
}

bool WalkAllowance::SpendCopy(size_t bytes) {
  return Spend(1 + static_cast<int64_t>(bytes >> 6));
}

bool WalkAllowance::SpendSearch(size_t haystack, size_t needle) {
  // Both factors are at most 2^58 (string sizes): saturate instead of overflowing.
  const uint64_t positions = (haystack >> 6) + 1, per = (needle >> 3) + 1;
  const uint64_t steps = per > uint64_t{INT64_MAX} / positions ? uint64_t{INT64_MAX}
                                                                : positions * per;
  return Spend(static_cast<int64_t>(steps));
}

bool WalkAllowance::Exhausted() { return g_allowance != nullptr && g_allowance->left_ < 0; }

std::string ToText(const Value& v) {
  if (v.kind == Value::Kind::kString) {  // the common case, one copy
    if (!WalkAllowance::SpendCopy(v.s.size())) return std::string();
    return v.s.size() <= kMaxStringBytes ? v.s : v.s.substr(0, kMaxStringBytes + 1);
  }
  std::string out;
  Print(v, false, &out);
  return out;
}

std::string Repr(const Value& v) {
  std::string out;
  Print(v, true, &out);
  return out;
}

nlohmann::ordered_json ToJson(const Value& v, bool* cut) {
  size_t bytes = 0;
  nlohmann::ordered_json j = Json(v, &bytes);
  if (cut != nullptr) *cut = bytes > kMaxStringBytes;
  return j;
}

bool Equal(const Value& a, const Value& b) {
  if (!WalkAllowance::Spend(1)) return false;
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
    case Value::Kind::kString:
      return WalkAllowance::Spend(static_cast<int64_t>(std::min(a.s.size(), b.s.size()) >> 6)) &&
             a.s == b.s;
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

}  // namespace dcf::server::jinja
