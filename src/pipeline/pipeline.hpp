// The Pipeline: the parts of a JobQueue (src/pipeline/), built in order and wired together, shared
// with the work in flight. JobQueue (src/job_queue.cpp) is its public face.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "admission.hpp"
#include "batch_runner.hpp"
#include "common/job_rules.hpp"
#include "common/trace_context.hpp"
#include "delivery.hpp"
#include "events.hpp"
#include "leases.hpp"
#include "model_table.hpp"
#include "observers.hpp"
#include "rebound/delivery/address_guard.hpp"
#include "rebound/delivery/callback_sender.hpp"
#include "rebound/delivery/origin_gate.hpp"
#include "rebound/detail/completion.hpp"
#include "rebound/job_queue_options.hpp"
#include "rebound/job_queue_status.hpp"
#include "store_access.hpp"
#include "store_pump.hpp"
#include "tenant_rates.hpp"
#include "work_item.hpp"

namespace rebound::detail {

/// Asynchronous waits for jobs to become final (`async_submit`, `async_wait`): completed when this
/// queue finishes or cancels the job, or when the pump sees it final in the store (another
/// server's work). Thread-safe; completions are called outside the lock (they only post).
class AsyncWaiters {
 public:
  explicit AsyncWaiters(std::size_t max_waits) : max_(max_waits) {}

  enum class Added { added, closed, full };

  /// Registers `done` for `id`. `bounded` waits count against `max_waits` (async_wait); those of
  /// async_submit are bounded by the queue capacity instead. On a refusal `done` is left as it was.
  /// With `unchecked`, the job has not been looked at yet: `*unchecked` is set to this wait's
  /// token, by which the look's answer reaches this wait alone (fail_one, mark_checked).
  Added add(const std::string& id, Completion<JobRecord>& done, bool bounded,
            std::uint64_t* unchecked = nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return Added::closed;
    if (bounded && bounded_ >= max_) return Added::full;
    const std::uint64_t token = unchecked ? ++last_token_ : 0;
    waits_[id].push_back({std::move(done), bounded, token});
    if (unchecked) *unchecked = token;
    bounded_ += bounded ? 1 : 0;
    count_.store(count_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return Added::added;
  }

  /// Completes every wait for `id` with `record`.
  void complete(const std::string& id, const JobRecord& record) {
    auto done = take(id);
    complete_all(done, {}, record);
  }

  /// Completes every wait for `id` with an error.
  void fail(const std::string& id, boost::system::error_code ec) {
    auto done = take(id);
    complete_all(done, ec, JobRecord{});
  }

  /// The wait for `id` with the token `unchecked` (see add), if it is still waiting unchecked,
  /// completed with an error; the others go on waiting.
  void fail_one(const std::string& id, std::uint64_t unchecked, boost::system::error_code ec) {
    std::vector<Wait> out;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = waits_.find(id);
      if (it == waits_.end()) return;
      std::vector<Wait>& all = it->second;
      auto mine = std::find_if(all.begin(), all.end(),
                               [&](const Wait& w) { return w.unchecked == unchecked; });
      if (mine == all.end()) return;
      out.push_back(std::move(*mine));
      all.erase(mine);
      if (all.empty()) waits_.erase(it);
      bounded_ -= out.front().bounded ? 1 : 0;
      count_.store(count_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
    }
    complete_all(out, ec, JobRecord{});
  }

  /// Whether the wait for `id` with the token `unchecked` still waits for its first look.
  bool unchecked(const std::string& id, std::uint64_t unchecked) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = waits_.find(id);
    if (it == waits_.end()) return false;
    return std::any_of(it->second.begin(), it->second.end(),
                       [&](const Wait& w) { return w.unchecked == unchecked; });
  }

  /// The wait for `id` with the token `unchecked` checked: its job was read, not final.
  void mark_checked(const std::string& id, std::uint64_t unchecked) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = waits_.find(id);
    if (it == waits_.end()) return;
    for (Wait& w : it->second)
      if (w.unchecked == unchecked) w.unchecked = 0;
  }

  /// True when nobody waits at all (no lock: a hint for the hot path).
  bool empty() const { return count_.load(std::memory_order_relaxed) == 0; }

