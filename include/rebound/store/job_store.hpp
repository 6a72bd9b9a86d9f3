// The JobStore interface: where jobs, their results and their delivery state live.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rebound/job.hpp"
#include "rebound/tenant.hpp"

namespace rebound {

/// What `JobStore::put` did with a job.
enum class PutOutcome {
  created,    ///< A new job; stored (durably, for a durable store) before `put` returned.
  duplicate,  ///< The same id with the same request is already stored: nothing was written.
  conflict,   ///< The same id with a different request is already stored: nothing was written.
  full,  ///< The store is at its size bound (MemoryJobStore's byte budget): nothing was written.
};

/// Thrown by a JobStore that cannot do its job now (disk full, file deleted or replaced,
/// connection lost). The JobQueue treats any exception from a store the same way; this type lets a
/// front end tell the failure apart (rebound::Server answers 503 `store_unavailable`).
class StoreUnavailable : public std::runtime_error {
 public:
  explicit StoreUnavailable(const std::string& why) : std::runtime_error(why) {}
};

/// A claim on a piece of work (a job to run, a callback to send): who holds it and until when.
/// `holder` is unique per claim (the JobQueue makes "<server id>/<sequence>"), so an
/// acknowledgement from a claim that was given up and claimed again is told apart even when both
/// come from the same server.
struct Lease {
  std::string holder;
  std::chrono::system_clock::time_point until;
};

/// One job of `JobStore::put_many`: the job (not owned; it outlives the call), and the lease its
/// new record is claimed with (none: it waits for claim_jobs).
struct PutRequest {
  const Job* job = nullptr;
  std::optional<Lease> claim;
};

/// What `JobStore::cancel` did.
enum class CancelOutcome {
  cancelled,         ///< the job was queued or running; it is final now, as given
  not_found,         ///< no job with that id
  already_finished,  ///< it was final already: nothing was written
};

/// What `JobStore::redeliver` did.
enum class RedeliverOutcome {
  redelivered,  ///< the callback was `failed`; it is pending again, claimed by the given lease
  not_found,    ///< no job with that id
  not_failed,   ///< its callback is not `failed` (none, pending or delivered)
};

/// Where a listing goes on: the creation time and id of the last entry a page answered. Pages
/// run newest first, by (created_at, id) descending, so an entry made or removed while someone
/// pages neither repeats nor shifts the others.
struct ListCursor {
  std::chrono::system_clock::time_point created_at{};
  std::string id;  ///< the key of the last job listed (rebound::key_of)
};

/// One page of a listing. Its entries carry no input and no result (their fields stay empty or
/// null; a job's result is a `get` away), so that the memory one page takes depends on the
/// number of entries, not on what the jobs hold.
struct JobPage {
  std::vector<JobRecord> jobs;
  /// Where the next page starts; none: this page is the last.
  std::optional<ListCursor> next;
};

/// The queue as the store holds it, the same for every server of a shared store: what an
/// autoscaler reads (JobStore::queue_stats).
struct QueueStats {
  std::size_t queued = 0;   ///< jobs accepted and not started (claimed or not)
  std::size_t running = 0;  ///< jobs started and not final
  /// The queued jobs of each priority that has any (0 first).
  std::vector<std::pair<int, std::size_t>> queued_by_priority;
  /// When the oldest queued job was accepted; none when nothing is queued.
  std::optional<std::chrono::system_clock::time_point> oldest_queued;
  std::size_t callbacks_waiting = 0;  ///< callbacks owed: due, retrying, or under way
  std::size_t callbacks_failed = 0;   ///< callbacks given up and kept: the dead letters
};

/// A count a store keeps of its own work in this process (JobStore::counters), shown by
/// Telemetry::render_metrics (rebound-server's `/metrics`) as the counter
/// `rebound_store_<name>`.
struct StoreCounter {
  std::string name;  ///< after `rebound_store_`: lower-case letters, digits and '_'
  std::string help;  ///< what it counts, one line
  std::uint64_t value = 0;
};

/// Which jobs a listing (JobStore::list_jobs) shows: every field set must match.
struct JobFilter {
  std::optional<JobStatus> status;
  std::optional<CallbackState> callback_state;
  std::optional<int> priority;
  /// The start of the job's key: "tenant/" for one tenant's jobs, "tenant/abc" for its ids that
  /// start with "abc" (rebound/tenant.hpp). Empty: every job.
  std::string id_prefix;

