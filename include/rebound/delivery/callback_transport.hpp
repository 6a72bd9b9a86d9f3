// The transport interface under CallbackSender: sends one HTTP POST and reports what came back.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace rebound {

/// One callback attempt as the transport sends it.
struct CallbackRequest {
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::chrono::milliseconds timeout{10000};  ///< for the whole attempt, connecting included
  /// Whose callback it is (rebound/tenant.hpp; "" for the default tenant): OriginGate keeps each
  /// tenant's breaker and limits at an origin apart.
  std::string tenant;
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
  /// Not sent, and not an attempt: the receiver's circuit is open, it is paused, or it is at its
  /// limits (OriginGate). Try again after `CallbackResponse::retry_in`.
  deferred,
};

/// What one attempt produced: an HTTP status, or a transport error.
struct CallbackResponse {
  TransportError error = TransportError::none;
  int status = 0;  ///< the HTTP status when `error` is `none`
  /// The raw `Retry-After` value, if any. CurlTransport gives none when the answer repeats the
  /// field with different values (it is a single value; a repeat of the same one counts once).
  std::string retry_after;
  std::string message;  ///< a human sentence for transport errors
  /// For `deferred`: when to try again, from now.
  std::chrono::milliseconds retry_in{0};
  /// The failure was this side's (out of descriptors, a handle that could not be made, the proxy
  /// unresolvable): it says nothing of the receiver's health, and no breaker counts it.
  bool local = false;
};

/// The circuit breaker of one receiver origin: `closed` sends, `open` sends nothing (requests are
/// deferred, spending no attempts) until a cool-down ends, `half_open` lets one probe through.
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
  std::size_t waiting = 0;    ///< requests waiting in memory for a place under the limits
  bool paused = false;        ///< paused by hand (OriginGate::pause)
  /// Requests answered `deferred` since the origin last answered well: what waits elsewhere (in
  /// a JobQueue's store) for the circuit, the pause or the limits.
  std::size_t deferred = 0;
  /// The tenant whose callbacks these are (OriginGate tracks each tenant at an origin apart);
  /// "" for the default tenant.
  std::string tenant;
  /// Attempts it answered with a 2xx, and otherwise (another status, a timeout, a refused or
  /// broken connection), since this process started (OriginGate keeps them for 1,024 origins,
  /// idle ones included: past that, the idle one that answered least recently loses them first).
  std::size_t delivered = 0;
  std::size_t failed = 0;
};

/// Called exactly once per `send`, on a transport thread. Must not block for long.
using CallbackResponseHandler = std::function<void(CallbackResponse)>;

/// Sends callback requests. Implement it to fake delivery in tests or to use another HTTP stack.
///
/// Contract: `send` returns quickly (it may queue), and calls `on_done` exactly once, from any
/// thread, also when the request fails. Redirects are reported as their 3xx status and never
/// followed. Implementations must be thread-safe and should not throw from `send`; one that
/// throws must not call `on_done` as well: CallbackSender counts the throw as a failed attempt
/// (as a broken connection, with the exception's message) and retries it.
class CallbackTransport {
 public:
  virtual ~CallbackTransport() = default;
  virtual void send(CallbackRequest request, CallbackResponseHandler on_done) = 0;
  /// The receivers' origins this transport currently tracks (see EndpointStatus); a transport
  /// without per-origin state returns none. Thread-safe.
  virtual std::vector<EndpointStatus> endpoints() const { return {}; }
};

}  // namespace rebound
