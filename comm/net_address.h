// Addresses for a coordinator other hosts must reach: resolving host names to IPv4, telling
// whether an address belongs to this host, and which of this host's addresses routes to a
// given peer (as `ip route get` says), so the coordinator is advertised on the network the
// workers are on.
#ifndef TANDEM_COMM_NET_ADDRESS_H_
#define TANDEM_COMM_NET_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"

namespace tandem {

// The first IPv4 address of `host` (a name or a dotted quad).
absl::StatusOr<std::string> ResolveIpv4(const std::string& host);
// True when `ipv4` is a loopback address or one of this host's interfaces' addresses.
bool IsLocalIpv4(const std::string& ipv4);
// This host's address on the interface that routes to `peer_ipv4` (no packet is sent).
absl::StatusOr<std::string> RouteSourceIpv4(const std::string& peer_ipv4);
// An address of this host others can reach: a non-loopback IPv4 of its host name, else of
// the first interface that is up and not loopback; empty when there is none.
std::string ThisHostIpv4();

// Splits "host[:port]" (port 0 when absent); InvalidArgument on a bad port.
absl::Status SplitHostPort(const std::string& text, std::string* host, int* port);

}  // namespace tandem

#endif  // TANDEM_COMM_NET_ADDRESS_H_
