// Service: admission, the worker step (model, store, callback), the store pump (claims of due
// work, leases) and shutdown.
#include "rebound/service.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "rebound/detail/job_queue.hpp"
#include "rebound/detail/json.hpp"
#include "rebound/detail/wire.hpp"
#include "rebound/error.hpp"

namespace rebound {
namespace {

using TimePoint = std::chrono::system_clock::time_point;

// A name for this server that no other server on the same store shares.
std::string default_server_id() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::random_device random;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "%08x", random());
  return std::string(host[0] ? host : "rebound") + "-" + std::to_string(::getpid()) + "-" + suffix;
}

}  // namespace

// The counters and histograms of GET /metrics, kept by hearing the pipeline's events.
class MetricsObserver final : public ServiceObserver {
 public:
  explicit MetricsObserver(Metrics& m) : m_(m) {}
  void on_accepted(const std::string&, bool) override { ++m_.jobs_accepted; }
  void on_refused(Refusal why) override {
    switch (why) {
      case Refusal::queue_full:
        ++m_.submissions_refused_queue_full;
        break;
      case Refusal::not_ready:
        ++m_.submissions_refused_not_ready;
        break;
      case Refusal::store_unavailable:
        ++m_.submissions_refused_store_unavailable;
        break;
    }
  }
  void on_claimed(std::size_t jobs, std::size_t callbacks, bool at_start) override {
    m_.jobs_resumed += jobs + (at_start ? callbacks : 0);
  }
  void on_batch_started(const std::vector<std::chrono::steady_clock::duration>& waits) override {
    for (const auto& wait : waits)
      m_.queue_wait_seconds.observe(std::chrono::duration<double>(wait).count());
    m_.batch_size.observe(static_cast<double>(waits.size()));
  }
  void on_batch_finished(std::size_t, double inference_seconds) override {
    m_.inference_seconds.observe(inference_seconds);
  }
  void on_late_result(std::size_t, double inference_seconds) override {
    m_.inference_seconds.observe(inference_seconds);
  }
  void on_completed(const JobRecord& record, std::size_t, double) override {
    ++(record.status == JobStatus::succeeded ? m_.jobs_succeeded : m_.jobs_failed);
  }
  void on_expired(const JobRecord&, std::chrono::milliseconds) override { ++m_.jobs_expired; }
  void on_invocation(bool succeeded) override {
    ++(succeeded ? m_.invocations_succeeded : m_.invocations_failed);
  }
  void on_attempt(const std::string&, const AttemptReport& report) override {
    switch (report.verdict) {
      case AttemptVerdict::delivered:
        ++m_.callback_attempts_delivered;
        ++m_.callbacks_delivered;
        break;
      case AttemptVerdict::give_up:
        ++m_.callback_attempts_given_up;
        ++m_.callbacks_given_up;
        break;
      case AttemptVerdict::retry:
        ++m_.callback_attempts_retried;
        break;
    }
  }
  void on_lease_lost(const std::string&, std::string_view) override { ++m_.leases_lost; }
  void on_store_error(std::string_view, const std::string&, std::string_view) override {
    ++m_.store_errors;
  }

 private:
  Metrics& m_;
};

// The JSON log lines of docs/operations.md. Fields are built only when the line is wanted.
class LogObserver final : public ServiceObserver {
 public:
  explicit LogObserver(Logger log) : log_(std::move(log)) {}
  void on_accepted(const std::string& id, bool has_callback) override {
    if (log_.enabled(LogLevel::debug)) {  // the submit path: no JSON unless wanted
      log_.job(LogLevel::debug, "job_accepted", id, {{"callback", has_callback}});
    }
  }
  void on_claimed(std::size_t jobs, std::size_t callbacks, bool at_start) override {
    if (at_start) log_.log(LogLevel::info, "jobs_resumed", {{"count", jobs + callbacks}});
  }
  void on_late_result(std::size_t size, double inference_seconds) override {
    log_.log(LogLevel::warn, "late_result_discarded",
             {{"batch_size", size}, {"inference_ms", inference_seconds * 1000.0}});
  }
  void on_completed(const JobRecord& record, std::size_t batch_size, double inference_ms) override {
    const LogLevel level = record.status == JobStatus::succeeded ? LogLevel::info : LogLevel::warn;
    if (!log_.enabled(level)) return;
    nlohmann::json fields = {{"status", to_string(record.status)}, {"batch_size", batch_size}};
    if (inference_ms >= 0) fields["inference_ms"] = inference_ms;
    if (record.outcome.error) fields["error_code"] = record.outcome.error->code;
    log_.job(level, "job_completed", record.job.id, fields);
  }
  void on_expired(const JobRecord& record, std::chrono::milliseconds ttl) override {
    log_.job(LogLevel::warn, "job_expired", record.job.id, {{"ttl_ms", ttl.count()}});
  }
  void on_attempt(const std::string& id, const AttemptReport& report) override {
    switch (report.verdict) {
      case AttemptVerdict::delivered:
        if (log_.enabled(LogLevel::info)) {  // once per job: fields only when wanted
          log_.job(LogLevel::info, "callback_delivered", id, {{"attempts", report.attempt}});
        }
        break;
      case AttemptVerdict::give_up:
        log_.job(LogLevel::warn, "callback_given_up", id,
                 {{"attempts", report.attempt}, {"error", report.error}});
        break;
      case AttemptVerdict::retry:
        log_.job(LogLevel::warn, "callback_attempt_failed", id,
                 {{"attempt", report.attempt},
                  {"error", report.error},
                  {"retry_in_ms", report.next_delay.count()}});
        break;
    }
  }
  void on_redelivery(const std::string& id, int previous_attempts) override {
    log_.job(LogLevel::info, "callback_redelivery", id, {{"previous_attempts", previous_attempts}});
  }
  void on_lease_lost(const std::string& id, std::string_view during) override {
    log_.job(LogLevel::warn, "lease_lost", id, {{"during", during}});
  }
  void on_store_failing(std::string_view during, const std::string& job_id,
                        std::string_view why) override {
    const nlohmann::json fields = {{"during", during}, {"error", why}};
    if (job_id.empty()) {
      log_.log(LogLevel::error, "store_failed", fields);
    } else {
      log_.job(LogLevel::error, "store_failed", job_id, fields);
    }
  }
  void on_store_recovered() override { log_.log(LogLevel::info, "store_recovered"); }