  /// True when somebody waits for `id`.
  bool waiting(const std::string& id) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return waits_.count(id) > 0;
  }

  /// The ids waited for now.
  std::vector<std::string> ids() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    out.reserve(waits_.size());
    for (const auto& entry : waits_)
      out.push_back(entry.first);
    return out;
  }

  /// Refuses new waits and completes every one registered with errc::shutting_down.
  void close() {
    std::unordered_map<std::string, std::vector<Wait>> all;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
      all.swap(waits_);
      bounded_ = 0;
      count_.store(0, std::memory_order_relaxed);
    }
    for (auto& entry : all)
      complete_all(entry.second, errc::shutting_down, JobRecord{});
  }

 private:
  struct Wait {
    Completion<JobRecord> done;
    bool bounded = false;
    std::uint64_t unchecked = 0;  // its token until its job was looked at (0: checked)
  };

  std::vector<Wait> take(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = waits_.find(id);
    if (it == waits_.end()) return {};
    std::vector<Wait> out = std::move(it->second);
    waits_.erase(it);
    for (const Wait& w : out)
      bounded_ -= w.bounded ? 1 : 0;
    count_.store(count_.load(std::memory_order_relaxed) - out.size(), std::memory_order_relaxed);
    return out;
  }

  static void complete_all(std::vector<Wait>& waits, boost::system::error_code ec,
                           const JobRecord& record) {
    for (Wait& w : waits)
      w.done(ec, record);
  }

  const std::size_t max_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::vector<Wait>> waits_;
  std::size_t bounded_ = 0;
  std::uint64_t last_token_ = 0;
  std::atomic<std::size_t> count_{0};  // written under the lock
  bool closed_ = false;
};

/// Answers every callback attempt with an error: the transport of a queue built without one,
/// which refuses callback jobs; it can still meet one in a store shared with other servers.
class NoTransport final : public CallbackTransport {
 public:
  void send(CallbackRequest, std::function<void(CallbackResponse)> on_done) override {
    CallbackResponse response;
    response.error = TransportError::cancelled;
    response.message = "this JobQueue has no callback transport";
    on_done(std::move(response));
  }
};

// A name for this server that no other server on the same store shares.
inline std::string default_server_id() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::random_device random;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "%08x", random());
  return std::string(host[0] ? host : "rebound") + "-" + std::to_string(::getpid()) + "-" + suffix;
}

/// The parts, in the order they are built: each is handed those above it, and the Pipeline itself
/// as the PipelineEvents through which they reach back up (which runs only once the Pipeline is
/// built: no part calls back during construction). Shared with the work in flight (deliveries,
/// watchdogs, writes being retried), which keeps it alive through keep_alive().
struct Pipeline final : PipelineEvents, std::enable_shared_from_this<Pipeline> {
  /// `gate`: in front of the transport, owned by the sender (null without one); `attempt_timeout`:
  /// the callback attempts' timeout; `prefetch`: the StorePump's (0: none).
  Pipeline(ModelRepository models_in, std::unique_ptr<JobStore> store_in,
           std::unique_ptr<CallbackSender> sender_in, bool has_transport, OriginGate* gate_in,
           std::chrono::milliseconds attempt_timeout, std::size_t prefetch, AddressGuard guard_in,
           JobQueueOptions& options)
      : models(std::move(models_in), options.logger, options.clock),
        default_ref(models.runs_every_job() ? models.first_versions().front().first : ModelRef{}),
        default_model(models.runs_every_job() ? models.first_versions().front().second.lock().get()
                                              : nullptr),
        job_store(std::move(store_in)),
        sender(std::move(sender_in)),
        gate(gate_in),
        delivers_callbacks(has_transport),
        guard(std::move(guard_in)),
        clock(options.clock),
        store(*job_store, observe, sender->get_executor(), options.store_retry_interval),
        readiness(models, options.logger,
                  [this] { pump.wake(clock()); }),  // jobs left in the store: claimed now
        admission(options.queue_capacity, readiness, *this,
                  options.tenant_share >= 1.0
                      ? std::numeric_limits<std::size_t>::max()
                      : std::max<std::size_t>(1, static_cast<std::size_t>(
                                                     options.tenant_share *
                                                     static_cast<double>(options.queue_capacity))),
                  options.max_work_bytes),
        leases(options.server_id.empty() ? default_server_id() : options.server_id, options.lease,
               clock),
        delivery(*sender, store, leases, admission, observe, clock, *this, gate, attempt_timeout,
                 options.callback_max_deferral),
        pump(store, admission, leases, delivery, observe, clock, *this, options.poll_interval,
             delivers_callbacks, prefetch),
        runner(models, store, leases, delivery, admission, observe, clock, *this,
               sender->get_executor(), options.job_ttl, options.inference_timeout),
        async_waiters(options.max_waiting),
        rates(options.tenant_defaults, options.tenants),
        poll_interval(options.poll_interval),
        trace_submissions(options.trace_submissions),
        reads_on_pump(static_cast<const JobReadStore&>(*job_store).reads_wait()) {
    observe.log = LogObserver(options.logger);
    logger = options.logger;
    observe.user = std::move(options.observers);
  }

