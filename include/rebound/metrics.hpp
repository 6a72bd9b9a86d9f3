// Metrics: lock-free counters and histograms, rendered in the Prometheus text format.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

namespace rebound {

/// A histogram with fixed upper bounds; observations are lock-free. Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds)
      : bounds_(std::move(upper_bounds)), buckets_(bounds_.size() + 1) {}

  void observe(double value) {
    std::size_t i = 0;
    while (i < bounds_.size() && value > bounds_[i])
      ++i;
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    // The sum is kept in millionths so that it can be an integer atomic.
    sum_micro_.fetch_add(static_cast<std::int64_t>(value * 1e6), std::memory_order_relaxed);
  }

  /// Appends `name_bucket{le=...}`, `name_sum` and `name_count` lines.
  void render(std::string& out, const std::string& name) const {
    std::uint64_t cumulative = 0;
    char line[256];
    for (std::size_t i = 0; i <= bounds_.size(); ++i) {
      cumulative += buckets_[i].load(std::memory_order_relaxed);
      if (i < bounds_.size()) {
        std::snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name.c_str(), bounds_[i],
                      static_cast<unsigned long long>(cumulative));
      } else {
        std::snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n", name.c_str(),
                      static_cast<unsigned long long>(cumulative));
      }
      out += line;
    }
    std::snprintf(line, sizeof line, "%s_sum %.6f\n%s_count %llu\n", name.c_str(),
                  static_cast<double>(sum_micro_.load(std::memory_order_relaxed)) / 1e6,
                  name.c_str(), static_cast<unsigned long long>(cumulative));
    out += line;
  }

  std::uint64_t count() const {
    std::uint64_t n = 0;
    for (const auto& b : buckets_)
      n += b.load(std::memory_order_relaxed);
    return n;
  }

 private:
  std::vector<double> bounds_;
  std::vector<std::atomic<std::uint64_t>> buckets_;
  std::atomic<std::int64_t> sum_micro_{0};
};

/// What rebound counts. Updated by the JobQueue; rendered by `GET /metrics`. Thread-safe.
struct Metrics {
  using Counter = std::atomic<std::uint64_t>;

  Counter jobs_accepted{0};
  Counter jobs_resumed{0};
  Counter jobs_succeeded{0};
  Counter jobs_failed{0};
  Counter jobs_expired{0};
  Counter jobs_cancelled{0};
  Counter results_discarded{0};
  Counter submissions_refused_queue_full{0};
  Counter submissions_refused_tenant_quota{0};
  Counter submissions_refused_tenant_rate{0};
  Counter submissions_refused_not_ready{0};
  Counter submissions_refused_store_unavailable{0};
  Counter store_errors{0};
  Counter leases_lost{0};
  /// Kept by an OtlpTracer (OtlpTracer::count_into), which may count into a const Metrics.
  mutable Counter trace_spans_exported{0};
  mutable Counter trace_spans_dropped{0};
  Counter invocations_succeeded{0};
  Counter invocations_failed{0};
  Counter callback_attempts_delivered{0};
  Counter callback_attempts_retried{0};
  Counter callback_attempts_given_up{0};
  Counter callback_deferrals{0};
  Counter callbacks_delivered{0};
  Counter callbacks_given_up{0};

