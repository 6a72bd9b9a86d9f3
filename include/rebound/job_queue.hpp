// JobQueue: the whole pipeline without HTTP. Accepts jobs, runs them through the model in batches,
// keeps them in a JobStore, delivers their callbacks, and hands results back in C++ through Asio
// completion tokens.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/system/error_code.hpp>
#include <nlohmann/json.hpp>

#include "rebound/delivery/callback_transport.hpp"
#include "rebound/detail/completion.hpp"
#include "rebound/errc.hpp"
#include "rebound/job.hpp"
#include "rebound/job_queue_options.hpp"
#include "rebound/job_queue_status.hpp"
#include "rebound/metrics.hpp"
#include "rebound/model.hpp"
#include "rebound/model_repository.hpp"
#include "rebound/operations.hpp"
#include "rebound/served_models.hpp"
#include "rebound/store/job_store.hpp"
#include "rebound/telemetry.hpp"
#include "rebound/tenant.hpp"

namespace rebound {

namespace detail {
struct Pipeline;
struct WorkItem;
template <typename Item>
class WorkQueue;
struct OwnedThreads;
struct FrontDoor;
struct Probe;
using TransportFactory = decltype(JobQueueOptions::transport);
using DefaultTransport = std::unique_ptr<CallbackTransport> (*)(boost::asio::any_io_executor io,
                                                                const AddressGuard& guard);
/// The transport a JobQueue uses when told none: rebound::http sets it to libcurl's as the
/// program starts (its library links with `--undefined=rebound_http_default_transport`, so the
/// registration is always linked in). Null on rebound::core alone. Thread-safe.
void set_default_transport(DefaultTransport make) noexcept;
DefaultTransport default_transport() noexcept;
}  // namespace detail

#if defined(REBOUND_HAS_HTTP)
}  // namespace rebound
// Registers libcurl's transport as the default (idempotent); defined in rebound::http.
extern "C" const void* rebound_http_default_transport();
namespace rebound::detail {
namespace {
// Every translation unit of a program on rebound::http registers the default as it starts, before
// its own globals: so a JobQueue built during static initialisation has it too, and the shared
// library is needed (a linker with --as-needed keeps it). Internal to each unit: no ODR issue.
[[maybe_unused]] const void* const http_default_transport_registered =
    rebound_http_default_transport();
}  // namespace
}  // namespace rebound::detail
namespace rebound {
#endif

/// The pipeline of docs/architecture.md, usable on its own or behind rebound::Server.
///
/// Example (the whole program; results come back through a future):
///   rebound::JobQueue queue(std::make_unique<rebound::EchoModel>());
///   rebound::JobRecord done =
///       queue.async_submit(rebound::make_job("job-1", {{"x", 1}}), boost::asio::use_future).get();
///   // done.status == JobStatus::succeeded, done.outcome.result == {"x": 1}
///
/// The same initiating functions take a plain handler `void(boost::system::error_code,
/// JobRecord)` or `boost::asio::use_awaitable` from a C++20 coroutine (examples/embedded).
///
/// Threads: the first constructor starts and owns them: a pool of `options.workers` threads for
/// the model, and one io thread for callbacks, timers and completions; the destructor drains
/// (`options.drain_on_destroy`) and joins them. The second constructor runs the model and the
/// callbacks on the executors you pass, which must outlive the queue. Both start one more thread,
/// the store pump, which claims due work from the store as far as slots are free, renews leases
/// and checks asynchronous waits for jobs held elsewhere; it runs on its own thread so that a slow
/// store never holds up the io executor.
///
/// The store is the queue: a submission is stored and claimed with a lease by this queue at once;
/// a callback's retry waits in the store until its `next_attempt_at`. Recovery is the same
/// mechanism: the first claims run in the constructor, so a durable store's unfinished work from
/// an earlier run (or a dead server's, once its leases run out) is taken over. Delivery is at
/// least once, so a job can run or be called back twice across a crash, never zero times.
///
/// Handlers of the asynchronous calls run on their associated executor, by default
/// `get_executor()` (the io thread): keep them short, or post the work elsewhere. Each is called
/// exactly once, also when the queue shuts down or is destroyed first (then with
/// errc::shutting_down).
///
/// Thread-safety: every method is thread-safe.
class JobQueue final {
 public:
  using executor_type = boost::asio::any_io_executor;

