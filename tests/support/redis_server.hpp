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

  /// A one-node Redis Cluster: cluster mode, every slot its own. What a cluster asks of its
  /// clients (keys declared, one slot a script) is checked as on a cluster of many nodes.
  struct ClusterNode {};
  explicit RedisServer(ClusterNode) : cluster_(true) {
    // A port pair found free may be taken before this node binds it (another test starting one
    // at the same moment): the node then exits at once, and another pair is tried.
    for (int tries = 0; tries < 5; ++tries) {
      port_ = free_cluster_port();
      if (launch()) return;
    }
    FAIL("no Redis Cluster node could start (see its log in " << dir_.path.string() << ")");
  }
  ~RedisServer() { stop(SIGKILL); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string uri() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  void start() { REQUIRE(launch()); }

 private:
  // Starts it and waits until it answers (and, as a cluster node, says the cluster is up); false
  // when it exited first (its port was taken).
  bool launch() {
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
    if (cluster_) {
      // (A short node timeout: a node that starts again rejoins at once.)
      args.insert(args.end(), {"--cluster-enabled", "yes", "--cluster-config-file",
                               dir_.file("nodes.conf"), "--cluster-node-timeout", "500"});
    }
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
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // The answer may come from another test's Redis that took the port first (ours then exits):
    // only ours counts.
    if (ask("INFO server").find("process_id:" + std::to_string(pid_) + "\r") == std::string::npos) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
      return false;
    }
    if (cluster_) {
      // The slots are assigned once (nodes.conf keeps them over a restart); then the node says
      // the cluster is up.
      const std::string info = ask("CLUSTER INFO");
      if (info.find("cluster_slots_assigned:16384") == std::string::npos)
        REQUIRE(ask("CLUSTER ADDSLOTSRANGE 0 16383").rfind("+OK", 0) == 0);
      while (ask("CLUSTER INFO").find("cluster_state:ok") == std::string::npos) {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return true;
  }

 public:
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

  // Sends one inline command and returns the first reply's bytes as they came (one read, up to
  // 4 KB: enough for the short replies it is used for); empty when Redis does not answer.
  std::string ask(const std::string& command) const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return {};
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    std::string out;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      const std::string line = command + "\r\n";
      char answer[4096];
      if (send(fd, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size())) {
        const ssize_t n = recv(fd, answer, sizeof answer, 0);
        if (n > 0) out.assign(answer, static_cast<std::size_t>(n));
      }
    }
    close(fd);
    return out;
  }

 private:
  // A free loopback port (0: any, picked by the kernel), or -1 when `port` is taken.
  static int free_port(int port = 0) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close(fd);
      REQUIRE(port != 0);
      return -1;
    }
    socklen_t len = sizeof addr;
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    return ntohs(addr.sin_port);
  }

  // A cluster node also listens on its port + 10000 (the cluster bus): a free pair below the
  // kernel's ephemeral range, so that the bus port exists and no outgoing connection takes it.
  static int free_cluster_port() {
    for (int tries = 0; tries < 1000; ++tries) {
      // 10000-22767: its bus port, 20000-32767, is below the ephemeral range too (32768 on).
      const int port =
          10000 +
          static_cast<int>(
              (std::chrono::steady_clock::now().time_since_epoch().count() / 1000 + tries * 7919) %
              12768);
      if (free_port(port) == port && free_port(port + 10000) == port + 10000) return port;
    }
    FAIL("no free port pair for a Redis Cluster node");
    return 0;
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
  bool cluster_ = false;
  TempDir dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace rebound::test
