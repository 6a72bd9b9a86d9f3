// Service: admission, the worker step (model, store, callback) and shutdown.
#include "rebound/service.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include <boost/asio/steady_timer.hpp>

#include "rebound/detail/json.hpp"
#include "rebound/error.hpp"
#include "rebound/job_queue.hpp"

namespace rebound {

struct Service::Core : std::enable_shared_from_this<Service::Core> {
  std::unique_ptr<Model> model;
  std::unique_ptr<JobStore> store;
  std::unique_ptr<CallbackSender> sender;
  std::size_t capacity = 0;
  std::chrono::milliseconds job_ttl{0};
  std::chrono::milliseconds inference_timeout{0};
  std::chrono::milliseconds store_retry_interval{1000};
  Logger log;

  // The failing-store policy (JobStore's comment): one log line when the store starts failing and
  // one when it works again; `stopped` ends the retries of writes when the Service goes away.
  std::atomic<bool> store_failing{false};
  std::atomic<bool> stopped{false};

  std::shared_mutex accepting_mutex;  // submit holds it shared; shutdown flips `accepting`
  bool accepting = true;

  std::mutex redeliver_mutex;  // serialises failed -> pending, the only move out of `failed`

  std::mutex mutex;
  std::condition_variable idle;
  std::size_t in_flight = 0;
  BatchStats stats;
  Metrics metrics;

  // Notes a store call that threw: counted always, logged once per failing spell.
  void store_failed(std::string_view during, const std::string& job_id, const char* why,
                    bool counted = true) {
    if (counted) ++metrics.store_errors;
    if (!store_failing.exchange(true)) {
      const nlohmann::json fields = {{"during", during}, {"error", why}};
      if (job_id.empty()) {
        log.log(LogLevel::error, "store_failed", fields);
      } else {
        log.job(LogLevel::error, "store_failed", job_id, fields);
      }
    }
  }

  // Notes a store call that worked. A failing spell ends (one log line) only when the store says
  // it works again: a store may answer reads while its writes fail.
  void store_worked() {
    if (!store_failing.load(std::memory_order_relaxed)) return;
    std::optional<std::string> why;
    try {
      why = store->failure();
    } catch (...) {
      return;
    }
    if (!why && store_failing.exchange(false)) log.log(LogLevel::info, "store_recovered");
  }

  // Runs `call` against the store; a failure is noted and rethrown as StoreUnavailable (for the
  // reads a front end answers from).
  template <typename Call>
  auto read_store(std::string_view during, const std::string& job_id, Call&& call) const
      -> decltype(call(*store)) {
    auto* self = const_cast<Core*>(this);
    try {
      auto out = call(*store);
      self->store_worked();
      return out;
    } catch (const std::exception& e) {
      self->store_failed(during, job_id, e.what());
      throw StoreUnavailable(e.what());
    } catch (...) {
      self->store_failed(during, job_id, "unknown error");
      throw StoreUnavailable("the job store failed");
    }
  }

  // Runs a write that an accepted job needs (its outcome, its callback's end), then `then`. When
  // the store fails the write is tried again every store_retry_interval on the io executor, and
  // the job keeps its slot, until it is written or the Service is destroyed (a durable store then
  // still holds the job as it was, and the next start takes it over).
  static void write_until_stored(const std::shared_ptr<Core>& core, const char* during,
                                 std::string job_id, std::function<void(JobStore&)> write,
                                 std::function<void()> then) {
    try {
      write(*core->store);
      core->store_worked();
    } catch (const std::exception& e) {
      core->store_failed(during, job_id, e.what());
      retry_later(core, during, std::move(job_id), std::move(write), std::move(then));
      return;
    } catch (...) {
      core->store_failed(during, job_id, "unknown error");
      retry_later(core, during, std::move(job_id), std::move(write), std::move(then));
      return;
    }
    then();
  }

  static void retry_later(const std::shared_ptr<Core>& core, const char* during, std::string job_id,
                          std::function<void(JobStore&)> write, std::function<void()> then) {
    if (core->stopped) {
      core->release();
      return;
    }
    auto timer = std::make_shared<boost::asio::steady_timer>(core->sender->get_executor(),
                                                             core->store_retry_interval);
    timer->async_wait([core, timer, during, job_id = std::move(job_id), write = std::move(write),
                       then = std::move(then)](const boost::system::error_code&) mutable {
      write_until_stored(core, during, std::move(job_id), std::move(write), std::move(then));
    });
  }