  /// Whether `r`, whose key is `key` (rebound::key_of), is listed.
  bool matches(const JobRecord& r, std::string_view key) const {
    return (!status || r.status == *status) &&
           (!callback_state || r.callback.state == *callback_state) &&
           (!priority || r.job.priority == *priority) &&
           key.substr(0, id_prefix.size()) == id_prefix;
  }
  bool matches(const JobRecord& r) const {
    return id_prefix.empty() ? matches(r, {}) : matches(r, key_of(r.job));
  }
};

/// A server seen working on a store (JobStore::report_server): what the console's servers view
/// shows.
struct ServerSeen {
  std::string id;  ///< the JobQueue's server id (the part of its lease holders before '/')
  std::chrono::system_clock::time_point last_seen{};
  std::size_t leases = 0;  ///< jobs and callbacks it held when it last reported
};

/// The lease protocol: what the JobQueue's pipeline does to a job and its callback, and the two
/// writes without a lease that tools use (complete, update_callback). The first of JobStore's
/// three parts; see JobStore for the job's life through it, its order of claims, and what every
/// part promises about threads, errors, tenants and time.
class JobLeaseStore {
 public:
  using TimePoint = std::chrono::system_clock::time_point;

  virtual ~JobLeaseStore() = default;

  /// Stores a new job in status `queued`, unless its id is already taken (see PutOutcome). With a
  /// `claim`, the new job is leased to it at once (the accepting server runs it); without, it waits
  /// for claim_jobs.
  virtual PutOutcome put(const Job& job, const std::optional<Lease>& claim) = 0;
  PutOutcome put(const Job& job) { return put(job, std::nullopt); }

  /// How `async_put` ends: the exception `put` would have thrown (null when it answered), and
  /// what it answered.
  using PutDone = std::function<void(std::exception_ptr error, PutOutcome outcome)>;

  /// put without waiting for it: `done` gets its answer or its error, exactly once, on the
  /// thread answer_thread names. The default runs put on the caller's thread and calls `done`
  /// before returning; a store that writes the puts of many callers together (SqliteJobStore,
  /// PostgresJobStore, RedisJobStore with batch_writes) calls `done` from its own thread once the
  /// job is stored, so that no caller's thread waits for the commit or the round trip.
  virtual void async_put(const Job& job, const std::optional<Lease>& claim, PutDone done) {
    answer_now(done, [&] { return put(job, claim); });
  }

  /// Stores several jobs as `put` would, in order, in as few writes as the store can (SQLite: one
  /// transaction; Redis: its batched calls, up to 256 puts or 1 MiB a round trip): one outcome
  /// per request, in the requests' order. An id twice in one call is a duplicate (or a conflict)
  /// the second time, as with two puts. A failing store throws, and some of the jobs may have been
  /// stored then, as with a put whose answer was lost: putting them again answers `duplicate`.
  /// The default calls `put` for each.
  virtual std::vector<PutOutcome> put_many(const std::vector<PutRequest>& requests) {
    std::vector<PutOutcome> out;
    out.reserve(requests.size());
    for (const PutRequest& r : requests)
      out.push_back(put(*r.job, r.claim));
    return out;
  }

  /// Leases up to `max` jobs that are not final and that nobody holds (never claimed, or their
  /// lease ran out before `now`): tenants in turns, each tenant's lowest priority number first,
  /// and within one priority in the order they became claimable (see the order in JobStore's
  /// comment). Jobs that became claimable at the same moment (one claim's, whose lease ended at
  /// once) come in an order each store chooses; the memory store may also order a job whose lease
  /// was lengthened by the end it had before (it refiles it lazily).
  virtual std::vector<JobRecord> claim_jobs(std::size_t max, const Lease& lease, TimePoint now) = 0;

