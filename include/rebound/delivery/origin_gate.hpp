// OriginGate: a CallbackTransport decorator that keeps each receiver origin to its limits and
// behind its own circuit breaker, and answers "not now" instead of holding requests it cannot send.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rebound/delivery/callback_transport.hpp"

namespace rebound {

/// The limits and the breaker of an OriginGate. Every bound a receiver could push is here.
struct OriginGateOptions {
  /// Requests in flight to one origin (`scheme://host:port`) at most. A hung receiver holds at
  /// most this many connections.
  std::size_t max_per_origin = 64;
  /// Requests in flight in all, at most. The last eighth of it (128 of 1,024) is kept for origins
  /// that answer (see the class).
  std::size_t max_total = 1024;
  /// Requests that may wait in memory for a place to free up while the origin is healthy, per
  /// origin and in all. Beyond them a request is answered `deferred` at once, with a time to come
  /// back that follows the origin's pace. Unbounded by default here (a receiver that stops
  /// answering opens its circuit, which sends them all back); a JobQueue sets the per-origin bound
  /// to a quarter of its capacity unless it is set.
  std::size_t max_waiting_per_origin = std::numeric_limits<std::size_t>::max();
  std::size_t max_waiting = std::numeric_limits<std::size_t>::max();
  /// A healthy origin fast enough to send everything waiting for it within this time (at the
  /// pace of its recent attempts: their latency / max_per_origin a request) may keep more than
  /// `max_waiting_per_origin` waiting in memory: such a backlog holds its slots only briefly, and
  /// sending it to the store and back would slow the receiver that is fastest of all. The bound
  /// is for slow receivers. (`max_waiting` still holds.)
  std::chrono::milliseconds quick_backlog{5000};
  /// How long (at least) a tenant that has just sent its callbacks keeps a reservation of the
  /// total: the most it had in flight then, at least one place and at most half of them. While
  /// another tenant has callbacks in flight or waiting, or holds a reservation, a tenant may have
  /// in flight at most an equal part of what the reservations leave (they leave at least half); a
  /// tenant alone may use every place. So one tenant's receivers that
  /// are slow but answer (and so open no circuit) take at most their part, and a tenant whose
  /// callbacks come now and then finds its places free when the next one comes. 0: a tenant
  /// counts only while it has callbacks in flight or waiting.
  std::chrono::milliseconds tenant_share_window{2000};
  /// Consecutive failures (timeouts, refused or broken connections, TLS failures, 5xx) that open
  /// an origin's circuit. 0 disables the breaker.
  std::size_t breaker_failures = 5;
  /// How long an open circuit sends nothing. The first request after it goes out as the probe;
  /// its success closes the circuit, its failure opens it for another cool-down.
  std::chrono::milliseconds breaker_cooldown{30000};
  /// While an origin is paused by hand, requests to it are deferred by this long, one after
  /// another at the origin's pace (they come back this often to find out whether it was resumed).
  std::chrono::milliseconds paused_retry{30000};
  /// Hears each circuit that opens (`open`, with the failures in a row) or closes again
  /// (`closed`), outside the gate's lock, on the thread that ended the attempt. May be empty.
  std::function<void(const std::string& origin, CircuitState state, std::size_t failures)>
      on_circuit;
  /// The clock of cool-downs and deferrals; inject one in tests to move time on without sleeping.
  std::function<std::chrono::steady_clock::time_point()> clock = [] {
    return std::chrono::steady_clock::now();
  };
};

/// Sits in front of any CallbackTransport and gives every receiver origin its own share:
///
/// - **Limits.** At most `max_per_origin` requests in flight to one origin and `max_total` in all.
///   More wait in memory, in order (up to `max_waiting_per_origin`); the attempt's timeout starts
///   only when the inner transport gets the request. The last eighth of `max_total` (none below 8)
///   is kept for origins that answer, while they have fewer than a sixteenth of it in flight: one
///   whose last attempt that said anything of the receiver was no failure, one never measured (one
///   request at a time), and a circuit's probe. So origins that hang (their first request out,
///   then timeouts) fill at most seven eighths and one kept place each for a first request, and
///   a receiver that answers keeps getting places until their circuits open.
/// - **Shares between tenants** (CallbackRequest::tenant): while several tenants have callbacks,
///   each may have in flight at most its part of `max_total` (see `tenant_share_window`), and the
///   places that free up go to the tenants below their part first, in turns.
/// - **A circuit breaker per origin** (and per tenant there: CallbackRequest::tenant). After
///   `breaker_failures` failures in a row the circuit opens: for `breaker_cooldown` nothing is
///   sent to the origin. Then one request goes out as the probe (`half_open`); its success closes
///   the circuit. Any answer that is not a 5xx (a 404, say) counts as the receiver being up.
/// - **Pausing by hand** (`pause`, `resume`): nothing is sent to a paused origin.
///
/// What cannot be sent now is not held: `send` answers it at once with `TransportError::deferred`
/// and `CallbackResponse::retry_in`, the time to try again (the end of the cool-down, the pace the
/// limits allow, or `paused_retry`). A deferral is not an attempt: CallbackSender reports it as
/// AttemptVerdict::deferred and spends none of the delivery's attempts, and rebound::JobQueue puts
/// the callback back in its store, due at that time, so a receiver that is down costs no memory
/// and no capacity however many callbacks wait for it.
///
/// Example:
///   rebound::OriginGate gate(std::make_unique<rebound::CurlTransport>(io.get_executor()));
///   gate.pause("https://hooks.example.com");   // its callbacks wait until resume()
///
/// Thread-safety: every method is thread-safe. `on_done` is called exactly once per `send`: a
/// deferral from inside `send`, an answer from wherever the inner transport calls it. Re-entry:
/// a `send`, `pause` or `resume` made on the thread of a handler a gate is calling (`on_done`,
/// `on_circuit`), to this gate or another, is decided inside the call (the pause, the request's
/// place), but what it leads to (the inner transport's sends, the answers, `on_circuit`) happens
/// after that handler returns, once the answers and sends the gate was making then are made (so
/// a backlog that ends request after request takes no more stack than one). Such a handler
/// must not block that thread waiting for the answer of a `send` it made. A clock that throws is
/// read as `steady_clock::now()`. Lifetime:
/// destroying the gate answers what waits in it `cancelled`, then destroys the inner transport.
class OriginGate final : public CallbackTransport {
 public:
  explicit OriginGate(std::unique_ptr<CallbackTransport> inner, OriginGateOptions options = {});
  ~OriginGate() override;
  OriginGate(const OriginGate&) = delete;
  OriginGate& operator=(const OriginGate&) = delete;

