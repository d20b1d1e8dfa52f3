// Hostfile parsing and the coordinator's default address for several hosts.
#include "launcher/hostfile.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "comm/net_address.h"

namespace tandem {
namespace launcher {

absl::StatusOr<std::vector<HostfileEntry>> ParseHostfile(const std::string& text) {
  std::vector<HostfileEntry> hosts;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    std::vector<std::string> words =
        absl::StrSplit(absl::StripAsciiWhitespace(line), absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.empty()) continue;
    HostfileEntry e;
    e.host = words[0];
    for (size_t i = 1; i < words.size(); ++i) {
      absl::string_view w = words[i];
      int n = 0;
      const size_t eq = w.find('=');
      const std::string key = std::string(w.substr(0, eq));
      if (eq == absl::string_view::npos || !absl::SimpleAtoi(w.substr(eq + 1), &n) || n < 1 ||
          (key != "slots" && key != "max_slots" && key != "max-slots")) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "line %d: '%s' is not slots=N or max_slots=N (N at least 1)", line_number, w));
      }
      if (key == "slots") e.slots = n;
    }
    hosts.push_back(e);
  }
  if (hosts.empty()) return absl::InvalidArgumentError("it names no host");
  return hosts;
}

int TotalSlots(const std::vector<HostfileEntry>& hosts) {
  int total = 0;
  for (const HostfileEntry& h : hosts) {
    if (h.slots < 0) return -1;
    total += h.slots;
  }
  return total;
}

absl::StatusOr<std::string> DefaultCoordinatorHost(const std::vector<HostfileEntry>& hosts) {
  bool resolved_any = false;
  for (const HostfileEntry& h : hosts) {
    absl::StatusOr<std::string> ip = ResolveIpv4(h.host);
    if (!ip.ok()) continue;
    resolved_any = true;
    if (IsLocalIpv4(*ip)) continue;
    absl::StatusOr<std::string> src = RouteSourceIpv4(*ip);
    if (!src.ok()) {
      return absl::UnavailableError(absl::StrFormat(
          "no route from this host to %s (%s): %s; give --coordinator-address", h.host, *ip,
          src.status().message()));
    }
    return *src;
  }
  if (resolved_any) return std::string("127.0.0.1");  // every host is this one
  const std::string mine = ThisHostIpv4();
  if (mine.empty()) {
    return absl::UnavailableError(
        "none of the hostfile's hosts resolves here and this host has no network address; "
        "give --coordinator-address");
  }
  return mine;
}

}  // namespace launcher
}  // namespace tandem
