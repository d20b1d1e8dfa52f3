// MpiCommunicator: operations are queued by the caller and executed, one at a time and in
// issue order, by the communicator's thread with MPI calls on a private duplicate
// communicator (collectives blocking; point-to-point transfers polled, sleeping between
// polls on the host's doorbells, so that a receive waiting for its peer leaves the cores to
// the compute streams and wakes when the peer rings). Each starts only once the CPU compute
// stream has run the work issued before it (an event recorded at issue: the ordering NCCL
// gets from its stream's wait), so that it sends what the queued ops computed and
// overwrites nothing they still read. Works wait on the shared state's "completed" counter:
// operations finish in order, so an operation is done exactly when the counter has reached
// its sequence number.
#include "comm/mpi_communicator.h"

#ifdef __linux__
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "comm/doorbells.h"
#include "comm/op_info.h"
#include "runtime/dtype.h"
#include "runtime/host_sync.h"
#include "runtime/profiler.h"
#include "runtime/status.h"
#include "runtime/stream.h"

#define MPI_RETURN_IF_ERROR(call)                                                 \
  do {                                                                            \
    int tandem_mpi_err_ = (call);                                                 \
    if (tandem_mpi_err_ != MPI_SUCCESS)                                           \
      return ::tandem::MpiErrorStatus(tandem_mpi_err_, #call, __FILE__, __LINE__); \
  } while (0)

namespace tandem {
namespace {

constexpr int kTag = 7301;                   // every point-to-point message of Tandem
constexpr int64_t kMaxChunk = int64_t{1} << 30;  // elements per MPI call (counts are int)
// How long a destructor waits for an operation stuck inside MPI before leaving the thread.
constexpr absl::Duration kStopGrace = absl::Seconds(2);
// How long a split waits for every rank to reach it.
constexpr absl::Duration kSplitTimeout = absl::Minutes(5);
// How long the communication thread keeps looking for the next operation before it sleeps.
constexpr std::chrono::microseconds kIdleSpin(50);
// A point-to-point transfer's wait: polled without pause this long, then between sleeps that
// grow from kPollSleepMin to kPollSleepMax (sleeping rather than spinning inside MPI, so that
// a receive posted long before its data leaves the core to the compute streams); with
// doorbells (comm/doorbells.h) to kRungSleepMax, as a peer's ring ends the sleep.
constexpr std::chrono::microseconds kPollSpin(50);
constexpr std::chrono::microseconds kPollSleepMin(5);
constexpr std::chrono::microseconds kPollSleepMax(50);
constexpr std::chrono::microseconds kRungSleepMax(1000);
// The largest shared-memory message sent eagerly (InitMpi), in one step: a pipeline's
// activation of a small micro-batch (gpt-tiny's 4 rows are 128 KB). Open MPI's limits count
// its headers too: kEagerRoom is theirs.
constexpr int64_t kEagerBytes = 128 * 1024;
constexpr int64_t kEagerRoom = 4 * 1024;
// How long after a post, a ring or a finished request a rendezvous's wait keeps its sleeps
// short (WaitAllPolling).
constexpr std::chrono::microseconds kHandshakeWindow(2000);
// The communication thread's scheduler time slice (Linux 6.12 and later: EEVDF's custom
// slice), the shortest the kernel takes: woken while the compute streams hold every core, it
// preempts one at once instead of after the running thread's slice (milliseconds).
constexpr uint64_t kCommSliceNs = 100'000;

// The MPI type used to move (not reduce) elements of `t`.
MPI_Datatype MoveType(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kBF16:
    case DType::kF16:
      return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

// Calls fn(offset, count) over [0, n) in chunks MPI can count; at least once, so that a
// zero-count operation still takes part (every rank makes the same calls).
absl::Status ForChunks(int64_t n, const std::function<absl::Status(int64_t, int)>& fn) {
  int64_t off = 0;
  do {
    const int64_t c = std::min(kMaxChunk, n - off);
    RETURN_IF_ERROR(fn(off, static_cast<int>(c)));
    off += c;
  } while (off < n);
  return absl::OkStatus();
}

void ToF32(const Tensor& t, float* out) {
  const uint16_t* in = t.data<uint16_t>();
  const int64_t n = t.numel();
  if (t.dtype() == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(in[i]);
  }
}

void FromF32(const float* in, const Tensor& t) {
  uint16_t* out = t.data<uint16_t>();
  const int64_t n = t.numel();
  if (t.dtype() == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToHalf(in[i]);
  }
}

void Divide(float* p, int64_t n, int by) {
  const float d = static_cast<float>(by);
  for (int64_t i = 0; i < n; ++i) p[i] /= d;
}

struct CommState;

struct QueuedOp {
  OpInfo info;
  std::function<absl::Status(CommState&)> run;  // on Unowned() views of the stash's tensors
  std::shared_ptr<TensorStash> stash;           // shared with the Work
  // The compute stream's work issued before this operation; null if it had all run at issue.
  std::unique_ptr<Event> ready;
};

// Each operation is made at issue, outside the lock (a deque of QueuedOps would allocate a
// block under the lock every other operation).
using OpQueue = std::deque<std::unique_ptr<QueuedOp>>;

// What the communicator, its thread and its Works share. Kept alive by all three, so a
// Work may outlive its communicator and a thread stuck in MPI after Abort stays valid.
struct CommState {
  CommIdentity id;
  MPI_Comm comm = MPI_COMM_NULL;  // used by the communication thread only
  // The job's doorbells, by the job's rank (shared with the communicators split from it);
  // null where they could not be made.
  std::shared_ptr<const Doorbells> bells;

  absl::Mutex mu;
  OpQueue queue ABSL_GUARDED_BY(mu);
  // The operation the communication thread is in: the info of the operation it took off
  // the queue, which it keeps until after resetting this; null when idle.
  const OpInfo* running ABSL_GUARDED_BY(mu) = nullptr;
  uint64_t failed_sequence ABSL_GUARDED_BY(mu) = 0;  // first operation that failed
  absl::Status failure ABSL_GUARDED_BY(mu);
  bool aborted ABSL_GUARDED_BY(mu) = false;
  std::string abort_reason ABSL_GUARDED_BY(mu);
  uint64_t completed_at_abort ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool exited ABSL_GUARDED_BY(mu) = false;
  // The communicators split from this one: aborted with it (a watchdog knows the job's).
  std::vector<std::weak_ptr<CommState>> children ABSL_GUARDED_BY(mu);

  // Written under `mu` only, so readers holding `mu` see the latest values; readable
  // without the lock too (heartbeat reports, Wait's fast path).
  std::atomic<uint64_t> issued_atomic{0};
  BusyLedger busy;  // time spent in op.run on the communication thread, by operation
  std::atomic<uint64_t> completed_atomic{0};
  // Set under `mu` when an operation fails or the communicator is aborted, before any later
  // store to completed_atomic: while it is clear, every operation found finished succeeded.
  std::atomic<bool> troubled{false};

  // f32 staging for 16-bit reductions, and the parts collectives' counts (PartCounts);
  // communication thread only, kept so that an operation allocates none.
  std::vector<float> scratch;
  std::vector<float> scratch_out;
  std::vector<int> part_counts;
  std::vector<int> part_displacements;

  // Whether `op` has finished and StatusOf(op) is OK, without the lock (which a waiter would
  // otherwise take for every operation it waits for).
  bool FinishedOk(const OpInfo& op) const {
    return completed_atomic.load(std::memory_order_acquire) >= op.sequence &&
           !troubled.load(std::memory_order_relaxed);
  }

  // The outcome of a finished (or aborted) operation.
  absl::Status StatusOf(const OpInfo& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (aborted && op.sequence > completed_at_abort) {
      return OpAbortedError(id, op, abort_reason);
    }
    if (failed_sequence != 0 && op.sequence >= failed_sequence) {
      if (op.sequence == failed_sequence) return failure;
      return absl::FailedPreconditionError(
          absl::StrCat(id.Who(), ": ", op.Describe(), " not run: operation #",
                       failed_sequence, " failed before it: ", failure.message()));
    }
    return absl::OkStatus();
  }

  // Where the communication thread is, for timeout messages.
  std::string Progress() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::string s = running ? absl::StrCat("the communication thread is in ",
                                           running->Describe())
                            : std::string("the communication thread is idle");
    absl::StrAppend(&s, ", finished through #",
                    completed_atomic.load(std::memory_order_relaxed), ", ", queue.size(),
                    " more queued");
    return s;
  }
};

// Blocks the calling thread (the host's, or a stream's for WaitOn) until operation `info`
// finished or `timeout` passed.
absl::Status WaitForOp(CommState* st, const OpInfo& info, absl::Duration timeout) {
  HostSync::Record("Work::Wait");  // not counted on a stream's thread
  const uint64_t seq = info.sequence;
  {
    // Poll briefly before sleeping, for the same reason as the communication thread.
    const auto spin_until = std::chrono::steady_clock::now() +
                            std::min(kIdleSpin * 2, absl::ToChronoMicroseconds(timeout));
    while (st->completed_atomic.load(std::memory_order_acquire) < seq &&
           std::chrono::steady_clock::now() < spin_until) {
      std::this_thread::yield();
    }
  }
  if (st->FinishedOk(info)) return absl::OkStatus();
  absl::MutexLock lock(&st->mu);
  auto done = [st, seq]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return st->completed_atomic.load(std::memory_order_relaxed) >= seq || st->aborted;
  };
  if (!st->mu.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    return WaitTimeoutError(st->id, info, timeout, st->Progress());
  }
  return st->StatusOf(info);
}

class MpiWork : public OpWork {
 public:
  MpiWork(std::shared_ptr<CommState> state, OpInfo info, std::shared_ptr<TensorStash> stash)
      : OpWork(std::move(info)), state_(std::move(state)), stash_(std::move(stash)) {}

  absl::Status Wait(absl::Duration timeout) override {
    return WaitForOp(state_.get(), info_, timeout);
  }

  absl::Status WaitOn(Stream& stream, absl::Duration timeout) override {
    if (!stream.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          state_->id.Who(), ": ", description(), " waited on a stream of ",
          stream.device().ToString(), "; the MPI communicator's work is the CPU's"));
    }
    // Finished: nothing to wait for.
    if (state_->FinishedOk(info_)) return absl::OkStatus();
    if (state_->completed_atomic.load(std::memory_order_acquire) >= info_.sequence) {
      absl::MutexLock lock(&state_->mu);
      return state_->StatusOf(info_);
    }
    RETURN_IF_ERROR(stream.Launch([state = state_, info = info_, timeout]() {
      return WaitForOp(state.get(), info, timeout);
    }));
    // Work on the compute stream now runs after the operation: the tensors, allocated there,
    // are safe in the allocator's stream order.
    absl::StatusOr<Stream*> compute = Stream::Compute(Device::Cpu());
    if (compute.ok() && *compute == &stream) stash_->Release();
    return absl::OkStatus();
  }

  absl::StatusOr<bool> IsCompleted() override {
    if (state_->FinishedOk(info_)) return true;
    absl::MutexLock lock(&state_->mu);
    if (state_->completed_atomic.load(std::memory_order_relaxed) < info_.sequence &&
        !state_->aborted) {
      return false;
    }
    RETURN_IF_ERROR(state_->StatusOf(info_));
    return true;
  }

 private:
  std::shared_ptr<CommState> state_;
  std::shared_ptr<TensorStash> stash_;
};

