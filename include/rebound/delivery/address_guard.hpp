// The SSRF guard: which callback addresses rebound refuses to connect to, and resolving host names
// once so that the connection goes to the address that passed the check.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <array>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rebound/error.hpp"

namespace rebound {

/// The kind of an IP address, as far as callback delivery cares.
enum class AddressClass {
  global,        ///< an ordinary public address
  loopback,      ///< 127.0.0.0/8, ::1
  private_use,   ///< 10/8, 172.16/12, 192.168/16, fc00::/7, and other non-global ranges
  link_local,    ///< 169.254/16 (cloud metadata lives here), fe80::/10
  shared_cgnat,  ///< 100.64/10
  unspecified,   ///< 0.0.0.0/8, ::
  multicast,     ///< 224/4, ff00::/8
  reserved,      ///< 240/4, 255.255.255.255, documentation and benchmarking ranges
};

/// The name of an address class for error messages, e.g. "loopback".
inline const char* to_string(AddressClass c) {
  switch (c) {
    case AddressClass::global:
      return "global";
    case AddressClass::loopback:
      return "loopback";
    case AddressClass::private_use:
      return "private";
    case AddressClass::link_local:
      return "link-local";
    case AddressClass::shared_cgnat:
      return "shared (CGNAT)";
    case AddressClass::unspecified:
      return "unspecified";
    case AddressClass::multicast:
      return "multicast";
    case AddressClass::reserved:
      return "reserved";
  }
  return "unknown";
}

/// Classifies an IPv4 address given in network byte order as four bytes.
inline AddressClass classify_ipv4(const std::array<std::uint8_t, 4>& a) {
  if (a[0] == 0) return AddressClass::unspecified;
  if (a[0] == 127) return AddressClass::loopback;
  if (a[0] == 10) return AddressClass::private_use;
  if (a[0] == 172 && (a[1] & 0xf0) == 16) return AddressClass::private_use;
  if (a[0] == 192 && a[1] == 168) return AddressClass::private_use;
  if (a[0] == 169 && a[1] == 254) return AddressClass::link_local;
  if (a[0] == 100 && (a[1] & 0xc0) == 64) return AddressClass::shared_cgnat;
  if (a[0] >= 224 && a[0] <= 239) return AddressClass::multicast;
  if (a[0] >= 240) return AddressClass::reserved;
  if (a[0] == 192 && a[1] == 0 && (a[2] == 0 || a[2] == 2)) return AddressClass::reserved;
  if (a[0] == 198 && (a[1] == 18 || a[1] == 19)) return AddressClass::reserved;
  if (a[0] == 198 && a[1] == 51 && a[2] == 100) return AddressClass::reserved;
  if (a[0] == 203 && a[1] == 0 && a[2] == 113) return AddressClass::reserved;
  return AddressClass::global;
}

/// Classifies an IPv6 address (16 bytes). Every form that carries an IPv4 address is judged by
/// it, since a host or relay that routes the form passes the packet on to that address:
/// IPv4-mapped (::ffff:a.b.c.d), IPv4-translated (::ffff:0:a.b.c.d), IPv4-compatible (::a.b.c.d)
/// and NAT64 (64:ff9b::a.b.c.d) by the IPv4 address inside; a 6to4 address (2002:aabb:ccdd::/48)
/// and a Teredo one (2001:0::/32: its server's address, and its client's, stored inverted) whose
/// IPv4 address is not global by that address. The local-use NAT64 prefix (64:ff9b:1::/48)
/// translates into the network it serves: private.
inline AddressClass classify_ipv6(const std::array<std::uint8_t, 16>& a) {
  auto zeros = [&](int from, int to) {
    for (int i = from; i < to; ++i)
      if (a[i] != 0) return false;
    return true;
  };
  auto inner_v4 = [&] { return classify_ipv4({a[12], a[13], a[14], a[15]}); };
  if (zeros(0, 16)) return AddressClass::unspecified;
  if (zeros(0, 15) && a[15] == 1) return AddressClass::loopback;
  if (zeros(0, 10) && a[10] == 0xff && a[11] == 0xff) return inner_v4();
  if (zeros(0, 8) && a[8] == 0xff && a[9] == 0xff && a[10] == 0 && a[11] == 0) return inner_v4();
  if (zeros(0, 12)) return inner_v4();
  if (a[0] == 0x00 && a[1] == 0x64 && a[2] == 0xff && a[3] == 0x9b && a[4] == 0x00 &&
      a[5] == 0x01) {
    return AddressClass::private_use;
  }
  if (a[0] == 0x20 && a[1] == 0x01 && a[2] == 0x00 && a[3] == 0x00) {
    const AddressClass server = classify_ipv4({a[4], a[5], a[6], a[7]});
    if (server != AddressClass::global) return server;
    const auto inv = [&](int i) { return static_cast<std::uint8_t>(~a[i]); };
    const AddressClass client = classify_ipv4({inv(12), inv(13), inv(14), inv(15)});
    if (client != AddressClass::global) return client;
  }
  if (a[0] == 0x00 && a[1] == 0x64 && a[2] == 0xff && a[3] == 0x9b && zeros(4, 12)) {
    return inner_v4();
  }
  if (a[0] == 0x20 && a[1] == 0x02) {
    const AddressClass embedded = classify_ipv4({a[2], a[3], a[4], a[5]});
    if (embedded != AddressClass::global) return embedded;
  }
  if ((a[0] & 0xfe) == 0xfc) return AddressClass::private_use;
  if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80) return AddressClass::link_local;
  if (a[0] == 0xfe && (a[1] & 0xc0) == 0xc0) return AddressClass::private_use;  // site-local
  if (a[0] == 0xff) return AddressClass::multicast;
  if (a[0] == 0x20 && a[1] == 0x01 && a[2] == 0x0d && a[3] == 0xb8) return AddressClass::reserved;
  return AddressClass::global;
}