  /// A queue that owns its threads: `options.workers` inference threads and one io thread. A null
  /// `store` is a MemoryJobStore. Callbacks go through `options.transport`, else libcurl when the
  /// program links rebound::http, else nowhere (callback jobs are refused with no_transport).
  /// Throws rebound::Error for a missing model or an option out of range.
  explicit JobQueue(std::unique_ptr<Model> model, std::unique_ptr<JobStore> store = nullptr,
                    JobQueueOptions options = {});

  /// A queue that serves several models, or several versions of one (ModelRepository): each
  /// job runs on the version chosen when it was accepted, batches never mix versions. Throws
  /// rebound::Error for an empty repository or an option out of range. (The Model constructors
  /// are this one with a repository of one model, version "1".)
  explicit JobQueue(ModelRepository models, std::unique_ptr<JobStore> store = nullptr,
                    JobQueueOptions options = {});

  /// A queue on your executors: model inference on `inference_executor` (size its pool to
  /// `options.workers`), callback timers, deliveries and completions on `io_executor`. Both must
  /// outlive the queue and any delivery still in flight. A null `transport` refuses callback jobs.
  JobQueue(boost::asio::any_io_executor inference_executor,
           boost::asio::any_io_executor io_executor, std::unique_ptr<Model> model,
           std::unique_ptr<JobStore> store, std::unique_ptr<CallbackTransport> transport,
           JobQueueOptions options = {});
  /// The same, serving a ModelRepository.
  JobQueue(boost::asio::any_io_executor inference_executor,
           boost::asio::any_io_executor io_executor, ModelRepository models,
           std::unique_ptr<JobStore> store, std::unique_ptr<CallbackTransport> transport,
           JobQueueOptions options = {});

  /// Owning queue: drains for up to `drain_on_destroy`, completes every handler still waiting
  /// (errc::shutting_down), waits until they have run (at most 10 s), then stops and joins its
  /// threads; callback attempts still in flight are abandoned to their leases. Either queue: jobs
  /// not started stay `queued` in a durable store for the next start. A queue on your executors
  /// waits for the submissions under way, whose end a store that writes on its own thread
  /// (SQLite, PostgreSQL, Redis) posts to `io_executor`: destroy it while that executor runs,
  /// and not on its only thread.
  ~JobQueue();
  JobQueue(const JobQueue&) = delete;
  JobQueue& operator=(const JobQueue&) = delete;

  /// The executor handlers run on unless they name their own: the io executor.
  executor_type get_executor() const noexcept;

  /// Submits a job and completes when it is final and the store has its final state, with the
  /// job's record (status, result or error). Signature `void(boost::system::error_code,
  /// JobRecord)`, with the record as the store keeps it. A refusal completes at once with its
  /// rebound::errc (as `submit` refuses) and an empty record (a handler of `submit` reads which
  /// rule a job broke: `Submitted::field`). The same request submitted again
  /// never runs twice: it completes as `async_wait` for the first job does (so also with not_found
  /// if the job was pruned meanwhile, or too_many_waiters).
  ///
  /// Example:
  ///   queue.async_submit(job, [](boost::system::error_code ec, rebound::JobRecord r) {
  ///     if (!ec) std::cout << r.outcome.result << "\n";
  ///   });
  template <typename CompletionToken>
  auto async_submit(Job job, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(boost::system::error_code, JobRecord)>(
        [this](auto handler, Job j) {
          start_submit(std::move(j),
                       detail::Completion<JobRecord>(std::move(handler), get_executor(), live_));
        },
        token, std::move(job));
  }

  /// Completes when the job `job` names (an id, or {id, tenant}), accepted by this queue or by
  /// any other server on the same store, is final (as soon as it is read when it is already),
  /// with its record.
  /// errc::not_found for an unknown job. A job this queue finishes completes it at once; one
  /// finished elsewhere is seen by the store pump within `poll_interval` (no thread waits for it).
  /// The call itself never waits for the store: with a store whose reads wait
  /// (JobReadStore::reads_wait: SQLite, PostgreSQL, Redis) the wait is registered first and the
  /// job read once on the pump's thread (with the other waits begun meanwhile, 256 a call);
  /// errc::store_unavailable when that read fails (at once while the store is failing). Past
  /// `max_waiting` (or once the queue shuts down) a job final already is still answered with its
  /// record, an unknown one not_found, and a job not final errc::too_many_waiters
  /// (errc::shutting_down); beyond 4,096 such looks waiting for the pump at once, every refused
  /// wait gets its refusal without one. The memory store is read where this is called.
  template <typename CompletionToken>
  auto async_wait(JobRef job, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(boost::system::error_code, JobRecord)>(
        [this](auto handler, JobRef j) {
          start_wait(j, detail::Completion<JobRecord>(std::move(handler), get_executor(), live_));
        },
        token, std::move(job));
  }