  // A bookkeeping write whose loss costs only a lagging display (running, a retry's progress).
  void write_or_note(const char* during, const std::string& job_id,
                     const std::function<void(JobStore&)>& write) {
    try {
      write(*store);
      store_worked();
    } catch (const std::exception& e) {
      store_failed(during, job_id, e.what());
    } catch (...) {
      store_failed(during, job_id, "unknown error");
    }
  }

  bool try_admit() {
    std::lock_guard<std::mutex> lock(mutex);
    if (in_flight >= capacity) return false;
    ++in_flight;
    return true;
  }

  // The admission shared by submissions and invocations; the caller holds accepting_mutex
  // (shared). `accepted` means a slot was taken, to be released when the work is finished.
  SubmitStatus admit() {
    if (!accepting) return SubmitStatus::shutting_down;
    if (!model->ready()) {
      ++metrics.submissions_refused_not_ready;
      return SubmitStatus::not_ready;
    }
    return try_admit() ? SubmitStatus::accepted : SubmitStatus::queue_full;
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    if (--in_flight == 0) idle.notify_all();
  }

  // Called exactly once for a job whose status is final: delivers its callback, then frees the
  // job's slot. Keeps the core alive for as long as the delivery runs.
  static void deliver(const std::shared_ptr<Core>& core, const JobRecord& record) {
    if (record.job.callback_url.empty()) {
      core->release();
      return;
    }
    const std::string id = record.job.id;
    const int attempts = record.callback.attempts;
    core->write_or_note("update_callback", id, [&](JobStore& store) {
      store.update_callback(id, {CallbackState::pending, attempts, {}});
    });
    CallbackMessage message{id, record.job.callback_url,
                            detail::dump_json(to_callback_json(record)), "msg_" + id,
                            record.callback.attempts};
    core->sender->deliver(
        std::move(message),
        [core, id](const AttemptReport& report) {
          switch (report.verdict) {
            case AttemptVerdict::delivered:
              ++core->metrics.callback_attempts_delivered;
              break;
            case AttemptVerdict::give_up:
              ++core->metrics.callback_attempts_given_up;
              break;
            case AttemptVerdict::retry:
              ++core->metrics.callback_attempts_retried;
              core->log.job(LogLevel::warn, "callback_attempt_failed", id,
                            {{"attempt", report.attempt},
                             {"error", report.error},
                             {"retry_in_ms", report.next_delay.count()}});
              core->write_or_note("update_callback", id, [&](JobStore& store) {
                store.update_callback(id, {CallbackState::pending, report.attempt, report.error});
              });
              break;
          }
        },
        [core, id](const DeliveryReport& report) {
          ++(report.delivered ? core->metrics.callbacks_delivered
                              : core->metrics.callbacks_given_up);
          if (report.delivered) {
            // Once per job: build the fields only when the line is wanted.
            if (core->log.enabled(LogLevel::info)) {
              core->log.job(LogLevel::info, "callback_delivered", id,
                            {{"attempts", report.attempts}});
            }
          } else {
            core->log.job(LogLevel::warn, "callback_given_up", id,
                          {{"attempts", report.attempts}, {"error", report.last_error}});
          }
          const CallbackInfo end{
              report.delivered ? CallbackState::delivered : CallbackState::failed, report.attempts,
              report.last_error};
          write_until_stored(
              core, "update_callback", id,
              [id, end](JobStore& store) { store.update_callback(id, end); },
              [core] { core->release(); });
        });
  }

