// JobQueue: the composition of the pipeline's parts (src/pipeline/) and the calls a front end
// makes. One job's walk: submit (validation, admission, the store's put with a claim) -> the
// queue -> BatchRunner (model, the store's acknowledgement) -> Delivery (attempts, recorded in the
// store); the StorePump claims what the store holds for this server beyond that.
#include "rebound/job_queue.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <future>
#include <limits>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "common/job_rules.hpp"
#include "pipeline/front_door.hpp"
#include "pipeline/intake.hpp"
#include "pipeline/pipeline.hpp"
#include "pipeline/probe.hpp"
#include "pipeline/work_queue.hpp"
#include "rebound/error.hpp"
#include "rebound/store/memory_job_store.hpp"
#include "rebound/tenant.hpp"

namespace rebound {
namespace detail {

/// The threads of a JobQueue built with the one-line constructor: the inference pool and one io
/// thread (callbacks, timers, completions), joined by `finish`.
struct OwnedThreads {
  explicit OwnedThreads(std::size_t workers) : inference(workers) {}

  ~OwnedThreads() { finish(std::atomic<long>(0)); }

  /// Joins the inference pool, then keeps the io loop running until every handler of the
  /// queue's asynchronous calls has run (`live` at 0: those a closing queue completed, and what
  /// they call in turn), for at most `io_grace`; then stops it. Timers of the transport (a
  /// breaker's cool-down, a retry) do not hold it. Safe to call twice.
  void finish(const std::atomic<long>& live) {
    if (finished) return;
    finished = true;
    inference.join();
    const auto deadline = std::chrono::steady_clock::now() + io_grace;
    while (live.load() > 0 && std::chrono::steady_clock::now() < deadline &&
           io_done.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) {
    }
    work.reset();
    io.stop();
    io_thread.join();
  }

  static constexpr std::chrono::seconds io_grace{10};

