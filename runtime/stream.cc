#include "runtime/stream.h"

#include <atomic>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "runtime/host_sync.h"
#include "runtime/status.h"

#if TANDEM_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_status.h"
#endif

namespace tandem {
namespace internal {

struct CpuQueue;

// The queue whose work the calling thread is running, and that work's ticket (a CPU stream's
// own thread, inside an item of work).
thread_local const CpuQueue* t_running_queue = nullptr;
thread_local uint64_t t_running_ticket = 0;

// A CPU stream: its work in issue order, each item numbered by a ticket (1, 2, ...), and, for
// an asynchronous stream, the thread that runs them. An item is done once `completed` has
// reached its ticket, so a position in the queue (an event) is a ticket.
struct CpuQueue {
  CpuQueue(bool async, int jitter_us, uint64_t seed)
      : async(async), jitter_us(jitter_us), seed(seed) {
    if (async) thread = std::thread([this] { Run(); });
  }

  ~CpuQueue() { Stop(); }

  // Lets the thread finish the queued work, then ends it. The queue may live on afterwards
  // (events recorded on it keep it), with everything run.
  void Stop() {
    if (!thread.joinable() || thread.get_id() == std::this_thread::get_id()) return;
    {
      absl::MutexLock lock(&mu);
      stopping = true;
    }
    thread.join();
  }

  // The error the host has not been told of yet (and from now on it has: the work queued
  // until now, issued without knowing, is skipped).
  absl::Status TakeErrorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    absl::Status e = std::move(error);
    error = absl::OkStatus();
    if (failed_unreported) {
      failed_unreported = false;
      skip_through = enqueued;
    }
    return e;
  }

  // Blocks until the work through `ticket` has run.
  void WaitFor(uint64_t ticket) {
    if (completed.load(std::memory_order_acquire) >= ticket) return;
    absl::MutexLock lock(&mu);
    auto done = [this, ticket]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return completed.load(std::memory_order_relaxed) >= ticket;
    };
    mu.Await(absl::Condition(&done));
  }

  bool Passed(uint64_t ticket) const {
    return completed.load(std::memory_order_acquire) >= ticket;
  }

  // Queues `work` (or, on an immediate stream, runs it now).
  absl::Status Launch(std::function<absl::Status()> work) {
    if (!async) {
      {
        absl::MutexLock lock(&mu);
        if (!error.ok() || failed_unreported) return TakeErrorLocked();
        ++enqueued;
      }
      absl::Status s = work();
      absl::MutexLock lock(&mu);
      completed.fetch_add(1, std::memory_order_acq_rel);
      return s;
    }
    absl::MutexLock lock(&mu);
    if (!error.ok() || failed_unreported) return TakeErrorLocked();
    ++enqueued;
    tasks.push_back(std::move(work));
    return absl::OkStatus();
  }

  // The ticket of the last item issued so far.
  uint64_t Tail() const { return enqueued.load(std::memory_order_acquire); }

  void Run() {
    DeviceThreadScope device_thread;
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> jitter(0, std::max(jitter_us, 0));
    auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return !tasks.empty() || stopping;
    };
    for (;;) {
      std::function<absl::Status()> work;
      uint64_t ticket;
      bool skip;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(&ready));
        if (tasks.empty()) return;  // stopping, and nothing left
        work = std::move(tasks.front());
        tasks.pop_front();
        ticket = completed.load(std::memory_order_relaxed) + 1;
        skip = failed_unreported || ticket <= skip_through;
      }
      if (jitter_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(jitter(rng)));
      t_running_queue = this;
      t_running_ticket = ticket;
      absl::Status s = skip ? absl::OkStatus() : work();
      work = nullptr;
      t_running_queue = nullptr;
      absl::MutexLock lock(&mu);
      if (!s.ok() && !failed_unreported) {
        error = std::move(s);
        failed_unreported = true;
      }
      completed.store(ticket, std::memory_order_release);
    }
  }

  const bool async;
  const int jitter_us;
  const uint64_t seed;
  absl::Mutex mu;
  std::deque<std::function<absl::Status()>> tasks ABSL_GUARDED_BY(mu);
  // Written under `mu`; read without it by Tail(), which every event recorded by the host
  // calls (a communicator's operation records one each).
  std::atomic<uint64_t> enqueued{0};
  std::atomic<uint64_t> completed{0};  // written under `mu`
  absl::Status error ABSL_GUARDED_BY(mu);
  bool failed_unreported ABSL_GUARDED_BY(mu) = false;
  uint64_t skip_through ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::thread thread;
};