  // Runs the model on a batch. Never throws: a model that throws, or returns the wrong number of
  // predictions, fails every item of the batch with model_error.
  std::vector<Prediction> predict(std::vector<nlohmann::json>& inputs) {
    try {
      // Moved, never copied, until its depth is checked: copying a json tree recurses.
      std::vector<Prediction> out;
      if (inputs.size() == 1) {
        out.push_back(model->predict(inputs.front()));
      } else {
        out = model->predict_batch(inputs);
      }
      if (out.size() == inputs.size()) {
        // Everything downstream (the store, the status body, the callback) serialises outputs
        // recursively; a model cannot be allowed to build a tree deep enough to overflow a stack.
        for (Prediction& p : out) {
          if (p.ok() && detail::json_deeper_than(p.output(), max_json_depth)) {
            p = Prediction::failure("model_error",
                                    "the model's output nests arrays and objects deeper than " +
                                        std::to_string(max_json_depth) + " levels");
          }
        }
        return out;
      }
      return std::vector<Prediction>(
          inputs.size(),
          Prediction::failure("model_error", "the model returned " + std::to_string(out.size()) +
                                                 " predictions for " +
                                                 std::to_string(inputs.size()) + " inputs"));
    } catch (const std::exception& e) {
      return std::vector<Prediction>(
          inputs.size(),
          Prediction::failure("model_error", std::string("the model failed: ") + e.what()));
    } catch (...) {
      return std::vector<Prediction>(inputs.size(),
                                     Prediction::failure("model_error", "the model failed"));
    }
  }

  void count_batch(std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex);
    ++stats.batches;
    stats.items += size;
    stats.largest_batch = std::max(stats.largest_batch, size);
  }

  // Records a final outcome and delivers its callback (or frees the slot when none is wanted).
  void finish(const JobRecord& record);

  // Answers one item of a batch with its prediction: an invocation's handler, or a job's record
  // and callback. inference_ms < 0: the model never answered (a timeout).
  void settle(WorkItem& item, Prediction& prediction, std::size_t batch_size, double inference_ms);

  // The worker step: runs on the inference executor, never under a lock.
  static void run_batch(const std::shared_ptr<Core>& core, std::vector<WorkItem> batch);
};

struct Service::WorkItem {
  Job job;
  InvocationHandler reply;  // set for an invocation: no store, no callback
  std::chrono::steady_clock::time_point enqueued = std::chrono::steady_clock::now();
};

void Service::Core::run_batch(const std::shared_ptr<Core>& core, std::vector<WorkItem> batch) {
  // Jobs that waited past their time-to-live end here, without running.
  if (core->job_ttl.count() > 0) {
    const auto now = std::chrono::system_clock::now();
    auto expired = std::stable_partition(batch.begin(), batch.end(), [&](const WorkItem& item) {
      return item.reply || now - item.job.created_at <= core->job_ttl;
    });
    for (auto it = expired; it != batch.end(); ++it) {
      JobRecord record;
      record.job = std::move(it->job);
      record.status = JobStatus::expired;
      record.outcome = {JobStatus::expired, nullptr,
                        ErrorInfo{"expired", "The job waited longer than its time-to-live of " +
                                                 std::to_string(core->job_ttl.count() / 1000.0) +
                                                 " s and was not run."}};
      ++core->metrics.jobs_expired;
      core->log.job(LogLevel::warn, "job_expired", record.job.id,
                    {{"ttl_ms", core->job_ttl.count()}});
      core->finish(record);
    }
    batch.erase(expired, batch.end());
    if (batch.empty()) return;
  }
  std::vector<nlohmann::json> inputs;
  inputs.reserve(batch.size());
  for (auto& item : batch) {
    if (!item.reply) {
      // Only the displayed status lags when this fails; the job still runs and completes.
      core->write_or_note("mark_running", item.job.id,
                          [&](JobStore& store) { store.mark_running(item.job.id); });
    }
    inputs.push_back(std::move(item.job.input));  // the record does not need it any more
  }
  core->count_batch(batch.size());
  const auto started = std::chrono::steady_clock::now();
  for (const auto& item : batch) {
    core->metrics.queue_wait_seconds.observe(
        std::chrono::duration<double>(started - item.enqueued).count());
  }
  core->metrics.batch_size.observe(static_cast<double>(batch.size()));

  // With an inference timeout, a watchdog on the io executor answers the batch when the model
  // overruns; whoever settles the batch first (the watchdog or the model) answers it, once.
  auto items = std::make_shared<std::vector<WorkItem>>(std::move(batch));
  auto settled = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<boost::asio::steady_timer> watchdog;
  if (core->inference_timeout.count() > 0) {
    watchdog = std::make_shared<boost::asio::steady_timer>(core->sender->get_executor(),
                                                           core->inference_timeout);
    watchdog->async_wait([core, items, settled](const boost::system::error_code& ec) {
      if (ec || settled->exchange(true)) return;
      const std::string message = "The model did not answer within the inference timeout of " +
                                  std::to_string(core->inference_timeout.count() / 1000.0) + " s.";
      for (auto& item : *items) {
        Prediction timeout = Prediction::failure("inference_timeout", message);
        core->settle(item, timeout, items->size(), -1);
      }
    });
  }
  std::vector<Prediction> predictions = core->predict(inputs);
  const double inference_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  core->metrics.inference_seconds.observe(inference_s);
  if (settled->exchange(true)) {
    core->log.log(LogLevel::warn, "late_result_discarded",
                  {{"batch_size", items->size()}, {"inference_ms", inference_s * 1000.0}});
    return;
  }
  if (watchdog) watchdog->cancel();
  for (std::size_t i = 0; i < items->size(); ++i) {
    core->settle((*items)[i], predictions[i], items->size(), inference_s * 1000.0);
  }
}