  boost::asio::thread_pool inference;
  boost::asio::io_context io{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::promise<void> io_ended;
  std::future<void> io_done = io_ended.get_future();
  // A handler that throws must not end the thread that every completion and callback runs on.
  std::thread io_thread{[this] {
    for (;;) {
      try {
        io.run();
        break;
      } catch (...) {
      }
    }
    io_ended.set_value();
  }};
  bool finished = false;
};

}  // namespace detail

namespace detail {
namespace {
std::atomic<DefaultTransport> registered_transport{nullptr};
}  // namespace

void set_default_transport(DefaultTransport make) noexcept {
  registered_transport.store(make);
}

DefaultTransport default_transport() noexcept {
  return registered_transport.load();
}
}  // namespace detail

JobQueue::JobQueue(std::unique_ptr<Model> model, std::unique_ptr<JobStore> store,
                   JobQueueOptions options)
    : JobQueue(model ? ModelRepository(std::move(model)) : ModelRepository(), std::move(store),
               std::move(options)) {}

JobQueue::JobQueue(ModelRepository models, std::unique_ptr<JobStore> store,
                   JobQueueOptions options) {
  if (options.workers == 0) throw Error("JobQueue: workers must be at least 1");
  threads_ = std::make_unique<detail::OwnedThreads>(options.workers);
  drain_on_destroy_ = options.drain_on_destroy;
  if (!options.transport) {
    if (const detail::DefaultTransport make = detail::default_transport()) options.transport = make;
  }
  try {
    build(threads_->inference.get_executor(), threads_->io.get_executor(), std::move(models),
          std::move(store), nullptr, std::move(options));
  } catch (...) {
    threads_->finish(*live_);
    throw;
  }
}

JobQueue::JobQueue(boost::asio::any_io_executor inference_executor,
                   boost::asio::any_io_executor io_executor, std::unique_ptr<Model> model,
                   std::unique_ptr<JobStore> store, std::unique_ptr<CallbackTransport> transport,
                   JobQueueOptions options)
    : JobQueue(std::move(inference_executor), std::move(io_executor),
               model ? ModelRepository(std::move(model)) : ModelRepository(), std::move(store),
               std::move(transport), std::move(options)) {}

JobQueue::JobQueue(boost::asio::any_io_executor inference_executor,
                   boost::asio::any_io_executor io_executor, ModelRepository models,
                   std::unique_ptr<JobStore> store, std::unique_ptr<CallbackTransport> transport,
                   JobQueueOptions options) {
  build(std::move(inference_executor), std::move(io_executor), std::move(models), std::move(store),
        std::move(transport), std::move(options));
}

void JobQueue::build(boost::asio::any_io_executor inference_executor,
                     boost::asio::any_io_executor io_executor, ModelRepository models,
                     std::unique_ptr<JobStore> store, std::unique_ptr<CallbackTransport> transport,
                     JobQueueOptions options) {
  // (Empty, it serves what its loader loads later: SageMaker's multi-model endpoints.)
  if (models.empty() && !models.loader()) {
    throw Error("JobQueue: a model is required (or a ModelRepository with a loader)");
  }
  if (!store) store = std::make_unique<MemoryJobStore>();
  if (options.queue_capacity == 0) throw Error("JobQueue: queue_capacity must be at least 1");
  if (options.workers == 0) throw Error("JobQueue: workers must be at least 1");
  if (options.job_ttl.count() < 0) throw Error("JobQueue: job_ttl must not be negative");
  if (options.inference_timeout.count() < 0) {
    throw Error("JobQueue: inference_timeout must not be negative");
  }
  if (options.store_retry_interval.count() <= 0) {
    throw Error("JobQueue: store_retry_interval must be positive");
  }
  // (Times are computed as now + lease in nanoseconds: a bound far from their range.)
  if (options.lease.count() <= 0 || options.lease > std::chrono::hours(24 * 366))
    throw Error("JobQueue: lease must be positive and at most a year");
  if (options.poll_interval.count() <= 0) throw Error("JobQueue: poll_interval must be positive");
  if (options.drain_on_destroy.count() < 0) {
    throw Error("JobQueue: drain_on_destroy must not be negative");
  }
  if (!options.clock) throw Error("JobQueue: a clock is required");
  AddressGuard guard(options.allow_private_callbacks, options.callback_allow);
  if (!transport && options.transport) transport = options.transport(io_executor, guard);
  const bool has_transport = transport != nullptr;
  // Every receiver origin gets its own limits and breaker, and what cannot go now waits in the
  // store (a deferral), not in memory.
  OriginGate* gate = nullptr;
  // The log (and the user's listener) hear when a receiver's circuit opens and closes; the
  // pipeline, built below, is handed over once it exists.
  auto pipeline = std::make_shared<std::weak_ptr<detail::Pipeline>>();
  if (transport) {
    OriginGateOptions gate_options = options.origins;
    // What waits in memory for one healthy origin is bounded by a share of the capacity (the rest
    // is deferred to the store at its pace), so that a slow receiver that never fails cannot take
    // every slot.
    if (gate_options.max_waiting_per_origin == std::numeric_limits<std::size_t>::max()) {
      gate_options.max_waiting_per_origin = std::max<std::size_t>(64, options.queue_capacity / 4);
    }
    gate_options.on_circuit = [pipeline, user = std::move(options.origins.on_circuit)](
                                  const std::string& origin, CircuitState state,
                                  std::size_t failures) {
      if (auto core = pipeline->lock())
        core->observe([&](auto& o) { o.on_circuit(origin, state, failures); });
      if (user) user(origin, state, failures);
    };
    auto gated = std::make_unique<OriginGate>(std::move(transport), std::move(gate_options));
    gate = gated.get();
    transport = std::move(gated);
  } else {
    transport = std::make_unique<detail::NoTransport>();
  }
  const std::chrono::milliseconds attempt_timeout = options.delivery.timeout;
  auto sender = std::make_unique<CallbackSender>(std::move(io_executor), std::move(transport),
                                                 std::move(options.delivery));
  // Parked slots belong to no tenant: with tenant shares, every accepted job is held in memory,
  // where the tenants take turns. At least a batch for every worker, or the workers would wait
  // on claims.
  // Batching as the default model's default version prefers it (every version's batches are
  // formed with the queue's one setting).
  // (A repository that starts empty, to be loaded live, batches as a Model does by default.)
  const Model* const first = models.find({});
  const BatchingPreference preferred = first ? first->batching() : BatchingPreference{};
  const std::size_t batch =
      std::max<std::size_t>(1, options.max_batch_size.value_or(preferred.max_batch_size));
  const std::size_t prefetch = options.tenant_share >= 1.0 && options.prefetch > 0
                                   ? std::max(options.prefetch, options.workers * batch)
                                   : 0;
  core_ = std::make_shared<detail::Pipeline>(std::move(models), std::move(store), std::move(sender),
                                             has_transport, gate, attempt_timeout, prefetch,
                                             std::move(guard), options);
  *pipeline = core_;
  detail::WorkQueueOptions queue_options;
  // The queue's own bound equals the admission bound, so an admitted item always fits.
  queue_options.capacity = options.queue_capacity;
  queue_options.workers = options.workers;
  queue_options.max_batch_size = options.max_batch_size.value_or(preferred.max_batch_size);
  queue_options.max_queue_delay = options.max_queue_delay.value_or(preferred.max_queue_delay);
  // Tenants take turns for the workers, each its weight's worth of jobs in a row.
  queue_options.default_weight = options.tenant_defaults.weight;
  for (const auto& [name, tenant] : options.tenants)
    queue_options.weights[name] = tenant.weight;
  // Batches never mix versions: a batch ends before the first item of another (its version's
  // entry in the model table, or null for one never served), unless the queue runs every job on
  // its one Model. Each batch taken is counted against its version until the batch runner is
  // done with it, so that a draining version is released only once nothing of it is left.
  detail::WorkQueue<detail::WorkItem>::BatchKey by_version;
  detail::WorkQueue<detail::WorkItem>::OnTaken taken;
  if (!core_->models.runs_every_job()) {
    // The version's Model: the one the item holds (no lookup), else the one loaded now.
    by_version = [core = core_.get()](const detail::WorkItem& item) -> const void* {
      return item.model ? item.model.get() : core->models.key_of(item.job.model);
    };
    taken = [core = core_.get()](std::vector<detail::WorkItem>& batch) {
      if (auto stats = core->models.stats_of(batch.front().job.model)) {
        stats->taken.fetch_add(batch.size(), std::memory_order_acq_rel);
        batch.front().taken_from = stats.get();  // (the table keeps it as long as it lives)
      }
    };
  }
  queue_ = std::make_unique<detail::WorkQueue<detail::WorkItem>>(
      std::move(inference_executor), queue_options,
      [core = core_](std::vector<detail::WorkItem> batch) {
        core->pump.note_taken();  // room in the prefetch: parked jobs are claimed now
        core->runner.run(std::move(batch));
      },
      std::move(by_version), std::move(taken));
  core_->models.set_queued(
      [queue = queue_.get()](const std::vector<const void*>& keys) {
        return queue->count_keys(keys);
      },
      [core = core_.get()] { return core->admission.parked(); });
  served_.reset(new ServedModels(core_->models, core_->sender->get_executor(), live_));
  // What the store holds from an earlier run (a durable store) or from servers gone: the first
  // claims happen here, so that they are counted when the constructor returns. A store that fails
  // now is retried by the pump. The pauses a shared store keeps hold before anything is sent.
  operations_.reset(new Operations(*core_));
  telemetry_.reset(new Telemetry(*core_, *queue_));
  core_->sync_pauses();
  // The models a shared store's fleet serves (routes, versions): followed from the first claim.
  core_->models.set_fleet(core_->job_store.get());
  core_->models.sync_fleet();
  core_->pump.set_skipped([core = core_.get()] { return core->models.not_served(); });
  // A model ready now is warmed up now (Model::warm_up), before the first claim.
  core_->readiness.start();
  // A shared store's wake-ups (PostgreSQL's NOTIFY): work another server left is claimed now, not
  // at the next poll.
  core_->work_watch.start(*core_->job_store, [core = core_.get()] { core->pump.wake_for_store(); });
  core_->pump.start(*queue_);
  core_->observe([&](auto& o) { o.on_metrics(&core_->metrics); });
}

JobQueue::~JobQueue() {
  // Drain (the owning constructor's promise), or at least answer the invocations still queued
  // and hand the leases of jobs not started back to the store.
  shutdown(threads_ && !shut_down_ ? drain_on_destroy_ : std::chrono::milliseconds(0));
  core_->complete_finals(detail::Pipeline::Reads::all);
  core_->async_waiters.close();
  core_->readiness.stop();  // a warm-up under way ends first (it wakes the pump when it does)
  core_->models.stop();     // so does a load under way; waiting loads and drains are answered
  core_->work_watch.end();
  core_->store.stop();
  core_->pump.stop();
  core_->end_pump_reads();  // the reads it had not made yet: answered shutting_down
  // The handlers still to run run now. The queue and the pipeline stay until then: a handler may
  // still call this queue (and is refused with shutting_down).
  // A store that answers on its own thread (Redis) posts the answers of the writes still out to
  // the io executor, which must stand until it has: the owned io_context (once its threads are
  // joined, nothing starts a write any more; the answers are dropped with it, unrun), or the
  // caller's, which outlives this queue.
  if (threads_) {
    threads_->finish(*live_);
    // The inference pool is joined: the io thread ran on after it (until finish stopped it), and
    // its handlers may have put work in the queue (a rerouted job) that can never run now.
    queue_->executor_ended();
  }
  core_->store.wait_answered();
  queue_.reset();  // waits for running batches (on the caller's executors)
  core_->observe([](auto& o) { o.on_metrics(nullptr); });
}

JobQueue::executor_type JobQueue::get_executor() const noexcept {
  return core_->sender->get_executor();
}

void detail::FrontDoor::submit(JobQueue& queue, Job job, SubmitAnswer answer) {
  if (!answer) throw Error("FrontDoor::submit: a handler is required");
  detail::submit_async_to(*queue.core_, *queue.queue_, std::move(job), std::move(answer),
                          /*rules_checked=*/true);
}

std::vector<Submitted> detail::FrontDoor::submit_many(JobQueue& queue, std::vector<Job> jobs) {
  return detail::submit_all_to(*queue.core_, *queue.queue_, jobs, /*rules_checked=*/true);
}

void JobQueue::start_accept(Job job, detail::Completion<Submitted> done) {
  // The answer may come on another thread (the store's); Completion is move-only.
  auto shared = std::make_shared<detail::Completion<Submitted>>(std::move(done));
  detail::submit_async_to(*core_, *queue_, std::move(job), [shared](const Submitted& verdict) {
    (*shared)(verdict.error, verdict);
  });
}

std::vector<Submitted> JobQueue::submit_many(std::vector<Job> jobs) {
  return detail::submit_all_to(*core_, *queue_, jobs);
}

void JobQueue::start_submit(Job job, detail::Completion<JobRecord> done) {
  const JobRef ref(job.id, job.tenant);
  // Held by the put under way (the answer may come on another thread, the store's); once the job
  // is taken, the queue's waits hold what is left of it.
  auto waiter = std::make_shared<detail::Completion<JobRecord>>(std::move(done));
  detail::submit_async_to(
      *core_, *queue_, std::move(job),
      [this, ref, waiter](const Submitted& verdict) {
        // The same request again: it completes with the first one's end, and never runs twice.
        if (verdict.duplicate) return start_wait(ref, std::move(*waiter));
        if (verdict.error) (*waiter)(verdict.error, JobRecord{});
        // Else the waiter waits for the job's end.
      },
      /*rules_checked=*/false, waiter);
}

void JobQueue::start_wait(const JobRef& job, detail::Completion<JobRecord> done) {
  if (!detail::is_valid_ref(job)) return done(errc::not_found, JobRecord{});
  const std::string id = key_of(job);
  if (core_->reads_on_pump) {
    // A store whose reads wait is not read here (this may be the io thread, or a store's thread
    // that answered a duplicate submission): the wait is registered first, then the pump looks
    // at the job once. An end from now on completes it, one before is in that look.
    std::uint64_t token = 0;
    errc refusal = errc::shutting_down;
    switch (core_->async_waiters.add(id, done, true, &token)) {
      case detail::AsyncWaiters::Added::added:
        return core_->check_wait(id, token);
      case detail::AsyncWaiters::Added::closed:
        break;
      case detail::AsyncWaiters::Added::full:
        refusal = errc::too_many_waiters;
        break;
    }
    // Refused a wait: a job final already (or unknown) is still answered as it is, from a look
    // on the pump too (within its bounds).
    if (!core_->take_look_up(id.size())) return done(refusal, JobRecord{});
    auto refused = std::make_shared<detail::Completion<JobRecord>>(std::move(done));
    return core_->read_on_pump(
        id, [core = core_.get(), bytes = id.size(), refused, refusal](
                boost::system::error_code ec, const std::optional<JobRecord>& record) {
          core->end_look_up(bytes);
          if (ec) return (*refused)(ec, JobRecord{});
          if (!record) return (*refused)(errc::not_found, JobRecord{});
          if (is_final(record->status)) return (*refused)({}, *record);
          (*refused)(refusal, JobRecord{});
        });
  }
  std::optional<JobRecord> record;
  try {
    record = core_->store.call("get", id, [&](const JobReadStore& s) { return s.get(id); });
  } catch (const StoreUnavailable&) {
    return done(errc::store_unavailable, JobRecord{});
  }
  if (!record) return done(errc::not_found, JobRecord{});
  if (is_final(record->status)) return done({}, std::move(*record));
  switch (core_->async_waiters.add(id, done, true)) {
    case detail::AsyncWaiters::Added::added:
      break;
    case detail::AsyncWaiters::Added::closed:
      return done(errc::shutting_down, JobRecord{});
    case detail::AsyncWaiters::Added::full:
      return done(errc::too_many_waiters, JobRecord{});
  }
  // It may have ended between the read above and the registration: look once more.
  core_->complete_from_store(id);
}

namespace {
// How old /metrics's count of the store's queue may be (Pipeline::metrics_stats): a second, or
// 20 times what the last count took if that is longer (a backlog of a million jobs takes a
// PostgreSQL store about half a second to count: counted once a second, that is half a core of
// the database a server), at most a minute. So counting takes at most a twentieth of the store's
// time a server however many scrape (for counts of up to 3 s; longer ones, once a minute).
std::chrono::system_clock::duration metrics_stats_max_age(
    std::chrono::system_clock::duration last_count_took) {
  constexpr std::chrono::system_clock::duration least = std::chrono::seconds(1);
  constexpr std::chrono::system_clock::duration most = std::chrono::minutes(1);
  constexpr int cost_factor = 20;
  if (last_count_took <= least / cost_factor) return least;
  if (last_count_took >= most / cost_factor) return most;
  return last_count_took * cost_factor;
}
// How old a count a scrape shows while another scrape is counting: 10 s, or twice the age above.
std::chrono::system_clock::duration metrics_stats_shown_while_counting(
    std::chrono::system_clock::duration max_age) {
  return std::max<std::chrono::system_clock::duration>(std::chrono::seconds(10), 2 * max_age);
}

// The handler of an async_invoke: answered once by the model, or, if its work item is dropped
// unanswered (a worker step that threw), with shutting_down as it goes.
struct InvokeReply {
  explicit InvokeReply(detail::Completion<Prediction> d) : done(std::move(d)) {}
  InvokeReply(const InvokeReply&) = delete;
  InvokeReply& operator=(const InvokeReply&) = delete;
  ~InvokeReply() {
    if (done) done(errc::shutting_down, Prediction::failure("shutting_down", "not answered"));
  }
  detail::Completion<Prediction> done;
};
}  // namespace

void JobQueue::start_invoke(ModelRef model, nlohmann::json input,
                            detail::Completion<Prediction> done) {
  auto shared = std::make_shared<InvokeReply>(std::move(done));
  const Submitted verdict = detail::FrontDoor::invoke(
      *this, std::move(input),
      [shared](boost::system::error_code ec, const Prediction& p) {
        // The model's answer, whatever its code (a model may fail with
        // any code it likes), or the queue's refusal at shutdown.
        shared->done(ec, p);
      },
      {}, std::move(model));
  if (!verdict.error) return;
  // A refusal: the Prediction says why too (the model's sentence for invalid_input, and which
  // model or version is not served).
  Prediction refused =
      verdict.error == errc::invalid_input || verdict.error == errc::model_not_found ||
              verdict.error == errc::version_unavailable
          ? Prediction::failure(verdict.reason.code, verdict.reason.message)
          : Prediction::failure(to_string(static_cast<errc>(verdict.error.value())),
                                verdict.error.message());
  shared->done(verdict.error, std::move(refused));
}

bool detail::Probe::quiesce(JobQueue& queue, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::steady_clock::duration::zero(),
                    deadline - std::chrono::steady_clock::now());
  };
  for (int round = 0; round < 2; ++round) {
    if (!queue.core_->pump.pass_now(left())) return false;
    if (!queue.queue_->wait_idle(left())) return false;
    if (!queue.core_->admission.wait_idle(left())) return false;
    if (!queue.core_->sender->wait_idle(left())) return false;  // `started` callbacks too
    auto ran = std::make_shared<std::promise<void>>();
    std::future<void> done = ran->get_future();
    boost::asio::post(queue.get_executor(), [ran] { ran->set_value(); });
    if (done.wait_for(left()) != std::future_status::ready) return false;
  }
  return true;
}

