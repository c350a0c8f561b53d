// The renderer of the chat-template interpreter (chat_template.h): runs a parsed template
// (jinja_parser.h) over its global variables, with Jinja's scoping (a `set` inside a loop
// does not leak out of it; a namespace() does), loop variables, undefined values (printing
// one prints nothing, testing it is false, its attributes or items are an error), the
// functions raise_exception, namespace and range, and the filters, tests and string and dict
// methods of jinja_builtins.h.
//
// Errors are InvalidArgument: "chat template line L, column C: ..." for a type error, an
// attribute or item of an undefined value, an unsupported method or function, integer
// overflow, or a bound passed: more than 2^20 loop iterations in one render (or a range(),
// split or list of more items), a string over kMaxStringBytes (16 MiB), more than 256 MiB of
// strings and lists made in one render (each copy counted), more than kMaxWalkSteps steps of
// the walks over values and the substring searches (printing, ==, `in`, tojson, the namespace
// check, split, replace, strip: shared lists make a value far bigger than what was made;
// jinja_value.h WalkAllowance), a list or dict as a dict key; "chat
// template: the rendered prompt would be longer than 16 MiB"; "the chat template refused the
// messages: <message>" for the template's own raise_exception(message). A bound is checked
// before the allocation it guards wherever that could be far larger than its inputs
// (printing stops at the string bound), and the iterations, the bytes made and the walks
// together bound a render's time.
//
// Thread-safety: a render only reads the tree, so many renders may share one; each render
// owns its variables.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "server/jinja_parser.h"
#include "server/jinja_value.h"

namespace dcf::server::jinja {

// Appends the output of `body` run with the variables `globals` to *out; on an error *out
// holds what was rendered before it.
absl::Status RenderTemplate(const NodeList& body, Dict globals, std::string* out);

}  // namespace dcf::server::jinja