  /// claim_jobs, leaving alone the jobs pinned to a version in `skip` (they stay claimable for
  /// the other servers of the store, in their place). A JobQueue on a shared store passes the
  /// versions its fleet serves and it has not loaded (still loading, or failed here), so that the
  /// servers that have them run their jobs. The default ignores `skip` (a store of one server:
  /// the JobQueue ends a job of a version it cannot run `version_unavailable`); RedisJobStore
  /// honours it.
  virtual std::vector<JobRecord> claim_jobs_except(std::size_t max, const Lease& lease,
                                                   TimePoint now,
                                                   const std::vector<ModelRef>& /*skip*/) {
    return claim_jobs(max, lease, now);
  }

  /// Extends the lease on a job or its callback to `lease.until`. False when `lease.holder` does
  /// not hold it any more (it ran out, or another claim took it): stop working on it.
  virtual bool renew(const std::string& id, const Lease& lease, TimePoint now) = 0;

  /// Moves a queued job to `running` (what polling shows) and records `now` as its `started_at`.
  /// Unknown ids and jobs not queued are ignored.
  virtual void mark_running(const std::string& id, TimePoint now) = 0;

  /// The acknowledgement of a job: records its final outcome and ends `holder`'s lease. A job
  /// with a callback becomes `pending`, claimed by `deliver` when given (the caller sends it at
  /// once), else due at once. False, and nothing written, when `holder` holds no live lease on it.
  virtual bool finish_job(const std::string& id, const std::string& holder,
                          const JobOutcome& outcome, const std::optional<Lease>& deliver,
                          TimePoint now) = 0;

  /// Ends a job that is not final yet with `outcome` (status `cancelled`), whoever holds it:
  /// its lease ends (a late acknowledgement from its holder is refused), and a job whose callback
  /// hears its end gets that callback pending, due at once. Atomic: of a cancellation and an
  /// acknowledgement at once, one wins.
  virtual CancelOutcome cancel(const std::string& id, const JobOutcome& outcome, TimePoint now) = 0;

  /// Leases up to `max` pending callbacks whose `next_attempt_at` has come and that nobody holds,
  /// earliest due first.
  virtual std::vector<JobRecord> claim_callbacks(std::size_t max, const Lease& lease,
                                                 TimePoint now) = 0;

  /// The acknowledgement of one callback attempt: writes `after` (pending again, due at its
  /// `next_attempt_at`; or delivered; or failed) and ends `holder`'s lease. False, and nothing
  /// written, when `holder` holds no live lease on the callback.
  /// `attempt`, when given, is the attempt this acknowledges (none for a deferral, which sends
  /// nothing): it joins the job's `attempt_log`, of which the store keeps the latest
  /// `max_attempt_log`, its error cut to `max_attempt_error_bytes`.
  virtual bool record_attempt(const std::string& id, const std::string& holder,
                              const CallbackInfo& after, TimePoint now,
                              const std::optional<CallbackAttempt>& attempt) = 0;
  bool record_attempt(const std::string& id, const std::string& holder, const CallbackInfo& after,
                      TimePoint now) {
    return record_attempt(id, holder, after, now, std::nullopt);
  }

  /// How an asynchronous write ends: the exception it failed with (null when it was written), and
  /// what the call answers (false: the lease was not held, nothing written).
  using WriteDone = std::function<void(std::exception_ptr error, bool answer)>;

