// Status helpers used across Tandem: library code returns absl::Status / StatusOr and never
// throws; these macros keep the early-return pattern to one line.
#ifndef TANDEM_RUNTIME_STATUS_H_
#define TANDEM_RUNTIME_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TANDEM_CONCAT_INNER_(a, b) a##b
#define TANDEM_CONCAT_(a, b) TANDEM_CONCAT_INNER_(a, b)

// Returns from the calling function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status tandem_status_ = (expr);          \
    if (!tandem_status_.ok()) return tandem_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` unwraps a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(TANDEM_CONCAT_(tandem_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                           \
  if (!var.ok()) return var.status();          \
  lhs = std::move(var).value()

#endif  // TANDEM_RUNTIME_STATUS_H_
