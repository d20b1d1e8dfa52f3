#include "runtime/allocator.h"

#include <cstdlib>
#include <atomic>
#include <set>
#include <string>
#include <vector>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "runtime/stream.h"

namespace tandem {
namespace {

// Host memory that counts what the allocator asked of the system.
class CountingMemory : public SystemMemory {
 public:
  explicit CountingMemory(int* live) : live_(live) {}
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    ++*live_;
    return std::malloc(bytes);
  }
  void Free(void* p, size_t) override {
    --*live_;
    std::free(p);
  }
  Device device() const override { return Device::Cpu(); }
  std::string name() const override { return "counting host memory"; }

 private:
  int* live_;
};

TEST(CachingAllocatorTest, RoundsAndCountsBytes) {
  int live = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&live), {});
  void* p = *a.Allocate(1000);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocated_bytes, 1024);  // rounded up to 512-byte units
  EXPECT_EQ(s.reserved_bytes, 1024);
  EXPECT_EQ(s.system_allocations, 1);
  EXPECT_EQ(live, 1);
  a.Free(p);
  s = a.stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.reserved_bytes, 1024);  // kept in the cache
  EXPECT_EQ(s.peak_allocated_bytes, 1024);
  EXPECT_EQ(live, 1);
}

TEST(CachingAllocatorTest, ReusesFreedBlocksBySize) {
  int live = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&live), {});
  void* p = *a.Allocate(4096);
  a.Free(p);
  void* q = *a.Allocate(4000);  // same rounded size: the cached block comes back
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().system_allocations, 1);
  EXPECT_EQ(a.stats().cache_hits, 1);
  void* r = *a.Allocate(4096);  // the block is taken: a new one
  EXPECT_NE(r, q);
  EXPECT_EQ(a.stats().system_allocations, 2);
  a.Free(q);
  a.Free(r);
  // A block more than twice the request is not handed out for it.
  void* small = *a.Allocate(512);
  EXPECT_NE(small, p);
  EXPECT_EQ(a.stats().system_allocations, 3);
  a.Free(small);
}

TEST(CachingAllocatorTest, ZeroByteAllocationsAreDistinct) {
  int live = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&live), {});
  void* p = *a.Allocate(0);
  void* q = *a.Allocate(0);
  EXPECT_NE(p, nullptr);
  EXPECT_NE(p, q);
  a.Free(p);
  a.Free(q);
}

TEST(CachingAllocatorTest, EmptyCacheReturnsFreeBlocksOnly) {
  int live = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&live), {});
  void* keep = *a.Allocate(2048);
  a.Free(*a.Allocate(8192));
  a.Free(*a.Allocate(16384));
  EXPECT_EQ(live, 3);
  a.EmptyCache();
  EXPECT_EQ(live, 1);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.reserved_bytes, 2048);
  EXPECT_EQ(s.allocated_bytes, 2048);
  EXPECT_EQ(s.system_frees, 2);
  a.Free(keep);
  a.EmptyCache();
  EXPECT_EQ(live, 0);
  EXPECT_EQ(a.stats().reserved_bytes, 0);
}

TEST(CachingAllocatorTest, OutOfMemoryNamesRequestDeviceAndStats) {
  int live = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&live), {.limit_bytes = 1 << 20});
  void* p = *a.Allocate(768 << 10);
  auto r = a.Allocate(512 << 10);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find("out of memory on cpu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("524288 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("allocated 786432 B"), std::string::npos) << msg;
  EXPECT_NE(msg.find("limit 1048576 B"), std::string::npos) << msg;
  a.Free(p);
}

TEST(CachingAllocatorTest, OutOfMemoryFreesTheCacheAndRetries) {
  int live = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&live), {.limit_bytes = 1 << 20});
  a.Free(*a.Allocate(768 << 10));  // cached, holding 768 KiB of the 1 MiB limit
  // 300 KiB is under half the cached block, so it is not reused, and the limit is hit.
  auto r = a.Allocate(300 << 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(a.stats().system_frees, 1);  // the cached block went back to make room
  EXPECT_EQ(a.stats().reserved_bytes, 300 << 10);
  a.Free(*r);
}

TEST(CachingAllocatorTest, PeakTracksHighWaterAndResets) {
  int live = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&live), {});
  void* p = *a.Allocate(1 << 20);
  void* q = *a.Allocate(1 << 20);
  a.Free(p);
  EXPECT_EQ(a.stats().peak_allocated_bytes, 2 << 20);
  a.ResetPeak();
  EXPECT_EQ(a.stats().peak_allocated_bytes, 1 << 20);
  a.Free(q);
}

