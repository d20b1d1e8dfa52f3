// Small file helpers shared by the programs (launcher, worker, tools) and the checkpoints.
#ifndef TANDEM_RUNTIME_FILES_H_
#define TANDEM_RUNTIME_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

// Writes `content` to `path` through a temporary file beside it (fsync, rename, fsync of the
// directory), so a reader sees the old file or the whole new one, never part of it, and the
// new one survives a crash once this returns.
absl::Status WriteFileAtomically(const std::string& path, const std::string& content);

// The whole content of the file `path`; NotFound ("cannot read <path>") when it cannot be read.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// This boot's id (/proc/sys/kernel/random/boot_id): processes that report the same one share
// a monotonic clock and /dev/shm, unless namespaces part them; "" where it cannot be read.
std::string BootId();

// The CPUs this process may run on (its affinity mask; all online ones where that is unread).
int HostCpus();

// Whether anything exists at `path` (stat succeeds).
bool PathExists(const std::string& path);

// Creates the directory `path` and any missing parent (mkdir -p); fine when it exists.
absl::Status MakeDirs(const std::string& path);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_FILES_H_
