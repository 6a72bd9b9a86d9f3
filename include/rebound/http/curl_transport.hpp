// CurlTransport: the shipped CallbackTransport, asynchronous, on libcurl's multi interface driven
// by an Asio executor: thousands of callbacks in flight on one thread, receivers isolated from
// each other.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include "rebound/delivery/address_guard.hpp"
#include "rebound/delivery/callback_transport.hpp"

namespace rebound {

/// The limits and settings of a CurlTransport. Every bound a receiver could push is here.
struct CurlTransportOptions {
  /// Requests in flight to one origin (`scheme://host:port`) at most; more wait their turn, in
  /// order, without spending attempts. A hung receiver holds at most this many connections.
  std::size_t max_per_origin = 64;
  /// Requests in flight in all at most; more wait their turn.
  std::size_t max_total = 1024;
  /// A response's status line and headers, at most; beyond it the attempt fails (`io`).
  std::size_t max_response_header_bytes = 16 * 1024;
  /// A response body is read and discarded up to this many bytes, then the connection is dropped;
  /// the status already received stands (a 2xx with a huge body is a delivery).
  std::size_t max_response_body_bytes = 64 * 1024;
  /// Consecutive failures (timeouts, refused connections, transport errors, 5xx) that open an
  /// origin's circuit. 0 disables the breaker.
  std::size_t breaker_failures = 5;
  /// How long an open circuit holds deliveries back before one probe goes out.
  std::chrono::milliseconds breaker_cooldown{30000};
  /// The longest a delivery waits behind an open circuit without spending an attempt; past it the
  /// attempt ends `circuit_open` (a failure, retried on the delivery's schedule), so that none
  /// waits forever for a receiver that stays down. Checked at each cool-down's end.
  std::chrono::milliseconds breaker_max_wait{300000};
  /// Which addresses may be contacted: checked on every address a connection is opened to, after
  /// DNS (so a name that resolves to a private address is refused, whatever it resolved to
  /// before). Not applied to a proxy's address: with `proxy`, the proxy decides.
  AddressGuard guard{};
  /// A PEM file of certificate authorities for https callbacks; empty uses the system's.
  std::string ca_cert_file;
  /// An egress proxy, e.g. "http://proxy.internal:3128"; empty: none. Environment variables
  /// (https_proxy, no_proxy) are ignored either way: every callback goes through the proxy.
  std::string proxy;
  /// Fixed name resolutions, as curl's --resolve: "host:port:address[,address...]". For tests
  /// and for pinning; everything else goes to the system resolver.
  std::vector<std::string> resolve;
};

/// Sends callbacks with libcurl (HTTP/1.1, HTTPS with certificate verification, kept-alive
/// connections reused per origin, no redirects, http and https only) on an executor you pass in:
/// it has no thread of its own. An attempt's timeout (CallbackRequest::timeout) covers the whole
/// attempt, connect to last byte, and starts when the request is sent, not while it waits for a
/// limit or an open circuit.
///
/// Each origin has a circuit breaker: after `breaker_failures` consecutive failures it opens, and
/// requests to it wait (spending no attempts) until `breaker_cooldown` has passed; then one probe
/// goes out, and its success closes the circuit. `endpoints()` lists the origins.
///
/// Example:
///   boost::asio::io_context io;
///   rebound::CallbackSender sender(io.get_executor(),
///                                  std::make_unique<rebound::CurlTransport>(io.get_executor()));
///
/// `on_done` is called exactly once per `send`, on the executor (never inside `send`), also when
/// the transport is destroyed first (`TransportError::cancelled`). Thread-safety: `send` and
/// `endpoints` are thread-safe. The executor must run for requests to progress; destroy the
/// transport while it still runs (or after it stopped for good).
class CurlTransport final : public CallbackTransport {
 public:
  explicit CurlTransport(boost::asio::any_io_executor executor, CurlTransportOptions options = {});
  ~CurlTransport() override;
  CurlTransport(const CurlTransport&) = delete;
  CurlTransport& operator=(const CurlTransport&) = delete;

  void send(CallbackRequest request, CallbackResponseHandler on_done) override;
  std::vector<EndpointStatus> endpoints() const override;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace rebound
