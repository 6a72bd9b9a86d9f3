// Load generator for POST /invocations: N concurrent kept-alive connections for D seconds.
// Prints one line: requests/s, latency p50/p99 (microseconds), errors.
// Usage: invocations_load HOST PORT CONNECTIONS SECONDS BODY
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s HOST PORT CONNECTIONS SECONDS BODY\n", argv[0]);
    return 2;
  }
  const std::string host = argv[1], body = argv[5];
  const int port = std::atoi(argv[2]), connections = std::atoi(argv[3]);
  const auto duration = std::chrono::duration<double>(std::atof(argv[4]));
  using clock = std::chrono::steady_clock;

  std::mutex mutex;
  std::vector<double> latencies_us;
  std::atomic<long> errors{0};
  const auto start = clock::now();
  const auto end = start + std::chrono::duration_cast<clock::duration>(duration);
  std::vector<std::thread> threads;
  for (int c = 0; c < connections; ++c) {
    threads.emplace_back([&] {
      httplib::Client client(host, port);
      client.set_keep_alive(true);
      client.set_tcp_nodelay(true);
      client.set_read_timeout(30, 0);
      std::vector<double> mine;
      while (clock::now() < end) {
        const auto t0 = clock::now();
        auto res = client.Post("/invocations", body, "application/json");
        const auto t1 = clock::now();
        if (!res || res->status != 200) {
          ++errors;
          continue;
        }
        mine.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      std::lock_guard<std::mutex> lock(mutex);
      latencies_us.insert(latencies_us.end(), mine.begin(), mine.end());
    });
  }
  for (auto& t : threads)
    t.join();
  const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
  std::sort(latencies_us.begin(), latencies_us.end());
  auto pct = [&](double p) {
    if (latencies_us.empty()) return 0.0;
    return latencies_us[std::min(latencies_us.size() - 1,
                                 static_cast<std::size_t>(p * latencies_us.size()))];
  };
  std::printf("rps=%.0f p50_us=%.1f p99_us=%.1f ok=%zu errors=%ld\n", latencies_us.size() / elapsed,
              pct(0.50), pct(0.99), latencies_us.size(), errors.load());
  return errors.load() == 0 ? 0 : 1;
}
