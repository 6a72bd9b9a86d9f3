// The one way the parts of a pipeline reach back up: what Admission, Delivery, the StorePump and
// the BatchRunner tell the Pipeline that built them. The Pipeline implements it and hands itself
// to each part's constructor; nothing is wired after construction.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "rebound/job.hpp"

namespace rebound::detail {

template <typename Item>
class WorkQueue;
struct WorkItem;

class PipelineEvents {
 public:
  using TimePoint = std::chrono::system_clock::time_point;

  /// What async work of the parts (a delivery, a watchdog, a write being retried) holds to keep
  /// them all alive until it ends. Never null while the pipeline exists.
  virtual std::shared_ptr<const void> keep_alive() const = 0;
  /// A slot of the queue was given back (Admission): work may wait in the store for it.
  virtual void slot_freed() = 0;
  /// The store pump should look for work at `at` (a callback's retry, Delivery).
  virtual void wake_pump(TimePoint at) = 0;
  /// The store refused to renew `holder`'s lease on the job `key` (cancelled, or claimed by
  /// another server): a waiting job is not run, a running one is told to stop.
  virtual void lease_lost(const std::string& key, const std::string& holder) = 0;
  /// The pump looks for expired and revoked jobs among those waiting in `queue` (at most every
  /// quarter second).
  virtual void sweep(WorkQueue<WorkItem>& queue) = 0;
  /// The pump is about to look for work (each pass): what a pass must know first.
  virtual void pump_polled() = 0;
  /// The pump was woken for the waits of jobs finished here (StorePump::wake_for_finals): on its
  /// thread, without a pass (no claims).
  virtual void finals_due() = 0;
  /// Whether somebody waits for the job `key` to end: its acknowledgement then asks the store for
  /// the record it keeps (JobStore::FinishAnswer), which completes the waits.
  virtual bool awaited(const std::string& key) const = 0;
  /// The store acknowledged the outcome of the job `key` (the BatchRunner): `record` as the runner
  /// finished it, its callback `pending` when one is due.
  virtual void job_final(const std::string& key, const JobRecord& record) = 0;
  /// The same, for a job somebody waits for (awaited) whose acknowledgement the store answered
  /// with `stored`, the record it keeps.
  virtual void job_answered(const std::string& key, JobRecord stored) = 0;

 protected:
  ~PipelineEvents() = default;
};

}  // namespace rebound::detail
