// Delivery throughput of CurlTransport behind its OriginGate (as a JobQueue sends): sends COUNT
// callbacks to URL as fast as the transport takes them (WINDOW outstanding at a time), on one
// event-loop thread, and prints callbacks/s. Isolates the transport from submission, inference and
// the store.
// Usage: rebound-transport-load URL [COUNT=100000] [WINDOW=1024] [PER_ORIGIN=64]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "rebound/delivery/curl_transport.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s URL [COUNT] [WINDOW] [PER_ORIGIN]\n", argv[0]);
    return 2;
  }
  const std::string url = argv[1];
  const long count = argc > 2 ? std::atol(argv[2]) : 100000;
  const long window = argc > 3 ? std::atol(argv[3]) : 1024;
  boost::asio::io_context io;
  rebound::CurlTransportOptions options;
  options.guard = rebound::AddressGuard(true);
  rebound::OriginGateOptions limits;
  if (argc > 4) limits.max_per_origin = static_cast<std::size_t>(std::atol(argv[4]));
  auto transport = std::make_unique<rebound::OriginGate>(
      std::make_unique<rebound::CurlTransport>(io.get_executor(), options), limits);
  const std::string body = R"({"id":"job-0000001","status":"succeeded","result":{"echo":null}})";
  long sent = 0, done = 0, failed = 0;
  std::function<void()> send_one = [&] {
    rebound::CallbackRequest r;
    r.url = url;
    r.body = body;
    r.headers = {{"Content-Type", "application/json"},
                 {"User-Agent", "rebound/bench"},
                 {"webhook-id", "msg_job-0000001"},
                 {"webhook-timestamp", "1790000000"}};
    r.timeout = std::chrono::seconds(10);
    ++sent;
    transport->send(std::move(r), [&](rebound::CallbackResponse response) {
      ++done;
      if (response.error != rebound::TransportError::none || response.status != 200) ++failed;
      if (sent < count) send_one();
      // Not from inside the transport's own handler: it ends on the loop, after this returns.
      if (done == count) boost::asio::post(io, [&] { transport.reset(); });
    });
  };
  const auto start = std::chrono::steady_clock::now();
  boost::asio::post(io, [&] {
    for (long i = 0; i < window && sent < count; ++i)
      send_one();
  });
  io.run();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("callbacks=%ld failed=%ld seconds=%.3f callbacks_per_s=%.0f\n", done, failed, seconds,
              done / seconds);
  return failed == 0 ? 0 : 1;
}
