// The doctest runner for rebound's test suite.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <csignal>

int main(int argc, char** argv) {
  // As rebound-server: a peer that closes its end (a Redis the tests kill) costs an error on that
  // connection, not the process.
  std::signal(SIGPIPE, SIG_IGN);
  return doctest::Context(argc, argv).run();
}
