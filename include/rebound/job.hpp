// A job, the states it moves through, and its stored record.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace rebound {

/// Where a job is in its life. `succeeded`, `failed`, `expired` and `cancelled` are final.
enum class JobStatus { queued, running, succeeded, failed, expired, cancelled };

/// Where the delivery of a job's result to its `callback_url` is.
/// `none`: the job has no callback (poll only) or its result is not ready yet.
enum class CallbackState { none, pending, delivered, failed };

inline std::string_view to_string(JobStatus status) {
  switch (status) {
    case JobStatus::queued:
      return "queued";
    case JobStatus::running:
      return "running";
    case JobStatus::succeeded:
      return "succeeded";
    case JobStatus::failed:
      return "failed";
    case JobStatus::expired:
      return "expired";
    case JobStatus::cancelled:
      return "cancelled";
  }
  return "unknown";
}

inline std::string_view to_string(CallbackState state) {
  switch (state) {
    case CallbackState::none:
      return "none";
    case CallbackState::pending:
      return "pending";
    case CallbackState::delivered:
      return "delivered";
    case CallbackState::failed:
      return "failed";
  }
  return "unknown";
}

/// The text `to_string` spells, read back: `from_string<JobStatus>("queued")`,
/// `from_string<CallbackState>("failed")`; nullopt for any other text. (The names are spelled
/// once, in `to_string`; the stores and the HTTP API read them with this.)
template <typename Enum>
std::optional<Enum> from_string(std::string_view text);

namespace detail {
template <typename Enum>
std::optional<Enum> spelled_as(std::string_view text, std::initializer_list<Enum> values) {
  for (Enum v : values) {
    if (to_string(v) == text) return v;
  }
  return std::nullopt;
}
}  // namespace detail

template <>
inline std::optional<JobStatus> from_string<JobStatus>(std::string_view text) {
  return detail::spelled_as(text, {JobStatus::queued, JobStatus::running, JobStatus::succeeded,
                                   JobStatus::failed, JobStatus::expired, JobStatus::cancelled});
}

template <>
inline std::optional<CallbackState> from_string<CallbackState>(std::string_view text) {
  return detail::spelled_as(text, {CallbackState::none, CallbackState::pending,
                                   CallbackState::delivered, CallbackState::failed});
}

/// True for the statuses a job never leaves.
inline bool is_final(JobStatus status) {
  return status == JobStatus::succeeded || status == JobStatus::failed ||
         status == JobStatus::expired || status == JobStatus::cancelled;
}

/// A machine-readable code and a human sentence, for a failed job or a failed request.
struct ErrorInfo {
  std::string code;
  std::string message;
};

/// Priorities run from 0 (first) to 9 (last); FIFO within one priority.
inline constexpr int highest_priority = 0;
inline constexpr int lowest_priority = 9;
inline constexpr int default_priority = 5;

/// Which events of a job its callback URL hears (`webhook_events`), as bits.
enum WebhookEvent : std::uint8_t {
  webhook_started = 1,    ///< `{"id", "status": "running"}` when the job starts running
  webhook_completed = 2,  ///< the final status, result or error (the callback of the seed)
};

/// Which model a job runs on: a model's name and one of its versions. In a Job as submitted, an
/// empty field is left for the queue to choose (the name: its default model; the version: that
/// model's route); the queue fills both in before it stores the job, so that a stored job
/// (`JobRecord::job.model`) names the version that runs it, and its status and callback say so.
/// A JobQueue built on one Model serves it as version "1" of `Model::name()`.
struct ModelRef {
  std::string name;
  std::string version;  ///< a positive integer's decimal text, e.g. "2"

  bool empty() const { return name.empty() && version.empty(); }
  friend bool operator==(const ModelRef& a, const ModelRef& b) {
    return a.name == b.name && a.version == b.version;
  }
  friend bool operator!=(const ModelRef& a, const ModelRef& b) { return !(a == b); }
};

/// What a caller submitted: the unit of work that flows from the HTTP route to the model.
struct Job {
  /// The id its tenant gave it: unique per tenant within a store; never holds a '/'.
  std::string id;
  std::string callback_url;  ///< Empty: the result is kept for polling only.
  nlohmann::json input;      ///< Handed to the model as is; `null` when absent.
  std::chrono::system_clock::time_point created_at{};
  /// 0 (runs first) to 9 (runs last); FIFO within one priority.
  int priority = default_priority;
  /// The job ends `expired` if it has not started this long after `created_at`. 0: the
  /// queue's `job_ttl`.
  std::chrono::milliseconds max_queue{0};
  /// WebhookEvent bits: which events the callback URL hears.
  std::uint8_t webhook_events = webhook_completed;
  /// The W3C `traceparent` the job was submitted with (empty: none); its callbacks carry the same
  /// trace id with a new parent id, and its log lines name the trace.
  std::string traceparent;
  /// The tenant that owns the job (rebound-server: the name of the API key that submitted it);
  /// empty: the single tenant. Two tenants' jobs may share an id (rebound/tenant.hpp). Last, so
  /// that a braced Job of the fields above reads as before.
  std::string tenant;
  /// The model and version it runs on (ModelRef): empty fields are chosen by the queue at
  /// submission, and a stored job has both.
  ModelRef model;

