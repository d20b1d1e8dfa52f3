// Device memory with statistics. One CachingAllocator design serves every device (after
// PyTorch's CUDA caching allocator): freed blocks are kept by size and handed out again, so
// steady-state training makes no system allocations; EmptyCache() returns them. Only the
// system memory underneath differs: aligned host memory, page-locked host memory, or
// cudaMalloc (never managed memory).
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

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // in blocks handed out now (sizes after rounding)
  int64_t reserved_bytes = 0;        // held from the system: allocated + cached
  int64_t peak_allocated_bytes = 0;  // highest allocated_bytes since the last ResetPeak
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
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // `bytes` may be 0 (a valid, unique, non-null pointer comes back). Out of memory is
  // ResourceExhausted naming the request, the device and the statistics.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  // Takes back a pointer from Allocate.
  virtual void Free(void* p) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void ResetPeak() = 0;
  // Returns every cached (free) block to the system.
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

  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* p) override;
  AllocatorStats stats() const override;
  void ResetPeak() override;
  void EmptyCache() override;
  Device device() const override { return memory_->device(); }

  // Sizes are rounded up to this many bytes (so vectorized kernels may read whole words).
  static constexpr size_t kRoundBytes = 512;

 private:
  void* TakeCachedLocked(size_t rounded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmptyCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<SystemMemory> memory_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::multimap<size_t, void*> free_blocks_ ABSL_GUARDED_BY(mu_);        // size -> block
  std::unordered_map<void*, size_t> live_blocks_ ABSL_GUARDED_BY(mu_);   // block -> size
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
};

// Runs `work` and returns the most `allocator` held during it above what it held before: what
// `work` allocated at its peak. With `fresh`, the cache is emptied first, so that each request
// gets a block of its own size.
int64_t PeakAllocatedDuring(Allocator& allocator, const std::function<void()>& work,
                            bool fresh = false);

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
