// The attempt log as the durable stores keep it: one JSON object per CallbackAttempt.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rebound/detail/json.hpp"
#include "rebound/job.hpp"

namespace rebound::detail {

/// {"at": ms, "s": HTTP status, "e": error, "l": latency ms, "g": signature schemes}: short
/// names, as the log is kept with every job. The error is cut to max_attempt_error_bytes.
inline nlohmann::json attempt_to_json(const CallbackAttempt& a) {
  std::string error = a.error.substr(0, max_attempt_error_bytes);
  return {{"at",
           std::chrono::duration_cast<std::chrono::milliseconds>(a.at.time_since_epoch()).count()},
          {"s", a.http_status},
          {"e", std::move(error)},
          {"l", a.latency.count()},
          {"g", a.signatures}};
}

/// The log as it is stored: a JSON array of attempt_to_json's objects, oldest first.
inline std::string attempt_log_to_json(const std::vector<CallbackAttempt>& log) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& a : log)
    out.push_back(attempt_to_json(a));
  return dump_json(out);
}

/// The log from its stored text; what does not read as one (a file from elsewhere) is left out.
inline std::vector<CallbackAttempt> attempt_log_from_json(const std::string& text) {
  std::vector<CallbackAttempt> out;
  nlohmann::json parsed;
  if (text.empty() || parse_untrusted_json(text, parsed, 1 << 20) != JsonParseError::none ||
      !parsed.is_array())
    return out;
  for (const auto& entry : parsed) {
    if (!entry.is_object()) continue;
    CallbackAttempt a;
    const auto number = [&](const char* key) -> long long {
      const auto it = entry.find(key);
      return it != entry.end() && it->is_number_integer() ? it->get<long long>() : 0;
    };
    const auto text_of = [&](const char* key) -> std::string {
      const auto it = entry.find(key);
      return it != entry.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    a.at = std::chrono::system_clock::time_point(std::chrono::milliseconds(number("at")));
    a.http_status = static_cast<int>(number("s"));
    a.error = text_of("e").substr(0, max_attempt_error_bytes);
    a.latency = std::chrono::milliseconds(number("l"));
    a.signatures = text_of("g");
    out.push_back(std::move(a));
  }
  // The latest are kept when a log is longer than a store would keep.
  if (out.size() > max_attempt_log)
    out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(max_attempt_log));
  return out;
}

/// `r` as a durable store reads it back: its times to the millisecond (what SQLite and
/// PostgreSQL keep), for a record answered from a write rather than read (a finish's).
inline void times_as_stored(JobRecord& r) {
  const auto ms = [](std::chrono::system_clock::time_point& t) {
    t = std::chrono::time_point_cast<std::chrono::milliseconds>(t);
  };
  ms(r.job.created_at);
  ms(r.started_at);
  ms(r.outcome.finished_at);
  ms(r.callback.next_attempt_at);
  ms(r.callback.delivery_started_at);
  for (CallbackAttempt& a : r.attempt_log)
    ms(a.at);
}

}  // namespace rebound::detail