bool detail::Probe::pump_pass(JobQueue& queue, std::chrono::milliseconds timeout) {
  return queue.core_->pump.pass_now(timeout);
}

void JobQueue::end_drain() {
  core_->admission.end_wait();
}

const AddressGuard& Operations::callback_guard() const {
  return core_.guard;
}

bool Operations::delivers_callbacks() const {
  return core_.delivers_callbacks;
}

Submitted detail::FrontDoor::choose_model(JobQueue& queue, ModelRef& model,
                                          const std::string& tenant) {
  Submitted refusal;
  detail::choose_model(*queue.core_, model, tenant, {}, refusal);
  return refusal;
}

Submitted detail::FrontDoor::invoke(JobQueue& queue, nlohmann::json input, InvokeAnswer on_result,
                                    const std::string& tenant, ModelRef model_ref) {
  if (!on_result) throw Error("FrontDoor::invoke: a result handler is required");
  detail::Pipeline& core = *queue.core_;
  const Submitted verdict = [&] {
    Submitted refusal;
    const std::shared_ptr<Model> model = detail::choose_model(core, model_ref, tenant, {}, refusal);
    if (!model) return refusal;
    if (auto invalid = detail::validate(*model, input)) {
      Submitted s = detail::refused(errc::invalid_input);
      s.reason = std::move(*invalid);
      s.field = "input";
      return s;
    }
    Job job;
    job.input = std::move(input);
    job.model = std::move(model_ref);  // the version that runs it (the batch runner's choice)
    const std::size_t bytes = detail::work_bytes(job);
    // The caller's tenant's rate, share and turn hold for its invocations as for its jobs.
    if (!core.rates.take(tenant, core.clock())) return detail::refused(errc::tenant_rate);
    auto entered = core.admission.enter();
    if (const auto admitted = core.admission.admit(tenant, bytes)) {
      core.rates.give_back(tenant);
      return detail::refused(admitted);
    }
    // Synchronous invocations queue at the default priority, beside jobs submitted without one.
    // (The item holds its version: a drain of it waits for the invocation.)
    queue.queue_->try_push(detail::WorkItem{std::move(job), std::move(on_result),
                                            detail::Claim::slot(core.admission, tenant, bytes),
                                            std::chrono::steady_clock::now(), model},
                           default_priority, tenant);
    return detail::taken();
  }();
  if (verdict.error) core.observe_submission(verdict, {}, false);
  return verdict;
}

