// Console: the embedded operator console and the JSON routes behind it (docs/console.md).
#include "console.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/embedded_files.hpp"
#include "common/submission.hpp"
#include "list_cursor.hpp"
#include "rebound/detail/json.hpp"
#include "rebound/detail/wire.hpp"
#include "rebound/store/job_store.hpp"
#include "rebound/tenant.hpp"

namespace rebound::detail {
namespace {

// The page may run its own scripts and styles and talk to this server, nothing else, and no
// other site may frame it.
constexpr const char* content_security_policy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

constexpr std::chrono::seconds sample_every{5};
constexpr std::size_t samples_kept = 121;  // 10 minutes of 5 s steps, and the one before

void send(HttpResponse& res, int status, const nlohmann::json& body) {
  res.status = status;  // Cache-Control: no-store is the Server's, on every console answer
  res.set_content(dump_json(body), "application/json");
}

void send_error(HttpResponse& res, const ApiError& error) {
  send(res, error.status, error.to_json());
}

std::string_view content_type_of(std::string_view name) {
  const auto dot = name.rfind('.');
  const std::string_view ext = dot == std::string_view::npos ? "" : name.substr(dot + 1);
  if (ext == "html") return "text/html; charset=utf-8";
  if (ext == "css") return "text/css; charset=utf-8";
  if (ext == "js" || ext == "mjs") return "text/javascript; charset=utf-8";
  if (ext == "svg") return "image/svg+xml";
  if (ext == "png") return "image/png";
  if (ext == "ico") return "image/x-icon";
  return "application/octet-stream";
}

// One entry of the console's listing: the status without result, and whose job it is.
nlohmann::json entry_json(const JobRecord& record) {
  nlohmann::json out = to_list_entry_json(record);
  out["tenant"] = record.job.tenant;
  return out;
}

// An id prefix: what a job id may start with (or nothing).
bool valid_id_prefix(const std::string& prefix) {
  return prefix.empty() || prefix == "." || prefix == ".." || is_valid_job_id(prefix);
}

nlohmann::json events_json(std::uint8_t events) {
  nlohmann::json out = nlohmann::json::array();
  if (events & webhook_started) out.push_back("started");
  if (events & webhook_completed) out.push_back("completed");
  return out;
}

}  // namespace

nlohmann::json queue_stats_json(const QueueStats& s) {
  nlohmann::json by_priority = nlohmann::json::object();
  for (const auto& [priority, n] : s.queued_by_priority)
    by_priority[std::to_string(priority)] = n;
  const double oldest = s.oldest_queued
                            ? std::max(0.0, std::chrono::duration<double>(
                                                std::chrono::system_clock::now() - *s.oldest_queued)
                                                .count())
                            : 0.0;
  return {{"queued", s.queued},
          {"running", s.running},
          {"oldest_queued_seconds", std::round(oldest * 1000) / 1000},
          {"queued_by_priority", std::move(by_priority)},
          {"callbacks_waiting", s.callbacks_waiting},
          {"callbacks_failed", s.callbacks_failed}};
}

Console::Console(JobQueue& queue, std::vector<std::string> tenants)
    : queue_(queue), tenants_(std::move(tenants)) {
  sampler_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      lock.unlock();
      sample();
      lock.lock();
      wake_.wait_for(lock, sample_every, [this] { return stop_; });
    }
  });
}

Console::~Console() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  sampler_.join();
}

void Console::sample() {
  const Metrics& m = queue_.telemetry().metrics();
  const Sample s{std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count(),
                 m.jobs_accepted.load(),
                 m.jobs_succeeded.load() + m.jobs_failed.load() + m.jobs_expired.load() +
                     m.jobs_cancelled.load()};
  std::lock_guard<std::mutex> lock(mutex_);
  samples_.push_back(s);
  while (samples_.size() > samples_kept)
    samples_.pop_front();
}

