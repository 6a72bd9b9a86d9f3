// Service: the composition of the pipeline's parts (src/service/) and the calls a front end
// makes. One job's walk: submit (admission, the store's put with a claim) -> the queue ->
// BatchRunner (model, the store's acknowledgement) -> Delivery (attempts, recorded in the store);
// the StorePump claims what the store holds for this server beyond that.
#include "rebound/service.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>

#include "rebound/detail/job_queue.hpp"
#include "rebound/error.hpp"
#include "service/admission.hpp"
#include "service/batch_runner.hpp"
#include "service/delivery.hpp"
#include "service/final_waiters.hpp"
#include "service/leases.hpp"
#include "service/observers.hpp"
#include "service/store_access.hpp"
#include "service/store_pump.hpp"
#include "service/work_item.hpp"

namespace rebound {
namespace {

// A name for this server that no other server on the same store shares.
std::string default_server_id() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::random_device random;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "%08x", random());
  return std::string(host[0] ? host : "rebound") + "-" + std::to_string(::getpid()) + "-" + suffix;
}

}  // namespace

// The parts, in the order they are built: each is handed those above it. Admission and Delivery
// also wake the pump (below them) through a lambda, which runs only once the Core is built.
// Shared with the work in flight (deliveries, watchdogs, writes being retried), which keeps it
// alive through the owner Delivery and BatchRunner are given.
struct Service::Core {
  Core(std::unique_ptr<Model> model_in, std::unique_ptr<JobStore> store_in,
       std::unique_ptr<CallbackSender> sender_in, ServiceOptions& options)
      : model(std::move(model_in)),
        job_store(std::move(store_in)),
        sender(std::move(sender_in)),
        clock(options.clock),
        store(*job_store, observe, sender->get_executor(), options.store_retry_interval),
        admission(options.queue_capacity, *model,
                  [this] {
                    // Work may be waiting in the store for a free slot: look now.
                    if (!store.stopped()) pump.wake(clock());
                  }),
        leases(options.server_id.empty() ? default_server_id() : options.server_id, options.lease,
               clock),
        delivery(*sender, store, leases, admission, observe, clock,
                 [this](std::chrono::system_clock::time_point at) { pump.wake(at); }),
        pump(
            store, admission, leases, delivery, observe, clock, options.poll_interval,
            [this](const std::string& id, const std::string& holder) {
              // Cancelled, or claimed by another: a waiting job is not run, a running one is
              // told to stop.
              runner.revoke(id, holder, true);
            },
            [this](detail::StorePump::Queue& queue) { runner.sweep(queue); }),
        runner(*model, store, leases, delivery, admission, observe, clock, sender->get_executor(),
               options.job_ttl, options.inference_timeout),
        waiters(options.max_waiting) {
    runner.set_on_final([this](const std::string& id) { waiters.notify(id); });
    observe.log = detail::LogObserver(options.logger);
    observe.user = std::move(options.observers);
  }

  std::unique_ptr<Model> model;
  std::unique_ptr<JobStore> job_store;
  std::unique_ptr<CallbackSender> sender;
  detail::Clock clock;
  Metrics metrics;
  detail::Observers observe{metrics};
  detail::StoreAccess store;
  detail::Admission admission;
  detail::Leases leases;
  detail::Delivery delivery;
  detail::StorePump pump;
  detail::BatchRunner runner;
  detail::FinalWaiters waiters;

  // Tells the observers how a submission (or, without an id, an invocation) was answered; called
  // outside every lock.
  void observe_submission(SubmitStatus status, const std::string& id, bool has_callback) {
    switch (status) {
      case SubmitStatus::accepted:
        if (!id.empty()) observe([&](auto& o) { o.on_accepted(id, has_callback); });
        break;
      case SubmitStatus::queue_full:
        observe([](auto& o) { o.on_refused(Refusal::queue_full); });
        break;
      case SubmitStatus::not_ready:
        observe([](auto& o) { o.on_refused(Refusal::not_ready); });
        break;
      case SubmitStatus::store_unavailable:
        observe([](auto& o) { o.on_refused(Refusal::store_unavailable); });
        break;
      default:
        break;
    }
  }
};

