// Observer: what a JobQueue tells about the work going through it. Metrics and logs are
// observers; add your own (tracing, an audit trail, a dashboard) through
// JobQueueOptions::observers.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "rebound/delivery/attempt.hpp"
#include "rebound/errc.hpp"
#include "rebound/job.hpp"

namespace rebound {

struct Metrics;

/// A submission accepted with a trace (JobQueueOptions::trace_submissions): what a tracer needs
/// to record its span. The job was stored with `traceparent`, whose parent id is this
/// submission's span; the run and every callback attempt of the job continue that trace.
struct SubmissionTrace {
  std::string job_id;          ///< the job's key (rebound::key_of)
  std::string traceparent;     ///< as stored with the job: 00-<trace id>-<this span's id>-<flags>
  std::string parent_span_id;  ///< the caller's span (16 hex) when it sent a traceparent, else ""
  std::chrono::system_clock::time_point started;   ///< when the queue began to take it
  std::chrono::system_clock::time_point accepted;  ///< when it was accepted
  ModelRef model;  ///< the version it was accepted for (Job::model, filled in)
};

/// Hears the events of a JobQueue's pipeline, in the order of a job's walk:
/// accepted -> (claimed) -> batch started -> completed | expired -> attempt ... -> (redelivery).
///
/// Every hook has an empty default: override what you need. Hooks run on the thread where the
/// event happens (an HTTP thread, an inference worker, the io executor, the pump thread), never
/// under a JobQueue lock, and may run concurrently: an observer must be thread-safe. An exception a
/// hook throws is swallowed. Keep hooks short: they run on the pipeline's threads.
///
/// Example:
///   struct Audit final : rebound::Observer {
///     void on_completed(const rebound::JobRecord& r, std::size_t, double) override {
///       audit_log.write(r.job.id, rebound::to_string(r.status));
///     }
///   };
///   options.observers.push_back(std::make_shared<Audit>());
///
/// A `job_id` these hooks are given is the job's store key (rebound::key_of: the id, or
/// "tenant/id" for a named tenant's job), as log lines show it.
class Observer {
 public:
  virtual ~Observer() = default;

  /// A job was stored and claimed by this server (a 202; an identical resubmission is not).
  virtual void on_accepted(const std::string& /*job_id*/, bool /*has_callback*/) {}
  /// With JobQueueOptions::trace_submissions, after on_accepted: the submission's trace.
  virtual void on_submission_traced(const SubmissionTrace& /*trace*/) {}
  /// A submission or invocation was refused, and why (a duplicate is not a refusal).
  virtual void on_refused(errc /*why*/) {}
  /// Work was claimed from the store that this server did not accept or schedule itself: `jobs`
  /// to run, `callbacks` owed from an earlier run (`at_start`: by the constructor).
  virtual void on_claimed(std::size_t /*jobs*/, std::size_t /*callbacks*/, bool /*at_start*/) {}
  /// A batch goes to the model; `waits` is how long each of its items waited for a worker.
  virtual void on_batch_started(const std::vector<std::chrono::steady_clock::duration>& /*waits*/) {
  }
  /// The model answered a batch after `inference_seconds`.
  virtual void on_batch_finished(std::size_t /*size*/, double /*inference_seconds*/) {}
  /// The model answered a batch that the inference timeout had already answered.
  virtual void on_late_result(std::size_t /*size*/, double /*inference_seconds*/) {}
  /// A job reached `succeeded` or `failed`; `inference_ms` < 0: the model never answered.
  virtual void on_completed(const JobRecord& /*record*/, std::size_t /*batch_size*/,
                            double /*inference_ms*/) {}
  /// A job waited past its time-to-live and ends `expired` without running.
  virtual void on_expired(const JobRecord& /*record*/, std::chrono::milliseconds /*ttl*/) {}
  /// A synchronous invocation was answered.
  virtual void on_invocation(bool /*succeeded*/) {}
  /// A job was cancelled (`JobQueue::cancel`): it ends `cancelled`.
  virtual void on_cancelled(const std::string& /*job_id*/) {}
  /// A running job's result was thrown away: the job was cancelled, or its lease was lost to
  /// another server's claim.
  virtual void on_discarded(const std::string& /*job_id*/) {}
  /// A callback attempt ended (delivered, retry with its delay, or give_up), or a callback was
  /// deferred (not sent, back in the store until `report.next_delay` has passed).
  virtual void on_attempt(const std::string& /*job_id*/, const AttemptReport& /*report*/) {}
  /// A given-up callback goes back into delivery.
  virtual void on_redelivery(const std::string& /*job_id*/, int /*previous_attempts*/) {}
  /// A receiver origin's circuit opened (`failures` in a row) or closed again.
  virtual void on_circuit(const std::string& /*origin*/, CircuitState /*state*/,
                          std::size_t /*failures*/) {}
  /// An operator paused (true) or resumed (false) callbacks to a receiver origin.
  virtual void on_origin_paused(const std::string& /*origin*/, bool /*paused*/) {}
  /// An acknowledgement was refused: the lease had run out and the work is another claim's.
  virtual void on_lease_lost(const std::string& /*job_id*/, std::string_view /*during*/) {}
  /// A store call failed (`job_id` empty when it was about no job in particular).
  virtual void on_store_error(std::string_view /*during*/, const std::string& /*job_id*/,
                              std::string_view /*why*/) {}
  /// The store started failing (once per failing spell), and works again.
  virtual void on_store_failing(std::string_view /*during*/, const std::string& /*job_id*/,
                                std::string_view /*why*/) {}
  virtual void on_store_recovered() {}
  /// The queue's metrics, once it is built (an observer that counts into them, as OtlpTracer
  /// does), and nullptr before they go (the queue is destroyed): no count after that.
  virtual void on_metrics(const Metrics* /*metrics*/) {}
};

}  // namespace rebound