bool Console::asset(const std::string& file, HttpResponse& res) const {
  const std::string_view name = file.empty() ? "index.html" : std::string_view(file);
  for (const EmbeddedFile& a : console_assets()) {
    if (a.name != name) continue;
    res.status = 200;
    res.set_header("Content-Security-Policy", content_security_policy);
    res.set_header("X-Frame-Options", "DENY");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Referrer-Policy", "no-referrer");
    res.set_header("Cache-Control", "no-cache");
    res.set_content(std::string(a.data, a.size), std::string(content_type_of(name)));
    return true;
  }
  return false;
}

std::optional<std::string> Console::tenant_param(const HttpRequest& req) const {
  const std::string tenant = req.param("tenant");
  // None: the default tenant's (one tenant; or, with several, jobs stored before they were named).
  if (tenant.empty()) return tenant;
  if (std::find(tenants_.begin(), tenants_.end(), tenant) == tenants_.end()) return std::nullopt;
  return tenant;
}

void Console::session(const std::string& name, bool is_operator, HttpResponse& res) const {
  send(res, 200,
       {{"role", is_operator ? "operator" : "viewer"},
        {"name", name},
        {"tenants", tenants_},
        {"server_id", queue_.operations().server_id()}});
}

void Console::overview(HttpResponse& res) const {
  nlohmann::json queue = nullptr;
  // The count /metrics shows, shared: every open tab refreshes this every 5 s. A failing store
  // leaves the queue out, as it does for the scrapes that do not count: the rest is this
  // server's own.
  try {
    if (const auto s = queue_.telemetry().recent_queue_stats()) queue = queue_stats_json(*s);
  } catch (const StoreUnavailable&) {
  }
  const Metrics& m = queue_.telemetry().metrics();
  nlohmann::json server = {{"accepted", m.jobs_accepted.load()},
                           {"succeeded", m.jobs_succeeded.load()},
                           {"failed", m.jobs_failed.load()},
                           {"expired", m.jobs_expired.load()},
                           {"cancelled", m.jobs_cancelled.load()},
                           {"callbacks_delivered", m.callbacks_delivered.load()},
                           {"callbacks_given_up", m.callbacks_given_up.load()},
                           {"callback_attempts_retried", m.callback_attempts_retried.load()},
                           {"in_flight", queue_.telemetry().in_flight()},
                           {"queue_depth", queue_.telemetry().queue_depth()}};
  nlohmann::json rates = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = 1; i < samples_.size(); ++i) {
      const Sample& a = samples_[i - 1];
      const Sample& b = samples_[i];
      const double dt = static_cast<double>(std::max<std::int64_t>(1, b.t - a.t));
      auto per_s = [&](std::uint64_t from, std::uint64_t to) {
        return std::round(static_cast<double>(to - std::min(from, to)) / dt * 100) / 100;
      };
      rates.push_back({{"t", b.t},
                       {"accepted_per_s", per_s(a.accepted, b.accepted)},
                       {"completed_per_s", per_s(a.completed, b.completed)}});
    }
  }
  send(res, 200, {{"queue", std::move(queue)}, {"server", std::move(server)}, {"rates", rates}});
}