Service::Service(boost::asio::any_io_executor inference_executor,
                 boost::asio::any_io_executor io_executor, std::unique_ptr<Model> model,
                 std::unique_ptr<JobStore> store, std::unique_ptr<CallbackTransport> transport,
                 ServiceOptions options) {
  if (!model) throw Error("Service: a model is required");
  if (!store) throw Error("Service: a job store is required");
  if (options.queue_capacity == 0) throw Error("Service: queue_capacity must be at least 1");
  if (options.job_ttl.count() < 0) throw Error("Service: job_ttl must not be negative");
  if (options.inference_timeout.count() < 0) {
    throw Error("Service: inference_timeout must not be negative");
  }
  if (options.store_retry_interval.count() <= 0) {
    throw Error("Service: store_retry_interval must be positive");
  }
  if (options.lease.count() <= 0) throw Error("Service: lease must be positive");
  if (options.poll_interval.count() <= 0) throw Error("Service: poll_interval must be positive");
  if (!options.clock) throw Error("Service: a clock is required");
  auto sender = std::make_unique<CallbackSender>(std::move(io_executor), std::move(transport),
                                                 std::move(options.delivery));
  core_ = std::make_shared<Core>(std::move(model), std::move(store), std::move(sender), options);
  core_->delivery.set_owner(core_);
  core_->runner.set_owner(core_);
  const BatchingPreference preferred = core_->model->batching();
  JobQueueOptions queue_options;
  // The queue's own bound equals the admission bound, so an admitted item always fits.
  queue_options.capacity = options.queue_capacity;
  queue_options.workers = options.workers;
  queue_options.max_batch_size = options.max_batch_size.value_or(preferred.max_batch_size);
  queue_options.max_queue_delay = options.max_queue_delay.value_or(preferred.max_queue_delay);
  queue_ = std::make_unique<BasicJobQueue<WorkItem>>(
      std::move(inference_executor), queue_options,
      [core = core_](std::vector<WorkItem> batch) { core->runner.run(std::move(batch)); });
  // What the store holds from an earlier run (a durable store) or from servers gone: the first
  // claims happen here, so that they are counted when the constructor returns. A store that fails
  // now is retried by the pump.
  core_->pump.start(*queue_);
}

Service::~Service() {
  core_->waiters.close();
  core_->admission.close();
  core_->store.stop();
  core_->pump.stop();
  queue_.reset();  // drops jobs not yet started and waits for running ones
}

SubmitStatus Service::submit(Job job) {
  const std::string id = job.id;
  const bool has_callback = !job.callback_url.empty();
  detail::StoreAccess::News news;
  const SubmitStatus status = [&] {
    auto entered = core_->admission.enter();
    const SubmitStatus admitted = core_->admission.admit();
    if (admitted == SubmitStatus::queue_full) {
      // A resubmission of a stored job is still answered as a duplicate when the queue is full.
      std::optional<JobRecord> existing;
      try {
        existing = core_->store.call(
            "get", id, [&](JobStore& s) { return s.get(id); }, &news);
      } catch (const StoreUnavailable&) {
        return SubmitStatus::store_unavailable;
      }
      if (existing) {
        return existing->job.same_request_as(job) ? SubmitStatus::duplicate
                                                  : SubmitStatus::conflict;
      }
    }
    if (admitted != SubmitStatus::accepted) return admitted;
    if (job.created_at == std::chrono::system_clock::time_point{}) job.created_at = core_->clock();
    job.priority = std::clamp(job.priority, highest_priority, lowest_priority);
    // 0: the time-to-live; at most a year (a time far beyond would overflow the clock's
    // arithmetic).
    job.max_queue = std::clamp(job.max_queue, std::chrono::milliseconds(0),
                               std::chrono::milliseconds(std::chrono::hours(24 * 366)));
    // The accepting server claims the job as it stores it: no claim round trip on the way in.
    const std::string holder = core_->leases.next_holder();
    PutOutcome outcome;
    try {
      outcome = core_->store.call(
          "put", id, [&](JobStore& s) { return s.put(job, core_->leases.from_now(holder)); },
          &news);
    } catch (const StoreUnavailable&) {
      core_->admission.release();
      return SubmitStatus::store_unavailable;
    }
    switch (outcome) {
      case PutOutcome::created:
        break;
      case PutOutcome::duplicate:
        core_->admission.release();
        return SubmitStatus::duplicate;
      case PutOutcome::full:
        core_->admission.release();
        return SubmitStatus::queue_full;
      case PutOutcome::conflict:
        core_->admission.release();
        return SubmitStatus::conflict;
    }
    // Cannot be full (admission bounds it) nor closed (shutdown waits for `entered`).
    core_->leases.hold(id, holder);
    const int priority = job.priority;
    queue_->try_push(WorkItem{std::move(job), nullptr, holder}, priority);
    return SubmitStatus::accepted;
  }();
  core_->store.tell(news);
  core_->observe_submission(status, id, has_callback);
  return status;
}

