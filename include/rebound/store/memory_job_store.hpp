// MemoryJobStore: a JobStore in process memory, bounded in bytes and in finished jobs kept.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rebound/detail/json.hpp"
#include "rebound/detail/servers_seen.hpp"
#include "rebound/error.hpp"
#include "rebound/store/job_state.hpp"
#include "rebound/store/job_store.hpp"

namespace rebound {

struct MemoryJobStoreOptions {
  /// Finished jobs (final, and their callback delivered, given up or not wanted) kept for polling,
  /// at most; beyond it the oldest finished ones are forgotten (polling them answers 404).
  std::size_t max_finished = 100000;
  /// The store's budget in bytes: its estimate of the heap its jobs hold (ids, URLs, inputs,
  /// results, errors and the bookkeeping around them). Beyond it, finished jobs are forgotten,
  /// oldest first; when unfinished jobs alone fill it, `put` answers `PutOutcome::full` (a
  /// submission then gets 503 `queue_full`). Default 1 GiB.
  std::size_t max_bytes = std::size_t{1} << 30;
};

/// A JobStore that keeps everything in memory: fast, and lost when the process ends.
///
/// Memory stays bounded twice over: in bytes (`max_bytes`, so 1,000 jobs of 1 MiB cannot take
/// gigabytes) and in finished jobs kept (`max_finished`). Finished jobs are forgotten oldest
/// first to stay within both; unfinished jobs are never dropped, and a `put` that would take the
/// store over its byte budget with them is refused instead.
///
/// Thread-safety: all methods are thread-safe (one mutex; no user code runs under it).
class MemoryJobStore final : public JobStore {
 public:
  explicit MemoryJobStore(MemoryJobStoreOptions options = {}) : options_(options) {
    if (options_.max_finished == 0) throw Error("MemoryJobStore: max_finished must be at least 1");
    if (options_.max_bytes == 0) throw Error("MemoryJobStore: max_bytes must be at least 1");
  }
  /// A store that keeps at most `max_finished` finished jobs, within the default byte budget.
  explicit MemoryJobStore(std::size_t max_finished)
      : MemoryJobStore(MemoryJobStoreOptions{max_finished}) {}

  using JobStore::put;
  PutOutcome put(const Job& job, const std::optional<Lease>& claim) override {
    // Measured outside the lock: the input may be large.
    const std::size_t input_bytes = detail::json_footprint(job.input);
    std::string key = rebound::key_of(job);
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = jobs_.find(key); it != jobs_.end()) {
      return job_state::put_again(it->second.stored, job);
    }
    Entry entry;
    entry.stored = job_state::created(job, claim);
    entry.input_bytes = input_bytes;
    entry.bytes = footprint(entry);
    // Refused before anything is evicted when forgetting every finished job would not make room:
    // a stream of refused submissions must not wipe the results and dead letters kept.
    if (bytes_ - finished_bytes_ + entry.bytes > options_.max_bytes) return PutOutcome::full;
    evict_finished_until(options_.max_bytes - std::min(options_.max_bytes, entry.bytes));
    if (bytes_ + entry.bytes > options_.max_bytes) return PutOutcome::full;
    bytes_ += entry.bytes;
    entry.tenant = &*tenant_names_.insert(job.tenant).first;
    auto it = jobs_.emplace(std::move(key), std::move(entry)).first;
    queued_set(it->second.stored.record.job).insert(queued_key(it));
    schedule(job_queue_, it, *job_state::job_due(it->second.stored));
    return PutOutcome::created;
  }

