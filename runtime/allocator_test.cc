#include "runtime/allocator.h"

#include <cstdlib>
#include <set>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace tandem
