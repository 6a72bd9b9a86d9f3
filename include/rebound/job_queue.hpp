// JobQueue: a bounded queue of jobs drained by a fixed number of workers on an Asio executor.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <iterator>
#include <mutex>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>

#include "rebound/error.hpp"
#include "rebound/job.hpp"

namespace rebound {

struct JobQueueOptions {
  std::size_t capacity = 10000;  ///< Jobs waiting, at most. `try_push` answers `full` beyond it.
  std::size_t workers = 2;       ///< Jobs handled at once, at most.
};

/// A bounded FIFO of jobs with a worker pool.
///
/// Workers are not threads of their own: each is a drain loop posted to the executor you pass in
/// (typically a `boost::asio::thread_pool` sized to `workers`), started when work arrives and
/// returned to the executor when the queue is empty. At most `workers` run at once.
///
/// Every job accepted by `try_push` is handed to the handler exactly once, also after `close()`
/// (the queue drains). The handler runs without any queue lock held; an exception it throws is
/// caught and counted (`handler_failures()`), and the worker carries on.
///
/// Example:
///   boost::asio::thread_pool pool(4);
///   rebound::JobQueue queue(pool.get_executor(), {1000, 4}, [](rebound::Job job) { ... });
///   if (queue.try_push(std::move(job)) == rebound::JobQueue::PushResult::full) { ... 503 ... }
///
/// Lifetime: destroy the queue while its executor still runs handlers; the destructor closes the
/// queue, drops jobs not yet started and waits for running handlers to return.
/// Thread-safety: every method is thread-safe.
class JobQueue final {
 public:
  using Handler = std::function<void(Job)>;
  enum class PushResult { accepted, full, closed };

  JobQueue(boost::asio::any_io_executor executor, JobQueueOptions options, Handler handler)
      : executor_(std::move(executor)), options_(options), handler_(std::move(handler)) {
    if (options_.capacity == 0) throw Error("JobQueue: capacity must be at least 1");
    if (options_.workers == 0) throw Error("JobQueue: workers must be at least 1");
    if (!handler_) throw Error("JobQueue: a handler is required");
  }

  JobQueue(const JobQueue&) = delete;
  JobQueue& operator=(const JobQueue&) = delete;

  ~JobQueue() {
    std::unique_lock<std::mutex> lock(mutex_);
    closed_ = true;
    pending_.clear();
    idle_.wait(lock, [this] { return active_workers_ == 0; });
  }

  /// Adds a job at the back. `full` when `capacity` jobs are waiting; `closed` after `close()`.
  PushResult try_push(Job job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return PushResult::closed;
      if (pending_.size() >= options_.capacity) return PushResult::full;
      pending_.push_back(std::move(job));
      if (active_workers_ >= options_.workers) return PushResult::accepted;
      ++active_workers_;
    }
    boost::asio::post(executor_, [this] { drain(); });
    return PushResult::accepted;
  }

  /// Stops accepting jobs. Jobs already accepted still run.
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }

  /// Removes and returns the jobs still waiting (not those running). For a shutdown deadline: the
  /// caller decides what becomes of them (a durable store keeps them for the next start).
  std::vector<Job> take_pending() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Job> out(std::make_move_iterator(pending_.begin()),
                         std::make_move_iterator(pending_.end()));
    pending_.clear();
    return out;
  }

  /// Waits until no job is waiting or running, or until `timeout`. True when idle.
  bool wait_idle(std::chrono::steady_clock::duration timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return idle_.wait_for(lock, timeout,
                          [this] { return pending_.empty() && active_workers_ == 0; });
  }

  std::size_t depth() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pending_.size();
  }
  std::size_t running() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return running_;
  }
  std::size_t handler_failures() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return handler_failures_;
  }
  std::size_t capacity() const { return options_.capacity; }
  boost::asio::any_io_executor get_executor() const { return executor_; }

 private:
  // One worker: takes jobs until the queue is empty. After a batch it re-posts itself instead of
  // looping forever, so a busy queue still lets other work on the executor run.
  void drain() {
    constexpr int jobs_per_turn = 64;
    for (int n = 0; n < jobs_per_turn; ++n) {
      Job job;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (pending_.empty()) {
          --active_workers_;
          if (active_workers_ == 0) idle_.notify_all();
          return;
        }
        job = std::move(pending_.front());
        pending_.pop_front();
        ++running_;
      }
      bool failed = false;
      try {
        handler_(std::move(job));
      } catch (...) {
        failed = true;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      --running_;
      if (failed) ++handler_failures_;
    }
    boost::asio::post(executor_, [this] { drain(); });
  }

  boost::asio::any_io_executor executor_;
  JobQueueOptions options_;
  Handler handler_;

  mutable std::mutex mutex_;
  std::condition_variable idle_;
  std::deque<Job> pending_;
  std::size_t active_workers_ = 0;
  std::size_t running_ = 0;
  std::size_t handler_failures_ = 0;
  bool closed_ = false;
};

}  // namespace rebound
