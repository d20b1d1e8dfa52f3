// Streams and events: ordered queues of device work and markers in them, with CUDA's
// semantics on every device. On CUDA they wrap cudaStream_t / cudaEvent_t. On the CPU an
// asynchronous stream is a queue that its own thread executes in order (after XLA's host
// streams): an op is queued and returns at once, an event is a marker the thread passes, a
// stream waits for another's event on its own thread, and the host blocks only when it
// synchronizes. So the CPU path runs the orderings a GPU depends on (the communication stream
// after the backward that produced a bucket, a forward after the receive it reads, memory
// reused only after the work that used it), and CPU timing through events is the stream
// thread's own clock.
//
// A CPU stream may instead be "immediate": work runs on the calling thread when issued (the
// stream is always idle). TANDEM_CPU_STREAMS=immediate|async picks the mode of the streams a
// process makes; TANDEM_CPU_STREAM_JITTER_US=N (tests only) makes every asynchronous CPU
// stream's thread sleep a random 0..N us before each item of work, from a fixed seed per
// stream, so that a missing event shows up as a wrong result.
#ifndef TANDEM_RUNTIME_STREAM_H_
#define TANDEM_RUNTIME_STREAM_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device.h"

namespace tandem {

namespace internal {
struct CpuQueue;  // a CPU stream's queue and thread (stream.cc)
struct CpuMark;   // where a CPU event was recorded
}  // namespace internal

enum class CpuStreamMode { kImmediate, kAsync };
const char* CpuStreamModeName(CpuStreamMode mode);  // "immediate", "async"
// The mode of the CPU streams this process makes: TANDEM_CPU_STREAMS, else asynchronous (the
// default measured against immediate in BENCHMARKS.md: no slower, and it proves the ordering).
CpuStreamMode DefaultCpuStreamMode();

// The steady clock's reading that every trace timestamp counts from (the profiler's epoch).
std::chrono::steady_clock::time_point TimeOrigin();
// TimeOrigin() in microseconds of the steady clock's epoch: added to a time since
// TimeOrigin(), it puts it on the host's monotonic clock, which the host's processes share.
double TimeOriginMicros();

class Stream {
 public:
  // A new stream on `d` that does not synchronize with the legacy default stream; on the CPU,
  // in DefaultCpuStreamMode().
  static absl::StatusOr<std::unique_ptr<Stream>> Create(Device d);
  // A new CPU stream in `mode` (tests and benchmarks compare the modes in one process).
  static std::unique_ptr<Stream> CreateCpu(CpuStreamMode mode);
  // The device's compute stream, made on first use and kept for the process lifetime.
  static absl::StatusOr<Stream*> Compute(Device d);
  // Finishes the stream's work first.
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device device() const { return device_; }
  // The cudaStream_t (as void*), or nullptr on the CPU.
  void* native() const { return native_; }
  // True for a CPU stream whose work runs on its own thread.
  bool async() const;

  // CPU streams only: runs `work` in stream order: queued for the stream's thread, or run now
  // on an immediate stream (whose work's error is then this call's). As on CUDA, an error of
  // earlier work that the host has not been told of yet is returned instead (and `work` is not
  // run); on an asynchronous stream an error `work` returns is the stream's, returned by the
  // next Launch or synchronization on the host, and the work queued before the host learned
  // of it is skipped.
  absl::Status Launch(std::function<absl::Status()> work);
  // Blocks the host until all work issued to the stream has finished (a host
  // synchronization); returns the stream's error, if any.
  absl::Status Synchronize();

 private:
  friend class Event;
  Stream(Device d, void* native, std::shared_ptr<internal::CpuQueue> queue)
      : device_(d), native_(native), queue_(std::move(queue)) {}
  Device device_;
  void* native_;
  std::shared_ptr<internal::CpuQueue> queue_;  // CPU streams
};

class Event {
 public:
  // `timing` events can measure elapsed time (slightly costlier on CUDA; on the CPU a timing
  // event is an item of the stream's work that reads the clock, the others are a position in
  // the queue).
  static absl::StatusOr<std::unique_ptr<Event>> Create(Device d, bool timing = true);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Marks the current end of `stream`'s work (cudaEventRecord); recording again moves it.
  // Recorded by an item of a CPU stream's own work, it marks that item.
  absl::Status Record(Stream& stream);
  // Makes work issued to `stream` after this call wait until the event has completed, without
  // blocking the host (cudaStreamWaitEvent). An event never recorded is complete.
  absl::Status MakeStreamWait(Stream& stream);
  // Blocks the host until the event has completed (cudaEventSynchronize; a host
  // synchronization); returns the error of the recording stream's work, if any (which the
  // stream still reports to its own next Launch or synchronization).
  absl::Status Synchronize();
  // True once the recorded work has finished (cudaEventQuery); never blocks.
  absl::StatusOr<bool> Query();
  // Milliseconds from `start` to this event (cudaEventElapsedTime): both timing events,
  // recorded and complete, else FailedPrecondition.
  absl::StatusOr<float> ElapsedMsSince(const Event& start) const;
  // Microseconds from TimeOrigin() to the moment the stream reached this event (a timing
  // event, recorded and complete). On CUDA measured from an anchor event recorded on the
  // device's idle compute stream the first time it is asked.
  absl::StatusOr<double> MicrosSinceOrigin() const;
  bool recorded() const { return recorded_; }

 private:
  Event(Device d, void* native, bool timing) : device_(d), native_(native), timing_(timing) {}
  absl::Status CheckElapsed(const Event& start) const;
  Device device_;
  void* native_;
  bool timing_;
  bool recorded_ = false;
  std::shared_ptr<internal::CpuMark> mark_;  // CPU: where it was last recorded
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_STREAM_H_