  /// What an asynchronous acknowledgement of a job answers (async_finish_job).
  struct FinishAnswer {
    /// False when `holder` held no live lease on the job: nothing was written.
    bool held = false;
    /// The job's record as the store keeps it once the finish is written (its input, outcome,
    /// callback state), when the caller asked for it and the store can say; empty otherwise, when
    /// the caller reads it with get if it needs it. The JobQueue asks only for a job somebody
    /// waits for (`async_submit`, `async_wait`, `Prefer: wait`), which is then answered without
    /// reading the job back.
    std::optional<JobRecord> record;
  };
  /// How async_finish_job ends: the exception it failed with (null when it was written), and
  /// what it answers.
  using FinishDone = std::function<void(std::exception_ptr error, FinishAnswer answer)>;

  /// finish_job without waiting for it: `done` gets its answer or its error, exactly once, on
  /// the thread answer_thread names. With `want_record`, the answer carries the job's record as
  /// stored (see FinishAnswer). The default runs finish_job on the caller's thread and calls
  /// `done` before returning, without a record; the stores of this library answer the record
  /// from what their write made of the job (no second read).
  virtual void async_finish_job(const std::string& id, const std::string& holder,
                                const JobOutcome& outcome, const std::optional<Lease>& deliver,
                                TimePoint now, bool want_record, FinishDone done) {
    (void)want_record;
    answer_now(done, [&] {
      return FinishAnswer{finish_job(id, holder, outcome, deliver, now), {}};
    });
  }

  /// record_attempt without waiting for it: `done` gets its answer or its error, exactly once,
  /// on the thread answer_thread names. The default runs record_attempt on the caller's thread.
  virtual void async_record_attempt(const std::string& id, const std::string& holder,
                                    const CallbackInfo& after, TimePoint now,
                                    const std::optional<CallbackAttempt>& attempt, WriteDone done) {
    answer_now(done, [&] { return record_attempt(id, holder, after, now, attempt); });
  }

  /// The asynchronous calls, as answer_thread names them.
  enum class AsyncCall { put, finish_job, record_attempt };

  /// Where an asynchronous call runs its `done`.
  enum class AnswerThread {
    /// On the calling thread, before the call returns (the defaults; MemoryJobStore).
    caller,
    /// On a thread of the store's own, once the write is done (a writer that commits the calls
    /// of many threads together, a connection's batch thread). There `done` must be quick and
    /// must not call the store: the JobQueue posts the rest of its work to its executor. (A
    /// failure found before anything was queued may still be answered on the calling thread.)
    store,
  };

  /// Which thread runs the `done` of the asynchronous form of `call` (for finish_job, asked
  /// for the stored record or not): the JobQueue goes on at once with an answer on its own
  /// thread, and hands one from a store's thread to its executor, so that a store's thread never
  /// runs the JobQueue's work. A store that overrides an asynchronous call to answer from a
  /// thread of its own says so here (the JobQueue also hands on an answer that it hears on
  /// another thread than the caller's, whatever this says). The default: `caller`.
  virtual AnswerThread answer_thread(AsyncCall call, bool record_asked) const noexcept {
    (void)call;
    (void)record_asked;
    return AnswerThread::caller;
  }

  /// renew for many leases at once (the renewals a server makes every third of a lease): one
  /// answer per lease, in order. The default renews them one by one; a store with round trips
  /// sends them together. Throws when the store fails (some may be renewed by then).
  virtual std::vector<bool> renew_all(const std::vector<std::pair<std::string, Lease>>& leases,
                                      TimePoint now) {
    std::vector<bool> out;
    out.reserve(leases.size());
    for (const auto& lease : leases)
      out.push_back(renew(lease.first, lease.second, now));
    return out;
  }

  /// Puts a `failed` callback back into delivery with a fresh attempt budget, claimed by `claim`.
  /// Atomic: of two redeliveries at once, one wins.
  virtual RedeliverOutcome redeliver(const std::string& id, const Lease& claim, TimePoint now) = 0;

  /// Records how a job ended, without a lease. `outcome.status` must be final. Unknown ids are
  /// ignored. A job with a callback is left for update_callback (its state is not changed).
  virtual void complete(const std::string& id, const JobOutcome& outcome) = 0;

  /// Records the state of the job's callback delivery, without a lease; `pending` makes it due at
  /// `callback.next_attempt_at`. Unknown ids are ignored.
  virtual void update_callback(const std::string& id, const CallbackInfo& callback) = 0;

