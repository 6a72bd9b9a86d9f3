// The built-in observers of a JobQueue (its metrics and its log) and the fan-out that tells every
// observer, built-in or the user's, of one event.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/trace_context.hpp"
#include "rebound/log.hpp"
#include "rebound/metrics.hpp"
#include "rebound/observer.hpp"

namespace rebound::detail {

// The counters and histograms of GET /metrics, kept by hearing the pipeline's events.
class MetricsObserver final : public Observer {
 public:
  explicit MetricsObserver(Metrics& m) : m_(m) {}
  void on_accepted(const std::string&, bool) override { ++m_.jobs_accepted; }
  void on_refused(errc why) override {
    switch (why) {
      case errc::queue_full:
        ++m_.submissions_refused_queue_full;
        break;
      case errc::not_ready:
        ++m_.submissions_refused_not_ready;
        break;
      case errc::store_unavailable:
        ++m_.submissions_refused_store_unavailable;
        break;
      case errc::tenant_quota:
        ++m_.submissions_refused_tenant_quota;
        break;
      case errc::tenant_rate:
        ++m_.submissions_refused_tenant_rate;
        break;
      default:  // the caller's own mistakes and conflicts: not the queue's load
        break;
    }
  }
  void on_claimed(std::size_t jobs, std::size_t callbacks, bool at_start) override {
    m_.jobs_resumed += jobs + (at_start ? callbacks : 0);
  }
  void on_batch_started(const std::vector<std::chrono::steady_clock::duration>& waits) override {
    for (const auto& wait : waits)
      m_.queue_wait_seconds.observe(std::chrono::duration<double>(wait).count());
    m_.batch_size.observe(static_cast<double>(waits.size()));
  }
  void on_batch_finished(std::size_t, double inference_seconds) override {
    m_.inference_seconds.observe(inference_seconds);
  }
  void on_late_result(std::size_t, double inference_seconds) override {
    m_.inference_seconds.observe(inference_seconds);
  }
  void on_completed(const JobRecord& record, std::size_t, double) override {
    ++(record.status == JobStatus::succeeded ? m_.jobs_succeeded : m_.jobs_failed);
  }
  void on_expired(const JobRecord&, std::chrono::milliseconds) override { ++m_.jobs_expired; }
  void on_cancelled(const std::string&) override { ++m_.jobs_cancelled; }
  void on_discarded(const std::string&) override { ++m_.results_discarded; }
  void on_invocation(bool succeeded) override {
    ++(succeeded ? m_.invocations_succeeded : m_.invocations_failed);
  }
  void on_attempt(const std::string&, const AttemptReport& report) override {
    switch (report.verdict) {
      case AttemptVerdict::delivered:
        ++m_.callback_attempts_delivered;
        ++m_.callbacks_delivered;
        break;
      case AttemptVerdict::give_up:
        ++m_.callback_attempts_given_up;
        ++m_.callbacks_given_up;
        break;
      case AttemptVerdict::retry:
        ++m_.callback_attempts_retried;
        break;
      case AttemptVerdict::deferred:
        ++m_.callback_deferrals;
        break;
    }
  }
  void on_lease_lost(const std::string&, std::string_view) override { ++m_.leases_lost; }
  void on_store_error(std::string_view, const std::string&, std::string_view) override {
    ++m_.store_errors;
  }

