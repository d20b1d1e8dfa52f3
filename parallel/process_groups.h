// The process groups a layout needs, split from the job's communicator in one place, in the
// same order on every rank (as Megatron-LM's initialize_model_parallel makes them all at
// once): a stage's tensor-parallel ranks ranked by tensor rank, a stage's data-parallel
// replicas (of the same tensor rank) by replica, a replica's pipeline stages (of the same
// tensor rank) by stage, and with tied embeddings across stages each replica's first and last
// stage (the embedding group, per tensor rank). Collective over the job's communicator.
#ifndef TANDEM_PARALLEL_PROCESS_GROUPS_H_
#define TANDEM_PARALLEL_PROCESS_GROUPS_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "model/tensor_parallel.h"
#include "runtime/timeline.h"
#include "parallel/layout.h"

namespace tandem {

struct ProcessGroups {
  // This stage's tensor-parallel group, null without tensor parallelism.
  std::unique_ptr<Communicator> tp;
  // This stage's data-parallel group: the job's communicator under data parallelism without
  // tensor parallelism, null without replicas.
  Communicator* dp = nullptr;
  // This replica's pipeline: the job's communicator without replicas or tensor parallelism,
  // null without stages.
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

// The collectives of a stage's blocks (model/tensor_parallel.h) over its tensor-parallel
// communicator: each issued, and the stream made to wait for it (Work::WaitOn) up to
// `timeout`; an error names this rank's place and the collective. Counts the bytes it moved.
class CommTensorGroup : public TensorGroup {
 public:
  CommTensorGroup(Communicator* comm, absl::Duration timeout, std::string where)
      : comm_(comm), timeout_(timeout), where_(std::move(where)) {}
  absl::Status AllReduceSum(Stream& s, const Tensor& t, const char* what) override;
  absl::Status AllReduceMax(Stream& s, const Tensor& t, const char* what) override;
  absl::Status AllGather(Stream& s, const Tensor& all, const Tensor& mine,
                         const char* what) override;
  absl::Status ReduceScatterSum(Stream& s, const Tensor& mine, const Tensor& all,
                                const char* what) override;
  // The bytes its collectives moved since the last call.
  int64_t TakeBytes() { return std::exchange(bytes_, 0); }
  // Where a step's collectives mark their waits (kComputePart before each, kTensorComm after
  // the stream's wait, parallel/step_phases.h); null: not marked.
  void set_timeline(StreamTimeline* timeline) { timeline_ = timeline; }

 private:
  // Issues one collective of `bytes` (issue), makes the stream wait for it, marks the timeline.
  absl::Status Run(Stream& s, int64_t bytes, const char* what,
                   const std::function<absl::StatusOr<std::unique_ptr<Work>>()>& issue);
  Communicator* comm_;
  absl::Duration timeout_;
  std::string where_;
  int64_t bytes_ = 0;
  StreamTimeline* timeline_ = nullptr;
};

}  // namespace tandem

#endif  // TANDEM_PARALLEL_PROCESS_GROUPS_H_
