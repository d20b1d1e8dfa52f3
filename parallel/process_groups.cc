#include "parallel/process_groups.h"

#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "runtime/status.h"

namespace tandem {

std::vector<Communicator*> ProcessGroups::All(Communicator* job) const {
  std::vector<Communicator*> comms = {job};
  for (Communicator* c : {dp_owned.get(), pp_owned.get(), embed.get()}) {
    if (c != nullptr) comms.push_back(c);
  }
  return comms;
}

absl::StatusOr<ProcessGroups> MakeProcessGroups(const JobLayout& l, bool tied_embeddings,
                                                Communicator* comm) {
  const ProcessGrid& grid = l.grid;
  const int rank = comm->rank();
  const int replica = grid.ReplicaOf(rank), stage = grid.StageOf(rank);
  ProcessGroups g;
  std::vector<int> peers, stages;
  for (int d = 0; d < grid.replicas; ++d) peers.push_back(grid.RankOf(d, stage));
  for (int k = 0; k < grid.stages; ++k) stages.push_back(grid.RankOf(replica, k));
  if (grid.stages == 1) {
    g.dp = comm;
  } else if (grid.replicas > 1) {
    ASSIGN_OR_RETURN(g.dp_owned,
                     comm->Split(stage, replica,
                                 absl::StrFormat("the data-parallel group of stage %d", stage),
                                 peers));
    g.dp = g.dp_owned.get();
  }
  if (grid.replicas == 1) {
    g.pp = comm;
  } else if (grid.stages > 1) {
    ASSIGN_OR_RETURN(g.pp_owned,
                     comm->Split(replica, stage,
                                 absl::StrFormat("the pipeline of replica %d", replica), stages));
    g.pp = g.pp_owned.get();
  }
  if (tied_embeddings && grid.stages > 1) {
    // The embedding group of each replica: its first and last stage, which hold the tied
    // table and its copy (Megatron's embedding group). Every rank takes part in the split;
    // a middle stage's group is itself alone, and unused.
    const bool end_stage = stage == 0 || stage == grid.stages - 1;
    std::vector<int> members = {grid.RankOf(replica, 0), grid.RankOf(replica, grid.stages - 1)};
    if (!end_stage) members = {rank};
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> group,
                     comm->Split(end_stage ? replica : grid.replicas + rank, stage,
                                 absl::StrFormat("the embedding group of replica %d", replica),
                                 members));
    if (end_stage) g.embed = std::move(group);
  }
  return g;
}

}  // namespace tandem