void Service::Core::settle(WorkItem& item, Prediction& prediction, std::size_t batch_size,
                           double inference_ms) {
  if (item.reply) {
    ++(prediction.ok() ? metrics.invocations_succeeded : metrics.invocations_failed);
    try {
      item.reply(prediction);
    } catch (...) {
      // The invocation's owner failed to take its answer; nothing else to do.
    }
    release();
    return;
  }
  JobRecord record;
  record.job = std::move(item.job);
  if (prediction.ok()) {
    record.outcome = {JobStatus::succeeded, std::move(prediction.output()), std::nullopt};
  } else {
    record.outcome = {JobStatus::failed, nullptr, prediction.error()};
  }
  record.status = record.outcome.status;
  ++(record.status == JobStatus::succeeded ? metrics.jobs_succeeded : metrics.jobs_failed);
  const LogLevel level = record.status == JobStatus::succeeded ? LogLevel::info : LogLevel::warn;
  if (log.enabled(level)) {
    nlohmann::json fields = {{"status", to_string(record.status)}, {"batch_size", batch_size}};
    if (inference_ms >= 0) fields["inference_ms"] = inference_ms;
    if (record.outcome.error) fields["error_code"] = record.outcome.error->code;
    log.job(level, "job_completed", record.job.id, fields);
  }
  finish(record);
}

void Service::Core::finish(const JobRecord& record) {
  auto core = shared_from_this();
  auto kept = std::make_shared<JobRecord>(record);
  write_until_stored(
      core, "complete", record.job.id,
      [kept](JobStore& store) { store.complete(kept->job.id, kept->outcome); },
      [core, kept] { deliver(core, *kept); });
}

Service::Service(boost::asio::any_io_executor inference_executor,
                 boost::asio::any_io_executor io_executor, std::unique_ptr<Model> model,
                 std::unique_ptr<JobStore> store, std::unique_ptr<CallbackTransport> transport,
                 ServiceOptions options)
    : core_(std::make_shared<Core>()) {
  if (!model) throw Error("Service: a model is required");
  if (!store) throw Error("Service: a job store is required");
  if (options.queue_capacity == 0) throw Error("Service: queue_capacity must be at least 1");
  core_->model = std::move(model);
  core_->store = std::move(store);
  core_->sender = std::make_unique<CallbackSender>(std::move(io_executor), std::move(transport),
                                                   std::move(options.delivery));
  core_->capacity = options.queue_capacity;
  if (options.job_ttl.count() < 0) throw Error("Service: job_ttl must not be negative");
  core_->job_ttl = options.job_ttl;
  if (options.inference_timeout.count() < 0) {
    throw Error("Service: inference_timeout must not be negative");
  }
  core_->inference_timeout = options.inference_timeout;
  if (options.store_retry_interval.count() <= 0) {
    throw Error("Service: store_retry_interval must be positive");
  }
  core_->store_retry_interval = options.store_retry_interval;
  core_->log = options.logger;
  // What a durable store holds from an earlier run: accepted, not finished. All of it resumes,
  // even beyond the capacity (new submissions wait until the backlog is below it again).
  std::vector<JobRecord> unfinished =
      core_->store->list_unfinished(std::numeric_limits<std::size_t>::max());
  const BatchingPreference preferred = core_->model->batching();
  JobQueueOptions queue_options;
  // The queue's own bound equals the admission bound, so an admitted item always fits.
  queue_options.capacity = std::max(options.queue_capacity, unfinished.size());
  queue_options.workers = options.workers;
  queue_options.max_batch_size = options.max_batch_size.value_or(preferred.max_batch_size);
  queue_options.max_queue_delay = options.max_queue_delay.value_or(preferred.max_queue_delay);
  queue_ = std::make_unique<BasicJobQueue<WorkItem>>(
      std::move(inference_executor), queue_options,
      [core = core_](std::vector<WorkItem> batch) { Core::run_batch(core, std::move(batch)); });
  resume(std::move(unfinished));
}