 private:
  Logger log_;
};

// Who hears the events: the metrics and the log (called directly), then the user's observers;
// nothing an observer throws reaches the pipeline.
struct Observers {
  explicit Observers(Metrics& metrics) : metrics(metrics) {}
  MetricsObserver metrics;
  LogObserver log{Logger()};
  std::vector<std::shared_ptr<ServiceObserver>> user;

  template <typename Event>
  void operator()(const Event& event) noexcept {
    // Even the built-ins can throw (out of memory while building a log line): the step that
    // tells them (freeing a slot, recording an attempt) must go on all the same.
    try {
      event(metrics);
      event(log);
    } catch (...) {
    }
    for (const auto& observer : user) {
      try {
        event(*observer);
      } catch (...) {
      }
    }
  }
};

struct Service::WorkItem {
  Job job;
  InvocationHandler reply;  // set for an invocation: no store, no callback
  std::string holder;       // the lease a job is run under
  std::chrono::steady_clock::time_point enqueued = std::chrono::steady_clock::now();
};

struct Service::Core : std::enable_shared_from_this<Service::Core> {
  std::unique_ptr<Model> model;
  std::unique_ptr<JobStore> store;
  std::unique_ptr<CallbackSender> sender;
  std::size_t capacity = 0;
  std::chrono::milliseconds job_ttl{0};
  std::chrono::milliseconds inference_timeout{0};
  std::chrono::milliseconds store_retry_interval{1000};
  std::chrono::milliseconds lease{30000};
  std::chrono::milliseconds poll_interval{1000};
  std::function<TimePoint()> clock;
  std::string server_id;
  std::atomic<std::uint64_t> claims{0};
  BasicJobQueue<WorkItem>* queue = nullptr;  // owned by the Service, which outlives its use here

  // The failing-store policy (JobStore's comment): one log line when the store starts failing and
  // one when it works again; `stopped` ends the retries of writes when the Service goes away.
  std::atomic<bool> store_failing{false};
  std::atomic<bool> stopped{false};

  std::shared_mutex accepting_mutex;  // submit holds it shared; shutdown flips `accepting`
  bool accepting = true;

  std::mutex mutex;
  std::condition_variable idle;
  std::size_t in_flight = 0;
  BatchStats stats;
  Metrics metrics;
  Observers observe{metrics};

  // Jobs this server holds a lease on (waiting for a worker or running), by id: the holder, for
  // renewals. Bounded by the capacity.
  std::mutex held_mutex;
  std::unordered_map<std::string, std::string> held;

  // The pump runs on a thread of its own, so that a slow store never holds up the io executor
  // (which also drives the callback transport). It wakes at the next due time it knows of (a
  // retry this server scheduled, a freed slot), else every poll interval; it renews leases every
  // third of a lease.
  std::mutex pump_mutex;
  std::condition_variable pump_wake;
  std::chrono::steady_clock::time_point pump_due = std::chrono::steady_clock::time_point::max();
  bool pump_stop = false;
  std::thread pump_thread;

  std::atomic<bool> starting{true};  // during the constructor's first claims

  TimePoint now() const { return clock(); }

  // A lease holder name that no other claim shares, on this server or another.
  std::string next_holder() { return server_id + "/" + std::to_string(++claims); }

  Lease lease_from_now(std::string holder) const { return Lease{std::move(holder), now() + lease}; }

  // Notes a store call that threw (`counted`: a call, not a health check), and the start of a
  // failing spell.
  void store_failed(std::string_view during, const std::string& job_id, const char* why,
                    bool counted = true) {
    if (counted) observe([&](auto& o) { o.on_store_error(during, job_id, why); });
    if (!store_failing.exchange(true)) {
      observe([&](auto& o) { o.on_store_failing(during, job_id, why); });
    }
  }

  // Notes a store call that worked. A failing spell ends (one log line) only when the store says
  // it works again: a store may answer reads while its writes fail.
  void store_worked() {
    if (!store_failing.load(std::memory_order_relaxed)) return;
    std::optional<std::string> why;
    try {
      why = store->failure();
    } catch (...) {
      return;
    }
    if (!why && store_failing.exchange(false)) observe([](auto& o) { o.on_store_recovered(); });
  }

  // What store calls made under a lock have to tell the observers once it is let go.
  struct StoreNews {
    bool worked = false;
    std::optional<std::pair<std::string, std::string>> failed;  // during, why
    std::string job_id;
  };

  void tell(const StoreNews& news) {
    if (news.failed) {
      store_failed(news.failed->first, news.job_id, news.failed->second.c_str());
    } else if (news.worked) {
      store_worked();
    }
  }

