// The transport interface under CallbackSender: sends one HTTP POST and reports what came back.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <ctime>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rebound/detail/http_date.hpp"

namespace rebound {

/// One callback attempt as the transport sends it.
struct CallbackRequest {
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::chrono::milliseconds timeout{10000};  ///< for the whole attempt, connecting included
};

/// Why a request got no HTTP answer.
enum class TransportError {
  none,             ///< an HTTP answer arrived (any status)
  invalid_url,      ///< the URL cannot be used
  refused_address,  ///< the SSRF guard refused the host or its addresses
  resolve_failed,   ///< the host name did not resolve
  connect_failed,   ///< the connection was refused or could not be opened in time
  timeout,          ///< no (complete) answer in time
  tls,              ///< the TLS handshake or the certificate check failed
  io,               ///< the connection broke
  cancelled,        ///< the transport shut down before an answer came
  circuit_open,     ///< waited longer than allowed behind the receiver's open circuit breaker
};

/// What one attempt produced: an HTTP status, or a transport error.
struct CallbackResponse {
  TransportError error = TransportError::none;
  int status = 0;           ///< the HTTP status when `error` is `none`
  std::string retry_after;  ///< the raw `Retry-After` header, if any
  std::string message;      ///< a human sentence for transport errors
};

/// The circuit breaker of one receiver origin: `closed` sends, `open` holds deliveries back
/// (without spending their attempts) until a cool-down ends, `half_open` lets one probe through.
enum class CircuitState { closed, open, half_open };

inline const char* to_string(CircuitState s) {
  switch (s) {
    case CircuitState::closed:
      return "closed";
    case CircuitState::open:
      return "open";
    case CircuitState::half_open:
      return "half_open";
  }
  return "closed";
}

/// What a transport knows of one receiver origin (`scheme://host:port`).
struct EndpointStatus {
  std::string origin;
  CircuitState state = CircuitState::closed;
  std::size_t consecutive_failures = 0;
  std::size_t in_flight = 0;  ///< requests sent and not yet answered
  std::size_t waiting = 0;    ///< requests held back by a limit or an open circuit
};

/// Called exactly once per `send`, on a transport thread. Must not block for long.
using CallbackResponseHandler = std::function<void(CallbackResponse)>;

/// Sends callback requests. Implement it to fake delivery in tests or to use another HTTP stack.
///
/// Contract: `send` returns quickly (it may queue), and calls `on_done` exactly once, from any
/// thread, also when the request fails. Redirects are reported as their 3xx status and never
/// followed. Implementations must be thread-safe and must not throw from `send`.
class CallbackTransport {
 public:
  virtual ~CallbackTransport() = default;
  virtual void send(CallbackRequest request, CallbackResponseHandler on_done) = 0;
  /// The receivers' origins this transport currently tracks (see EndpointStatus); a transport
  /// without per-origin state returns none. Thread-safe.
  virtual std::vector<EndpointStatus> endpoints() const { return {}; }
};

/// Parses a `Retry-After` value, either delay-seconds ("120") or an HTTP-date
/// in any of RFC 9110's three forms ("Wed, 21 Oct 2015 07:28:00 GMT", "Wednesday, 21-Oct-15
/// 07:28:00 GMT", "Wed Oct 21 07:28:00 2015"), into a delay from `now`, whatever the process
/// locale. A date in the past gives 0.
/// Returns nullopt for anything else. Never throws.
inline std::optional<std::chrono::milliseconds> parse_retry_after(
    std::string_view value, std::chrono::system_clock::time_point now) {
  while (!value.empty() && value.front() == ' ')
    value.remove_prefix(1);
  while (!value.empty() && value.back() == ' ')
    value.remove_suffix(1);
  if (value.empty() || value.size() > 64) return std::nullopt;
  bool digits = true;
  for (char c : value)
    digits = digits && c >= '0' && c <= '9';
  if (digits) {
    if (value.size() > 9) return std::chrono::milliseconds(999999999LL * 1000);
    long long seconds = 0;
    for (char c : value)
      seconds = seconds * 10 + (c - '0');
    return std::chrono::milliseconds(seconds * 1000);
  }
  const std::time_t now_seconds = std::chrono::system_clock::to_time_t(now);
  std::tm now_utc{};
  gmtime_r(&now_seconds, &now_utc);
  const std::optional<long long> when = detail::parse_http_date(value, 1900LL + now_utc.tm_year);
  if (!when) return std::nullopt;
  // Far-future dates would overflow std::chrono's nanoseconds: work in seconds, clamped.
  const long long delta = *when - static_cast<long long>(now_seconds);
  if (delta <= 0) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(std::min(delta, 999999999LL) * 1000);
}

}  // namespace rebound
