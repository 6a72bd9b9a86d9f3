// The rules a Job must keep to be accepted, written once: JobQueue's submit checks them for every
// caller (C++ and HTTP alike), and the HTTP parser (common/submission.hpp) uses the same sentences
// for the JSON it reads.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "common/callback_url.hpp"
#include "common/trace_context.hpp"
#include "rebound/delivery/address_guard.hpp"
#include "rebound/job.hpp"
#include "rebound/model.hpp"
#include "rebound/tenant.hpp"

namespace rebound::detail {

/// Longest job id accepted.
inline constexpr std::size_t max_job_id_length = 128;

/// A job id is 1 to 128 characters from `A-Z a-z 0-9 . _ : -`, and not "." or "..".
inline bool is_valid_job_id(std::string_view id) {
  if (id.empty() || id.size() > max_job_id_length) return false;
  // A path segment of "." or ".." is not itself in a URL (RFC 3986 removes it): no status URL
  // could name such a job.
  if (id == "." || id == "..") return false;
  for (char c : id) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

/// Longest `max_queue` accepted (`max_queue_seconds` over HTTP): a week.
inline constexpr double max_queue_seconds_limit = 7 * 86400;

/// A rule broken: the field at fault, as the HTTP API names it, and a sentence that says so.
struct BrokenRule {
  std::string field;
  std::string message;
};

inline const char* job_id_rule() {
  return "The field 'id' must be 1 to 128 characters from A-Z a-z 0-9 . _ : -, and not '.' or "
         "'..'.";
}
inline const char* tenant_rule() {
  return "The field 'tenant' must be empty or 1 to 64 characters from A-Z a-z 0-9 _ -.";
}
inline const char* priority_rule() {
  return "The field 'priority' must be an integer from 0 (runs first) to 9.";
}
inline const char* max_queue_rule() {
  return "The field 'max_queue_seconds' must be a number of seconds from 0.001 to 604800.";
}
inline const char* traceparent_rule() {
  return "The field 'traceparent' must be a W3C traceparent: 00-<32 hex>-<16 hex>-<2 hex>.";
}
inline const char* model_rule() {
  return "The field 'model' must be a model name: 1 to 64 characters from a-z 0-9 . _ -, "
         "starting with a letter or a digit.";
}
inline const char* version_rule() {
  return "The field 'version' must be a positive integer: a JSON integer, or its decimal text "
         "with no leading zero, at most 18 digits.";
}
inline const char* webhook_events_rule() {
  return "The field 'webhook_events' must be a non-empty array of \"started\" and \"completed\".";
}

/// Whether `job` can name a job at all: a valid id and an empty or valid tenant. A JobRef that
/// cannot (an id with a '/') names none: it is never taken for another tenant's key.
inline bool is_valid_ref(const JobRef& job) {
  return is_valid_job_id(job.id) && (job.tenant.empty() || is_valid_tenant_name(job.tenant));
}

/// Why `url` cannot be a callback URL under `guard` (its syntax, or an address the guard refuses
/// by its literal), or nullopt. Names resolved later are checked again as they are connected to.
inline std::optional<BrokenRule> check_callback_url(std::string_view url,
                                                    const AddressGuard& guard) {
  const CallbackUrlParse parsed = parse_callback_url(url);
  if (!parsed.url)
    return BrokenRule{"callback_url", "The field 'callback_url' " + parsed.error + "."};
  // (At submission only: a job stored before this rule is sent to the URL it was accepted with.)
  if (sent_length(url) > max_callback_url_length) {
    return BrokenRule{"callback_url",
                      "The field 'callback_url' is longer than 2048 characters once its "
                      "characters past ASCII are percent-encoded."};
  }
  if (auto refused = guard.check_host(parsed.url->host))
    return BrokenRule{"callback_url", "The field 'callback_url' " + *refused + "."};
  return std::nullopt;
}

/// Where check_job looks at `field` in its order (below): a field it does not check ranks last.
/// The HTTP parser tells a job with two faults the one ranked first, as check_job would.
inline std::size_t rule_rank(std::string_view field) {
  constexpr std::string_view order[] = {
      "id",          "tenant", "callback_url", "priority", "max_queue_seconds", "webhook_events",
      "traceparent", "model",  "version"};
  return static_cast<std::size_t>(std::find(std::begin(order), std::end(order), field) -
                                  std::begin(order));
}

/// The first rule `job` breaks, or nullopt: its id (a job id: no '/'), its tenant (empty, or a
/// tenant name: rebound/tenant.hpp), its callback URL (when it has one) under `guard`, its priority
/// (0-9), its `max_queue` (0: the queue's time-to-live, else 1 ms to a week), its webhook
/// events (a non-empty set of `webhook_started` and `webhook_completed`) and its traceparent
/// (empty, or a valid W3C one: over HTTP an invalid header is ignored, as the specification asks)
/// and its model (each field empty, or a model name and a version: is_valid_model_name,
/// is_valid_model_version). (In rule_rank's order: keep the two alike.)
inline std::optional<BrokenRule> check_job(const Job& job, const AddressGuard& guard) {
  if (!is_valid_job_id(job.id)) return BrokenRule{"id", job_id_rule()};
  if (!job.tenant.empty() && !is_valid_tenant_name(job.tenant))
    return BrokenRule{"tenant", tenant_rule()};
  if (!job.callback_url.empty()) {
    if (auto broken = check_callback_url(job.callback_url, guard)) return broken;
  }
  if (job.priority < highest_priority || job.priority > lowest_priority)
    return BrokenRule{"priority", priority_rule()};
  using std::chrono::milliseconds;
  const auto week = std::chrono::duration_cast<milliseconds>(
      std::chrono::duration<double>(max_queue_seconds_limit));
  if (job.max_queue < milliseconds(0) || job.max_queue > week)
    return BrokenRule{"max_queue_seconds", max_queue_rule()};
  if (job.webhook_events == 0 || (job.webhook_events & ~(webhook_started | webhook_completed)) != 0)
    return BrokenRule{"webhook_events", webhook_events_rule()};
  if (!job.traceparent.empty() && !is_valid_traceparent(job.traceparent))
    return BrokenRule{"traceparent", traceparent_rule()};
  if (!job.model.name.empty() && !is_valid_model_name(job.model.name))
    return BrokenRule{"model", model_rule()};
  if (!job.model.version.empty() && !is_valid_model_version(job.model.version))
    return BrokenRule{"version", version_rule()};
  return std::nullopt;
}

}  // namespace rebound::detail
