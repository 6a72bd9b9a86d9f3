// A real redis-server for a test: started on a free loopback port in a temporary folder, ended
// (by its process id) when the test ends. Stop and start it again to test a Redis that goes away.
#pragma once

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "support/temp_dir.hpp"

#ifndef REBOUND_REDIS_SERVER
#error "REBOUND_REDIS_SERVER (the path of redis-server) is defined by tests/CMakeLists.txt"
#endif

namespace rebound::test {

class RedisServer {
 public:
  /// `extra`: more redis-server arguments, e.g. {"--appendonly", "yes"}.
  explicit RedisServer(std::vector<std::string> extra = {}) : extra_(std::move(extra)) {
    port_ = free_port();
    start();
  }
  ~RedisServer() { stop(SIGKILL); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string uri() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  void start() {
    REQUIRE(pid_ == -1);
    std::vector<std::string> args{REBOUND_REDIS_SERVER,
                                  "--port",
                                  std::to_string(port_),
                                  "--bind",
                                  "127.0.0.1",
                                  "--dir",
                                  dir_.path.string(),
                                  "--save",
                                  "",
                                  "--daemonize",
                                  "no",
                                  "--loglevel",
                                  "warning",
                                  "--logfile",
                                  dir_.file("redis.log")};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args)
        argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!answers_ping()) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  /// Ends it: SIGTERM lets it write its data (an append-only file) first, SIGKILL does not.
  void stop(int signal = SIGTERM) {
    if (pid_ <= 0) return;
    kill(pid_, signal);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  /// Pauses and resumes it (a hung Redis: connections stay open, nothing answers).
  void pause() { kill(pid_, SIGSTOP); }
  void resume() { kill(pid_, SIGCONT); }

 private:
  static int free_port() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t len = sizeof addr;
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    return ntohs(addr.sin_port);
  }

  bool answers_ping() const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    bool ok = false;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      const char ping[] = "PING\r\n";
      char answer[16] = {0};
      ok = send(fd, ping, sizeof ping - 1, 0) == sizeof ping - 1 &&
           recv(fd, answer, sizeof answer - 1, 0) > 0 && std::string(answer).rfind("+PONG", 0) == 0;
    }
    close(fd);
    return ok;
  }

  std::vector<std::string> extra_;
  TempDir dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace rebound::test