  // Runs `call` against the store; a failure is noted and rethrown as StoreUnavailable (for the
  // reads a front end answers from). With `news`, what happened is kept there for `tell`,
  // because the caller holds a lock that observers must not run under.
  template <typename Call>
  auto read_store(std::string_view during, const std::string& job_id, Call&& call,
                  StoreNews* news = nullptr) const -> decltype(call(*store)) {
    auto* self = const_cast<Core*>(this);
    auto failed = [&](const char* why) {
      if (news) {
        news->failed.emplace(std::string(during), why);
        news->job_id = job_id;
      } else {
        self->store_failed(during, job_id, why);
      }
    };
    try {
      auto out = call(*store);
      if (news) {
        news->worked = true;
      } else {
        self->store_worked();
      }
      return out;
    } catch (const std::exception& e) {
      failed(e.what());
      throw StoreUnavailable(e.what());
    } catch (...) {
      failed("unknown error");
      throw StoreUnavailable("the job store failed");
    }
  }

  // Runs a write that an accepted job needs (its acknowledgement, an attempt's record), then
  // `then` with what the write answered (false: the lease was lost). When the store fails the
  // write is tried again every store_retry_interval on the io executor, and the work keeps its
  // slot, until it is written or the Service is destroyed (the store then still holds the work as
  // it was, and its lease runs out: another claim takes it over).
  static void write_until_stored(const std::shared_ptr<Core>& core, const char* during,
                                 std::string job_id, std::function<bool(JobStore&)> write,
                                 std::function<void(bool)> then) {
    bool answer = false;
    try {
      answer = write(*core->store);
      core->store_worked();
    } catch (const std::exception& e) {
      core->store_failed(during, job_id, e.what());
      retry_later(core, during, std::move(job_id), std::move(write), std::move(then));
      return;
    } catch (...) {
      core->store_failed(during, job_id, "unknown error");
      retry_later(core, during, std::move(job_id), std::move(write), std::move(then));
      return;
    }
    then(answer);
  }

  static void retry_later(const std::shared_ptr<Core>& core, const char* during, std::string job_id,
                          std::function<bool(JobStore&)> write, std::function<void(bool)> then) {
    if (core->stopped) {
      core->release();
      return;
    }
    auto timer = std::make_shared<boost::asio::steady_timer>(core->sender->get_executor(),
                                                             core->store_retry_interval);
    timer->async_wait([core, timer, during, job_id = std::move(job_id), write = std::move(write),
                       then = std::move(then)](const boost::system::error_code&) mutable {
      write_until_stored(core, during, std::move(job_id), std::move(write), std::move(then));
    });
  }

  // A bookkeeping write whose loss costs only a lagging display (running, a retry's progress).
  void write_or_note(const char* during, const std::string& job_id,
                     const std::function<void(JobStore&)>& write) {
    try {
      write(*store);
      store_worked();
    } catch (const std::exception& e) {
      store_failed(during, job_id, e.what());
    } catch (...) {
      store_failed(during, job_id, "unknown error");
    }
  }

  bool try_admit() {
    std::lock_guard<std::mutex> lock(mutex);
    if (in_flight >= capacity) return false;
    ++in_flight;
    return true;
  }

  // The admission shared by submissions and invocations; the caller holds accepting_mutex
  // (shared). `accepted` means a slot was taken, to be released when the work is finished.
  // The caller tells the observers, after it let go of the lock.
  SubmitStatus admit() {
    if (!accepting) return SubmitStatus::shutting_down;
    if (!model->ready()) return SubmitStatus::not_ready;
    return try_admit() ? SubmitStatus::accepted : SubmitStatus::queue_full;
  }

  // Tells the observers how a submission (or, without an id, an invocation) was answered; called
  // outside every lock.
  void observe_submission(SubmitStatus status, const std::string& id, bool has_callback) {
    switch (status) {
      case SubmitStatus::accepted:
        if (!id.empty()) observe([&](auto& o) { o.on_accepted(id, has_callback); });
        break;
      case SubmitStatus::queue_full:
        observe([](auto& o) { o.on_refused(Refusal::queue_full); });
        break;
      case SubmitStatus::not_ready:
        observe([](auto& o) { o.on_refused(Refusal::not_ready); });
        break;
      case SubmitStatus::store_unavailable:
        observe([](auto& o) { o.on_refused(Refusal::store_unavailable); });
        break;
      default:
        break;
    }
  }

  void release(std::size_t n = 1) {
    if (n == 0) return;
    bool freed;
    {
      std::lock_guard<std::mutex> lock(mutex);
      freed = in_flight == capacity;
      in_flight -= n;
      if (in_flight == 0) idle.notify_all();
    }
    // Work may be waiting in the store for a free slot: look now rather than at the next poll.
    if (freed && !stopped) wake_pump(now());
  }

  void hold(const std::string& id, const std::string& holder) {
    std::lock_guard<std::mutex> lock(held_mutex);
    held[id] = holder;
  }
  // Forgets `holder`'s claim on `id`; a later claim of the same id (after a lease ran out) stays.
  void unhold(const std::string& id, const std::string& holder) {
    std::lock_guard<std::mutex> lock(held_mutex);
    auto it = held.find(id);
    if (it != held.end() && it->second == holder) held.erase(it);
  }

  // ---- Delivery: one attempt at a time; the schedule between attempts lives in the store.