  // PipelineEvents: what the parts tell the Pipeline.
  std::shared_ptr<const void> keep_alive() const override {
    auto keep = weak_from_this().lock();
    assert(keep);
    return keep;
  }
  void slot_freed() override {
    // Work may be waiting in the store for a free slot: look now.
    if (!store.stopped()) pump.wake(clock());
  }
  void wake_pump(std::chrono::system_clock::time_point at) override { pump.wake_for_retry(at); }
  void lease_lost(const std::string& key, const std::string& holder) override {
    runner.revoke(key, holder, true);
  }
  void sweep(WorkQueue<WorkItem>& queue) override { runner.sweep(queue); }
  void pump_polled() override {
    models.settle_drains();  // versions being unloaded whose last jobs ran
    models.sync_fleet();     // what the other servers of a shared store changed, and ours
    // Followed twice a second, however long the poll interval: the next pass is due by then.
    if (models.follows_fleet()) pump.wake(clock() + std::chrono::milliseconds(500));
    complete_finals(Reads::none);  // (the reads asked of the pump: at its wake-ups for them)
    poll_async_waits();
    sync_pauses();
  }
  bool awaited(const std::string& key) const override {
    return !async_waiters.empty() && async_waiters.waiting(key);
  }
  void job_final(const std::string& key, const JobRecord& record) override {
    // Called where the store's acknowledgement was heard (the io executor with a store that
    // answers from its own thread, else the worker), which never waits for a store: a job
    // someone waits for (a store that answered no record, or a wait that began while the
    // acknowledgement was under way) is read back on the pump's thread (complete_finals), woken
    // for it now.
    if (async_waiters.empty()) return;
    if (!async_waiters.waiting(key)) return;
    {
      std::lock_guard<std::mutex> lock(finals_mutex);
      finals.insert_or_assign(key, record);
    }
    pump.wake_for_finals();
  }
  void job_answered(const std::string& key, JobRecord stored) override {
    if (async_waiters.empty()) return;  // (a store that answered a record nobody asked for)
    // The store's record completes the waits, on the pump's thread too: there the completions
    // of many jobs go out together (one wake-up of the executors they post to), not one a job
    // from each worker (15 % of async_submit's rate: docs/benchmarks.md). They wait behind what
    // the pump is doing (a pass, renewals: with a store that hangs, until its call times out).
    {
      std::lock_guard<std::mutex> lock(finals_mutex);
      answered_finals.insert_or_assign(key, std::move(stored));
    }
    pump.wake_for_finals();
  }
  void finals_due() override { complete_finals(); }

  /// How a read_on_pump ends: the job's record (nullopt: none such), or the error that kept it
  /// from being read (store_unavailable; shutting_down once the pump has stopped).
  using ReadDone =
      std::function<void(boost::system::error_code ec, const std::optional<JobRecord>& record)>;
  struct PumpRead {
    std::string id;
    ReadDone done;
    std::uint64_t wait = 0;  // a wait's first look: its token
  };

  /// Reads the job `id` on the pump's thread, for a caller that must not wait for a store whose
  /// reads wait (JobReadStore::reads_wait): an async_wait's first look (`wait`: its token, see
  /// AsyncWaiters::add), a submission refused for room looked up. The reads asked for meanwhile
  /// go together, each id read once (get_many, max_reads_a_call a call, max_reads_a_turn before
  /// the pump's renewals get their turn); a first look whose wait was answered meanwhile is not
  /// made. They wait behind what the pump is doing (a pass, renewals). `done` runs on the pump's
  /// thread (or a shutdown's): it must be quick and must not call the store. Once the pump has
  /// stopped (end_pump_reads), `done` is answered shutting_down at once.
  void read_on_pump(std::string id, ReadDone done, std::uint64_t wait = 0) {
    bool ended = false;
    {
      std::lock_guard<std::mutex> lock(finals_mutex);
      ended = pump_reads_ended;
      if (!ended) pump_reads.push_back({std::move(id), std::move(done), wait});
    }
    if (ended) return done(errc::shutting_down, std::nullopt);
    pump.wake_for_finals();
  }

