// Doorbells: one counter per process of a job on this host, in memory those processes share,
// that a waiting communication thread sleeps on (a futex) and a peer rings when it may have
// given that thread something to do: posted a transfer to it, or finished one with it.
//
// Open MPI's shared-memory transport has no blocking wait: a thread waiting for a transfer
// must poll. Polled on a short timer, every waiting rank costs the host a wake-up each few
// tens of microseconds, which on a host with more ranks than cores is time taken from the
// compute streams; polled on a long timer, each transfer is noticed late. With doorbells
// the wait sleeps until a peer rings (or a long timer, in case a step of a transfer came
// without a ring), so waiting costs next to nothing and a transfer is noticed at once.
// Ranks on other hosts have no bell: a wait on one of them polls on the short timer.
#ifndef TANDEM_COMM_DOORBELLS_H_
#define TANDEM_COMM_DOORBELLS_H_

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace tandem {

class Doorbells {
 public:
  // Collective over `comm` (every rank calls it, from one thread). Null where any rank of
  // `comm` could not map its host's shared memory or was not `enabled`: then no rank uses
  // doorbells.
  static std::unique_ptr<Doorbells> Create(MPI_Comm comm, bool enabled = true);
  // Whether this process asks for doorbells: yes unless TANDEM_MPI_DOORBELLS=off (every wait
  // then polls on the short timer, as it does for a rank on another host).
  static bool Wanted();
  ~Doorbells();
  Doorbells(const Doorbells&) = delete;
  Doorbells& operator=(const Doorbells&) = delete;

  // Whether rank `r` of the communicator given to Create has a bell here (is on this host).
  bool Reaches(int r) const { return r >= 0 && r < static_cast<int>(bells_.size()) && bells_[r]; }
  // Wakes rank r's waiting threads (those in Wait now, and a Wait about to sleep on a count
  // taken before the ring). r must be reachable. Costs a system call only while a thread
  // sleeps on that bell: the communication thread rings its own after every operation.
  void Ring(int r) const;
  // This rank's count: take it before looking for work, then Wait on it.
  uint32_t Count() const { return own_->count.load(std::memory_order_acquire); }
  // Sleeps until this rank's count is no longer `seen` (a ring), or `timeout` passed.
  void Wait(uint32_t seen, std::chrono::microseconds timeout) const;

 private:
  // One rank's bell: the count its waits sleep on, and how many threads sleep on it now (so
  // that a ring with no one to wake skips the futex call).
  struct Bell {
    std::atomic<uint32_t> count;
    std::atomic<uint32_t> sleepers;
  };
  Doorbells() = default;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<Bell*> bells_;  // by rank; null for a rank on another host
  Bell* own_ = nullptr;
};

}  // namespace tandem

#endif  // TANDEM_COMM_DOORBELLS_H_