// ---- the operations, run on the communication thread ----

absl::Status RunAllReduce(CommState& st, const Tensor& t, ReduceOp op) {
  const int64_t n = t.numel();
  const int world = st.id.world_size;
  const MPI_Op mpi_op = op == ReduceOp::kMax ? MPI_MAX : MPI_SUM;
  if (t.dtype() == DType::kF32 || t.dtype() == DType::kI32) {
    char* base = static_cast<char*>(t.raw());
    const size_t esize = DTypeSize(t.dtype());
    RETURN_IF_ERROR(ForChunks(n, [&](int64_t off, int c) -> absl::Status {
      MPI_RETURN_IF_ERROR(MPI_Allreduce(MPI_IN_PLACE, base + off * esize, c,
                                        MoveType(t.dtype()), mpi_op, st.comm));
      return absl::OkStatus();
    }));
    if (op == ReduceOp::kAvg) Divide(t.data<float>(), n, world);  // checked: floats only
    return absl::OkStatus();
  }
  st.scratch.resize(n);
  float* f = st.scratch.data();
  ToF32(t, f);
  RETURN_IF_ERROR(ForChunks(n, [&](int64_t off, int c) -> absl::Status {
    MPI_RETURN_IF_ERROR(MPI_Allreduce(MPI_IN_PLACE, f + off, c, MPI_FLOAT, mpi_op, st.comm));
    return absl::OkStatus();
  }));
  if (op == ReduceOp::kAvg) Divide(f, n, world);
  FromF32(f, t);
  return absl::OkStatus();
}

