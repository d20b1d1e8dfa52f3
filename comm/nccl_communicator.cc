// NcclCommunicator: a non-blocking NCCL communicator (so initialization and every wait can
// time out and Abort can interrupt) on a private CUDA stream. Operations are enqueued on
// the calling thread, in issue order, after an event recorded on the compute stream; each
// records an event that its Work polls or a stream waits for (WaitOn). Tensors stay
// referenced until their operation's event has fired, even if the Work is dropped, or until
// the compute stream, where they were allocated, was made to wait for it (PyTorch's
// avoid-record-streams mode: the caching allocator's stream order protects them from then on).
#include "comm/nccl_communicator.h"

#include "absl/strings/str_cat.h"

#if TANDEM_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "comm/op_info.h"
#include "runtime/cuda_status.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/host_sync.h"
#include "runtime/status.h"
#include "runtime/stream.h"

namespace tandem {
namespace {

// NCCL's error codes as absl::Status, with the call, file, line, NCCL's message and its last
// error's detail.
absl::Status NcclErrorStatus(ncclResult_t e, const char* call, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  return absl::InternalError(absl::StrFormat("%s:%d: %s failed: %s%s%s", file, line, call,
                                             ncclGetErrorString(e), last && *last ? ": " : "",
                                             last ? last : ""));
}

// Returns on failure; ncclInProgress is the non-blocking mode's "taken, still running".
#define NCCL_RETURN_IF_ERROR(call)                                                      \
  do {                                                                                  \
    ncclResult_t tandem_nccl_err_ = (call);                                             \
    if (tandem_nccl_err_ != ncclSuccess && tandem_nccl_err_ != ncclInProgress)          \
      return NcclErrorStatus(tandem_nccl_err_, #call, __FILE__, __LINE__);              \
  } while (0)

// How long the destructor lets outstanding operations drain before aborting them.
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(30);

ncclDataType_t NcclType(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
  }
  return ncclUint8;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

// Calls call(rank, begin, count) for every rank's non-empty part, in one NCCL group.
template <typename Call>
ncclResult_t EachPart(const std::vector<int64_t>& offsets, Call call) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  for (size_t k = 0; k + 1 < offsets.size(); ++k) {
    const int64_t count = offsets[k + 1] - offsets[k];
    if (count == 0) continue;
    r = call(static_cast<int>(k), offsets[k], count);
    if (r != ncclSuccess && r != ncclInProgress) {
      ncclGroupEnd();
      return r;
    }
  }
  return ncclGroupEnd();
}

// A CUDA event before or after one operation; timed, for the communicator's busy time.
class CudaEvent {
 public:
  static absl::StatusOr<std::shared_ptr<CudaEvent>> Create() {
    cudaEvent_t e;
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDefault));
    return std::shared_ptr<CudaEvent>(new CudaEvent(e));
  }
  ~CudaEvent() { cudaEventDestroy(event_); }
  cudaEvent_t get() const { return event_; }

 private:
  explicit CudaEvent(cudaEvent_t e) : event_(e) {}
  cudaEvent_t event_;
};

struct InFlight {
  uint64_t sequence;
  std::shared_ptr<CudaEvent> start;  // on the communication stream, before the operation
  std::shared_ptr<CudaEvent> done;
  std::shared_ptr<TensorStash> stash;  // until `done` fires, or the compute stream waited
};

// What the communicator and its Works share.
struct NcclState {
  CommIdentity id;
  std::unique_ptr<Stream> stream;  // the communication stream
  absl::Duration accept_timeout;   // the options' accept_timeout

