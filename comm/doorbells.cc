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
#include <string>

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
  std::unique_ptr<Doorbells> d(new Doorbells());
  d->bells_.assign(size, nullptr);
  int mapped = 0;
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    int node_rank = 0, node_size = 0;
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_size(node, &node_size);
    // The host's first rank makes the segment, the others map it by name, and it is
    // unlinked once all have: nothing is left in /dev/shm, even if a rank dies later.
    static std::atomic<int> made{0};
    char name[64] = {0};
    d->bytes_ = kLine * static_cast<size_t>(node_size);
    if (node_rank == 0) {
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
    MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, node);
    if (name[0] != 0 && enabled) {
      const int fd = shm_open(name, O_RDWR, 0600);
      if (fd >= 0) {
        void* p = mmap(nullptr, d->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p != MAP_FAILED) {
          d->base_ = p;
          mapped = 1;
        }
      }
    }
    MPI_Barrier(node);
    if (node_rank == 0 && name[0] != 0) shm_unlink(name);
    // Each rank of `comm` on this host, by its place among the host's ranks.
    MPI_Group all = MPI_GROUP_NULL, here = MPI_GROUP_NULL;
    std::vector<int> ranks(size), at(size, MPI_UNDEFINED);
    for (int r = 0; r < size; ++r) ranks[r] = r;
    if (MPI_Comm_group(comm, &all) != MPI_SUCCESS || MPI_Comm_group(node, &here) != MPI_SUCCESS ||
        MPI_Group_translate_ranks(all, size, ranks.data(), here, at.data()) != MPI_SUCCESS) {
      mapped = 0;
    }
    if (all != MPI_GROUP_NULL) MPI_Group_free(&all);
    if (here != MPI_GROUP_NULL) MPI_Group_free(&here);
    MPI_Comm_free(&node);
    if (mapped) {
      char* base = static_cast<char*>(d->base_);
      for (int r = 0; r < size; ++r) {
        if (at[r] == MPI_UNDEFINED) continue;
        d->bells_[r] = reinterpret_cast<std::atomic<uint32_t>*>(base + kLine * at[r]);
      }
      d->own_ = d->bells_[rank];
    }
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

void Doorbells::Ring(int r) const {
  std::atomic<uint32_t>* bell = bells_[r];
  bell->fetch_add(1, std::memory_order_release);
  // Shared between processes: not FUTEX_PRIVATE_FLAG.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(bell), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void Doorbells::Wait(uint32_t seen, std::chrono::microseconds timeout) const {
  const int64_t us = timeout.count();
  timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  // Returns at once if the count moved since `seen` (a ring this wait would have missed).
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(own_), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

#else  // no futexes: every wait polls on its timer

std::unique_ptr<Doorbells> Doorbells::Create(MPI_Comm, bool) { return nullptr; }
Doorbells::~Doorbells() = default;
void Doorbells::Ring(int) const {}
void Doorbells::Wait(uint32_t, std::chrono::microseconds) const {}

#endif

}  // namespace tandem
