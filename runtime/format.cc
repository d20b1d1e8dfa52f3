#include "runtime/format.h"

#include "absl/strings/str_format.h"

namespace tandem {

std::string FormatBytes(int64_t bytes) {
  if (bytes < 0) return "-";
  const double kb = static_cast<double>(bytes) / 1024, mb = kb / 1024, gb = mb / 1024;
  if (gb >= 1024) return absl::StrFormat("%.1f TB", gb / 1024);
  if (mb >= 1024) return absl::StrFormat("%.1f GB", gb);
  if (mb >= 10) return absl::StrFormat("%.0f MB", mb);
  if (mb >= 1) return absl::StrFormat("%.1f MB", mb);
  return absl::StrFormat("%.0f KB", kb);
}

}  // namespace tandem