// A recorded CPU event: the ticket of the queue position it marks and, for a timing event,
// the steady clock's reading when the stream's thread reached it.
// The clock reading is held apart, so that the item of work writing it keeps no queue alive.
struct CpuMark {
  std::shared_ptr<CpuQueue> queue;  // null: complete when recorded (an immediate stream)
  uint64_t ticket = 0;
  std::shared_ptr<std::atomic<int64_t>> stamp_ns =  // since TimeOrigin(); -1 until reached
      std::make_shared<std::atomic<int64_t>>(-1);
  bool Complete() const { return queue == nullptr || queue->Passed(ticket); }
  int64_t stamp() const { return stamp_ns->load(std::memory_order_acquire); }
};

}  // namespace internal

namespace {

using internal::CpuMark;
using internal::CpuQueue;

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
}

std::shared_ptr<CpuQueue> NewCpuQueue(CpuStreamMode mode) {
  static std::atomic<uint64_t> streams{0};
  const uint64_t index = streams.fetch_add(1) + 1;
  return std::make_shared<CpuQueue>(mode == CpuStreamMode::kAsync,
                                    EnvInt("TANDEM_CPU_STREAM_JITTER_US"),
                                    index * 0x9e3779b97f4a7c15ull);
}

int64_t NanosSinceOrigin() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              TimeOrigin())
      .count();
}

}  // namespace

const char* CpuStreamModeName(CpuStreamMode mode) {
  return mode == CpuStreamMode::kAsync ? "async" : "immediate";
}

CpuStreamMode DefaultCpuStreamMode() {
  const char* v = std::getenv("TANDEM_CPU_STREAMS");
  if (v != nullptr && std::string(v) == "immediate") return CpuStreamMode::kImmediate;
  return CpuStreamMode::kAsync;
}

std::chrono::steady_clock::time_point TimeOrigin() {
  static const auto origin = std::chrono::steady_clock::now();
  return origin;
}

double TimeOriginMicros() {
  return std::chrono::duration<double, std::micro>(TimeOrigin().time_since_epoch()).count();
}

absl::StatusOr<std::unique_ptr<Stream>> Stream::Create(Device d) {
  if (d.is_cpu()) return CreateCpu(DefaultCpuStreamMode());
#if TANDEM_CUDA
  RETURN_IF_ERROR(SetCurrentDevice(d));
  cudaStream_t s;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return std::unique_ptr<Stream>(new Stream(d, s, nullptr));
#else
  return NoCudaBackendError(d);
#endif
}

std::unique_ptr<Stream> Stream::CreateCpu(CpuStreamMode mode) {
  (void)TimeOrigin();  // fixed before any timestamp
  return std::unique_ptr<Stream>(new Stream(Device::Cpu(), nullptr, NewCpuQueue(mode)));
}

absl::StatusOr<Stream*> Stream::Compute(Device d) {
  static std::mutex mu;
  static auto* streams = new std::map<std::pair<int, int>, Stream*>();
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(static_cast<int>(d.type()), d.index());
  auto it = streams->find(key);
  if (it != streams->end()) return it->second;
  // Kept for the process lifetime (never destroyed: a CPU stream's thread may still be
  // waiting for work when the process exits).
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> s, Create(d));
  Stream* raw = s.release();
  (*streams)[key] = raw;
  return raw;
}

