// OtlpTracer (rebound/http/otlp_tracer.hpp): spans built from the pipeline's events, queued
// (bounded), and exported in batches over OTLP/HTTP with JSON encoding by one thread with libcurl.
#include "rebound/http/otlp_tracer.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "common/retry_after.hpp"
#include "common/text.hpp"
#include "common/trace_context.hpp"
#include "rebound/detail/json.hpp"
#include "rebound/error.hpp"
#include "rebound/metrics.hpp"
#include "rebound/tenant.hpp"
#include "rebound/version.hpp"

namespace rebound {

namespace {
// An environment variable's value as set, "" when it is not.
std::string_view environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}
}  // namespace

std::optional<std::string> otlp_traces_endpoint_from_environment() {
  if (detail::equals_ignoring_case(environment("OTEL_SDK_DISABLED"), "true")) return std::nullopt;
  if (detail::equals_ignoring_case(environment("OTEL_TRACES_EXPORTER"), "none"))
    return std::nullopt;
  const char* traces = std::getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
  if (traces && *traces) return std::string(traces);
  const char* base = std::getenv("OTEL_EXPORTER_OTLP_ENDPOINT");
  if (!base || !*base) return std::nullopt;
  return otlp_traces_endpoint(base);
}

std::string otlp_traces_endpoint(std::string url) {
  while (!url.empty() && url.back() == '/')
    url.pop_back();
  constexpr std::string_view path = "/v1/traces";
  if (url.size() >= path.size() && url.compare(url.size() - path.size(), path.size(), path) == 0)
    return url;
  return url + std::string(path);
}