  // Sends the next attempt of a pending callback that `holder` has claimed; the caller holds a
  // slot for it, which is freed once the attempt is recorded.
  static void attempt(const std::shared_ptr<Core>& core, const JobRecord& record,
                      std::string holder) {
    const std::string id = record.job.id;
    const CallbackInfo before = record.callback;
    CallbackMessage message{id, record.job.callback_url,
                            detail::dump_json(to_callback_json(record)), "msg_" + id,
                            before.attempts};
    RetryState state;
    state.attempts = before.delivery_attempts;
    state.previous_delay = before.previous_delay;
    if (before.delivery_started_at != TimePoint{}) {
      state.elapsed = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   core->now() - before.delivery_started_at));
    }
    // Renewed while it lasts: an attempt may wait in the transport (behind a receiver's other
    // requests, or its open circuit) for longer than a lease.
    core->hold(id, holder);
    core->sender->attempt(std::move(message), state,
                          [core, id, before, holder = std::move(holder)](const AttemptReport& r) {
                            core->attempted(id, holder, before, r);
                          });
  }

  // What follows an attempt: its record in the store (pending with the next time, delivered or
  // failed), metrics and logs.
  void attempted(const std::string& id, const std::string& holder, const CallbackInfo& before,
                 const AttemptReport& report) {
    CallbackInfo after = before;
    after.attempts = report.attempt;
    after.delivery_attempts = before.delivery_attempts + 1;
    after.last_error = report.error;
    switch (report.verdict) {
      case AttemptVerdict::delivered:
        after.state = CallbackState::delivered;
        break;
      case AttemptVerdict::give_up:
        after.state = CallbackState::failed;
        break;
      case AttemptVerdict::retry:
        after.state = CallbackState::pending;
        after.next_attempt_at = now() + report.next_delay;
        after.previous_delay = report.next_delay;
        break;
    }
    observe([&](auto& o) { o.on_attempt(id, report); });
    auto core = shared_from_this();
    write_until_stored(
        core, "record_attempt", id,
        [id, holder, after, core](JobStore& s) {
          return s.record_attempt(id, holder, after, core->now());
        },
        [core, id, holder, after](bool recorded) {
          core->unhold(id, holder);
          if (!recorded) core->lease_lost(id, "record_attempt");
          core->release();
          if (recorded && after.state == CallbackState::pending) {
            core->wake_pump(after.next_attempt_at);
          }
        });
  }

  void lease_lost(const std::string& id, const char* during) {
    observe([&](auto& o) { o.on_lease_lost(id, during); });
  }

  // ---- The pump: claims due work from the store, as far as there are free slots.

  // Runs the pump at `at` (at once when it has come), unless it runs earlier already.
  void wake_pump(TimePoint at) {
    const auto delay = std::chrono::duration_cast<std::chrono::steady_clock::duration>(at - now());
    const auto when = std::chrono::steady_clock::now() +
                      std::max(std::chrono::steady_clock::duration::zero(), delay);
    std::lock_guard<std::mutex> lock(pump_mutex);
    if (when >= pump_due) return;
    pump_due = when;
    pump_wake.notify_one();
  }

  // The pump thread's loop, until the Service stops it.
  void run_pump() {
    auto next_renewal = std::chrono::steady_clock::now() + lease / 3;
    std::unique_lock<std::mutex> lock(pump_mutex);
    for (;;) {
      pump_wake.wait_until(lock, std::min(pump_due, next_renewal), [&] {
        return pump_stop || std::chrono::steady_clock::now() >= pump_due ||
               std::chrono::steady_clock::now() >= next_renewal;
      });
      if (pump_stop) return;
      lock.unlock();
      if (std::chrono::steady_clock::now() >= next_renewal) {
        renew_leases();
        next_renewal = std::chrono::steady_clock::now() + lease / 3;
      }
      if (std::chrono::steady_clock::now() >= pump_due) pump();
      lock.lock();
    }
  }

  // Claims what is due, as far as slots are free: callbacks first (results already paid for),
  // then jobs. Runs on the pump thread (and once in the constructor).
  void pump() {
    {
      std::lock_guard<std::mutex> lock(pump_mutex);
      pump_due = std::chrono::steady_clock::time_point::max();
    }
    if (stopped) return;
    std::size_t jobs = 0, callbacks = 0;
    bool more = false;
    try {
      // After shutdown begins nothing new is claimed: it stays in the store for the next start,
      // or for the other servers.
      if (accepting_work()) {
        callbacks = claim_callbacks(more);
        jobs = claim_jobs(more);
      }
      store_worked();
    } catch (const std::exception& e) {
      store_failed("claim", {}, e.what());
    } catch (...) {
      store_failed("claim", {}, "unknown error");
    }
    // Taken over: jobs this server did not accept, and at start the callbacks an earlier run owed
    // (later, claimed callbacks are the retries this server or another scheduled).
    const bool at_start = starting;
    if (!at_start) callbacks = 0;
    if (jobs + callbacks > 0) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        stats.resumed += jobs + callbacks;
      }
      observe([&](auto& o) { o.on_claimed(jobs, callbacks, at_start); });
    }
    wake_pump(now() + (more ? std::chrono::milliseconds(0) : poll_interval));
  }

  bool accepting_work() {
    std::shared_lock<std::shared_mutex> lock(accepting_mutex);
    return accepting;
  }

  static constexpr std::size_t max_claim = 256;

  std::size_t free_slots() {
    std::lock_guard<std::mutex> lock(mutex);
    return capacity > in_flight ? capacity - in_flight : 0;
  }

  // Claims with `claim` up to as many items as there are free slots, and keeps those it gets a
  // slot for; a claim whose slot a submission took meanwhile is handed back at once (its lease
  // ends now). Slots are not reserved beforehand, so a poll never makes a submission see a full
  // queue.
  template <typename Claim>
  std::vector<JobRecord> claim_with_slots(const char* what, bool& more, std::string& holder,
                                          Claim&& claim) {
    const std::size_t slots = std::min(free_slots(), max_claim);
    if (slots == 0) return {};
    holder = next_holder();
    std::vector<JobRecord> due = claim(slots, lease_from_now(holder), now());
    if (due.size() == slots) more = true;
    std::vector<JobRecord> kept;
    for (auto& record : due) {
      if (try_admit()) {
        kept.push_back(std::move(record));
      } else {
        const TimePoint at = now();
        write_or_note(what, record.job.id, [&](JobStore& s) {
          s.renew(record.job.id, {holder, at}, at);
        });
      }
    }
    return kept;
  }

  std::size_t claim_callbacks(bool& more) {
    std::string holder;
    auto due = claim_with_slots("claim_callbacks", more, holder,
                                [this](std::size_t n, const Lease& lease, TimePoint at) {
                                  return store->claim_callbacks(n, lease, at);
                                });
    auto core = shared_from_this();
    for (auto& record : due)
      attempt(core, record, holder);
    return due.size();
  }

  std::size_t claim_jobs(bool& more) {
    std::string holder;
    auto due = claim_with_slots("claim_jobs", more, holder,
                                [this](std::size_t n, const Lease& lease, TimePoint at) {
                                  return store->claim_jobs(n, lease, at);
                                });
    std::size_t queued = 0;
    for (auto& record : due) {
      const std::string id = record.job.id;
      hold(id, holder);
      if (queue->try_push(WorkItem{std::move(record.job), nullptr, holder}) ==
          PushResult::accepted) {
        ++queued;  // runs: at least once
        continue;
      }
      // Shutdown closed the queue meanwhile: the job goes back to the store at once.
      unhold(id, holder);
      const TimePoint at = now();
      write_or_note("renew", id, [&](JobStore& s) { s.renew(id, {holder, at}, at); });
      release();
    }
    return queued;
  }

  // Extends the leases on the jobs this server holds (every third of a lease, on the pump thread).
  void renew_leases() {
    std::vector<std::pair<std::string, std::string>> jobs;
    {
      std::lock_guard<std::mutex> lock(held_mutex);
      jobs.assign(held.begin(), held.end());
    }
    const TimePoint at = now();
    for (const auto& job : jobs) {
      const std::string& id = job.first;  // not a structured binding: lambdas capture it (C++17)
      const std::string& holder = job.second;
      write_or_note("renew", id, [&](JobStore& s) { s.renew(id, {holder, at + lease}, at); });
    }
  }

  // Runs the model on a batch. Never throws: a model that throws, or returns the wrong number of
  // predictions, fails every item of the batch with model_error.
  std::vector<Prediction> predict(std::vector<nlohmann::json>& inputs) {
    try {
      // Moved, never copied, until its depth is checked: copying a json tree recurses.
      std::vector<Prediction> out;
      if (inputs.size() == 1) {
        out.push_back(model->predict(inputs.front()));
      } else {
        out = model->predict_batch(inputs);
      }
      if (out.size() == inputs.size()) {
        // Everything downstream (the store, the status body, the callback) serialises outputs
        // recursively; a model cannot be allowed to build a tree deep enough to overflow a stack.
        for (Prediction& p : out) {
          if (p.ok() && detail::json_deeper_than(p.output(), max_json_depth)) {
            p = Prediction::failure("model_error",
                                    "the model's output nests arrays and objects deeper than " +
                                        std::to_string(max_json_depth) + " levels");
          }
        }
        return out;
      }
      return std::vector<Prediction>(
          inputs.size(),
          Prediction::failure("model_error", "the model returned " + std::to_string(out.size()) +
                                                 " predictions for " +
                                                 std::to_string(inputs.size()) + " inputs"));
    } catch (const std::exception& e) {
      return std::vector<Prediction>(
          inputs.size(),
          Prediction::failure("model_error", std::string("the model failed: ") + e.what()));
    } catch (...) {
      return std::vector<Prediction>(inputs.size(),
                                     Prediction::failure("model_error", "the model failed"));
    }
  }

  void count_batch(std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex);
    ++stats.batches;
    stats.items += size;
    stats.largest_batch = std::max(stats.largest_batch, size);
  }

  // Acknowledges a final outcome to the store and sends the first callback attempt (or frees the
  // slot when none is wanted, or when the lease was lost: another claim has the job).
  void finish(const JobRecord& record, const std::string& holder);

  // Answers one item of a batch with its prediction: an invocation's handler, or a job's record
  // and callback. inference_ms < 0: the model never answered (a timeout).
  void settle(WorkItem& item, Prediction& prediction, std::size_t batch_size, double inference_ms);

  // The worker step: runs on the inference executor, never under a lock.
  static void run_batch(const std::shared_ptr<Core>& core, std::vector<WorkItem> batch);
};