  // Held by Issue from start to end: WaitAcceptedLocked lets go of `mu` while NCCL works,
  // and no second call may reach a communicator that has not yet accepted the last one.
  absl::Mutex issue_mu ABSL_ACQUIRED_BEFORE(mu);
  absl::Mutex mu;
  ncclComm_t comm ABSL_GUARDED_BY(mu) = nullptr;
  bool aborted ABSL_GUARDED_BY(mu) = false;
  std::string abort_reason ABSL_GUARDED_BY(mu);
  uint64_t completed_at_abort ABSL_GUARDED_BY(mu) = 0;
  std::deque<InFlight> in_flight ABSL_GUARDED_BY(mu);
  // The tensors of operations NCCL took in but that failed before they were tracked: NCCL may
  // still run them, so they stay allocated as long as the communicator.
  std::vector<Tensor> abandoned ABSL_GUARDED_BY(mu);
  std::atomic<uint64_t> issued_atomic{0};  // written under `mu` only
  std::atomic<uint64_t> completed_atomic{0};
  BusyLedger busy;  // the operations' time on the stream, by their events
  // The communicators split from this one: aborted with it (a watchdog knows the job's).
  std::vector<std::weak_ptr<NcclState>> children ABSL_GUARDED_BY(mu);

  // Drops finished operations from the front (they finish in stream order).
  void RetireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (!in_flight.empty()) {
      const InFlight& op = in_flight.front();
      const cudaError_t q = cudaEventQuery(op.done->get());
      if (q != cudaSuccess) {
        // A not-ready query leaves no error behind; any other error stays for the next check.
        if (q == cudaErrorNotReady) cudaGetLastError();
        return;
      }
      float ms = 0;
      if (cudaEventElapsedTime(&ms, op.start->get(), op.done->get()) != cudaSuccess) ms = 0;
      busy.Add(op.sequence, static_cast<int64_t>(ms * 1e6));
      completed_atomic.store(op.sequence, std::memory_order_release);
      in_flight.pop_front();
    }
  }

  // NCCL's asynchronous error, if any (a failed peer, a network error).
  absl::Status AsyncErrorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (comm == nullptr) return absl::OkStatus();
    ncclResult_t async = ncclSuccess;
    NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      return NcclErrorStatus(async, "ncclCommGetAsyncError", __FILE__, __LINE__);
    }
    return absl::OkStatus();
  }

  // In non-blocking mode a call may return before NCCL has taken it in; wait until it has.
  // The first operation with a peer connects to it and waits for it to arrive. `mu` is let go
  // between polls, so that Abort (the watchdog's, or a signal's) can end the wait.
  absl::Status WaitAcceptedLocked(absl::Duration timeout, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const absl::Time deadline = absl::Now() + timeout;
    for (int spins = 0;;) {
      if (aborted) {
        return absl::AbortedError(absl::StrCat("the communicator was aborted while waiting for ",
                                               what, ": ", abort_reason));
      }
      ncclResult_t state = ncclSuccess;
      NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state));
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) {
        return NcclErrorStatus(state, std::string(what).c_str(), __FILE__, __LINE__);
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "%s: %s still in progress after %s", id.Who(), what,
            absl::FormatDuration(timeout)));
      }
      mu.Unlock();
      if (++spins < 1000) {
        std::this_thread::yield();
      } else {
        absl::SleepFor(absl::Microseconds(100));
      }
      mu.Lock();
    }
  }
};

class NcclWork : public OpWork {
 public:
  NcclWork(std::shared_ptr<NcclState> state, OpInfo info, std::shared_ptr<CudaEvent> done,
           std::shared_ptr<TensorStash> stash)
      : OpWork(std::move(info)),
        state_(std::move(state)),
        done_(std::move(done)),
        stash_(std::move(stash)) {}
  const std::shared_ptr<TensorStash>& stash() const { return stash_; }

  absl::Status Wait(absl::Duration timeout) override {
    HostSync::Record("Work::Wait");
    const absl::Time deadline = absl::Now() + timeout;
    for (int i = 0;; ++i) {
      absl::StatusOr<bool> done = IsCompleted();
      if (!done.ok() || *done) return done.status();
      if (absl::Now() >= deadline) {
        absl::MutexLock lock(&state_->mu);
        return WaitTimeoutError(
            state_->id, info_, timeout,
            absl::StrFormat("the NCCL stream finished through #%d, %d operations in flight",
                            state_->completed_atomic.load(), state_->in_flight.size()));
      }
      if (i < 200) {
        std::this_thread::yield();
      } else {
        absl::SleepFor(absl::Microseconds(50));
      }
    }
  }

