#include "launcher/paths.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/files.h"

namespace tandem {
namespace launcher {

std::string AbsolutePath(const std::string& base, const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  if (path == ".") return base;
  std::string p = path;
  while (absl::StartsWith(p, "./")) p = p.substr(2);
  return absl::StrCat(base, absl::EndsWith(base, "/") ? "" : "/", p);
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string BuildWorkingDirectory() {
  const char* bwd = std::getenv("BUILD_WORKING_DIRECTORY");
  return bwd != nullptr ? bwd : "";
}

bool IsExecutable(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

bool IsNonEmptyDirectory(const std::string& path, bool* exists, bool* is_dir) {
  struct stat st;
  *exists = ::stat(path.c_str(), &st) == 0;
  *is_dir = *exists && S_ISDIR(st.st_mode);
  if (!*is_dir) return false;
  // Any entry besides . and .. makes it non-empty.
  bool non_empty = false;
  if (DIR* d = opendir(path.c_str())) {
    while (struct dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        non_empty = true;
        break;
      }
    }
    closedir(d);
  }
  return non_empty;
}

std::string DefaultRunDir(const std::string& user_dir, absl::Time now, const std::string& name) {
  return absl::StrCat(AbsolutePath(user_dir, "runs"), "/",
                      absl::FormatTime("%Y%m%d-%H%M%S", now, absl::LocalTimeZone()), "-", name);
}

std::string NewRunDir(const std::string& user_dir, absl::Time now, const std::string& name) {
  const std::string base = DefaultRunDir(user_dir, now, name);
  std::string dir = base;
  for (int n = 2; PathExists(dir); ++n) dir = absl::StrCat(base, "-", n);
  return dir;
}

absl::Status CreateRunDirectory(const std::string& dir) {
  for (const char* sub : {"logs", "metrics", "checkpoints"}) {
    absl::Status s = MakeDirs(absl::StrCat(dir, "/", sub));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace launcher
}  // namespace tandem
