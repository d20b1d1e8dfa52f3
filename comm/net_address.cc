// Host addresses through the C library: getaddrinfo for names, getifaddrs for this host's
// interfaces, and a connected UDP socket for the route's source address.
#include "comm/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {
namespace {

std::string ToText(const in_addr& a) {
  char buf[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

bool IsLoopback(const in_addr& a) { return (ntohl(a.s_addr) >> 24) == 127; }

}  // namespace

absl::StatusOr<std::string> ResolveIpv4(const std::string& host) {
  in_addr a;
  if (inet_pton(AF_INET, host.c_str(), &a) == 1) return host;
  addrinfo hints = {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int err = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (err != 0 || res == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("cannot resolve host '%s': %s", host, gai_strerror(err)));
  }
  const std::string out = ToText(reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr);
  freeaddrinfo(res);
  return out;
}

bool IsLocalIpv4(const std::string& ipv4) {
  in_addr want;
  if (inet_pton(AF_INET, ipv4.c_str(), &want) != 1) return false;
  if (IsLoopback(want)) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    found = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == want.s_addr;
  }
  freeifaddrs(list);
  return found;
}

absl::StatusOr<std::string> RouteSourceIpv4(const std::string& peer_ipv4) {
  sockaddr_in peer = {};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(9);  // any port: connecting a UDP socket sends nothing
  if (inet_pton(AF_INET, peer_ipv4.c_str(), &peer.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", peer_ipv4));
  }
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  absl::StatusOr<std::string> out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&peer), sizeof(peer)) != 0) {
    out = absl::UnavailableError(
        absl::StrFormat("no route to %s: %s", peer_ipv4, std::strerror(errno)));
  } else {
    sockaddr_in self = {};
    socklen_t len = sizeof(self);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) != 0) {
      out = absl::InternalError(absl::StrCat("getsockname: ", std::strerror(errno)));
    } else {
      out = ToText(self.sin_addr);
    }
  }
  close(fd);
  return out;
}

std::string ThisHostIpv4() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) == 0) {
    absl::StatusOr<std::string> a = ResolveIpv4(name);
    in_addr parsed;
    if (a.ok() && inet_pton(AF_INET, a->c_str(), &parsed) == 1 && !IsLoopback(parsed)) return *a;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* i = list; i != nullptr && out.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    out = ToText(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr);
  }
  freeifaddrs(list);
  return out;
}

absl::Status SplitHostPort(const std::string& text, std::string* host, int* port) {
  const size_t colon = text.rfind(':');
  *port = 0;
  if (colon == std::string::npos) {
    *host = text;
  } else {
    *host = text.substr(0, colon);
    if (!absl::SimpleAtoi(text.substr(colon + 1), port) || *port < 0 || *port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrFormat("'%s': the port must be a number from 0 to 65535", text));
    }
  }
  if (host->empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s': no host", text));
  }
  return absl::OkStatus();
}

}  // namespace tandem