Stream::~Stream() {
#if TANDEM_CUDA
  if (native_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(native_));
    cudaStreamDestroy(static_cast<cudaStream_t>(native_));
  }
#endif
  if (queue_ != nullptr) queue_->Stop();  // after the queued work
}

bool Stream::async() const { return queue_ != nullptr && queue_->async; }

absl::Status Stream::Launch(std::function<absl::Status()> work) {
  if (queue_ == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("Launch of host work on a stream of ", device_.ToString()));
  }
  return queue_->Launch(std::move(work));
}

absl::Status Stream::Synchronize() {
  HostSync::Record("Stream::Synchronize");
  if (queue_ != nullptr) {
    queue_->WaitFor(queue_->Tail());
    absl::MutexLock lock(&queue_->mu);
    return queue_->TakeErrorLocked();
  }
#if TANDEM_CUDA
  if (native_) CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(native_)));
#endif
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Event>> Event::Create(Device d, bool timing) {
  if (d.is_cpu()) return std::unique_ptr<Event>(new Event(d, nullptr, timing));
#if TANDEM_CUDA
  RETURN_IF_ERROR(SetCurrentDevice(d));
  cudaEvent_t e;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, timing ? 0 : cudaEventDisableTiming));
  return std::unique_ptr<Event>(new Event(d, e, timing));
#else
  return NoCudaBackendError(d);
#endif
}

Event::~Event() {
#if TANDEM_CUDA
  if (native_) cudaEventDestroy(static_cast<cudaEvent_t>(native_));
#endif
}

absl::Status Event::Record(Stream& stream) {
  if (stream.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat("event on ", device_.ToString(),
                                                   " recorded on a stream of ",
                                                   stream.device().ToString()));
  }
  recorded_ = true;
  if (stream.queue_ != nullptr) {
    auto mark = std::make_shared<CpuMark>();
    CpuQueue* q = stream.queue_.get();
    if (internal::t_running_queue == q) {
      // Recorded by the stream's own work (memory an op frees as it runs): the stream's
      // position is that work, not the end of what the host queued after it.
      mark->queue = stream.queue_;
      mark->ticket = internal::t_running_ticket;
      mark->stamp_ns->store(NanosSinceOrigin());
    } else if (!q->async) {
      // Everything issued so far has run.
      mark->stamp_ns->store(NanosSinceOrigin());
    } else if (timing_) {
      // An item of the stream's work that reads the clock when the thread reaches it.
      mark->queue = stream.queue_;
      absl::MutexLock lock(&q->mu);
      mark->ticket = ++q->enqueued;
      q->tasks.push_back([stamp = mark->stamp_ns]() {
        stamp->store(NanosSinceOrigin(), std::memory_order_release);
        return absl::OkStatus();
      });
    } else {
      mark->queue = stream.queue_;
      mark->ticket = q->Tail();
    }
    mark_ = std::move(mark);
    return absl::OkStatus();
  }
#if TANDEM_CUDA
  if (native_) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(native_),
                                         static_cast<cudaStream_t>(stream.native())));
  }
#endif
  return absl::OkStatus();
}

absl::Status Event::MakeStreamWait(Stream& stream) {
  if (stream.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat("stream of ", stream.device().ToString(),
                                                   " made to wait for an event on ",
                                                   device_.ToString()));
  }
  if (stream.queue_ != nullptr) {
    std::shared_ptr<CpuMark> mark = mark_;
    if (mark == nullptr || mark->Complete() || mark->queue == stream.queue_) {
      return absl::OkStatus();  // nothing to wait for, or the stream's own order
    }
    if (!stream.queue_->async) {
      mark->queue->WaitFor(mark->ticket);  // an immediate stream's work runs on this thread
      return absl::OkStatus();
    }
    return stream.Launch([mark]() {
      mark->queue->WaitFor(mark->ticket);
      return absl::OkStatus();
    });
  }