 protected:
  /// The asynchronous forms' default: `call` on this thread, then `done` with its answer or its
  /// error (outside the try: a `done` that throws is not the call's failure).
  template <typename Done, typename Call>
  static void answer_now(const Done& done, Call&& call) {
    decltype(call()) answer{};
    std::exception_ptr error;
    try {
      answer = call();
    } catch (...) {
      error = std::current_exception();
    }
    done(error, std::move(answer));
  }
};

/// The read side: a job's record (what the pipeline's waits and the HTTP front read), and the
/// listings and pages the console shows (the second of JobStore's three parts). Reads answer what
/// the store holds for every server that shares it; none changes a job.
class JobReadStore {
 public:
  using TimePoint = std::chrono::system_clock::time_point;

  virtual ~JobReadStore() = default;

  /// The job's current record, or nullopt when the id is unknown (or was pruned).
  virtual std::optional<JobRecord> get(const std::string& id) const = 0;

  /// `get` for several ids at once: one answer per id, in the ids' order (an id twice is answered
  /// twice). A store with round trips or commits to wait for makes one where `get` makes one an
  /// id (Redis: the reads pipelined on one connection, 256 a round trip; SQLite: one wait for the
  /// writes under way); the JobQueue reads the jobs its waiters wait for this way, at most 256 a
  /// call. The default calls `get` for each. A failing store throws.
  virtual std::vector<std::optional<JobRecord>> get_many(
      const std::vector<std::string>& ids) const {
    std::vector<std::optional<JobRecord>> out;
    out.reserve(ids.size());
    for (const std::string& id : ids)
      out.push_back(get(id));
    return out;
  }

  /// Whether a read may wait (a round trip, a lock behind a commit, a disk). The JobQueue then
  /// reads for the callers that must not wait (`async_wait`'s first look at its job, a submission
  /// refused for room looked up) on its store pump's thread, together with the others asked for
  /// meanwhile, rather than on the calling thread (perhaps the io thread). A store in memory
  /// says false (MemoryJobStore): its reads are made where they are asked. The default: true.
  virtual bool reads_wait() const noexcept { return true; }

  /// Jobs whose callback was given up (`CallbackState::failed`), most recently created first, at
  /// most `limit`: the dead letters an operator redelivers.
  virtual std::vector<JobRecord> list_failed_callbacks(std::size_t limit) const = 0;

  /// As list_failed_callbacks, of the jobs whose id starts with `id_prefix` (one tenant's:
  /// "name/", rebound/tenant.hpp); empty: all. The shipped stores filter as they read; this
  /// default filters what list_failed_callbacks answers for a larger limit, so it may miss some
  /// when other tenants have many more.
  virtual std::vector<JobRecord> list_failed_callbacks_with_prefix(const std::string& id_prefix,
                                                                   std::size_t limit) const {
    if (id_prefix.empty()) return list_failed_callbacks(limit);
    std::vector<JobRecord> out;
    const std::size_t read = limit > (SIZE_MAX - 1000) / 10 ? SIZE_MAX : limit * 10 + 1000;
    for (auto& record : list_failed_callbacks(read)) {
      if (out.size() >= limit) break;
      if (key_of(record.job).compare(0, id_prefix.size(), id_prefix) == 0)
        out.push_back(std::move(record));
    }
    return out;
  }