std::size_t Telemetry::max_batch_size() const {
  return queue_.options().max_batch_size;
}

std::chrono::microseconds Telemetry::max_queue_delay() const {
  return queue_.options().max_queue_delay;
}

std::string Telemetry::render_metrics() const {
  std::string out =
      core_.metrics.render(queue_depth(), core_.admission.in_flight(), core_.sender->in_flight());
  // The breakers, by state, from what the transport tracks now.
  std::size_t by_state[3] = {0, 0, 0};
  for (const EndpointStatus& e : core_.sender->endpoints())
    ++by_state[static_cast<int>(e.state)];
  out +=
      "# HELP rebound_callback_endpoints Receiver origins tracked by the transport, by circuit "
      "state.\n# TYPE rebound_callback_endpoints gauge\n";
  for (const CircuitState state :
       {CircuitState::closed, CircuitState::open, CircuitState::half_open}) {
    out += std::string("rebound_callback_endpoints{state=\"") + to_string(state) + "\"} " +
           std::to_string(by_state[static_cast<int>(state)]) + "\n";
  }
  out +=
      "# HELP rebound_work_bytes Bytes the work in memory holds (inputs as parsed, callback "
      "bodies), of JobQueueOptions::max_work_bytes.\n# TYPE rebound_work_bytes gauge\n"
      "rebound_work_bytes " +
      std::to_string(core_.admission.bytes()) +
      "\n# HELP rebound_work_bytes_limit JobQueueOptions::max_work_bytes (--max-work-mib).\n"
      "# TYPE rebound_work_bytes_limit gauge\nrebound_work_bytes_limit " +
      std::to_string(core_.admission.max_bytes()) + "\n";
  out += core_.models.metrics_text();
  // The store's own counters (in memory: no call to the database).
  for (const StoreCounter& c : core_.job_store->counters()) {
    const std::string name = "rebound_store_" + c.name;
    out += "# HELP " + name + " " + c.help + "\n# TYPE " + name + " counter\n" + name + " " +
           std::to_string(c.value) + "\n";
  }
  // The whole queue, as the store counts it: the same on every server of a shared store (for
  // an autoscaler: take the max over servers, not the sum). Left out while the store fails.
  std::optional<QueueStats> stats;
  try {
    stats = recent_queue_stats();
  } catch (...) {  // (whatever it was: recent_queue_stats says when the next count is)
  }
  if (stats) {
    out +=
        "# HELP rebound_queue_jobs The store's jobs not final, by state (every server of a "
        "shared store reports the same).\n# TYPE rebound_queue_jobs gauge\n"
        "rebound_queue_jobs{state=\"queued\"} " +
        std::to_string(stats->queued) + "\nrebound_queue_jobs{state=\"running\"} " +
        std::to_string(stats->running) +
        "\n# HELP rebound_queue_queued The store's queued jobs by priority.\n"
        "# TYPE rebound_queue_queued gauge\n";
    for (const auto& [priority, n] : stats->queued_by_priority)
      out += "rebound_queue_queued{priority=\"" + std::to_string(priority) + "\"} " +
             std::to_string(n) + "\n";
    const double oldest =
        stats->oldest_queued
            ? std::max(0.0,
                       std::chrono::duration<double>(core_.clock() - *stats->oldest_queued).count())
            : 0.0;
    char text[32];
    std::snprintf(text, sizeof text, "%.3f", oldest);
    out += std::string(
               "# HELP rebound_queue_oldest_queued_seconds Age of the store's oldest queued job "
               "(0: none).\n# TYPE rebound_queue_oldest_queued_seconds gauge\n"
               "rebound_queue_oldest_queued_seconds ") +
           text +
           "\n# HELP rebound_queue_callbacks_waiting Callbacks the store owes: due, retrying or "
           "under way.\n# TYPE rebound_queue_callbacks_waiting gauge\n"
           "rebound_queue_callbacks_waiting " +
           std::to_string(stats->callbacks_waiting) + "\n";
  }
  return out;
}