  /// A place for a read asked of the pump for a caller that is refused without it (a submission
  /// refused for room, an async_wait past max_waiting), holding `bytes` (the job kept to compare
  /// with the stored one) until end_look_up. False past max_look_ups or max_look_up_bytes (a
  /// caller that submits in a loop to a full queue while the store is slow): the refusal is then
  /// answered as it is, so that look-ups cannot pile up in memory.
  bool take_look_up(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(finals_mutex);
    if (look_ups >= max_look_ups || bytes > max_look_up_bytes - look_up_bytes) return false;
    ++look_ups;
    look_up_bytes += bytes;
    return true;
  }
  void end_look_up(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(finals_mutex);
    --look_ups;
    look_up_bytes -= bytes;
  }
  static constexpr std::size_t max_look_ups = 4096;
  static constexpr std::size_t max_look_up_bytes = std::size_t{64} << 20;

  /// After the pump has stopped: the reads still asked for are answered shutting_down, and so is
  /// every later one.
  void end_pump_reads() {
    std::deque<PumpRead> left;
    {
      std::lock_guard<std::mutex> lock(finals_mutex);
      pump_reads_ended = true;
      left.swap(pump_reads);
    }
    for (PumpRead& r : left)
      answer_read(r.done, errc::shutting_down, std::nullopt);
  }

  /// A read's answer given after finals_reading is released (a look-up's: it runs the
  /// submission's handler and the observers).
  struct ReadAnswer {
    ReadDone done;
    boost::system::error_code ec;
    std::shared_ptr<const std::optional<JobRecord>> record;
  };

  /// The reads asked for by read_on_pump, made now (in complete_finals, under finals_reading):
  /// at most max_reads_a_turn (the rest at the pump's next turn, woken for them), or, with `all`
  /// (a shutdown's, before it closes the waits), every one. A first look is answered here; a
  /// look-up's answer is added to `later`. A store failing (said by the queue's calls, or by its
  /// failure()) fails the reads without another call; when one batch fails on a record the
  /// store cannot read, its ids are read one at a time, for at most a second.
  void run_pump_reads(bool all, std::vector<ReadAnswer>& later) {
    for (;;) {
      std::vector<PumpRead> asked;
      bool more = false;
      {
        std::lock_guard<std::mutex> lock(finals_mutex);
        const std::size_t n = std::min(pump_reads.size(), max_reads_a_turn);
        asked.assign(std::make_move_iterator(pump_reads.begin()),
                     std::make_move_iterator(pump_reads.begin() + static_cast<std::ptrdiff_t>(n)));
        pump_reads.erase(pump_reads.begin(), pump_reads.begin() + static_cast<std::ptrdiff_t>(n));
        more = !pump_reads.empty();
      }
      if (asked.empty()) return;
      make_reads(asked, later);
      if (!more) return;
      if (!all) return pump.wake_for_finals();
    }
  }