void Service::Core::run_batch(const std::shared_ptr<Core>& core, std::vector<WorkItem> batch) {
  // Jobs that waited past their time-to-live end here, without running.
  if (core->job_ttl.count() > 0) {
    const auto now = core->now();
    auto expired = std::stable_partition(batch.begin(), batch.end(), [&](const WorkItem& item) {
      return item.reply || now - item.job.created_at <= core->job_ttl;
    });
    for (auto it = expired; it != batch.end(); ++it) {
      JobRecord record;
      record.job = std::move(it->job);
      record.status = JobStatus::expired;
      record.outcome = {JobStatus::expired, nullptr,
                        ErrorInfo{"expired", "The job waited longer than its time-to-live of " +
                                                 std::to_string(core->job_ttl.count() / 1000.0) +
                                                 " s and was not run."}};
      core->observe([&](auto& o) { o.on_expired(record, core->job_ttl); });
      core->finish(record, it->holder);
    }
    batch.erase(expired, batch.end());
    if (batch.empty()) return;
  }
  std::vector<nlohmann::json> inputs;
  inputs.reserve(batch.size());
  for (auto& item : batch) {
    if (!item.reply) {
      // Only the displayed status lags when this fails; the job still runs and completes.
      core->write_or_note("mark_running", item.job.id,
                          [&](JobStore& store) { store.mark_running(item.job.id); });
    }
    inputs.push_back(std::move(item.job.input));  // the record does not need it any more
  }
  core->count_batch(batch.size());
  const auto started = std::chrono::steady_clock::now();
  {
    std::vector<std::chrono::steady_clock::duration> waits;
    waits.reserve(batch.size());
    for (const auto& item : batch)
      waits.push_back(started - item.enqueued);
    core->observe([&](auto& o) { o.on_batch_started(waits); });
  }

  // With an inference timeout, a watchdog on the io executor answers the batch when the model
  // overruns; whoever settles the batch first (the watchdog or the model) answers it, once.
  auto items = std::make_shared<std::vector<WorkItem>>(std::move(batch));
  auto settled = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<boost::asio::steady_timer> watchdog;
  if (core->inference_timeout.count() > 0) {
    watchdog = std::make_shared<boost::asio::steady_timer>(core->sender->get_executor(),
                                                           core->inference_timeout);
    watchdog->async_wait([core, items, settled](const boost::system::error_code& ec) {
      if (ec || settled->exchange(true)) return;
      const std::string message = "The model did not answer within the inference timeout of " +
                                  std::to_string(core->inference_timeout.count() / 1000.0) + " s.";
      for (auto& item : *items) {
        Prediction timeout = Prediction::failure("inference_timeout", message);
        core->settle(item, timeout, items->size(), -1);
      }
    });
  }
  std::vector<Prediction> predictions = core->predict(inputs);
  const double inference_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (settled->exchange(true)) {
    core->observe([&](auto& o) { o.on_late_result(items->size(), inference_s); });
    return;
  }
  core->observe([&](auto& o) { o.on_batch_finished(items->size(), inference_s); });
  if (watchdog) watchdog->cancel();
  for (std::size_t i = 0; i < items->size(); ++i) {
    core->settle((*items)[i], predictions[i], items->size(), inference_s * 1000.0);
  }
}

