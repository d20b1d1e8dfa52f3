// The memory a run may still take on a device: on the host, capped by the cgroup a batch job
// or container puts the process in.
#include "runtime/device.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "runtime/test_files.h"

namespace tandem {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Makes dir and its parents.
void MakeDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') mkdir(dir.substr(0, i).c_str(), 0755);
  }
}

// cgroup v1 (a hybrid host also lists "0::/"): the step's own limit leaves 6 GiB counting
// its 1 GiB of file cache, but the job above it only 0.5 GiB; the root's "no limit" is a
// huge number.
TEST(CgroupHeadroom, V1TakesTheTightestCgroupAbove) {
  const std::string root = FreshTestDir("cgroup");
  const std::string step = root + "/memory/job/step", job = root + "/memory/job";
  MakeDirs(step);
  Write(step + "/memory.limit_in_bytes", std::to_string(8 * kGiB));
  Write(step + "/memory.usage_in_bytes", std::to_string(3 * kGiB));
  Write(step + "/memory.stat", "cache 5\nrss 7\ntotal_cache " + std::to_string(kGiB) + "\n");
  Write(job + "/memory.limit_in_bytes", std::to_string(4 * kGiB));
  Write(job + "/memory.usage_in_bytes", std::to_string(7 * kGiB / 2));
  Write(root + "/memory/memory.limit_in_bytes", "9223372036854771712\n");
  Write(root + "/memory/memory.usage_in_bytes", std::to_string(20 * kGiB));
  Write(root + "/self", "5:cpu:/\n4:memory:/job/step\n0::/\n");
  EXPECT_EQ(internal::CgroupHeadroom(root + "/self", root), kGiB / 2);
}

// cgroup v2 (a Slurm job): 2 GiB allowed, 1 GiB used of which 0.5 GiB is file cache; the
// parent says "max".
TEST(CgroupHeadroom, V2CountsFileCacheAsFree) {
  const std::string root = FreshTestDir("cgroup");
  const std::string job = root + "/slurm/job_1";
  MakeDirs(job);
  Write(job + "/memory.max", std::to_string(2 * kGiB) + "\n");
  Write(job + "/memory.current", std::to_string(kGiB) + "\n");
  Write(job + "/memory.stat", "anon 1\nfile " + std::to_string(kGiB / 2) + "\nfile_mapped 9\n");
  Write(root + "/slurm/memory.max", "max\n");
  Write(root + "/self", "0::/slurm/job_1\n");
  EXPECT_EQ(internal::CgroupHeadroom(root + "/self", root), 3 * kGiB / 2);
}

TEST(CgroupHeadroom, NoLimitIsUnknown) {
  const std::string root = FreshTestDir("cgroup");
  Write(root + "/self", "0::/\n");
  EXPECT_EQ(internal::CgroupHeadroom(root + "/self", root), -1);
  EXPECT_EQ(internal::CgroupHeadroom(root + "/missing", root), -1);
}

TEST(AvailableMemoryBytes, TheHostHasSome) {
  EXPECT_GT(AvailableMemoryBytes(Device::Cpu()), 16 << 20);
}

}  // namespace
}  // namespace tandem