  /// Runs one input through the model without storing it (SageMaker's `/invocations`), in the
  /// same queue and batches as jobs. Signature `void(boost::system::error_code, Prediction)`. The
  /// error code is for refusals (invalid_input, queue_full, not_ready, shutting_down), with a
  /// failed Prediction that says why (for invalid_input, what `Model::validate` said); a model
  /// that fails answers success with its failed Prediction, whatever its code.
  template <typename CompletionToken>
  auto async_invoke(nlohmann::json input, CompletionToken&& token) {
    return async_invoke(ModelRef{}, std::move(input), std::forward<CompletionToken>(token));
  }

  /// async_invoke on the version `model` names (ModelRef: an empty name is the default model, an
  /// empty version its default version); one this queue does not serve is refused with
  /// model_not_found or version_unavailable.
  template <typename CompletionToken>
  auto async_invoke(ModelRef model, nlohmann::json input, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken,
                                       void(boost::system::error_code, Prediction)>(
        [this](auto handler, ModelRef m, nlohmann::json in) {
          start_invoke(std::move(m), std::move(in),
                       detail::Completion<Prediction>(std::move(handler), get_executor(), live_));
        },
        token, std::move(model), std::move(input));
  }

  /// Accepts a job without waiting for its end, and completes once the store holds it (with a
  /// durable store: after it is written), or at once when it is refused (a refusal for room,
  /// queue_full or tenant_quota, once the store pump has looked the id up with a store whose
  /// reads wait: a resubmission of a stored job is a duplicate then). Signature
  /// `void(boost::system::error_code, Submitted)`: success for a job taken (`duplicate` when the
  /// same request came before: nothing new is queued), else the rebound::errc that refused it:
  /// invalid_job (the Job breaks a rule; `Submitted::field` and `reason` say which),
  /// invalid_input (`Model::validate` refused it), id_conflict, queue_full, tenant_quota,
  /// not_ready, store_unavailable, shutting_down, no_transport. `job.created_at` is set here when
  /// it is left at its default. Every rule a Job has over HTTP is checked here too, so C++ and
  /// HTTP refuse the same jobs.
  ///
  /// Fire and forget with `boost::asio::detached`; wait for the answer with `use_future` (a
  /// refusal throws boost::system::system_error); read the reason of a refusal with a handler:
  ///   queue.submit(rebound::make_job("job-1", {{"x", 1}}, "https://hooks.example.com/done"),
  ///                [](boost::system::error_code ec, const rebound::Submitted& s) {
  ///                  if (ec) std::cerr << ec.message() << ": " << s.reason.message << "\n";
  ///                });
  template <typename CompletionToken>
  auto submit(Job job, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(boost::system::error_code, Submitted)>(
        [this](auto handler, Job j) {
          start_accept(std::move(j),
                       detail::Completion<Submitted>(std::move(handler), get_executor(), live_));
        },
        token, std::move(job));
  }

  /// Accepts many jobs as `submit` would, in order, with one write to the store for them all
  /// (`JobStore::put_many`: one SQLite transaction, a few Redis round trips), and returns what
  /// each came to when the store has answered (this call waits for it). Each job is checked and
  /// admitted on its own: a full queue refuses the jobs it has no room for and takes the others.
  /// An id that came earlier in the call (in a valid job) is a duplicate (or id_conflict,
  /// another request) when that job was taken, and is refused as it was when it was refused for
  /// room or by the store; when that job was an id_conflict, the same request is too, and
  /// another is told by the stored job (a duplicate when it is the stored request, else
  /// id_conflict). When the store fails, every job that reached it is store_unavailable; some of
  /// them may be stored nonetheless (Redis, whose batches commit one by one), and submitting them
  /// again answers a duplicate.
  std::vector<Submitted> submit_many(std::vector<Job> jobs);

  /// The record of the job `job` names (an id, or {id, tenant}), or nullopt for an unknown job.
  /// Throws StoreUnavailable when the store fails.
  std::optional<JobRecord> find(const JobRef& job) const;

  /// Cancels a job that is not final yet, on whichever server of the store it waits or runs: a
  /// queued job never runs; a running one is told through `rebound::cancellation_requested()`
  /// and its result is discarded. It ends `cancelled` (error code "cancelled"), and a callback
  /// that hears its end says so. Returns success when it cancelled the job, errc::not_found for
  /// an unknown job, errc::already_final for a job that had ended, errc::store_unavailable when
  /// the store fails.
  [[nodiscard]] boost::system::error_code cancel(const JobRef& job);

