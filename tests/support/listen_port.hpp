// A free loopback port for a server a test starts (Redis, PostgreSQL), below the kernel's
// ephemeral range (32768 on): a test that stops such a server and starts it again on the same
// port needs that port to stay free meanwhile, and a port in the ephemeral range can be taken by
// any outgoing connection of any process on the machine (a client's source port, or a client's
// connection to that very port while nothing listens there, which loopback TCP completes as a
// connection to itself). Nothing but a listener takes a port below that range.
#pragma once

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>

namespace rebound::test {

// True when `port` on 127.0.0.1 can be bound now.
inline bool port_is_free(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return free;
}

// A port in [first, first + span) free now, picked at a point that differs between processes
// and calls (tests running in parallel each start their own servers), so two seldom try the
// same one; a server that still loses its port to another at start says so, and its starter
// tries another.
inline int listen_port(int first, int span) {
  static std::atomic<unsigned> calls{0};
  const auto seed =
      static_cast<unsigned>(getpid()) * 2654435761u +
      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count() / 1000) +
      calls++ * 7919u;
  for (unsigned tries = 0; tries < 1000; ++tries) {
    const int port =
        first + static_cast<int>((seed + tries * 104729u) % static_cast<unsigned>(span));
    if (port_is_free(port)) return port;
  }
  FAIL("no free loopback port in " << first << "-" << first + span - 1);
  return 0;
}

}  // namespace rebound::test
