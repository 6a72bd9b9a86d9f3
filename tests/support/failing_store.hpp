// FailingStore: a JobStore fake that works like the memory store until told to fail, then throws
// StoreUnavailable from every call (and reports why through failure()) until told to work again.
// With its `puts` gate closed it keeps each async_put unanswered until the gate opens, then answers
// it from a thread of its own, as SQLite's writer answers after its commit; with `reads` closed,
// `get` and `get_many` wait for it to open (a read behind a slow commit).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rebound/store/memory_job_store.hpp"

namespace rebound::test {

class FailingStore final : public JobStore {
 public:
  /// Shared with the test: the store itself belongs to the JobQueue.
  struct Switch {
    std::atomic<bool> failing{false};
    std::atomic<int> calls_failed{0};
    void fail() { failing = true; }
    void heal() { failing = false; }

    /// Closed, it holds each caller of `pass` until it opens again.
    class Gate {
     public:
      void close() {
        std::lock_guard<std::mutex> lock(m_);
        closed_ = true;
      }
      void open() {
        std::lock_guard<std::mutex> lock(m_);
        closed_ = false;
        changed_.notify_all();
      }
      bool closed() {
        std::lock_guard<std::mutex> lock(m_);
        return closed_;
      }
      /// Closed for a scope: opened again at its end, also when a check fails first.
      class ClosedWhile {
       public:
        explicit ClosedWhile(Gate& gate) : gate_(gate) { gate_.close(); }
        ~ClosedWhile() { gate_.open(); }
        ClosedWhile(const ClosedWhile&) = delete;
        ClosedWhile& operator=(const ClosedWhile&) = delete;

       private:
        Gate& gate_;
      };
      /// `auto closed = gate.closed_while_in_scope();`
      [[nodiscard]] ClosedWhile closed_while_in_scope() { return ClosedWhile(*this); }
      /// Callers held in `pass` now.
      int waiting() {
        std::lock_guard<std::mutex> lock(m_);
        return waiting_;
      }
      /// Returns at once while open; else waits until it opens.
      void pass() {
        std::unique_lock<std::mutex> lock(m_);
        ++waiting_;
        changed_.wait(lock, [this] { return !closed_; });
        --waiting_;
      }

     private:
      std::mutex m_;
      std::condition_variable changed_;
      bool closed_ = false;
      int waiting_ = 0;
    };
    /// Whether async_finish_job answers the record when asked (the library's stores do); off,
    /// it answers none, as JobStore's default, and a JobQueue reads a waited-for job back.
    std::atomic<bool> answer_records{false};
    /// The acknowledgements that asked for the record (async_finish_job's want_record).
    std::atomic<int> records_asked{0};
    Gate puts;    ///< async_put's answers
    Gate reads;   ///< get and get_many
    Gate counts;  ///< queue_stats
    /// The reads made: `get` calls, `get_many` calls and the most ids one of those asked for.
    std::atomic<std::size_t> gets{0}, get_manys{0}, most_ids_read{0};

    /// A job whose record cannot be read (a row the store cannot decode): `get` of it and every
    /// `get_many` that asks for it throw StoreUnavailable, while the store says it works.
    void make_unreadable(const std::string& id) {
      std::lock_guard<std::mutex> lock(unreadable_mutex);
      unreadable = id;
    }
    bool is_unreadable(const std::string& id) {
      std::lock_guard<std::mutex> lock(unreadable_mutex);
      return !unreadable.empty() && id == unreadable;
    }
    std::mutex unreadable_mutex;
    std::string unreadable;
  };

  explicit FailingStore(std::shared_ptr<Switch> control) : control_(std::move(control)) {}
  ~FailingStore() override {
    control_->puts.open();
    control_->reads.open();
    control_->counts.open();
    std::lock_guard<std::mutex> lock(answering_mutex_);
    for (auto& t : answering_)
      t.join();
  }

  void async_put(const Job& job, const std::optional<Lease>& claim, PutDone done) override {
    if (!control_->puts.closed()) return answer_now(done, [&] { return put(job, claim); });
    std::lock_guard<std::mutex> lock(answering_mutex_);
    answering_.emplace_back([this, job, claim, done = std::move(done)] {
      control_->puts.pass();
      answer_now(done, [&] { return put(job, claim); });
    });
  }

  // (The puts answered from a thread of its own when the gate is closed.)
  AnswerThread answer_thread(AsyncCall call, bool) const noexcept override {
    return call == AsyncCall::put ? AnswerThread::store : AnswerThread::caller;
  }

