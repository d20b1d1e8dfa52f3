// The process grid of a job: D replicas of a K-stage pipeline, each stage's blocks split over
// T tensor-parallel ranks, over T x D x K ranks. Ranks follow Megatron-LM's order: the T
// tensor-parallel ranks of one stage of one replica are neighbouring ranks (rank = (stage x D +
// replica) x T + tensor), so that a node's GPUs form a tensor-parallel group and its
// collectives, on every block's critical path, stay on the node's links; then the D
// data-parallel peers of a stage, whose gradient reductions are the next heaviest traffic;
// the K stages of one replica are T x D ranks apart. Data parallelism is the grid with one
// stage; a pipeline (or model parallelism) without replicas is the grid with D = 1.
#ifndef TANDEM_PARALLEL_GRID_H_
#define TANDEM_PARALLEL_GRID_H_

#include <string>

#include "absl/status/statusor.h"

namespace tandem {

struct ProcessGrid {
  int replicas = 1;  // D
  int stages = 1;    // K
  int tensors = 1;   // T

  // T x D x K ranks: T = `tensor_parallel` ranks per stage, D = `data_parallel` replicas of
  // world / (T x D) stages; an error, saying what would, unless T x D divides the world size.
  static absl::StatusOr<ProcessGrid> Make(int world, int data_parallel, int tensor_parallel = 1);

  int ranks() const { return tensors * replicas * stages; }
  int RankOf(int replica, int stage, int tensor = 0) const {
    return (stage * replicas + replica) * tensors + tensor;
  }
  int TensorOf(int rank) const { return rank % tensors; }
  int ReplicaOf(int rank) const { return rank / tensors % replicas; }
  int StageOf(int rank) const { return rank / tensors / replicas; }
  // Where a rank's number alone does not say its place: replicas of a pipeline, or tensor
  // parallelism beside either.
  bool hybrid() const { return (replicas > 1) + (stages > 1) + (tensors > 1) >= 2; }
  // "(replica 1, stage 0)", and with tensor parallelism "(replica 1, tensor 0, stage 0)".
  std::string Place(int rank) const;
  // Every rank's place: "rank (replica, stage): 0 (0, 0), 1 (1, 0), 2 (0, 1), 3 (1, 1)", with
  // tensor parallelism "rank (replica, tensor, stage): 0 (0, 0, 0), ...".
  std::string Places() const;
};

}  // namespace tandem

#endif  // TANDEM_PARALLEL_GRID_H_