  std::optional<JobRecord> get(const std::string& id) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return std::nullopt;
    return it->second.stored.record;
  }

  /// Its reads take no time: made where they are asked.
  bool reads_wait() const noexcept override { return false; }

  /// One lock for all of them.
  std::vector<std::optional<JobRecord>> get_many(
      const std::vector<std::string>& ids) const override {
    std::vector<std::optional<JobRecord>> out;
    out.reserve(ids.size());
    std::lock_guard<std::mutex> lock(mutex_);
    for (const std::string& id : ids) {
      auto it = jobs_.find(id);
      out.push_back(it == jobs_.end() ? std::nullopt
                                      : std::optional<JobRecord>(it->second.stored.record));
    }
    return out;
  }

  std::vector<JobRecord> claim_jobs(std::size_t max, const Lease& lease, TimePoint now) override {
    return claim(job_queue_, max, lease, now);
  }

  std::vector<JobRecord> claim_jobs_except(std::size_t max, const Lease& lease, TimePoint now,
                                           const std::vector<ModelRef>& skip) override {
    return claim(job_queue_, max, lease, now, skip.empty() ? nullptr : &skip);
  }

  bool renew(const std::string& id, const Lease& lease, TimePoint now) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return renew_locked(id, lease, now);
  }

  /// Takes the store's lock once per 256 leases (a JobQueue renews everything it holds, every
  /// third of a lease), so that other callers get it in between.
  std::vector<bool> renew_all(const std::vector<std::pair<std::string, Lease>>& leases,
                              TimePoint now) override {
    std::vector<bool> out;
    out.reserve(leases.size());
    std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
    for (std::size_t i = 0; i < leases.size(); ++i) {
      if (i % 256 == 0) {
        if (lock.owns_lock()) {
          lock.unlock();
          std::this_thread::yield();  // (a mutex is not fair: let a waiting caller in)
        }
        lock.lock();
      }
      out.push_back(renew_locked(leases[i].first, leases[i].second, now));
    }
    return out;
  }

  void mark_running(const std::string& id, TimePoint now) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it != jobs_.end() && job_state::mark_running(it->second.stored, now)) {
      queued_set(it->second.stored.record.job).erase(queued_key(it));
    }
  }

  /// The queued jobs of lower priority numbers are counted per priority; those of its own
  /// priority one by one up to it (linear in them only).
  std::optional<std::size_t> queue_position(const std::string& id) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end() || it->second.stored.record.status != JobStatus::queued)
      return std::nullopt;
    const int priority = priority_index(it->second.stored.record.job);
    std::size_t ahead = 0;
    for (int p = 0; p < priority; ++p)
      ahead += queued_[static_cast<std::size_t>(p)].size();
    const auto& same = queued_[static_cast<std::size_t>(priority)];
    return ahead + static_cast<std::size_t>(std::distance(same.begin(), same.find(queued_key(it))));
  }

  std::optional<QueueStats> queue_stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    QueueStats stats;
    for (int p = 0; p <= lowest_priority; ++p) {
      const Queued& queued = queued_[static_cast<std::size_t>(p)];
      if (queued.empty()) continue;
      stats.queued += queued.size();
      stats.queued_by_priority.emplace_back(p, queued.size());
      if (!stats.oldest_queued || queued.begin()->first < *stats.oldest_queued)
        stats.oldest_queued = queued.begin()->first;
    }
    // Every job not final is in job_queue_, waiting or running.
    stats.running = job_queue_.size() - std::min(job_queue_.size(), stats.queued);
    stats.callbacks_waiting = callback_queue_.size();
    stats.callbacks_failed = failed_callbacks_;
    return stats;
  }

  bool finish_job(const std::string& id, const std::string& holder, const JobOutcome& outcome,
                  const std::optional<Lease>& deliver, TimePoint now) override {
    return finish(id, holder, outcome, deliver, now, nullptr);
  }

  /// Answers on the caller's thread, with the record as finished when asked (a copy of its
  /// input and result).
  void async_finish_job(const std::string& id, const std::string& holder, const JobOutcome& outcome,
                        const std::optional<Lease>& deliver, TimePoint now, bool want_record,
                        FinishDone done) override {
    answer_now(done, [&] {
      FinishAnswer answer;
      answer.held =
          finish(id, holder, outcome, deliver, now, want_record ? &answer.record : nullptr);
      return answer;
    });
  }

  CancelOutcome cancel(const std::string& id, const JobOutcome& outcome, TimePoint now) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return CancelOutcome::not_found;
    const Before before(it);
    const CancelOutcome out = job_state::cancel(it->second.stored, outcome, now);
    if (out != CancelOutcome::cancelled) return out;
    it->second.result_bytes = 0;
    refile(it, before);
    return out;
  }

  std::vector<JobRecord> claim_callbacks(std::size_t max, const Lease& lease,
                                         TimePoint now) override {
    return claim(callback_queue_, max, lease, now);
  }

  using JobStore::record_attempt;
  bool record_attempt(const std::string& id, const std::string& holder, const CallbackInfo& after,
                      TimePoint now, const std::optional<CallbackAttempt>& attempt) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return false;
    const Before before(it);
    if (!job_state::record_attempt(it->second.stored, holder, after, now, attempt)) return false;
    refile(it, before);  // recounts the entry's bytes, its attempt log with them
    return true;
  }

  RedeliverOutcome redeliver(const std::string& id, const Lease& claim, TimePoint now) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return RedeliverOutcome::not_found;
    const Before before(it);
    const RedeliverOutcome out = job_state::redeliver(it->second.stored, claim, now);
    if (out == RedeliverOutcome::redelivered) refile(it, before);
    return out;
  }

  void complete(const std::string& id, const JobOutcome& outcome) override {
    // (Measured outside the lock; kept only for a job that succeeded, as job_state::complete.)
    const std::size_t result_bytes =
        outcome.status == JobStatus::succeeded ? detail::json_footprint(outcome.result) : 0;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    const Before before(it);
    job_state::complete(it->second.stored, outcome);
    it->second.result_bytes = result_bytes;
    refile(it, before);
  }

  void update_callback(const std::string& id, const CallbackInfo& callback) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    const Before before(it);
    job_state::update_callback(it->second.stored, callback);
    refile(it, before);
  }

  std::vector<JobRecord> list_unfinished(std::size_t limit) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<JobRecord> out;
    for (const auto& [id, entry] : jobs_) {
      if (!job_state::is_finished(entry.stored.record)) out.push_back(entry.stored.record);
    }
    std::sort(out.begin(), out.end(), [](const JobRecord& a, const JobRecord& b) {
      return a.job.created_at < b.job.created_at;
    });
    if (out.size() > limit) out.resize(limit);
    return out;
  }

  std::vector<JobRecord> list_failed_callbacks(std::size_t limit) const override {
    return list_failed_callbacks_with_prefix({}, limit);
  }

  std::vector<JobRecord> list_failed_callbacks_with_prefix(const std::string& id_prefix,
                                                           std::size_t limit) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<JobRecord> out;
    for (const auto& [id, entry] : jobs_) {
      if (entry.stored.record.callback.state == CallbackState::failed &&
          id.compare(0, id_prefix.size(), id_prefix) == 0) {
        out.push_back(entry.stored.record);
      }
    }
    std::sort(out.begin(), out.end(), [](const JobRecord& a, const JobRecord& b) {
      return a.job.created_at > b.job.created_at;
    });
    if (out.size() > limit) out.resize(limit);
    return out;
  }

  /// Reads the page from the dead letters' index: a prefix that names a tenant ("acme/...") reads
  /// that tenant's alone, so its cost does not depend on other tenants' dead letters (nor on the
  /// jobs that are not dead letters). Entries without input or result.
  JobPage failed_callbacks_page(const std::string& id_prefix,
                                const std::optional<ListCursor>& after,
                                std::size_t limit) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    JobPage page;
    if (limit == 0) return page;
    const FailedIndex* index = &failed_all_;
    if (const auto slash = id_prefix.find('/'); slash != std::string::npos) {
      const auto own = failed_of_.find(std::string_view(id_prefix).substr(0, slash));
      if (own == failed_of_.end()) return page;
      index = &own->second;
    }
    // Newest first: backwards from the end, or from the cursor (exclusive).
    auto at = after ? index->lower_bound(FailedKey{after->created_at, after->id}) : index->end();
    const FailedKey* last = nullptr;
    while (at != index->begin()) {
      --at;
      if (at->second.compare(0, id_prefix.size(), id_prefix) != 0) continue;
      if (page.jobs.size() == limit) {
        page.next = ListCursor{last->first, last->second};
        break;
      }
      page.jobs.push_back(listed(jobs_.at(at->second).stored.record));
      last = &*at;
    }
    return page;
  }

  /// Scans every job for the page (in memory, no index), copying only the page's entries.
  JobPage list_jobs(const JobFilter& filter, const std::optional<ListCursor>& after,
                    std::size_t limit) const override {
    using Key = std::pair<TimePoint, const std::string*>;
    auto newer = [](const Key& a, const Key& b) {
      return a.first != b.first ? a.first > b.first : *a.second > *b.second;
    };
    std::lock_guard<std::mutex> lock(mutex_);
    JobPage page;
    if (limit == 0) return page;
    std::vector<Key> keys;
    for (const auto& [id, entry] : jobs_) {
      if (!filter.matches(entry.stored.record, id)) continue;
      // To the millisecond, as cursors and the other stores keep it.
      const Key key{
          std::chrono::floor<std::chrono::milliseconds>(entry.stored.record.job.created_at), &id};
      if (after && !newer(Key{after->created_at, &after->id}, key)) continue;
      keys.push_back(key);
    }
    const std::size_t take = std::min(keys.size(), limit);
    std::partial_sort(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(take), keys.end(),
                      newer);
    page.jobs.reserve(take);
    for (std::size_t i = 0; i < take; ++i)
      page.jobs.push_back(listed(jobs_.at(*keys[i].second).stored.record));
    if (keys.size() > limit) page.next = ListCursor{keys[take - 1].first, *keys[take - 1].second};
    return page;
  }

  void report_server(const std::string& id, std::size_t leases, TimePoint now) override {
    std::lock_guard<std::mutex> lock(mutex_);
    seen_.note(id, leases, now);
  }

  std::vector<ServerSeen> servers(TimePoint now) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return seen_.list(now);
  }

  /// Shared by the JobQueues built on this store (as a fleet's store shares them).
  std::optional<std::uint64_t> put_model_config(const std::string& name, const std::string& config,
                                                std::uint64_t if_generation) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ModelConfig& held = model_configs_[name];
    if (held.generation != if_generation) return std::nullopt;
    held.name = name;
    held.config = config;
    held.generation = if_generation + 1;
    return held.generation;
  }

  std::optional<std::vector<ModelConfig>> model_configs() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<ModelConfig> out;
    for (const auto& [name, held] : model_configs_)
      if (held.generation > 0) out.push_back(held);
    return out;
  }

  /// Looks at no more than 5,000 entries filed by `since` a call, each tenant's by priority; a
  /// call cut short leaves the next one to start at the tenant after the one where it stopped.
  std::vector<ModelRef> waiting_versions(const std::vector<ModelRef>& versions,
                                         TimePoint since) const override {
    std::vector<ModelRef> out;
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t looked = 0;
    const std::string from = std::move(waiting_from_);
    waiting_from_.clear();
    // The tenants' ranges from `range` to `end`; false when cut short.
    const auto walk = [&](Queue::const_iterator range, Queue::const_iterator end) {
      while (range != end && out.size() < versions.size()) {
        const std::string* tenant = range->tenant;
        for (int p = highest_priority; p <= lowest_priority; ++p) {
          for (auto q = job_queue_.lower_bound(QueueKey{tenant, p, TimePoint::min(), nullptr});
               q != job_queue_.end() && q->tenant == tenant && q->priority == p && q->at <= since;
               ++q) {
            if (++looked > 5000) {
              waiting_from_ = *tenant + '\0';  // (the next tenant's name sorts at or after it)
              return false;
            }
            const StoredJob& s = jobs_.find(*q->id)->second.stored;
            if (s.job_lease && s.job_lease->until > since) continue;  // (claimed since)
            const ModelRef& model = s.record.job.model;
            if (std::find(versions.begin(), versions.end(), model) != versions.end() &&
                std::find(out.begin(), out.end(), model) == out.end()) {
              out.push_back(model);
            }
          }
        }
        range = job_queue_.lower_bound(
            QueueKey{tenant, lowest_priority + 1, TimePoint::min(), nullptr});
      }
      return true;
    };
    const auto start = job_queue_.lower_bound(
        QueueKey{&from, std::numeric_limits<int>::min(), TimePoint::min(), nullptr});
    if (walk(start, job_queue_.end())) walk(job_queue_.begin(), start);
    return out;
  }

  /// Jobs held now, finished or not.
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return jobs_.size();
  }

  /// The bytes the store counts against `max_bytes` now.
  std::size_t bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_;
  }

 private:
  // Keyed by (tenant, priority, due time, id): the strings are those of the entry in jobs_ (its
  // key, its job's tenant), which stay where they are (node-based), so the queues hold pointers
  // rather than copies. Jobs: each tenant's range by priority, then time (a claim takes turns
  // across the ranges); callbacks: all under one tenant and priority 0, by time. A null id sorts
  // first (a bound for lower_bound).
  struct QueueKey {
    const std::string* tenant;  // interned (tenant_names_): one string a tenant
    int priority;
    TimePoint at;
    const std::string* id;
  };
  struct QueueOrder {
    bool operator()(const QueueKey& a, const QueueKey& b) const {
      if (a.tenant != b.tenant) {
        if (const int c = a.tenant->compare(*b.tenant); c != 0) return c < 0;
      }
      if (a.priority != b.priority) return a.priority < b.priority;
      if (a.at != b.at) return a.at < b.at;
      if (!a.id || !b.id) return !a.id && b.id;
      return *a.id < *b.id;
    }
  };
  using Queue = std::set<QueueKey, QueueOrder>;
  // The queued jobs of one priority, by (created_at, id): for queue_position.
  using QueuedKey = std::pair<TimePoint, const std::string*>;
  struct QueuedOrder {
    bool operator()(const QueuedKey& a, const QueuedKey& b) const {
      return a.first != b.first ? a.first < b.first : *a.second < *b.second;
    }
  };
  using Queued = std::set<QueuedKey, QueuedOrder>;
  // An entry's time in a queue when it is in none (no job or lease ends at the clock's minimum).
  static constexpr TimePoint unfiled = TimePoint::min();
  // An entry and its key make one node of jobs_, 640 bytes, one size class of the allocator (a
  // node of 648 bytes takes 768: 100,000 finished jobs kept, 12 MiB more). The fields are packed
  // to stay within it: bit-fields, no optional times, no cached hash (IdHash).
  static constexpr std::uint64_t sequence_bits = (std::uint64_t{1} << 62) - 1;
  struct Entry {
    StoredJob stored;  // the record and its leases, as the state rules (job_state.hpp) keep them
    std::size_t input_bytes = 0;
    std::size_t result_bytes = 0;
    std::size_t bytes = 0;  // what this entry counts in bytes_
    // Its latest note in finished_order_, 0: none (62 bits: a sequence that never runs out).
    std::uint64_t finished_as : 62;
    std::uint64_t finished : 1;         // counted in finished_bytes_
    std::uint64_t failed_callback : 1;  // counted in failed_callbacks_
    // The queues: a job waiting or running is in job_queue_, a pending callback in
    // callback_queue_, each under the time it is claimable from (job_state::job_due and
    // callback_due; a renewal leaves it filed under the earlier time, see extend); `unfiled`
    // when it is not in that queue.
    TimePoint job_key = unfiled, callback_key = unfiled;
    // Its job's tenant, interned (tenant_names_), as its job queue key holds it: keys of one
    // tenant compare their tenants by address.
    const std::string* tenant = nullptr;

    Entry() : finished_as(0), finished(0), failed_callback(0) {}
  };
  // std::hash<std::string> makes the map keep each key's hash in its node (8 bytes); a hash of
  // its own does not (the library computes it again when it walks a bucket: a few ids' worth).
  struct IdHash {
    std::size_t operator()(const std::string& id) const noexcept {
      return std::hash<std::string_view>{}(id);
    }
  };
  using Map = std::unordered_map<std::string, Entry, IdHash>;
  // Checked in rebound's own test build (a program of one's own may use other library modes).