SubmitStatus Service::invoke(nlohmann::json input, InvocationHandler on_result) {
  if (!on_result) throw Error("Service::invoke: a result handler is required");
  const SubmitStatus status = [&] {
    auto entered = core_->admission.enter();
    const SubmitStatus admitted = core_->admission.admit();
    if (admitted != SubmitStatus::accepted) return admitted;
    Job job;
    job.input = std::move(input);
    // Synchronous invocations queue at the default priority, beside jobs submitted without one.
    queue_->try_push(WorkItem{std::move(job), std::move(on_result), {}}, default_priority);
    return SubmitStatus::accepted;
  }();
  if (status != SubmitStatus::accepted) core_->observe_submission(status, {}, false);
  return status;
}

std::size_t Service::max_batch_size() const {
  return queue_->options().max_batch_size;
}

std::chrono::microseconds Service::max_queue_delay() const {
  return queue_->options().max_queue_delay;
}

std::string Service::render_metrics() const {
  std::string out = core_->metrics.render(queue_->depth(), core_->admission.in_flight(),
                                          core_->sender->in_flight());
  // The breakers, by state, from what the transport tracks now.
  std::size_t by_state[3] = {0, 0, 0};
  for (const EndpointStatus& e : core_->sender->endpoints())
    ++by_state[static_cast<int>(e.state)];
  out +=
      "# HELP rebound_callback_endpoints Receiver origins tracked by the transport, by circuit "
      "state.\n# TYPE rebound_callback_endpoints gauge\n";
  for (const CircuitState state :
       {CircuitState::closed, CircuitState::open, CircuitState::half_open}) {
    out += std::string("rebound_callback_endpoints{state=\"") + to_string(state) + "\"} " +
           std::to_string(by_state[static_cast<int>(state)]) + "\n";
  }
  return out;
}

std::vector<EndpointStatus> Service::callback_endpoints() const {
  return core_->sender->endpoints();
}

const std::vector<std::string>& Service::webhook_public_keys() const {
  return core_->sender->public_keys();
}

const Metrics& Service::metrics() const {
  return core_->metrics;
}

BatchStats Service::batch_stats() const {
  BatchStats stats = core_->runner.stats();
  stats.resumed = core_->pump.resumed();
  return stats;
}

RedeliverStatus Service::redeliver(const std::string& id) {
  if (!core_->admission.accepting()) return RedeliverStatus::shutting_down;
  if (!core_->admission.take_slot()) {
    // Still tell an unknown id or a callback that is not failed apart from a full queue.
    auto record = core_->store.call("get", id, [&](JobStore& s) { return s.get(id); });
    if (!record) return RedeliverStatus::not_found;
    if (record->callback.state != CallbackState::failed) return RedeliverStatus::not_failed;
    return RedeliverStatus::queue_full;
  }
  const Lease lease = core_->leases.from_now(core_->leases.next_holder());
  RedeliverOutcome outcome;
  std::optional<JobRecord> record;
  try {
    // The store moves failed -> pending atomically: of two redeliveries at once (on this server
    // or another), one wins and the other answers not_failed.
    outcome = core_->store.call(
        "redeliver", id, [&](JobStore& s) { return s.redeliver(id, lease, core_->clock()); });
    if (outcome == RedeliverOutcome::redelivered) {
      record = core_->store.call("get", id, [&](JobStore& s) { return s.get(id); });
    }
  } catch (...) {
    core_->admission.release();
    throw;
  }
  if (outcome != RedeliverOutcome::redelivered || !record) {  // no record: pruned meanwhile
    core_->admission.release();
    return outcome == RedeliverOutcome::not_failed ? RedeliverStatus::not_failed
                                                   : RedeliverStatus::not_found;
  }
  core_->observe([&](auto& o) { o.on_redelivery(id, record->callback.attempts); });
  core_->delivery.attempt(*record, lease.holder);
  return RedeliverStatus::accepted;
}

