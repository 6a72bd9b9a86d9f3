// Server: the HTTP front of a Service (routes of DESIGN.md), on cpp-httplib.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "rebound/address_guard.hpp"
#include "rebound/service.hpp"

namespace rebound {

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 8080;                       ///< 0 picks a free port; `bind()` returns it
  std::size_t max_body_bytes = 6291456;  ///< larger bodies get 413 (SageMaker's limit)
  /// HTTP connections served at once. cpp-httplib gives each kept-alive connection a thread, so
  /// this is also the most concurrent clients served without queueing.
  std::size_t http_threads = 64;
  /// Checks callback URLs at submission. Must agree with the transport's guard.
  AddressGuard guard{};
  /// When not empty, every route but `/ping` and `/openapi.json` requires
  /// `Authorization: Bearer <one of these keys>` (several keys allow rotation); else 401.
  std::vector<std::string> api_keys;
  /// How long `POST /invocations` waits for its result before answering 504 (SageMaker allows 60
  /// s).
  std::chrono::milliseconds invocation_timeout{60000};
};

/// Serves a Service over HTTP:
///   POST /v1/inferences, GET /v1/inferences/{id}, POST /v1/inferences/{id}/redeliver,
///   GET /v1/inferences?callback_state=failed, POST /invocations, GET /ping, GET /openapi.json
/// Errors have the shape {"error": {"code", "message", "field"?}} (see docs/http-api.md).
///
/// Example:
///   rebound::Server server(service, {"127.0.0.1", 8080});
///   server.bind();
///   std::thread t([&] { server.run(); });
///   ...
///   server.stop(); t.join();
///
/// Thread-safety: `stop` and `port` may be called from any thread; `bind` and `run` once each.
/// The Service must outlive the Server.
class Server final {
 public:
  Server(Service& service, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds the listening socket and returns the port. Throws rebound::Error when it cannot.
  int bind();

  /// Serves requests until `stop()`; binds first if `bind()` was not called. Blocks.
  void run();

  /// Stops serving; `run` returns. Safe to call more than once, and before `run`.
  void stop();

  /// The bound port, or 0 before `bind()`.
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rebound
