// Path arithmetic on strings and simple checks of what a path names, shared by the launcher
// and the tools that drive it.
#ifndef TANDEM_LAUNCHER_PATHS_H_
#define TANDEM_LAUNCHER_PATHS_H_

#include <string>

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

}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_PATHS_H_
