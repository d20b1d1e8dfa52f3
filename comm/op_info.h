// What one communicator operation is (kind, sequence number, dtype, count, peer) and the
// argument checks every Communicator implementation shares, so the MPI and NCCL
// communicators refuse the same calls with the same messages. Private to comm/.
#ifndef TANDEM_COMM_OP_INFO_H_
#define TANDEM_COMM_OP_INFO_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace tandem {

enum class OpKind {
  kAllReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kSend,
  kRecv,
  kSendRecv,
  kBarrier,
  kSplit,
  kReduceScatterParts,
  kAllGatherParts,
};

// "all_reduce", "broadcast", ...
const char* OpKindName(OpKind kind);

struct OpInfo {
  OpKind kind = OpKind::kBarrier;
  uint64_t sequence = 0;
  DType dtype = DType::kF32;
  int64_t count = 0;  // elements; per rank for all_gather and reduce_scatter
  ReduceOp op = ReduceOp::kSum;
  // Peers by their rank in the job (CommIdentity::JobRankOf), for messages and traces.
  int peer = -1;           // broadcast root, send/recv peer
  std::vector<int> sends;  // send_recv: peers sent to, in order
  std::vector<int> recvs;  // send_recv: peers received from, in order
  std::vector<int64_t> offsets;  // the *_parts collectives: each rank's part (see Parts)

  // "all_reduce #42 (f32 x 1024, sum)".
  std::string Describe() const;
  // "all 4 ranks to join it", "rank 3 to send its f32 x 10", ...
  std::string WaitingFor(int world_size) const;
};

// A Work for one operation: its sequence number and description come from its OpInfo.
class OpWork : public Work {
 public:
  uint64_t sequence() const override { return info_.sequence; }
  // Formatted on first use, not at issue: most operations are never described.
  const std::string& description() const override {
    std::call_once(described_, [this] { description_ = info_.Describe(); });
    return description_;
  }

 protected:
  explicit OpWork(OpInfo info) : info_(std::move(info)) {}

  const OpInfo info_;

 private:
  mutable std::once_flag described_;
  mutable std::string description_;
};

// The time each operation ran, as running sums by sequence number, so that a step's
// operations' time is the difference at its first and last numbers (Communicator::
// busy_seconds_through). Operations are added in sequence order, by the thread that runs or
// retires them; the last kCapacity are kept.
class BusyLedger {
 public:
  static constexpr uint64_t kCapacity = 1 << 16;
  void Add(uint64_t sequence, int64_t ns);
  // Seconds of the operations 1..sequence that have been added (through the oldest kept one,
  // for an older number).
  double SecondsThrough(uint64_t sequence) const;
  double Seconds() const;

 private:
  // Not an absl::Mutex: locked for every operation, on the communication thread between
  // one operation and the next (see TensorStash's).
  mutable std::mutex mu_;
  // Guarded by mu_.
  std::vector<int64_t> sums_ = std::vector<int64_t>(kCapacity, 0);
  uint64_t last_ = 0;  // the last sequence number added
  int64_t total_ = 0;
};

