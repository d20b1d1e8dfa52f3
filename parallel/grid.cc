#include "parallel/grid.h"

#include "absl/strings/str_format.h"

namespace tandem {

absl::StatusOr<ProcessGrid> ProcessGrid::Make(int world, int data_parallel,
                                             int tensor_parallel) {
  if (tensor_parallel < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--tensor-parallel=%d: must be at least 1 (1: no tensor parallelism)", tensor_parallel));
  }
  if (world % tensor_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--tensor-parallel=%d does not divide --gpus=%d: T tensor-parallel ranks per stage of "
        "D replicas take T x D x K workers; use a T that divides %d",
        tensor_parallel, world, world));
  }
  if (tensor_parallel > 1) {
    absl::StatusOr<ProcessGrid> g = Make(world / tensor_parallel, data_parallel);
    if (g.ok()) g->tensors = tensor_parallel;
    return g;
  }
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
  if (tensors > 1) {
    return absl::StrFormat("(replica %d, tensor %d, stage %d)", ReplicaOf(rank), TensorOf(rank),
                           StageOf(rank));
  }
  return absl::StrFormat("(replica %d, stage %d)", ReplicaOf(rank), StageOf(rank));
}

std::string ProcessGrid::Places() const {
  std::string out = tensors > 1 ? "rank (replica, tensor, stage):" : "rank (replica, stage):";
  for (int r = 0; r < ranks(); ++r) {
    if (tensors > 1) {
      absl::StrAppendFormat(&out, "%s %d (%d, %d, %d)", r ? "," : "", r, ReplicaOf(r),
                            TensorOf(r), StageOf(r));
    } else {
      absl::StrAppendFormat(&out, "%s %d (%d, %d)", r ? "," : "", r, ReplicaOf(r), StageOf(r));
    }
  }
  return out;
}

}  // namespace tandem
