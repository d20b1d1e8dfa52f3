// Checkpoint files: named f32 arrays plus key=value metadata, with a checksum, written
// atomically (temporary file, fsync, rename, fsync of the directory), so a crash leaves
// either the old file or the new one. A truncated or corrupt file is refused whole.
//
// Format (little-endian):
//   "TANDEMCK" | u32 version (1) | u32 count
//   count x { u32 name_len | name | u64 numel | numel x f32 }
//   u32 meta_len | meta ("key=value\n" lines)
//   u64 FNV-1a 64 of every byte above | "TANDEMEND"
#ifndef TANDEM_MODEL_CHECKPOINT_H_
#define TANDEM_MODEL_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

struct CheckpointData {
  std::vector<std::pair<std::string, std::vector<float>>> arrays;
  std::map<std::string, std::string> meta;

  // The array named `name`, or NotFound.
  absl::StatusOr<const std::vector<float>*> Array(const std::string& name) const;
  absl::StatusOr<std::string> Meta(const std::string& key) const;
};

// What identifies one written file: its size and the checksum stored in its trailer.
struct CheckpointFileInfo {
  int64_t bytes = 0;
  uint64_t checksum = 0;
};

// Writes atomically; `info`, if given, receives the file's size and checksum.
absl::Status WriteCheckpoint(const std::string& path, const CheckpointData& data,
                             CheckpointFileInfo* info = nullptr);
// Reads and verifies a whole file; DataLoss names the file when it is corrupt or truncated.
absl::StatusOr<CheckpointData> ReadCheckpoint(const std::string& path);
// DataLoss: "checkpoint <path> is corrupt or incomplete (<why>); it was not loaded: ...".
absl::Status CorruptCheckpointError(const std::string& path, const std::string& why);
// The size and stored checksum of a file, from its trailer only (nothing is verified but the
// trailer's presence): a cheap check that a file is the one a manifest lists.
absl::StatusOr<CheckpointFileInfo> StatCheckpoint(const std::string& path);

}  // namespace tandem

#endif  // TANDEM_MODEL_CHECKPOINT_H_
