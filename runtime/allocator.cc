#include "runtime/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "absl/strings/str_format.h"
#include "runtime/status.h"

#if TANDEM_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_status.h"
#endif

namespace tandem {

std::string AllocatorStats::ToString() const {
  return absl::StrFormat(
      "allocated %d B, reserved %d B, peak allocated %d B, %d system allocations",
      allocated_bytes, reserved_bytes, peak_allocated_bytes, system_allocations) +
         absl::StrFormat(", %d of %d allocations served from the cache", cache_hits,
                         allocations);
}

CachingAllocator::CachingAllocator(std::unique_ptr<SystemMemory> memory, Options options)
    : memory_(std::move(memory)), options_(options) {}

CachingAllocator::~CachingAllocator() {
  absl::MutexLock lock(&mu_);
  EmptyCacheLocked();
  // Live blocks are leaked on purpose: a tensor outliving its allocator is a bug elsewhere,
  // and freeing under it would turn that into memory corruption.
}

void* CachingAllocator::TakeCachedLocked(size_t rounded) {
  // Best fit among cached blocks no larger than twice the request: blocks are not split,
  // so a much larger one would waste more than it saves.
  auto it = free_blocks_.lower_bound(rounded);
  if (it == free_blocks_.end() || it->first > 2 * rounded) return nullptr;
  void* p = it->second;
  live_blocks_[p] = it->first;
  stats_.allocated_bytes += it->first;
  free_blocks_.erase(it);
  return p;
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes) {
  const size_t rounded = std::max<size_t>(kRoundBytes, (bytes + kRoundBytes - 1) /
                                                            kRoundBytes * kRoundBytes);
  absl::MutexLock lock(&mu_);
  void* p = TakeCachedLocked(rounded);
  if (p != nullptr) {
    stats_.cache_hits++;
  } else {
    const auto over_limit = [&] {
      return options_.limit_bytes > 0 &&
             stats_.reserved_bytes + static_cast<int64_t>(rounded) > options_.limit_bytes;
    };
    if (!over_limit()) {
      ASSIGN_OR_RETURN(p, memory_->Allocate(rounded));
    }
    if (p == nullptr && !free_blocks_.empty()) {
      // Like PyTorch: give the cache back to the system and try once more.
      EmptyCacheLocked();
      if (!over_limit()) {
        ASSIGN_OR_RETURN(p, memory_->Allocate(rounded));
      }
    }
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "out of memory on %s (%s): tried to allocate %d bytes; %s%s", device().ToString(),
          memory_->name(), bytes, stats_.ToString(),
          options_.limit_bytes > 0 ? absl::StrFormat(", limit %d B", options_.limit_bytes)
                                   : ""));
    }
    stats_.system_allocations++;
    stats_.reserved_bytes += rounded;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    live_blocks_[p] = rounded;
    stats_.allocated_bytes += rounded;
  }
  stats_.allocations++;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return p;
}

void CachingAllocator::Free(void* p) {
  if (p == nullptr) return;
  absl::MutexLock lock(&mu_);
  auto it = live_blocks_.find(p);
  if (it == live_blocks_.end()) {
    std::fprintf(stderr, "tandem: Free of a pointer %p not from this allocator (%s)\n", p,
                 device().ToString().c_str());
    std::abort();
  }
  stats_.allocated_bytes -= it->second;
  free_blocks_.emplace(it->second, p);
  live_blocks_.erase(it);
}