  absl::Status WaitOn(Stream& stream, absl::Duration) override {
    if (stream.device() != state_->id.device || stream.native() == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %s waited on a stream of %s; the NCCL communicator's work is on %s",
          state_->id.Who(), description(), stream.device().ToString(),
          state_->id.device.ToString()));
    }
    absl::MutexLock lock(&state_->mu);
    if (state_->aborted && info_.sequence > state_->completed_at_abort) {
      return OpAbortedError(state_->id, info_, state_->abort_reason);
    }
    CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.native()), done_->get(), 0));
    // Work on the compute stream, where the tensors are allocated, now runs after the
    // operation: the caching allocator's stream order keeps their memory for it.
    absl::StatusOr<Stream*> compute = Stream::Compute(state_->id.device);
    if (compute.ok() && *compute == &stream) stash_->Release();
    return absl::OkStatus();
  }

  absl::StatusOr<bool> IsCompleted() override {
    absl::MutexLock lock(&state_->mu);
    if (state_->aborted) {
      if (info_.sequence <= state_->completed_at_abort) return true;
      return OpAbortedError(state_->id, info_, state_->abort_reason);
    }
    const cudaError_t e = cudaEventQuery(done_->get());
    if (e == cudaSuccess) {
      state_->RetireLocked();
      return true;
    }
    if (e != cudaErrorNotReady) return CudaErrorStatus(e, "cudaEventQuery", __FILE__, __LINE__);
    cudaGetLastError();
    absl::Status async = state_->AsyncErrorLocked();
    if (!async.ok()) return OpFailedError(state_->id, description(), async);
    return false;
  }

 private:
  std::shared_ptr<NcclState> state_;
  std::shared_ptr<CudaEvent> done_;
  std::shared_ptr<TensorStash> stash_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclState> state, std::unique_ptr<Event> compute_ready,
                   Tensor barrier)
      : state_(std::move(state)),
        compute_ready_(std::move(compute_ready)),
        barrier_(std::move(barrier)) {
    // cudaFree waits for the whole device, and an operation in flight may wait for peers
    // that wait for this rank: the allocator lets the operations finish first.
    before_free_ = AddBeforeSystemFree(state_->id.device, [state = state_] {
      (void)SetCurrentDevice(state->id.device);
      const absl::Time deadline = absl::Now() + state->accept_timeout;
      for (;;) {
        {
          absl::MutexLock lock(&state->mu);
          state->RetireLocked();
          if (state->in_flight.empty() || state->aborted) return;
        }
        if (absl::Now() > deadline) return;
        absl::SleepFor(absl::Microseconds(100));
      }
    });
  }

  ~NcclCommunicator() override {
    RemoveBeforeSystemFree(before_free_);
    NcclState* s = state_.get();
    (void)SetCurrentDevice(s->id.device);  // the event queries below go to this rank's GPU
    absl::MutexLock lock(&s->mu);
    if (s->comm != nullptr && !s->aborted) {
      s->RetireLocked();
      absl::Status finalized;
      if (!s->in_flight.empty() || !s->AsyncErrorLocked().ok()) {
        // A rank leaving on an error, with operations unfinished or NCCL failed: abort at once,
        // as the MPI communicator does, rather than wait for peers that may be gone.
        finalized = absl::AbortedError("operations in flight");
      } else {
        // Let NCCL finish its own work (bounded), then free; abort what does not finish.
        const ncclResult_t r = ncclCommFinalize(s->comm);
        finalized = (r == ncclSuccess || r == ncclInProgress)
                        ? s->WaitAcceptedLocked(kFinalizeTimeout, "ncclCommFinalize")
                        : NcclErrorStatus(r, "ncclCommFinalize", __FILE__, __LINE__);
      }
      if (finalized.ok()) {
        ncclCommDestroy(s->comm);
      } else if (!s->aborted) {  // else Abort came during the wait and freed it
        ncclCommAbort(s->comm);
      }
      s->comm = nullptr;
    }
    s->in_flight.clear();
  }

  int rank() const override { return state_->id.rank; }
  int world_size() const override { return state_->id.world_size; }
  Device device() const override { return state_->id.device; }

  absl::StatusOr<std::unique_ptr<Work>> AllReduce(const Tensor& t,
                                                  const AllReduceOptions& options) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckAllReduce(state_->id, t, options.op));
    return Issue(info, {t}, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(t.raw(), t.raw(), t.numel(), NcclType(t.dtype()), NcclOp(options.op),
                           comm, stream);
    });
  }

  absl::StatusOr<std::unique_ptr<Work>> Broadcast(const Tensor& t,
                                                  const BroadcastOptions& options) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckBroadcast(state_->id, t, options.root));
    return Issue(info, {t}, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(t.raw(), t.raw(), t.numel(), NcclType(t.dtype()), options.root, comm,
                           stream);
    });
  }

  absl::StatusOr<std::unique_ptr<Work>> AllGather(const Tensor& out, const Tensor& in) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckAllGather(state_->id, out, in));
    return Issue(info, {out, in}, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(in.raw(), out.raw(), in.numel(), NcclType(in.dtype()), comm, stream);
    });
  }

  absl::StatusOr<std::unique_ptr<Work>> ReduceScatter(
      const Tensor& out, const Tensor& in, const ReduceScatterOptions& options) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckReduceScatter(state_->id, out, in, options.op));
    return Issue(info, {out, in}, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclReduceScatter(in.raw(), out.raw(), out.numel(), NcclType(in.dtype()),
                               NcclOp(options.op), comm, stream);
    });
  }

  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterParts(
      const Tensor& t, const std::vector<int64_t>& offsets, const Tensor& out) override {
    ASSIGN_OR_RETURN(OpInfo info,
                     CheckParts(state_->id, OpKind::kReduceScatterParts, t, offsets, out));
    const int me = state_->id.rank;
    return Issue(info, {t, out}, [&](ncclComm_t comm, cudaStream_t stream) {
      return EachPart(offsets, [&](int r, int64_t begin, int64_t count) {
        float* part = static_cast<float*>(t.raw()) + begin;
        // The root's receive buffer only is written; the others' is ignored.
        float* sum = r == me && out.defined() ? static_cast<float*>(out.raw()) : part;
        return ncclReduce(part, sum, count, ncclFloat32, ncclSum, r, comm, stream);
      });
    });
  }

  absl::StatusOr<std::unique_ptr<Work>> AllGatherParts(
      const Tensor& t, const std::vector<int64_t>& offsets) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckParts(state_->id, OpKind::kAllGatherParts, t, offsets));
    return Issue(info, {t}, [&](ncclComm_t comm, cudaStream_t stream) {
      return EachPart(offsets, [&](int r, int64_t begin, int64_t count) {
        float* part = static_cast<float*>(t.raw()) + begin;
        return ncclBroadcast(part, part, count, ncclFloat32, r, comm, stream);
      });
    });
  }

  absl::StatusOr<std::unique_ptr<Work>> Send(const Tensor& t, int peer) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckSend(state_->id, t, peer));
    return Issue(info, {t}, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclSend(t.raw(), t.numel(), NcclType(t.dtype()), peer, comm, stream);
    });
  }

  absl::StatusOr<std::unique_ptr<Work>> Recv(const Tensor& t, int peer) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckRecv(state_->id, t, peer));
    return Issue(info, {t}, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclRecv(t.raw(), t.numel(), NcclType(t.dtype()), peer, comm, stream);
    });
  }

  absl::StatusOr<std::unique_ptr<Work>> SendRecv(
      const std::vector<PeerTransfer>& transfers) override {
    ASSIGN_OR_RETURN(OpInfo info, CheckSendRecv(state_->id, transfers));
    std::vector<Tensor> tensors;
    for (const PeerTransfer& x : transfers) tensors.push_back(x.tensor);
    return Issue(info, std::move(tensors), [&](ncclComm_t comm, cudaStream_t stream) {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (const PeerTransfer& x : transfers) {
        const Tensor& t = x.tensor;
        r = x.kind == PeerTransfer::Kind::kSend
                ? ncclSend(t.raw(), t.numel(), NcclType(t.dtype()), x.peer, comm, stream)
                : ncclRecv(t.raw(), t.numel(), NcclType(t.dtype()), x.peer, comm, stream);
        if (r != ncclSuccess && r != ncclInProgress) {
          ncclGroupEnd();
          return r;
        }
      }
      return ncclGroupEnd();
    });
  }

  absl::StatusOr<std::unique_ptr<Work>> Barrier() override {
    // NCCL has no barrier: a one-element all-reduce has the same effect.
    const Tensor& t = barrier_;
    return Issue(BarrierInfo(), {t}, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(t.raw(), t.raw(), 1, ncclFloat32, ncclSum, comm, stream);
    });
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(
      int color, int key, const std::string& name, const std::vector<int>& members) override {
    NcclState* s = state_.get();
    if (color < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(s->id.Who(), ": split: color ", color, " is negative"));
    }
    RETURN_IF_ERROR(SetCurrentDevice(s->id.device));
    auto state = std::make_shared<NcclState>();
    state->accept_timeout = s->accept_timeout;
    ASSIGN_OR_RETURN(state->stream, Stream::Create(s->id.device));
    ASSIGN_OR_RETURN(std::unique_ptr<Event> compute_ready, Event::Create(s->id.device, false));
    ASSIGN_OR_RETURN(Tensor barrier, Tensor::Empty(Shape{1}, DType::kF32, s->id.device));
    ncclComm_t comm = nullptr;
    {
      // In this communicator's order: no operation may be issued to it meanwhile.
      absl::MutexLock issue_lock(&s->issue_mu);
      absl::MutexLock lock(&s->mu);
      if (s->aborted) return RefusedAfterAbortError(s->id, OpKind::kSplit, s->abort_reason);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t r = ncclCommSplit(s->comm, color, key, &comm, &config);
      if (r != ncclSuccess && r != ncclInProgress) {
        return NcclErrorStatus(r, "ncclCommSplit", __FILE__, __LINE__);
      }
      RETURN_IF_ERROR(s->WaitAcceptedLocked(s->accept_timeout, "ncclCommSplit"));
    }
    int rank = 0, size = 1;
    {
      absl::MutexLock lock(&state->mu);
      state->comm = comm;
      absl::Status joined = state->WaitAcceptedLocked(
          s->accept_timeout, absl::StrCat("the split of ", name, " (every rank joining it)"));
      if (joined.ok() && ncclCommUserRank(comm, &rank) != ncclSuccess) {
        joined = absl::InternalError("ncclCommUserRank failed after a split");
      }
      if (joined.ok() && ncclCommCount(comm, &size) != ncclSuccess) {
        joined = absl::InternalError("ncclCommCount failed after a split");
      }
      if (joined.ok()) {
        state->id = CommIdentity{rank, size, s->id.device, name,
                                 s->id.JobRank(), members};
        joined = CheckSplitMembers(s->id, state->id, members, /*made=*/nullptr);
      }
      if (!joined.ok()) {
        ncclCommAbort(comm);
        state->comm = nullptr;
        return joined;
      }
    }
    {
      absl::MutexLock lock(&s->mu);
      s->children.push_back(state);
    }
    return std::unique_ptr<Communicator>(
        new NcclCommunicator(std::move(state), std::move(compute_ready), std::move(barrier)));
  }

  const std::string& name() const override { return state_->id.group; }

  // Aborts `s` and every communicator split from it.
  static void AbortTree(NcclState* s, absl::string_view reason) {
    std::vector<std::shared_ptr<NcclState>> children;
    {
      absl::MutexLock lock(&s->mu);
      for (const auto& c : s->children) {
        if (auto child = c.lock()) children.push_back(std::move(child));
      }
      if (!s->aborted) {
        s->RetireLocked();
        s->aborted = true;
        s->abort_reason = std::string(reason);
        s->completed_at_abort = s->completed_atomic.load();
        if (s->comm != nullptr) ncclCommAbort(s->comm);
        s->comm = nullptr;
      }
    }
    for (const auto& c : children) AbortTree(c.get(), reason);
  }

  void Abort(absl::string_view reason) override {
    // The caller may be any thread (a watchdog, a signal's): queries go to this rank's GPU.
    (void)SetCurrentDevice(state_->id.device);
    AbortTree(state_.get(), reason);
  }

  uint64_t last_issued_sequence() const override {
    return state_->issued_atomic.load(std::memory_order_acquire);
  }
  uint64_t last_completed_sequence() const override {
    absl::MutexLock lock(&state_->mu);
    state_->RetireLocked();
    return state_->completed_atomic.load(std::memory_order_acquire);
  }
  // The finished operations' time on the communication stream, measured by their events.
  double busy_seconds() const override {
    absl::MutexLock lock(&state_->mu);
    state_->RetireLocked();
    return state_->busy.Seconds();
  }
  double busy_seconds_through(uint64_t sequence) const override {
    absl::MutexLock lock(&state_->mu);
    state_->RetireLocked();
    return state_->busy.SecondsThrough(sequence);
  }

 private:
  // Enqueues `call` after the compute stream's work so far, records its completion event.
  template <typename Call>
  absl::StatusOr<std::unique_ptr<Work>> Issue(OpInfo info, std::vector<Tensor> tensors,
                                              Call call) {
    NcclState* s = state_.get();
    RETURN_IF_ERROR(SetCurrentDevice(s->id.device));
    ASSIGN_OR_RETURN(std::shared_ptr<CudaEvent> start, CudaEvent::Create());
    ASSIGN_OR_RETURN(std::shared_ptr<CudaEvent> done, CudaEvent::Create());
    ASSIGN_OR_RETURN(Stream * compute, Stream::Compute(s->id.device));
    absl::MutexLock issue_lock(&s->issue_mu);
    absl::MutexLock lock(&s->mu);
    if (s->aborted) return RefusedAfterAbortError(s->id, info.kind, s->abort_reason);
    info.sequence = s->issued_atomic.load(std::memory_order_relaxed) + 1;
    s->issued_atomic.store(info.sequence, std::memory_order_release);
    const OpKind kind = info.kind;
    auto work = std::make_unique<NcclWork>(state_, std::move(info), done,
                                           std::make_shared<TensorStash>(tensors));
    const std::string& what = work->description();
    auto fail = [&](const absl::Status& e) { return OpFailedError(s->id, what, e); };
    absl::Status st = compute_ready_->Record(*compute);
    if (st.ok()) st = compute_ready_->MakeStreamWait(*s->stream);
    if (!st.ok()) return fail(st);
    const cudaStream_t comm_stream = static_cast<cudaStream_t>(s->stream->native());
    if (const cudaError_t e = cudaEventRecord(start->get(), comm_stream); e != cudaSuccess) {
      return fail(CudaErrorStatus(e, "cudaEventRecord", __FILE__, __LINE__));
    }
    const ncclResult_t r =
        call(s->comm, static_cast<cudaStream_t>(s->stream->native()));
    // From here NCCL may hold the operation: a failure keeps its tensors allocated.
    auto fail_held = [&](const absl::Status& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
      for (Tensor& t : tensors) s->abandoned.push_back(std::move(t));
      return fail(e);
    };
    if (r != ncclSuccess && r != ncclInProgress) {
      return fail_held(NcclErrorStatus(r, OpKindName(kind), __FILE__, __LINE__));
    }
    st = s->WaitAcceptedLocked(s->accept_timeout, what);
    if (!st.ok()) return fail_held(st);
    const cudaError_t e =
        cudaEventRecord(done->get(), static_cast<cudaStream_t>(s->stream->native()));
    if (e != cudaSuccess) {
      return fail_held(CudaErrorStatus(e, "cudaEventRecord", __FILE__, __LINE__));
    }
    s->in_flight.push_back(
        InFlight{work->sequence(), std::move(start), std::move(done), work->stash()});
    s->RetireLocked();
    return std::unique_ptr<Work>(std::move(work));
  }

  std::shared_ptr<NcclState> state_;
  std::unique_ptr<Event> compute_ready_;  // recorded on the compute stream before each op
  const Tensor barrier_;                  // one f32 on the device, for Barrier
  int before_free_ = 0;                   // AddBeforeSystemFree's id
};

