// The state rules of a stored job, written once: what each JobStore call does to one job, as pure
// functions over a StoredJob (no I/O, no clock of their own, no index). MemoryJobStore applies
// them under its lock and keeps its indexes beside; SqliteJobStore and PostgresJobStore apply them
// to the rows their writer's transaction reads (SQLite keeps who holds a lease in memory, the file
// being one process's, and puts the caller's lease in the row's place before the rule runs).
// RedisJobStore states the same rules in Lua (src/store/redis/*.lua), atomic inside Redis across
// servers, with one lease field that is the job's until it is final and its callback's after. The
// differential test (tests/test_store_differential.cpp) holds SQLite, Redis and PostgreSQL to the
// memory store's answers and records after every step, so to these rules. A store of one's own
// starts here.
//
// What the JobQueue never does, and the stores may answer differently: give `deliver` to finish a
// job that wants no completion callback, complete a job with a status that is not final, or make a
// callback pending (update_callback) on a job that is not final.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rebound/job.hpp"
#include "rebound/store/job_store.hpp"

namespace rebound {

/// A job as a store keeps it: its record, and the two leases on it.
struct StoredJob {
  JobRecord record;
  /// Who runs the job, until when (a claim, or the put of the server that accepted it).
  std::optional<Lease> job_lease;
  /// Who delivers its callback, until when (a claim of the callback, or the finish that started
  /// its delivery).
  std::optional<Lease> callback_lease;
};

namespace job_state {

using TimePoint = std::chrono::system_clock::time_point;

/// True when `lease` is `holder`'s and has not run out at `now`.
inline bool holds(const Lease& lease, const std::string& holder, TimePoint now) {
  return lease.holder == holder && lease.until > now;
}
inline bool holds(const std::optional<Lease>& lease, const std::string& holder, TimePoint now) {
  return lease && holds(*lease, holder, now);
}

/// A job put for the first time: queued, held by `claim` when given (the server that accepted it
/// runs it).
inline StoredJob created(const Job& job, const std::optional<Lease>& claim) {
  StoredJob s;
  s.record.job = job;
  s.job_lease = claim;
  return s;
}

/// A put of `job` under a taken id: the same request again, or another one.
inline PutOutcome put_again(const StoredJob& existing, const Job& job) {
  return existing.record.job.same_request_as(job) ? PutOutcome::duplicate : PutOutcome::conflict;
}

/// When a claim of jobs may take it (stores claim each tenant's jobs in order of priority, then
/// this time, the tenants taking turns: claim_turns): the end of its lease, else its creation;
/// nullopt once it is final.
inline std::optional<TimePoint> job_due(const StoredJob& s) {
  if (is_final(s.record.status)) return std::nullopt;
  return s.job_lease ? s.job_lease->until : s.record.job.created_at;
}

/// When a claim of callbacks may take it: the end of its lease, else its next attempt; nullopt
/// unless its callback is pending.
inline std::optional<TimePoint> callback_due(const StoredJob& s) {
  if (s.record.callback.state != CallbackState::pending) return std::nullopt;
  return s.callback_lease ? s.callback_lease->until : s.record.callback.next_attempt_at;
}

/// claim_jobs, for one job: taken when due at `now` (its lease, if any, has run out).
inline bool claim_job(StoredJob& s, const Lease& lease, TimePoint now) {
  const auto due = job_due(s);
  if (!due || *due > now) return false;
  s.job_lease = lease;
  return true;
}

/// claim_callbacks, for one job.
inline bool claim_callback(StoredJob& s, const Lease& lease, TimePoint now) {
  const auto due = callback_due(s);
  if (!due || *due > now) return false;
  s.callback_lease = lease;
  return true;
}

/// The order in which a claim of jobs takes them across tenants: turns, one job each, so that no
/// tenant's priorities or numbers keep another's jobs waiting (a priority orders a tenant's own
/// jobs only). `tenants` are the tenants with claimable jobs, in name order (the default tenant's
/// name is empty), and `claimable[i]` how many tenant i has, each tenant's in its own order
/// (priority, then due time); `last_turn` is the tenant that took the last job of the claim before,
/// if any. The answer visits every claimable job once as (tenant index, position in its order),
/// the first turn going to the first tenant after `last_turn` (wrapping round); a claim takes from
/// its front and remembers the tenant of the last job it took.
inline std::vector<std::pair<std::size_t, std::size_t>> claim_turns(
    const std::vector<std::string>& tenants, const std::vector<std::size_t>& claimable,
    const std::optional<std::string>& last_turn) {
  std::size_t first = 0;
  if (last_turn) {
    while (first < tenants.size() && tenants[first] <= *last_turn)
      ++first;
    if (first == tenants.size()) first = 0;
  }
  std::vector<std::pair<std::size_t, std::size_t>> order;
  for (std::size_t position = 0;; ++position) {
    const std::size_t before = order.size();
    for (std::size_t k = 0; k < tenants.size(); ++k) {
      const std::size_t t = (first + k) % tenants.size();
      if (position < claimable[t]) order.emplace_back(t, position);
    }
    if (order.size() == before) return order;
  }
}

/// Which lease a renewal made longer.
enum class Renewed { none, job, callback };

/// renew: the job's lease if `lease.holder` holds it, else its callback's.
inline Renewed renew(StoredJob& s, const Lease& lease, TimePoint now) {
  if (holds(s.job_lease, lease.holder, now)) {
    s.job_lease->until = lease.until;
    return Renewed::job;
  }
  if (holds(s.callback_lease, lease.holder, now)) {
    s.callback_lease->until = lease.until;
    return Renewed::callback;
  }
  return Renewed::none;
}

/// mark_running: a queued job is running from `now`. False when it was not queued.
inline bool mark_running(StoredJob& s, TimePoint now) {
  if (s.record.status != JobStatus::queued) return false;
  s.record.status = JobStatus::running;
  s.record.started_at = now;
  return true;
}

/// The outcome written (its status final; a result is kept only for a job that succeeded), the
/// job's lease ended; its callback left as it is (complete, and the first step of finish and
/// cancel).
inline void complete(StoredJob& s, const JobOutcome& outcome) {
  s.record.status = outcome.status;
  s.record.outcome = outcome;
  if (outcome.status != JobStatus::succeeded) s.record.outcome.result = nullptr;
  s.job_lease.reset();
}

/// The callback starts a fresh delivery at `now` (its attempt count keeps adding up, its last error
/// is cleared), held by `lease` when given, else due at once. (The schedule fields, next attempt
/// to previous delay, mean something only while the callback is pending.)
inline void start_delivery(StoredJob& s, const std::optional<Lease>& lease, TimePoint now) {
  CallbackInfo& cb = s.record.callback;
  cb.state = CallbackState::pending;
  cb.last_error.clear();
  cb.next_attempt_at = now;
  cb.delivery_attempts = 0;
  cb.delivery_started_at = now;
  cb.previous_delay = std::chrono::milliseconds(0);
  s.callback_lease = lease;
}

/// finish_job: refused (false) unless `holder` holds the job's lease at `now` and it is not final;
/// then its outcome is written (and the version that ran it, JobOutcome::ran_on_version) and, if it
/// wants a completion callback, its delivery starts, held by `deliver` (ignored for a job that
/// wants none).
inline bool finish(StoredJob& s, const std::string& holder, const JobOutcome& outcome,
                   const std::optional<Lease>& deliver, TimePoint now) {
  if (is_final(s.record.status) || !holds(s.job_lease, holder, now)) return false;
  complete(s, outcome);
  if (!outcome.ran_on_version.empty()) s.record.job.model.version = outcome.ran_on_version;
  if (s.record.job.wants_completion_callback()) start_delivery(s, deliver, now);
  return true;
}

/// cancel, for a job that exists: final already, or ended with `outcome` now (whoever holds it),
/// its callback, if it wants a completion callback, due at once.
inline CancelOutcome cancel(StoredJob& s, const JobOutcome& outcome, TimePoint now) {
  if (is_final(s.record.status)) return CancelOutcome::already_finished;
  complete(s, outcome);
  if (s.record.job.wants_completion_callback()) start_delivery(s, std::nullopt, now);
  return CancelOutcome::cancelled;
}

/// update_callback: the callback as given; its lease ended.
inline void update_callback(StoredJob& s, const CallbackInfo& callback) {
  s.record.callback = callback;
  s.callback_lease.reset();
}

/// record_attempt: refused (false) unless the callback is pending and `holder` holds its lease at
/// `now`; then `attempt` joins the log (the last `max_attempt_log` kept, each error cut to
/// `max_attempt_error_bytes`) and the callback becomes `after`, its lease ended.
inline bool record_attempt(StoredJob& s, const std::string& holder, const CallbackInfo& after,
                           TimePoint now, const std::optional<CallbackAttempt>& attempt) {
  if (s.record.callback.state != CallbackState::pending || !holds(s.callback_lease, holder, now)) {
    return false;
  }
  if (attempt) {
    auto& log = s.record.attempt_log;
    if (log.size() >= max_attempt_log) {
      log.erase(log.begin(),
                log.begin() + static_cast<std::ptrdiff_t>(log.size() + 1 - max_attempt_log));
    }
    log.push_back(*attempt);
    if (log.back().error.size() > max_attempt_error_bytes)
      log.back().error.resize(max_attempt_error_bytes);
  }
  update_callback(s, after);
  return true;
}

/// redeliver, for a job that exists: only a callback that was given up is delivered again, held
/// by `claim`.
inline RedeliverOutcome redeliver(StoredJob& s, const Lease& claim, TimePoint now) {
  if (s.record.callback.state != CallbackState::failed) return RedeliverOutcome::not_failed;
  start_delivery(s, claim, now);
  return RedeliverOutcome::redelivered;
}

/// True when nothing more will happen to the job: final, and its callback delivered, given up or
/// not wanted. (What a store may forget first.)
inline bool is_finished(const JobRecord& record) {
  if (!is_final(record.status)) return false;
  if (!record.job.wants_completion_callback()) return true;
  return record.callback.state == CallbackState::delivered ||
         record.callback.state == CallbackState::failed;
}

}  // namespace job_state
}  // namespace rebound
