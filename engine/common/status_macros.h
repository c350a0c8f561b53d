// Status propagation helpers. Debian's Abseil (20220623) ships no status_macros.h, so the
// project keeps this one small header. Use at every module boundary; no exceptions cross them.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DCF_CONCAT_INNER_(a, b) a##b
#define DCF_CONCAT_(a, b) DCF_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                                \
  do {                                                       \
    const ::absl::Status dcf_status_ = (expr);               \
    if (!dcf_status_.ok()) return dcf_status_;               \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates the absl::StatusOr `expr`; on error returns its
// status, otherwise moves the value into `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, expr) \
  DCF_ASSIGN_OR_RETURN_IMPL_(DCF_CONCAT_(dcf_statusor_, __LINE__), lhs, expr)
#define DCF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
