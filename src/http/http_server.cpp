// Internal: rebound's connection loop under cpp-httplib's request parser (see http_server.hpp).
#include "http_server.hpp"

#include "rebound/detail/text.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string_view>

namespace rebound::detail {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

thread_local ConnectionStream* this_threads_connection = nullptr;

struct ServingConnection {
  explicit ServingConnection(ConnectionStream* stream) { this_threads_connection = stream; }
  ~ServingConnection() { this_threads_connection = nullptr; }
};

int poll_ms(milliseconds timeout) {
  const auto count = std::clamp<milliseconds::rep>(timeout.count(), 0, 60 * 60 * 1000);
  return static_cast<int>(count);
}

bool has_body(const httplib::Request& req) {
  return req.has_header("Transfer-Encoding") || req.get_header_value_count("Content-Length") > 1 ||
         (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
}

// A connection on an accepted socket.
class SocketConnection final : public ConnectionStream {
 public:
  SocketConnection(socket_t fd, const HttpLimits& limits) : ConnectionStream(limits), fd_(fd) {}

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0)
      describe(address, length, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0)
      describe(address, length, ip, port);
  }
  // cpp-httplib (built without CPPHTTPLIB_USE_POLL) answers 500 to a socket at or above
  // FD_SETSIZE because its own stream would select() on it. This stream polls, so it never does.
  socket_t socket() const override { return fd_ < FD_SETSIZE ? fd_ : INVALID_SOCKET; }

 protected:
  ssize_t receive(char* buffer, std::size_t size, milliseconds timeout) override {
    const auto deadline = steady_clock::now() + timeout;
    for (;;) {
      if (!wait(POLLIN, deadline)) return wait_ran_out;
      const ssize_t n = ::recv(fd_, buffer, size, MSG_DONTWAIT);
      if (n >= 0) return n;
      if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    }
  }
  ssize_t send(const char* data, std::size_t size, milliseconds timeout) override {
    const auto deadline = steady_clock::now() + timeout;
    for (;;) {
      if (!wait(POLLOUT, deadline)) return wait_ran_out;
      // Non-blocking: the wait above is the only one (a blocking send of a large buffer would
      // wait for all of it, past every deadline).
      const ssize_t n = ::send(fd_, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) return n;
      if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    }
  }

 private:
  bool wait(short events, steady_clock::time_point deadline) const {
    pollfd p{fd_, events, 0};
    for (;;) {
      const int ready = ::poll(
          &p, 1, poll_ms(std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now())));
      if (ready > 0) return true;  // readable, writable, or an error that recv/send will report
      if (ready == 0 || errno != EINTR) return false;
    }
  }

  static void describe(const sockaddr_storage& address, socklen_t length, std::string& ip,
                       int& port) {
    char host[NI_MAXHOST];
    char service[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host, sizeof host,
                      service, sizeof service, NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
      ip = host;
      port = std::atoi(service);
    }
  }

  socket_t fd_;
};

// A connection whose bytes come from memory (the fuzzer, tests).
class MemoryConnection final : public ConnectionStream {
 public:
  MemoryConnection(std::string input, const HttpLimits& limits)
      : ConnectionStream(limits), input_(std::move(input)) {}

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 40000;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 8080;
  }
  socket_t socket() const override { return INVALID_SOCKET; }
  std::string& output() { return output_; }

 protected:
  ssize_t receive(char* buffer, std::size_t size, milliseconds) override {
    const std::size_t n = std::min(size, input_.size() - offset_);
    std::memcpy(buffer, input_.data() + offset_, n);
    offset_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t send(const char* data, std::size_t size, milliseconds) override {
    output_.append(data, size);
    return static_cast<ssize_t>(size);
  }

 private:
  std::string input_;
  std::size_t offset_ = 0;
  std::string output_;
};

}  // namespace

ConnectionStream* current_connection() {
  return this_threads_connection;
}

// --- ConnectionStream

bool ConnectionStream::fill() {
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  // Waits in slices, so that a server that stops does not wait out a stalled client.
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline_ - steady_clock::now());
    if (left.count() <= 0 || (stopping_ && *stopping_)) {
      timed_out_ = true;
      return false;
    }
    const ssize_t n = receive(buffer_.data() + end_, buffer_.size() - end_,
                              std::min<milliseconds>(left, milliseconds(100)));
    if (n > 0) {
      end_ += static_cast<std::size_t>(n);
      return true;
    }
    if (n == 0) peer_closed_ = true;
    if (n != wait_ran_out) return false;
  }
}

ssize_t ConnectionStream::read(char* ptr, std::size_t size) {
  if (budget_ == 0) {
    // Over the limit: an end of stream, so that cpp-httplib still answers (400, 414) and stops.
    over_limit_ = true;
    return 0;
  }
  if (begin_ == end_ && !fill()) return peer_closed_ ? 0 : -1;
  const std::size_t n = std::min({size, end_ - begin_, budget_});
  std::memcpy(ptr, buffer_.data() + begin_, n);
  if (in_request_ && !headers_parsed_) note_head(ptr, n);
  begin_ += n;
  budget_ -= n;
  return static_cast<ssize_t>(n);
}

