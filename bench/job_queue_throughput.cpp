// The library's own ceiling: jobs per second through JobQueue::async_submit to completion (echo
// model, memory store, no HTTP), beside a bare boost::asio::post of the same model call to a pool
// of the same size, in the same run. Prints one line per round and the medians.
// Usage: rebound-job-queue-throughput [JOBS per round, default 200000] [ROUNDS, default 5]
//                                     [WORKERS, default 2] [SUBMITTERS, default 1]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "rebound/job_queue.hpp"
#include "rebound/store/memory_job_store.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Counts completions and wakes the main thread at the last.
struct Finish {
  explicit Finish(long n) : left(n) {}
  void one() {
    if (left.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(m);
      cv.notify_all();
    }
  }
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [this] { return left.load() == 0; });
  }
  std::atomic<long> left;
  std::mutex m;
  std::condition_variable cv;
};

// Runs `submit(i)` for i in [0, jobs) from `submitters` threads; returns jobs per second until
// `finish` saw every completion.
template <typename Submit>
double rate(long jobs, int submitters, Finish& finish, Submit submit) {
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < submitters; ++t) {
    threads.emplace_back([&, t] {
      for (long i = t; i < jobs; i += submitters)
        submit(i);
    });
  }
  for (auto& thread : threads)
    thread.join();
  finish.wait();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(jobs) / seconds;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const long jobs = argc > 1 ? std::atol(argv[1]) : 200000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const int workers = argc > 3 ? std::atoi(argv[3]) : 2;
  const int submitters = argc > 4 ? std::atoi(argv[4]) : 1;
  if (jobs <= 0 || rounds <= 0 || workers <= 0 || submitters <= 0) {
    std::fprintf(stderr, "usage: %s [JOBS] [ROUNDS] [WORKERS] [SUBMITTERS]\n", argv[0]);
    return 2;
  }
  std::vector<double> queue_rates, post_rates;
  std::atomic<long> failures{0};
  for (int round = 0; round < rounds; ++round) {
    {
      // A fresh queue per round: its memory store starts empty. Every job may be in flight at
      // once (a submitter does not wait), so the capacity is the round's job count.
      rebound::JobQueueOptions options;
      options.workers = static_cast<std::size_t>(workers);
      options.queue_capacity = static_cast<std::size_t>(jobs);
      rebound::MemoryJobStoreOptions store_options;
      store_options.max_finished = static_cast<std::size_t>(jobs);
      rebound::JobQueue queue(std::make_unique<rebound::EchoModel>(),
                              std::make_unique<rebound::MemoryJobStore>(store_options), options);
      Finish finish(jobs);
      queue_rates.push_back(rate(jobs, submitters, finish, [&](long i) {
        rebound::Job job;
        job.id = "r" + std::to_string(round) + "-" + std::to_string(i);
        job.input = i;
        queue.async_submit(std::move(job),
                           [&finish, &failures](boost::system::error_code ec, rebound::JobRecord) {
                             if (ec) ++failures;
                             finish.one();
                           });
      }));
    }
    {
      // The same model call, posted straight to a pool of the same size.
      boost::asio::thread_pool pool(static_cast<std::size_t>(workers));
      rebound::EchoModel model;
      Finish finish(jobs);
      post_rates.push_back(rate(jobs, submitters, finish, [&](long i) {
        boost::asio::post(pool, [&finish, &model, i] {
          nlohmann::json input = i;
          const rebound::Prediction p = model.predict(input);
          if (!p.ok()) std::abort();
          finish.one();
        });
      }));
      pool.join();
    }
    std::printf("round %d: async_submit %.0f jobs/s, bare post %.0f jobs/s\n", round + 1,
                queue_rates.back(), post_rates.back());
  }
  const double q = median(queue_rates), p = median(post_rates);
  std::printf(
      "median of %d rounds of %ld jobs (%d workers, %d submitting threads): async_submit %.0f "
      "jobs/s, bare post %.0f jobs/s, ratio %.3f\n",
      rounds, jobs, workers, submitters, q, p, q / p);
  if (failures) std::printf("%ld jobs were refused\n", failures.load());
  return failures ? 1 : 0;
}
