// Internal: rebound-server's HTTP/1.1 front on Boost.Beast. One session object per connection,
// every read and write asynchronous with its own deadline: a connection costs a socket and its
// buffers, never a thread, and a request waits for its answer without holding one.
// Not installed: src/http/server.cpp, the tests and the fuzzer include it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/any_io_executor.hpp>

#include "http_message.hpp"

namespace rebound::detail {

/// What connections may cost. Every buffer a client can fill has its bound here.
struct HttpLimits {
  std::size_t max_head_bytes = 64 * 1024;  ///< request line and headers; beyond: 431, closed
  std::size_t max_body_bytes = 6291456;    ///< decoded body; beyond: 413, closed
  /// Idle time allowed before a request's first byte (a new or a kept-alive connection).
  std::chrono::milliseconds keep_alive_timeout{5000};
  std::chrono::milliseconds header_timeout{10000};    ///< first byte to end of headers
  std::chrono::milliseconds body_timeout{60000};      ///< end of headers to end of body: 408
  std::chrono::milliseconds response_timeout{60000};  ///< first byte to last of a response
  std::size_t max_requests_per_connection = 100000;
  /// Connections open at once; one more is closed as soon as it is accepted.
  std::size_t max_connections = 10000;
  /// Connections open at once from one client address (0: no limit; behind a proxy every
  /// connection comes from the proxy's address).
  std::size_t max_connections_per_address = 0;
  /// Bytes of request bodies being received at once, as declared (a chunked body counts as
  /// max_body_bytes); one more gets 503 `server_busy` unread. One body is always received.
  std::size_t max_receiving_bytes = std::size_t{256} << 20;
  /// How long a stopping front lets the answers under way be written before it closes them.
  std::chrono::milliseconds stop_grace{2000};
};

/// Answers one request, exactly once, from any thread: a route answers at once or later (when
/// the job it waits for ends). Dropping an unanswered Reply answers 500, so a connection is
/// never left waiting. Move-only.
class Reply {
 public:
  struct State;
  Reply() = default;
  explicit Reply(std::shared_ptr<State> state) : state_(std::move(state)) {}
  Reply(Reply&&) noexcept = default;
  Reply& operator=(Reply&&) noexcept;
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
  ~Reply();

  void operator()(HttpResponse response);
  explicit operator bool() const { return static_cast<bool>(state_); }

  /// The executor of the request's connection (a strand on the front's threads): work that
  /// answers later can run there without another hand-over. Empty once the connection is gone.
  /// Post to it only while the front lives.
  boost::asio::any_io_executor executor() const;

  /// `abandoned` runs once if the client goes away (or the front stops) before the answer: the
  /// route may then give up what it holds for the request. Runs at once when it went already;
  /// else later, on the session's thread. Set it before handing the Reply on.
  void on_abandoned(std::function<void()> abandoned);

 private:
  std::shared_ptr<State> state_;
};

/// How the front hands a request to the routes: on one of the front's threads, which it may use
/// for short blocking work (a store call), never to wait for a job.
using HttpHandler = std::function<void(HttpRequest&, Reply)>;

/// What the front answers itself, before any route: the error bodies of 400, 408, 413, 414, 431
/// and of control bytes in the head.
using HttpErrorBody = std::function<HttpResponse(int status, const std::string& code)>;

/// Judges a request from its head, before its body is read: an answer refuses it, the body
/// unread (the connection then ends); nullopt lets it go on. Asked only of a request whose body
/// has yet to arrive (one already buffered costs nothing to read), on one of the front's
/// threads. A request it lets through still goes to the handler whole.
using HttpHeadCheck = std::function<std::optional<HttpResponse>(const HttpRequest& head)>;

/// An HTTP/1.1 server on its own io_context, run by `threads` threads.
/// Thread-safety: `stop` and `port` from any thread; `bind` once, then `run` once.
class HttpFront {
 public:
  HttpFront(HttpLimits limits, std::size_t threads, HttpHandler handler, HttpErrorBody errors,
            HttpHeadCheck head_check = {});
  ~HttpFront();
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;

  /// Listens on host:port (0: any free port); returns the port. Throws rebound::Error.
  int bind(const std::string& host, int port);
  /// Serves until `stop`: the calling thread is one of the `threads`. Blocks.
  void run();
  /// Stops accepting and closes idle connections; answers under way are written (for up to
  /// `stop_grace`), routes still holding a request hear `on_abandoned`; then `run` returns.
  /// Idempotent.
  void stop();
  int port() const;

  /// Serves `input` as the bytes of one connection whose peer then stops sending, and returns
  /// what was written back (over a local socket pair, so the same session code runs). For the
  /// fuzzer and tests; not concurrently with itself. Works whether or not `run` is running: when
  /// it is not, this thread runs the connection, and a `run` called meanwhile waits for it.
  std::string serve_bytes(std::string input);

  /// Connections open now.
  std::size_t connections() const;

  struct Impl;  // (named by the sessions of http_front.cpp)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace rebound::detail
