// The JobQueue's one policy for a failing store (see JobStore's comment): every store call goes
// through here, so a failure is counted, logged once per failing spell, and either answered
// (StoreUnavailable, for what a front end reads) or retried (for the writes accepted work needs).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>
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

  /// Starts a store call that answers through `Done` (JobStore::WriteDone for async_record_attempt,
  /// JobStore::FinishDone for async_finish_job).
  template <typename Done>
  using Write = std::function<void(JobStore&, Done)>;
  /// Called with what the write answered (false, or a FinishAnswer not held: the lease was lost).
  template <typename Answer>
  using Written = std::function<void(Answer)>;
  /// Where the store answers a call (JobStore::answer_thread).
  struct Call {
    JobStore::AsyncCall call;
    bool record_asked = false;
  };

  StoreAccess(JobStore& store, Observers& observe, boost::asio::any_io_executor executor,
              std::chrono::milliseconds retry_interval)
      : store_(store),
        observe_(observe),
        executor_(std::move(executor)),
        retry_interval_(retry_interval) {}

  JobStore& store() { return store_; }

  /// Ends the retries of writes (the queue is going away).
  void stop() { stopped_ = true; }

  /// Waits until the store has answered every write started (a store that answers on its own
  /// thread posts the rest to the executor): before the executor goes away. Every store answers
  /// each call, a failing one within its timeouts.
  void wait_answered() {
    std::unique_lock<std::mutex> lock(out_->mutex);
    out_->none.wait(lock, [&] { return out_->count == 0; });
  }
  bool stopped() const { return stopped_; }

  /// Whether a failing spell is under way (a store call failed, and the store has not said it
  /// works since).
  bool failing() const { return failing_.load(std::memory_order_relaxed); }

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
  /// `then` with what the write answered. `write` starts the store's asynchronous call `call`
  /// with the `done` it is given. Where the store says it answers on the caller's thread
  /// (JobStore::answer_thread: memory, SQLite's acknowledgements) `then` runs there before this
  /// returns; where it answers from a thread of its own (SQLite's writer, Redis's batch thread,
  /// PostgreSQL's writer) `then` is posted to the executor, so that no store thread runs the
  /// queue's work.
  /// When the store fails the write is tried again every retry interval on the executor while the
  /// work keeps its slot, until it is written or the queue stops: then `abandon` runs instead of
  /// `then` (the store still holds the work as it was, and its lease runs out: another claim takes
  /// it over). `keep_alive` is held until then.
  template <typename Answer, typename Done>
  void write_until_stored(std::shared_ptr<const void> keep_alive, const char* during,
                          std::string job_id, Call call, Write<Done> write, Written<Answer> then,
                          std::function<void()> abandon) {
    auto pending = std::make_shared<PendingWrite<Answer, Done>>(
        PendingWrite<Answer, Done>{std::move(keep_alive), during, std::move(job_id), call,
                                   std::move(write), std::move(then), std::move(abandon)});
    start(std::move(pending));
  }

  /// What `put` answers: a StoreUnavailable in `error` when the store failed (noted as `call`
  /// notes it), else the outcome.
  using PutThen = std::function<void(std::exception_ptr error, PutOutcome outcome)>;

  /// A put that answers through `then` instead of waiting (JobStore::async_put): on the caller's
  /// thread before this returns when the store answers at once (memory); posted to the executor
  /// when it answers from its own thread (SQLite's writer after the commit, PostgreSQL's, Redis's
  /// batch thread), so that no store thread runs the queue's work. The pipeline must outlive the
  /// answer (wait_answered).
  void put(const Job& job, const std::optional<Lease>& claim, PutThen then) {
    // The answer's one owner: whichever copy of `done` answers first moves `then` out, so that
    // nothing it holds (the submission's slot, its entry) outlives the answer.
    struct Answer {
      std::atomic<bool> given{false};
      PutThen then;
      std::string job_id;
    };
    auto state = std::make_shared<Answer>();
    state->then = std::move(then);
    state->job_id = key_of(job);
    const bool inline_answer = answers_inline({JobStore::AsyncCall::put});
    const auto caller = std::this_thread::get_id();
    out_->started();
    auto done = [this, inline_answer, caller, state, out = out_, executor = executor_](
                    std::exception_ptr error, PutOutcome outcome) {
      if (state->given.exchange(true)) return;
      auto finish = [this, id = state->job_id, then = std::move(state->then), error, outcome] {
        if (!error) {
          worked();
          return then(nullptr, outcome);
        }
        std::exception_ptr refused;
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          failed("put", id, e.what());
          refused = std::make_exception_ptr(StoreUnavailable(e.what()));
        } catch (...) {
          failed("put", id, "unknown error");
          refused = std::make_exception_ptr(StoreUnavailable("the job store failed"));
        }
        then(refused, outcome);
      };
      if (go_on_here(inline_answer, caller)) {
        out->answered();
        finish();
      } else {
        boost::asio::post(executor, std::move(finish));
        out->answered();
      }
    };
    try {
      store_.async_put(job, claim, done);
    } catch (...) {
      if (state->given.load()) throw;  // from `then`, run inline: the caller's to handle
      done(std::current_exception(), PutOutcome::created);  // a store that threw, unanswered
    }
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
  template <typename Answer, typename Done>
  struct PendingWrite {
    std::shared_ptr<const void> keep_alive;
    const char* during;
    std::string job_id;
    Call call;
    Write<Done> write;
    Written<Answer> then;
    std::function<void()> abandon;
  };

  /// Whether the store says it answers `c` on the caller's thread (JobStore::answer_thread).
  bool answers_inline(Call c) const {
    return store_.answer_thread(c.call, c.record_asked) == JobStore::AnswerThread::caller;
  }

  /// Whether an answer is gone on with where it is heard: the store said it answers on the
  /// caller's thread, and it did (a store of one's own that says so and answers from a thread of
  /// its own is handed to the executor all the same, so that its thread never runs the queue's
  /// work).
  static bool go_on_here(bool inline_answer, std::thread::id caller) {
    return inline_answer && std::this_thread::get_id() == caller;
  }

  template <typename Answer, typename Done>
  void start(std::shared_ptr<PendingWrite<Answer, Done>> pending) {
    const bool inline_answer = answers_inline(pending->call);
    const auto caller = std::this_thread::get_id();
    // Answered once per try; a `then` that throws on the caller's thread is not a failed write.
    auto answered = std::make_shared<std::atomic<bool>>(false);
    out_->started();
    // From a store's thread it hands its reference on to the executor, and only then counts the
    // write as answered: the store's thread never holds the last reference (the pipeline it keeps
    // alive owns the store), and the executor is not torn down under a post (wait_answered).
    // After the post the store's thread touches only the count, which it shares: the handler may
    // run at once and end the pipeline, this StoreAccess with it.
    auto done = [this, pending, inline_answer, caller, answered, out = out_, executor = executor_](
                    std::exception_ptr error, Answer answer) mutable {
      if (answered->exchange(true)) return;
      auto mine = std::move(pending);
      if (go_on_here(inline_answer, caller)) {
        out->answered();
        written(mine, error, std::move(answer));
      } else {
        boost::asio::post(
            executor, [this, mine = std::move(mine), error, answer = std::move(answer)]() mutable {
              written(mine, error, std::move(answer));
            });
        out->answered();
      }
    };
    try {
      pending->write(store_, std::move(done));
    } catch (...) {
      if (answered->exchange(true)) throw;  // from `then`, run inline: the caller's to handle
      out_->answered();
      written(pending, std::current_exception(), Answer{});
    }
  }

  template <typename Answer, typename Done>
  void written(const std::shared_ptr<PendingWrite<Answer, Done>>& pending, std::exception_ptr error,
               Answer answer) {
    if (!error) {
      worked();
      pending->then(std::move(answer));
      return;
    }
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      failed(pending->during, pending->job_id, e.what());
    } catch (...) {
      failed(pending->during, pending->job_id, "unknown error");
    }
    retry_later(pending);
  }

  template <typename Answer, typename Done>
  void retry_later(std::shared_ptr<PendingWrite<Answer, Done>> pending) {
    if (stopped_) {
      pending->abandon();
      return;
    }
    auto timer = std::make_shared<boost::asio::steady_timer>(executor_, retry_interval_);
    timer->async_wait([this, timer, pending = std::move(pending)](
                          const boost::system::error_code&) mutable { start(std::move(pending)); });
  }

  // Writes started and not answered by the store yet.
  struct Out {
    std::mutex mutex;
    std::condition_variable none;
    std::size_t count = 0;
    void started() {
      std::lock_guard<std::mutex> lock(mutex);
      ++count;
    }
    void answered() {
      std::lock_guard<std::mutex> lock(mutex);
      if (--count == 0) none.notify_all();
    }
  };
  const std::shared_ptr<Out> out_ = std::make_shared<Out>();
  JobStore& store_;
  Observers& observe_;
  boost::asio::any_io_executor executor_;
  std::chrono::milliseconds retry_interval_;
  std::atomic<bool> failing_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace rebound::detail
