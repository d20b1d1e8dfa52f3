#include "runtime/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/host_sync.h"
#include "runtime/status.h"
#include "runtime/stream.h"

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

// A block of system memory, live or cached. A cached block keeps, as events, where the
// streams that used it were when it was freed.
struct CachingAllocator::Block {
  void* p = nullptr;
  size_t size = 0;
  size_t requested = 0;            // live: the request it serves (rounded), at most size
  Stream* home = nullptr;          // the stream it was allocated for
  std::vector<Stream*> used_on;    // other streams (RecordStream)
  std::unique_ptr<Event> home_done;  // cached, host-accessible memory: `home` at the free
  std::vector<std::unique_ptr<Event>> others_done;  // cached: each of `used_on` at the free
};

namespace {

// Drops the events that have completed; true when none is left among `events`.
bool Prune(std::vector<std::unique_ptr<Event>>* events) {
  events->erase(std::remove_if(events->begin(), events->end(),
                               [](const std::unique_ptr<Event>& e) {
                                 absl::StatusOr<bool> done = e->Query();
                                 return !done.ok() || *done;  // an error: nothing to wait for
                               }),
                events->end());
  return events->empty();
}

bool Done(std::unique_ptr<Event>* e) {
  if (*e == nullptr) return true;
  absl::StatusOr<bool> done = (*e)->Query();
  if (!done.ok() || *done) e->reset();
  return *e == nullptr;
}

// An event marking where `s` is now; null (after waiting for `s`) if none can be recorded.
std::unique_ptr<Event> MarkNow(Stream& s) {
  absl::StatusOr<std::unique_ptr<Event>> e = Event::Create(s.device(), /*timing=*/false);
  if (e.ok() && (*e)->Record(s).ok()) return std::move(*e);
  (void)s.Synchronize();
  return nullptr;
}

std::mutex& HooksMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

// id -> (device, wait)
std::map<int, std::pair<Device, std::function<void()>>>& Hooks() {
  static auto* hooks = new std::map<int, std::pair<Device, std::function<void()>>>();
  return *hooks;
}

void RunBeforeSystemFree(Device device) {
  std::vector<std::function<void()>> waits;
  {
    std::lock_guard<std::mutex> lock(HooksMutex());
    for (const auto& [id, hook] : Hooks()) {
      if (hook.first == device) waits.push_back(hook.second);
    }
  }
  for (const auto& wait : waits) wait();
}

}  // namespace

int AddBeforeSystemFree(Device device, std::function<void()> wait) {
  static int next = 0;
  std::lock_guard<std::mutex> lock(HooksMutex());
  Hooks().emplace(++next, std::make_pair(device, std::move(wait)));
  return next;
}

void RemoveBeforeSystemFree(int id) {
  std::lock_guard<std::mutex> lock(HooksMutex());
  Hooks().erase(id);
}

CachingAllocator::CachingAllocator(std::unique_ptr<SystemMemory> memory, Options options)
    : memory_(std::move(memory)), options_(options) {}

CachingAllocator::~CachingAllocator() {
  absl::MutexLock lock(&mu_);
  // Live blocks are leaked on purpose: a tensor outliving its allocator is a bug elsewhere,
  // and freeing under it would turn that into memory corruption. Cached blocks whose work
  // has not run are leaked too.
  for (auto& [size, b] : free_blocks_) {
    if (b->others_done.empty() && b->home_done == nullptr) memory_->Free(b->p, size);
  }
}

Stream* CachingAllocator::DefaultStream() {
  absl::StatusOr<Stream*> s = Stream::Compute(memory_->device());
  return s.ok() ? *s : nullptr;
}

void* CachingAllocator::TakeCachedLocked(size_t rounded, Stream* stream, bool strict) {
  // Best fit among cached blocks no larger than twice the request (blocks are not split, so a
  // much larger one would waste more than it saves) that no queued work may still touch:
  // every other stream past the free, and the block's own stream too unless the block goes
  // back to it for work in its order. Device memory never moves to another stream.
  const bool host = memory_->host_accessible();
  for (auto it = free_blocks_.lower_bound(rounded);
       it != free_blocks_.end() && it->first <= 2 * rounded; ++it) {
    Block& b = *it->second;
    if (!Prune(&b.others_done)) continue;
    const bool same_stream = b.home == stream && !strict;
    if (!same_stream && !(host && Done(&b.home_done))) continue;
    std::unique_ptr<Block> taken = std::move(it->second);
    free_blocks_.erase(it);
    taken->home = stream;
    taken->used_on.clear();
    taken->home_done.reset();
    void* p = taken->p;
    taken->requested = rounded;
    stats_.allocated_bytes += taken->size;
    live_blocks_[p] = std::move(taken);
    return p;
  }
  return nullptr;
}