ssize_t ConnectionStream::write(const char* ptr, std::size_t size) {
  if (write_failed_) return -1;
  // Each write within write_timeout, and the whole response within response_timeout: a client
  // that reads a few bytes now and then cannot hold the thread.
  const auto now = steady_clock::now();
  if (response_deadline_ == steady_clock::time_point{})
    response_deadline_ = now + limits_.response_timeout;
  const auto left = std::chrono::duration_cast<milliseconds>(response_deadline_ - now);
  const ssize_t n = left.count() > 0 ? send(ptr, size, std::min(left, limits_.write_timeout)) : -1;
  if (n < 0) {
    write_failed_ = true;
    return -1;
  }
  return n;
}

bool ConnectionStream::wait_for_request(std::chrono::milliseconds timeout,
                                        const std::function<bool()>& give_up) {
  in_request_ = false;
  if (begin_ < end_) return true;
  begin_ = end_ = 0;
  const auto deadline = steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now());
    if (left.count() <= 0) return false;
    const ssize_t n = receive(buffer_.data(), buffer_.size(),
                              std::min<milliseconds>(left, limits_.idle_under_pressure));
    if (n > 0) {
      end_ = static_cast<std::size_t>(n);
      return true;
    }
    if (n != wait_ran_out) return false;
    if (give_up && give_up()) return false;
  }
}

// The head as sent, before cpp-httplib decodes it (it percent-decodes header values):
// - a header line (not the request line: its limit is 414's) longer than cpp-httplib reads, line
//   end included, is refused by it as a bad request; it is a head too large (431), as documented;
// - a control byte (anything below 0x20 but HTAB and a CR before its LF, or DEL) is how requests
//   are smuggled past proxies: noted for the router to refuse (400 invalid_header).
void ConnectionStream::note_head(const char* bytes, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    ++head_line_bytes_;
    if (b == '\n') {
      if (head_lines_ > 0 && previous_head_byte_ == '\r' &&
          head_line_bytes_ > CPPHTTPLIB_HEADER_MAX_LENGTH) {
        header_line_too_long_ = true;
      }
      ++head_lines_;
      head_line_bytes_ = 0;
    } else if ((b < 0x20 && b != '\t' && b != '\r') || b == 0x7f || previous_head_byte_ == '\r') {
      control_in_head_ = true;
    }
    previous_head_byte_ = b;
  }
}

void ConnectionStream::begin_request() {
  in_request_ = true;
  request_start_ = steady_clock::now();
  deadline_ = request_start_ + limits_.header_timeout;
  budget_ = limits_.max_head_bytes;
  headers_parsed_ = has_body_ = body_consumed_ = close_ = over_limit_ = timed_out_ = false;
  header_line_too_long_ = control_in_head_ = false;
  head_lines_ = head_line_bytes_ = 0;
  previous_head_byte_ = 0;
  response_deadline_ = {};
}

void ConnectionStream::begin_body(bool has_body) {
  headers_parsed_ = true;
  has_body_ = has_body;
  deadline_ = request_start_ + limits_.body_timeout;
  // Raw bytes: the decoded body plus room for chunk framing. The decoded size is held to
  // max_body_bytes by read_body; this bound covers what httplib reads around it (chunk lines).
  budget_ = limits_.max_body_bytes * 2 + 64 * 1024;
}

bool ConnectionStream::must_close() const {
  return !headers_parsed_ || close_ || (has_body_ && !body_consumed_) || write_failed_;
}

// --- ConnectionPool

ConnectionPool::ConnectionPool(std::size_t threads) {
  threads_.reserve(threads);
  for (std::size_t i = 0; i < threads; ++i)
    threads_.emplace_back([this] { work(); });
}

ConnectionPool::~ConnectionPool() {
  shutdown();
}

void ConnectionPool::enqueue(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(fn));
    waiting_.store(jobs_.size(), std::memory_order_relaxed);
  }
  ready_.notify_one();
}

void ConnectionPool::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& t : threads_)
    t.join();
  threads_.clear();
}

void ConnectionPool::work() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and every accepted connection was served
      job = std::move(jobs_.front());
      jobs_.pop_front();
      waiting_.store(jobs_.size(), std::memory_order_relaxed);
    }
    try {
      job();
    } catch (...) {
      // One connection failed (out of memory, say); the server serves the others.
    }
  }
}

// --- read_body

