// libFuzzer target: callback URL parsing and the SSRF host check never crash, and a parsed URL is
// always usable (http/https, a host, a port in range, a target starting with '/').
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/callback_url.hpp"
#include "rebound/delivery/address_guard.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto parsed = rebound::detail::parse_callback_url(text);
  if (parsed.url.has_value() == !parsed.error.empty()) std::abort();
  if (parsed.url) {
    const auto& u = *parsed.url;
    if (u.scheme != "http" && u.scheme != "https") std::abort();
    if (u.host.empty() || u.port < 1 || u.port > 65535) std::abort();
    if (u.target.empty() || u.target[0] != '/') std::abort();
    if (u.origin().empty()) std::abort();
    static const rebound::AddressGuard guard;
    (void)guard.check_host(u.host);
  }
  (void)rebound::classify_ip_literal(text);
  return 0;
}