/// Classifies an IP literal ("10.0.0.1", "::1", "::ffff:127.0.0.1"); nullopt for a host name.
inline std::optional<AddressClass> classify_ip_literal(const std::string& host) {
  std::array<std::uint8_t, 4> v4{};
  if (inet_pton(AF_INET, host.c_str(), v4.data()) == 1) return classify_ipv4(v4);
  std::array<std::uint8_t, 16> v6{};
  const std::string bare = host.substr(0, host.find('%'));  // drop a zone id such as "%eth0"
  if (inet_pton(AF_INET6, bare.c_str(), v6.data()) == 1) return classify_ipv6(v6);
  return std::nullopt;
}

/// Decides which callback hosts and addresses may be contacted.
///
/// By default only global addresses pass. `allow_private` lifts the address check (local
/// development and tests). The allowlist names what may be called back even inside the network:
///   "hooks.internal"       that host name exactly (any address it resolves to)
///   "*.corp.example"       any host name under corp.example
///   "10.1.2.3", "fd00::7"  that address
///   "10.20.0.0/16"         any address in that range (IPv4 or IPv6 CIDR)
/// Thread-safety: immutable after construction, safe to share.
class AddressGuard {
 public:
  explicit AddressGuard(bool allow_private = false, std::vector<std::string> allowlist = {})
      : allow_private_(allow_private) {
    for (auto& entry : allowlist) {
      for (auto& c : entry)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (entry.empty()) throw Error("callback allowlist: empty entry");
      if (auto range = parse_range(entry)) {
        ranges_.push_back(*range);
      } else if (entry.rfind("*.", 0) == 0 && entry.size() > 2) {
        suffixes_.push_back(entry.substr(1));  // ".corp.example"
      } else if (entry.find('/') == std::string::npos && entry.find('*') == std::string::npos) {
        hosts_.push_back(entry);
      } else {
        throw Error("callback allowlist: '" + entry +
                    "' is not a host, *.domain, address or CIDR range");
      }
    }
  }

