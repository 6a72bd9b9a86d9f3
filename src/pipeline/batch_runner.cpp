// The batch runner: time-to-live, the model call and its watchdog, and each outcome's
// acknowledgement.
#include "batch_runner.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <exception>
#include <utility>

#include <boost/asio/steady_timer.hpp>

#include "rebound/detail/json.hpp"
#include "rebound/detail/wire.hpp"
#include "rebound/tenant.hpp"
#include "work_queue.hpp"

namespace rebound {
namespace {
// The cancellation flags of the batch the calling worker thread runs now, while its model call
// lasts (rebound::cancellation_requested).
thread_local const std::vector<std::shared_ptr<std::atomic<bool>>>* current_flags = nullptr;
}  // namespace

bool cancellation_requested() noexcept {
  const auto* flags = current_flags;
  if (!flags || flags->empty()) return false;
  for (const auto& flag : *flags)
    if (!flag->load(std::memory_order_relaxed)) return false;
  return true;
}

}  // namespace rebound

namespace rebound::detail {
namespace {

// "0.15", "30", "86400": seconds as a person writes them.
std::string seconds_text(std::chrono::milliseconds d) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", static_cast<double>(d.count()) / 1000.0);
  return text;
}

}  // namespace

std::chrono::milliseconds BatchRunner::time_in_queue(const Job& job) const {
  return job.max_queue.count() > 0 ? job.max_queue : job_ttl_;
}

bool BatchRunner::past_time(const WorkItem& item, TimePoint now) const {
  const auto limit = time_in_queue(item.job);
  return !item.reply && limit.count() > 0 && now - item.job.created_at > limit;
}

void BatchRunner::screen(std::vector<WorkItem>& batch, TimePoint now) {
  // Claims revoked while their job waited (a cancellation, or another server's claim) end here,
  // without running.
  std::vector<WorkItem> dropped_items;
  {
    std::lock_guard<std::mutex> lock(runs_mutex_);
    auto dropped = std::stable_partition(batch.begin(), batch.end(), [&](const WorkItem& item) {
      return item.reply || !revoked_locked(item, true);
    });
    for (auto it = dropped; it != batch.end(); ++it)
      dropped_items.push_back(std::move(*it));
    batch.erase(dropped, batch.end());
  }
  dropped_items.clear();  // their claims go back outside the lock: a freed slot may wake the pump
  // Jobs that waited past their time in queue (their own max_queue, else the time-to-live) end
  // here, without running.
  auto expired = std::stable_partition(batch.begin(), batch.end(),
                                       [&](const WorkItem& item) { return !past_time(item, now); });
  for (auto it = expired; it != batch.end(); ++it) {
    const auto limit = time_in_queue(it->job);
    JobRecord record;
    record.job = std::move(it->job);
    record.status = JobStatus::expired;
    record.outcome.error =
        ErrorInfo{"expired", "The job was not started within its time in queue of " +
                                 seconds_text(limit) + " s."};
    record.outcome.finished_at = now;
    observe_([&](auto& o) { o.on_expired(record, limit); });
    finish(std::move(record), std::move(it->claim));
  }
  batch.erase(expired, batch.end());
}

void BatchRunner::sweep(WorkQueue<WorkItem>& queue) {
  const auto now = clock_();
  bool any_revoked;
  {
    std::lock_guard<std::mutex> lock(runs_mutex_);
    any_revoked = !revoked_.empty() || !cancelled_unheld_.empty();
  }
  std::vector<WorkItem> taken = queue.take_if([&](const WorkItem& item) {
    if (item.reply) return false;
    if (past_time(item, now)) return true;
    if (!any_revoked) return false;
    std::lock_guard<std::mutex> lock(runs_mutex_);
    return revoked_locked(item, false);
  });
  {
    std::lock_guard<std::mutex> lock(runs_mutex_);
    const auto at = std::chrono::steady_clock::now();
    for (auto it = cancelled_unheld_.begin(); it != cancelled_unheld_.end();)
      it = it->second < at ? cancelled_unheld_.erase(it) : std::next(it);
  }
  screen(taken, now);
  for (auto& item : taken) {  // nothing, unless a revocation was undone meanwhile: run it after all
    const int priority = item.job.priority;
    const std::string tenant = item.job.tenant;  // back into its tenant's turn
    // Closed by a shutdown: the claim goes with the item, the lease runs out, the store keeps it.
    queue.try_push(std::move(item), priority, tenant);
  }
}

