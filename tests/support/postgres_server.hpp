// A real PostgreSQL for a test: a cluster made with initdb in a temporary folder and started with
// pg_ctl on a free loopback port (as the `postgres` user when the tests run as root, since
// PostgreSQL refuses to run as root), stopped when the object ends. One is shared by every test
// of the process (shared_postgres(): initdb takes a second or two), each test in a schema of its
// own (fresh_schema()); a test that stops or restarts its database makes its own.
#pragma once

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/listen_port.hpp"
#include "support/temp_dir.hpp"

#ifndef REBOUND_PG_BINDIR
#error "REBOUND_PG_BINDIR (where initdb and pg_ctl are) is defined by tests/CMakeLists.txt"
#endif

namespace rebound::test {

class PostgresServer {
 public:
  PostgresServer() {
    const bool root = geteuid() == 0;
    if (root) {
      const passwd* pg = getpwnam("postgres");
      REQUIRE_MESSAGE(pg != nullptr,
                      "running as root needs the postgres user (Debian's postgresql)");
      REQUIRE(chown(dir_.path.c_str(), pg->pw_uid, pg->pw_gid) == 0);
      as_ = "runuser -u postgres -- ";
    }
    REQUIRE(run(std::string(REBOUND_PG_BINDIR) + "/initdb -D " + data() +
                " -A trust -U postgres --no-sync -E UTF8 --locale=C > " + dir_.file("initdb.log") +
                " 2>&1") == 0);
    // Its port is below the ephemeral range (support/listen_port.hpp), so that it is still free
    // when a test stops this server and starts it again. A port found free may be taken before
    // the postmaster binds it (another test starting a server at the same moment): it then fails
    // to start, and another port is tried.
    for (int tries = 0; tries < 5; ++tries) {
      port_ = listen_port(25000, 7768);  // (Redis Cluster nodes and their buses use 10000-24999)
      const auto logged = dir_.size("postgres.log");
      if (launch()) return;
      if (dir_.read("postgres.log", logged).find("Address already in use") == std::string::npos)
        break;
    }
    FAIL("PostgreSQL did not start; its log ends: " << dir_.tail("postgres.log"));
  }
  ~PostgresServer() { stop(); }
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  int port() const { return port_; }
  /// The URI a store connects with (the superuser, trusted on loopback), in `schema` when given.
  std::string uri(const std::string& schema = {}) const {
    return "postgresql://postgres@127.0.0.1:" + std::to_string(port_) + "/postgres" +
           (schema.empty() ? "" : "?schema=" + schema);
  }

  /// Starts it (again) and waits until it accepts connections.
  void start() {
    REQUIRE_MESSAGE(launch(),
                    "PostgreSQL did not start; its log ends: " << dir_.tail("postgres.log"));
  }

  /// Stops it: "fast" ends the sessions cleanly, "immediate" is a crash (recovery at start).
  void stop(const std::string& mode = "fast") {
    if (!running_) return;
    run(std::string(REBOUND_PG_BINDIR) + "/pg_ctl -D " + data() + " -w -m " + mode +
        " stop > /dev/null 2>&1");
    running_ = false;
  }

  /// Freezes it (SIGSTOP to the postmaster and every process it started: connections stay open,
  /// nothing answers), and thaws it again.
  void pause() { signal_all(SIGSTOP); }
  void resume() { signal_all(SIGCONT); }

  /// Runs SQL with psql and answers what it printed (tuples only, unaligned). Calls at once
  /// from several threads each name a file of their own for the output (`out_name`).
  std::string psql(const std::string& sql, const std::string& out_name = "psql.out") const {
    const std::string out = dir_.file(out_name);
    const std::string command = std::string(REBOUND_PG_BINDIR) +
                                "/psql -X -q -t -A -h 127.0.0.1 -p " + std::to_string(port_) +
                                " -U postgres -d postgres -c \"" + sql + "\" > " + out + " 2>&1";
    std::system(command.c_str());
    std::string text;
    if (FILE* f = std::fopen(out.c_str(), "r")) {
      char buffer[4096];
      std::size_t n;
      while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0)
        text.append(buffer, n);
      std::fclose(f);
    }
    return text;
  }

  /// A schema name no other test of this process uses.
  static std::string fresh_schema() {
    static std::atomic<int> next{0};
    return "t" + std::to_string(getpid()) + "_" + std::to_string(next++);
  }

 private:
  std::string data() const { return dir_.file("data"); }
  int run(const std::string& command) const { return std::system((as_ + command).c_str()); }

  // The postmaster (its pid file's first line) and its children, by their ids.
  void signal_all(int signal) const {
    std::ifstream pid_file(data() + "/postmaster.pid");
    pid_t postmaster = 0;
    pid_file >> postmaster;
    REQUIRE(postmaster > 0);
    ::kill(postmaster, signal);
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string name = entry.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream stat(entry.path() / "stat");
      std::string line;
      if (!std::getline(stat, line)) continue;
      const auto close = line.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(line.substr(close + 2));
      std::string state;
      pid_t parent = 0;
      rest >> state >> parent;
      if (parent == postmaster) ::kill(std::stoi(name), signal);
    }
  }

  // Starts the postmaster on port_ and waits until it accepts connections; false when it could
  // not (its port taken, say; a postmaster still starting after 30 s is ended).
  bool launch() {
    running_ = run(std::string(REBOUND_PG_BINDIR) + "/pg_ctl -D " + data() + " -w -t 30 -l " +
                   dir_.file("postgres.log") + " -o \"-p " + std::to_string(port_) +
                   " -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off"
                   " -c max_connections=200\" start > /dev/null") == 0;
    if (!running_) {
      run(std::string(REBOUND_PG_BINDIR) + "/pg_ctl -D " + data() +
          " -w -m immediate stop > /dev/null 2>&1");
    }
    return running_;
  }

  TempDir dir_;
  std::string as_;
  int port_ = 0;
  bool running_ = false;
};

/// The PostgreSQL every test of this process shares (started at first use).
inline PostgresServer& shared_postgres() {
  static PostgresServer server;
  return server;
}

}  // namespace rebound::test
