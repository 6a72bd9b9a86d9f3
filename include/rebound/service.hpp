// Service: the whole pipeline without HTTP. Accepts jobs, runs them through the model on a
// JobQueue, records results in a JobStore and delivers callbacks with a CallbackSender.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include "rebound/delivery/callback_sender.hpp"
#include "rebound/job.hpp"
#include "rebound/log.hpp"
#include "rebound/metrics.hpp"
#include "rebound/model.hpp"
#include "rebound/service_observer.hpp"
#include "rebound/store/job_store.hpp"

namespace rebound {

template <typename Item>
class BasicJobQueue;

struct ServiceOptions {
  std::size_t workers = 4;  ///< batches run at once
  /// Jobs and invocations handed to `Model::predict_batch` at once; unset: the model's preference
  /// (`Model::batching()`), which defaults to 1 (no batching).
  std::optional<std::size_t> max_batch_size;
  /// Longest wait for a batch to fill; unset: the model's preference.
  std::optional<std::chrono::microseconds> max_queue_delay;
  /// A job still waiting this long after it was accepted is not run: it ends `expired` (error
  /// code "expired") and its callback says so, as SageMaker's RequestTTLSeconds. 0: no limit.
  /// Measured from `created_at`, so it holds across restarts with a durable store.
  std::chrono::milliseconds job_ttl{0};
  /// A batch whose model call has not returned after this long is answered at once: its jobs end
  /// `failed` with code "inference_timeout" (invocations get it too) and the late result is
  /// discarded. The model call itself cannot be interrupted, so its worker stays busy until it
  /// returns. 0: no limit.
  std::chrono::milliseconds inference_timeout{0};
  /// Work in memory at once, at most: jobs waiting for a worker or running, and callback
  /// attempts under way. A callback waiting for its next attempt is in the store, not in memory,
  /// and holds no slot. Submissions beyond it are refused with `queue_full`, so memory stays
  /// bounded however slow the model or the receivers are.
  std::size_t queue_capacity = 10000;
  CallbackSenderOptions delivery;
  /// While the store fails, how often a write for an accepted job (its outcome, its callback's
  /// end) is tried again. The job keeps its slot meanwhile, so nothing accepted is lost.
  std::chrono::milliseconds store_retry_interval{1000};
  /// How long a claim on work (a job to run, a callback attempt) lasts without renewal. Jobs are
  /// renewed every third of it while they wait or run; work whose server died is claimed by
  /// another (or by this one after a restart) once its lease runs out. Longer than the callback
  /// timeout, so that an attempt never outlives its lease.
  std::chrono::milliseconds lease{30000};
  /// How often the store is asked for due work that this server did not schedule itself (other
  /// servers' jobs, leases that ran out). Retries this server scheduled wake it on time.
  std::chrono::milliseconds poll_interval{1000};
  /// Callers of `wait_final` waiting at once, at most; beyond, `wait_final` answers at once.
  std::size_t max_waiting = 1024;
  /// The name of this server in lease holders (logs, the store). Empty: host name, process id and
  /// a random suffix.
  std::string server_id;
  /// The clock of every time the Service stores or compares (created_at, leases, next attempts,
  /// time-to-live). Tests inject one to move time on without sleeping; timers still wait in real
  /// time for the difference to the injected clock.
  std::function<std::chrono::system_clock::time_point()> clock = [] {
    return std::chrono::system_clock::now();
  };
  /// Where job events go (accepted, completed, expired, callback attempts, deliveries, give-ups,
  /// resumed jobs, store errors). The default logs nothing.
  Logger logger;
  /// More listeners to the pipeline's events, after the metrics and the log (see
  /// ServiceObserver: thread-safe, short, never called under a Service lock).
  std::vector<std::shared_ptr<ServiceObserver>> observers;
};

/// What `Service::submit` did.
enum class SubmitStatus {
  accepted,           ///< stored and queued; it will reach a final state
  duplicate,          ///< the same request was submitted before: nothing new was queued
  conflict,           ///< the id is taken by a different request
  queue_full,         ///< `queue_capacity` jobs are in flight; try again later
  not_ready,          ///< the model is not ready
  shutting_down,      ///< `shutdown` has begun
  store_unavailable,  ///< the JobStore failed (see Service::store_failure); nothing was accepted
};

/// Called once with the result of a synchronous invocation, on an inference thread.
using InvocationHandler = std::function<void(const Prediction&)>;

/// Counters of the batches run so far.
struct BatchStats {
  std::uint64_t batches = 0;  ///< predict_batch calls
  std::uint64_t items = 0;    ///< jobs and invocations in them
  std::size_t largest_batch = 0;
  std::uint64_t resumed = 0;  ///< jobs claimed from the store (at construction, or later)
};

/// What `Service::redeliver` did.
enum class RedeliverStatus {
  accepted,       ///< the callback is being delivered again, with a fresh attempt budget
  not_found,      ///< no job with that id
  not_failed,     ///< the job's callback is not `failed` (none, pending or delivered)
  queue_full,     ///< `queue_capacity` jobs are in flight; try again later
  shutting_down,  ///< `shutdown` has begun
};

/// What `Service::cancel` did.
enum class CancelStatus {
  cancelled,         ///< the job was queued or running; it is `cancelled` now
  not_found,         ///< no job with that id
  already_finished,  ///< the job was final already: nothing changed
};

/// The pipeline of docs/architecture.md, ready to put behind any front end (rebound::Server is
/// one).
///
/// Example:
///   boost::asio::thread_pool inference(4);
///   boost::asio::io_context io;  // run it on a thread of its own
///   rebound::Service service(inference.get_executor(), io.get_executor(),
///                            std::make_unique<rebound::EchoModel>(),
///                            std::make_unique<rebound::MemoryJobStore>(),
///                            std::make_unique<rebound::CurlTransport>(io.get_executor()));
///   service.submit({"job-1", "https://example.com/hook", {{"x", 1}}});
///
/// The store is the queue: a submission is stored and claimed with a lease by this server at
/// once; a callback's retry waits in the store until its `next_attempt_at`; a pump on the io
/// executor claims due work (callbacks, then jobs) as far as slots are free, at the times this
/// server scheduled and every `poll_interval` for the rest. Recovery is the same mechanism: the
/// first claims run in the constructor, so a durable store's unfinished work from an earlier run
/// (or a dead server's, once its leases run out) is taken over. Jobs not final run again; a final
/// job's callback goes on with its schedule. Delivery is at least once, so a job can run or be
/// called back twice across a crash, never zero times.
///
/// Executors: model inference runs on `inference_executor` (size its pool to `workers`); callback
/// timers and delivery bookkeeping run on `io_executor`. Both must outlive the Service and any
/// delivery still in flight.
/// Thread-safety: every method is thread-safe.
class Service final {
 public:
  Service(boost::asio::any_io_executor inference_executor, boost::asio::any_io_executor io_executor,
          std::unique_ptr<Model> model, std::unique_ptr<JobStore> store,
          std::unique_ptr<CallbackTransport> transport, ServiceOptions options = {});
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  /// Accepts a job: checks readiness and capacity, stores it, queues it. `job.created_at` is set
  /// here when it is left at its default.
  SubmitStatus submit(Job job);