  /// A page of the failed callbacks of jobs whose id starts with `id_prefix` (""), newest first
  /// by (created_at, id), those after `after` (none: from the newest), at most `limit`; entries
  /// without input or result. The shipped stores read only the page (an index range) and never
  /// load an input or a result for it. This default pages what list_failed_callbacks_with_prefix
  /// answers for at most 10,000 entries: a store with more failed callbacks overrides it.
  virtual JobPage failed_callbacks_page(const std::string& id_prefix,
                                        const std::optional<ListCursor>& after,
                                        std::size_t limit) const {
    JobPage page;
    if (limit == 0) return page;
    // Times to the millisecond, as cursors keep them.
    auto ms = [](const JobRecord& r) {
      return std::chrono::floor<std::chrono::milliseconds>(r.job.created_at);
    };
    std::vector<JobRecord> all = list_failed_callbacks_with_prefix(id_prefix, 10000);
    std::sort(all.begin(), all.end(), [&](const JobRecord& a, const JobRecord& b) {
      return ms(a) != ms(b) ? ms(a) > ms(b) : key_of(a.job) > key_of(b.job);
    });
    for (auto& record : all) {
      if (after && !(ms(record) < after->created_at ||
                     (ms(record) == after->created_at && key_of(record.job) < after->id)))
        continue;
      if (page.jobs.size() == limit) {
        const JobRecord& last = page.jobs.back();
        page.next = ListCursor{ms(last), key_of(last.job)};
        break;
      }
      record.job.input = nullptr;
      record.outcome.result = nullptr;
      page.jobs.push_back(std::move(record));
    }
    return page;
  }

  /// The whole queue's numbers (QueueStats), counted by the store, so that every server of a
  /// shared store reports the same. nullopt: the store cannot tell (the default).
  virtual std::optional<QueueStats> queue_stats() const { return std::nullopt; }

  /// What this store counts of its own work since it was made, in this process (not the
  /// fleet's): PostgresJobStore's transactions and those made again. None by default. Called at
  /// every scrape of `/metrics`: it must answer from memory, without a call to the database.
  virtual std::vector<StoreCounter> counters() const { return {}; }

  /// A page of the jobs that match `filter`, newest first by (created_at, id), those after
  /// `after`, at most `limit`; entries without input, result or attempt log (as
  /// failed_callbacks_page). A page may hold fewer than `limit` entries and still have a `next`:
  /// a store may bound what one call reads. What the console's jobs view shows.
  /// This default sees only the jobs list_unfinished (at most 10,000) and
  /// list_failed_callbacks_with_prefix answer: the shipped stores override it and see every job
  /// they keep.
  virtual JobPage list_jobs(const JobFilter& filter, const std::optional<ListCursor>& after,
                            std::size_t limit) const {
    std::vector<JobRecord> all = list_unfinished(10000);
    for (auto& r : list_failed_callbacks_with_prefix(filter.id_prefix, 10000)) {
      if (is_final(r.status) && r.callback.state == CallbackState::failed)
        all.push_back(std::move(r));
    }
    return page_of(std::move(all), filter, after, limit);
  }

  /// Jobs that are not finished: not final yet, or final with a callback still `pending`.
  /// At most `limit` of them, oldest first.
  virtual std::vector<JobRecord> list_unfinished(std::size_t limit) const = 0;

  /// How many queued jobs run before the queued job `id`: those of a lower priority number, and
  /// those of its priority accepted before it. nullopt when the job is not queued (or unknown),
  /// or when the store cannot tell (the default).
  virtual std::optional<std::size_t> queue_position(const std::string& /*id*/) const {
    return std::nullopt;
  }

