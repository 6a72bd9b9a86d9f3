// Internal: cpp-httplib's server with rebound's own connection handling (limits, timeouts,
// pipelining, a bounded request body), so that no client can make it hold memory or a thread
// without bound. Not installed: only src/http/server.cpp and the fuzzer include it.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace rebound::detail {

/// What one connection may cost. Every buffer a client can fill has its bound here.
struct HttpLimits {
  std::size_t max_head_bytes = 64 * 1024;  ///< request line and headers; beyond: 400, closed
  std::size_t max_body_bytes = 6291456;    ///< decoded body; beyond: 413, closed
  /// Idle time allowed before a request's first byte (a new or kept-alive connection). While
  /// other connections wait for a thread, an idle one is closed after `idle_under_pressure`.
  std::chrono::milliseconds keep_alive_timeout{5000};
  std::chrono::milliseconds idle_under_pressure{100};
  std::chrono::milliseconds header_timeout{10000};    ///< first byte to end of headers
  std::chrono::milliseconds body_timeout{60000};      ///< first byte to end of body
  std::chrono::milliseconds write_timeout{5000};      ///< per write of the response
  std::chrono::milliseconds response_timeout{60000};  ///< first write to last of a response
  std::size_t max_requests_per_connection = 100000;
};

/// The bytes of one connection as cpp-httplib reads and writes them. Unlike httplib's own stream
/// it keeps what it read ahead from one request to the next (pipelining), counts bytes against
/// the limits and enforces the deadlines. Subclasses move the bytes: a socket, or memory.
class ConnectionStream : public httplib::Stream {
 public:
  explicit ConnectionStream(const HttpLimits& limits) : limits_(limits) {}

  bool is_readable() const override { return true; }
  bool is_writable() const override { return !write_failed_; }
  ssize_t read(char* ptr, std::size_t size) override;
  ssize_t write(const char* ptr, std::size_t size) override;

  /// Waits up to `timeout` for a request's first byte; false when the peer closed or went quiet.
  /// `give_up` is asked between short waits whether to stop waiting early.
  bool wait_for_request(std::chrono::milliseconds timeout, const std::function<bool()>& give_up);

  /// Reads and waits give up once `*stopping` turns true (the server stops).
  void watch_stopping(const std::atomic<bool>* stopping) { stopping_ = stopping; }

  /// A new request starts: the head limit and deadline apply from here.
  void begin_request();
  /// The headers are parsed: the body limit and deadline apply from here.
  void begin_body(bool has_body);

  /// The request's body was read to its end (so the next request starts where it stopped).
  void body_consumed() { body_consumed_ = true; }
  /// The connection ends after this response (an unread body, a refused request).
  void close_after_response() { close_ = true; }
  /// True when the connection cannot carry another request: the request was not read to its end
  /// (bad or over-long head, unread body), or the peer or a write failed.
  bool must_close() const;
  /// True when the peer may still be sending the request just answered: closing at once could
  /// reset the connection before the peer reads the answer.
  bool may_still_be_sending() const {
    return in_request_ && !peer_closed_ &&
           (!headers_parsed_ || over_limit_ || (has_body_ && !body_consumed_));
  }

  /// A limit of HttpLimits cut the request short, or one header line was longer than
  /// cpp-httplib reads (CPPHTTPLIB_HEADER_MAX_LENGTH): either way the head is too large (431).
  bool over_limit() const { return over_limit_ || header_line_too_long_; }
  /// The request's head held a control byte (NUL, a bare CR, DEL, ...): refuse it.
  bool control_in_head() const { return control_in_head_; }
  /// A deadline of HttpLimits ran out while reading the request.
  bool timed_out() const { return timed_out_; }

 protected:
  /// What receive() and send() return when their wait ran out (-1: any other failure).
  static constexpr ssize_t wait_ran_out = -2;
  /// Receives into `buffer`, waiting at most `timeout`. Returns the count, 0 at end of stream,
  /// wait_ran_out, or -1 on an error.
  virtual ssize_t receive(char* buffer, std::size_t size, std::chrono::milliseconds timeout) = 0;
  virtual ssize_t send(const char* data, std::size_t size, std::chrono::milliseconds timeout) = 0;

 private:
  bool fill();
  void note_head(const char* bytes, std::size_t n);

  const HttpLimits& limits_;
  std::vector<char> buffer_ = std::vector<char>(16 * 1024);
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  std::size_t budget_ = 0;  // bytes the current phase may still read
  std::chrono::steady_clock::time_point request_start_{};
  std::chrono::steady_clock::time_point deadline_{};
  std::chrono::steady_clock::time_point response_deadline_{};
  const std::atomic<bool>* stopping_ = nullptr;
  bool in_request_ = false;
  bool headers_parsed_ = false;
  bool has_body_ = false;
  bool body_consumed_ = false;
  bool close_ = false;
  bool over_limit_ = false;
  bool header_line_too_long_ = false;
  bool control_in_head_ = false;
  unsigned char previous_head_byte_ = 0;
  std::size_t head_lines_ = 0;       // line ends seen in the head so far
  std::size_t head_line_bytes_ = 0;  // bytes of the head's current line
  bool timed_out_ = false;
  bool peer_closed_ = false;
  bool write_failed_ = false;
};

/// The connection being served on this thread (for handlers that must end it after answering).
ConnectionStream* current_connection();

/// Threads that serve connections; knows how many connections wait for one.
class ConnectionPool final : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(std::size_t threads);
  ~ConnectionPool() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;
  /// Connections accepted and waiting for a thread.
  std::size_t waiting() const { return waiting_.load(std::memory_order_relaxed); }

 private:
  void work();
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  std::atomic<std::size_t> waiting_{0};
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

/// How reading a request body ended.
enum class BodyRead { ok, too_large, malformed, unsupported, timed_out };

/// Reads the body of `req` into `body`, holding it to `limit` decoded bytes: `Content-Length`
/// (refused before reading when over the limit), `chunked`, or none (an empty body, at once).
BodyRead read_body(const httplib::Request& req, const httplib::ContentReader& reader,
                   std::size_t limit, std::string& body);

/// cpp-httplib's Server with rebound's connection loop (see ConnectionStream).
/// Thread-safety: as httplib::Server; `serve_bytes` is for one thread at a time (fuzzing, tests).
class HttpServer final : public httplib::Server {
 public:
  explicit HttpServer(HttpLimits limits, std::size_t threads);

  /// Serves the requests in `input` as if they arrived on one connection; returns what the
  /// server wrote back. For the fuzzer and tests: no socket involved.
  std::string serve_bytes(std::string input);

  /// Stops accepting and ends kept-alive connections; then as httplib::Server::stop.
  void shutdown();

  const HttpLimits& limits() const { return limits_; }

 private:
  bool process_and_close_socket(socket_t sock) override;
  void serve(ConnectionStream& stream);

  HttpLimits limits_;
  std::atomic<bool> stopping_{false};
  std::atomic<ConnectionPool*> pool_{nullptr};
};

}  // namespace rebound::detail