absl::Status RunBroadcast(CommState& st, const Tensor& t, int root) {
  char* base = static_cast<char*>(t.raw());
  const size_t esize = DTypeSize(t.dtype());
  return ForChunks(t.numel(), [&](int64_t off, int c) -> absl::Status {
    MPI_RETURN_IF_ERROR(
        MPI_Bcast(base + off * esize, c, MoveType(t.dtype()), root, st.comm));
    return absl::OkStatus();
  });
}

absl::Status RunAllGather(CommState& st, const Tensor& out, const Tensor& in) {
  const int c = static_cast<int>(in.numel());  // checked at issue
  const MPI_Datatype type = MoveType(in.dtype());
  const char* my_block = static_cast<const char*>(out.raw()) + in.bytes() * st.id.rank;
  const void* send = (in.raw() == my_block) ? MPI_IN_PLACE : in.raw();
  MPI_RETURN_IF_ERROR(MPI_Allgather(send, c, type, out.raw(), c, type, st.comm));
  return absl::OkStatus();
}

absl::Status RunReduceScatter(CommState& st, const Tensor& out, const Tensor& in, ReduceOp op) {
  const int c = static_cast<int>(out.numel());  // checked at issue
  const int world = st.id.world_size;
  if (in.dtype() == DType::kF32 || in.dtype() == DType::kI32) {
    MPI_RETURN_IF_ERROR(MPI_Reduce_scatter_block(in.raw(), out.raw(), c, MoveType(in.dtype()),
                                                 MPI_SUM, st.comm));
    if (op == ReduceOp::kAvg) Divide(out.data<float>(), c, world);
    return absl::OkStatus();
  }
  st.scratch.resize(in.numel());
  st.scratch_out.resize(c);
  ToF32(in, st.scratch.data());
  MPI_RETURN_IF_ERROR(MPI_Reduce_scatter_block(st.scratch.data(), st.scratch_out.data(), c,
                                               MPI_FLOAT, MPI_SUM, st.comm));
  if (op == ReduceOp::kAvg) Divide(st.scratch_out.data(), c, world);
  FromF32(st.scratch_out.data(), out);
  return absl::OkStatus();
}

// Each rank's element count and displacement in a parts collective, as MPI counts them, into
// st.part_counts and st.part_displacements.
void PartCounts(CommState& st, const std::vector<int64_t>& offsets) {
  st.part_counts.clear();
  st.part_displacements.clear();
  for (size_t r = 0; r + 1 < offsets.size(); ++r) {
    st.part_counts.push_back(static_cast<int>(offsets[r + 1] - offsets[r]));  // checked at issue
    st.part_displacements.push_back(static_cast<int>(offsets[r]));
  }
}

absl::Status RunReduceScatterParts(CommState& st, const Tensor& t,
                                   const std::vector<int64_t>& offsets, const Tensor& out) {
  PartCounts(st, offsets);
  const std::vector<int>& counts = st.part_counts;
  float* base = t.data<float>();
  if (out.defined()) {
    MPI_RETURN_IF_ERROR(MPI_Reduce_scatter(base, out.data<float>(), counts.data(), MPI_FLOAT,
                                           MPI_SUM, st.comm));
    return absl::OkStatus();
  }
  // In place, MPI takes the whole vector from the buffer and writes this rank's sums at its
  // start; they go to this rank's part.
  MPI_RETURN_IF_ERROR(
      MPI_Reduce_scatter(MPI_IN_PLACE, base, counts.data(), MPI_FLOAT, MPI_SUM, st.comm));
  const int mine = st.id.rank;
  std::memmove(base + offsets[mine], base, sizeof(float) * counts[mine]);
  return absl::OkStatus();
}

absl::Status RunAllGatherParts(CommState& st, const Tensor& t,
                               const std::vector<int64_t>& offsets) {
  PartCounts(st, offsets);
  MPI_RETURN_IF_ERROR(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, t.raw(),
                                     st.part_counts.data(), st.part_displacements.data(), MPI_FLOAT,
                                     st.comm));
  return absl::OkStatus();
}

// `peer` by its rank in the job, as the operation's description names it.
absl::Status CheckReceived(const MPI_Status& status, MPI_Datatype type, int want, int peer) {
  int got = 0;
  MPI_RETURN_IF_ERROR(MPI_Get_count(&status, type, &got));
  if (got != want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "received %d elements from rank %d, expected %d (mismatched send and recv)", got,
        peer, want));
  }
  return absl::OkStatus();
}

