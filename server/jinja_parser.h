// The parser of the chat-template interpreter (chat_template.h): the syntax tree of a template
// (Node, holding expressions as Expr) and ParseTemplate, which builds it from the lexer's
// pieces (jinja_lexer.h) and refuses, at load, everything outside the supported subset:
// unknown tags, filters and tests (those jinja_builtins.h does not hold), set blocks, loop
// filters and recursive loops.
//
// Errors are InvalidArgument "chat template line L, column C: ..." naming the first problem
// ("chat template: the template ends before its 'endfor'" for an unclosed block). A tree is
// plain data that owns its children (unique_ptr); once built it is only read, so many
// renders may read one tree at once.
//
// Nesting is bounded at parse time ("nested too deeply"): statements ({% for %}, {% if %})
// at most kMaxNesting inside one another, and every expression at most kMaxNesting deep,
// counting both what the parser recurses into (parentheses, brackets, arguments, `not`,
// unary -) and the height of the tree it builds (`a ~ b ~ c` is 3 deep: operator chains
// nest to the left). The parser, the renderer and the tree's destructor all recurse by
// these depths, so a template that parses cannot exhaust any thread's stack.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "server/jinja_lexer.h"
#include "server/jinja_value.h"

namespace dcf::server::jinja {

// An expression; line and column are the token that makes it (its operator, 'if', 'is',
// 'not', '[', '(' or '{', its filter, test or attribute name, or the literal or name).
// args by kind: kAttr: {value}; kFilter, kTest: {value, arguments...}; kItem: {value, index};
// kSlice: {value, start, stop, step} (nullptr where has_slice is false); kCall: {callee,
// arguments...}; kCond: {condition, value, else value (optional)}; kDict: {key, value, key,
// value, ...}; kList: the elements; kNot, kNeg: {operand}; kBinary: {left, right}.
// How deep statements, and separately expressions, may nest (see above). Real chat
// templates nest statements under 10 deep and expressions under 20.
inline constexpr int kMaxNesting = 64;

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
  int height = 1;  // of the tree under this expression, itself included (<= kMaxNesting)
};
using ExprPtr = std::unique_ptr<Expr>;

// A run of text, an output tag or a statement; line and column are the tag's for kFor, kIf
// and kSet.
struct Node {
  enum class Kind { kText, kOutput, kFor, kIf, kSet };
  Kind kind;
  int line = 1, column = 1;
  std::string text;                  // kText
  ExprPtr expr;                      // kOutput, kFor (iterable), kSet (value)
  std::vector<std::string> targets;  // kFor loop variables; kSet: name [, attribute]
  std::vector<std::unique_ptr<Node>> body, else_body;
  std::vector<std::pair<ExprPtr, std::vector<std::unique_ptr<Node>>>> branches;  // kIf
};
using NodeList = std::vector<std::unique_ptr<Node>>;

// Appends the tree of `pieces` (Split's output) to *out.
absl::Status ParseTemplate(std::vector<Piece> pieces, NodeList* out);

}  // namespace dcf::server::jinja