  /// True when the callback URL hears the job's end (the callback a JobStore keeps the delivery
  /// state of): a URL, with `completed` among its events.
  bool wants_completion_callback() const {
    return !callback_url.empty() && (webhook_events & webhook_completed) != 0;
  }
  /// True when the callback URL hears the job start.
  bool wants_started_callback() const {
    return !callback_url.empty() && (webhook_events & webhook_started) != 0;
  }

  /// True when `other` is the same request (used for idempotent resubmission). The trace context
  /// is not part of the request: a retry from another span is still the same job. Of the model,
  /// the name is (another model is another request) and the version is not: it is the queue's
  /// choice at the first submission (a route may choose another later), and a resubmission is
  /// answered with the job as stored, which names the version that runs it. (A job stored
  /// without a model, by a server from before models were named, matches any.)
  bool same_request_as(const Job& other) const {
    return id == other.id && tenant == other.tenant && callback_url == other.callback_url &&
           input == other.input && priority == other.priority && max_queue == other.max_queue &&
           webhook_events == other.webhook_events &&
           (model.name == other.model.name || model.name.empty() || other.model.name.empty());
  }
};

/// A job with an id, an input and, when given, a callback URL; every other field at its default.
///   queue.async_submit(rebound::make_job("job-1", {{"x", 1}}), boost::asio::use_future);
inline Job make_job(std::string id, nlohmann::json input = nullptr, std::string callback_url = {}) {
  Job job;
  job.id = std::move(id);
  job.input = std::move(input);
  job.callback_url = std::move(callback_url);
  return job;
}

/// The state of a job's callback delivery, and its retry schedule while it is pending.
struct CallbackInfo {
  CallbackState state = CallbackState::none;
  int attempts = 0;        ///< Attempts made so far, over all deliveries of this job.
  std::string last_error;  ///< Why the last attempt failed; empty when none has.
  /// When the next attempt is due, while `pending` (the epoch: at once). The schedule lives in the
  /// store, so a retry hours away costs no memory, and a restart keeps it.
  std::chrono::system_clock::time_point next_attempt_at{};
  /// What the backoff policy needs for the delay after the next attempt: the attempts of this
  /// delivery (a redelivery starts again at 0), when it began, and the last delay it chose.
  int delivery_attempts = 0;
  std::chrono::system_clock::time_point delivery_started_at{};
  std::chrono::milliseconds previous_delay{0};
};

/// How a job ended, as its record keeps it: its result or its error, and when. Its final status is
/// the record's own (`JobRecord::status`), kept once.
struct JobEnd {
  nlohmann::json result;           ///< The model's output when the job `succeeded`.
  std::optional<ErrorInfo> error;  ///< Set when it `failed`, `expired` or was `cancelled`.
  /// When the job became final (the epoch: not recorded).
  std::chrono::system_clock::time_point finished_at{};
};

/// How a job ended, as it is handed to a JobStore: its final status, with the JobEnd the record
/// keeps.
struct JobOutcome : JobEnd {
  JobStatus status = JobStatus::failed;

  JobOutcome() = default;
  JobOutcome(JobStatus final_status, nlohmann::json output, std::optional<ErrorInfo> why,
             std::chrono::system_clock::time_point at = {})
      : JobEnd{std::move(output), std::move(why), at}, status(final_status) {}
  /// The outcome of a final record.
  JobOutcome(JobStatus final_status, JobEnd end) : JobEnd(std::move(end)), status(final_status) {}

  /// The version that ran the job, when it is not the one the job was stored with (an unload with
  /// QueuedJobs::reroute sent the job to its model's route instead): finish_job records it as the
  /// job's version (JobRecord::job.model), so that the record and the callback agree. Empty: the
  /// stored version ran it.
  std::string ran_on_version;
};

/// One callback attempt as the store keeps it for the people who look at a job later (the
/// operator console): when it went, what came back, how long it took, which signatures it carried.
/// Deferrals (not sent: an open circuit, a pause) are not attempts and are not kept.
struct CallbackAttempt {
  std::chrono::system_clock::time_point at{};  ///< when the attempt was sent
  int http_status = 0;                         ///< the receiver's status; 0: no HTTP answer
  std::string error;  ///< why it failed ("HTTP 503", "timeout: ..."); empty when delivered
  std::chrono::milliseconds latency{0};  ///< from handing it to the transport to its end
  /// The signature schemes the request carried, comma-separated ("v1", "v1,v1a"; empty: unsigned).
  std::string signatures;
};

/// How many attempts a store keeps per job (the latest; older ones are dropped).
inline constexpr std::size_t max_attempt_log = 10;
/// How much of an attempt's error a store keeps.
inline constexpr std::size_t max_attempt_error_bytes = 256;

/// A job as a JobStore keeps it: the request, where it is, and how it ended.
struct JobRecord {
  Job job;
  JobStatus status = JobStatus::queued;
  JobEnd outcome;  ///< Meaningful once `status` is final.
  CallbackInfo callback;
  /// When the job started running (the epoch: it has not, or the store does not know).
  std::chrono::system_clock::time_point started_at{};
  /// The latest callback attempts, oldest first, at most `max_attempt_log` (empty where a store
  /// keeps none, and in listings).
  std::vector<CallbackAttempt> attempt_log;
};

}  // namespace rebound