void BatchRunner::run(std::vector<WorkItem> batch) {
  // The work queue counted the batch as taken from its version (JobQueue's on_taken, under the
  // queue's lock): a draining version is released only once no batch of it is in here.
  struct Untake {
    VersionStats* stats;
    std::size_t n;
    ~Untake() {
      if (stats) stats->taken.fetch_sub(n, std::memory_order_release);
    }
  } untake{batch.empty() ? nullptr : batch.front().taken_from, batch.size()};
  // Jobs sent on from a rerouted version count as taken from the version they run on, as long as
  // they are in here.
  struct Retake {
    std::vector<std::shared_ptr<VersionStats>> to;
    ~Retake() {
      for (const auto& stats : to)
        stats->taken.fetch_sub(1, std::memory_order_release);
    }
  } retake;
  const auto now = clock_();
  screen(batch, now);
  if (batch.empty()) return;
  if (only_) return run_on(*only_, only_stats_.get(), std::move(batch), now);
  // A batch holds one version's items: the work queue ends a batch before another version's
  // (JobQueue's BatchKey: the version's Model). Items of versions this queue does not serve now
  // (jobs taken over from a store) share a key, null: such a batch is split by version here.
  while (!batch.empty()) {
    std::vector<WorkItem> same;
    const ModelRef ref = batch.front().job.model;
    if (batch.size() == 1 || std::all_of(batch.begin() + 1, batch.end(),
                                         [&](const WorkItem& w) { return w.job.model == ref; })) {
      same = std::move(batch);
      batch.clear();
    } else {
      std::vector<WorkItem> rest;
      for (auto& item : batch)
        (item.job.model == ref ? same : rest).push_back(std::move(item));
      batch = std::move(rest);
    }
    // A version unloaded with its jobs sent to the route: each goes to the version the route
    // chooses for it (a ready one: never back here), and runs with that version's batch. One
    // that no version can take stays, to run on its own while it is loaded; so does an
    // invocation (its caller was told the version it runs on).
    if (models_.rerouting() && models_.rerouted(ref)) {
      // Those sent on are no longer the drained version's: its drain does not wait for them.
      const std::shared_ptr<VersionStats> from = models_.stats_of(ref);
      const bool counted = from && from.get() == untake.stats;
      std::vector<WorkItem> stay;
      for (auto& item : same) {
        ModelRef to = item.job.model;
        ModelTable::Lease lease;
        if (!item.reply) lease = models_.reroute(to, item.job.tenant, item.job.id);
        if (!lease.model) {
          stay.push_back(std::move(item));
          continue;
        }
        item.job.model = std::move(to);
        item.model = std::move(lease.model);
        item.rerouted = true;
        if (counted && untake.n > 0) {
          untake.stats->taken.fetch_sub(1, std::memory_order_release);
          --untake.n;
        }
        if (lease.stats) {
          lease.stats->taken.fetch_add(1, std::memory_order_acq_rel);
          retake.to.push_back(std::move(lease.stats));
        }
        batch.push_back(std::move(item));
      }
      if (stay.empty()) continue;
      same = std::move(stay);
    }
    // The version a job was accepted for is held by its item (a drain waits for it); a job
    // claimed from the store looks it up, and a draining version still runs its jobs.
    std::shared_ptr<Model> model = same.front().model;
    std::shared_ptr<VersionStats> stats = models_.stats_of(ref);
    if (!model) model = models_.acquire(ref).model;
    if (model) {
      run_on(*model, stats.get(), std::move(same), now);
      continue;
    }
    const bool named = models_.has_model(ref.name);
    for (auto& item : same) {
      Prediction refused =
          Prediction::failure(named ? "version_unavailable" : "model_not_found",
                              named ? "This server does not serve version '" + ref.version +
                                          "' of the model '" + ref.name + "'."
                                    : "This server does not serve the model '" + ref.name + "'.");
      settle(item, refused, 1, -1, TimePoint{}, nullptr);  // (no model call, no version)
    }
  }
}

