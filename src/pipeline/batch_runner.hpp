// The batch runner: the worker step. A batch from the queue goes through the model (under a
// watchdog when there is an inference timeout); each job's outcome is acknowledged to the store
// and its callback handed to delivery; each invocation is answered.
#pragma once

#include <atomic>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <nlohmann/json.hpp>

#include "admission.hpp"
#include "delivery.hpp"
#include "events.hpp"
#include "leases.hpp"
#include "model_table.hpp"
#include "observers.hpp"
#include "rebound/job_queue_status.hpp"
#include "rebound/model.hpp"
#include "store_access.hpp"
#include "work_item.hpp"
#include "work_queue.hpp"

namespace rebound::detail {

/// `run` is called by the queue's workers, on the inference executor, never under a lock; the
/// watchdog runs on `timer_executor`. `owner` (the pipeline) is kept alive by the work in
/// flight (a watchdog, a write being retried).
class BatchRunner {
 public:
  /// `events` hears each job whose outcome this runner got acknowledged (job_final, or
  /// job_answered with the store's record for a job somebody waits for: it is final in the
  /// store) and keeps the parts alive while a watchdog or a write is under way.
  BatchRunner(ModelTable& models, StoreAccess& store, Leases& leases, Delivery& delivery,
              Admission& admission, Observers& observe, Clock clock, PipelineEvents& events,
              boost::asio::any_io_executor timer_executor, std::chrono::milliseconds job_ttl,
              std::chrono::milliseconds inference_timeout)
      : models_(models),
        only_(models.runs_every_job() ? models.first_versions().front().second.lock() : nullptr),
        only_stats_(only_ ? models.stats_of(models.first_versions().front().first) : nullptr),
        store_(store),
        leases_(leases),
        delivery_(delivery),
        admission_(admission),
        observe_(observe),
        clock_(std::move(clock)),
        events_(events),
        timer_executor_(std::move(timer_executor)),
        job_ttl_(job_ttl),
        inference_timeout_(inference_timeout) {}

  /// The worker step for one batch.
  void run(std::vector<WorkItem> batch);

  /// batches, items and the largest batch so far (`resumed` is the pump's).
  BatchStats stats() const;

  /// Takes out of `queue` the jobs that must not wait any longer: past their time in queue
  /// (ended `expired`), or revoked (dropped). Called by the pump about every second, so that a job
  /// starved by higher priorities still expires on time and a cancelled one frees its slot.
  void sweep(WorkQueue<WorkItem>& queue);

  /// `holder`'s run of `id` is over (the job was cancelled, or its lease was lost to another
  /// claim): a running job's cancellation flag is set (rebound::cancellation_requested) and its
  /// result discarded. With `queued_too`, a job still waiting in the queue is dropped when a
  /// worker takes it, without running.
  void revoke(const std::string& id, const std::string& holder, bool queued_too);

  /// A stopping process gives up its running jobs (JobQueue::abandon_running): every running
  /// job's cancellation flag is set and its result discarded, its lease handed back (the job stays
  /// unfinished in the store, for another server or the next start); and so for any run that
  /// starts later.
  void abandon_running();

  /// The job `id` was cancelled while this server held no claim on it that it knew of: a claim
  /// taken in the moment between the store's answer and its note here (a submission, the pump)
  /// is dropped when a worker or the sweep meets it. Forgotten after `keep`.
  void cancelled_unheld(const std::string& id, std::chrono::milliseconds keep);

 private:
  using TimePoint = std::chrono::system_clock::time_point;
  // The job's time in queue: its own max_queue, else the queue's time-to-live (0: none).
  std::chrono::milliseconds time_in_queue(const Job& job) const;
  bool past_time(const WorkItem& item, TimePoint now) const;
  // Ends the items of `batch` that must not run (revoked: dropped; past their time: expired) and
  // leaves the others.
  void screen(std::vector<WorkItem>& batch, TimePoint now);

  // Runs a batch of one version's items (screened) on `model`, counted in `counts` (its
  // version's stats; they outlive the runner's work: the table keeps them).
  void run_on(Model& model, VersionStats* counts, std::vector<WorkItem> batch, TimePoint now);

  // Runs the model on a batch. Never throws: a model that throws, or returns the wrong number of
  // predictions, fails every item of the batch with model_error.
  std::vector<Prediction> predict(Model& model, std::vector<nlohmann::json>& inputs);

  // Answers one item with its prediction: an invocation's handler, or a job's outcome, counted
  // in `counts` (its version's; null: it ran on none). inference_ms < 0: the model never
  // answered (a timeout).
  void settle(WorkItem& item, Prediction& prediction, std::size_t batch_size, double inference_ms,
              TimePoint started_at, VersionStats* counts);

  // Acknowledges a final outcome to the store and starts its callback (or frees the slot when
  // none is wanted, or when the lease was lost: another claim has the job).
  void finish(JobRecord record, Claim claim, bool rerouted = false);

  ModelTable& models_;  // (rerouting a job asks its route)
  // A queue built on one Model (ModelRepository::runs_every_job): it runs every item, whatever
  // model the item names, on that Model (which such a table never releases).
  const std::shared_ptr<Model> only_;
  const std::shared_ptr<VersionStats> only_stats_;
  StoreAccess& store_;
  Leases& leases_;
  Delivery& delivery_;
  Admission& admission_;
  Observers& observe_;
  const Clock clock_;
  PipelineEvents& events_;
  boost::asio::any_io_executor timer_executor_;
  const std::chrono::milliseconds job_ttl_;
  const std::chrono::milliseconds inference_timeout_;
  // What async work holds to keep the parts alive.
  std::shared_ptr<const void> owner() const { return events_.keep_alive(); }
  mutable std::mutex stats_mutex_;
  BatchStats stats_;

  // The jobs running now (id -> their claim and cancellation flag), and the claims revoked while
  // their job waited in the queue (bounded by the queue: each is dropped when its job is taken).
  struct Running {
    std::string holder;
    std::shared_ptr<std::atomic<bool>> cancelled;
  };
  std::mutex runs_mutex_;
  std::unordered_map<std::string, Running> running_;
  bool abandoned_ = false;  // (under runs_mutex_) abandon_running was called
  std::set<std::pair<std::string, std::string>> revoked_;  // (id, holder)
  // Jobs cancelled with no claim here (see cancelled_unheld): id -> until when it is kept.
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> cancelled_unheld_;
  // Under runs_mutex_: whether the waiting item's run is revoked; with `take`, the note is used up.
  bool revoked_locked(const WorkItem& item, bool take);
  // Ends an item's run: false when it was revoked (its result is to be discarded); `abandoned`
  // says whether the process gave its running jobs up (abandon_running).
  bool end_run(const WorkItem& item, bool& abandoned);
};

}  // namespace rebound::detail
