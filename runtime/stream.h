// Streams and events: ordered queues of device work and markers in them.
// On CUDA they wrap cudaStream_t / cudaEvent_t. On the CPU work runs at the moment it is
// issued ("ordered-immediate"), so a stream is always idle, an event is complete as soon as
// it is recorded, and its timestamp is the host clock at that moment: the code above is the
// same for both devices and CPU timing through events is real.
#ifndef TANDEM_RUNTIME_STREAM_H_
#define TANDEM_RUNTIME_STREAM_H_

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device.h"

namespace tandem {

class Stream {
 public:
  // A new stream on `d` that does not synchronize with the legacy default stream.
  static absl::StatusOr<std::unique_ptr<Stream>> Create(Device d);
  // The device's compute stream, made on first use and kept for the process lifetime.
  static absl::StatusOr<Stream*> Compute(Device d);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device device() const { return device_; }
  // The cudaStream_t (as void*), or nullptr on the CPU.
  void* native() const { return native_; }
  // Blocks until all work issued to the stream has finished.
  absl::Status Synchronize();

 private:
  Stream(Device d, void* native) : device_(d), native_(native) {}
  Device device_;
  void* native_;
};

class Event {
 public:
  // `timing` events can measure elapsed time (slightly costlier on CUDA).
  static absl::StatusOr<std::unique_ptr<Event>> Create(Device d, bool timing = true);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Marks the current end of `stream`'s work.
  absl::Status Record(Stream& stream);
  // Makes later work on `stream` wait until this event has completed (no host blocking).
  absl::Status MakeStreamWait(Stream& stream);
  // Blocks the host until the event has completed.
  absl::Status Synchronize();
  // True once the recorded work has finished.
  absl::StatusOr<bool> Query();
  // Milliseconds from `start` to this event; both recorded and complete.
  absl::StatusOr<float> ElapsedMsSince(const Event& start) const;

 private:
  Event(Device d, void* native) : device_(d), native_(native) {}
  Device device_;
  void* native_;
  bool recorded_ = false;
  std::chrono::steady_clock::time_point cpu_time_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_STREAM_H_