void BatchRunner::run_on(Model& model, VersionStats* counts, std::vector<WorkItem> batch,
                         TimePoint now) {
  // The jobs running now, each with its cancellation flag.
  std::vector<std::shared_ptr<std::atomic<bool>>> flags;
  bool given_up = false;  // the process gave its running jobs up before this batch began
  {
    std::lock_guard<std::mutex> lock(runs_mutex_);
    given_up = abandoned_;
    for (const auto& item : batch) {
      if (item.reply) continue;
      // (Raised from the start once the process gave its running jobs up.)
      auto flag = std::make_shared<std::atomic<bool>>(abandoned_);
      running_[key_of(item.job)] = Running{item.claim.holder(), flag};
      flags.push_back(std::move(flag));
    }
  }
  std::vector<nlohmann::json> inputs;
  inputs.reserve(batch.size());
  for (auto& item : batch) {
    if (!item.reply && !given_up) {
      // Only the displayed status lags when this fails; the job still runs and completes. (Not
      // for a job already given up: it is handed back, unstarted.)
      const std::string key = key_of(item.job);
      store_.write_or_note("mark_running", key,
                           [&](JobLeaseStore& store) { store.mark_running(key, now); });
      delivery_.notify_started(item.job);
    }
    inputs.push_back(std::move(item.job.input));  // the record does not need it any more
  }
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.batches;
    stats_.items += batch.size();
    stats_.largest_batch = std::max(stats_.largest_batch, batch.size());
  }
  const auto started = std::chrono::steady_clock::now();
  {
    std::vector<std::chrono::steady_clock::duration> waits;
    waits.reserve(batch.size());
    for (const auto& item : batch)
      waits.push_back(started - item.enqueued);
    observe_([&](auto& o) { o.on_batch_started(waits); });
  }

  // With an inference timeout, a watchdog answers the batch when the model overruns; whoever
  // settles the batch first (the watchdog or the model) answers it, once.
  auto items = std::make_shared<std::vector<WorkItem>>(std::move(batch));
  auto settled = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<boost::asio::steady_timer> watchdog;
  if (inference_timeout_.count() > 0) {
    watchdog = std::make_shared<boost::asio::steady_timer>(timer_executor_, inference_timeout_);
    watchdog->async_wait([this, keep = owner(), items, settled, flags, now,
                          counts](const boost::system::error_code& ec) {
      if (ec || settled->exchange(true)) return;
      const std::string message = "The model did not answer within the inference timeout of " +
                                  std::to_string(inference_timeout_.count() / 1000.0) + " s.";
      for (auto& item : *items) {
        Prediction timeout = Prediction::failure("inference_timeout", message);
        settle(item, timeout, items->size(), -1, now, counts);
      }
      // The late result will be discarded: a model that polls its flag may stop now (and a
      // stopping process, whose abandon_running no longer sees these jobs, need not wait).
      // (Raised once the jobs are settled: a raised flag would have discarded their outcome.)
      for (const auto& flag : flags)
        flag->store(true);
    });
  }
  std::vector<Prediction> predictions;
  {
    // An invocation in the batch is never cancelled: the flag stays down for a mixed batch.
    const bool has_invocation = flags.size() < items->size();
    current_flags = has_invocation ? nullptr : &flags;
    predictions = predict(model, inputs);
    current_flags = nullptr;
  }
  const double inference_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (counts) counts->inference_us += static_cast<std::uint64_t>(inference_s * 1e6);
  if (settled->exchange(true)) {
    observe_([&](auto& o) { o.on_late_result(items->size(), inference_s); });
    return;
  }
  observe_([&](auto& o) { o.on_batch_finished(items->size(), inference_s); });
  if (watchdog) watchdog->cancel();
  for (std::size_t i = 0; i < items->size(); ++i) {
    settle((*items)[i], predictions[i], items->size(), inference_s * 1000.0, now, counts);
  }
}