  /// Runs one input through the model without storing it (SageMaker's `/invocations`): it joins
  /// the same queue and batches as jobs. `on_result` is called exactly once when the status is
  /// `accepted`, and never otherwise. Statuses as for `submit` (never duplicate or conflict).
  SubmitStatus invoke(nlohmann::json input, InvocationHandler on_result);

  /// The job's record, or nullopt for an unknown id. Throws StoreUnavailable when the store fails.
  std::optional<JobRecord> find(const std::string& id) const;

  /// Waits up to `timeout` for the job to become final, and returns its record as it is then
  /// (nullopt for an unknown id). A job this server finishes or cancels wakes the wait at once; one
  /// finished by another server on the same store is seen within a second. `waited` (optional)
  /// says whether it waited: not when `max_waiting` callers wait already, nor during shutdown,
  /// which wakes every wait. Throws StoreUnavailable when the store fails.
  std::optional<JobRecord> wait_final(const std::string& id, std::chrono::milliseconds timeout,
                                      bool* waited = nullptr);

  /// How many queued jobs run before the queued job `id` (JobStore::queue_position): nullopt
  /// when it is not queued or the store cannot tell. Throws StoreUnavailable when the store fails.
  std::optional<std::size_t> queue_position(const std::string& id) const;

  /// Cancels a job that is not final yet, on whichever server of the store it waits or runs: a
  /// queued job never runs; a running one is told through `rebound::cancellation_requested()`
  /// and its result is discarded. It ends `cancelled` (error code "cancelled"), and a callback
  /// that hears its end says so. Throws StoreUnavailable when the store fails.
  CancelStatus cancel(const std::string& id);

  /// Puts a job whose callback was given up back into delivery, with a fresh attempt budget and
  /// the same `webhook-id`. Attempt counts keep adding up in the job's record. Throws
  /// StoreUnavailable when the store fails.
  RedeliverStatus redeliver(const std::string& id);

  /// Jobs whose callback was given up, most recent first, at most `limit`. Throws
  /// StoreUnavailable when the store fails.
  std::vector<JobRecord> failed_callbacks(std::size_t limit) const;

  /// The callback receivers' origins the transport tracks: circuit state, failures, requests.
  std::vector<EndpointStatus> callback_endpoints() const;

  /// The "whpk_..." public keys that verify this server's Ed25519 (`v1a`) callback signatures
  /// (from `options.delivery.signing_secrets`), in order; empty when none signs that way.
  const std::vector<std::string>& webhook_public_keys() const;

  /// True while the model is ready, the store works and the service accepts work.
  bool ready() const;

  /// Why the job store cannot be used now (JobStore::failure), or nullopt while it works.
  std::optional<std::string> store_failure() const;

  /// Work in memory now: jobs and callback attempts (see ServiceOptions::queue_capacity).
  std::size_t in_flight() const;

  /// Jobs waiting for a worker now.
  std::size_t queue_depth() const;

  const Model& model() const;

  /// The batch size and delay in force (from the options, else the model's preference).
  std::size_t max_batch_size() const;
  std::chrono::microseconds max_queue_delay() const;

  BatchStats batch_stats() const;

  /// The counters and histograms of this Service (see docs/operations.md).
  const Metrics& metrics() const;

  /// All metrics in the Prometheus text format, gauges included (what `GET /metrics` serves).
  std::string render_metrics() const;

  /// Stops accepting jobs, then waits up to `timeout` for jobs in flight to finish, deliveries
  /// included. True when nothing was left in flight. At the deadline, jobs that have not started
  /// are taken off the queue and stay `queued` in the store (a durable store runs them on the
  /// next start; the memory store loses them); running inferences and deliveries go on.
  bool shutdown(std::chrono::steady_clock::duration timeout);

  struct Core;      // shared with deliveries in flight
  struct WorkItem;  // a job, or an invocation waiting for its result

 private:
  std::shared_ptr<Core> core_;
  std::unique_ptr<BasicJobQueue<WorkItem>> queue_;  // destroyed first: its workers use the core
};

}  // namespace rebound
