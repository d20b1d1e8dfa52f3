// Host synchronizations: the moments a host thread blocks until device work has finished (a
// stream or event synchronize, a device-to-host read, a host wait on communication). On a GPU
// each one leaves the device idle while the host catches up: the classic ".item() in the
// training loop" stall. The runtime counts them, so that a training step can report its count
// and tests can hold every strategy to one per read of the loss.
#ifndef TANDEM_RUNTIME_HOST_SYNC_H_
#define TANDEM_RUNTIME_HOST_SYNC_H_

#include <cstdint>

namespace tandem {

class HostSync {
 public:
  // Called by every blocking call of the runtime and the communicators before it blocks;
  // `what` names the call ("Stream::Synchronize"). Not counted on a device's own threads (a
  // CPU stream's, a communicator's), whose waits are the devices' ordering, not the host's.
  static void Record(const char* what);
  // The host synchronizations this process made so far, and of those the ones outside an
  // ExpectedHostSync scope.
  static int64_t Count();
  static int64_t UnexpectedCount();
  // With debugging on (--debug-syncs), every host synchronization outside an
  // ExpectedHostSync scope prints where it came from (a stack trace) to stderr, like
  // torch.cuda.set_sync_debug_mode("warn").
  static void SetDebug(bool on);
  static bool debug();
};

// The host synchronizations a caller means to make (reading a step's loss for the progress
// line, writing a checkpoint): counted, but never reported as unexpected. Scopes nest.
class ExpectedHostSync {
 public:
  ExpectedHostSync();
  ~ExpectedHostSync();
  ExpectedHostSync(const ExpectedHostSync&) = delete;
  ExpectedHostSync& operator=(const ExpectedHostSync&) = delete;
};

// Marks the calling thread, for as long as the scope lives, as a device's own thread: a CPU
// stream's or a communicator's. Its waits are not host synchronizations, and memory it
// allocates is for immediate use (allocator.h).
class DeviceThreadScope {
 public:
  DeviceThreadScope();
  ~DeviceThreadScope();
  DeviceThreadScope(const DeviceThreadScope&) = delete;
  DeviceThreadScope& operator=(const DeviceThreadScope&) = delete;
};

// True on a thread inside a DeviceThreadScope.
bool OnDeviceThread();

}  // namespace tandem

#endif  // TANDEM_RUNTIME_HOST_SYNC_H_