// The tensors of one operation, kept allocated for it (PyTorch's stashed tensors, in its
// avoid-record-streams mode): until the operation finished, or until work on the device's
// compute stream, where the tensors are allocated, was made to wait for it (Work::WaitOn):
// from then on the caching allocator's stream order keeps their memory from reuse until the
// operation has run, so the stash may go before the operation does. The operation itself
// runs on Unowned() views.
class TensorStash {
 public:
  explicit TensorStash(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {}
  void Release() {
    std::vector<Tensor> dropped;
    std::lock_guard<std::mutex> lock(mu_);
    dropped.swap(tensors_);
  }

 private:
  // A std::mutex: one is made, locked and destroyed with every operation, and absl::Mutex,
  // where absl is built with its deadlock detection (without NDEBUG, as the system's is),
  // enters each mutex it locks in a process-wide graph, under a global lock, until it is
  // destroyed.
  std::mutex mu_;
  std::vector<Tensor> tensors_;  // guarded by mu_
};

// Who is checking: the communicator's rank, size and device, and for a group split from the
// job's communicator (Communicator::Split) its name and this process's rank in the job.
struct CommIdentity {
  int rank = 0;
  int world_size = 1;
  Device device = Device::Cpu();
  std::string group;  // "" for the job's communicator; "the data-parallel group of stage 1"
  int job_rank = -1;  // -1: the same as rank
  // A group's members: the job's rank of each of its ranks (empty for the job's communicator).
  std::vector<int> members;
  // "rank 3" in the job's communicator; "rank 3 (1 of the data-parallel group of stage 1)"
  // in a group.
  std::string Who() const;
  // This process's rank in the job.
  int JobRank() const { return job_rank >= 0 ? job_rank : rank; }
  // The job's rank of this communicator's rank `r`: operations name their peers by it, so a
  // group's transfer reads as the job's ranks do ("to ranks [4]").
  int JobRankOf(int r) const {
    return r >= 0 && r < static_cast<int>(members.size()) ? members[r] : r;
  }
};

// Each returns the operation (sequence number unset) or InvalidArgument naming the rank,
// the operation and the offending argument.
absl::StatusOr<OpInfo> CheckAllReduce(const CommIdentity& c, const Tensor& t, ReduceOp op);
absl::StatusOr<OpInfo> CheckBroadcast(const CommIdentity& c, const Tensor& t, int root);
absl::StatusOr<OpInfo> CheckAllGather(const CommIdentity& c, const Tensor& out,
                                      const Tensor& in);
absl::StatusOr<OpInfo> CheckReduceScatter(const CommIdentity& c, const Tensor& out,
                                          const Tensor& in, ReduceOp op);
absl::StatusOr<OpInfo> CheckSend(const CommIdentity& c, const Tensor& t, int peer);
absl::StatusOr<OpInfo> CheckRecv(const CommIdentity& c, const Tensor& t, int peer);
absl::StatusOr<OpInfo> CheckSendRecv(const CommIdentity& c,
                                     const std::vector<PeerTransfer>& transfers);
// ReduceScatterParts and AllGatherParts: `t` f32 and `offsets` a split of it into one part
// per rank (Communicator::ReduceScatterParts); `out`, when defined, f32 on t's device with as
// many elements as this rank's part.
absl::StatusOr<OpInfo> CheckParts(const CommIdentity& c, OpKind kind, const Tensor& t,
                                  const std::vector<int64_t>& offsets,
                                  const Tensor& out = Tensor());
OpInfo BarrierInfo();
OpInfo SplitInfo();
// OK when a group `group` split from `parent` has the `members` its caller expects: one job
// rank per group rank, this rank's own in its place, and, where the communicator can tell
// (`made`, the job ranks the split put in the group), each of them; else InvalidArgument
// naming the rank, the group and both lists.
absl::Status CheckSplitMembers(const CommIdentity& parent, const CommIdentity& group,
                               const std::vector<int>& members, const std::vector<int>* made);

// DeadlineExceeded: "rank 1: all_reduce #42 (f32 x 1024, sum) not finished after 5s:
// waiting for all 4 ranks to join it; <progress>".
absl::Status WaitTimeoutError(const CommIdentity& c, const OpInfo& op, absl::Duration timeout,
                              absl::string_view progress);
// `cause`'s code, with "rank 1: <description> failed: <cause's message>".
absl::Status OpFailedError(const CommIdentity& c, absl::string_view description,
                           const absl::Status& cause);
// Aborted: "rank 1: all_reduce #42 (...) aborted: <reason>".
absl::Status OpAbortedError(const CommIdentity& c, const OpInfo& op, absl::string_view reason);
// Aborted, for an operation issued after Communicator::Abort: "rank 1: all_reduce refused: the
// communicator was aborted: <reason>".
absl::Status RefusedAfterAbortError(const CommIdentity& c, OpKind kind, absl::string_view reason);

}  // namespace tandem

#endif  // TANDEM_COMM_OP_INFO_H_