BodyRead read_body(const httplib::Request& req, const httplib::ContentReader& reader,
                   std::size_t limit, std::string& body) {
  ConnectionStream* connection = current_connection();
  auto consumed = [connection] {
    if (connection) connection->body_consumed();
    return BodyRead::ok;
  };
  const std::string encoding = req.get_header_value("Content-Encoding");
  if (!encoding.empty() && !equals_ignoring_case(encoding, "identity"))
    return BodyRead::unsupported;
  if (req.has_header("Transfer-Encoding")) {
    // Only plain chunked: anything else (gzip, a list) is refused rather than guessed at.
    if (!equals_ignoring_case(req.get_header_value("Transfer-Encoding"), "chunked") ||
        req.get_header_value_count("Transfer-Encoding") != 1) {
      return BodyRead::unsupported;
    }
  } else if (req.has_header("Content-Length")) {
    const std::string text = req.get_header_value("Content-Length");
    if (req.get_header_value_count("Content-Length") != 1 || text.empty() || text.size() > 18 ||
        text.find_first_not_of("0123456789") != std::string::npos) {
      return BodyRead::malformed;
    }
    const unsigned long long length = std::stoull(text);
    if (length > limit) return BodyRead::too_large;  // refused unread
    if (length == 0) return consumed();
    body.reserve(static_cast<std::size_t>(length));
  } else {
    return consumed();  // HTTP/1.1: no Content-Length and no Transfer-Encoding is an empty body
  }
  bool too_large = false;
  const bool ok = reader([&](const char* data, std::size_t size) {
    if (body.size() + size > limit) {
      too_large = true;
      return false;
    }
    body.append(data, size);
    return true;
  });
  if (ok) return consumed();
  if (too_large || (connection && connection->over_limit())) return BodyRead::too_large;
  if (connection && connection->timed_out()) return BodyRead::timed_out;
  return BodyRead::malformed;
}

// --- HttpServer

HttpServer::HttpServer(HttpLimits limits, std::size_t threads) : limits_(limits) {
  new_task_queue = [this, threads] {
    auto* pool = new ConnectionPool(threads);
    pool_ = pool;
    return pool;
  };
  // The body limit is read_body's; httplib's own check would read and discard a declared body
  // of any size before answering.
  set_payload_max_length(std::numeric_limits<std::size_t>::max());
  // Only for the Keep-Alive header httplib writes: the connection loop is ours.
  set_keep_alive_max_count(limits_.max_requests_per_connection);
  set_keep_alive_timeout(
      std::chrono::duration_cast<std::chrono::seconds>(limits_.keep_alive_timeout).count());
  // A response that ends its connection says so, instead of the Keep-Alive httplib wrote.
  set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    ConnectionStream* connection = current_connection();
    if (connection && connection->must_close() && !res.has_header("Connection")) {
      res.headers.erase("Keep-Alive");
      res.set_header("Connection", "close");
    }
  });
}

void HttpServer::shutdown() {
  stopping_ = true;
  stop();
}

std::string HttpServer::serve_bytes(std::string input) {
  MemoryConnection connection(std::move(input), limits_);
  serve(connection);
  return std::move(connection.output());
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  {
    SocketConnection connection(sock, limits_);
    serve(connection);
    if (connection.may_still_be_sending()) {
      // Lingering close (as nginx does): stop sending, then read and discard for a while, so
      // that a client which sends its whole body before reading (most do) sees the answer
      // instead of a reset. Bounded: 2 s, and the body limit plus 1 MiB.
      ::shutdown(sock, SHUT_WR);
      char discard[16 * 1024];
      std::size_t drained = 0;
      const std::size_t drain_limit = limits_.max_body_bytes + (1u << 20);
      // Shorter while other connections wait for a thread.
      ConnectionPool* pool = pool_.load();
      const auto until =
          steady_clock::now() + milliseconds(pool && pool->waiting() > 0 ? 200 : 2000);
      pollfd p{sock, POLLIN, 0};
      while (drained < drain_limit && steady_clock::now() < until &&
             ::poll(&p, 1,
                    poll_ms(std::chrono::duration_cast<milliseconds>(until -
                                                                     steady_clock::now()))) > 0) {
        const ssize_t n = ::recv(sock, discard, sizeof discard, 0);
        if (n <= 0) break;
        drained += static_cast<std::size_t>(n);
      }
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return true;
}

void HttpServer::serve(ConnectionStream& stream) {
  ServingConnection serving(&stream);
  stream.watch_stopping(&stopping_);
  ConnectionPool* pool = pool_.load();
  auto give_up = [this, pool] { return stopping_.load() || (pool && pool->waiting() > 0); };
  for (std::size_t served = 0; !stopping_;) {
    if (!stream.wait_for_request(limits_.keep_alive_timeout, give_up)) break;
    stream.begin_request();
    const bool last = ++served >= limits_.max_requests_per_connection;
    bool client_closes = false;
    const bool written =
        process_request(stream, last, client_closes, [&stream](httplib::Request& req) {
          stream.begin_body(has_body(req));
          // Range requests would have httplib copy the body once per range (gigabytes from one
          // 8 KiB header); no route serves ranges.
          req.ranges.clear();
          // Framing that another hop could read differently (request smuggling) gets one request
          // per connection: a chunked body, or more than one Content-Length.
          if (req.has_header("Transfer-Encoding") ||
              req.get_header_value_count("Content-Length") > 1) {
            stream.close_after_response();
          }
        });
    if (!written || client_closes || last || stream.must_close()) break;
  }
}

}  // namespace rebound::detail