void BatchRunner::revoke(const std::string& id, const std::string& holder, bool queued_too) {
  std::lock_guard<std::mutex> lock(runs_mutex_);
  auto it = running_.find(id);
  if (it != running_.end() && it->second.holder == holder) {
    it->second.cancelled->store(true);
  } else if (queued_too && leases_.job_holder_of(id) == holder) {
    // Still held, so still waiting in the queue: a worker drops it when it takes it. (Entries of
    // jobs that ended meanwhile are swept once there are more than the queue can hold.)
    revoked_.insert({id, holder});
    if (revoked_.size() > admission_.capacity()) {
      for (auto r = revoked_.begin(); r != revoked_.end();) {
        r = leases_.job_holder_of(r->first) == r->second ? std::next(r) : revoked_.erase(r);
      }
    }
  }
}

bool BatchRunner::revoked_locked(const WorkItem& item, bool take) {
  if (revoked_.empty() && cancelled_unheld_.empty()) return false;
  std::string key = key_of(item.job);
  if (take) {
    return revoked_.erase({key, item.claim.holder()}) > 0 || cancelled_unheld_.erase(key) > 0;
  }
  return revoked_.count({key, item.claim.holder()}) > 0 || cancelled_unheld_.count(key) > 0;
}

void BatchRunner::abandon_running() {
  std::lock_guard<std::mutex> lock(runs_mutex_);
  abandoned_ = true;
  for (auto& [id, run] : running_)
    run.cancelled->store(true);
}

void BatchRunner::cancelled_unheld(const std::string& id, std::chrono::milliseconds keep) {
  std::lock_guard<std::mutex> lock(runs_mutex_);
  cancelled_unheld_[id] = std::chrono::steady_clock::now() + keep;
}

bool BatchRunner::end_run(const WorkItem& item, bool& abandoned) {
  std::lock_guard<std::mutex> lock(runs_mutex_);
  abandoned = abandoned_;
  auto it = running_.find(key_of(item.job));
  if (it == running_.end() || it->second.holder != item.claim.holder()) return true;
  const bool revoked = it->second.cancelled->load();
  running_.erase(it);
  return !revoked;
}

BatchStats BatchRunner::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