void Service::Core::settle(WorkItem& item, Prediction& prediction, std::size_t batch_size,
                           double inference_ms) {
  if (item.reply) {
    observe([&](auto& o) { o.on_invocation(prediction.ok()); });
    try {
      item.reply(prediction);
    } catch (...) {
      // The invocation's owner failed to take its answer; nothing else to do.
    }
    release();
    return;
  }
  JobRecord record;
  record.job = std::move(item.job);
  if (prediction.ok()) {
    record.outcome = {JobStatus::succeeded, std::move(prediction.output()), std::nullopt};
  } else {
    record.outcome = {JobStatus::failed, nullptr, prediction.error()};
  }
  record.status = record.outcome.status;
  observe([&](auto& o) { o.on_completed(record, batch_size, inference_ms); });
  finish(record, item.holder);
}

void Service::Core::finish(const JobRecord& record, const std::string& holder) {
  auto core = shared_from_this();
  auto kept = std::make_shared<JobRecord>(record);
  std::optional<Lease> deliver;
  if (!record.job.callback_url.empty()) deliver = lease_from_now(next_holder());
  write_until_stored(
      core, "finish_job", record.job.id,
      [core, kept, holder, deliver](JobStore& s) {
        return s.finish_job(kept->job.id, holder, kept->outcome, deliver, core->now());
      },
      [core, kept, holder, deliver](bool acknowledged) {
        core->unhold(kept->job.id, holder);
        if (!acknowledged) {
          // The lease ran out and another claim has the job: this result is not the one kept.
          core->lease_lost(kept->job.id, "finish_job");
          core->release();
          return;
        }
        if (!deliver) {
          core->release();
          return;
        }
        // The callback is this server's at once: its first attempt goes out now, in the slot the
        // job held.
        const TimePoint at = core->now();
        kept->callback.state = CallbackState::pending;
        kept->callback.next_attempt_at = at;
        kept->callback.delivery_attempts = 0;
        kept->callback.delivery_started_at = at;
        kept->callback.previous_delay = std::chrono::milliseconds(0);
        attempt(core, *kept, deliver->holder);
      });
}