absl::StatusOr<void*> CachingAllocator::TakeLocked(size_t rounded, Stream* stream,
                                                   bool strict) {
  void* p = TakeCachedLocked(rounded, stream, strict);
  if (p != nullptr) {
    stats_.cache_hits++;
  } else {
    if (options_.limit_bytes > 0 &&
        stats_.reserved_bytes + static_cast<int64_t>(rounded) > options_.limit_bytes) {
      return nullptr;
    }
    ASSIGN_OR_RETURN(p, memory_->Allocate(rounded));
    if (p == nullptr) return nullptr;
    stats_.system_allocations++;
    stats_.reserved_bytes += rounded;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    auto b = std::make_unique<Block>();
    b->p = p;
    b->size = rounded;
    b->requested = rounded;
    b->home = stream;
    live_blocks_[p] = std::move(b);
    stats_.allocated_bytes += rounded;
  }
  stats_.allocations++;
  stats_.requested_bytes += rounded;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_requested_bytes = std::max(stats_.peak_requested_bytes, stats_.requested_bytes);
  return p;
}

absl::Status CachingAllocator::OutOfMemoryLocked(size_t bytes) {
  return absl::ResourceExhaustedError(absl::StrFormat(
      "out of memory on %s (%s): tried to allocate %d bytes; %s%s", device().ToString(),
      memory_->name(), bytes, stats_.ToString(),
      options_.limit_bytes > 0 ? absl::StrFormat(", limit %d B", options_.limit_bytes) : ""));
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes, const AllocationUse& use) {
  const size_t rounded = std::max<size_t>(kRoundBytes, (bytes + kRoundBytes - 1) /
                                                            kRoundBytes * kRoundBytes);
  Stream* stream = use.stream != nullptr ? use.stream : DefaultStream();
  // Work on a device's own thread uses what it allocates at once, before the work queued
  // after it on its stream: only an idle block will do.
  const bool strict = use.host_writes || OnDeviceThread();
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(void* p, TakeLocked(rounded, stream, strict));
    if (p != nullptr) return p;
    if (free_blocks_.empty()) return OutOfMemoryLocked(bytes);
  }
  // Like PyTorch: give the cache back to the system and try once more.
  ReleaseCache();
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(void* p, TakeLocked(rounded, stream, strict));
  if (p != nullptr) return p;
  return OutOfMemoryLocked(bytes);
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
  std::unique_ptr<Block> b = std::move(it->second);
  live_blocks_.erase(it);
  for (Stream* s : b->used_on) {
    if (std::unique_ptr<Event> e = MarkNow(*s)) b->others_done.push_back(std::move(e));
  }
  if (memory_->host_accessible() && b->home != nullptr) b->home_done = MarkNow(*b->home);
  stats_.allocated_bytes -= b->size;
  stats_.requested_bytes -= b->requested;
  const size_t size = b->size;
  free_blocks_.emplace(size, std::move(b));
}

void CachingAllocator::RecordStream(void* p, Stream& stream) {
  absl::MutexLock lock(&mu_);
  auto it = live_blocks_.find(p);
  if (it == live_blocks_.end()) return;  // not a block's start: a caller's bug, but harmless
  Block& b = *it->second;
  if (&stream == b.home) return;
  if (std::find(b.used_on.begin(), b.used_on.end(), &stream) == b.used_on.end()) {
    b.used_on.push_back(&stream);
  }
}

AllocatorStats CachingAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  absl::MutexLock lock(&mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_requested_bytes = stats_.requested_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

int64_t PeakAllocatedDuring(Allocator& allocator, const std::function<void()>& work, bool fresh) {
  if (fresh) allocator.EmptyCache();
  const int64_t before = allocator.stats().allocated_bytes;
  allocator.ResetPeak();
  work();
  return allocator.stats().peak_allocated_bytes - before;
}

int64_t PeakRequestedDuring(Allocator& allocator, const std::function<void()>& work) {
  const int64_t before = allocator.stats().requested_bytes;
  allocator.ResetPeak();
  work();
  return allocator.stats().peak_requested_bytes - before;
}

void CachingAllocator::EmptyCache() { ReleaseCache(); }

void CachingAllocator::ReleaseCache() {
  // First the communicators' operations in flight (a device-wide free could wait for them,
  // and they for peers), then the cached blocks' own pending work, with no lock held: the
  // work being waited for may allocate or free.
  RunBeforeSystemFree(device());
  std::multimap<size_t, std::unique_ptr<Block>> cached;
  {
    absl::MutexLock lock(&mu_);
    cached.swap(free_blocks_);
  }
  // Polled rather than synchronized: an error of the streams' work is their users' to hear.
  bool waited = false;
  for (auto& [size, b] : cached) {
    while (!Prune(&b->others_done) || !Done(&b->home_done)) {
      if (!waited) HostSync::Record("the allocator's wait for cached blocks in use");
      waited = true;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  absl::MutexLock lock(&mu_);
  for (auto& [size, b] : cached) {
    memory_->Free(b->p, size);
    stats_.reserved_bytes -= size;
    stats_.system_frees++;
  }
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