 protected:
  /// The page of `records` that a listing answers: those matching `filter` after `after`, newest
  /// first by (created_at to the millisecond, id), at most `limit`, without input, result and
  /// attempt log. For stores that list from memory.
  static JobPage page_of(std::vector<JobRecord> records, const JobFilter& filter,
                         const std::optional<ListCursor>& after, std::size_t limit) {
    JobPage page;
    if (limit == 0) return page;
    auto ms = [](const JobRecord& r) {
      return std::chrono::floor<std::chrono::milliseconds>(r.job.created_at);
    };
    std::vector<JobRecord> kept;
    for (auto& r : records) {
      if (!filter.matches(r)) continue;
      if (after &&
          !(ms(r) < after->created_at || (ms(r) == after->created_at && key_of(r.job) < after->id)))
        continue;
      kept.push_back(std::move(r));
    }
    std::sort(kept.begin(), kept.end(), [&](const JobRecord& a, const JobRecord& b) {
      return ms(a) != ms(b) ? ms(a) > ms(b) : key_of(a.job) > key_of(b.job);
    });
    if (kept.size() > limit) {
      kept.resize(limit);
      page.next = ListCursor{ms(kept.back()), key_of(kept.back().job)};
    }
    for (auto& r : kept) {
      r.job.input = nullptr;
      r.outcome.result = nullptr;
      r.attempt_log.clear();
    }
    page.jobs = std::move(kept);
    return page;
  }
};

/// One model's configuration as a store shares it among servers (FleetStore::model_configs).
struct ModelConfig {
  std::string name;
  std::string config;            ///< as put_model_config was given it
  std::uint64_t generation = 0;  ///< 1 for the first write, then one more for each
};

/// Fleet coordination: what the servers that share a store tell each other through it (the third
/// of JobStore's three parts). Each call has a default for a store of one server (keep nothing,
/// share nothing), so a store of one's own may leave this part out.
class FleetStore {
 public:
  using TimePoint = std::chrono::system_clock::time_point;

  virtual ~FleetStore() = default;

  /// Notes that server `id` is alive and holds `leases` jobs and callbacks (a JobQueue calls it
  /// every few seconds). The default keeps nothing.
  virtual void report_server(const std::string& /*id*/, std::size_t /*leases*/, TimePoint /*now*/) {
  }

  /// The servers that reported in the last hour, most recently seen first. The default: none.
  virtual std::vector<ServerSeen> servers(TimePoint /*now*/) const { return {}; }

  /// Keeps `origin` ("https://host:443", OriginGate::origin_of's form) paused, or not, for every
  /// server of the store: a JobQueue writes it when an operator pauses or resumes, and each
  /// JobQueue on the store holds the origins paused_origins() answers (it asks every second).
  /// The default keeps nothing (pauses are then each server's own). False: the store keeps as
  /// many paused origins as it will (RedisJobStore: 10,000) and refused this one.
  virtual bool set_origin_paused(const std::string& /*origin*/, bool /*paused*/) { return true; }

  /// The origins paused through set_origin_paused, sorted; nullopt when the store does not share
  /// pauses (the default).
  virtual std::optional<std::vector<std::string>> paused_origins() const { return std::nullopt; }

  /// Writes the shared configuration of model `name` (the JobQueue's own JSON text: its route and
  /// the versions every server serves) when the generation stored for it is `if_generation` (0:
  /// none stored yet), and answers the new generation (`if_generation + 1`); nullopt, writing
  /// nothing, when another server wrote it in between. Each JobQueue on the store reads
  /// model_configs() twice a second and follows what it says (ServedModels). The default keeps
  /// nothing and answers `if_generation + 1`: with it, models are each server's own.
  virtual std::optional<std::uint64_t> put_model_config(const std::string& /*name*/,
                                                        const std::string& /*config*/,
                                                        std::uint64_t if_generation) {
    return if_generation + 1;
  }

  /// Every model configuration put_model_config wrote, by name; nullopt when the store does not
  /// share them (the default).
  virtual std::optional<std::vector<ModelConfig>> model_configs() const { return std::nullopt; }

  /// Of `versions`, those with a job that nobody has claimed since `since` or before (never
  /// claimed and created by then, or its last lease ended by then): jobs no server of the store
  /// runs, because none has their version loaded. A JobQueue on a shared store asks it about the
  /// fleet's versions it does not serve itself (evicted for its memory budget, or too large for
  /// it) and loads those answered, within the budget (ServedModels: versions loaded on demand).
  /// A store may look at a bounded number of jobs and answer only some. The default: none.
  virtual std::vector<ModelRef> waiting_versions(const std::vector<ModelRef>& /*versions*/,
                                                 TimePoint /*since*/) const {
    return {};
  }

