// Path arithmetic on strings, simple checks of what a path names, and the run directory's
// name and layout, shared by the launcher, examples/train and the tools that drive them.
#ifndef TANDEM_LAUNCHER_PATHS_H_
#define TANDEM_LAUNCHER_PATHS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tandem {
namespace launcher {

// `path` made absolute against `base` (unchanged when already absolute or empty; leading
// "./" dropped).
std::string AbsolutePath(const std::string& base, const std::string& path);

// The folder part of `path`: "a/b" for "a/b/c", "." for "c".
std::string DirOf(const std::string& path);

// The directory `bazel run` was started from (BUILD_WORKING_DIRECTORY), where the user's
// relative paths are; "" outside `bazel run`.
std::string BuildWorkingDirectory();

// Whether `path` is a regular file this process may execute.
bool IsExecutable(const std::string& path);

// Whether `path` is a directory with anything in it; `exists` and `is_dir` say what it is.
bool IsNonEmptyDirectory(const std::string& path, bool* exists, bool* is_dir);

// "<user_dir>/runs/YYYYmmdd-HHMMSS-<name>" in local time: where a run without --run-dir goes
// (<name> is the launcher's strategy, or "train" for examples/train).
std::string DefaultRunDir(const std::string& user_dir, absl::Time now, const std::string& name);
// DefaultRunDir, or with "-2", "-3", ... appended where that is taken: never an earlier run's.
std::string NewRunDir(const std::string& user_dir, absl::Time now, const std::string& name);

// Makes the run directory with logs/, metrics/ and checkpoints/.
absl::Status CreateRunDirectory(const std::string& dir);

}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_PATHS_H_