  void make_reads(std::vector<PumpRead>& asked, std::vector<ReadAnswer>& later) {
    constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
    using Record = std::shared_ptr<const std::optional<JobRecord>>;
    std::vector<std::size_t> slot(asked.size(), none);  // each read's id among `keys`
    std::vector<std::string> keys;
    std::vector<Record> records;  // null: not read
    std::size_t given = 0;        // asked[0, given) answered
    auto give = [&](std::size_t i, boost::system::error_code ec, const Record& record) {
      static const Record nothing = std::make_shared<const std::optional<JobRecord>>();
      const Record& answer = record ? record : nothing;
      if (asked[i].wait) {
        answer_read(asked[i].done, ec, *answer);
      } else {
        later.push_back({std::move(asked[i].done), ec, answer});
      }
    };
    try {
      std::unordered_map<std::string_view, std::size_t> index;
      for (std::size_t i = 0; i < asked.size(); ++i) {
        // A first look whose wait was answered meanwhile (its job ended): nothing to read.
        if (asked[i].wait && !async_waiters.unchecked(asked[i].id, asked[i].wait)) continue;
        auto [it, added] = index.emplace(asked[i].id, keys.size());
        if (added) keys.push_back(asked[i].id);
        slot[i] = it->second;
      }
      records.resize(keys.size());
      bool failing = store.failing() && job_store->failure().has_value();
      for (std::size_t first = 0; first < keys.size() && !failing; first += max_reads_a_call) {
        const std::size_t end = std::min(keys.size(), first + max_reads_a_call);
        std::vector<std::string> batch(keys.begin() + static_cast<std::ptrdiff_t>(first),
                                       keys.begin() + static_cast<std::ptrdiff_t>(end));
        try {
          std::vector<std::optional<JobRecord>> read = read_many(batch);
          for (std::size_t k = 0; k < read.size(); ++k)
            records[first + k] =
                std::make_shared<const std::optional<JobRecord>>(std::move(read[k]));
          continue;
        } catch (...) {
        }
        try {
          failing = job_store->failure().has_value();
        } catch (...) {
          failing = true;
        }
        if (failing) break;  // down or hung: the rest fail without another call
        // The batch failed on a record the store cannot read: one at a time, so that it fails its
        // own read only; for at most a second (reads that time out fail the rest).
        const auto began = std::chrono::steady_clock::now();
        for (std::size_t k = first; k < end; ++k) {
          if (std::chrono::steady_clock::now() - began > std::chrono::seconds(1)) break;
          try {
            const std::string& id = keys[k];
            records[k] = std::make_shared<const std::optional<JobRecord>>(
                store.call("get", id, [&](const JobReadStore& s) { return s.get(id); }));
          } catch (...) {
          }
        }
      }
      for (; given < asked.size(); ++given) {
        if (slot[given] == none) continue;
        const Record& record = records[slot[given]];
        give(given, record ? boost::system::error_code() : errc::store_unavailable, record);
      }
    } catch (...) {
      // (Out of memory, say.) Every read not answered yet is answered now: a look-up left
      // unanswered would hold its submission for ever.
      for (; given < asked.size(); ++given) {
        try {
          give(given, errc::store_unavailable, nullptr);
        } catch (...) {
        }
      }
    }
  }

  static constexpr std::size_t max_reads_a_turn = 4 * 256;

  static void answer_read(const ReadDone& done, boost::system::error_code ec,
                          const std::optional<JobRecord>& record) {
    try {
      done(ec, record);
    } catch (...) {
      // (Ours never throw; the others' answers go on.)
    }
  }

  /// An async_wait registered without a look at its job (JobQueue::start_wait, with a store whose
  /// reads wait), its token `unchecked`: read on the pump, and answered from its record (every
  /// wait for the job, once it is final), not_found when there is none, store_unavailable when it
  /// could not be read; a job not final leaves it waiting for the job's end. The answer reaches
  /// this wait alone otherwise: a wait begun meanwhile (perhaps as the job was being stored) is
  /// answered by its own look.
  void check_wait(const std::string& id, std::uint64_t unchecked) {
    read_on_pump(
        id,
        [this, id, unchecked](boost::system::error_code ec,
                              const std::optional<JobRecord>& record) {
          if (ec) return async_waiters.fail_one(id, unchecked, ec);
          if (!record) return async_waiters.fail_one(id, unchecked, errc::not_found);
          if (is_final(record->status)) return async_waiters.complete(id, *record);
          async_waiters.mark_checked(id, unchecked);
        },
        unchecked);
  }

  /// The waits for jobs this queue finished, completed with the record as the store keeps it
  /// (input, started_at, callback state: the same answer a wait gets for a job another server
  /// finished): as its acknowledgement answered it, else read back, or the one in hand when the
  /// store cannot say. On the pump's thread, when woken
  /// for them and each pass; and by a shutdown before it closes the waits, which waits for the
  /// pump's reads under way (finals_reading) so that none of them is answered shutting_down.
  /// Read `max_reads_a_call` at a time (JobStore::get_many: one round trip each). Then, unless
  /// `reads` says none (a pass's: the pump's turns for them come with its wake-ups), the reads
  /// asked of the pump (run_pump_reads; `all` of them for a shutdown), the look-ups' answers
  /// given once the lock is released.
  enum class Reads { none, a_turn, all };
  void complete_finals(Reads reads = Reads::a_turn) {
    std::vector<ReadAnswer> later;
    complete_finals_and_reads(reads, later);
    for (ReadAnswer& answer : later)
      answer_read(answer.done, answer.ec, *answer.record);
  }