  bool allow_private() const { return allow_private_; }

  /// Whether an address of this class may be contacted (before the allowlist).
  bool permits(AddressClass c) const { return allow_private_ || c == AddressClass::global; }

  /// Whether an address (4 or 16 bytes) may be contacted: global, allowed by the flag, or listed.
  bool permits_address(const std::uint8_t* bytes, std::size_t size) const {
    return permits(class_of(bytes, size)) || in_ranges(to_v6(bytes, size));
  }

  /// Whether the host name itself is on the allowlist (exactly or by a *.domain entry).
  bool host_listed(const std::string& host) const {
    for (const auto& h : hosts_)
      if (h == host) return true;
    for (const auto& suffix : suffixes_) {
      if (host.size() > suffix.size() &&
          host.compare(host.size() - suffix.size(), suffix.size(), suffix) == 0) {
        return true;
      }
    }
    return false;
  }

  /// Checks a host as written in a URL (lower case), without resolving it: refuses IP literals
  /// outside the global range and the name "localhost", unless allowed. An IPv4 address counts
  /// in every form a resolver or libcurl reads as one (127.1, 2130706433, 0x7f000001, 0177.0.0.1),
  /// and a name with a trailing dot (the DNS root) as the same name. Returns the reason, or
  /// nullopt. (The addresses a name resolves to are checked again as a callback is sent.)
  std::optional<std::string> check_host(const std::string& host) const {
    if (allow_private_ || host_listed(host)) return std::nullopt;
    std::string name = host;
    while (name.size() > 1 && name.back() == '.')
      name.pop_back();
    if (host_listed(name)) return std::nullopt;
    auto bytes = literal_bytes(name);
    if (!bytes) bytes = other_ipv4_bytes(name);
    if (bytes) {
      if (permits_address(bytes->data(), bytes->size())) return std::nullopt;
      const std::string kind = to_string(class_of(bytes->data(), bytes->size()));
      return std::string(kind[0] == 'u' ? "points to an " : "points to a ") + kind +
             " address, which callbacks may not use";
    }
    if (name == "localhost" ||
        (name.size() > 10 && name.compare(name.size() - 10, 10, ".localhost") == 0)) {
      return "points to a loopback address, which callbacks may not use";
    }
    return std::nullopt;
  }

  /// The result of `resolve`: a numeric address that passed the check, or why there is none.
  struct Resolution {
    std::string address;   ///< numeric, e.g. "93.184.216.34" or "2001:db8::1"
    std::string error;     ///< set when `address` is empty
    bool refused = false;  ///< true when the name resolved, but only to refused addresses
  };