  void send(CallbackRequest request, CallbackResponseHandler on_done) override;

  /// What `send` would answer now for a request to `url` from `tenant` that its origin's open
  /// circuit, its probe out or a pause holds back: the `deferred` response (counted as one), or
  /// nullopt when the request could go (nothing is reserved). Lets a caller skip building a
  /// request that would not be sent, as rebound::JobQueue does before each attempt.
  std::optional<CallbackResponse> defer_now(const std::string& url, const std::string& tenant,
                                            std::chrono::milliseconds timeout);

  /// The origins being delivered to, waiting, failing, open or paused, sorted by origin.
  std::vector<EndpointStatus> endpoints() const override;

  /// Stops sending to `origin` (a URL or an origin: "https://hooks.example.com"; the port defaults
  /// from the scheme) until `resume`: what waits here and what comes later is deferred, what is in
  /// flight ends as it will. Returns the origin as the gate names it ("https://host:443"), or
  /// throws rebound::Error for a URL that is not http(s).
  std::string pause(const std::string& origin);

  /// Sends to `origin` again (its breaker state is kept). False when it was not paused.
  bool resume(const std::string& origin);

  /// The paused origins, sorted.
  std::vector<std::string> paused() const;

  /// The origin key of a callback URL or origin, as `endpoints()` and `pause` name it; empty for
  /// one that is not an http(s) URL.
  static std::string origin_of(const std::string& url);

  struct State;  // shared with the requests in flight

 private:
  std::shared_ptr<State> state_;
};

}  // namespace rebound