Service::Service(boost::asio::any_io_executor inference_executor,
                 boost::asio::any_io_executor io_executor, std::unique_ptr<Model> model,
                 std::unique_ptr<JobStore> store, std::unique_ptr<CallbackTransport> transport,
                 ServiceOptions options)
    : core_(std::make_shared<Core>()) {
  if (!model) throw Error("Service: a model is required");
  if (!store) throw Error("Service: a job store is required");
  if (options.queue_capacity == 0) throw Error("Service: queue_capacity must be at least 1");
  if (options.job_ttl.count() < 0) throw Error("Service: job_ttl must not be negative");
  if (options.inference_timeout.count() < 0) {
    throw Error("Service: inference_timeout must not be negative");
  }
  if (options.store_retry_interval.count() <= 0) {
    throw Error("Service: store_retry_interval must be positive");
  }
  if (options.lease.count() <= 0) throw Error("Service: lease must be positive");
  if (options.poll_interval.count() <= 0) throw Error("Service: poll_interval must be positive");
  if (!options.clock) throw Error("Service: a clock is required");
  core_->model = std::move(model);
  core_->store = std::move(store);
  core_->capacity = options.queue_capacity;
  core_->job_ttl = options.job_ttl;
  core_->inference_timeout = options.inference_timeout;
  core_->store_retry_interval = options.store_retry_interval;
  core_->lease = options.lease;
  core_->poll_interval = options.poll_interval;
  core_->clock = options.clock;
  core_->server_id = options.server_id.empty() ? default_server_id() : options.server_id;
  core_->observe.log = LogObserver(options.logger);
  core_->observe.user = std::move(options.observers);
  core_->sender = std::make_unique<CallbackSender>(std::move(io_executor), std::move(transport),
                                                   std::move(options.delivery));
  const BatchingPreference preferred = core_->model->batching();
  JobQueueOptions queue_options;
  // The queue's own bound equals the admission bound, so an admitted item always fits.
  queue_options.capacity = options.queue_capacity;
  queue_options.workers = options.workers;
  queue_options.max_batch_size = options.max_batch_size.value_or(preferred.max_batch_size);
  queue_options.max_queue_delay = options.max_queue_delay.value_or(preferred.max_queue_delay);
  queue_ = std::make_unique<BasicJobQueue<WorkItem>>(
      std::move(inference_executor), queue_options,
      [core = core_](std::vector<WorkItem> batch) { Core::run_batch(core, std::move(batch)); });
  core_->queue = queue_.get();
  // What the store holds from an earlier run (a durable store) or from servers gone: the first
  // claims happen here, so that they are counted when the constructor returns. A store that fails
  // now is retried by the pump.
  core_->pump();
  core_->starting = false;
  core_->pump_thread = std::thread([core = core_.get()] { core->run_pump(); });
}

Service::~Service() {
  {
    std::unique_lock<std::shared_mutex> lock(core_->accepting_mutex);
    core_->accepting = false;
  }
  core_->stopped = true;
  {
    std::lock_guard<std::mutex> lock(core_->pump_mutex);
    core_->pump_stop = true;
    core_->pump_wake.notify_one();
  }
  core_->pump_thread.join();
  queue_.reset();  // drops jobs not yet started and waits for running ones
}

SubmitStatus Service::submit(Job job) {
  const std::string id = job.id;
  const bool has_callback = !job.callback_url.empty();
  Core::StoreNews news;
  const SubmitStatus status = [&] {
    std::shared_lock<std::shared_mutex> accepting(core_->accepting_mutex);
    const SubmitStatus admitted = core_->admit();
    if (admitted == SubmitStatus::queue_full) {
      // A resubmission of a stored job is still answered as a duplicate when the queue is full.
      std::optional<JobRecord> existing;
      try {
        existing = core_->read_store(
            "get", id, [&](JobStore& s) { return s.get(id); }, &news);
      } catch (const StoreUnavailable&) {
        return SubmitStatus::store_unavailable;
      }
      if (existing) {
        return existing->job.same_request_as(job) ? SubmitStatus::duplicate
                                                  : SubmitStatus::conflict;
      }
    }
    if (admitted != SubmitStatus::accepted) return admitted;
    if (job.created_at == std::chrono::system_clock::time_point{}) job.created_at = core_->now();
    // The accepting server claims the job as it stores it: no claim round trip on the way in.
    const std::string holder = core_->next_holder();
    PutOutcome outcome;
    try {
      outcome = core_->read_store(
          "put", id, [&](JobStore& s) { return s.put(job, core_->lease_from_now(holder)); }, &news);
    } catch (const StoreUnavailable&) {
      core_->release();
      return SubmitStatus::store_unavailable;
    }
    switch (outcome) {
      case PutOutcome::created:
        break;
      case PutOutcome::duplicate:
        core_->release();
        return SubmitStatus::duplicate;
      case PutOutcome::full:
        core_->release();
        return SubmitStatus::queue_full;
      case PutOutcome::conflict:
        core_->release();
        return SubmitStatus::conflict;
    }
    // Cannot be full (admission bounds it) nor closed (shutdown waits for this shared lock).
    core_->hold(id, holder);
    queue_->try_push(WorkItem{std::move(job), nullptr, holder});
    return SubmitStatus::accepted;
  }();
  core_->tell(news);
  core_->observe_submission(status, id, has_callback);
  return status;
}

SubmitStatus Service::invoke(nlohmann::json input, InvocationHandler on_result) {
  if (!on_result) throw Error("Service::invoke: a result handler is required");
  const SubmitStatus status = [&] {
    std::shared_lock<std::shared_mutex> accepting(core_->accepting_mutex);
    const SubmitStatus admitted = core_->admit();
    if (admitted != SubmitStatus::accepted) return admitted;
    Job job;
    job.input = std::move(input);
    queue_->try_push(WorkItem{std::move(job), std::move(on_result), {}});
    return SubmitStatus::accepted;
  }();
  if (status != SubmitStatus::accepted) core_->observe_submission(status, {}, false);
  return status;
}

