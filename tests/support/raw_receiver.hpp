// A callback receiver on a bare socket, for receivers no HTTP library would be: one that hangs,
// trickles, answers with a gigabyte or with endless headers. Each connection runs `behaviour` on
// a thread of its own; the receiver counts connections, at once and in all.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rebound::test {

class RawReceiver {
 public:
  /// What one connection does; `stopping` turns true when the receiver is destroyed.
  using Behaviour = std::function<void(int fd, const std::atomic<bool>& stopping)>;

  explicit RawReceiver(Behaviour behaviour, const std::string& address = "127.0.0.1", int port = 0)
      : behaviour_(std::move(behaviour)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int yes = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listener_, 1024) != 0) {
      ::close(listener_);
      throw std::runtime_error("RawReceiver: cannot listen on " + address);
    }
    socklen_t length = sizeof a;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &length);
    port_ = ntohs(a.sin_port);
    address_ = address;
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~RawReceiver() {
    stopping_ = true;
    acceptor_.join();
    ::close(listener_);
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      threads.swap(threads_);
    }
    for (auto& t : threads)
      t.join();
  }

  int port() const { return port_; }
  std::string url(const std::string& path = "/hook") const {
    return "http://" + address_ + ":" + std::to_string(port_) + path;
  }
  int connections() const { return accepted_; }
  /// Connections whose behaviour has returned (the peer closed, or the behaviour gave up).
  int ended() const { return ended_; }
  int most_at_once() const { return most_at_once_; }

  /// Reads one request (head and Content-Length body); false when the peer closed or stopping.
  static bool read_request(int fd, const std::atomic<bool>& stopping) {
    std::string data;
    std::size_t body_needed = std::string::npos;
    std::size_t head_end = std::string::npos;
    while (!stopping) {
      if (head_end != std::string::npos && data.size() >= head_end + body_needed) return true;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buffer[8192];
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) return false;
      data.append(buffer, static_cast<std::size_t>(n));
      if (head_end == std::string::npos &&
          (head_end = data.find("\r\n\r\n")) != std::string::npos) {
        head_end += 4;
        body_needed = 0;
        std::string lower = data.substr(0, head_end);
        std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
        const auto at = lower.find("content-length:");
        if (at != std::string::npos) body_needed = std::stoul(lower.substr(at + 15));
      }
    }
    return false;
  }

  /// Sends all of `text`; false when the peer went away.
  static bool send_all(int fd, const std::string& text) {
    std::size_t sent = 0;
    while (sent < text.size()) {
      const ssize_t n = ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }

  /// Waits until stopping, or until the peer closes.
  static void hold(int fd, const std::atomic<bool>& stopping) {
    while (!stopping) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) {
        char buffer[4096];
        if (::recv(fd, buffer, sizeof buffer, 0) <= 0) return;
      }
    }
  }

 private:
  void accept_loop() {
    while (!stopping_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) continue;
      ++accepted_;
      const int now = ++open_;
      int seen = most_at_once_;
      while (now > seen && !most_at_once_.compare_exchange_weak(seen, now)) {
      }
      std::lock_guard<std::mutex> lock(mutex_);
      threads_.emplace_back([this, fd] {
        behaviour_(fd, stopping_);
        --open_;
        ++ended_;
        ::close(fd);
      });
    }
  }

  Behaviour behaviour_;
  int listener_ = -1;
  int port_ = 0;
  std::string address_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> accepted_{0};
  std::atomic<int> open_{0};
  std::atomic<int> ended_{0};
  std::atomic<int> most_at_once_{0};
  std::mutex mutex_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

}  // namespace rebound::test
