// The comparison the emulation tests (cuda_kernels_emulation_test.cc,
// flash_attention_emulation_test.cc) judge a kernel's results by.
#ifndef TANDEM_RUNTIME_CUDA_EMULATION_TESTING_H_
#define TANDEM_RUNTIME_CUDA_EMULATION_TESTING_H_

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace cuda_emulation {

// Every element within tol * (|want| + rms(want)) of want; nan only where want is nan.
template <typename W>
::testing::AssertionResult Close(const char* what, const std::vector<float>& got,
                                 const std::vector<W>& want, double tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " values, want " << want.size();
  }
  double sq = 0;
  for (W w : want) sq += std::isfinite(w) ? double{w} * w : 0.0;
  const double rms = want.empty() ? 0.0 : std::sqrt(sq / want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    const double err = std::fabs(double{got[i]} - want[i]);
    if (!(err <= tol * (std::fabs(want[i]) + rms))) {
      return ::testing::AssertionFailure() << what << " element " << i << ": got " << got[i]
                                           << ", want " << want[i] << " (rms " << rms << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace cuda_emulation
}  // namespace tandem

#endif  // TANDEM_RUNTIME_CUDA_EMULATION_TESTING_H_
