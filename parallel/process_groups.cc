#include "parallel/process_groups.h"

#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "parallel/step_phases.h"
#include "runtime/status.h"

namespace tandem {

std::vector<Communicator*> ProcessGroups::All(Communicator* job) const {
  std::vector<Communicator*> comms = {job};
  for (Communicator* c : {tp.get(), dp_owned.get(), pp_owned.get(), embed.get()}) {
    if (c != nullptr) comms.push_back(c);
  }
  return comms;
}

absl::StatusOr<ProcessGroups> MakeProcessGroups(const JobLayout& l, bool tied_embeddings,
                                                Communicator* comm) {
  const ProcessGrid& grid = l.grid;
  const int rank = comm->rank();
  const int replica = grid.ReplicaOf(rank), stage = grid.StageOf(rank);
  const int tensor = grid.TensorOf(rank), T = grid.tensors;
  ProcessGroups g;
  std::vector<int> tensors, peers, stages;
  for (int t = 0; t < T; ++t) tensors.push_back(grid.RankOf(replica, stage, t));
  for (int d = 0; d < grid.replicas; ++d) peers.push_back(grid.RankOf(d, stage, tensor));
  for (int k = 0; k < grid.stages; ++k) stages.push_back(grid.RankOf(replica, k, tensor));
  // Names gain the tensor rank where there are several.
  const std::string of_tensor = T > 1 ? absl::StrFormat(", tensor rank %d", tensor) : "";
  if (T > 1) {
    ASSIGN_OR_RETURN(
        g.tp, comm->Split(stage * grid.replicas + replica, tensor,
                          absl::StrFormat("the tensor-parallel group of replica %d, stage %d",
                                          replica, stage),
                          tensors));
  }
  if (grid.stages == 1 && T == 1) {
    g.dp = comm;
  } else if (grid.replicas > 1) {
    ASSIGN_OR_RETURN(g.dp_owned,
                     comm->Split(stage * T + tensor, replica,
                                 absl::StrFormat("the data-parallel group of stage %d%s", stage,
                                                 of_tensor),
                                 peers));
    g.dp = g.dp_owned.get();
  }
  if (grid.replicas == 1 && T == 1) {
    g.pp = comm;
  } else if (grid.stages > 1) {
    ASSIGN_OR_RETURN(g.pp_owned,
                     comm->Split(replica * T + tensor, stage,
                                 absl::StrFormat("the pipeline of replica %d%s", replica,
                                                 of_tensor),
                                 stages));
    g.pp = g.pp_owned.get();
  }
  if (tied_embeddings && grid.stages > 1) {
    // The embedding group of each replica: its first and last stage, which hold the tied
    // table and its copy (Megatron's embedding group). Every rank takes part in the split;
    // a middle stage's group is itself alone, and unused.
    const bool end_stage = stage == 0 || stage == grid.stages - 1;
    std::vector<int> members = {grid.RankOf(replica, 0, tensor),
                                grid.RankOf(replica, grid.stages - 1, tensor)};
    if (!end_stage) members = {rank};
    const int pair = replica * T + tensor;  // one group per replica and tensor rank
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> group,
                     comm->Split(end_stage ? pair : grid.replicas * T + rank, stage,
                                 absl::StrFormat("the embedding group of replica %d%s", replica,
                                                 of_tensor),
                                 members));
    if (end_stage) g.embed = std::move(group);
  }
  return g;
}

absl::Status CommTensorGroup::Run(
    Stream& s, int64_t bytes, const char* what,
    const std::function<absl::StatusOr<std::unique_ptr<Work>>()>& issue) {
  absl::Status st =
      timeline_ != nullptr ? timeline_->Mark(kComputePart, "compute") : absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Work>> w = issue();
  if (st.ok()) st = w.ok() ? (*w)->WaitOn(s, timeout_) : w.status();
  if (st.ok() && timeline_ != nullptr) st = timeline_->Mark(kTensorComm, what);
  if (!st.ok()) {
    return absl::Status(st.code(),
                        absl::StrFormat("%s, waiting for %s: %s", where_, what, st.message()));
  }
  bytes_ += bytes;
  return absl::OkStatus();
}

absl::Status CommTensorGroup::AllReduceSum(Stream& s, const Tensor& t, const char* what) {
  return Run(s, t.bytes(), what, [&] { return comm_->AllReduce(t, {ReduceOp::kSum}); });
}

absl::Status CommTensorGroup::AllReduceMax(Stream& s, const Tensor& t, const char* what) {
  return Run(s, t.bytes(), what, [&] { return comm_->AllReduce(t, {ReduceOp::kMax}); });
}

absl::Status CommTensorGroup::AllGather(Stream& s, const Tensor& all, const Tensor& mine,
                                        const char* what) {
  return Run(s, all.bytes(), what, [&] { return comm_->AllGather(all, mine); });
}

absl::Status CommTensorGroup::ReduceScatterSum(Stream& s, const Tensor& mine, const Tensor& all,
                                               const char* what) {
  return Run(s, all.bytes(), what, [&] { return comm_->ReduceScatter(mine, all); });
}

}  // namespace tandem
