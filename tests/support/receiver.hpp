// A real callback receiver on loopback for tests: records every request, answers as scripted.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rebound::test {

class Receiver {
 public:
  struct Request {
    std::string path;
    std::string body;
    httplib::Headers headers;
    int remote_port = 0;
    std::chrono::steady_clock::time_point at;
    std::string header(const std::string& name) const {
      auto it = headers.find(name);
      return it == headers.end() ? std::string() : it->second;
    }
  };
  /// Fills in the answer to one request; the default answers 200 "{}".
  using Responder = std::function<void(const Request&, httplib::Response&)>;

  /// Listens on 127.0.0.1:`port` (0: any free port).
  explicit Receiver(int port = 0) {
    // Enough threads for every sender connection (cpp-httplib serves one connection per thread),
    // and no forced reconnects, so that tests see the sender's own connection behaviour.
    server_.new_task_queue = [] { return new httplib::ThreadPool(64); };
    server_.set_keep_alive_max_count(100000);
    // Idle connections close after a second: stop() waits for them, and senders must cope.
    server_.set_keep_alive_timeout(1);
    server_.Post(R"(/.*)", [this](const httplib::Request& req, httplib::Response& res) {
      Request r{req.path, req.body, req.headers, req.remote_port, std::chrono::steady_clock::now()};
      Responder responder;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!script_.empty()) {
          responder = std::move(script_.front());
          script_.pop_front();
        } else {
          responder = fallback_;
        }
      }
      res.status = 200;
      res.set_content("{}", "application/json");
      if (responder) responder(r, res);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        received_.push_back(std::move(r));
      }
      changed_.notify_all();
    });
    // As rebound::Server does: remember the listening socket to raise cpp-httplib's backlog of 5.
    server_.set_socket_options([this](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_socket_ = sock;
    });
    port_ = port == 0 ? server_.bind_to_any_port("127.0.0.1")
                      : (server_.bind_to_port("127.0.0.1", port) ? port : -1);
    if (port_ <= 0) throw std::runtime_error("test receiver: cannot bind");
    ::listen(listen_socket_, SOMAXCONN);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }

  ~Receiver() { stop(); }

  void stop() {
    // cpp-httplib's stop() does nothing until its accept loop has marked itself running: a
    // receiver stopped at once (a test whose callbacks were all refused) would wait in accept
    // for ever. As rebound::Server does, wait (briefly) for the loop first.
    if (thread_.joinable()) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!server_.is_running() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  int port() const { return port_; }
  std::string url(const std::string& path = "/hook") const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }

  /// Answers the next requests with these statuses, in order; then with the fallback.
  void script_statuses(const std::vector<int>& statuses) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int status : statuses) {
      script_.push_back([status](const Request&, httplib::Response& res) { res.status = status; });
    }
  }
  void script(Responder responder) {
    std::lock_guard<std::mutex> lock(mutex_);
    script_.push_back(std::move(responder));
  }
  /// How requests beyond the script are answered (default: 200).
  void set_fallback(Responder responder) {
    std::lock_guard<std::mutex> lock(mutex_);
    fallback_ = std::move(responder);
  }

  /// Waits until at least `n` requests have arrived. False on timeout.
  bool wait_for(std::size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return received_.size() >= n; });
  }

  std::vector<Request> received() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_;
  }
  std::size_t count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_.size();
  }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  socket_t listen_socket_ = INVALID_SOCKET;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Responder> script_;
  Responder fallback_;
  std::vector<Request> received_;
};

/// A loopback port with nothing listening on it (bound, then released).
inline int unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error("test: cannot find a free port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

/// Polls `predicate` every few milliseconds until it holds or `timeout` passes.
template <typename Predicate>
bool eventually(Predicate predicate, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return predicate();
}

}  // namespace rebound::test