std::vector<EndpointStatus> Operations::callback_endpoints() const {
  return core_.sender->endpoints();
}

std::string Operations::pause_origin(const std::string& origin) {
  if (!core_.gate) throw Error("Operations::pause_origin: this queue delivers no callbacks");
  const std::string key = OriginGate::origin_of(origin);
  if (key.empty()) throw Error("Operations::pause_origin: not an http(s) URL or origin: " + origin);
  // In the store first (a shared store holds it for every server), then here at once.
  const bool kept = core_.store.call("set_origin_paused", {},
                                     [&](FleetStore& s) { return s.set_origin_paused(key, true); });
  if (!kept) {
    throw Error(
        "Operations::pause_origin: the store keeps as many paused origins as it will; "
        "resume some first");
  }
  core_.gate->pause(key);
  core_.observe([&](auto& o) { o.on_origin_paused(key, true); });
  return key;
}

bool Operations::resume_origin(const std::string& origin) {
  if (!core_.gate) return false;
  const std::string key = OriginGate::origin_of(origin);
  if (key.empty()) return false;
  core_.store.call("set_origin_paused", {}, [&](FleetStore& s) {
    s.set_origin_paused(key, false);
    return true;
  });
  if (!core_.gate->resume(key)) return false;
  core_.observe([&](auto& o) { o.on_origin_paused(key, false); });
  return true;
}

