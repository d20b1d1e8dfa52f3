// Human-readable figures shared by every message and table that states a size.
#ifndef TANDEM_RUNTIME_FORMAT_H_
#define TANDEM_RUNTIME_FORMAT_H_

#include <cstdint>
#include <string>

namespace tandem {

// "512 KB", "12.3 MB", "1.5 GB", "1.2 TB" (binary units); "-" when negative (unknown).
std::string FormatBytes(int64_t bytes);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_FORMAT_H_