// MPI_Waitall without holding a core: Open MPI's blocking wait polls its shared-memory queues
// nonstop (unless mpi_yield_when_idle), and a pipeline's receive is posted long before its
// data comes, so that polling would take CPU time from the compute streams for the whole
// forward or backward it overlaps. Polls without pause for kPollSpin (a transfer whose peer
// is ready finishes in that time), then sleeps between polls, a little longer each time. Each
// poll progresses every request (the receiver's progress also moves a rendezvous send along).
// It rings every peer (ranks of st's communicator) on this host's doorbells once its requests
// are posted and whenever a poll finished one of them (a receive that ends has given its
// sender's send what it waits for), and then this process's own bell too (the poll's progress
// may have finished another communication thread's transfer). With every peer on the
// doorbells it sleeps on its own bell, up to kRungSleepMax: woken by a peer's ring, it notices
// a transfer at once and costs nothing while it waits; after each ring or finished request it
// polls twice before sleeping again (a poll that progressed a request reports it only on the
// next). A message above kEagerBytes (`handshake`) takes the rendezvous, whose handshake steps
// no ring announces: for kHandshakeWindow after its post, each ring and each finished request,
// its sleeps stop at kPollSleepMax, a step noticed at most that long after it came. A peer on
// another host has no bell: then every sleep stops there.
int WaitAllPolling(const CommState& st, const std::vector<int>& peers, bool handshake,
                   std::vector<MPI_Request>& requests, std::vector<MPI_Status>& statuses) {
  const Doorbells* bells = st.bells.get();
  std::vector<int> ring;
  bool all_rung = bells != nullptr;
  for (int p : peers) {
    const int r = st.id.JobRankOf(p);
    if (bells != nullptr && bells->Reaches(r)) {
      ring.push_back(r);
    } else {
      all_rung = false;
    }
  }
  const int self = st.id.JobRank();
  auto ring_peers = [&](bool and_self) {
    for (int r : ring) bells->Ring(r);
    if (and_self && bells != nullptr) bells->Ring(self);
  };
  ring_peers(false);
  // A rendezvous's handshake steps come soon after a ring (the peer's post) or a finished
  // request: for kHandshakeWindow after each, a handshake's sleeps stop at kPollSleepMax.
  const auto now = [] { return std::chrono::steady_clock::now(); };
  auto short_until = now() + (handshake ? kHandshakeWindow : std::chrono::microseconds(0));
  auto longest = [&] {
    return all_rung && now() >= short_until ? kRungSleepMax : kPollSleepMax;
  };
  const int n = static_cast<int>(requests.size());
  int pending = 0;
  for (const MPI_Request& r : requests) pending += r != MPI_REQUEST_NULL;
  std::vector<int> finished(n);
  std::vector<MPI_Status> finished_statuses(n);
  const auto spin_until = now() + kPollSpin;
  auto sleep = kPollSleepMin;
  int polls_before_sleep = 0;
  while (pending > 0) {
    const uint32_t seen = all_rung ? bells->Count() : 0;
    int count = 0;
    const int e = MPI_Testsome(n, requests.data(), &count, finished.data(),
                               finished_statuses.data());
    if (e != MPI_SUCCESS) {
      for (int k = 0; count != MPI_UNDEFINED && k < count; ++k) {
        statuses[finished[k]] = finished_statuses[k];
      }
      // Complete what is still posted, so no buffer stays in use (an error ends the job:
      // blocking here costs nothing worth saving); the statuses of the failed ones hold their
      // errors.
      for (int i = 0; i < n; ++i) {
        if (requests[i] != MPI_REQUEST_NULL) MPI_Wait(&requests[i], &statuses[i]);
      }
      ring_peers(true);
      return e;
    }
    if (count == MPI_UNDEFINED) break;  // none active
    if (count > 0) {
      for (int k = 0; k < count; ++k) statuses[finished[k]] = finished_statuses[k];
      pending -= count;
      ring_peers(true);
      polls_before_sleep = 2;
      if (handshake) short_until = now() + kHandshakeWindow;
      continue;
    }
    if (polls_before_sleep > 0) {
      --polls_before_sleep;
      continue;
    }
    if (now() < spin_until) continue;
    if (all_rung) {
      bells->Wait(seen, std::min(sleep, longest()));
      if (bells->Count() != seen) {
        polls_before_sleep = 2;
        sleep = kPollSleepMin;
        if (handshake) short_until = now() + kHandshakeWindow;
        continue;
      }
    } else {
      std::this_thread::sleep_for(std::min(sleep, longest()));
    }
    sleep = std::min(sleep * 2, longest());
  }
  return MPI_SUCCESS;
}

// WaitAllPolling for one request; its failure as `what`'s.
absl::Status WaitOnePolling(const CommState& st, int peer, int64_t bytes, MPI_Request request,
                            const char* what, MPI_Status* status) {
  std::vector<MPI_Request> requests = {request};
  std::vector<MPI_Status> statuses(1);
  statuses[0].MPI_ERROR = MPI_SUCCESS;
  const int e = WaitAllPolling(st, {peer}, bytes > kEagerBytes, requests, statuses);
  *status = statuses[0];
  if (e == MPI_SUCCESS) return absl::OkStatus();
  return MpiErrorStatus(status->MPI_ERROR != MPI_SUCCESS ? status->MPI_ERROR : e, what,
                        __FILE__, __LINE__);
}

absl::Status RunSend(CommState& st, const Tensor& t, int peer) {
  char* base = static_cast<char*>(t.raw());
  const size_t esize = DTypeSize(t.dtype());
  return ForChunks(t.numel(), [&](int64_t off, int c) -> absl::Status {
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_RETURN_IF_ERROR(
        MPI_Isend(base + off * esize, c, MoveType(t.dtype()), peer, kTag, st.comm, &request));
    MPI_Status status;
    return WaitOnePolling(st, peer, int64_t{c} * static_cast<int64_t>(esize), request, "MPI_Send",
                          &status);
  });
}