AllocatorStats CachingAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  absl::MutexLock lock(&mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

int64_t PeakAllocatedDuring(Allocator& allocator, const std::function<void()>& work, bool fresh) {
  if (fresh) allocator.EmptyCache();
  const int64_t before = allocator.stats().allocated_bytes;
  allocator.ResetPeak();
  work();
  return allocator.stats().peak_allocated_bytes - before;
}

void CachingAllocator::EmptyCache() {
  absl::MutexLock lock(&mu_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCacheLocked() {
  for (auto& [size, p] : free_blocks_) {
    memory_->Free(p, size);
    stats_.reserved_bytes -= size;
    stats_.system_frees++;
  }
  free_blocks_.clear();
}

namespace {

class HostMemory : public SystemMemory {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override { return std::aligned_alloc(64, bytes); }
  void Free(void* p, size_t) override { std::free(p); }
  Device device() const override { return Device::Cpu(); }
  std::string name() const override { return "host memory"; }
};

#if TANDEM_CUDA
// p from a CUDA allocation that returned e: null when out of memory (the allocator's cue to
// free its cache and retry), an error for any other failure.
absl::StatusOr<void*> NullIfOutOfMemory(cudaError_t e, void* p) {
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // an out-of-memory is not sticky; cleared for the retry
    return nullptr;
  }
  CUDA_RETURN_IF_ERROR(e);
  return p;
}

class PinnedHostMemory : public SystemMemory {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = nullptr;
    return NullIfOutOfMemory(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), p);
  }
  void Free(void* p, size_t) override { cudaFreeHost(p); }
  Device device() const override { return Device::Cpu(); }
  std::string name() const override { return "pinned host memory"; }
};

class CudaMemory : public SystemMemory {
 public:
  explicit CudaMemory(int index) : index_(index) {}
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = nullptr;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(index_));
    return NullIfOutOfMemory(cudaMalloc(&p, bytes), p);
  }
  void Free(void* p, size_t) override {
    cudaSetDevice(index_);
    cudaFree(p);
  }
  Device device() const override { return Device::Cuda(index_); }
  std::string name() const override { return "cudaMalloc"; }

 private:
  int index_;
};
#endif

}  // namespace

absl::StatusOr<Allocator*> GetAllocator(Device d) {
  static std::mutex mu;
  static auto* allocators = new std::map<int, std::unique_ptr<Allocator>>();  // -1: cpu
  std::lock_guard<std::mutex> lock(mu);
  const int key = d.is_cpu() ? -1 : d.index();
  auto it = allocators->find(key);
  if (it != allocators->end()) return it->second.get();
  std::unique_ptr<SystemMemory> memory;
  if (d.is_cpu()) {
    memory = std::make_unique<HostMemory>();
  } else {
    std::string why;
    const int count = CudaDeviceCount(&why);
    if (d.index() >= count) {
      return absl::UnavailableError(absl::StrFormat(
          "%s requested but %d CUDA devices are visible%s%s", d.ToString(), count,
          count == 0 ? ": " : "", count == 0 ? why : ""));
    }
#if TANDEM_CUDA
    memory = std::make_unique<CudaMemory>(d.index());
#endif
  }
  auto allocator = std::make_unique<CachingAllocator>(std::move(memory), CachingAllocator::Options{});
  Allocator* raw = allocator.get();
  (*allocators)[key] = std::move(allocator);
  return raw;
}

int64_t AllocatableBytes(Device d) {
  const int64_t system = AvailableMemoryBytes(d);
  if (system < 0) return -1;
  absl::StatusOr<Allocator*> a = GetAllocator(d);
  if (!a.ok()) return system;
  const AllocatorStats st = (*a)->stats();
  return system + st.reserved_bytes - st.allocated_bytes;
}

Allocator* GetPinnedHostAllocator() {
  // Page-locking needs a CUDA driver; without a device there is nothing to stage for, and
  // plain host memory serves.
  static auto* pinned = new CachingAllocator(
#if TANDEM_CUDA
      CudaDeviceCount() > 0 ? std::unique_ptr<SystemMemory>(new PinnedHostMemory())
                            : std::unique_ptr<SystemMemory>(new HostMemory()),
#else
      std::make_unique<HostMemory>(),
#endif
      CachingAllocator::Options{});
  return pinned;
}

}  // namespace tandem
