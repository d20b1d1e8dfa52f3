// The process grid of a job: D replicas of a K-stage pipeline over D x K ranks. Ranks follow
// Megatron-LM's order: the D data-parallel peers of one stage are neighbouring ranks (rank =
// stage x D + replica), so that they share a host, or an NVLink island, and the gradient
// reductions among them, the heaviest traffic, stay there; the K stages of one replica are D
// ranks apart. Data parallelism is the grid with one stage; a pipeline (or model
// parallelism) without replicas is the grid with D = 1.
#ifndef TANDEM_PARALLEL_GRID_H_
#define TANDEM_PARALLEL_GRID_H_

#include <string>

#include "absl/status/statusor.h"

namespace tandem {

struct ProcessGrid {
  int replicas = 1;  // D
  int stages = 1;    // K

  // D x K ranks: D = `data_parallel` replicas of world / D stages; an error, saying what
  // would, unless D divides the world size.
  static absl::StatusOr<ProcessGrid> Make(int world, int data_parallel);

  int ranks() const { return replicas * stages; }
  int RankOf(int replica, int stage) const { return stage * replicas + replica; }
  int ReplicaOf(int rank) const { return rank % replicas; }
  int StageOf(int rank) const { return rank / replicas; }
  // Replicas of a pipeline: the layout where a rank's number alone does not say its place.
  bool hybrid() const { return replicas > 1 && stages > 1; }
  // "(replica 1, stage 0)".
  std::string Place(int rank) const;
  // Every rank's place: "rank (replica, stage): 0 (0, 0), 1 (1, 0), 2 (0, 1), 3 (1, 1)".
  std::string Places() const;
};

}  // namespace tandem

#endif  // TANDEM_PARALLEL_GRID_H_