  void async_finish_job(const std::string& id, const std::string& holder, const JobOutcome& outcome,
                        const std::optional<Lease>& deliver, TimePoint now, bool want_record,
                        FinishDone done) override {
    if (want_record) ++control_->records_asked;
    if (!control_->answer_records)
      return JobStore::async_finish_job(id, holder, outcome, deliver, now, want_record,
                                        std::move(done));
    try {
      check();
    } catch (...) {
      return done(std::current_exception(), FinishAnswer{});
    }
    inner_.async_finish_job(id, holder, outcome, deliver, now, want_record, std::move(done));
  }

  using JobStore::put;
  PutOutcome put(const Job& job, const std::optional<Lease>& claim) override {
    return check(), inner_.put(job, claim);
  }
  std::optional<JobRecord> get(const std::string& id) const override {
    control_->reads.pass();
    ++control_->gets;
    if (control_->is_unreadable(id)) throw StoreUnavailable("fake store: cannot read " + id);
    return check(), inner_.get(id);
  }
  std::vector<std::optional<JobRecord>> get_many(
      const std::vector<std::string>& ids) const override {
    control_->reads.pass();
    ++control_->get_manys;
    std::size_t most = control_->most_ids_read;
    while (ids.size() > most && !control_->most_ids_read.compare_exchange_weak(most, ids.size())) {
    }
    for (const auto& id : ids)
      if (control_->is_unreadable(id)) throw StoreUnavailable("fake store: cannot read " + id);
    return check(), inner_.get_many(ids);
  }
  std::vector<JobRecord> claim_jobs(std::size_t max, const Lease& lease, TimePoint now) override {
    return check(), inner_.claim_jobs(max, lease, now);
  }
  bool renew(const std::string& id, const Lease& lease, TimePoint now) override {
    return check(), inner_.renew(id, lease, now);
  }
  void mark_running(const std::string& id, TimePoint now) override {
    check(), inner_.mark_running(id, now);
  }
  std::optional<std::size_t> queue_position(const std::string& id) const override {
    return check(), inner_.queue_position(id);
  }
  bool finish_job(const std::string& id, const std::string& holder, const JobOutcome& outcome,
                  const std::optional<Lease>& deliver, TimePoint now) override {
    return check(), inner_.finish_job(id, holder, outcome, deliver, now);
  }
  std::vector<JobRecord> claim_callbacks(std::size_t max, const Lease& lease,
                                         TimePoint now) override {
    return check(), inner_.claim_callbacks(max, lease, now);
  }
  using JobStore::record_attempt;
  bool record_attempt(const std::string& id, const std::string& holder, const CallbackInfo& after,
                      TimePoint now, const std::optional<CallbackAttempt>& attempt) override {
    return check(), inner_.record_attempt(id, holder, after, now, attempt);
  }
  JobPage list_jobs(const JobFilter& filter, const std::optional<ListCursor>& after,
                    std::size_t limit) const override {
    return check(), inner_.list_jobs(filter, after, limit);
  }
  void report_server(const std::string& id, std::size_t leases, TimePoint now) override {
    check(), inner_.report_server(id, leases, now);
  }
  std::vector<ServerSeen> servers(TimePoint now) const override {
    return check(), inner_.servers(now);
  }
  CancelOutcome cancel(const std::string& id, const JobOutcome& outcome, TimePoint now) override {
    return check(), inner_.cancel(id, outcome, now);
  }
  RedeliverOutcome redeliver(const std::string& id, const Lease& claim, TimePoint now) override {
    return check(), inner_.redeliver(id, claim, now);
  }
  void complete(const std::string& id, const JobOutcome& outcome) override {
    check(), inner_.complete(id, outcome);
  }
  void update_callback(const std::string& id, const CallbackInfo& callback) override {
    check(), inner_.update_callback(id, callback);
  }
  std::vector<JobRecord> list_failed_callbacks(std::size_t limit) const override {
    return check(), inner_.list_failed_callbacks(limit);
  }
  std::optional<rebound::QueueStats> queue_stats() const override {
    control_->counts.pass();
    return check(), inner_.queue_stats();
  }
  std::vector<JobRecord> list_unfinished(std::size_t limit) const override {
    return check(), inner_.list_unfinished(limit);
  }
  std::optional<std::string> failure() const override {
    if (control_->failing) return std::string("the fake store was told to fail");
    return std::nullopt;
  }

 private:
  void check() const {
    if (control_->failing) {
      ++control_->calls_failed;
      throw StoreUnavailable("the fake store was told to fail");
    }
  }

  std::shared_ptr<Switch> control_;
  MemoryJobStore inner_;
  std::mutex answering_mutex_;
  std::vector<std::thread> answering_;  // held puts' answers
};

}  // namespace rebound::test