void Console::jobs(const HttpRequest& req, HttpResponse& res) const {
  JobFilter filter;
  if (req.has_param("status") && !req.param("status").empty()) {
    filter.status = from_string<JobStatus>(req.param("status"));
    if (!filter.status) {
      return send_error(res, {422, "invalid_field",
                              "status must be queued, running, succeeded, failed, expired or "
                              "cancelled.",
                              "status"});
    }
  }
  if (req.has_param("callback_state") && !req.param("callback_state").empty()) {
    filter.callback_state = from_string<CallbackState>(req.param("callback_state"));
    if (!filter.callback_state) {
      return send_error(
          res, {422, "invalid_field", "callback_state must be none, pending, delivered or failed.",
                "callback_state"});
    }
  }
  if (req.has_param("priority") && !req.param("priority").empty()) {
    const std::string p = req.param("priority");
    if (p.size() != 1 || p[0] < '0' || p[0] > '9') {
      return send_error(res, {422, "invalid_field", "priority must be 0 to 9.", "priority"});
    }
    filter.priority = p[0] - '0';
  }
  std::size_t limit = 50;
  if (req.has_param("limit")) {
    const auto given = parse_list_limit(req.param("limit"), 200);
    if (!given) return send_error(res, {422, "invalid_field", "limit must be 1 to 200.", "limit"});
    limit = *given;
  }
  const std::string tenant = req.param("tenant");
  if (!tenant.empty() && !tenant_param(req)) {
    return send_error(res, {422, "invalid_field", "tenant is not one of this server's.", "tenant"});
  }
  const std::string id_prefix = req.param("id_prefix");
  if (!valid_id_prefix(id_prefix)) {
    return send_error(
        res, {422, "invalid_field", "id_prefix must be up to 128 characters of A-Z a-z 0-9 . _ : -",
              "id_prefix"});
  }
  // With several tenants and none chosen, every key starts with its tenant: the id prefix is
  // matched here, after the store's page (which may then come back short).
  const bool store_prefix = !tenants_.empty() && tenant.empty();
  filter.id_prefix = store_prefix ? std::string() : job_key(tenant, id_prefix);
  std::optional<ListCursor> after;
  if (req.has_param("cursor")) {
    after = parse_list_cursor_text(req.param("cursor"));
    if (!after) {
      return send_error(res, {422, "invalid_field",
                              "cursor must be a next_cursor of this listing, as given.", "cursor"});
    }
  }
  // The store's pages, until one holds `limit` matches (or after a bound of pages: a short page
  // with its cursor goes back, for the next call to go on).
  nlohmann::json jobs = nlohmann::json::array();
  std::optional<ListCursor> next = after;
  for (int pages = 0; pages < 20 && jobs.size() < limit; ++pages) {
    const JobPage page = queue_.operations().list_jobs(filter, next, limit - jobs.size());
    for (const JobRecord& record : page.jobs) {
      if (store_prefix && record.job.id.compare(0, id_prefix.size(), id_prefix) != 0) continue;
      jobs.push_back(entry_json(record));
    }
    next = page.next;
    if (!next || !store_prefix) break;
  }
  send(res, 200,
       {{"jobs", std::move(jobs)},
        {"next_cursor",
         next ? nlohmann::json(list_cursor_text(*next, next->id)) : nlohmann::json(nullptr)}});
}

void Console::job(const JobRef& job, HttpResponse& res) const {
  const std::optional<JobRecord> record = queue_.find(job);
  if (!record) {
    return send_error(res, {404, "not_found", "No job with id '" + job.id + "'.", {}});
  }
  nlohmann::json out = to_status_json(*record);
  out["tenant"] = record->job.tenant;
  out["input"] = record->job.input;
  out["webhook_events"] = events_json(record->job.webhook_events);
  const std::chrono::system_clock::time_point never{};
  if (record->started_at != never && record->outcome.finished_at != never &&
      is_final(record->status)) {
    out["inference_seconds"] =
        std::round(std::chrono::duration<double>(record->outcome.finished_at - record->started_at)
                       .count() *
                   1e6) /
        1e6;
  }
  nlohmann::json log = nlohmann::json::array();
  for (const CallbackAttempt& a : record->attempt_log) {
    nlohmann::json entry = {{"at", format_rfc3339(a.at)}, {"latency_ms", a.latency.count()}};
    if (a.http_status != 0) entry["status"] = a.http_status;
    if (!a.error.empty()) entry["error"] = a.error;
    nlohmann::json schemes = nlohmann::json::array();
    for (std::size_t start = 0; start < a.signatures.size();) {
      const auto comma = std::min(a.signatures.find(',', start), a.signatures.size());
      if (comma > start) schemes.push_back(a.signatures.substr(start, comma - start));
      start = comma + 1;
    }
    entry["signatures"] = std::move(schemes);
    log.push_back(std::move(entry));
  }
  out["attempt_log"] = std::move(log);
  send(res, 200, out);
}