std::vector<std::string> Operations::paused_origins() const {
  return core_.gate ? core_.gate->paused() : std::vector<std::string>{};
}

const std::vector<std::string>& Operations::webhook_public_keys() const {
  return core_.sender->public_keys();
}

std::vector<std::string> Operations::webhook_signing_keys(const std::string& tenant) const {
  return core_.sender->signing_keys_for(tenant);
}

std::vector<std::string> Operations::webhook_public_keys(const std::string& tenant) const {
  return core_.sender->public_keys_for(tenant);
}

const Metrics& Telemetry::metrics() const {
  return core_.metrics;
}

BatchStats Telemetry::batch_stats() const {
  BatchStats stats = core_.runner.stats();
  stats.resumed = core_.pump.resumed();
  return stats;
}

boost::system::error_code JobQueue::redeliver(const JobRef& job) {
  try {
    return redeliver_stored(job);
  } catch (const StoreUnavailable&) {
    return errc::store_unavailable;
  }
}

boost::system::error_code JobQueue::redeliver_stored(const JobRef& job) {
  if (!core_->admission.accepting()) return errc::shutting_down;
  if (!core_->delivers_callbacks) return errc::no_transport;
  if (!detail::is_valid_ref(job)) return errc::not_found;
  const std::string id = key_of(job);
  if (const auto slot = core_->admission.take_slot_within_share(job.tenant)) {
    // Still tell an unknown id or a callback that is not failed apart from a full queue.
    auto record = core_->store.call("get", id, [&](const JobReadStore& s) { return s.get(id); });
    if (!record) return errc::not_found;
    if (record->callback.state != CallbackState::failed) return errc::not_failed;
    return slot;
  }
  detail::Claim claim = detail::Claim::slot(core_->admission, job.tenant);  // freed on all ways
  const Lease lease = core_->leases.from_now(core_->leases.next_holder());
  // The store moves failed -> pending atomically: of two redeliveries at once (on this server
  // or another), one wins and the other answers not_failed.
  const RedeliverOutcome outcome = core_->store.call(
      "redeliver", id, [&](JobLeaseStore& s) { return s.redeliver(id, lease, core_->clock()); });
  std::optional<JobRecord> record;
  if (outcome == RedeliverOutcome::redelivered) {
    // (When this read fails the answer is store_unavailable although the store redelivered it:
    // its lease runs out unheld and a pump delivers it then; a retry is told not_failed.)
    record = core_->store.call("get", id, [&](const JobReadStore& s) { return s.get(id); });
  }
  if (outcome != RedeliverOutcome::redelivered || !record) {  // no record: pruned meanwhile
    return outcome == RedeliverOutcome::not_failed ? errc::not_failed : errc::not_found;
  }
  core_->observe([&](auto& o) { o.on_redelivery(id, record->callback.attempts); });
  core_->delivery.attempt(*record, lease.holder, std::move(claim));
  return {};
}

