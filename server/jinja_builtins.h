// The built-in filters, tests and string and dict methods of the chat-template interpreter
// (chat_template.h). Filters() and Tests() are the one list of what the subset supports: the
// parser refuses at load a filter or test they do not hold and the renderer runs the function
// they map the name to, both through FindFilter and FindTest, so what is accepted and what
// runs cannot drift apart.
//
// Errors are InvalidArgument "chat template line L, column C: ..." (At, jinja_lexer.h) at the
// Site given: an unsupported filter or test, a type error ("length of a bool", "join of a
// non-list", "odd/even of a non-integer", "'items' of a list") or an unsupported method
// ("strings have no method 'x' here", "dicts have no method 'x' here").
//
// Thread-safety: the tables are built once and never change; every function here is pure.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/jinja_value.h"

namespace dcf::server::jinja {

// Where a built-in is used: the line and column its errors name (the filter's or test's name,
// or the call's '(').
struct Site {
  int line = 1, column = 1;
};

// The bounds of jinja_value.h at `at`, checked before what they guard is built: a string of
// `bytes` past kMaxStringBytes ("a string longer than 16 MiB"), a list of `items` past
// kMaxListItems ("a list of more than 1048576 items"). The renderer's checks too.
absl::Status CheckStringBytes(const Site& at, size_t bytes);
absl::Status CheckListItems(const Site& at, size_t items);

// `value | name(args...)`: the value and the positional arguments, evaluated (keyword
// arguments are ignored).
using FilterFn = absl::StatusOr<Value> (*)(const Site& at, const Value& value,
                                           const std::vector<Value>& args);
// `value is name`: the value, evaluated; a test's own arguments are not evaluated. The result
// is before `is not` negates it.
using TestFn = absl::StatusOr<bool> (*)(const Site& at, const Value& value);

// Every supported filter and test, by name (aliases such as d for default and count for length
// map to the same function).
const std::map<std::string, FilterFn, std::less<>>& Filters();
const std::map<std::string, TestFn, std::less<>>& Tests();

// The function Filters() / Tests() map `name` to; InvalidArgument "chat template line L,
// column C: the filter 'name' is not supported" ("the test 'name' ...") at `at` when the
// table does not hold it. The parser refuses unknown names with this at load, so at render
// time it cannot fail.
absl::StatusOr<FilterFn> FindFilter(const Site& at, absl::string_view name);
absl::StatusOr<TestFn> FindTest(const Site& at, absl::string_view name);

// `text.name(args...)`: strip, lstrip, rstrip, startswith, endswith, upper, lower, replace,
// capitalize, title, split.
absl::StatusOr<Value> StringMethod(const Site& at, const std::string& text,
                                   absl::string_view name, const std::vector<Value>& args);
// The dict key `key` names: its text (ToText); an error for a list or a dict (Python's
// unhashable keys: their text could be 16 MiB for a value of a few names) and a text past
// kMaxStringBytes.
absl::StatusOr<std::string> KeyOf(const Site& at, const Value& key);
// `d.name(args...)` for a dict d: get, items, keys, values; an error when d is not a dict.
absl::StatusOr<Value> DictMethod(const Site& at, const Value& d, absl::string_view name,
                                 const std::vector<Value>& args);

}  // namespace dcf::server::jinja
