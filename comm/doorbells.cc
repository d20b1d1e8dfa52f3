#include "comm/doorbells.h"

#ifdef __linux__
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/files.h"

namespace tandem {
namespace {

// One bell per cache line, so that ringing one rank does not disturb another's.
constexpr size_t kLine = 64;
static_assert(std::atomic<uint32_t>::is_always_lock_free, "a bell must be a plain word");

}  // namespace

bool Doorbells::Wanted() {
  const char* v = std::getenv("TANDEM_MPI_DOORBELLS");
  return v == nullptr || std::string(v) != "off";
}

#ifdef __linux__

std::unique_ptr<Doorbells> Doorbells::Create(MPI_Comm comm, bool enabled) {
  int rank = 0, size = 0;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS) {
    return nullptr;
  }
  static_assert(sizeof(Bell) <= kLine, "a bell must fit in its cache line");
  std::unique_ptr<Doorbells> d(new Doorbells());
  d->bells_.assign(size, nullptr);
  // Which ranks share this host: the same boot (one monotonic clock, one /dev/shm) and the same
  // network namespace (what a launch across hosts tells apart), by plain collectives over
  // `comm` (MPI_Comm_split_type crashed Open MPI 4.1 between namespaces over TCP).
  constexpr int kKey = 128, kName = 64;
  char key[kKey] = {0};
  {
    char net[64] = {0};
    if (readlink("/proc/self/ns/net", net, sizeof(net) - 1) <= 0) net[0] = 0;
    std::snprintf(key, sizeof(key), "%s %s", BootId().c_str(), net);
  }
  std::vector<char> keys(static_cast<size_t>(kKey) * size);
  MPI_Allgather(key, kKey, MPI_CHAR, keys.data(), kKey, MPI_CHAR, comm);
  auto same_host = [&](int r) { return std::strncmp(&keys[kKey * r], key, kKey) == 0; };
  std::vector<int> here;  // this host's ranks, in order: rank here[i] has bell i
  for (int r = 0; r < size; ++r) {
    if (same_host(r)) here.push_back(r);
  }
  // The host's first rank makes the segment, the others map it by name, and it is unlinked
  // once all have: nothing is left in /dev/shm, even if a rank dies later.
  static std::atomic<int> made{0};
  char name[kName] = {0};
  d->bytes_ = kLine * here.size();
  const bool leader = here.front() == rank;
  if (leader) {
    std::snprintf(name, sizeof(name), "/tandem-doorbells-%d-%d", static_cast<int>(getpid()),
                  made.fetch_add(1));
    const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(d->bytes_)) != 0) {
      shm_unlink(name);
      close(fd);
      name[0] = 0;
    } else if (fd < 0) {
      name[0] = 0;
    } else {
      close(fd);
    }
  }
  std::vector<char> names(static_cast<size_t>(kName) * size);
  MPI_Allgather(name, kName, MPI_CHAR, names.data(), kName, MPI_CHAR, comm);
  const char* mine = &names[kName * here.front()];
  int mapped = 0;
  if (mine[0] != 0 && enabled) {
    const int fd = shm_open(mine, O_RDWR, 0600);
    if (fd >= 0) {
      void* p = mmap(nullptr, d->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (p != MAP_FAILED) {
        d->base_ = p;
        mapped = 1;
      }
    }
  }
  MPI_Barrier(comm);
  if (leader && name[0] != 0) shm_unlink(name);
  if (mapped) {
    char* base = static_cast<char*>(d->base_);
    for (size_t i = 0; i < here.size(); ++i) {
      d->bells_[here[i]] = reinterpret_cast<Bell*>(base + kLine * i);
    }
    d->own_ = d->bells_[rank];
  }
  // All or none: a rank that waits on its bell must hear from every peer that has one.
  int everywhere = 0;
  MPI_Allreduce(&mapped, &everywhere, 1, MPI_INT, MPI_MIN, comm);
  if (!everywhere || d->own_ == nullptr) return nullptr;
  return d;
}

Doorbells::~Doorbells() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

// A ring and a wait each write their own word, then read the other's (both sequentially
// consistent): either the ring sees the sleeper and wakes it, or the wait's futex call sees
// the new count and does not sleep.
void Doorbells::Ring(int r) const {
  Bell* bell = bells_[r];
  bell->count.fetch_add(1, std::memory_order_seq_cst);
  if (bell->sleepers.load(std::memory_order_seq_cst) == 0) return;
  // Shared between processes: not FUTEX_PRIVATE_FLAG.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&bell->count), FUTEX_WAKE, INT_MAX, nullptr,
          nullptr, 0);
}

void Doorbells::Wait(uint32_t seen, std::chrono::microseconds timeout) const {
  const int64_t us = timeout.count();
  timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  own_->sleepers.fetch_add(1, std::memory_order_seq_cst);
  // Returns at once if the count moved since `seen` (a ring this wait would have missed).
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&own_->count), FUTEX_WAIT, seen, &ts, nullptr,
          0);
  own_->sleepers.fetch_sub(1, std::memory_order_relaxed);
}

#else  // no futexes: every wait polls on its timer

std::unique_ptr<Doorbells> Doorbells::Create(MPI_Comm, bool) { return nullptr; }
Doorbells::~Doorbells() = default;
void Doorbells::Ring(int) const {}
void Doorbells::Wait(uint32_t, std::chrono::microseconds) const {}

#endif

}  // namespace tandem