  void complete_finals_and_reads(Reads reads, std::vector<ReadAnswer>& later) {
    std::lock_guard<std::mutex> reading(finals_reading);
    std::unordered_map<std::string, JobRecord> mine, answered;
    {
      std::lock_guard<std::mutex> lock(finals_mutex);
      mine.swap(finals);
      answered.swap(answered_finals);
    }
    for (const auto& [key, record] : answered)
      async_waiters.complete(key, record);
    std::vector<std::string> keys;
    keys.reserve(std::min(mine.size(), max_reads_a_call));
    for (auto it = mine.begin(); it != mine.end();) {
      keys.clear();
      auto end = it;
      for (; end != mine.end() && keys.size() < max_reads_a_call; ++end)
        keys.push_back(end->first);
      std::vector<std::optional<JobRecord>> stored;
      try {
        stored = read_many(keys);
      } catch (const StoreUnavailable&) {
        stored.assign(keys.size(), std::nullopt);  // answered with the records in hand
      }
      for (std::size_t i = 0; it != end; ++it, ++i) {
        const bool kept = stored[i] && is_final(stored[i]->status);
        async_waiters.complete(it->first, kept ? *stored[i] : it->second);
      }
    }
    // Then the reads asked of the pump (a wait's first look among them): under the same lock,
    // so that a shutdown's close of the waits comes after the looks under way.
    if (reads != Reads::none) run_pump_reads(reads == Reads::all, later);
  }

  /// The store's records of `keys` (JobStore::get_many), one answer a key.
  /// A store of one's own that answers the wrong count fails the read (noted and logged as a
  /// failed store call).
  std::vector<std::optional<JobRecord>> read_many(const std::vector<std::string>& keys) {
    return store.call("get", keys.front(), [&](const JobReadStore& s) {
      auto out = s.get_many(keys);
      if (out.size() != keys.size()) {
        throw StoreUnavailable("the job store answered " + std::to_string(out.size()) +
                               " records for " + std::to_string(keys.size()) + " ids (get_many)");
      }
      return out;
    });
  }

  static constexpr std::size_t max_reads_a_call = 256;