absl::Status RunRecv(CommState& st, const Tensor& t, int peer) {
  char* base = static_cast<char*>(t.raw());
  const size_t esize = DTypeSize(t.dtype());
  const MPI_Datatype type = MoveType(t.dtype());
  return ForChunks(t.numel(), [&](int64_t off, int c) -> absl::Status {
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_RETURN_IF_ERROR(MPI_Irecv(base + off * esize, c, type, peer, kTag, st.comm, &request));
    MPI_Status status;
    RETURN_IF_ERROR(WaitOnePolling(st, peer, int64_t{c} * static_cast<int64_t>(esize), request,
                                   "MPI_Recv", &status));
    return CheckReceived(status, type, c, st.id.JobRankOf(peer));
  });
}

absl::Status RunSendRecv(CommState& st, const std::vector<PeerTransfer>& transfers) {
  std::vector<MPI_Request> requests(transfers.size(), MPI_REQUEST_NULL);
  absl::Status posted;
  // Receives first, so that eager sends find them posted.
  for (int pass = 0; pass < 2 && posted.ok(); ++pass) {
    for (size_t i = 0; i < transfers.size(); ++i) {
      const PeerTransfer& x = transfers[i];
      const bool recv = x.kind == PeerTransfer::Kind::kRecv;
      if (recv != (pass == 0)) continue;
      const int c = static_cast<int>(x.tensor.numel());  // checked at issue
      const MPI_Datatype type = MoveType(x.tensor.dtype());
      const int e = recv ? MPI_Irecv(x.tensor.raw(), c, type, x.peer, kTag, st.comm,
                                     &requests[i])
                         : MPI_Isend(x.tensor.raw(), c, type, x.peer, kTag, st.comm,
                                     &requests[i]);
      if (e != MPI_SUCCESS) {
        posted = MpiErrorStatus(e, recv ? "MPI_Irecv" : "MPI_Isend", __FILE__, __LINE__);
        break;
      }
    }
  }
  std::vector<MPI_Status> statuses(transfers.size());
  for (MPI_Status& x : statuses) x.MPI_ERROR = MPI_SUCCESS;
  // Posted requests are completed even after a failure, so no buffer stays in use.
  std::vector<int> peers;
  bool handshake = false;
  for (const PeerTransfer& x : transfers) {
    peers.push_back(x.peer);
    handshake = handshake || x.tensor.bytes() > kEagerBytes;
  }
  const int e = WaitAllPolling(st, peers, handshake, requests, statuses);
  RETURN_IF_ERROR(posted);
  if (e != MPI_SUCCESS) {
    for (size_t i = 0; i < statuses.size(); ++i) {
      if (statuses[i].MPI_ERROR != MPI_SUCCESS && statuses[i].MPI_ERROR != MPI_ERR_PENDING) {
        return MpiErrorStatus(statuses[i].MPI_ERROR,
                              absl::StrCat("MPI_Waitall (transfer ", i, ")").c_str(), __FILE__,
                              __LINE__);
      }
    }
    return MpiErrorStatus(e, "MPI_Waitall", __FILE__, __LINE__);
  }
  for (size_t i = 0; i < transfers.size(); ++i) {
    const PeerTransfer& x = transfers[i];
    if (x.kind != PeerTransfer::Kind::kRecv) continue;
    RETURN_IF_ERROR(CheckReceived(statuses[i], MoveType(x.tensor.dtype()),
                                  static_cast<int>(x.tensor.numel()), st.id.JobRankOf(x.peer)));
  }
  return absl::OkStatus();
}

// ---- the communication thread ----

