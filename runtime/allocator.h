// Device memory with statistics. One CachingAllocator design serves every device (after
// PyTorch's CUDA caching allocator): freed blocks are kept by size and handed out again, so
// steady-state training makes no system allocations; EmptyCache() returns them. Only the
// system memory underneath differs: aligned host memory, page-locked host memory, or
// cudaMalloc (never managed memory).
//
// It is stream-aware, as the host frees memory while work queued on streams may still use
// it. Each block belongs to the stream it was allocated for; once freed it is handed out again
// at once for work on that stream (which runs after the work queued before the free), and for
// anything else only after the work queued before the free has run, on its own stream and on
// every stream it was recorded on (RecordStream, PyTorch's recordStream). Memory the host
// can touch (the CPU's, pinned) records where its stream was at the free; device memory never
// moves to another stream, as in PyTorch.
#ifndef TANDEM_RUNTIME_ALLOCATOR_H_
#define TANDEM_RUNTIME_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device.h"

namespace tandem {

class Stream;  // runtime/stream.h

// How a block will first be used, so that the cache hands out only blocks no queued work
// still uses in a way that could clash.
struct AllocationUse {
  // The stream whose work uses the block (null: the device's compute stream).
  Stream* stream = nullptr;
  // The block is written first by the host (a tensor filled on the host, a staging buffer)
  // or by a copy from another device, not by `stream`'s work in its order: it must be idle
  // on every stream, its own included. Allocations made on a device's own thread (an op's
  // scratch, while the op runs) are treated so too.
  bool host_writes = false;
};

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // in blocks handed out now (sizes after rounding)
  int64_t reserved_bytes = 0;        // held from the system: allocated + cached
  int64_t peak_allocated_bytes = 0;  // highest allocated_bytes since the last ResetPeak
  // The requests themselves (rounded) in blocks handed out now: allocated_bytes less what a
  // cached block larger than its request adds (PyTorch's requested_bytes), so it does not
  // depend on what the cache held.
  int64_t requested_bytes = 0;
  int64_t peak_requested_bytes = 0;  // highest requested_bytes since the last ResetPeak
  int64_t peak_reserved_bytes = 0;
  int64_t system_allocations = 0;    // cudaMalloc / aligned_alloc calls made
  int64_t system_frees = 0;
  int64_t allocations = 0;           // Allocate calls that succeeded
  int64_t cache_hits = 0;            // of those, served from cached blocks
  std::string ToString() const;
};

// The memory under an allocator: one call per system allocation.
class SystemMemory {
 public:
  virtual ~SystemMemory() = default;
  // Returns nullptr when the system has no memory to give, and an error for any other failure
  // (on CUDA, an error left by an earlier kernel), which the allocator passes on unchanged
  // rather than calling it out of memory.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* p, size_t bytes) = 0;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // True where the host can read and write it (the CPU's memory, pinned host memory).
  virtual bool host_accessible() const { return device().is_cpu(); }
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // `bytes` may be 0 (a valid, unique, non-null pointer comes back). Out of memory is
  // ResourceExhausted naming the request, the device and the statistics.
  virtual absl::StatusOr<void*> Allocate(size_t bytes, const AllocationUse& use = {}) = 0;
  // Takes back a pointer from Allocate (the host is done with it; queued work may not be).
  virtual void Free(void* p) = 0;
  // Marks the live block `p` (from Allocate) as used by work on `stream` too: once freed, it
  // is not handed out again before the work `stream` had queued at the free has run.
  virtual void RecordStream(void* p, Stream& stream) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void ResetPeak() = 0;
  // Returns every cached (free) block to the system, once the work queued on it has run and
  // the communicators' operations in flight have finished (AddBeforeSystemFree).
  virtual void EmptyCache() = 0;
  virtual Device device() const = 0;
};

class CachingAllocator : public Allocator {
 public:
  struct Options {
    // Most bytes held from the system at once; 0 means no limit but the system's.
    int64_t limit_bytes = 0;
  };
  CachingAllocator(std::unique_ptr<SystemMemory> memory, Options options);
  ~CachingAllocator() override;

  absl::StatusOr<void*> Allocate(size_t bytes, const AllocationUse& use = {}) override;
  void Free(void* p) override;
  void RecordStream(void* p, Stream& stream) override;
  AllocatorStats stats() const override;
  void ResetPeak() override;
  void EmptyCache() override;
  Device device() const override { return memory_->device(); }

  // Sizes are rounded up to this many bytes (so vectorized kernels may read whole words).
  static constexpr size_t kRoundBytes = 512;

 private:
  struct Block;
  // A cached block for `stream`'s work, else memory from the system within the limit, else
  // null (an error only where the system memory failed otherwise).
  absl::StatusOr<void*> TakeLocked(size_t rounded, Stream* stream, bool strict)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void* TakeCachedLocked(size_t rounded, Stream* stream, bool strict)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OutOfMemoryLocked(size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns every cached block to the system, after the work queued on them has run.
  void ReleaseCache();
  Stream* DefaultStream();

  const std::unique_ptr<SystemMemory> memory_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::multimap<size_t, std::unique_ptr<Block>> free_blocks_ ABSL_GUARDED_BY(mu_);  // by size
  std::unordered_map<void*, std::unique_ptr<Block>> live_blocks_ ABSL_GUARDED_BY(mu_);
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
};

// Work the allocator waits for before it returns cached memory of `device` to the system
// (after an out of memory, or EmptyCache): cudaFree waits for the whole device, and a
// collective in flight may wait for peers that wait for this rank, so the communicators
// register a wait for their operations in flight here. Returns an id for
// RemoveBeforeSystemFree.
int AddBeforeSystemFree(Device device, std::function<void()> wait);
void RemoveBeforeSystemFree(int id);

// Runs `work` and returns the most `allocator` held during it above what it held before: what
// `work` allocated at its peak. With `fresh`, the cache is emptied first, so that each request
// gets a block of its own size.
int64_t PeakAllocatedDuring(Allocator& allocator, const std::function<void()>& work,
                            bool fresh = false);
// The same in requested bytes (AllocatorStats::requested_bytes): the most `work`'s requests
// held at once above those live before, whichever cached blocks served them, so it does not
// depend on what ran before.
int64_t PeakRequestedDuring(Allocator& allocator, const std::function<void()>& work);

// The process-wide allocator of a device (CUDA device memory, or host memory for the CPU).
absl::StatusOr<Allocator*> GetAllocator(Device d);
// What allocations on `d` may still take, or -1 when unknown: the system's available memory
// (AvailableMemoryBytes) and the free blocks d's allocator holds cached.
int64_t AllocatableBytes(Device d);
// Page-locked host memory for staging copies to and from CUDA devices; plain host memory
// in a build without CUDA.
Allocator* GetPinnedHostAllocator();

}  // namespace tandem

#endif  // TANDEM_RUNTIME_ALLOCATOR_H_
