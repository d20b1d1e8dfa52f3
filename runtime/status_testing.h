// GoogleTest helpers for absl::Status results.
#ifndef TANDEM_RUNTIME_STATUS_TESTING_H_
#define TANDEM_RUNTIME_STATUS_TESTING_H_

#include "absl/status/status.h"
#include "gtest/gtest.h"

// Fails the test, printing the expression and the status, unless `expr` is OK.
#define ASSERT_OK(expr)                            \
  do {                                             \
    const absl::Status st_ = (expr);               \
    ASSERT_TRUE(st_.ok()) << #expr << ": " << st_; \
  } while (0)

#endif  // TANDEM_RUNTIME_STATUS_TESTING_H_
