// Internal: a job record as the HTTP API shows it (docs/http-api.md) and as a callback carries it
// (docs/delivery.md), and the RFC 3339 times both use.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <ctime>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "rebound/job.hpp"
#include "rebound/tenant.hpp"

namespace rebound::detail {

/// Formats a time point as RFC 3339 in UTC with milliseconds, e.g. "2026-11-22T04:06:00.123Z".
inline std::string format_rfc3339(std::chrono::system_clock::time_point tp) {
  using namespace std::chrono;
  const auto ms = duration_cast<milliseconds>(tp.time_since_epoch()).count() % 1000;
  const std::time_t secs = system_clock::to_time_t(tp);
  std::tm utc{};
  gmtime_r(&secs, &utc);
  char buf[40];
  const std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms < 0 ? ms + 1000 : ms));
  return buf;
}

/// `{"name", "version"}`: the model a stored job runs on (left out of the bodies of a job stored
/// without one, by a server from before models were named).
inline nlohmann::json to_model_json(const ModelRef& model) {
  return {{"name", model.name}, {"version", model.version}};
}

/// The body of `GET /v1/inferences/{id}` for a record (see docs/http-api.md), with its queue
/// position while it is queued and the store can tell.
inline nlohmann::json to_status_json(const JobRecord& record,
                                     std::optional<std::size_t> queue_position = std::nullopt) {
  nlohmann::json out = {{"id", record.job.id},
                        {"status", to_string(record.status)},
                        {"priority", record.job.priority},
                        {"created_at", format_rfc3339(record.job.created_at)}};
  if (!record.job.model.name.empty()) out["model"] = to_model_json(record.job.model);
  if (record.status == JobStatus::queued && queue_position) out["queue_position"] = *queue_position;
  const std::chrono::system_clock::time_point never{};
  if (record.started_at != never) out["started_at"] = format_rfc3339(record.started_at);
  if (is_final(record.status) && record.outcome.finished_at != never) {
    out["finished_at"] = format_rfc3339(record.outcome.finished_at);
  }
  if (record.status == JobStatus::succeeded) out["result"] = record.outcome.result;
  if (record.outcome.error && is_final(record.status)) {
    out["error"] = {{"code", record.outcome.error->code},
                    {"message", record.outcome.error->message}};
  }
  nlohmann::json callback = {
      {"url", record.job.callback_url.empty() ? nlohmann::json(nullptr)
                                              : nlohmann::json(record.job.callback_url)},
      {"state", to_string(record.callback.state)},
      {"attempts", record.callback.attempts}};
  if (!record.callback.last_error.empty()) callback["last_error"] = record.callback.last_error;
  if (record.callback.state == CallbackState::pending &&
      record.callback.next_attempt_at != std::chrono::system_clock::time_point{}) {
    callback["next_attempt_at"] = format_rfc3339(record.callback.next_attempt_at);
  }
  out["callback"] = std::move(callback);
  return out;
}

/// `text` cut to at most `max` bytes, not inside a UTF-8 sequence.
inline std::string truncated_utf8(std::string text, std::size_t max) {
  if (text.size() <= max) return text;
  std::size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80)
    --end;
  text.resize(end);
  return text;
}

/// The longest error code and message a failed job keeps from its model (longer ones are cut).
inline constexpr std::size_t max_error_code_bytes = 64;
inline constexpr std::size_t max_error_message_bytes = 4096;

/// The longest error message or last callback error a list entry shows (the job's own status
/// shows it whole).
inline constexpr std::size_t max_list_message_bytes = 1024;

/// One entry of a job listing (`GET /v1/inferences?callback_state=failed`): the job's status
/// without its result (a poll away), its messages cut to `max_list_message_bytes`.
inline nlohmann::json to_list_entry_json(const JobRecord& record) {
  nlohmann::json out = to_status_json(record);
  out.erase("result");
  if (auto e = out.find("error"); e != out.end())
    (*e)["message"] = truncated_utf8((*e)["message"].get<std::string>(), max_list_message_bytes);
  auto& callback = out["callback"];
  if (auto e = callback.find("last_error"); e != callback.end())
    *e = truncated_utf8(e->get<std::string>(), max_list_message_bytes);
  return out;
}

/// The body POSTed to the callback URL once a job is final (see docs/delivery.md).
inline nlohmann::json to_callback_json(const JobRecord& record) {
  nlohmann::json out = {{"id", record.job.id}, {"status", to_string(record.status)}};
  if (!record.job.model.name.empty()) out["model"] = to_model_json(record.job.model);
  if (record.status == JobStatus::succeeded) {
    out["result"] = record.outcome.result;
  } else if (record.outcome.error) {
    out["error"] = {{"code", record.outcome.error->code},
                    {"message", record.outcome.error->message}};
  }
  return out;
}

}  // namespace rebound::detail