#if defined(REBOUND_CHECK_LAYOUT) && defined(__GLIBCXX__) && defined(__x86_64__) && \
    !defined(_GLIBCXX_DEBUG)
  static_assert(sizeof(void*) + sizeof(Map::value_type) <= 640,
                "a node of jobs_ outgrew its allocator size class (see Entry)");
#endif
  // The dead letters (callback `failed`) by creation, to the millisecond, then key: ascending, so
  // a page walks it backwards.
  using FailedKey = std::pair<TimePoint, std::string>;
  using FailedIndex = std::set<FailedKey>;

  // finish_job, copying the record as finished into `record` when given.
  bool finish(const std::string& id, const std::string& holder, const JobOutcome& outcome,
              const std::optional<Lease>& deliver, TimePoint now,
              std::optional<JobRecord>* record) {
    // (Measured outside the lock; kept only for a job that succeeded, as job_state::complete.)
    const std::size_t result_bytes =
        outcome.status == JobStatus::succeeded ? detail::json_footprint(outcome.result) : 0;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return false;
    const Before before(it);
    if (!job_state::finish(it->second.stored, holder, outcome, deliver, now)) return false;
    it->second.result_bytes = result_bytes;
    if (record) *record = it->second.stored.record;
    refile(it, before);
    return true;
  }

  // A listing's entry: the record without input or result.
  static JobRecord listed(const JobRecord& full) {
    JobRecord entry;
    entry.job.id = full.job.id;
    entry.job.tenant = full.job.tenant;
    entry.job.callback_url = full.job.callback_url;
    entry.job.created_at = full.job.created_at;
    entry.job.priority = full.job.priority;
    entry.job.max_queue = full.job.max_queue;
    entry.job.webhook_events = full.job.webhook_events;
    entry.job.traceparent = full.job.traceparent;
    entry.job.model = full.job.model;
    entry.status = full.status;
    entry.started_at = full.started_at;
    entry.outcome.error = full.outcome.error;
    entry.outcome.finished_at = full.outcome.finished_at;
    entry.callback = full.callback;
    return entry;
  }

  // Called under mutex_: files the entry among the dead letters (everyone's, its tenant's), or
  // takes it out.
  void index_failed(Map::const_iterator it, bool in) {
    const JobRecord& r = it->second.stored.record;
    FailedKey key{std::chrono::floor<std::chrono::milliseconds>(r.job.created_at), it->first};
    auto own = failed_of_.find(r.job.tenant);
    // (What may throw, allocating, comes before any change, or undoes it: a failure leaves the
    // index as it was, and the caller's flags with it.)
    if (in) {
      if (own == failed_of_.end()) own = failed_of_.emplace(r.job.tenant, FailedIndex{}).first;
      const auto placed = own->second.insert(key).first;
      try {
        failed_all_.insert(std::move(key));
      } catch (...) {
        own->second.erase(placed);
        if (own->second.empty()) failed_of_.erase(own);
        throw;
      }
      return;
    }
    if (own != failed_of_.end()) {
      own->second.erase(key);
      if (own->second.empty()) failed_of_.erase(own);
    }
    failed_all_.erase(key);
  }

  // Called under mutex_: (re)files the entry in `queue` under `at`.
  void schedule(Queue& queue, Map::iterator it, TimePoint at) {
    unschedule(queue, it);
    // (The clock's minimum means "in no queue": an entry due then is filed a tick later.)
    if (at == unfiled) at += TimePoint::duration{1};
    queue.insert(
        QueueKey{tenant_in(queue, it->second), priority_in(queue, it->second), at, &it->first});
    key_of(queue, it->second) = at;
  }

  void unschedule(Queue& queue, Map::iterator it) {
    TimePoint& key = key_of(queue, it->second);
    if (key != unfiled) {
      queue.erase(
          QueueKey{tenant_in(queue, it->second), priority_in(queue, it->second), key, &it->first});
    }
    key = unfiled;
  }

  const std::string* tenant_in(const Queue& queue, const Entry& e) const {
    static const std::string everyone;
    return &queue == &job_queue_ ? e.tenant : &everyone;
  }

  static int priority_index(const Job& job) {
    return std::clamp(job.priority, highest_priority, lowest_priority);
  }
  Queued& queued_set(const Job& job) {
    return queued_[static_cast<std::size_t>(priority_index(job))];
  }
  static QueuedKey queued_key(Map::const_iterator it) {
    return {it->second.stored.record.job.created_at, &it->first};
  }

  int priority_in(const Queue& queue, const Entry& e) const {
    return &queue == &job_queue_ ? priority_index(e.stored.record.job) : 0;
  }

  TimePoint& key_of(const Queue& queue, Entry& e) {
    return &queue == &job_queue_ ? e.job_key : e.callback_key;
  }

  // Called under mutex_.
  bool renew_locked(const std::string& id, const Lease& lease, TimePoint now) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return false;
    switch (job_state::renew(it->second.stored, lease, now)) {
      case job_state::Renewed::job:
        extend(job_queue_, it, lease.until);
        return true;
      case job_state::Renewed::callback:
        extend(callback_queue_, it, lease.until);
        return true;
      case job_state::Renewed::none:
        break;
    }
    return false;
  }

  // Called under mutex_, after a lease was made to end at `until`. A lease made longer leaves its
  // entry filed under the old end: the claim that finds it there still held files it again, under
  // the lease's end then. A renewal costs a lookup, not two tree operations: a server with 200,000
  // callbacks waiting for slow receivers renews them all every third of a lease, and while claims
  // run, an entry is filed again about once a lease instead of three times (while none run, a full
  // queue, the next claim does what has gathered, in slices). A lease made shorter (handed back)
  // is filed at once.
  void extend(Queue& queue, Map::iterator it, TimePoint until) {
    const TimePoint key = key_of(queue, it->second);
    if (key == unfiled || until < key) schedule(queue, it, until);
  }

  // Leases the entries of `queue` claimable at `now` (at most `max`) to `lease`, in the entry's
  // job or callback lease (`held`), and files them under the end of the lease. Each tenant's range
  // gives its claimable entries first first (priority, then time); the ranges take turns, one
  // entry each, from the tenant after the one that took the last entry of the claim before
  // (last_turn_), so that no tenant's priorities or numbers keep another's jobs waiting. An entry
  // found due whose lease was renewed since it was filed is filed again under the lease's end; a
  // long run of those is refiled a slice at a time, the lock let go in between, before any is
  // claimed.
  std::vector<JobRecord> claim(Queue& queue, std::size_t max, const Lease& lease, TimePoint now,
                               const std::vector<ModelRef>* skip = nullptr) {
    constexpr std::size_t refile_slice = 256;
    const bool callbacks = &queue == &callback_queue_;
    auto held = [&](const StoredJob& s) -> const std::optional<Lease>& {
      return callbacks ? s.callback_lease : s.job_lease;
    };
    std::vector<JobRecord> out;
    std::unique_lock<std::mutex> lock(mutex_);
    const int lowest = callbacks ? 0 : lowest_priority;
    for (;;) {
      std::size_t skipped = 0;  // jobs of versions skipped, looked past: at most 5,000 a walk
      // Each tenant's claimable entries, at most as many as the claim still takes.
      std::vector<std::vector<Map::iterator>> due;
      std::vector<std::string> tenants;
      std::vector<Map::iterator> renewed;
      const std::size_t wanted = max - out.size();
      for (auto range = queue.begin(); range != queue.end() && renewed.size() < refile_slice;) {
        const std::string* tenant = range->tenant;
        std::vector<Map::iterator> mine;
        for (int p = highest_priority; p <= lowest; ++p) {
          auto q = queue.lower_bound(QueueKey{tenant, p, TimePoint::min(), nullptr});
          std::string resume;  // (with versions to skip) its key in resume_
          bool resumed = false;
          if (skip) {
            resume = resume_key(*tenant, p, *skip);
            const auto r = resume_.find(resume);
            if (r != resume_.end() && r->second.at <= now && now >= r->second.since &&
                now - r->second.since < resume_lifetime) {
              q = queue.upper_bound(QueueKey{tenant, p, r->second.at, &r->second.id});
              resumed = true;
            }
          }
          bool stopped = false, found = false;
          std::optional<QueueKey> passed;  // the last skipped before the first found
          for (; q != queue.end() && q->tenant == tenant && q->priority == p && q->at <= now &&
                 mine.size() < wanted && renewed.size() < refile_slice;
               ++q) {
            Map::iterator it = jobs_.find(*q->id);
            const std::optional<Lease>& h = held(it->second.stored);
            if (h && h->until > now) {
              renewed.push_back(it);
            } else if (!skip || std::find(skip->begin(), skip->end(),
                                          it->second.stored.record.job.model) == skip->end()) {
              mine.push_back(it);
              found = true;
            } else {
              // A job of a version skipped stays where it is; past 5,000, the next claim
              // with these versions to skip goes on after the last one passed.
              if (!found) passed = *q;
              if (++skipped > 5000) {
                stopped = true;
                break;
              }
            }
          }
          if (skip) {
            const bool at_end = !stopped && (q == queue.end() || q->tenant != tenant ||
                                             q->priority != p || q->at > now);
            if (!found && at_end) {
              resume_.erase(resume);  // read to the end: the next claim from the start
            } else if (passed) {
              if (resume_.size() >= 16384) resume_.clear();  // (skip lists come and go)
              Resume& r = resume_[resume];
              if (!resumed) r.since = now;
              r.at = passed->at;
              r.id = *passed->id;
            }
          }
        }
        if (!mine.empty()) {
          due.push_back(std::move(mine));
          tenants.push_back(*tenant);
        }
        range = queue.lower_bound(QueueKey{tenant, lowest + 1, TimePoint::min(), nullptr});
      }
      for (Map::iterator it : renewed)
        schedule(queue, it, held(it->second.stored)->until);
      // A walk cut short by renewed entries saw only some tenants: the turns are dealt once a
      // walk saw them all (the refiled ones are not due again, so each walk gets further).
      if (renewed.size() >= refile_slice) {
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
        continue;
      }
      std::vector<std::size_t> claimable;
      for (const auto& mine : due)
        claimable.push_back(mine.size());
      const auto turns =
          job_state::claim_turns(tenants, claimable, callbacks ? std::nullopt : last_turn_);
      for (const auto& [t, position] : turns) {
        if (out.size() >= max) break;
        Map::iterator it = due[t][position];
        StoredJob& s = it->second.stored;
        if (callbacks ? job_state::claim_callback(s, lease, now)
                      : job_state::claim_job(s, lease, now)) {
          schedule(queue, it, lease.until);
          out.push_back(s.record);
          if (!callbacks) last_turn_ = tenants[t];
        } else if (const auto at = callbacks ? job_state::callback_due(s) : job_state::job_due(s)) {
          schedule(queue, it, *at);  // (filed early: never, while the indexes hold)
        } else {
          unschedule(queue, it);
        }
      }
      return out;
    }
  }

  // What an entry was before a transition, for refile.
  struct Before {
    explicit Before(Map::const_iterator it)
        : queued(it->second.stored.record.status == JobStatus::queued) {}
    bool queued;
  };

  // Called under mutex_ after a transition of the state rules: the entry is filed where its new
  // state says (a queued job that no longer is leaves its priority's set; a final one leaves the
  // job queue; a pending callback is filed under callback_due, any other leaves that queue), then
  // its bytes are counted again (changed).
  void refile(Map::iterator it, const Before& before) {
    const StoredJob& s = it->second.stored;
    if (before.queued && s.record.status != JobStatus::queued)
      queued_set(s.record.job).erase(queued_key(it));
    if (!job_state::job_due(s)) unschedule(job_queue_, it);
    if (const auto due = job_state::callback_due(s)) {
      schedule(callback_queue_, it, *due);
    } else {
      unschedule(callback_queue_, it);
    }
    changed(it);
  }

  static std::size_t footprint(const Entry& e) {
    constexpr std::size_t per_entry = sizeof(Map::value_type) + 4 * sizeof(void*) + 64;
    const JobRecord& r = e.stored.record;
    std::size_t strings = 2 * (r.job.id.size() + r.job.tenant.size()) + r.job.callback_url.size() +
                          r.callback.last_error.size() + r.job.traceparent.size() +
                          r.job.model.name.size() + r.job.model.version.size();
    if (r.outcome.error) strings += r.outcome.error->code.size() + r.outcome.error->message.size();
    strings += r.attempt_log.capacity() * sizeof(CallbackAttempt);
    for (const CallbackAttempt& a : r.attempt_log)
      strings += a.error.capacity() + a.signatures.capacity();
    // A dead letter's two entries in the index (everyone's, its tenant's): a node and its key.
    if (e.failed_callback)
      strings +=
          2 * (sizeof(FailedKey) + 4 * sizeof(void*) + r.job.id.size() + r.job.tenant.size() + 1);
    return per_entry + strings + e.input_bytes + e.result_bytes;
  }

  // Called under mutex_ after an entry changed: recounts its bytes, and notes it finished (with
  // a fresh sequence number, so that an older note of the same job, from before a redelivery,
  // can never evict it).
  void changed(Map::iterator it) {
    Entry& e = it->second;
    const bool failed = e.stored.record.callback.state == CallbackState::failed;
    if (failed != e.failed_callback) {
      index_failed(it, failed);  // first: it may throw, and then nothing changed
      e.failed_callback = failed;
      if (failed) {
        ++failed_callbacks_;
      } else {
        --failed_callbacks_;
      }
    }
    bytes_ -= e.bytes;
    if (e.finished) finished_bytes_ -= e.bytes;
    e.bytes = footprint(e);
    e.finished = job_state::is_finished(e.stored.record);
    bytes_ += e.bytes;
    if (e.finished) finished_bytes_ += e.bytes;
    if (e.finished) {
      if (e.finished_as != 0) --finished_;  // its earlier note goes stale
      e.finished_as = ++finished_sequence_ & sequence_bits;
      finished_order_.emplace_back(&it->first, std::uint64_t{e.finished_as});
      ++finished_;
    }
    evict_finished_until(options_.max_bytes);
  }

  // Called under mutex_: forgets finished jobs, oldest first, until at most max_finished are kept
  // and the store holds at most `bytes`.
  void evict_finished_until(std::size_t bytes) {
    while (!finished_order_.empty() && (finished_ > options_.max_finished || bytes_ > bytes)) {
      const auto [id, sequence] = finished_order_.front();
      finished_order_.pop_front();
      auto victim = jobs_.find(*id);
      if (victim == jobs_.end() || victim->second.finished_as != sequence) continue;  // stale
      --finished_;
      victim->second.finished_as = 0;
      if (job_state::is_finished(
              victim->second.stored.record)) {  // not when redelivery made it pending again
        if (victim->second.failed_callback) {
          index_failed(victim, false);  // before the counts: it may throw
          --failed_callbacks_;
        }
        bytes_ -= victim->second.bytes;
        finished_bytes_ -= victim->second.bytes;
        unschedule(job_queue_, victim);
        unschedule(callback_queue_, victim);
        jobs_.erase(victim);
      }
    }
  }

  MemoryJobStoreOptions options_;
  mutable std::mutex mutex_;
  Map jobs_;
  Queue job_queue_, callback_queue_;
  // Every tenant's name met, once (never forgotten: tenants are few, named by the operator).
  std::set<std::string> tenant_names_;
  // The tenant whose job a claim took last: the next claim's turns start after it.
  std::optional<std::string> last_turn_;
  std::array<Queued, lowest_priority + 1> queued_;
  std::size_t bytes_ = 0;
  std::size_t finished_bytes_ = 0;  // of bytes_, what finished jobs hold
  // Finished events, oldest first: (the entry's key in jobs_, sequence). A note is live while its
  // job's finished_as still equals its sequence; finished_ counts the live ones. An entry is
  // erased only when its live note, its newest, is taken (evict_finished_until), and its older
  // ones were taken before it: the key a note points to is always there.
  std::deque<std::pair<const std::string*, std::uint64_t>> finished_order_;
  std::uint64_t finished_sequence_ = 0;
  std::size_t finished_ = 0;
  std::size_t failed_callbacks_ = 0;                           // entries whose callback is `failed`
  FailedIndex failed_all_;                                     // their keys: everyone's
  std::map<std::string, FailedIndex, std::less<>> failed_of_;  // and each tenant's
  detail::ServersSeen seen_;
  std::map<std::string, ModelConfig> model_configs_;
  mutable std::string waiting_from_;  // the tenant where waiting_versions was cut short
  // Where the last claim that left versions alone got to in a tenant's priority: the last of the
  // skipped jobs it passed before the first it could take, by resume_key. The next claim with the
  // same versions goes on after it, so that jobs behind more skipped ones than a claim reads
  // (5,000) are reached (read from the start each time, they were held back for good). The point
  // only ever passes skipped jobs; it lives resume_lifetime from the claim that read from the start
  // (a job filed before it meanwhile, by a lease that ran out, waits at most that), and is
  // dropped when a claim reads to the end and finds nothing.
  struct Resume {
    TimePoint at;
    std::string id;
    TimePoint since;  // the claim that read from the start
  };
  static constexpr std::chrono::seconds resume_lifetime{300};
  std::unordered_map<std::string, Resume> resume_;
  static std::string resume_key(const std::string& tenant, int priority,
                                const std::vector<ModelRef>& skip) {
    std::string key = tenant + '\n' + std::to_string(priority);
    for (const ModelRef& m : skip)
      key += '\n' + m.name + ' ' + m.version;
    return key;
  }
};

}  // namespace rebound