  /// Wake-ups: asks the store to call `woken` when work became claimable that a server of the
  /// store wrote (a job put unclaimed, a lease handed back, a callback due now), so that a
  /// JobQueue claims it at once instead of at its next poll (JobQueueOptions::poll_interval). A
  /// store may call it more often than that (a wake-up finds nothing to claim: harmless), for
  /// instance when it cannot tell what it missed (its listener reconnected). `woken` is called
  /// on a thread of the store's, must return quickly and must not call the store. A JobQueue
  /// watches from its construction to its destruction. Answers a number for unwatch_work; the
  /// default wakes no one (0): the queue polls.
  virtual std::uint64_t watch_work(std::function<void()> /*woken*/) { return 0; }

  /// Ends the wake-ups of the `watch_work` that answered `watch`: once this returns, its `woken`
  /// is not running and is not called again. 0 is ignored.
  virtual void unwatch_work(std::uint64_t /*watch*/) {}
};

/// Where jobs live from acceptance until they are pruned: the queue itself, not a log beside it.
/// Three parts, each an interface of its own: the lease protocol (JobLeaseStore), the read side
/// (JobReadStore) and fleet coordination (FleetStore), and `failure()`, which is the whole
/// store's. A store of one's own derives from JobStore and implements the pure virtuals of the
/// first two (the third has defaults); code that needs one part takes that part.
///
/// Work is claimed with a lease, renewed while it lasts, and acknowledged; an acknowledgement
/// from a holder whose lease ran out is refused (false, nothing written), and a lease that runs
/// out makes the work claimable again: a crashed server's jobs and callbacks are taken over.
/// A job's life through it:
///   put (optionally claimed at once) | claim_jobs -> [renew] -> mark_running -> finish_job
///   -> callback pending: claimed at once by finish_job, or later by claim_callbacks
///   -> record_attempt (pending again with its next_attempt_at, or delivered / failed)
///   -> redeliver (failed -> pending) ...
/// A pending callback waits in the store, not in memory: claim_callbacks hands it out when its
/// `next_attempt_at` has come. Order: jobs by tenants in turns (one job a tenant a turn, tenants
/// in name order, starting after the tenant whose job the last claim took: job_state::claim_turns),
/// each tenant's by priority (0 first), then by the time each became claimable: a job never
/// claimed at its creation (oldest first), a job whose lease ran out at the end of that lease;
/// callbacks by the time each became due: its next attempt (or the end of its lease).
///
/// `complete` and `update_callback` write a record as given, without a lease (for tools,
/// migrations and tests); the JobQueue finishes work only through the leased calls.
///
/// Time comes in as `now` on every call that depends on it, so that tests and simulations can
/// drive a store with their own clock.
///
/// Tenants: a job is named by its key (rebound::key_of: "tenant/id", or the id for the single
/// tenant), unique in the store. Every call that takes an `id` takes that key, and list
/// prefixes and cursors are of keys; every record a store hands back carries the job's tenant
/// and id as their own fields (Job::tenant, Job::id), as `put` was given them. A store keeps the
/// tenant as a field: it never splits a key to find it.
///
/// Thread-safety: every method may be called concurrently from any thread.
/// Errors: a store that cannot do its job (disk full, file deleted, connection lost) throws, and
/// `failure()` says why until it works again. The JobQueue has one policy for it, whichever call
/// failed: submissions are refused (`store_unavailable`, nothing accepted), readiness is false
/// (`/ping` 503), one log line gives the reason, and a write that failed for an accepted job is
/// tried again until it succeeds, so nothing accepted is lost.
class JobStore : public JobLeaseStore, public JobReadStore, public FleetStore {
 public:
  using TimePoint = std::chrono::system_clock::time_point;  // (one name for the three parts' alias)

  ~JobStore() override = default;

  /// Why the store cannot do its job now, or nullopt while it can. Called for every `/ping`, so
  /// it must be cheap; a store that notices trouble only when it writes may answer from its last
  /// write. The default never fails (a store in process memory).
  virtual std::optional<std::string> failure() const { return std::nullopt; }
};

}  // namespace rebound