TEST(AllocatorTest, ProcessWideCpuAllocator) {
  Allocator* cpu = *GetAllocator(Device::Cpu());
  EXPECT_EQ(cpu, *GetAllocator(Device::Cpu()));
  EXPECT_TRUE(cpu->device().is_cpu());
  void* p = *cpu->Allocate(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  cpu->Free(p);
}

TEST(AllocatorTest, MissingCudaDeviceIsAClearError) {
  std::string why;
  const int n = CudaDeviceCount(&why);
  auto r = GetAllocator(Device::Cuda(n));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cuda:" + std::to_string(n) + " requested"),
            std::string::npos)
      << r.status();
}

TEST(PeakAllocatedDuring, IsWhatTheWorkHeldAtMostAboveWhatWasLive) {
  int system = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&system), {});
  void* held = *a.Allocate(4096);
  const int64_t peak = PeakAllocatedDuring(a, [&] {
    void* p = *a.Allocate(1024);
    void* q = *a.Allocate(2048);
    a.Free(p);
    a.Free(q);
    a.Free(*a.Allocate(512));
  });
  EXPECT_EQ(peak, 1024 + 2048);
  a.Free(held);
}

// A cached 2048-byte block serves a 1100-byte request (1536 rounded to 512 bytes, and the
// block no more than twice it): allocated counts the block, requested the rounded request, and
// the peak of requests is what the work asked for.
TEST(PeakRequestedDuring, CountsTheRequestsNotTheCachedBlocks) {
  int system = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&system), {});
  a.Free(*a.Allocate(2048));
  const int64_t peak = PeakRequestedDuring(a, [&] {
    void* p = *a.Allocate(1100);
    EXPECT_EQ(a.stats().allocated_bytes, 2048);
    EXPECT_EQ(a.stats().requested_bytes, 1536);
    void* q = *a.Allocate(512);
    a.Free(p);
    a.Free(q);
  });
  EXPECT_EQ(peak, 1536 + 512);
  EXPECT_EQ(a.stats().requested_bytes, 0);
  EXPECT_EQ(system, 2);
}

// ---- streams: a block freed by the host while queued work still uses it ----------------------

// A stream whose thread is held until Release(): the work queued on it has not run.
class HeldStream {
 public:
  HeldStream() : stream_(Stream::CreateCpu(CpuStreamMode::kAsync)) {
    EXPECT_TRUE(stream_->Launch([this] {
      while (!released_.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
      return absl::OkStatus();
    }).ok());
  }
  ~HeldStream() { Release(); }
  void Release() {
    released_ = true;
    EXPECT_TRUE(stream_->Synchronize().ok());
  }
  Stream& operator*() { return *stream_; }
  Stream* get() { return stream_.get(); }

 private:
  std::atomic<bool> released_{false};
  std::unique_ptr<Stream> stream_;
};

AllocationUse For(Stream* s, bool host_writes = false) {
  AllocationUse u;
  u.stream = s;
  u.host_writes = host_writes;
  return u;
}

// Work queued later on the same stream runs after the work that used the block: it may have
// the block at once, as PyTorch's allocator gives a block back to its stream.
TEST(StreamAwareAllocatorTest, AFreedBlockGoesBackToItsStreamAtOnce) {
  int live = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&live), {});
  HeldStream s;
  void* p = *a.Allocate(4096, For(s.get()));
  a.Free(p);  // the stream's queued work may still use it
  EXPECT_EQ(*a.Allocate(4096, For(s.get())), p);
  a.Free(p);
}

// The host writing a block, or another stream using it, must wait for the work queued before
// the free: a new block is made instead, and the old one comes back once the work ran.
TEST(StreamAwareAllocatorTest, TheHostAndOtherStreamsWaitForTheQueuedWork) {
  int live = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&live), {});
  HeldStream s;
  auto other = Stream::CreateCpu(CpuStreamMode::kAsync);
  void* p = *a.Allocate(4096, For(s.get()));
  a.Free(p);
  void* host = *a.Allocate(4096, For(s.get(), /*host_writes=*/true));
  void* elsewhere = *a.Allocate(4096, For(other.get()));
  EXPECT_NE(host, p);
  EXPECT_NE(elsewhere, p);
  EXPECT_EQ(a.stats().system_allocations, 3);
  s.Release();
  void* later = *a.Allocate(4096, For(other.get()));
  EXPECT_EQ(later, p);  // idle now: any stream may have it
  for (void* q : {host, elsewhere, later}) a.Free(q);
}

