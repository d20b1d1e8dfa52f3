// Open MPI hostfiles as the launcher reads them (to check the slots against --gpus) and the
// address the coordinator is advertised on when workers run on several hosts: this host's
// address on the interface that routes to the first remote host of the hostfile.
#ifndef TANDEM_LAUNCHER_HOSTFILE_H_
#define TANDEM_LAUNCHER_HOSTFILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {
namespace launcher {

// One line of a hostfile: "node1 slots=4 max_slots=8".
struct HostfileEntry {
  std::string host;
  int slots = -1;  // -1: not given (Open MPI then counts the host's cores)
};

// Parses Open MPI's hostfile format: one host per line, optional "slots=N" and
// "max_slots=N" (or "max-slots=N"), '#' comments. An error names the line.
absl::StatusOr<std::vector<HostfileEntry>> ParseHostfile(const std::string& text);

// The sum of the slots, or -1 when a line gives none.
int TotalSlots(const std::vector<HostfileEntry>& hosts);

// Where workers on these hosts reach a coordinator running here: this host's address on
// the interface routing to the first host that is not this one (as `ip route get` would
// say); 127.0.0.1 when every host is this one. Hosts that do not resolve here are skipped.
absl::StatusOr<std::string> DefaultCoordinatorHost(const std::vector<HostfileEntry>& hosts);

}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_HOSTFILE_H_
