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
#include "rebound/delivery/origin_gate.hpp"

namespace rebound {

/// The limits and settings of a CurlTransport. Every bound a receiver could push is here.
struct CurlTransportOptions {
  /// Connections open at once, at most (curl's cap; requests beyond it wait inside curl, their
  /// timeout running). The OriginGate in front of it keeps requests within its own limits first:
  /// keep this at least OriginGateOptions::max_total.
  std::size_t max_total = 1024;
  /// A response's status line and headers, at most; beyond it the attempt fails (`io`).
  std::size_t max_response_header_bytes = 16 * 1024;
  /// A response body is read and discarded up to this many bytes, then the connection is dropped;
  /// the status already received stands (a 2xx with a huge body is a delivery).
  std::size_t max_response_body_bytes = 64 * 1024;
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
/// attempt, connect to last byte.
///
/// Per-origin limits and circuit breakers are not here but in rebound::OriginGate, which every
/// JobQueue puts in front of its transport; put one in front yourself when you use a
/// CallbackSender directly.
///
/// Example:
///   boost::asio::io_context io;
///   rebound::CallbackSender sender(
///       io.get_executor(), std::make_unique<rebound::OriginGate>(
///                              std::make_unique<rebound::CurlTransport>(io.get_executor())));
///
/// `on_done` is called exactly once per `send`, on the executor (never inside `send`), also when
/// the transport is destroyed first (`TransportError::cancelled`). A failure of this side's own
/// (out of descriptors, say) is marked `CallbackResponse::local`. Thread-safety: `send` is
/// thread-safe. The executor must run for requests to progress; destroy the
/// transport while it still runs (or after it stopped for good).
class CurlTransport final : public CallbackTransport {
 public:
  explicit CurlTransport(boost::asio::any_io_executor executor, CurlTransportOptions options = {});
  ~CurlTransport() override;
  CurlTransport(const CurlTransport&) = delete;
  CurlTransport& operator=(const CurlTransport&) = delete;

  void send(CallbackRequest request, CallbackResponseHandler on_done) override;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace rebound
