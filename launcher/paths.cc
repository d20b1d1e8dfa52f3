#include "launcher/paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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

}  // namespace launcher
}  // namespace tandem