 private:
  Metrics& m_;
};

// The JSON log lines of docs/operations.md. Fields are built only when the line is wanted.
class LogObserver final : public Observer {
 public:
  explicit LogObserver(Logger log) : log_(std::move(log)) {}
  void on_accepted(const std::string& id, bool has_callback) override {
    if (log_.enabled(LogLevel::debug)) {  // the submit path: no JSON unless wanted
      log_.job(LogLevel::debug, "job_accepted", id, {{"callback", has_callback}});
    }
  }
  void on_claimed(std::size_t jobs, std::size_t callbacks, bool at_start) override {
    if (at_start) log_.log(LogLevel::info, "jobs_resumed", {{"count", jobs + callbacks}});
  }
  void on_late_result(std::size_t size, double inference_seconds) override {
    log_.log(LogLevel::warn, "late_result_discarded",
             {{"batch_size", size}, {"inference_ms", inference_seconds * 1000.0}});
  }
  void on_completed(const JobRecord& record, std::size_t batch_size, double inference_ms) override {
    const LogLevel level = record.status == JobStatus::succeeded ? LogLevel::info : LogLevel::warn;
    if (!log_.enabled(level)) return;
    nlohmann::json fields = {{"status", to_string(record.status)}, {"batch_size", batch_size}};
    if (inference_ms >= 0) fields["inference_ms"] = inference_ms;
    if (record.outcome.error) fields["error_code"] = record.outcome.error->code;
    add_trace(fields, record.job);
    log_.job(level, "job_completed", key_of(record.job), fields);
  }
  void on_expired(const JobRecord& record, std::chrono::milliseconds ttl) override {
    nlohmann::json fields = {{"ttl_ms", ttl.count()}};
    add_trace(fields, record.job);
    log_.job(LogLevel::warn, "job_expired", key_of(record.job), fields);
  }
  // The submission's trace, so that a log search finds the job from the caller's trace.
  static void add_trace(nlohmann::json& fields, const Job& job) {
    if (is_valid_traceparent(job.traceparent)) fields["trace_id"] = trace_id_of(job.traceparent);
  }
  void on_cancelled(const std::string& id) override {
    log_.job(LogLevel::info, "job_cancelled", id);
  }
  void on_discarded(const std::string& id) override {
    log_.job(LogLevel::info, "result_discarded", id);
  }
  void on_attempt(const std::string& id, const AttemptReport& report) override {
    switch (report.verdict) {
      case AttemptVerdict::delivered:
        if (log_.enabled(LogLevel::info)) {  // once per job: fields only when wanted
          nlohmann::json fields = {{"attempts", report.attempt}};
          add_span(fields, report);
          log_.job(LogLevel::info, "callback_delivered", id, fields);
        }
        break;
      case AttemptVerdict::give_up: {
        nlohmann::json fields = {{"attempts", report.attempt}, {"error", report.error}};
        add_span(fields, report);
        log_.job(LogLevel::warn, "callback_given_up", id, fields);
        break;
      }
      case AttemptVerdict::retry: {
        nlohmann::json fields = {{"attempt", report.attempt},
                                 {"error", report.error},
                                 {"retry_in_ms", report.next_delay.count()}};
        add_span(fields, report);
        log_.job(LogLevel::warn, "callback_attempt_failed", id, fields);
        break;
      }
      case AttemptVerdict::deferred:
        // As many as the callbacks waiting for an open circuit, each time they come due: the
        // endpoint list and the deferral count say it once.
        if (log_.enabled(LogLevel::debug)) {
          log_.job(LogLevel::debug, "callback_deferred", id,
                   {{"reason", report.error}, {"retry_in_ms", report.next_delay.count()}});
        }
        break;
    }
  }
  // The attempt's own span of the submission's trace: its trace id and its parent id.
  static void add_span(nlohmann::json& fields, const AttemptReport& report) {
    if (!is_valid_traceparent(report.traceparent)) return;
    fields["trace_id"] = trace_id_of(report.traceparent);
    fields["span_id"] = report.traceparent.substr(36, 16);
  }
  void on_circuit(const std::string& origin, CircuitState state, std::size_t failures) override {
    if (state == CircuitState::open) {
      log_.log(LogLevel::warn, "circuit_opened", {{"origin", origin}, {"failures", failures}});
    } else {
      log_.log(LogLevel::info, "circuit_closed", {{"origin", origin}});
    }
  }
  void on_origin_paused(const std::string& origin, bool paused) override {
    log_.log(LogLevel::info, paused ? "origin_paused" : "origin_resumed", {{"origin", origin}});
  }
  void on_redelivery(const std::string& id, int previous_attempts) override {
    log_.job(LogLevel::info, "callback_redelivery", id, {{"previous_attempts", previous_attempts}});
  }
  void on_lease_lost(const std::string& id, std::string_view during) override {
    log_.job(LogLevel::warn, "lease_lost", id, {{"during", during}});
  }
  void on_store_failing(std::string_view during, const std::string& job_id,
                        std::string_view why) override {
    const nlohmann::json fields = {{"during", during}, {"error", why}};
    if (job_id.empty()) {
      log_.log(LogLevel::error, "store_failed", fields);
    } else {
      log_.job(LogLevel::error, "store_failed", job_id, fields);
    }
  }
  void on_store_recovered() override { log_.log(LogLevel::info, "store_recovered"); }

 private:
  Logger log_;
};

// Who hears the events: the metrics and the log (called directly), then the user's observers;
// nothing an observer throws reaches the pipeline.
struct Observers {
  explicit Observers(Metrics& metrics) : metrics(metrics) {}
  MetricsObserver metrics;
  LogObserver log{Logger()};
  std::vector<std::shared_ptr<Observer>> user;

  template <typename Event>
  void operator()(const Event& event) noexcept {
    // Even the built-ins can throw (out of memory while building a log line): the step that
    // tells them (freeing a slot, recording an attempt) must go on all the same.
    try {
      event(metrics);
      event(log);
    } catch (...) {
    }
    for (const auto& observer : user) {
      try {
        event(*observer);
      } catch (...) {
      }
    }
  }
};

}  // namespace rebound::detail