void Service::resume(std::vector<JobRecord> unfinished) {
  {
    std::lock_guard<std::mutex> lock(core_->mutex);
    core_->in_flight += unfinished.size();
    core_->stats.resumed += unfinished.size();
  }
  core_->metrics.jobs_resumed += unfinished.size();
  if (!unfinished.empty()) {
    core_->log.log(LogLevel::info, "jobs_resumed", {{"count", unfinished.size()}});
  }
  for (auto& record : unfinished) {
    if (is_final(record.status)) {
      Core::deliver(core_, record);  // the result is stored; only the callback is owed
    } else {
      queue_->try_push(WorkItem{std::move(record.job), nullptr});  // runs again: at least once
    }
  }
}

Service::~Service() {
  {
    std::unique_lock<std::shared_mutex> lock(core_->accepting_mutex);
    core_->accepting = false;
  }
  core_->stopped = true;
  queue_.reset();  // drops jobs not yet started and waits for running ones
}

SubmitStatus Service::submit(Job job) {
  std::shared_lock<std::shared_mutex> accepting(core_->accepting_mutex);
  const SubmitStatus admitted = core_->admit();
  if (admitted == SubmitStatus::queue_full) {
    // A resubmission of a stored job is still answered as a duplicate when the queue is full.
    std::optional<JobRecord> existing;
    try {
      existing = core_->read_store("get", job.id, [&](JobStore& s) { return s.get(job.id); });
    } catch (const StoreUnavailable&) {
      ++core_->metrics.submissions_refused_store_unavailable;
      return SubmitStatus::store_unavailable;
    }
    if (existing) {
      return existing->job.same_request_as(job) ? SubmitStatus::duplicate : SubmitStatus::conflict;
    }
    ++core_->metrics.submissions_refused_queue_full;
  }
  if (admitted != SubmitStatus::accepted) return admitted;
  if (job.created_at == std::chrono::system_clock::time_point{}) {
    job.created_at = std::chrono::system_clock::now();
  }
  PutOutcome outcome;
  try {
    outcome = core_->read_store("put", job.id, [&](JobStore& s) { return s.put(job); });
  } catch (const StoreUnavailable&) {
    core_->release();
    ++core_->metrics.submissions_refused_store_unavailable;
    return SubmitStatus::store_unavailable;
  }
  if (outcome != PutOutcome::created) {
    core_->release();
    switch (outcome) {
      case PutOutcome::duplicate:
        return SubmitStatus::duplicate;
      case PutOutcome::full:
        ++core_->metrics.submissions_refused_queue_full;
        return SubmitStatus::queue_full;
      default:
        return SubmitStatus::conflict;
    }
  }
  // Cannot be full (admission bounds it) nor closed (shutdown waits for this shared lock).
  if (core_->log.enabled(LogLevel::debug)) {  // the submit path: no JSON unless wanted
    core_->log.job(LogLevel::debug, "job_accepted", job.id,
                   {{"callback", !job.callback_url.empty()}});
  }
  queue_->try_push(WorkItem{std::move(job), nullptr});
  ++core_->metrics.jobs_accepted;
  return SubmitStatus::accepted;
}

