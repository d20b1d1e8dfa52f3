// The process groups a layout needs, split from the job's communicator in one place, in the
// same order on every rank (as Megatron-LM's initialize_model_parallel makes them all at
// once): a stage's data-parallel replicas ranked by replica, a replica's pipeline stages by
// stage, and with tied embeddings across stages each replica's first and last stage (the
// embedding group). Collective over the job's communicator.
#ifndef TANDEM_PARALLEL_PROCESS_GROUPS_H_
#define TANDEM_PARALLEL_PROCESS_GROUPS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "parallel/layout.h"

namespace tandem {

struct ProcessGroups {
  // This stage's data-parallel group: the job's communicator under data parallelism, null
  // without replicas.
  Communicator* dp = nullptr;
  // This replica's pipeline: the job's communicator without replicas, null without stages.
  Communicator* pp = nullptr;
  // Tied embeddings in a pipeline, on its first and last stage: those two of this replica;
  // null on every other rank and without tying.
  std::unique_ptr<Communicator> embed;
  // The groups split off (dp and pp point into them where they are not the job's).
  std::unique_ptr<Communicator> dp_owned, pp_owned;

  // The job's communicator `job` and every group split from it, for sequence numbers and
  // busy time.
  std::vector<Communicator*> All(Communicator* job) const;
};

// The groups rank `comm->rank()` belongs to under layout `l`; `tied_embeddings` as the model.
absl::StatusOr<ProcessGroups> MakeProcessGroups(const JobLayout& l, bool tied_embeddings,
                                                Communicator* comm);

}  // namespace tandem

#endif  // TANDEM_PARALLEL_PROCESS_GROUPS_H_