// recordStream: a block used on a second stream is not reused, even by its own stream, before
// the second stream's work queued at the free has run.
TEST(StreamAwareAllocatorTest, RecordStreamKeepsTheBlockForTheOtherStreamsWork) {
  int live = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&live), {});
  auto home = Stream::CreateCpu(CpuStreamMode::kAsync);
  HeldStream user;
  void* p = *a.Allocate(4096, For(home.get()));
  a.RecordStream(p, *user);
  a.Free(p);
  void* q = *a.Allocate(4096, For(home.get()));
  EXPECT_NE(q, p);
  user.Release();
  void* r = *a.Allocate(4096, For(home.get()));
  EXPECT_EQ(r, p);
  a.Free(q);
  a.Free(r);
}

// An op's scratch, allocated on the stream's thread while the op runs, is used before the
// work queued after the op: a block that work still needs (freed by the host once it queued
// it) is not the scratch's, though it belongs to the same stream.
TEST(StreamAwareAllocatorTest, AllocationsOnTheStreamsThreadTakeIdleBlocksOnly) {
  int live = 0;
  CachingAllocator a(std::make_unique<CountingMemory>(&live), {});
  auto s = Stream::CreateCpu(CpuStreamMode::kAsync);
  HeldStream gate;  // holds s's thread until released, through an event
  auto released = *Event::Create(Device::Cpu(), false);
  ASSERT_TRUE(released->Record(*gate).ok());
  ASSERT_TRUE(released->MakeStreamWait(*s).ok());
  void* scratch = nullptr;
  ASSERT_TRUE(s->Launch([&] {  // an op with scratch
    scratch = *a.Allocate(4096, For(s.get()));
    a.Free(scratch);
    return absl::OkStatus();
  }).ok());
  void* p = *a.Allocate(4096, For(s.get()));
  ASSERT_TRUE(s->Launch([] { return absl::OkStatus(); }).ok());  // an op that reads p
  a.Free(p);  // the host is done with p; the op after the scratch's is not
  gate.Release();
  ASSERT_TRUE(s->Synchronize().ok());
  EXPECT_NE(scratch, p);
  EXPECT_EQ(a.stats().system_allocations, 2);
}

// System memory that records what happens, in order.
class LoggingMemory : public SystemMemory {
 public:
  explicit LoggingMemory(std::vector<std::string>* log) : log_(log) {}
  absl::StatusOr<void*> Allocate(size_t bytes) override { return std::malloc(bytes); }
  void Free(void* p, size_t) override {
    log_->push_back("system free");
    std::free(p);
  }
  Device device() const override { return Device::Cpu(); }
  std::string name() const override { return "logging host memory"; }

 private:
  std::vector<std::string>* log_;
};

// A device-wide free (cudaFree) could wait for collectives in flight, which may wait for
// peers that wait for this rank: the out-of-memory retry lets the communicators finish first,
// and the cached blocks' pending work, before it returns anything to the system.
TEST(StreamAwareAllocatorTest, TheOutOfMemoryRetryWaitsForTheCommunicatorsFirst) {
  std::vector<std::string> log;
  CachingAllocator a(std::make_unique<LoggingMemory>(&log), {.limit_bytes = 1 << 20});
  const int hook = AddBeforeSystemFree(Device::Cpu(), [&log] { log.push_back("communicators"); });
  const int other = AddBeforeSystemFree(Device::Cuda(0), [&log] { log.push_back("cuda:0"); });
  auto s = Stream::CreateCpu(CpuStreamMode::kAsync);
  std::atomic<bool> ran{false};
  ASSERT_TRUE(s->Launch([&ran] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ran = true;
    return absl::OkStatus();
  }).ok());
  void* p = *a.Allocate(768 << 10, For(s.get()));
  a.Free(p);  // cached, its stream's work still queued
  auto r = a.Allocate(300 << 10, For(s.get(), /*host_writes=*/true));  // over the limit
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ran.load()) << "the cached block was freed before its stream's work ran";
  EXPECT_EQ(log, (std::vector<std::string>{"communicators", "system free"}));
  RemoveBeforeSystemFree(hook);
  RemoveBeforeSystemFree(other);
  a.Free(*r);
}

}  // namespace
}  // namespace tandem
