// The JobStore interface: where jobs, their results and their delivery state live.
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "rebound/job.hpp"

namespace rebound {

/// What `JobStore::put` did with a job.
enum class PutOutcome {
  created,    ///< A new job; stored (durably, for a durable store) before `put` returned.
  duplicate,  ///< The same id with the same request is already stored: nothing was written.
  conflict,   ///< The same id with a different request is already stored: nothing was written.
  full,  ///< The store is at its size bound (MemoryJobStore's byte budget): nothing was written.
};

/// Thrown by a JobStore that cannot do its job now (disk full, file deleted or replaced,
/// connection lost). The Service treats any exception from a store the same way; this type lets a
/// front end tell the failure apart (rebound::Server answers 503 `store_unavailable`).
class StoreUnavailable : public std::runtime_error {
 public:
  explicit StoreUnavailable(const std::string& why) : std::runtime_error(why) {}
};

/// Where jobs live from acceptance until they are pruned.
///
/// The in-memory store ships now; SQLite (durable, embedded) and Redis Streams (shared by several
/// servers) implement the same interface. A job's life through it:
///   put -> mark_running -> complete -> update_callback (zero or more times).
/// `list_unfinished` is what a durable store hands back on start so that nothing accepted is lost.
///
/// Thread-safety: every method may be called concurrently from any thread.
/// Errors: a store that cannot do its job (disk full, file deleted, connection lost) throws, and
/// `failure()` says why until it works again. The Service has one policy for it, whichever call
/// failed: submissions are refused (`store_unavailable`, nothing accepted), readiness is false
/// (`/ping` 503), one log line gives the reason, and a write that failed for an accepted job is
/// tried again until it succeeds, so nothing accepted is lost.
class JobStore {
 public:
  virtual ~JobStore() = default;

  /// Stores a new job in status `queued`, unless its id is already taken (see PutOutcome).
  virtual PutOutcome put(const Job& job) = 0;

  /// The job's current record, or nullopt when the id is unknown (or was pruned).
  virtual std::optional<JobRecord> get(const std::string& id) const = 0;

  /// Moves a queued job to `running`. Unknown ids are ignored.
  virtual void mark_running(const std::string& id) = 0;

  /// Records how a job ended. `outcome.status` must be final. Unknown ids are ignored.
  virtual void complete(const std::string& id, const JobOutcome& outcome) = 0;

  /// Records the state of the job's callback delivery. Unknown ids are ignored.
  virtual void update_callback(const std::string& id, const CallbackInfo& callback) = 0;

  /// Jobs whose callback was given up (`CallbackState::failed`), most recently created first, at
  /// most `limit`: the dead letters an operator redelivers.
  virtual std::vector<JobRecord> list_failed_callbacks(std::size_t limit) const = 0;

  /// Jobs that are not finished: not final yet, or final with a callback still `pending`.
  /// At most `limit` of them, oldest first.
  virtual std::vector<JobRecord> list_unfinished(std::size_t limit) const = 0;

  /// Why the store cannot do its job now, or nullopt while it can. Called for every `/ping`, so
  /// it must be cheap; a store that notices trouble only when it writes may answer from its last
  /// write. The default never fails (a store in process memory).
  virtual std::optional<std::string> failure() const { return std::nullopt; }
};

}  // namespace rebound
