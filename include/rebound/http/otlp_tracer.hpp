// OtlpTracer: OpenTelemetry traces of a JobQueue's jobs, exported over OTLP/HTTP (JSON).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "rebound/observer.hpp"

namespace rebound {

struct Metrics;

struct OtlpTracerOptions {
  /// Where spans are POSTed: the full traces URL (`http://collector:4318/v1/traces`). See
  /// otlp_traces_endpoint for the OTEL_EXPORTER_OTLP_* variables.
  std::string endpoint;
  std::string service_name = "rebound";  ///< the resource's `service.name`
  std::string server_id;                 ///< `service.instance.id` (JobQueueOptions::server_id)
  std::string model_name;  ///< span names ("send <model>") and `messaging.destination.name`
  /// Spans waiting to be exported, at most: beyond it new spans are dropped (and counted), so a
  /// collector that is down costs bounded memory and never slows a job.
  std::size_t max_queued_spans = 8192;
  std::size_t max_batch_spans = 512;         ///< spans in one export request, at most
  std::chrono::milliseconds interval{2000};  ///< a batch goes at least this often
  std::chrono::milliseconds request_timeout{10000};
  /// An export answered 429, 502, 503 or 504 (or not at all) is sent again up to this many
  /// times in all, after the collector's Retry-After (at most `max_retry_delay`) or a backoff.
  int max_tries = 4;
  std::chrono::milliseconds max_retry_delay{30000};
  /// What the destructor may spend exporting what is queued (one try per batch, the transfer
  /// under way cut at the deadline): a hung collector delays a shutdown by this much at most.
  std::chrono::milliseconds shutdown_timeout{5000};
};

/// The traces URL from the environment, as the OpenTelemetry specification names it:
/// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as is, else OTEL_EXPORTER_OTLP_ENDPOINT + "/v1/traces";
/// nullopt when neither is set (or set empty), and when OTEL_SDK_DISABLED=true or
/// OTEL_TRACES_EXPORTER=none turns traces off.
std::optional<std::string> otlp_traces_endpoint_from_environment();

/// `base` + "/v1/traces", unless it ends with "/v1/traces" already (a full traces URL).
std::string otlp_traces_endpoint(std::string base);

/// An Observer that records each job's trace and exports it over OTLP/HTTP with JSON encoding,
/// following OpenTelemetry's messaging conventions: the submission (`send <model>`, PRODUCER,
/// from on_submission_traced: set JobQueueOptions::trace_submissions), the run (`process
/// <model>`, CONSUMER, from its start to its final state, with the queue wait as
/// `rebound.queue_wait_ms`), and each callback attempt (`POST`, CLIENT, whose span id is the
/// parent id of the `traceparent` header that attempt carried; retries carry
/// `http.request.resend_count`). The run and the attempts are children of the submission's span.
/// A trace whose flags say it is not sampled (a caller's `traceparent` ending in -00) is not
/// exported. The queue's metrics count what is exported and dropped (on_metrics).
///
/// Spans wait in a bounded queue and go out in batches from a thread of the tracer's own (libcurl),
/// so a slow or failing collector never holds up a job; what cannot be queued or exported is
/// dropped and counted. The destructor exports what is queued (one try per batch).
///
/// Example:
///   rebound::OtlpTracerOptions to;
///   to.endpoint = "http://127.0.0.1:4318/v1/traces";
///   to.model_name = "iris";
///   auto tracer = std::make_shared<rebound::OtlpTracer>(to);
///   options.observers.push_back(tracer);
///   options.trace_submissions = true;
///   rebound::JobQueue queue(model, store, options);  // counts into its /metrics from now on
///
/// Thread-safety: the hooks are called from any thread; every method is thread-safe.
class OtlpTracer final : public Observer {
 public:
  /// Throws rebound::Error for an endpoint that is not an http:// or https:// URL.
  explicit OtlpTracer(OtlpTracerOptions options);
  ~OtlpTracer() override;
  OtlpTracer(const OtlpTracer&) = delete;
  OtlpTracer& operator=(const OtlpTracer&) = delete;

  void on_submission_traced(const SubmissionTrace& trace) override;
  void on_completed(const JobRecord& record, std::size_t batch_size, double inference_ms) override;
  void on_expired(const JobRecord& record, std::chrono::milliseconds ttl) override;
  void on_attempt(const std::string& job_id, const AttemptReport& report) override;
  void on_metrics(const Metrics* metrics) override { count_into(metrics); }

  /// Spans the collector accepted, and spans dropped (queue full, or an export that failed for
  /// good).
  std::uint64_t exported() const;
  std::uint64_t dropped() const;
  /// Also counts them into `metrics` (GET /metrics: rebound_trace_spans_exported_total,
  /// rebound_trace_spans_dropped_total), from now on; nullptr stops it (returning once no count
  /// is under way). A JobQueue does both through on_metrics.
  void count_into(const Metrics* metrics);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace rebound