#if TANDEM_CUDA
  if (native_ && stream.native()) {
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.native()),
                                             static_cast<cudaEvent_t>(native_), 0));
  }
#endif
  return absl::OkStatus();
}

absl::Status Event::Synchronize() {
  HostSync::Record("Event::Synchronize");
  if (device_.is_cpu()) {
    std::shared_ptr<CpuMark> mark = mark_;
    if (mark == nullptr || mark->queue == nullptr) return absl::OkStatus();
    mark->queue->WaitFor(mark->ticket);
    // Told, not taken: the stream's own user hears of it too (its next Launch or
    // synchronization), as with CUDA's sticky errors.
    absl::MutexLock lock(&mark->queue->mu);
    return mark->queue->error;
  }
#if TANDEM_CUDA
  if (native_) CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(native_)));
#endif
  return absl::OkStatus();
}

absl::StatusOr<bool> Event::Query() {
  if (device_.is_cpu()) return mark_ == nullptr || mark_->Complete();
#if TANDEM_CUDA
  if (native_) {
    cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(native_));
    if (e == cudaErrorNotReady) {
      // Not an error, but the runtime records it as the thread's last one, where the next
      // kernel launch's check would find it; cleared as PyTorch's CUDAEvent::query does.
      (void)cudaGetLastError();
      return false;
    }
    CUDA_RETURN_IF_ERROR(e);
  }
#endif
  return true;
}

absl::Status Event::CheckElapsed(const Event& start) const {
  if (!recorded_ || !start.recorded_) {
    return absl::FailedPreconditionError("elapsed time asked of an event never recorded");
  }
  if (!timing_ || !start.timing_) {
    return absl::FailedPreconditionError("elapsed time asked of an event made without timing");
  }
  if (device_.is_cpu()) {
    for (const Event* e : {&start, this}) {
      if (!e->mark_->Complete() || e->mark_->stamp() < 0) {
        return absl::FailedPreconditionError(
            "elapsed time asked of an event not yet complete (synchronize first)");
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<float> Event::ElapsedMsSince(const Event& start) const {
  RETURN_IF_ERROR(CheckElapsed(start));
#if TANDEM_CUDA
  if (native_) {
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.native_),
                                              static_cast<cudaEvent_t>(native_)));
    return ms;
  }
#endif
  return static_cast<float>((mark_->stamp() - start.mark_->stamp()) * 1e-6);
}

absl::StatusOr<double> Event::MicrosSinceOrigin() const {
  RETURN_IF_ERROR(CheckElapsed(*this));
  if (device_.is_cpu()) return mark_->stamp() * 1e-3;
#if TANDEM_CUDA
  // The anchor: an event recorded on the device's compute stream once it is idle, at a host
  // time read right after it completed.
  struct Anchor {
    std::unique_ptr<Event> event;
    double micros = 0;
  };
  static std::mutex mu;
  static auto* anchors = new std::map<int, Anchor>();
  std::lock_guard<std::mutex> lock(mu);
  Anchor& a = (*anchors)[device_.index()];
  if (a.event == nullptr) {
    ExpectedHostSync once;
    ASSIGN_OR_RETURN(Stream * s, Stream::Compute(device_));
    RETURN_IF_ERROR(s->Synchronize());
    ASSIGN_OR_RETURN(a.event, Event::Create(device_, true));
    RETURN_IF_ERROR(a.event->Record(*s));
    RETURN_IF_ERROR(a.event->Synchronize());
    a.micros = NanosSinceOrigin() * 1e-3;
  }
  ASSIGN_OR_RETURN(float ms, ElapsedMsSince(*a.event));
  return a.micros + ms * 1e3;
#else
  return absl::UnimplementedError("MicrosSinceOrigin of a CUDA event in a build without CUDA");
#endif
}

}  // namespace tandem
