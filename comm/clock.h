// Time as the coordinator's watchdog sees it, behind an interface (after leveldb's Env) so
// tests can move it by hand instead of sleeping. Waits with a timeout use real time.
#ifndef TANDEM_COMM_CLOCK_H_
#define TANDEM_COMM_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  // The system clock; lives for the whole process.
  static Clock* Real();
};

// A clock that moves only when told to. Thread-safe.
class ManualClock : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

inline Clock* Clock::Real() {
  class RealClock : public Clock {
   public:
    absl::Time Now() override { return absl::Now(); }
  };
  static RealClock* clock = new RealClock;
  return clock;
}

}  // namespace tandem

#endif  // TANDEM_COMM_CLOCK_H_
