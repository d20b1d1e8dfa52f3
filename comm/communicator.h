// The Communicator: collectives and point-to-point transfers among the ranks of one job.
// Every operation is asynchronous: it is checked and queued at once and returns a Work
// handle. Operations run one after another in issue order (on a communication thread for CPU
// tensors, a communication stream for CUDA tensors), and each carries a sequence number
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

enum class ReduceOp { kSum, kAvg };

// "sum" or "avg".
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
// until Wait returned OK (the handle keeps their storage alive meanwhile).
class Work {
 public:
  virtual ~Work() = default;

  // Blocks until the operation finished or `timeout` passed. OK once it finished; its own
  // error if it failed; Aborted with the reason after Communicator::Abort; DeadlineExceeded
  // naming the rank, the operation, its sequence number and what it waits for.
  virtual absl::Status Wait(absl::Duration timeout) = 0;
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

  // Stops communication for good: every unfinished Work returns Aborted(reason) at once and
  // later operations are refused. Thread-safe; meant for the coordinator's abort.
  virtual void Abort(absl::string_view reason) = 0;

  // Sequence number of the last operation issued (0 before the first), and the last one
  // finished. A rank whose issued number is behind the others' never entered a collective.
  virtual uint64_t last_issued_sequence() const = 0;
  virtual uint64_t last_completed_sequence() const = 0;

  // Seconds the communication thread has spent running operations since creation, so a
  // caller can tell how much communication its own waits did not see (overlap). 0 where the
  // backend does not measure it (NCCL: the work runs on the device, unseen by the host).
  virtual double busy_seconds() const { return 0; }
};

}  // namespace tandem

#endif  // TANDEM_COMM_COMMUNICATOR_H_
