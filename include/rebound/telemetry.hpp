// rebound::Telemetry: the numbers of a JobQueue: its metrics and their Prometheus text, the
// slots and bytes in flight, its depth, the store's queue statistics (the same on every server of
// a shared store, for autoscalers), its batches. Reached through `JobQueue::telemetry()`; lives as
// long as its queue.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "rebound/job_queue_status.hpp"
#include "rebound/metrics.hpp"
#include "rebound/store/job_store.hpp"

namespace rebound {

class JobQueue;
namespace detail {
struct Pipeline;
struct WorkItem;
template <typename Item>
class WorkQueue;
}  // namespace detail

/// Thread-safety: every method is thread-safe.
///
/// Example (an autoscaler's probe, polling often: the count shared with /metrics):
///   if (auto stats = queue.telemetry().recent_queue_stats()) scale_to(stats->queued / per_server);
class Telemetry {
 public:
  Telemetry(const Telemetry&) = delete;
  Telemetry& operator=(const Telemetry&) = delete;

  /// Why the job store cannot be used now (JobStore::failure), or nullopt while it works.
  std::optional<std::string> store_failure() const;

  /// Capacity slots taken now: jobs accepted and not finished (in memory, or parked in the store:
  /// JobQueueOptions::prefetch) and callback attempts (see JobQueueOptions::queue_capacity).
  std::size_t in_flight() const;

  /// The bytes work in memory holds now (JobQueueOptions::max_work_bytes).
  std::size_t work_bytes() const;

  /// Jobs this queue accepted or claimed that wait for a worker now: in its memory, and parked in
  /// the store beyond its prefetch (JobQueueOptions::prefetch).
  std::size_t queue_depth() const;

  /// The whole queue's numbers as the store counts them (JobStore::queue_stats): the same on
  /// every server of a shared store, for autoscalers. nullopt when the store cannot tell. Throws
  /// StoreUnavailable when the store fails.
  std::optional<QueueStats> queue_stats() const;

  /// queue_stats as `GET /metrics` shows them: counted at most once a second, and shared by every
  /// caller of this function and of render_metrics, so that what polls often (scrapers, the
  /// console's overview in each open tab, `GET /v1/models`) costs a shared store one count a second at most. A
  /// count that takes longer than 50 ms (a long backlog in a shared database) is kept 20 times as
  /// long as it took, at most a minute, so that counting takes at most a twentieth of the store's
  /// time. One caller counts at a time, with no lock held; the others meanwhile get the last
  /// count if it is under 10 s old (or twice the age above, if longer), else nullopt. A count
  /// that failed is not kept: the call that counted throws StoreUnavailable, and the next call
  /// counts again, or, after a failure that took longer than 50 ms (a statement timeout), once
  /// 20 times that has passed since the count began, at most a minute (nullopt meanwhile).
  /// nullopt also when the store cannot tell. What a count took is read on JobQueueOptions::clock:
  /// a clock stepped forward during a count counts the step (the count is then kept a minute at
  /// most).
  std::optional<QueueStats> recent_queue_stats() const;

  /// True once the model is ready (Model::ready) and its warm-up (Model::warm_up) has returned:
  /// `GET /v1/models` says `ready`, else `loading`.
  bool model_ready() const;

  /// The batch size and delay in force (from the options, else the model's preference).
  std::size_t max_batch_size() const;
  std::chrono::microseconds max_queue_delay() const;

  BatchStats batch_stats() const;

  /// The counters and histograms of this queue (see docs/operations.md).
  const Metrics& metrics() const;

  /// All metrics in the Prometheus text format, gauges included (what `GET /metrics` serves).
  /// The store's queue gauges (`rebound_queue_*`) are recent_queue_stats: counted at most once a
  /// second (longer when counting is slow), left out when there is no count to show.
  std::string render_metrics() const;

 private:
  friend class JobQueue;
  Telemetry(detail::Pipeline& core, const detail::WorkQueue<detail::WorkItem>& queue)
      : core_(core), queue_(queue) {}
  detail::Pipeline& core_;
  const detail::WorkQueue<detail::WorkItem>& queue_;
};

}  // namespace rebound
