// HttpTransport: the real CallbackTransport, HTTP/1.1 and HTTPS with kept-alive connections.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "rebound/address_guard.hpp"
#include "rebound/callback_transport.hpp"

namespace rebound {

struct HttpTransportOptions {
  /// Requests sent at once, at most. Each sender thread keeps one open connection per receiver
  /// origin, so this is also the most connections kept open to one receiver.
  std::size_t connections = 16;
  /// Receivers each sender thread keeps a connection open to, at most; beyond it the least
  /// recently used connection is closed. Bounds sockets and memory however many receivers there
  /// are.
  std::size_t origins_per_connection = 32;
  /// Which addresses may be contacted. Host names are resolved once per connection and the
  /// connection goes to the address that passed the check.
  AddressGuard guard{};
  /// A PEM file of certificate authorities for https callbacks; empty uses the system's.
  std::string ca_cert_file;
};

/// Sends callbacks over HTTP/1.1 (cpp-httplib), with keep-alive, TLS certificate verification,
/// no redirects followed, and the SSRF guard applied to every connection.
///
/// `send` queues the request for one of `connections` sender threads and returns at once. On
/// destruction, requests not yet started are dropped (their handlers are not called) and the
/// threads are joined. Thread-safety: `send` is thread-safe.
class HttpTransport final : public CallbackTransport {
 public:
  explicit HttpTransport(HttpTransportOptions options = {});
  ~HttpTransport() override;
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  void send(CallbackRequest request, CallbackResponseHandler on_done) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rebound