absl::Status CheckOptions(const NcclCommunicatorOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "NCCL communicator: rank %d outside a world of %d", o.rank, o.world_size));
  }
  if (!o.device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", o.rank,
                                                   ": NCCL communicator needs a CUDA device, "
                                                   "not ", o.device.ToString()));
  }
  if (o.world_size > 1 && o.store == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", o.rank, ": NCCL communicator of ", o.world_size,
        " ranks needs a key-value store to share the unique id"));
  }
  if (o.init_timeout <= absl::ZeroDuration() || o.accept_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "NCCL communicator: init_timeout and accept_timeout must be positive");
  }
  return absl::OkStatus();
}

// Rank 0 makes the unique id and publishes it; the others wait for it.
absl::StatusOr<ncclUniqueId> ShareUniqueId(const NcclCommunicatorOptions& o) {
  ncclUniqueId id;
  if (o.rank == 0) {
    NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    if (o.store != nullptr) {
      RETURN_IF_ERROR(o.store->Set(o.key, absl::string_view(id.internal, sizeof(id.internal))));
    }
    return id;
  }
  ASSIGN_OR_RETURN(std::string bytes, o.store->Wait(o.key, o.init_timeout));
  if (bytes.size() != sizeof(id.internal)) {
    return absl::DataLossError(absl::StrFormat(
        "rank %d: the NCCL unique id under '%s' has %d bytes, expected %d", o.rank, o.key,
        bytes.size(), sizeof(id.internal)));
  }
  std::memcpy(id.internal, bytes.data(), bytes.size());
  return id;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const NcclCommunicatorOptions& o) {
  RETURN_IF_ERROR(CheckOptions(o));
  std::string why;
  const int devices = CudaDeviceCount(&why);
  if (devices <= o.device.index()) {
    return absl::UnavailableError(absl::StrFormat(
        "rank %d: NCCL communicator on %s: %s", o.rank, o.device.ToString(),
        devices == 0 ? why : absl::StrCat("only ", devices, " CUDA devices visible")));
  }
  RETURN_IF_ERROR(SetCurrentDevice(o.device));
  ASSIGN_OR_RETURN(ncclUniqueId id, ShareUniqueId(o));
  auto state = std::make_shared<NcclState>();
  state->id = CommIdentity{o.rank, o.world_size, o.device};
  state->accept_timeout = o.accept_timeout;
  ASSIGN_OR_RETURN(state->stream, Stream::Create(o.device));
  ASSIGN_OR_RETURN(std::unique_ptr<Event> compute_ready, Event::Create(o.device, false));
  ASSIGN_OR_RETURN(Tensor barrier, Tensor::Empty(Shape{1}, DType::kF32, o.device));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing rank ends in a timeout, not a hang
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, o.world_size, id, o.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    return NcclErrorStatus(r, "ncclCommInitRankConfig", __FILE__, __LINE__);
  }
  {
    absl::MutexLock lock(&state->mu);
    state->comm = comm;
    absl::Status s = state->WaitAcceptedLocked(
        o.init_timeout, absl::StrFormat("NCCL initialization (waiting for all %d ranks to "
                                        "join with the unique id under '%s')",
                                        o.world_size, o.key));
    if (!s.ok()) {
      ncclCommAbort(comm);
      state->comm = nullptr;
      return s;
    }
  }
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(std::move(state), std::move(compute_ready), std::move(barrier)));
}

}  // namespace tandem

#else  // !TANDEM_CUDA

namespace tandem {

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const NcclCommunicatorOptions& options) {
  return absl::UnavailableError(absl::StrCat(
      "rank ", options.rank, ": NCCL communicator requested, but this build has no CUDA"));
}

}  // namespace tandem

#endif  // TANDEM_CUDA