void Console::redeliver_all(const std::string& body, const std::string& who, HttpResponse& res) {
  nlohmann::json parsed;
  if (auto error = json_body_error(parse_untrusted_json(body, parsed))) {
    return send_error(res, *error);
  }
  auto text_field = [&](const char* name) -> std::optional<std::string> {
    const auto it = parsed.is_object() ? parsed.find(name) : parsed.end();
    if (it == parsed.end() || it->is_null()) return std::string();
    if (!it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  const auto tenant = text_field("tenant");
  const auto id_prefix = text_field("id_prefix");
  const auto dry = parsed.is_object() ? parsed.find("dry_run") : parsed.end();
  // dry_run is required: a bare POST must not redeliver everything.
  if (!parsed.is_object() || !tenant || !id_prefix || dry == parsed.end() || !dry->is_boolean()) {
    return send_error(res, {422,
                            "invalid_field",
                            "Send {\"tenant\"?: string, \"id_prefix\"?: string, \"dry_run\": "
                            "true or false}.",
                            {}});
  }
  if (!valid_id_prefix(*id_prefix)) {
    return send_error(
        res, {422, "invalid_field", "id_prefix must be up to 128 characters of A-Z a-z 0-9 . _ : -",
              "id_prefix"});
  }
  if (!tenant->empty() && std::find(tenants_.begin(), tenants_.end(), *tenant) == tenants_.end()) {
    return send_error(res, {422, "invalid_field", "tenant is not one of this server's.", "tenant"});
  }
  const bool dry_run = dry->get<bool>();
  // The store pages by tenant; an id prefix without a tenant (several tenants) is matched here.
  const bool here = !tenants_.empty() && tenant->empty();
  const std::string prefix = here ? std::string() : job_key(*tenant, *id_prefix);
  std::size_t matched = 0, redelivered = 0;
  bool more = false;
  std::optional<ListCursor> after;
  std::string stopped_by;
  do {
    JobFilter filter;
    filter.callback_state = CallbackState::failed;
    filter.id_prefix = prefix;
    const JobPage page = queue_.operations().list_jobs(filter, after, 500);
    for (const JobRecord& record : page.jobs) {
      if (here && record.job.id.compare(0, id_prefix->size(), *id_prefix) != 0) continue;
      if (matched == max_bulk) {
        more = true;
        break;
      }
      ++matched;
      if (dry_run || !stopped_by.empty()) continue;
      const boost::system::error_code ec = queue_.redeliver({record.job.id, record.job.tenant});
      if (ec == errc::store_unavailable) throw StoreUnavailable("redeliver: the store fails");
      if (!ec) {
        ++redelivered;
      } else if (ec != errc::not_found && ec != errc::not_failed) {  // (redelivered or pruned
        stopped_by = to_string(static_cast<errc>(ec.value()));       // meanwhile: passed over)
      }
    }
    after = page.next;
  } while (after && !more);
  if (!stopped_by.empty()) more = true;
  if (!dry_run) {
    queue_.operations().logger().log(LogLevel::info, "console_redeliver_all",
                                     {{"key", who},
                                      {"tenant", *tenant},
                                      {"id_prefix", *id_prefix},
                                      {"matched", matched},
                                      {"redelivered", redelivered},
                                      {"stopped_by", stopped_by}});
  }
  nlohmann::json out = {{"matched", matched}, {"redelivered", redelivered}, {"more", more}};
  if (!stopped_by.empty()) out["stopped_by"] = stopped_by;
  send(res, 200, out);
}

void Console::servers(HttpResponse& res) const {
  nlohmann::json out = nlohmann::json::array();
  for (const ServerSeen& s : queue_.operations().servers()) {
    out.push_back({{"id", s.id},
                   {"last_seen", format_rfc3339(s.last_seen)},
                   {"leases", s.leases},
                   {"this", s.id == queue_.operations().server_id()}});
  }
  send(res, 200, {{"servers", std::move(out)}});
}

void Console::paused(HttpResponse& res) const {
  send(res, 200, {{"origins", queue_.operations().paused_origins()}});
}

}  // namespace rebound::detail