namespace {

// OTLP's SpanKind and StatusCode numbers.
enum Kind { kClient = 3, kProducer = 4, kConsumer = 5 };
enum Status { kUnset = 0, kOk = 1, kError = 2 };

struct Span {
  std::string trace_id, span_id, parent_id, name;
  Kind kind = kClient;
  std::chrono::system_clock::time_point start, end;
  nlohmann::json attributes = nlohmann::json::array();
  Status status = kUnset;
  std::string status_message;
};

std::string nanos(std::chrono::system_clock::time_point t) {
  return std::to_string(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

void add(nlohmann::json& attributes, const char* key, const std::string& value) {
  attributes.push_back({{"key", key}, {"value", {{"stringValue", value}}}});
}
void add(nlohmann::json& attributes, const char* key, std::int64_t value) {
  // (OTLP/JSON writes 64-bit integers as strings.)
  attributes.push_back({{"key", key}, {"value", {{"intValue", std::to_string(value)}}}});
}
void add(nlohmann::json& attributes, const char* key, double value) {
  attributes.push_back({{"key", key}, {"value", {{"doubleValue", value}}}});
}

// Whether a valid traceparent's flags say its trace is sampled (W3C: bit 0).
bool sampled(const std::string& traceparent) {
  const char low = traceparent[54];
  const int value = low >= 'a' ? low - 'a' + 10 : low - '0';
  return (value & 1) != 0;
}

std::string new_span_id() {
  std::string id;
  detail::append_random_hex16(id);
  return id;
}

std::size_t write_nothing(char*, std::size_t size, std::size_t count, void*) {
  return size * count;
}

std::size_t keep_retry_after(char* data, std::size_t size, std::size_t count, void* out) {
  constexpr std::string_view name = "retry-after:";
  const std::string_view line(data, size * count);
  if (line.size() > name.size() && detail::starts_with_ignoring_case(line, name)) {
    const std::string_view value = line.substr(name.size());
    const auto first = value.find_first_not_of(" \t");
    const auto last = value.find_last_not_of(" \t\r\n");
    *static_cast<std::string*>(out) = first == std::string_view::npos
                                          ? std::string()
                                          : std::string(value.substr(first, last - first + 1));
  }
  return size * count;
}

}  // namespace

struct OtlpTracer::Impl {
  explicit Impl(OtlpTracerOptions o) : options(std::move(o)) {
    if (options.endpoint.rfind("http://", 0) != 0 && options.endpoint.rfind("https://", 0) != 0) {
      throw Error("OTLP endpoint: not an http:// or https:// URL: '" + options.endpoint + "'");
    }
    options.max_batch_spans = std::max<std::size_t>(1, options.max_batch_spans);
    options.max_tries = std::max(1, options.max_tries);
    options.interval = std::max(options.interval, std::chrono::milliseconds(10));
    options.request_timeout = std::max(options.request_timeout, std::chrono::milliseconds(1));
    exporter = std::thread([this] { run(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
      flush_until = std::chrono::steady_clock::now() + options.shutdown_timeout;
    }
    wake.notify_all();
    exporter.join();
  }

  // Past the shutdown's deadline: nothing more is sent (the transfer under way is cut).
  bool past_deadline() const {
    const auto until = flush_until.load();
    return until != std::chrono::steady_clock::time_point::max() &&
           std::chrono::steady_clock::now() >= until;
  }

  void push(Span span) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!stopping && queue.size() < options.max_queued_spans) {
        queue.push_back(std::move(span));
        if (queue.size() < options.max_batch_spans) return;
      } else {
        count_dropped(1);
        return;
      }
    }
    wake.notify_all();  // a full batch goes at once
  }

  void count_dropped(std::size_t n) {
    dropped += n;
    std::lock_guard<std::mutex> lock(metrics_mutex);
    if (metrics) metrics->trace_spans_dropped += n;
  }
  void count_exported(std::size_t n) {
    exported += n;
    std::lock_guard<std::mutex> lock(metrics_mutex);
    if (metrics) metrics->trace_spans_exported += n;
  }

  // The exporter's thread: a batch when one is full or the interval has passed; at the end what
  // is left, one try per batch.
  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      wake.wait_for(lock, options.interval,
                    [&] { return stopping || queue.size() >= options.max_batch_spans; });
      while (!queue.empty()) {
        const std::size_t n = std::min(queue.size(), options.max_batch_spans);
        std::vector<Span> batch(std::make_move_iterator(queue.begin()),
                                std::make_move_iterator(queue.begin() + static_cast<long>(n)));
        queue.erase(queue.begin(), queue.begin() + static_cast<long>(n));
        const bool last_call = stopping;
        lock.unlock();
        try {
          send(batch, last_call);
        } catch (...) {
          count_dropped(batch.size());  // out of memory building the body, say: the thread goes on
        }
        lock.lock();
        if (!stopping && queue.size() < options.max_batch_spans) break;
      }
      if (stopping && queue.empty()) return;
    }
  }

  std::string body_of(const std::vector<Span>& batch) const {
    nlohmann::json resource = nlohmann::json::array();
    add(resource, "service.name", options.service_name);
    if (!options.server_id.empty()) add(resource, "service.instance.id", options.server_id);
    add(resource, "service.version", std::string(version));
    nlohmann::json spans = nlohmann::json::array();
    for (const Span& s : batch) {
      nlohmann::json span = {{"traceId", s.trace_id},
                             {"spanId", s.span_id},
                             {"name", s.name},
                             {"kind", static_cast<int>(s.kind)},
                             {"startTimeUnixNano", nanos(s.start)},
                             {"endTimeUnixNano", nanos(std::max(s.start, s.end))},
                             {"attributes", s.attributes}};
      if (!s.parent_id.empty()) span["parentSpanId"] = s.parent_id;
      if (s.status != kUnset) {
        span["status"] = {{"code", static_cast<int>(s.status)}};
        if (!s.status_message.empty()) span["status"]["message"] = s.status_message;
      }
      spans.push_back(std::move(span));
    }
    nlohmann::json body = {
        {"resourceSpans",
         {{{"resource", {{"attributes", resource}}},
           {"scopeSpans",
            {{{"scope", {{"name", "rebound"}, {"version", std::string(version)}}},
              {"spans", spans}}}}}}}};
    return detail::dump_json(body);
  }

  // One batch, tried again on 429/502/503/504 or no answer (not when `last_call`: the tracer
  // is going); dropped and counted when it fails for good.
  void send(const std::vector<Span>& batch, bool last_call) {
    if (past_deadline()) return count_dropped(batch.size());
    const std::string body = body_of(batch);
    for (int attempt = 1;; ++attempt) {
      std::string retry_after;
      const long status = post(body, retry_after);
      if (status >= 200 && status < 300) return count_exported(batch.size());
      const bool passing =
          status == 0 || status == 429 || status == 502 || status == 503 || status == 504;
      if (!passing || last_call || attempt >= options.max_tries) {
        return count_dropped(batch.size());
      }
      std::chrono::milliseconds pause =
          std::min(options.max_retry_delay, std::chrono::milliseconds(250 << std::min(attempt, 7)));
      if (!retry_after.empty()) {
        if (const auto after =
                detail::parse_retry_after(retry_after, std::chrono::system_clock::now())) {
          pause = std::min(options.max_retry_delay, *after);
        }
      }
      std::unique_lock<std::mutex> lock(mutex);
      if (wake.wait_for(lock, pause, [&] { return stopping; })) {
        return count_dropped(batch.size());  // going: no more tries for a batch that failed
      }
    }
  }

  static int cut_at_deadline(void* impl, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<const Impl*>(impl)->past_deadline() ? 1 : 0;
  }

  // POSTs `body`; the HTTP status, or 0 when there was no answer.
  long post(const std::string& body, std::string& retry_after) {
    if (!curl) curl.reset(curl_easy_init());
    CURL* c = curl.get();
    if (!c) return 0;
    curl_easy_reset(c);
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, options.endpoint.c_str());
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(options.request_timeout.count()));
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, cut_at_deadline);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, this);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_nothing);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, keep_retry_after);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &retry_after);
    long status = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    return status;
  }

  OtlpTracerOptions options;
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Span> queue;
  bool stopping = false;
  std::atomic<std::chrono::steady_clock::time_point> flush_until{
      std::chrono::steady_clock::time_point::max()};
  std::atomic<std::uint64_t> exported{0}, dropped{0};
  std::mutex metrics_mutex;  // count_into(nullptr) returns once no count is under way
  const Metrics* metrics = nullptr;
  struct CurlFree {
    void operator()(CURL* c) const { curl_easy_cleanup(c); }
  };
  std::unique_ptr<CURL, CurlFree> curl;  // the exporter thread's only
  std::thread exporter;                  // (last: started once the rest is built)
};