  Histogram queue_wait_seconds{
      {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram inference_seconds{{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                               0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram batch_size{{1, 2, 4, 8, 16, 32, 64, 128, 256}};

  /// The Prometheus text exposition (format 0.0.4); gauges are passed in by the caller.
  std::string render(std::size_t queue_depth, std::size_t jobs_in_flight,
                     std::size_t deliveries_in_flight) const {
    std::string out;
    out.reserve(4096);
    auto counter = [&](const char* name, const char* help, const char* labels, const Counter& c) {
      char line[320];
      if (help) {
        std::snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
        out += line;
      }
      std::snprintf(line, sizeof line, "%s%s %llu\n", name, labels,
                    static_cast<unsigned long long>(c.load(std::memory_order_relaxed)));
      out += line;
    };
    auto gauge = [&](const char* name, const char* help, std::size_t value) {
      char line[320];
      std::snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s gauge\n%s %zu\n", name, help, name,
                    name, value);
      out += line;
    };
    auto histogram = [&](const char* name, const char* help, const Histogram& h) {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
      h.render(out, name);
    };
    counter("rebound_jobs_accepted_total", "Jobs accepted (202) by POST /v1/inferences.", "",
            jobs_accepted);
    counter("rebound_jobs_resumed_total",
            "Jobs claimed from the store (at start, or after a lease ran out).", "", jobs_resumed);
    counter("rebound_jobs_completed_total", "Jobs that reached a final status, by status.",
            "{status=\"succeeded\"}", jobs_succeeded);
    counter("rebound_jobs_completed_total", nullptr, "{status=\"failed\"}", jobs_failed);
    counter("rebound_jobs_completed_total", nullptr, "{status=\"expired\"}", jobs_expired);
    counter("rebound_jobs_completed_total", nullptr, "{status=\"cancelled\"}", jobs_cancelled);
    counter("rebound_results_discarded_total",
            "Model results thrown away: the job was cancelled, or another server took it over.", "",
            results_discarded);
    counter("rebound_submissions_refused_total", "Submissions and invocations refused, by reason.",
            "{reason=\"queue_full\"}", submissions_refused_queue_full);
    counter("rebound_submissions_refused_total", nullptr, "{reason=\"not_ready\"}",
            submissions_refused_not_ready);
    counter("rebound_submissions_refused_total", nullptr, "{reason=\"store_unavailable\"}",
            submissions_refused_store_unavailable);
    counter("rebound_submissions_refused_total", nullptr, "{reason=\"tenant_quota\"}",
            submissions_refused_tenant_quota);
    counter("rebound_submissions_refused_total", nullptr, "{reason=\"tenant_rate\"}",
            submissions_refused_tenant_rate);
    counter("rebound_store_errors_total",
            "Job store calls that failed (each is retried or refused; see the store_failed log).",
            "", store_errors);
    counter("rebound_trace_spans_exported_total",
            "Trace spans an OTLP collector accepted (--otlp-endpoint).", "", trace_spans_exported);
    counter("rebound_trace_spans_dropped_total",
            "Trace spans dropped: the export queue was full, or an export failed for good.", "",
            trace_spans_dropped);
    counter("rebound_leases_lost_total",
            "Acknowledgements refused because the lease had run out (another claim has the work).",
            "", leases_lost);
    counter("rebound_invocations_total", "Synchronous invocations answered, by outcome.",
            "{outcome=\"succeeded\"}", invocations_succeeded);
    counter("rebound_invocations_total", nullptr, "{outcome=\"failed\"}", invocations_failed);
    counter("rebound_callback_attempts_total", "Callback attempts, by what followed.",
            "{outcome=\"delivered\"}", callback_attempts_delivered);
    counter("rebound_callback_attempts_total", nullptr, "{outcome=\"retry\"}",
            callback_attempts_retried);
    counter("rebound_callback_attempts_total", nullptr, "{outcome=\"give_up\"}",
            callback_attempts_given_up);
    counter("rebound_callback_deferrals_total",
            "Callbacks not sent when due (the receiver's circuit open, paused, or at its limits), "
            "put back in the store; no attempt spent.",
            "", callback_deferrals);
    counter("rebound_callbacks_delivered_total", "Callbacks delivered (a 2xx).", "",
            callbacks_delivered);
    counter("rebound_callbacks_given_up_total", "Callbacks given up (now listed as failed).", "",
            callbacks_given_up);
    gauge("rebound_queue_depth", "Jobs and invocations waiting for a worker.", queue_depth);
    gauge("rebound_jobs_in_flight",
          "Jobs and invocations accepted and not finished (delivery included).", jobs_in_flight);
    gauge("rebound_callbacks_in_flight",
          "Callback attempts under way (retries waiting for their time are in the store).",
          deliveries_in_flight);
    histogram("rebound_queue_wait_seconds", "Time from acceptance to the start of inference.",
              queue_wait_seconds);
    histogram("rebound_inference_seconds", "Time of one Model::predict or predict_batch call.",
              inference_seconds);
    histogram("rebound_batch_size", "Jobs and invocations per model call.", batch_size);
    return out;
  }
};

}  // namespace rebound
