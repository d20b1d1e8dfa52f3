// A small deterministic random generator (splitmix64 + Box-Muller) whose sequence is the same
// on every platform and compiler, unlike std::normal_distribution; used for initialization,
// data shuffling and synthetic data, so a seed names one run exactly.
#ifndef TANDEM_MODEL_RNG_H_
#define TANDEM_MODEL_RNG_H_

#include <cmath>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace tandem {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform integer in [0, n).
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }
  // Standard normal.
  float Normal() {
    const double u1 = (static_cast<double>(Next() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    const double u2 = static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t state_;
};

// 64-bit FNV-1a: a stable hash (of a parameter's name; of a checkpoint's contents).
inline uint64_t Fnv1a64(absl::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace tandem

#endif  // TANDEM_MODEL_RNG_H_