boost::system::error_code JobQueue::cancel(const JobRef& job) {
  if (!detail::is_valid_ref(job)) return errc::not_found;
  const std::string id = key_of(job);
  const auto now = core_->clock();
  const JobOutcome outcome{JobStatus::cancelled, nullptr,
                           ErrorInfo{"cancelled", "The job was cancelled before it finished."},
                           now};
  CancelOutcome result;
  try {
    result = core_->store.call("cancel", id,
                               [&](JobLeaseStore& s) { return s.cancel(id, outcome, now); });
  } catch (const StoreUnavailable&) {
    return errc::store_unavailable;
  }
  switch (result) {
    case CancelOutcome::not_found:
      return errc::not_found;
    case CancelOutcome::already_finished:
      return errc::already_final;
    case CancelOutcome::cancelled:
      break;
  }
  // Held here: a queued job is dropped when a worker takes it, a running one is told through the
  // model's cancellation flag. Held by another server: its next renewal is refused and it does
  // the same (within a third of a lease).
  if (auto holder = core_->leases.job_holder_of(id)) {
    core_->runner.revoke(id, *holder, true);
  } else {
    // Perhaps claimed here a moment ago (a submission still on its way to the queue, a claim of
    // the pump): noted for long enough that the sweep meets it if it waits in the queue.
    core_->runner.cancelled_unheld(
        id, std::max(core_->leases.duration(), std::chrono::milliseconds(5000)));
  }
  core_->observe([&](auto& o) { o.on_cancelled(id); });
  if (!core_->async_waiters.empty()) core_->complete_from_store(id);
  // Its callback ("cancelled") is due now, in the store.
  core_->pump.wake(now);
  return {};
}

JobPage Operations::failed_callbacks_page(const std::string& tenant,
                                          const std::optional<ListCursor>& after,
                                          std::size_t limit) const {
  const std::string prefix = tenant.empty() ? std::string() : tenant + "/";
  return core_.store.call("list_failed_callbacks", {}, [&](const JobReadStore& s) {
    return s.failed_callbacks_page(prefix, after, limit);
  });
}

JobPage Operations::list_jobs(const JobFilter& filter, const std::optional<ListCursor>& after,
                              std::size_t limit) const {
  return core_.store.call("list_jobs", {},
                          [&](const JobReadStore& s) { return s.list_jobs(filter, after, limit); });
}

std::vector<ServerSeen> Operations::servers() const {
  const auto now = core_.clock();
  auto seen = core_.store.call("servers", {}, [&](const FleetStore& s) { return s.servers(now); });
  // Before its first report (every third of a lease), this server is still one of them.
  const std::string& me = server_id();
  if (std::none_of(seen.begin(), seen.end(), [&](const ServerSeen& s) { return s.id == me; }))
    seen.insert(seen.begin(), ServerSeen{me, now, 0});
  return seen;
}

const Logger& Operations::logger() const {
  return core_.logger;
}

const std::string& Operations::server_id() const {
  return core_.leases.server_id();
}

std::vector<JobRecord> Operations::failed_callbacks(std::size_t limit) const {
  return core_.store.call("list_failed_callbacks", {},
                          [&](const JobReadStore& s) { return s.list_failed_callbacks(limit); });
}

std::optional<JobRecord> JobQueue::find(const JobRef& job) const {
  if (!detail::is_valid_ref(job)) return std::nullopt;  // no key of another job's
  const std::string id = key_of(job);
  return core_->store.call("get", id, [&](const JobReadStore& s) { return s.get(id); });
}

std::optional<std::size_t> Operations::queue_position(const JobRef& job) const {
  if (!detail::is_valid_ref(job)) return std::nullopt;
  const std::string id = key_of(job);
  return core_.store.call("queue_position", id,
                          [&](const JobReadStore& s) { return s.queue_position(id); });
}

std::optional<std::string> Telemetry::store_failure() const {
  return core_.store.failure();
}

bool JobQueue::ready() const {
  return core_->admission.open() && !core_->store.failure();
}

bool Telemetry::model_ready() const {
  // (A queue that stopped taking work starts no warm-up for a model that got ready since.)
  return core_.admission.accepting() ? core_.readiness.ready() : core_.readiness.warmed();
}

std::size_t Telemetry::in_flight() const {
  return core_.admission.in_flight();
}

std::size_t Telemetry::work_bytes() const {
  return core_.admission.bytes();
}