  /// The models served, each in its versions (a JobQueue built on one Model: version "1" of its
  /// name), changed live (ServedModels).
  ModelTable models;
  /// A queue built on one Model (ModelTable::runs_every_job, which never changes): the version a
  /// job that names none runs on, and its Model, a submission's choice without a lookup (intake's
  /// choose_model). Null otherwise.
  const ModelRef default_ref;
  Model* const default_model;
  std::unique_ptr<JobStore> job_store;
  std::unique_ptr<CallbackSender> sender;
  OriginGate* const gate;  // in front of the transport, owned by the sender; null without one
  const bool delivers_callbacks;
  const AddressGuard guard;
  Clock clock;
  Logger logger;  // JobQueueOptions::logger, for what the front ends log (Operations::logger)
  Metrics metrics;
  Observers observe{metrics};
  StoreAccess store;
  ModelReadiness readiness;  // the model ready and warmed up (Model::warm_up)
  Admission admission;
  Leases leases;
  Delivery delivery;
  StorePump pump;
  /// The store's wake-ups of the pump (FleetStore::watch_work), from the queue's start to its
  /// end; declared after the pump, so it ends before the pump does even when the queue's
  /// construction fails.
  struct WorkWatch {
    JobStore* store = nullptr;
    std::uint64_t id = 0;
    void start(JobStore& s, std::function<void()> woken) {
      store = &s;
      id = s.watch_work(std::move(woken));
    }
    void end() {
      if (store) store->unwatch_work(std::exchange(id, 0));
    }
    ~WorkWatch() { end(); }
  } work_watch;
  BatchRunner runner;
  AsyncWaiters async_waiters;
  TenantRates rates;  // each tenant's submissions per second
  const std::chrono::milliseconds poll_interval;
  const bool trace_submissions;  // JobQueueOptions::trace_submissions
  /// A store whose reads may wait (JobReadStore::reads_wait: SQLite, PostgreSQL, Redis, most of
  /// one's own) is read on the pump's thread for the callers that must not wait (read_on_pump);
  /// the memory store where it is asked.
  const bool reads_on_pump;
  // On the pump's thread only, on `clock` as the pump's schedule is.
  std::chrono::system_clock::time_point last_wait_poll{};
  std::chrono::system_clock::time_point last_pause_sync{};
  std::size_t wait_poll_offset = 0;  // on the pump's thread only
  // Jobs finished here that someone waits for, to be read back (complete_finals): at most one a
  // waited job. finals_mutex guards both maps.
  std::mutex finals_mutex;
  std::unordered_map<std::string, JobRecord> finals;
  // Jobs finished here that someone waits for, with the record the store's acknowledgement
  // answered: completed by complete_finals without a read.
  std::unordered_map<std::string, JobRecord> answered_finals;
  std::mutex finals_reading;  // held while finals taken from the maps are read and completed
  // The reads asked for by read_on_pump, whether the pump has stopped making them, and the
  // look-ups among them (take_look_up): under finals_mutex.
  std::deque<PumpRead> pump_reads;
  bool pump_reads_ended = false;
  std::size_t look_ups = 0, look_up_bytes = 0;
  // The store's queue_stats as /metrics last counted them (Telemetry::recent_queue_stats), and when
  // (on `clock`) and what that count took: counted again once they are a second old (or 20
  // times what the count took, if longer), so that however many scrapers ask (Prometheus
  // replicas, a harness polling every 50 ms) a shared store counts its backlog at most once a
  // second for this server, and spends at most a twentieth of its time on it. A failed count is
  // not kept (none is shown until one works); one that failed after more than 50 ms (cut by a
  // statement timeout) holds off the next as a kept one would (metrics_stats_failed_at: when it
  // began). Whether a scrape is counting now: the scrapes meanwhile show the last count (if under
  // 10 s old, or twice the age it is kept, if longer) rather than wait or count too. Under
  // metrics_stats_mutex, which nobody holds while counting.
  std::mutex metrics_stats_mutex;
  std::optional<std::chrono::system_clock::time_point> metrics_stats_at;
  std::chrono::system_clock::duration metrics_stats_took{};  // what the last count took
  std::optional<std::chrono::system_clock::time_point> metrics_stats_failed_at;
  std::optional<QueueStats> metrics_stats;
  bool metrics_stats_counting = false;

  /// Completes the asynchronous waits for `id` from the store's record, if it is final (or gone).
  void complete_from_store(const std::string& id) {
    std::optional<JobRecord> record;
    try {
      record = store.call("get", id, [&](const JobReadStore& s) { return s.get(id); });
    } catch (const StoreUnavailable&) {
      return;  // asked again at the next poll
    }
    settle_wait(id, record);
  }

  /// The waits for `id`, from its record in the store: failed when it is gone, completed when it
  /// is final, left waiting otherwise.
  void settle_wait(const std::string& id, const std::optional<JobRecord>& record) {
    if (!record) {
      async_waiters.fail(id, errc::not_found);
    } else if (is_final(record->status)) {
      async_waiters.complete(id, *record);
    }
  }