CancelStatus Service::cancel(const std::string& id) {
  const auto now = core_->clock();
  const JobOutcome outcome{JobStatus::cancelled, nullptr,
                           ErrorInfo{"cancelled", "The job was cancelled before it finished."},
                           now};
  const CancelOutcome result =
      core_->store.call("cancel", id, [&](JobStore& s) { return s.cancel(id, outcome, now); });
  switch (result) {
    case CancelOutcome::not_found:
      return CancelStatus::not_found;
    case CancelOutcome::already_finished:
      return CancelStatus::already_finished;
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
  core_->waiters.notify(id);
  // Its callback ("cancelled") is due now, in the store.
  core_->pump.wake(now);
  return CancelStatus::cancelled;
}

std::vector<JobRecord> Service::failed_callbacks(std::size_t limit) const {
  return core_->store.call("list_failed_callbacks", {},
                           [&](JobStore& s) { return s.list_failed_callbacks(limit); });
}

std::optional<JobRecord> Service::find(const std::string& id) const {
  return core_->store.call("get", id, [&](JobStore& s) { return s.get(id); });
}

std::optional<JobRecord> Service::wait_final(const std::string& id,
                                             std::chrono::milliseconds timeout, bool* waited) {
  if (waited) *waited = false;
  std::optional<JobRecord> record = find(id);
  if (!record || is_final(record->status) || timeout.count() <= 0) return record;
  detail::FinalWaiters::Ticket ticket{id};
  if (!core_->waiters.join(ticket)) return record;
  if (waited) *waited = true;
  struct Leave {
    detail::FinalWaiters& w;
    detail::FinalWaiters::Ticket& t;
    ~Leave() { w.leave(t); }
  } leave{core_->waiters, ticket};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Woken at once by this server's own outcomes; every second the store is asked again, for the
  // outcomes of the other servers.
  constexpr auto poll = std::chrono::seconds(1);
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline || core_->waiters.closed()) return record;
    core_->waiters.wait(ticket, std::min(deadline, now + poll));
    record = find(id);
    if (!record || is_final(record->status)) return record;
  }
}

std::optional<std::size_t> Service::queue_position(const std::string& id) const {
  return core_->store.call("queue_position", id, [&](JobStore& s) { return s.queue_position(id); });
}

std::optional<std::string> Service::store_failure() const {
  return core_->store.failure();
}

bool Service::ready() const {
  return core_->admission.open() && !store_failure();
}

std::size_t Service::in_flight() const {
  return core_->admission.in_flight();
}

std::size_t Service::queue_depth() const {
  return queue_->depth();
}

const Model& Service::model() const {
  return *core_->model;
}

bool Service::shutdown(std::chrono::steady_clock::duration timeout) {
  core_->waiters.close();
  core_->admission.close();
  queue_->close();
  if (core_->admission.wait_idle(timeout)) return true;
  // The deadline passed: jobs that never started stay as they are in the store (queued), and
  // their slots are freed so that the running ones can end the process promptly. Invocations
  // still waiting are answered that the server is stopping.
  for (auto& item : queue_->take_pending()) {
    if (item.reply) {
      try {
        item.reply(Prediction::failure("shutting_down", "the server is shutting down"));
      } catch (...) {
      }
    } else {
      // Its lease ends now, so that another server may take it at once.
      core_->leases.hand_back(core_->store, "renew", item.job.id, item.holder);
    }
    core_->admission.release();
  }
  return false;
}

}  // namespace rebound
