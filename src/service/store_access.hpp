// The JobQueue's one policy for a failing store (see JobStore's comment): every store call goes
// through here, so a failure is counted, logged once per failing spell, and either answered
// (StoreUnavailable, for what a front end reads) or retried (for the writes accepted work needs).
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "observers.hpp"
#include "rebound/store/job_store.hpp"

namespace rebound::detail {

/// Thread-safe. Owns nothing: the store and the observers belong to the pipeline, which
/// the retries of `write_until_stored` keep alive.
class StoreAccess {
 public:
  /// What a store call made under a lock has to tell the observers once the lock is let go.
  struct News {
    bool worked = false;
    std::optional<std::pair<std::string, std::string>> failed;  // during, why
    std::string job_id;
  };

  using Write = std::function<bool(JobStore&)>;
  /// Called with what the write answered (false: the lease was lost).
  using Written = std::function<void(bool)>;

  StoreAccess(JobStore& store, Observers& observe, boost::asio::any_io_executor executor,
              std::chrono::milliseconds retry_interval)
      : store_(store),
        observe_(observe),
        executor_(std::move(executor)),
        retry_interval_(retry_interval) {}

  JobStore& store() { return store_; }

  /// Ends the retries of writes (the queue is going away).
  void stop() { stopped_ = true; }
  bool stopped() const { return stopped_; }

  /// Notes a store call that threw (`counted`: a call, not a health check), and the start of a
  /// failing spell.
  void failed(std::string_view during, const std::string& job_id, const char* why,
              bool counted = true) {
    if (counted) observe_([&](auto& o) { o.on_store_error(during, job_id, why); });
    if (!failing_.exchange(true))
      observe_([&](auto& o) { o.on_store_failing(during, job_id, why); });
  }

  /// Notes a store call that worked. A failing spell ends (one log line) only when the store says
  /// it works again: a store may answer reads while its writes fail.
  void worked() {
    if (!failing_.load(std::memory_order_relaxed)) return;
    std::optional<std::string> why;
    try {
      why = store_.failure();
    } catch (...) {
      return;
    }
    if (!why && failing_.exchange(false)) observe_([](auto& o) { o.on_store_recovered(); });
  }

  void tell(const News& news) {
    if (news.failed) {
      failed(news.failed->first, news.job_id, news.failed->second.c_str());
    } else if (news.worked) {
      worked();
    }
  }

  /// Why the store cannot be used now (JobStore::failure, a throw counted as the reason), noting
  /// the start or the end of a failing spell. For health checks.
  std::optional<std::string> failure() {
    std::optional<std::string> why;
    try {
      why = store_.failure();
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
      why = "the job store failed";
    }
    if (why) {
      failed("failure", {}, why->c_str(), false);
    } else if (failing_.exchange(false)) {
      observe_([](auto& o) { o.on_store_recovered(); });
    }
    return why;
  }

  /// Runs `call` against the store; a failure is noted and rethrown as StoreUnavailable (for the
  /// calls whose answer a front end waits for: reads, puts, redeliveries). With `news`, what
  /// happened is kept there for `tell`, because the caller holds a lock that observers must not run
  /// under.
  template <typename Call>
  auto call(std::string_view during, const std::string& job_id, Call&& call, News* news = nullptr)
      -> decltype(call(std::declval<JobStore&>())) {
    auto note_failure = [&](const char* why) {
      if (news) {
        news->failed.emplace(std::string(during), why);
        news->job_id = job_id;
      } else {
        failed(during, job_id, why);
      }
    };
    try {
      auto out = call(store_);
      if (news) {
        news->worked = true;
      } else {
        worked();
      }
      return out;
    } catch (const std::exception& e) {
      note_failure(e.what());
      throw StoreUnavailable(e.what());
    } catch (...) {
      note_failure("unknown error");
      throw StoreUnavailable("the job store failed");
    }
  }

  /// Runs a write that accepted work needs (its acknowledgement, an attempt's record), then
  /// `then` with what the write answered. When the store fails the write is tried again every
  /// retry interval on the executor while the work keeps its slot, until it is written or the
  /// queue stops: then `abandon` runs instead of `then` (the store still holds the work as it
  /// was, and its lease runs out: another claim takes it over). `keep_alive` is held until then.
  void write_until_stored(std::shared_ptr<const void> keep_alive, const char* during,
                          std::string job_id, Write write, Written then,
                          std::function<void()> abandon) {
    bool answer = false;
    try {
      answer = write(store_);
      worked();
    } catch (const std::exception& e) {
      failed(during, job_id, e.what());
      retry_later(std::move(keep_alive), during, std::move(job_id), std::move(write),
                  std::move(then), std::move(abandon));
      return;
    } catch (...) {
      failed(during, job_id, "unknown error");
      retry_later(std::move(keep_alive), during, std::move(job_id), std::move(write),
                  std::move(then), std::move(abandon));
      return;
    }
    then(answer);
  }

  /// A bookkeeping write whose loss costs only a lagging display (running, a lease handed back).
  void write_or_note(const char* during, const std::string& job_id,
                     const std::function<void(JobStore&)>& write) {
    try {
      write(store_);
      worked();
    } catch (const std::exception& e) {
      failed(during, job_id, e.what());
    } catch (...) {
      failed(during, job_id, "unknown error");
    }
  }

 private:
  void retry_later(std::shared_ptr<const void> keep_alive, const char* during, std::string job_id,
                   Write write, Written then, std::function<void()> abandon) {
    if (stopped_) {
      abandon();
      return;
    }
    auto timer = std::make_shared<boost::asio::steady_timer>(executor_, retry_interval_);
    timer->async_wait([this, timer, keep_alive = std::move(keep_alive), during,
                       job_id = std::move(job_id), write = std::move(write), then = std::move(then),
                       abandon = std::move(abandon)](const boost::system::error_code&) mutable {
      write_until_stored(std::move(keep_alive), during, std::move(job_id), std::move(write),
                         std::move(then), std::move(abandon));
    });
  }

  JobStore& store_;
  Observers& observe_;
  boost::asio::any_io_executor executor_;
  std::chrono::milliseconds retry_interval_;
  std::atomic<bool> failing_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace rebound::detail