  /// On the pump's thread, each time it looks for work: waits for jobs that this queue does not
  /// hold (another server's, or final before the wait began) are checked in the store.
  /// At most every half poll interval (the pump also wakes at once while it finds more work) and
  /// at most `max_wait_polls` jobs a pass, taken in turn and read in one call (get_many: one round
  /// trip), so that lease renewals on the same thread never wait long behind them.
  void poll_async_waits() {
    if (async_waiters.empty()) return;
    const auto now = clock();  // the pump's clock: a clock stepped back does not stop it
    if (now >= last_wait_poll && now - last_wait_poll < poll_interval / 2) return;
    last_wait_poll = now;
    const std::vector<std::string> ids = async_waiters.ids();
    const std::size_t n = std::min(ids.size(), max_wait_polls);
    std::vector<std::string> asked;
    asked.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::string& id = ids[(wait_poll_offset + i) % ids.size()];
      if (leases.job_holder_of(id)) continue;  // held here: its end completes the wait
      asked.push_back(id);
    }
    wait_poll_offset += n;
    if (asked.empty()) return;
    std::vector<std::optional<JobRecord>> records;
    try {
      records = read_many(asked);  // one round trip for them all
    } catch (const StoreUnavailable&) {
      // A store that says it is failing (down, hung): asked again at the next poll. Else the
      // batch failed on one record the store cannot read: one at a time, so that it holds up its
      // own wait only, not the others'.
      bool failing = true;
      try {
        failing = job_store->failure().has_value();
      } catch (...) {
      }
      if (!failing) {
        for (const std::string& id : asked)
          complete_from_store(id);
      }
      return;
    }
    for (std::size_t i = 0; i < asked.size(); ++i)
      settle_wait(asked[i], records[i]);
  }

  static constexpr std::size_t max_wait_polls = max_reads_a_call;

  /// Before the pump starts, then on its thread before each pass's claims, at most every second:
  /// the gate holds the origins a shared store keeps
  /// paused (JobStore::paused_origins), so that a pause or a resume made through any server of it
  /// holds on this one too. A store that shares none leaves the gate's own pauses alone.
  void sync_pauses() {
    if (!gate) return;
    const auto now = clock();
    if (now >= last_pause_sync && now - last_pause_sync < std::chrono::seconds(1)) return;
    last_pause_sync = now;
    // The gate first: a pause or resume made here between the two reads is then redone, never
    // undone.
    const std::vector<std::string> held = gate->paused();  // sorted, as the store's answer
    std::optional<std::vector<std::string>> shared;
    try {
      const FleetStore& fleet = *job_store;
      shared = fleet.paused_origins();
    } catch (...) {
      return;  // the claims of the same pass see the store's trouble, and log it
    }
    if (!shared) return;
    // As the gate names them: what another writer left in another form, or not an origin at all,
    // would otherwise be paused and resumed at every pass.
    for (auto& origin : *shared)
      origin = OriginGate::origin_of(origin);
    shared->erase(std::remove(shared->begin(), shared->end(), std::string()), shared->end());
    std::sort(shared->begin(), shared->end());
    shared->erase(std::unique(shared->begin(), shared->end()), shared->end());
    std::vector<std::string> to_pause, to_resume;
    std::set_difference(shared->begin(), shared->end(), held.begin(), held.end(),
                        std::back_inserter(to_pause));
    std::set_difference(held.begin(), held.end(), shared->begin(), shared->end(),
                        std::back_inserter(to_resume));
    for (const auto& origin : to_pause) {
      try {
        gate->pause(origin);
      } catch (...) {
        continue;  // not an origin this gate can hold (written by something else)
      }
      observe([&](auto& o) { o.on_origin_paused(origin, true); });
    }
    for (const auto& origin : to_resume) {
      if (gate->resume(origin)) observe([&](auto& o) { o.on_origin_paused(origin, false); });
    }
  }

  // With trace_submissions: the job (checked already) gets the trace its submission's span
  // starts: a child of its traceparent when it has one, else a new trace; the job is stored with
  // a traceparent that names that span. What on_submission_traced will tell, once accepted.
  std::optional<SubmissionTrace> begin_trace(Job& job) const {
    if (!trace_submissions) return std::nullopt;
    SubmissionTrace trace;
    trace.job_id = key_of(job);
    trace.model = job.model;
    trace.started = clock();
    if (is_valid_traceparent(job.traceparent)) {
      trace.parent_span_id = job.traceparent.substr(36, 16);
      job.traceparent = child_traceparent(job.traceparent);
    } else {
      job.traceparent = new_traceparent();
    }
    trace.traceparent = job.traceparent;
    return trace;
  }

  // Tells the observers how a submission (or, without an id, an invocation) was answered: a new
  // job accepted, or a refusal (a duplicate is neither); called outside every lock.
  void observe_submission(const Submitted& s, const std::string& id, bool has_callback,
                          std::optional<SubmissionTrace>* trace = nullptr) {
    if (s.error) {
      const errc why = static_cast<errc>(s.error.value());
      observe([why](auto& o) { o.on_refused(why); });
    } else if (!s.duplicate && !id.empty()) {
      observe([&](auto& o) { o.on_accepted(id, has_callback); });
      if (trace && *trace) {
        (*trace)->accepted = clock();
        observe([&](auto& o) { o.on_submission_traced(**trace); });
      }
    }
  }
};

}  // namespace rebound::detail
