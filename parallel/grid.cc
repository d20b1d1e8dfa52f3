#include "parallel/grid.h"

#include "absl/strings/str_format.h"

namespace tandem {

absl::StatusOr<ProcessGrid> ProcessGrid::Make(int world, int data_parallel) {
  if (data_parallel < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--data-parallel=%d: must be at least 1 (1: one pipeline, no replicas)", data_parallel));
  }
  if (world < 1 || world % data_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--data-parallel=%d does not divide --gpus=%d: D replicas of a pipeline of K stages "
        "take D x K workers; use a D that divides %d",
        data_parallel, world, world));
  }
  ProcessGrid g;
  g.replicas = data_parallel;
  g.stages = world / data_parallel;
  return g;
}

std::string ProcessGrid::Place(int rank) const {
  return absl::StrFormat("(replica %d, stage %d)", ReplicaOf(rank), StageOf(rank));
}

std::string ProcessGrid::Places() const {
  std::string out = "rank (replica, stage):";
  for (int r = 0; r < ranks(); ++r) {
    absl::StrAppendFormat(&out, "%s %d (%d, %d)", r ? "," : "", r, ReplicaOf(r), StageOf(r));
  }
  return out;
}

}  // namespace tandem