  /// Puts a job whose callback was given up back into delivery, with a fresh attempt budget and
  /// the same `webhook-id`. Returns success when it is being delivered again, else
  /// errc::not_found, not_failed (its callback is none, pending or delivered), queue_full,
  /// tenant_quota, shutting_down, no_transport (this queue delivers no callbacks: another
  /// server of the store must) or store_unavailable.
  [[nodiscard]] boost::system::error_code redeliver(const JobRef& job);

  /// True while the model is ready and warmed up (Model::warm_up), the store works and the queue
  /// accepts work.
  bool ready() const;

  /// The default model's default version now (its route's `default_version`), held for the
  /// caller: hold it briefly, since an unload of that version waits for every holder. Null when
  /// it is not ready.
  std::shared_ptr<const Model> model() const;
  /// The models this queue serves now, changed live: versions loaded and unloaded, routes set
  /// (rebound/served_models.hpp).
  ServedModels& models() noexcept;
  const ServedModels& models() const noexcept;

  /// What operators and the operator console need: listings and their pages, dead letters,
  /// queue positions, receiver origins and their pause and resume, servers, keys, the address
  /// policy and the logger (rebound/operations.hpp).
  Operations& operations() noexcept { return *operations_; }
  const Operations& operations() const noexcept { return *operations_; }

  /// The numbers: metrics and their Prometheus text, slots in flight, bytes, depth, the store's
  /// queue statistics, batches (rebound/telemetry.hpp).
  const Telemetry& telemetry() const noexcept { return *telemetry_; }

  /// Stops accepting jobs, then waits up to `timeout` for jobs in flight to finish, deliveries
  /// included. True when nothing was left in flight. At the deadline, jobs that have not started
  /// are taken off the queue and stay `queued` in the store (a durable store runs them on the
  /// next start; the memory store loses them); running inferences and deliveries go on (see
  /// `abandon_running`).
  /// Asynchronous waits still registered complete with errc::shutting_down.
  /// Not from a handler on the queue's io executor: it waits for what runs there (deliveries, and
  /// the submissions whose store answers are posted there).
  bool shutdown(std::chrono::steady_clock::duration timeout);

  /// Ends a `shutdown` waiting on another thread at once, as if its deadline had passed (a second
  /// SIGTERM). Later shutdowns do not wait either.
  void end_drain();

  /// Gives up the running inferences, for a process that must end now (after `shutdown` returned
  /// false): `rebound::cancellation_requested()` turns true in their model calls, so that a model
  /// that polls it returns early; their results are discarded, and their jobs stay unfinished in
  /// the store with their leases ended (another server takes them at once; a durable store runs
  /// them on the next start; the memory store loses them). So for any batch that starts later.
  /// A model call that does not poll the flag still runs to its end. `Server::run_until_signal`
  /// calls it when the drain's deadline passes.
  void abandon_running();

 private:
  void build(boost::asio::any_io_executor inference_executor,
             boost::asio::any_io_executor io_executor, ModelRepository models,
             std::unique_ptr<JobStore> store, std::unique_ptr<CallbackTransport> transport,
             JobQueueOptions options);
  friend struct detail::FrontDoor;
  friend struct detail::Probe;
  boost::system::error_code redeliver_stored(const JobRef& job);
  void start_submit(Job job, detail::Completion<JobRecord> done);
  void start_accept(Job job, detail::Completion<Submitted> done);
  void start_wait(const JobRef& job, detail::Completion<JobRecord> done);
  void start_invoke(ModelRef model, nlohmann::json input, detail::Completion<Prediction> done);

  std::unique_ptr<detail::OwnedThreads> threads_;  // the owning constructor's; destroyed last
  // The handlers of asynchronous calls not yet run: the owning destructor waits for them.
  detail::LiveCount live_ = std::make_shared<std::atomic<long>>(0);
  std::shared_ptr<detail::Pipeline> core_;
  std::unique_ptr<detail::WorkQueue<detail::WorkItem>> queue_;  // destroyed first
  std::unique_ptr<Operations> operations_;
  std::unique_ptr<Telemetry> telemetry_;
  std::unique_ptr<ServedModels> served_;
  std::chrono::milliseconds drain_on_destroy_{0};
  std::atomic<bool> shut_down_{false};  // `shutdown` ran: the destructor does not drain again
};

}  // namespace rebound
