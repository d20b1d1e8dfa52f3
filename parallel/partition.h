// Splitting a model's blocks into K contiguous pipeline stages: balanced by a cost per block
// (parameter count by default, or measured time), or given explicitly ("3,3,2").
#ifndef TANDEM_PARALLEL_PARTITION_H_
#define TANDEM_PARALLEL_PARTITION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// Stage boundaries: stage s holds blocks [bounds[s], bounds[s + 1]); bounds has K + 1 entries.
using StageBounds = std::vector<int>;

// The contiguous split of blocks with costs `cost` into `stages` non-empty stages that
// minimizes the largest stage's cost (ties: the earliest such split). More stages than
// blocks is an error naming both numbers.
absl::StatusOr<StageBounds> BalancedPartition(const std::vector<double>& cost, int stages);

// "3,3,2": explicit stage sizes in blocks; they must be positive, number `stages`, and sum
// to `num_blocks`.
absl::StatusOr<StageBounds> ExplicitPartition(absl::string_view sizes, int num_blocks,
                                              int stages);
// The sizes "3,3,2" of `bounds`: what ExplicitPartition turns back into them.
std::string PartitionSizes(const StageBounds& bounds);

}  // namespace tandem

#endif  // TANDEM_PARALLEL_PARTITION_H_