  /// Resolves `host` once and returns the first address this guard permits. A host name whose
  /// addresses are all refused (a DNS name pointing inside the network) is refused. Blocking.
  Resolution resolve(const std::string& host) const {
    const bool listed = host_listed(host);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
      return {{}, "cannot resolve " + host + ": " + gai_strerror(rc)};
    }
    Resolution result;
    std::string refused_class;
    for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      std::array<std::uint8_t, 16> bytes{};
      std::size_t size = 0;
      if (ai->ai_family == AF_INET) {
        auto* sin = reinterpret_cast<sockaddr_in*>(ai->ai_addr);
        std::memcpy(bytes.data(), &sin->sin_addr, size = 4);
        inet_ntop(AF_INET, &sin->sin_addr, text, sizeof text);
      } else if (ai->ai_family == AF_INET6) {
        auto* sin6 = reinterpret_cast<sockaddr_in6*>(ai->ai_addr);
        std::memcpy(bytes.data(), &sin6->sin6_addr, size = 16);
        inet_ntop(AF_INET6, &sin6->sin6_addr, text, sizeof text);
      } else {
        continue;
      }
      if (listed || permits_address(bytes.data(), size)) {
        result.address = text;
        break;
      }
      refused_class = to_string(class_of(bytes.data(), size));
    }
    freeaddrinfo(found);
    if (result.address.empty()) {
      result.refused = !refused_class.empty();
      result.error = refused_class.empty() ? "no usable address for " + host
                                           : host + " resolves to a " + refused_class +
                                                 " address, which callbacks may not use";
    }
    return result;
  }

 private:
  struct Range {
    std::array<std::uint8_t, 16> prefix{};
    int bits = 0;
  };

  // The class of an address given as 4 (IPv4) or 16 (IPv6) bytes.
  static AddressClass class_of(const std::uint8_t* bytes, std::size_t size) {
    return size == 4 ? classify_ipv4({bytes[0], bytes[1], bytes[2], bytes[3]})
                     : classify_ipv6(to_v6(bytes, size));
  }

  static std::array<std::uint8_t, 16> to_v6(const std::uint8_t* bytes, std::size_t size) {
    std::array<std::uint8_t, 16> v6{};
    if (size == 4) {
      v6[10] = v6[11] = 0xff;  // IPv4-mapped, so one range type serves both families
      std::memcpy(v6.data() + 12, bytes, 4);
    } else {
      std::memcpy(v6.data(), bytes, 16);
    }
    return v6;
  }

  // 4 bytes for an IPv4 literal, 16 for IPv6; nullopt for a name.
  static std::optional<std::vector<std::uint8_t>> literal_bytes(const std::string& host) {
    std::vector<std::uint8_t> v4(4), v6(16);
    if (inet_pton(AF_INET, host.c_str(), v4.data()) == 1) return v4;
    const std::string bare = host.substr(0, host.find('%'));
    if (inet_pton(AF_INET6, bare.c_str(), v6.data()) == 1) return v6;
    return std::nullopt;
  }

  // The other ways to write an IPv4 address that resolvers (inet_aton) and libcurl take: fewer
  // parts (127.1), one number (2130706433), octal or hex parts (0177.0.0.1, 0x7f000001).
  static std::optional<std::vector<std::uint8_t>> other_ipv4_bytes(const std::string& host) {
    if (host.empty() || host.find_first_not_of("0123456789abcdefx.") != std::string::npos)
      return std::nullopt;
    in_addr address{};
    if (inet_aton(host.c_str(), &address) == 0) return std::nullopt;
    std::vector<std::uint8_t> v4(4);
    std::memcpy(v4.data(), &address, v4.size());
    return v4;
  }

  static std::optional<Range> parse_range(const std::string& entry) {
    const auto slash = entry.find('/');
    const std::string addr = entry.substr(0, slash);
    auto bytes = literal_bytes(addr);
    if (!bytes) return std::nullopt;
    const int family_bits = bytes->size() == 4 ? 32 : 128;
    int bits = family_bits;
    if (slash != std::string::npos) {
      const std::string n = entry.substr(slash + 1);
      if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos) {
        throw Error("callback allowlist: bad prefix length in '" + entry + "'");
      }
      bits = std::stoi(n);
      if (bits > family_bits) throw Error("callback allowlist: prefix too long in '" + entry + "'");
    }
    Range r;
    r.prefix = to_v6(bytes->data(), bytes->size());
    r.bits = bytes->size() == 4 ? 96 + bits : bits;
    return r;
  }

  bool in_ranges(const std::array<std::uint8_t, 16>& a) const {
    for (const auto& r : ranges_) {
      bool match = true;
      for (int bit = 0; bit < r.bits && match; ++bit) {
        const int byte = bit / 8, mask = 0x80 >> (bit % 8);
        match = (a[byte] & mask) == (r.prefix[byte] & mask);
      }
      if (match) return true;
    }
    return false;
  }

  bool allow_private_;
  std::vector<std::string> hosts_;
  std::vector<std::string> suffixes_;
  std::vector<Range> ranges_;
};

}  // namespace rebound
