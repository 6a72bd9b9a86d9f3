// A real redis-server for a test: started on a free loopback port in a temporary folder, ended
// (by its process id) when the test ends. Stop and start it again to test a Redis that goes away.
#pragma once

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/listen_port.hpp"
#include "support/temp_dir.hpp"

#ifndef REBOUND_REDIS_SERVER
#error "REBOUND_REDIS_SERVER (the path of redis-server) is defined by tests/CMakeLists.txt"
#endif

namespace rebound::test {

class RedisServer {
 public:
  /// `extra`: more redis-server arguments, e.g. {"--appendonly", "yes"}.
  /// Its port is below the ephemeral range (support/listen_port.hpp), so that it is still free
  /// when a test stops this Redis and starts it again.
  explicit RedisServer(std::vector<std::string> extra = {}) : extra_(std::move(extra)) {
    // A port found free may be taken before this Redis binds it (another test starting a server
    // at the same moment): it then exits at once, and another port is tried.
    for (int tries = 0; tries < 5; ++tries) {
      port_ = listen_port(plain_first, plain_count);
      if (launch()) return;
    }
    FAIL("no Redis could start; its log: " << dir_.tail("redis.log"));
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
    FAIL("no Redis Cluster node could start; its log: " << dir_.tail("redis.log"));
  }
  ~RedisServer() { stop(SIGKILL); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string uri() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  /// Starts it again after stop(), on the same port and folder.
  void start() {
    REQUIRE_MESSAGE(launch(), "redis-server exited at start: " << dir_.tail("redis.log"));
  }

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
                                  "notice",
                                  "--logfile",
                                  dir_.file("redis.log")};
    if (cluster_) {
      // (A short node timeout: a node that starts again rejoins at once.)
      args.insert(args.end(), {"--cluster-enabled", "yes", "--cluster-config-file",
                               dir_.file("nodes.conf"), "--cluster-node-timeout", "500"});
    }
    args.insert(args.end(), extra_.begin(), extra_.end());
    // (The child makes only async-signal-safe calls, prctl, getppid, execv and _exit: this
    // process has threads, and after fork only those are sure to work, under the sanitizers too.)
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      // Ended with the test process when that is killed (a ctest timeout), not left behind.
      // (Strictly: when the thread that started it ends. Every test starts its Redis on the
      // test's own thread.)
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      execv(argv[0], argv.data());
      _exit(127);
    }
    // (Generous: a Redis with an append-only file syncs it at start, which a machine busy with
    // other tests' writes can make take seconds.)
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    const auto give_up = [&](const char* why) {
      const pid_t pid = pid_;
      const std::string state = process_state();
      stop(SIGKILL);
      FAIL("redis-server (pid " << pid << ", " << state << ") " << why
                                << "; its log: " << dir_.tail("redis.log"));
    };
    // Until it answers PING, and says that it is ours: the answer may come from another test's
    // Redis that took the port first (ours then exits: tried again on another port).
    for (;;) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      if (ask("PING").rfind("+PONG", 0) == 0) {
        const std::string info = ask("INFO server");
        if (info.find("process_id:" + std::to_string(pid_) + "\r") != std::string::npos) break;
        if (info.find("process_id:") != std::string::npos) {  // another's
          stop(SIGKILL);
          return false;
        }
        // (no answer in time: asked again)
      }
      if (std::chrono::steady_clock::now() >= deadline) give_up("did not answer PING within 30 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (cluster_) {
      // The slots are assigned once (nodes.conf keeps them over a restart); then the node says
      // the cluster is up.
      const std::string info = ask("CLUSTER INFO");
      if (info.find("cluster_slots_assigned:16384") == std::string::npos &&
          ask("CLUSTER ADDSLOTSRANGE 0 16383").rfind("+OK", 0) != 0)
        give_up("did not take the slots");
      while (ask("CLUSTER INFO").find("cluster_state:ok") == std::string::npos) {
        if (std::chrono::steady_clock::now() >= deadline)
          give_up("did not say the cluster is up within 30 s");
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
    const int fd = connected();
    if (fd < 0) return {};
    std::string out;
    const std::string line = command + "\r\n";
    char answer[4096];
    if (send(fd, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size())) {
      const ssize_t n = recv(fd, answer, sizeof answer, 0);
      if (n > 0) out.assign(answer, static_cast<std::size_t>(n));
    }
    close(fd);
    return out;
  }

 private:
  // Ports below the kernel's ephemeral range (32768 on; support/listen_port.hpp): a plain
  // Redis's, and a cluster node's with its bus port (its port + 10000), in ranges apart so that
  // no node takes a plain Redis's port for its bus while that Redis is stopped.
  static constexpr int plain_first = 25000, plain_count = 7768;  // 25000-32767
  // (tests/redis_cluster.py's nodes take 11000-14999, buses 21000-24999)
  static constexpr int node_first = 10000, node_count = 1000;  // 10000-10999, buses 20000-20999

  static int free_cluster_port() {
    for (int tries = 0; tries < 1000; ++tries) {
      const int port = listen_port(node_first, node_count);
      if (port_is_free(port + 10000)) return port;
    }
    FAIL("no free port pair for a Redis Cluster node");
    return 0;
  }

  // The process's state and where it waits (/proc), for a failure's message.
  std::string process_state() const {
    const std::string proc = "/proc/" + std::to_string(pid_);
    std::ifstream status(proc + "/status"), wchan(proc + "/wchan");
    std::string line, state, waits;
    while (std::getline(status, line))
      if (line.rfind("State:", 0) == 0) state = line;
    std::getline(wchan, waits);
    std::ifstream cmdline(proc + "/cmdline");
    std::string command;
    std::getline(cmdline, command, '\0');
    return state + ", waits in " + waits + ", runs " + command;
  }

  // A connection to it, whose reads give up after 2 s (a listener that accepts and never
  // answers cannot hang the test); -1 when nothing accepts.
  int connected() const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    timeval limit{};
    limit.tv_sec = 2;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }

  std::vector<std::string> extra_;
  bool cluster_ = false;
  TempDir dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace rebound::test
