// Files for tests: fresh paths under the test's temporary directory, whole files read back.
#ifndef TANDEM_RUNTIME_TEST_FILES_H_
#define TANDEM_RUNTIME_TEST_FILES_H_

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem {

// A path under $TEST_TMPDIR (else /tmp) that no earlier call returned; nothing is created.
inline std::string FreshTestPath(const std::string& name) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, "-", getpid(), "-", ++counter);
}

// FreshTestPath(name), created as a directory.
inline std::string FreshTestDir(const std::string& name) {
  const std::string dir = FreshTestPath(name);
  mkdir(dir.c_str(), 0755);
  return dir;
}

// The whole file, or "" where it cannot be read.
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace tandem

#endif  // TANDEM_RUNTIME_TEST_FILES_H_