OtlpTracer::OtlpTracer(OtlpTracerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

OtlpTracer::~OtlpTracer() = default;

std::uint64_t OtlpTracer::exported() const {
  return impl_->exported.load();
}
std::uint64_t OtlpTracer::dropped() const {
  return impl_->dropped.load();
}
void OtlpTracer::count_into(const Metrics* metrics) {
  std::lock_guard<std::mutex> lock(impl_->metrics_mutex);
  impl_->metrics = metrics;
}

namespace {

// The model a span names: the job's (a queue of several models), else the tracer's.
const std::string& model_of(const ModelRef& model, const OtlpTracerOptions& o) {
  return model.name.empty() ? o.model_name : model.name;
}

void messaging(nlohmann::json& a, const char* operation, const std::string& job_id,
               const ModelRef& model, const OtlpTracerOptions& o) {
  add(a, "messaging.system", std::string("rebound"));
  add(a, "messaging.operation.type", std::string(operation));
  add(a, "messaging.operation.name", std::string(operation));
  add(a, "messaging.message.id", job_id);
  add(a, "messaging.destination.name", model_of(model, o));
  if (!model.version.empty()) add(a, "rebound.model.version", model.version);
  if (!o.server_id.empty()) add(a, "rebound.server.id", o.server_id);
}

}  // namespace

void OtlpTracer::on_submission_traced(const SubmissionTrace& t) {
  if (!detail::is_valid_traceparent(t.traceparent) || !sampled(t.traceparent)) return;
  Span s;
  s.trace_id = detail::trace_id_of(t.traceparent);
  s.span_id = t.traceparent.substr(36, 16);
  s.parent_id = t.parent_span_id;
  s.name = "send " + model_of(t.model, impl_->options);
  s.kind = kProducer;
  s.start = t.started;
  s.end = t.accepted;
  messaging(s.attributes, "send", t.job_id, t.model, impl_->options);
  impl_->push(std::move(s));
}

void OtlpTracer::on_completed(const JobRecord& record, std::size_t batch_size,
                              double inference_ms) {
  const Job& job = record.job;
  if (!detail::is_valid_traceparent(job.traceparent) || !sampled(job.traceparent)) return;
  Span s;
  s.trace_id = detail::trace_id_of(job.traceparent);
  s.span_id = new_span_id();
  s.parent_id = job.traceparent.substr(36, 16);
  s.name = "process " + model_of(job.model, impl_->options);
  s.kind = kConsumer;
  const auto end = record.outcome.finished_at != std::chrono::system_clock::time_point{}
                       ? record.outcome.finished_at
                       : std::chrono::system_clock::now();
  // From the run's start; a job that never ran (expired) from its acceptance.
  const std::chrono::system_clock::time_point never{};
  s.start = record.started_at != never ? record.started_at
            : job.created_at != never  ? std::min(job.created_at, end)
                                       : end;
  s.end = end;
  messaging(s.attributes, "process", key_of(job), job.model, impl_->options);
  add(s.attributes, "rebound.job.status", std::string(to_string(record.status)));
  if (record.started_at >= job.created_at && job.created_at.time_since_epoch().count() != 0) {
    add(s.attributes, "rebound.queue_wait_ms",
        static_cast<std::int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      record.started_at - job.created_at)
                                      .count()));
  }
  if (batch_size > 1) {
    add(s.attributes, "messaging.batch.message_count", static_cast<std::int64_t>(batch_size));
  }
  if (inference_ms >= 0) add(s.attributes, "rebound.inference_ms", inference_ms);
  if (record.status == JobStatus::succeeded) {
    s.status = kOk;
  } else {
    s.status = kError;
    if (record.outcome.error) {
      add(s.attributes, "error.type", record.outcome.error->code);
      s.status_message = record.outcome.error->code;
    }
  }
  impl_->push(std::move(s));
}

