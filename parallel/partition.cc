#include "parallel/partition.h"

#include <algorithm>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace tandem {

absl::StatusOr<StageBounds> BalancedPartition(const std::vector<double>& cost, int stages) {
  const int n = static_cast<int>(cost.size());
  if (stages < 1) return absl::InvalidArgumentError("a pipeline needs at least one stage");
  if (stages > n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d stages but the model has only %d blocks (embedding, layers, head); use at most "
        "%d GPUs for this model or more layers",
        stages, n, n));
  }
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost[i];
  // best[k][i]: the smallest possible largest-stage cost splitting blocks [0, i) in k stages.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {
        const double c = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (c < best[k][i]) {
          best[k][i] = c;
          cut[k][i] = j;
        }
      }
    }
  }
  StageBounds b(stages + 1);
  b[stages] = n;
  for (int k = stages, i = n; k > 0; --k) {
    i = cut[k][i];
    b[k - 1] = i;
  }
  return b;
}

absl::StatusOr<StageBounds> ExplicitPartition(absl::string_view sizes, int num_blocks,
                                              int stages) {
  StageBounds b = {0};
  for (absl::string_view part : absl::StrSplit(sizes, ',')) {
    int v;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--balance=%s: '%s' is not a positive number of blocks", sizes, part));
    }
    b.push_back(b.back() + v);
  }
  if (static_cast<int>(b.size()) - 1 != stages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--balance=%s gives %d stages but the job has %d; give one size per stage", sizes,
        b.size() - 1, stages));
  }
  if (b.back() != num_blocks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--balance=%s sums to %d blocks but the model has %d (embedding + layers + head)",
        sizes, b.back(), num_blocks));
  }
  return b;
}

std::string PartitionSizes(const StageBounds& bounds) {
  std::string sizes;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    absl::StrAppend(&sizes, s ? "," : "", bounds[s + 1] - bounds[s]);
  }
  return sizes;
}

}  // namespace tandem
