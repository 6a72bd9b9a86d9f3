// Uses the header-only core alone: a model, the queue and a backoff policy, no HTTP.
#include <rebound/backoff.hpp>
#include <rebound/job_queue.hpp>
#include <rebound/model.hpp>

#include <boost/asio/thread_pool.hpp>

#include <atomic>
#include <chrono>
#include <iostream>

int main() {
  boost::asio::thread_pool pool(2);
  rebound::EchoModel model;
  std::atomic<int> seen{0};
  rebound::JobQueue queue(pool.get_executor(), {100, 2, 8, std::chrono::milliseconds(1)},
                          [&](std::vector<rebound::Job> batch) {
                            for (const auto& job : batch)
                              seen += model.predict(job.input).ok() ? 1 : 0;
                          });
  for (int i = 0; i < 10; ++i) {
    rebound::Job job;
    job.id = "j" + std::to_string(i);
    queue.try_push(job);
  }
  queue.close();
  const bool idle = queue.wait_idle(std::chrono::seconds(10));
  pool.join();
  const bool ok =
      idle && seen == 10 && rebound::backoff::default_policy()->next_delay({}).has_value();
  std::cout << "rebound::core " << (ok ? "ok" : "BROKEN") << std::endl;
  return ok ? 0 : 1;
}