void OtlpTracer::on_expired(const JobRecord& record, std::chrono::milliseconds) {
  on_completed(record, 1, -1);
}

void OtlpTracer::on_attempt(const std::string& job_id, const AttemptReport& report) {
  if (report.verdict == AttemptVerdict::deferred) return;  // nothing was sent
  if (!detail::is_valid_traceparent(report.traceparent) || !sampled(report.traceparent)) return;
  Span s;
  s.trace_id = detail::trace_id_of(report.traceparent);
  s.span_id = report.traceparent.substr(36, 16);
  s.parent_id = report.parent_span_id;
  s.name = "POST";
  s.kind = kClient;
  s.start = report.started_at;
  s.end = report.finished_at;
  add(s.attributes, "http.request.method", std::string("POST"));
  add(s.attributes, "messaging.message.id", job_id);
  if (report.attempt > 1) {
    add(s.attributes, "http.request.resend_count", static_cast<std::int64_t>(report.attempt - 1));
  }
  if (report.response.status > 0) {
    add(s.attributes, "http.response.status_code",
        static_cast<std::int64_t>(report.response.status));
  }
  if (report.verdict == AttemptVerdict::delivered) {
    s.status = kOk;
  } else {
    s.status = kError;
    const std::string type = report.response.status > 0 ? std::to_string(report.response.status)
                                                        : std::string("transport_error");
    add(s.attributes, "error.type", type);
    s.status_message = report.error;
  }
  impl_->push(std::move(s));
}

}  // namespace rebound