std::vector<Prediction> BatchRunner::predict(Model& model, std::vector<nlohmann::json>& inputs) {
  try {
    // Moved, never copied, until its depth is checked: copying a json tree recurses.
    std::vector<Prediction> out;
    if (inputs.size() == 1) {
      out.push_back(model.predict(inputs.front()));
    } else {
      out = model.predict_batch(inputs);
    }
    if (out.size() == inputs.size()) {
      // Everything downstream (the store, the status body, the callback) serialises outputs
      // recursively; a model cannot be allowed to build a tree deep enough to overflow a stack.
      for (Prediction& p : out) {
        if (p.ok() && json_deeper_than(p.output(), max_json_depth)) {
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
                                               " predictions for " + std::to_string(inputs.size()) +
                                               " inputs"));
  } catch (const std::exception& e) {
    return std::vector<Prediction>(
        inputs.size(),
        Prediction::failure("model_error", std::string("the model failed: ") + e.what()));
  } catch (...) {
    return std::vector<Prediction>(inputs.size(),
                                   Prediction::failure("model_error", "the model failed"));
  }
}

void BatchRunner::settle(WorkItem& item, Prediction& prediction, std::size_t batch_size,
                         double inference_ms, TimePoint started_at, VersionStats* counts) {
  if (item.reply) {
    observe_([&](auto& o) { o.on_invocation(prediction.ok()); });
    try {
      item.reply({}, prediction);
    } catch (...) {
      // The invocation's owner failed to take its answer; nothing else to do.
    }
    item.claim.release();
    return;
  }
  bool abandoned = false;
  if (!end_run(item, abandoned)) {
    // Cancelled, or taken over by another claim: the store has its outcome already. Given up by
    // a stopping process: the job stays unfinished in the store, and its lease ends now, for
    // another server (or the next start) to take at once.
    observe_([&](auto& o) { o.on_discarded(key_of(item.job)); });
    if (abandoned) {
      item.claim.hand_back(store_, "renew");
    } else {
      item.claim.release();
    }
    return;
  }
  JobRecord record;
  record.job = std::move(item.job);
  record.started_at = started_at;  // (as mark_running wrote it)
  record.outcome.finished_at = clock_();
  if (prediction.ok()) {
    record.status = JobStatus::succeeded;
    record.outcome.result = std::move(prediction.output());
  } else {
    // A model's message may be anything it threw: kept to a bound, like every stored string.
    ErrorInfo error = prediction.error();
    error.code = truncated_utf8(std::move(error.code), max_error_code_bytes);
    error.message = truncated_utf8(std::move(error.message), max_error_message_bytes);
    record.status = JobStatus::failed;
    record.outcome.error = std::move(error);
  }
  if (counts) ++(record.status == JobStatus::succeeded ? counts->succeeded : counts->failed);
  observe_([&](auto& o) { o.on_completed(record, batch_size, inference_ms); });
  finish(std::move(record), std::move(item.claim), item.rerouted);
}

void BatchRunner::finish(JobRecord record, Claim claim, bool rerouted) {
  // What the store is told (the final status with the result), moved out of the record for the
  // write and its retries, and back into it once acknowledged: the result is never copied.
  auto outcome = std::make_shared<JobOutcome>(record.status, std::move(record.outcome));
  if (rerouted) outcome->ran_on_version = record.job.model.version;  // (the store's is another)
  record.outcome = JobEnd{};  // (not a moved-from one: nothing reads it until it comes back)
  auto kept = std::make_shared<JobRecord>(std::move(record));
  // Shared by the write's continuations (copied into std::function); whichever runs ends it.
  auto held = std::make_shared<Claim>(std::move(claim));
  const std::string holder = held->holder();
  std::optional<Lease> deliver;
  if (kept->job.wants_completion_callback()) deliver = leases_.from_now(leases_.next_holder());
  const std::string key = key_of(kept->job);
  // A job somebody waits for is answered with the record the store keeps, from the store's
  // answer (no second read). Asked when the write starts: a wait that begins later is read back.
  const bool want_record = events_.awaited(key);
  store_.write_until_stored<JobStore::FinishAnswer, JobStore::FinishDone>(
      owner(), "finish_job", key, {JobStore::AsyncCall::finish_job, want_record},
      [this, key, outcome, holder, deliver, want_record](JobLeaseStore& s,
                                                         JobStore::FinishDone done) {
        s.async_finish_job(key, holder, *outcome, deliver, clock_(), want_record, std::move(done));
      },
      [this, kept, key, outcome, held, deliver](JobStore::FinishAnswer answer) {
        held->drop_lease();
        if (!answer.held) {
          // The lease ran out and another claim has the job: this result is not the one kept.
          observe_([&](auto& o) { o.on_lease_lost(key, "finish_job"); });
          held->release();
          return;
        }
        kept->outcome = std::move(static_cast<JobEnd&>(*outcome));
        kept->callback.state = deliver ? CallbackState::pending : CallbackState::none;
        if (answer.record && is_final(answer.record->status)) {
          events_.job_answered(key, std::move(*answer.record));
        } else {
          events_.job_final(key, *kept);
        }
        if (!deliver) {
          held->release();
          return;
        }
        // The callback is this server's at once: its first attempt goes out now, in the slot the
        // job held.
        delivery_.start(std::move(*kept), deliver->holder, std::move(*held));
      },
      [held] { held->release(); });
}

}  // namespace rebound::detail
