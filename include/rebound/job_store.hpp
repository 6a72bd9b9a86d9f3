// The JobStore interface: where jobs, their results and their delivery state live.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "rebound/job.hpp"

namespace rebound {

/// What `JobStore::put` did with a job.
enum class PutOutcome {
  created,    ///< A new job; stored (durably, for a durable store) before `put` returned.
  duplicate,  ///< The same id with the same request is already stored: nothing was written.
  conflict,   ///< The same id with a different request is already stored: nothing was written.
};

/// Where jobs live from acceptance until they are pruned.
///
/// The in-memory store ships now; SQLite (durable, embedded) and Redis Streams (shared by several
/// servers) implement the same interface. A job's life through it:
///   put -> mark_running -> complete -> update_callback (zero or more times).
/// `list_unfinished` is what a durable store hands back on start so that nothing accepted is lost.
///
/// Thread-safety: every method may be called concurrently from any thread.
/// Errors: a store that cannot do its job (disk full, connection lost) throws; the caller turns
/// that into a 5xx for a submission and keeps the job in memory for the rest.
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
};

}  // namespace rebound