SubmitStatus Service::invoke(nlohmann::json input, InvocationHandler on_result) {
  if (!on_result) throw Error("Service::invoke: a result handler is required");
  std::shared_lock<std::shared_mutex> accepting(core_->accepting_mutex);
  const SubmitStatus admitted = core_->admit();
  if (admitted == SubmitStatus::queue_full) ++core_->metrics.submissions_refused_queue_full;
  if (admitted != SubmitStatus::accepted) return admitted;
  Job job;
  job.input = std::move(input);
  queue_->try_push(WorkItem{std::move(job), std::move(on_result)});
  return SubmitStatus::accepted;
}

std::size_t Service::max_batch_size() const {
  return queue_->options().max_batch_size;
}

std::chrono::microseconds Service::max_queue_delay() const {
  return queue_->options().max_queue_delay;
}

std::string Service::render_metrics() const {
  std::size_t in_flight;
  {
    std::lock_guard<std::mutex> lock(core_->mutex);
    in_flight = core_->in_flight;
  }
  std::string out = core_->metrics.render(queue_->depth(), in_flight, core_->sender->in_flight());
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

const Metrics& Service::metrics() const {
  return core_->metrics;
}

BatchStats Service::batch_stats() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->stats;
}

RedeliverStatus Service::redeliver(const std::string& id) {
  std::shared_lock<std::shared_mutex> accepting(core_->accepting_mutex);
  if (!core_->accepting) return RedeliverStatus::shutting_down;
  std::lock_guard<std::mutex> lock(core_->redeliver_mutex);
  auto record = core_->read_store("get", id, [&](JobStore& s) { return s.get(id); });
  if (!record) return RedeliverStatus::not_found;
  if (record->callback.state != CallbackState::failed) return RedeliverStatus::not_failed;
  if (!core_->try_admit()) return RedeliverStatus::queue_full;
  core_->log.job(LogLevel::info, "callback_redelivery", id,
                 {{"previous_attempts", record->callback.attempts}});
  // Core::deliver marks the callback pending before it returns, so a second redeliver waiting on
  // the mutex sees `pending` and answers not_failed.
  Core::deliver(core_, *record);
  return RedeliverStatus::accepted;
}

std::vector<JobRecord> Service::failed_callbacks(std::size_t limit) const {
  return core_->read_store("list_failed_callbacks", {},
                           [&](JobStore& s) { return s.list_failed_callbacks(limit); });
}

std::optional<JobRecord> Service::find(const std::string& id) const {
  return core_->read_store("get", id, [&](JobStore& s) { return s.get(id); });
}

std::optional<std::string> Service::store_failure() const {
  std::optional<std::string> why;
  try {
    why = core_->store->failure();
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
    why = "the job store failed";
  }
  if (why) {
    core_->store_failed("failure", {}, why->c_str(), false);
  } else if (core_->store_failing.exchange(false)) {
    core_->log.log(LogLevel::info, "store_recovered");
  }
  return why;
}

bool Service::ready() const {
  {
    std::shared_lock<std::shared_mutex> lock(core_->accepting_mutex);
    if (!core_->accepting || !core_->model->ready()) return false;
  }
  return !store_failure();
}

std::size_t Service::in_flight() const {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->in_flight;
}

std::size_t Service::queue_depth() const {
  return queue_->depth();
}

const Model& Service::model() const {
  return *core_->model;
}

bool Service::shutdown(std::chrono::steady_clock::duration timeout) {
  {
    std::unique_lock<std::shared_mutex> lock(core_->accepting_mutex);
    core_->accepting = false;
  }
  queue_->close();
  std::unique_lock<std::mutex> lock(core_->mutex);
  if (core_->idle.wait_for(lock, timeout, [this] { return core_->in_flight == 0; })) return true;
  lock.unlock();
  // The deadline passed: jobs that never started stay as they are in the store (queued), and
  // their slots are freed so that the running ones can end the process promptly. Invocations
  // still waiting are answered that the server is stopping.
  for (auto& item : queue_->take_pending()) {
    if (item.reply) {
      try {
        item.reply(Prediction::failure("shutting_down", "the server is shutting down"));
      } catch (...) {
      }
    }
    core_->release();
  }
  return false;
}

}  // namespace rebound