// The communication thread's scheduling, best effort (Linux): the shortest time slice (see
// kCommSliceNs), and timers without slack, so that its sleeps between polls end on time
// (the default 50 us slack would double kPollSleepMax).
void ScheduleCommunicationThread() {
#ifdef __linux__
  struct SchedAttr {  // the kernel's struct sched_attr (glibc wraps no sched_setattr)
    uint32_t size;
    uint32_t sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime;
    uint64_t sched_deadline;
    uint64_t sched_period;
  };
  SchedAttr attr{};
  attr.size = sizeof(attr);
  if (syscall(SYS_sched_getattr, 0, &attr, sizeof(attr), 0) == 0 &&
      attr.sched_policy == SCHED_OTHER) {
    attr.size = sizeof(attr);
    attr.sched_flags = 0;
    attr.sched_runtime = kCommSliceNs;  // a fair task's slice; older kernels ignore it
    (void)syscall(SYS_sched_setattr, 0, &attr, 0);
  }
  (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
}

void CommunicationLoop(std::shared_ptr<CommState> st) {
  DeviceThreadScope device_thread;  // its waits are the device's ordering, not the host's
  ScheduleCommunicationThread();
  CommState* s = st.get();
  // Tests only: TANDEM_CPU_STREAM_JITTER_US=N delays each operation by 0..N us, as it does
  // every item of a CPU stream's work (runtime/stream.h).
  const char* jitter_env = std::getenv("TANDEM_CPU_STREAM_JITTER_US");
  const int jitter_us = jitter_env ? std::max(0, std::atoi(jitter_env)) : 0;
  std::mt19937_64 rng(0x5eed0000u + static_cast<uint64_t>(s->id.rank));
  std::uniform_int_distribution<int> jitter(0, jitter_us);
  auto has_work = [s]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !s->queue.empty() || s->stopping || s->aborted;
  };
  bool aborted = false;
  uint64_t taken = 0;  // sequence number of the last operation taken from the queue
  std::unique_ptr<QueuedOp> op;  // that operation
  absl::Status status;  // its outcome, once run
  // Whether `op` ran and its completion is not reported yet. With the next operation already
  // queued, the report and the take share one critical section (one lock round trip per
  // operation); otherwise it goes at once, before the thread looks for more.
  bool unreported = false;
  auto report = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    s->running = nullptr;
    if (!status.ok() && s->failed_sequence == 0) {
      s->failed_sequence = op->info.sequence;
      s->failure = status;
      s->troubled.store(true, std::memory_order_relaxed);
    }
    s->completed_atomic.store(op->info.sequence, std::memory_order_release);
    unreported = false;
  };
  for (;;) {
    if (unreported && s->issued_atomic.load(std::memory_order_acquire) == taken) {
      absl::MutexLock lock(&s->mu);
      report();
    }
    // A caller that waits on each operation issues the next within microseconds of the last
    // finishing; polling briefly (yielding the core) is cheaper than waking from a sleep,
    // which costs several microseconds (allreduce_bench's "waited" column shows it).
    const auto spin_until = std::chrono::steady_clock::now() + kIdleSpin;
    while (s->issued_atomic.load(std::memory_order_acquire) == taken &&
           std::chrono::steady_clock::now() < spin_until) {
      std::this_thread::yield();
    }
    bool skip = false;
    std::unique_ptr<QueuedOp> finished;  // the operation before, once the next is taken
    {
      absl::MutexLock lock(&s->mu);
      if (unreported) report();
      s->mu.Await(absl::Condition(&has_work));
      if (s->aborted || s->queue.empty()) {
        aborted = s->aborted;
        break;
      }
      finished = std::move(op);
      op = std::move(s->queue.front());
      s->queue.pop_front();
      s->running = &op->info;
      taken = op->info.sequence;
      skip = s->failed_sequence != 0;
    }
    finished = nullptr;  // outside the lock
    // After the compute stream's work issued before this operation (its data, or its
    // buffers' last readers). An error there is the stream's user's to hear; the operation
    // still runs, as the other ranks expect it.
    if (op->ready != nullptr) (void)op->ready->Synchronize();
    if (jitter_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(jitter(rng)));
    status = absl::OkStatus();
    if (!skip) {
      // The profiler's communication lane: when each operation really ran.
      SpanScope span(Profiler::enabled() ? op->info.Describe() : std::string(), "comm", -1,
                     static_cast<int64_t>(op->info.sequence), /*thread=*/1);
      const auto start = std::chrono::steady_clock::now();
      status = op->run(*s);
      s->busy.Add(op->info.sequence, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - start)
                                         .count());
      if (!status.ok()) {
        status = OpFailedError(s->id, op->info.Describe(), status);
      }
    }
    op->run = nullptr;
    // The operation's progress may have finished another communication thread's transfer,
    // which waits on this process's doorbell.
    if (s->bells != nullptr) s->bells->Ring(s->id.JobRank());
    op->stash->Release();  // the tensors, before reporting completion
    unreported = true;
  }
  // After an abort the communicator may be mid-operation on other ranks: leave it alone.
  if (!aborted) MPI_Comm_free(&s->comm);
  absl::MutexLock lock(&s->mu);
  s->exited = true;
}

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(std::shared_ptr<CommState> state) : state_(std::move(state)) {
    thread_ = std::thread(CommunicationLoop, state_);
  }

  ~MpiCommunicator() override {
    CommState* s = state_.get();
    {
      absl::MutexLock lock(&s->mu);
      if (!s->queue.empty() || s->running != nullptr) {
        AbortLocked("communicator destroyed with operations in flight");
      }
      s->stopping = true;
    }
    bool exited;
    {
      absl::MutexLock lock(&s->mu);
      auto is_exited = [s]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->exited; };
      exited = s->mu.AwaitWithTimeout(absl::Condition(&is_exited), kStopGrace);
    }
    // A thread still blocked in MPI (peers gone after an abort) keeps the state alive.
    if (exited) {
      thread_.join();
    } else {
      thread_.detach();
    }
  }

  int rank() const override { return state_->id.rank; }
  int world_size() const override { return state_->id.world_size; }
  Device device() const override { return Device::Cpu(); }

  absl::StatusOr<std::unique_ptr<Work>> AllReduce(const Tensor& t,
                                                  const AllReduceOptions& options) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckAllReduce(state_->id, t, options.op));
    return Enqueue(std::move(info), {t}, [u = t.Unowned(), options](CommState& st) {
      return RunAllReduce(st, u, options.op);
    });
  }

  absl::StatusOr<std::unique_ptr<Work>> Broadcast(const Tensor& t,
                                                  const BroadcastOptions& options) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckBroadcast(state_->id, t, options.root));
    return Enqueue(std::move(info), {t}, [u = t.Unowned(), options](CommState& st) {
      return RunBroadcast(st, u, options.root);
    });
  }

  absl::StatusOr<std::unique_ptr<Work>> AllGather(const Tensor& out, const Tensor& in) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckAllGather(state_->id, out, in));
    RETURN_IF_ERROR(CheckIntCount(info, in.numel() * world_size()));
    return Enqueue(std::move(info), {out, in},
                   [o = out.Unowned(), i = in.Unowned()](CommState& st) {
                     return RunAllGather(st, o, i);
                   });
  }

  absl::StatusOr<std::unique_ptr<Work>> ReduceScatter(
      const Tensor& out, const Tensor& in, const ReduceScatterOptions& options) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckReduceScatter(state_->id, out, in, options.op));
    RETURN_IF_ERROR(CheckIntCount(info, out.numel()));
    return Enqueue(std::move(info), {out, in},
                   [o = out.Unowned(), i = in.Unowned(), options](CommState& st) {
                     return RunReduceScatter(st, o, i, options.op);
                   });
  }

  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterParts(
      const Tensor& t, const std::vector<int64_t>& offsets, const Tensor& out) override {
    ASSIGN_OR_RETURN(OpInfo info,
                     CheckParts(state_->id, OpKind::kReduceScatterParts, t, offsets, out));
    RETURN_IF_ERROR(CheckIntCount(info, t.numel()));
    return Enqueue(std::move(info), {t, out},
                   [u = t.Unowned(), offsets, o = out.Unowned()](CommState& st) {
                     return RunReduceScatterParts(st, u, offsets, o);
                   });
  }

  absl::StatusOr<std::unique_ptr<Work>> AllGatherParts(
      const Tensor& t, const std::vector<int64_t>& offsets) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckParts(state_->id, OpKind::kAllGatherParts, t, offsets));
    RETURN_IF_ERROR(CheckIntCount(info, t.numel()));
    return Enqueue(std::move(info), {t}, [u = t.Unowned(), offsets](CommState& st) {
      return RunAllGatherParts(st, u, offsets);
    });
  }

  absl::StatusOr<std::unique_ptr<Work>> Send(const Tensor& t, int peer) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckSend(state_->id, t, peer));
    return Enqueue(std::move(info), {t},
                   [u = t.Unowned(), peer](CommState& st) { return RunSend(st, u, peer); });
  }

  absl::StatusOr<std::unique_ptr<Work>> Recv(const Tensor& t, int peer) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckRecv(state_->id, t, peer));
    return Enqueue(std::move(info), {t},
                   [u = t.Unowned(), peer](CommState& st) { return RunRecv(st, u, peer); });
  }

  absl::StatusOr<std::unique_ptr<Work>> SendRecv(
      const std::vector<PeerTransfer>& transfers) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckSendRecv(state_->id, transfers));
    for (const PeerTransfer& x : transfers) RETURN_IF_ERROR(CheckIntCount(info, x.tensor.numel()));
    std::vector<Tensor> tensors;
    std::vector<PeerTransfer> unowned = transfers;
    for (PeerTransfer& x : unowned) {
      tensors.push_back(x.tensor);
      x.tensor = x.tensor.Unowned();
    }
    return Enqueue(std::move(info), std::move(tensors),
                   [unowned](CommState& st) { return RunSendRecv(st, unowned); });
  }

  absl::StatusOr<std::unique_ptr<Work>> Barrier() override {
    return Enqueue(BarrierInfo(), {}, [](CommState& st) -> absl::Status {
      MPI_RETURN_IF_ERROR(MPI_Barrier(st.comm));
      return absl::OkStatus();
    });
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(
      int color, int key, const std::string& name, const std::vector<int>& members) override {
    if (color < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(state_->id.Who(), ": split: color ", color, " is negative"));
    }
    // On the communication thread, in this communicator's order: MPI_Comm_split is a
    // collective on it.
    auto split = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    ASSIGN_OR_RETURN(std::unique_ptr<Work> w,
                     Enqueue(SplitInfo(), {}, [split, color, key](CommState& st) -> absl::Status {
                       MPI_RETURN_IF_ERROR(MPI_Comm_split(st.comm, color, key, split.get()));
                       return absl::OkStatus();
                     }));
    RETURN_IF_ERROR(w->Wait(kSplitTimeout));
    auto state = std::make_shared<CommState>();
    state->comm = *split;
    MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(state->comm, MPI_ERRORS_RETURN));
    MPI_RETURN_IF_ERROR(MPI_Comm_rank(state->comm, &state->id.rank));
    MPI_RETURN_IF_ERROR(MPI_Comm_size(state->comm, &state->id.world_size));
    state->id.device = Device::Cpu();
    state->id.group = name;
    state->bells = state_->bells;
    state->id.job_rank = state_->id.JobRank();
    // The job's ranks the split put in the group, against the caller's layout.
    std::vector<int> made(state->id.world_size);
    {
      std::vector<int> ranks(made.size());
      for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = static_cast<int>(r);
      MPI_Group group = MPI_GROUP_NULL, parent = MPI_GROUP_NULL;
      int e = MPI_Comm_group(state->comm, &group);
      if (e == MPI_SUCCESS) e = MPI_Comm_group(state_->comm, &parent);
      if (e == MPI_SUCCESS) {
        e = MPI_Group_translate_ranks(group, static_cast<int>(ranks.size()), ranks.data(), parent,
                                      made.data());
      }
      if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
      if (parent != MPI_GROUP_NULL) MPI_Group_free(&parent);
      MPI_RETURN_IF_ERROR(e);
      for (int& r : made) r = state_->id.JobRankOf(r);
    }
    // On a mismatch the new communicator is left allocated: freeing it is collective, and
    // the group's other ranks may not have refused it. The error ends the job.
    RETURN_IF_ERROR(CheckSplitMembers(state_->id, state->id, members, &made));
    state->id.members = members;
    {
      absl::MutexLock lock(&state_->mu);
      state_->children.push_back(state);
    }
    return std::unique_ptr<Communicator>(new MpiCommunicator(std::move(state)));
  }

  const std::string& name() const override { return state_->id.group; }

  void Abort(absl::string_view reason) override { AbortTree(state_.get(), reason); }

  uint64_t last_issued_sequence() const override {
    return state_->issued_atomic.load(std::memory_order_acquire);
  }
  double busy_seconds() const override { return state_->busy.Seconds(); }
  double busy_seconds_through(uint64_t sequence) const override {
    return state_->busy.SecondsThrough(sequence);
  }

  uint64_t last_completed_sequence() const override {
    return state_->completed_atomic.load(std::memory_order_acquire);
  }

 private:
  OpQueue AbortLocked(absl::string_view reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    return AbortStateLocked(state_.get(), reason);
  }

  // Aborts `s` and every communicator split from it.
  static void AbortTree(CommState* s, absl::string_view reason) {
    OpQueue dropped;
    std::vector<std::shared_ptr<CommState>> children;
    {
      absl::MutexLock lock(&s->mu);
      dropped = AbortStateLocked(s, reason);
      for (const auto& c : s->children) {
        if (auto child = c.lock()) children.push_back(std::move(child));
      }
    }
    // `dropped` (and the tensors it holds) goes at the end, outside the lock.
    for (const auto& c : children) AbortTree(c.get(), reason);
  }

  static OpQueue AbortStateLocked(CommState* s, absl::string_view reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
    if (s->aborted) return {};
    s->aborted = true;
    s->troubled.store(true, std::memory_order_relaxed);
    s->abort_reason = std::string(reason);
    s->completed_at_abort = s->completed_atomic.load(std::memory_order_relaxed);
    OpQueue dropped;
    dropped.swap(s->queue);
    return dropped;
  }

  // MPI counts elements in an int; larger all_gather / reduce_scatter / send_recv blocks
  // are refused (all_reduce, broadcast, send and recv are split in chunks instead).
  absl::Status CheckIntCount(const OpInfo& info, int64_t count) {
    if (count <= INT_MAX) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s: %d elements in one block exceed MPI's int count",
                        state_->id.Who(), OpKindName(info.kind), count));
  }

  absl::StatusOr<std::unique_ptr<Work>> Enqueue(
      OpInfo info, std::vector<Tensor> tensors, std::function<absl::Status(CommState&)> run) {
    CommState* s = state_.get();
    // Where the compute stream is now: the operation runs after that work.
    ASSIGN_OR_RETURN(Stream * compute, Stream::Compute(Device::Cpu()));
    ASSIGN_OR_RETURN(std::unique_ptr<Event> ready, Event::Create(Device::Cpu(), false));
    RETURN_IF_ERROR(ready->Record(*compute));
    // A stream that has already run all of it (idle, or immediate) leaves nothing to wait
    // for: the communication thread then skips the event.
    ASSIGN_OR_RETURN(bool idle, ready->Query());
    if (idle) ready = nullptr;
    // Made before taking the lock, which the communication thread takes for every operation;
    // only the sequence number is given under it.
    auto stash = std::make_shared<TensorStash>(std::move(tensors));
    auto op = std::make_unique<QueuedOp>(QueuedOp{info, std::move(run), stash, std::move(ready)});
    {
      absl::MutexLock lock(&s->mu);
      if (s->aborted) return RefusedAfterAbortError(s->id, info.kind, s->abort_reason);
      info.sequence = s->issued_atomic.load(std::memory_order_relaxed) + 1;
      op->info.sequence = info.sequence;
      s->issued_atomic.store(info.sequence, std::memory_order_release);
      s->queue.push_back(std::move(op));
    }
    return std::unique_ptr<Work>(new MpiWork(state_, std::move(info), std::move(stash)));
  }

  std::shared_ptr<CommState> state_;
  std::thread thread_;
};

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