std::size_t Service::max_batch_size() const {
  return queue_->options().max_batch_size;
}

std::chrono::microseconds Service::max_queue_delay() const {
  return queue_->options().max_queue_delay;
}

std::string Service::render_metrics() const {
  std::size_t in_flight;
  {
    std::lock_guard<std::mutex> lock(core_->mutex);
    in_flight = core_->in_flight;
  }
  std::string out = core_->metrics.render(queue_->depth(), in_flight, core_->sender->in_flight());
  // The breakers, by state, from what the transport tracks now.
  std::size_t by_state[3] = {0, 0, 0};
  for (const EndpointStatus& e : core_->sender->endpoints())
    ++by_state[static_cast<int>(e.state)];
  out +=
      "# HELP rebound_callback_endpoints Receiver origins tracked by the transport, by circuit "
      "state.\n# TYPE rebound_callback_endpoints gauge\n";
  for (const CircuitState state :
       {CircuitState::closed, CircuitState::open, CircuitState::half_open}) {
    out += std::string("rebound_callback_endpoints{state=\"") + to_string(state) + "\"} " +
           std::to_string(by_state[static_cast<int>(state)]) + "\n";
  }
  return out;
}

std::vector<EndpointStatus> Service::callback_endpoints() const {
  return core_->sender->endpoints();
}

const Metrics& Service::metrics() const {
  return core_->metrics;
}

BatchStats Service::batch_stats() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->stats;
}

RedeliverStatus Service::redeliver(const std::string& id) {
  if (!core_->accepting_work()) return RedeliverStatus::shutting_down;
  if (!core_->try_admit()) {
    // Still tell an unknown id or a callback that is not failed apart from a full queue.
    auto record = core_->read_store("get", id, [&](JobStore& s) { return s.get(id); });
    if (!record) return RedeliverStatus::not_found;
    if (record->callback.state != CallbackState::failed) return RedeliverStatus::not_failed;
    return RedeliverStatus::queue_full;
  }
  const Lease lease = core_->lease_from_now(core_->next_holder());
  RedeliverOutcome outcome;
  std::optional<JobRecord> record;
  try {
    // The store moves failed -> pending atomically: of two redeliveries at once (on this server
    // or another), one wins and the other answers not_failed.
    outcome = core_->read_store("redeliver", id,
                                [&](JobStore& s) { return s.redeliver(id, lease, core_->now()); });
    if (outcome == RedeliverOutcome::redelivered) {
      record = core_->read_store("get", id, [&](JobStore& s) { return s.get(id); });
    }
  } catch (...) {
    core_->release();
    throw;
  }
  if (outcome != RedeliverOutcome::redelivered || !record) {  // no record: pruned meanwhile
    core_->release();
    return outcome == RedeliverOutcome::not_failed ? RedeliverStatus::not_failed
                                                   : RedeliverStatus::not_found;
  }
  core_->observe([&](auto& o) { o.on_redelivery(id, record->callback.attempts); });
  Core::attempt(core_, *record, lease.holder);
  return RedeliverStatus::accepted;
}

std::vector<JobRecord> Service::failed_callbacks(std::size_t limit) const {
  return core_->read_store("list_failed_callbacks", {},
                           [&](JobStore& s) { return s.list_failed_callbacks(limit); });
}

std::optional<JobRecord> Service::find(const std::string& id) const {
  return core_->read_store("get", id, [&](JobStore& s) { return s.get(id); });
}

std::optional<std::string> Service::store_failure() const {
  std::optional<std::string> why;
  try {
    why = core_->store->failure();
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
    why = "the job store failed";
  }
  if (why) {
    core_->store_failed("failure", {}, why->c_str(), false);
  } else if (core_->store_failing.exchange(false)) {
    core_->observe([](auto& o) { o.on_store_recovered(); });
  }
  return why;
}

bool Service::ready() const {
  {
    std::shared_lock<std::shared_mutex> lock(core_->accepting_mutex);
    if (!core_->accepting || !core_->model->ready()) return false;
  }
  return !store_failure();
}

std::size_t Service::in_flight() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->in_flight;
}

std::size_t Service::queue_depth() const {
  return queue_->depth();
}

const Model& Service::model() const {
  return *core_->model;
}

bool Service::shutdown(std::chrono::steady_clock::duration timeout) {
  {
    std::unique_lock<std::shared_mutex> lock(core_->accepting_mutex);
    core_->accepting = false;
  }
  queue_->close();
  std::unique_lock<std::mutex> lock(core_->mutex);
  if (core_->idle.wait_for(lock, timeout, [this] { return core_->in_flight == 0; })) return true;
  lock.unlock();
  // The deadline passed: jobs that never started stay as they are in the store (queued), and
  // their slots are freed so that the running ones can end the process promptly. Invocations
  // still waiting are answered that the server is stopping.
  for (auto& item : queue_->take_pending()) {
    if (item.reply) {
      try {
        item.reply(Prediction::failure("shutting_down", "the server is shutting down"));
      } catch (...) {
      }
    } else {
      // Its lease ends now, so that another server may take it at once.
      core_->unhold(item.job.id, item.holder);
      const auto at = core_->now();
      core_->write_or_note("renew", item.job.id, [&](JobStore& s) {
        s.renew(item.job.id, {item.holder, at}, at);
      });
    }
    core_->release();
  }
  return false;
}

}  // namespace rebound
