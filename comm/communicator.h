// The Communicator: collectives and point-to-point transfers among the ranks of one job.
// Every operation is asynchronous: it is checked and queued at once and returns a Work
// handle. Operations run one after another in issue order (on a communication thread for CPU
// tensors, a communication stream for CUDA tensors), each after the work issued to the
// device's compute stream before it (the communication stream waits for an event recorded on
// the compute stream; MPI's thread for the same event), and each carries a sequence number
// (1, 2, ...) that is the same on every rank issuing the same operations in the same order.
#ifndef TANDEM_COMM_COMMUNICATOR_H_
#define TANDEM_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/device.h"
#include "runtime/tensor.h"

namespace tandem {

// kMax: the element-wise largest (vocabulary-parallel cross-entropy's row maxima); all-reduce
// only.
enum class ReduceOp { kSum, kAvg, kMax };

// "sum", "avg" or "max".
const char* ReduceOpName(ReduceOp op);

struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
};

struct BroadcastOptions {
  int root = 0;  // the rank whose tensor every rank receives
};

struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
};

// One half of a grouped exchange (Communicator::SendRecv).
struct PeerTransfer {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  Tensor tensor;
  int peer = -1;

  static PeerTransfer Send(Tensor t, int peer) { return {Kind::kSend, std::move(t), peer}; }
  static PeerTransfer Recv(Tensor t, int peer) { return {Kind::kRecv, std::move(t), peer}; }
};

// A queued or running operation. The tensors it uses must not be touched by the caller
// until it finished (Wait returned OK, or work on a stream made to wait with WaitOn); the
// communicator keeps their memory allocated meanwhile.
class Work {
 public:
  virtual ~Work() = default;

  // Blocks the host until the operation finished or `timeout` passed (a host
  // synchronization). OK once it finished; its own error if it failed; Aborted with the reason
  // after Communicator::Abort; DeadlineExceeded naming the rank, the operation, its sequence
  // number and what it waits for.
  virtual absl::Status Wait(absl::Duration timeout) = 0;
  // Makes work issued to `stream` after this call wait until the operation finished, without
  // blocking the host (ProcessGroupNCCL's work.wait()). A failure, an abort or, on the CPU, a
  // wait longer than `timeout` becomes the stream's error, returned by its next
  // synchronization (on CUDA the stream waits for the operation's event; a hang there is the
  // heartbeat watchdog's to catch).
  virtual absl::Status WaitOn(Stream& stream, absl::Duration timeout) = 0;
  // True once finished, false while queued or running, the error if it failed.
  virtual absl::StatusOr<bool> IsCompleted() = 0;
  // This operation's sequence number (1 for the first operation of a communicator).
  virtual uint64_t sequence() const = 0;
  // "all_reduce #42 (f32 x 1024, sum)".
  virtual const std::string& description() const = 0;
};

