#include "server/jinja_value.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

}  // namespace dcf::server::jinja