absl::Status CheckThreadLevel(int level) {
  if (level >= MPI_THREAD_SERIALIZED) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "MPI runs at ", ThreadLevelName(level),
      "; Tandem's communication thread needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE"));
}

}  // namespace

absl::Status MpiErrorStatus(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) {
    len = snprintf(text, sizeof(text), "MPI error %d", code);
  }
  return absl::InternalError(absl::StrFormat("%s:%d: %s failed: %s", file, line, call,
                                             absl::string_view(text, len)));
}

absl::Status InitMpi(int* argc, char*** argv) {
  int initialized = 0;
  MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  int level = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_RETURN_IF_ERROR(MPI_Query_thread(&level));
  } else {
    // Shared-memory messages up to kEagerBytes go eagerly (copied through the receiver's queue,
    // no handshake) unless these are set in the environment or on mpirun's command line (they
    // take precedence over a parameter file's): above Open MPI's 4 KB default a message takes
    // the rendezvous, whose handshake steps no finished transfer announces, so each would wait
    // for a peer asleep on its doorbell (comm/doorbells.h). Only the shared-memory transport
    // (vader) reads them.
    const std::string eager = std::to_string(kEagerBytes + kEagerRoom);
    for (const char* name : {"OMPI_MCA_btl_vader_eager_limit", "OMPI_MCA_btl_vader_max_send_size",
                             "OMPI_MCA_btl_vader_rndv_eager_limit"}) {
      setenv(name, eager.c_str(), /*overwrite=*/0);
    }
    MPI_RETURN_IF_ERROR(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &level));
  }
  return CheckThreadLevel(level);
}