// Issue order is call order: issue a communicator's operations from one thread (or order
// the threads yourself), the same sequence on every rank.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Where the tensors passed to this communicator must live.
  virtual Device device() const = 0;

  // In place: every rank's `t` becomes the element-wise sum (or average) over all ranks.
  // f32, bf16, f16 (and i32 for sum); the same dtype and count on every rank.
  virtual absl::StatusOr<std::unique_ptr<Work>> AllReduce(
      const Tensor& t, const AllReduceOptions& options = {}) = 0;
  // In place: every rank's `t` becomes the root's `t`.
  virtual absl::StatusOr<std::unique_ptr<Work>> Broadcast(
      const Tensor& t, const BroadcastOptions& options = {}) = 0;
  // `out` (world_size * in.numel() elements) receives every rank's `in`, in rank order.
  virtual absl::StatusOr<std::unique_ptr<Work>> AllGather(const Tensor& out,
                                                          const Tensor& in) = 0;
  // `in` (world_size * out.numel() elements) is reduced over ranks; rank r keeps block r.
  virtual absl::StatusOr<std::unique_ptr<Work>> ReduceScatter(
      const Tensor& out, const Tensor& in, const ReduceScatterOptions& options = {}) = 0;
  // In-place collectives over parts of one tensor: rank r owns the elements
  // [offsets[r], offsets[r + 1]) of `t` (world_size + 1 offsets from 0 to t.numel(), never
  // decreasing; a part may be empty); `t` has the same size on every rank. f32 only: they
  // move ZeRO's gradient and parameter shards, which are f32.
  // Each rank's part of `t` becomes the sum over all ranks of that part; the rest of `t` is
  // left unspecified (MPI_Reduce_scatter with counts; NCCL: grouped ncclReduce to each owner).
  // With `out` (f32, this rank's part's count, on t's device) the sum goes there instead and
  // `t` is only read: ZeRO-2's gradient bucket, freed once reduced, into the rank's shard.
  virtual absl::StatusOr<std::unique_ptr<Work>> ReduceScatterParts(
      const Tensor& t, const std::vector<int64_t>& offsets, const Tensor& out = Tensor()) = 0;
  // Every rank's part of `t` goes to every rank (MPI_Allgatherv; NCCL: grouped ncclBroadcast
  // from each owner).
  virtual absl::StatusOr<std::unique_ptr<Work>> AllGatherParts(
      const Tensor& t, const std::vector<int64_t>& offsets) = 0;
  // Point to point, matched in order with the peer's Recv / Send. Standalone transfers run
  // in issue order like everything else, so two ranks that both Send first may deadlock
  // (as with NCCL): exchanges among several peers go through SendRecv.
  virtual absl::StatusOr<std::unique_ptr<Work>> Send(const Tensor& t, int peer) = 0;
  virtual absl::StatusOr<std::unique_ptr<Work>> Recv(const Tensor& t, int peer) = 0;
  // Sends and receives started together as one operation (one sequence number), so rings
  // and pairwise exchanges cannot deadlock.
  virtual absl::StatusOr<std::unique_ptr<Work>> SendRecv(
      const std::vector<PeerTransfer>& transfers) = 0;
  // Completes once every rank has reached it.
  virtual absl::StatusOr<std::unique_ptr<Work>> Barrier() = 0;

  // A communicator over the ranks of this one that pass the same `color` (>= 0), ranked by
  // `key` (ties by rank here), called `name` in its messages ("the data-parallel group of
  // stage 1": an error then reads "rank 3 (1 of the data-parallel group of stage 1): ...").
  // `members` are the job's ranks of the group's ranks, in its order, as the caller's layout
  // defines it: operations name their peers by them. A split whose members disagree with
  // them is refused (MPI checks every member; NCCL, which cannot tell, this rank's place).
  // Collective over every rank of this communicator (MPI_Comm_split; ncclCommSplit). The new
  // communicator has its own operations' order and sequence numbers; its device is this one's.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(
      int color, int key, const std::string& name, const std::vector<int>& members) = 0;
  // Its name in messages: "" for the job's communicator.
  virtual const std::string& name() const = 0;

  // Stops communication for good: every unfinished Work returns Aborted(reason) at once and
  // later operations are refused. Thread-safe; meant for the coordinator's abort.
  virtual void Abort(absl::string_view reason) = 0;

  // Sequence number of the last operation issued (0 before the first), and the last one
  // finished. A rank whose issued number is behind the others' never entered a collective.
  virtual uint64_t last_issued_sequence() const = 0;
  virtual uint64_t last_completed_sequence() const = 0;

  // Seconds the operations have spent running since creation, so a caller can tell how much
  // communication its own waits did not see (overlap): MPI's communication thread's time in
  // them; on NCCL the finished operations' time on the communication stream, between events
  // recorded around each. 0 where a backend does not measure it.
  virtual double busy_seconds() const { return 0; }
  // busy_seconds() of the operations through `sequence` only (those issued after it not
  // counted), for the time of one step's operations: the difference at its first and last
  // sequence numbers. Exact for the last 65536 operations, once they finished.
  virtual double busy_seconds_through(uint64_t sequence) const { return busy_seconds(); }
};

}  // namespace tandem

#endif  // TANDEM_COMM_COMMUNICATOR_H_