// At most a second old, or 20 times what the last count took (metrics_stats_max_age): a call
// within that of the last count gets that count; GET /v1/stats and Telemetry::queue_stats count
// each time. One call counts at a time, with no lock held (the store's hooks may run meanwhile,
// and a slow store holds up that call only): one that comes while another counts gets the last
// count if it is less than 10 s old (or twice that age, if longer: a store that hangs in the count
// does not freeze the gauges), else none. A count that failed is not kept: the next call counts
// again, unless the failed one took longer than 50 ms (a count cut by the store's statement
// timeout), which holds off the next as a kept one would, with none shown meanwhile.
std::optional<QueueStats> Telemetry::recent_queue_stats() const {
  std::optional<QueueStats> stats;
  std::chrono::system_clock::time_point counted_at;
  {
    std::lock_guard<std::mutex> lock(core_.metrics_stats_mutex);
    counted_at = core_.clock();
    const auto within = [&](const std::optional<std::chrono::system_clock::time_point>& at,
                            std::chrono::system_clock::duration age) {
      return at && counted_at >= *at && counted_at - *at < age;
    };
    const auto& at = core_.metrics_stats_at;
    const auto max_age = metrics_stats_max_age(core_.metrics_stats_took);
    if (within(at, max_age)) return core_.metrics_stats;
    if (core_.metrics_stats_counting) {
      if (within(at, metrics_stats_shown_while_counting(max_age))) return core_.metrics_stats;
      return std::nullopt;
    }
    if (within(core_.metrics_stats_failed_at, max_age)) return std::nullopt;
    core_.metrics_stats_counting = true;
  }
  std::exception_ptr failure;
  try {
    stats = queue_stats();
  } catch (...) {  // (whatever it was: rethrown once the state below is kept)
    failure = std::current_exception();
  }
  // What the count took, on the same clock: one stepped back while counting took nothing (one
  // stepped forward took the step: kept a minute at most). (A clock that throws fails the count,
  // and leaves no scrape counting for good.)
  std::chrono::system_clock::duration took{};
  try {
    took = std::max(core_.clock() - counted_at, std::chrono::system_clock::duration{});
  } catch (...) {
    if (!failure) failure = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(core_.metrics_stats_mutex);
    core_.metrics_stats_counting = false;
    core_.metrics_stats = stats;
    core_.metrics_stats_took = took;
    if (!failure) {
      core_.metrics_stats_at = counted_at;
      core_.metrics_stats_failed_at.reset();
    } else {
      core_.metrics_stats_at.reset();
      if (metrics_stats_max_age(took) > metrics_stats_max_age({}))
        core_.metrics_stats_failed_at = counted_at;
      else
        core_.metrics_stats_failed_at.reset();
    }
  }
  if (failure) std::rethrow_exception(failure);
  return stats;
}

std::optional<QueueStats> Telemetry::queue_stats() const {
  return core_.store.call("queue_stats", {}, [](const JobReadStore& s) { return s.queue_stats(); });
}

std::size_t Telemetry::queue_depth() const {
  return queue_.depth() + core_.admission.parked();
}

std::shared_ptr<const Model> JobQueue::model() const {
  return core_->models.default_of({});
}

ServedModels& JobQueue::models() noexcept {
  return *served_;
}

const ServedModels& JobQueue::models() const noexcept {
  return *served_;
}

std::vector<ModelInfo> ServedModels::list() const {
  return table_.list();
}

std::optional<ModelInfo> ServedModels::find(const std::string& name) const {
  return table_.find(name);
}

std::string ServedModels::default_model() const {
  return table_.default_model();
}

boost::system::error_code ServedModels::set_route(const std::string& name, ModelRoute route,
                                                  std::uint64_t if_generation, ModelInfo* out) {
  return table_.set_route(name, std::move(route), if_generation, out);
}

void ServedModels::start_load(std::string name, std::string version,
                              detail::Completion<ModelInfo> done) {
  table_.load(name, version, std::move(done));
}

void ServedModels::start_unload_model(std::string name, detail::Completion<ModelInfo> done) {
  table_.unload_model(name, std::move(done));
}

bool ServedModels::loads() const {
  return table_.loads();
}

void ServedModels::start_unload(std::string name, std::string version, QueuedJobs queued,
                                detail::Completion<ModelInfo> done) {
  table_.unload(name, version, queued == QueuedJobs::reroute, std::move(done));
}

void JobQueue::abandon_running() {
  core_->runner.abandon_running();
}

bool JobQueue::shutdown(std::chrono::steady_clock::duration timeout) {
  shut_down_ = true;
  core_->admission.close();  // (and no warm-up starts: the pump and submissions look no more)
  const auto started = std::chrono::steady_clock::now();
  // Jobs parked in the store (JobQueueOptions::prefetch) run too while the time lasts: the pump
  // claims them into the queue as it drains (JobQueue's handler wakes it), and the queue stays
  // open for them until none is parked.
  bool left_parked = false;
  if (core_->admission.parked() > 0) {
    core_->pump.wake(core_->clock());
    core_->admission.wait_unparked(timeout);
    // What is still parked stays queued in the store (for the next start, or other servers).
    left_parked = core_->admission.drop_parked(core_->admission.parked()) > 0;
  }
  // The pump's pass under way queues what it claimed before the queue closes to it.
  core_->pump.barrier();
  queue_->close();
  const auto spent = std::chrono::steady_clock::now() - started;
  if (core_->admission.wait_idle(timeout > spent ? timeout - spent
                                                 : std::chrono::steady_clock::duration::zero()) &&
      !left_parked) {
    core_->complete_finals(detail::Pipeline::Reads::all);
    core_->async_waiters.close();
    return true;
  }
  // The deadline passed: jobs that never started stay as they are in the store (queued), and
  // their slots are freed so that the running ones can end the process promptly. Invocations
  // still waiting are answered that the server is stopping.
  for (auto& item : queue_->take_pending()) {
    if (item.reply) {
      try {
        item.reply(errc::shutting_down,
                   Prediction::failure("shutting_down", "the server is shutting down"));
      } catch (...) {
      }
    }
    // A job's lease ends now, so that another server may take it at once; the slot is freed.
    item.claim.hand_back(core_->store, "renew");
  }
  // Jobs not final now end elsewhere (a later start, another server): their waits end here.
  core_->complete_finals(detail::Pipeline::Reads::all);
  core_->async_waiters.close();
  return false;
}

}  // namespace rebound