absl::Status FinalizeMpi() {
  int initialized = 0, finalized = 0;
  MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  MPI_RETURN_IF_ERROR(MPI_Finalized(&finalized));
  if (initialized && !finalized) MPI_RETURN_IF_ERROR(MPI_Finalize());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(
    const MpiCommunicatorOptions& options) {
  int initialized = 0, finalized = 0;
  MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  MPI_RETURN_IF_ERROR(MPI_Finalized(&finalized));
  if (!initialized || finalized) {
    return absl::FailedPreconditionError(
        "MPI communicator: MPI is not running (call InitMpi first, and before FinalizeMpi)");
  }
  int level = MPI_THREAD_SINGLE;
  MPI_RETURN_IF_ERROR(MPI_Query_thread(&level));
  RETURN_IF_ERROR(CheckThreadLevel(level));
  auto state = std::make_shared<CommState>();
  MPI_RETURN_IF_ERROR(MPI_Comm_dup(options.base, &state->comm));
  MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(state->comm, MPI_ERRORS_RETURN));
  MPI_RETURN_IF_ERROR(MPI_Comm_rank(state->comm, &state->id.rank));
  MPI_RETURN_IF_ERROR(MPI_Comm_size(state->comm, &state->id.world_size));
  state->id.device = Device::Cpu();
  state->bells = Doorbells::Create(state->comm, Doorbells::Wanted());
  return std::unique_ptr<Communicator>(new MpiCommunicator(std::move(state)));
}

}  // namespace tandem
