// Structured logs: one JSON object per line, with the job id on every line about a job.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "rebound/detail/wire.hpp"
#include "rebound/job.hpp"

namespace rebound {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

inline std::string_view to_string(LogLevel level) {
  switch (level) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warn:
      return "warn";
    case LogLevel::error:
      return "error";
    case LogLevel::off:
      return "off";
  }
  return "unknown";
}

/// "debug", "info", "warn", "error" or "off"; nullopt otherwise.
inline std::optional<LogLevel> parse_log_level(std::string_view text) {
  for (auto level :
       {LogLevel::debug, LogLevel::info, LogLevel::warn, LogLevel::error, LogLevel::off}) {
    if (text == to_string(level)) return level;
  }
  return std::nullopt;
}

/// Receives each finished log line (a JSON object, no newline). Called from any thread, never
/// under a rebound lock; must be thread-safe.
using LogSink = std::function<void(LogLevel, const std::string& line)>;

/// Writes structured log lines at or above a level to a sink.
///
/// Every line is `{"ts": "<RFC 3339>", "level": "...", "event": "...", ...fields}`; lines about a
/// job carry `"job_id"`. Example:
///   {"ts":"2026-11-22T05:40:01.120Z","level":"warn","event":"callback_attempt_failed",
///    "job_id":"1234","attempt":1,"error":"HTTP 503","retry_in_ms":740}
/// Thread-safety: immutable after construction; `log` may be called from any thread.
class Logger {
 public:
  Logger() = default;  ///< logs nothing
  Logger(LogLevel level, LogSink sink) : level_(level), sink_(std::move(sink)) {}

  /// A logger that writes lines to `out` (e.g. std::cerr), serialised by its own mutex.
  static Logger to_stream(LogLevel level, std::ostream& out) {
    auto mutex = std::make_shared<std::mutex>();
    return Logger(level, [&out, mutex](LogLevel, const std::string& line) {
      std::lock_guard<std::mutex> lock(*mutex);
      out << line << '\n' << std::flush;
    });
  }

  bool enabled(LogLevel level) const { return sink_ && level != LogLevel::off && level >= level_; }

  /// Logs `event` with `fields` (a JSON object) when `level` is enabled. Never throws.
  void log(LogLevel level, std::string_view event,
           const nlohmann::json& fields = nlohmann::json::object()) const {
    write(level, event, nullptr, fields);
  }

  /// Logs an event about a job: `job_id` follows the event name, then the fields.
  void job(LogLevel level, std::string_view event, const std::string& job_id,
           const nlohmann::json& fields = nlohmann::json::object()) const {
    write(level, event, &job_id, fields);
  }

 private:
  void write(LogLevel level, std::string_view event, const std::string* job_id,
             const nlohmann::json& fields) const {
    if (!enabled(level)) return;
    try {
      nlohmann::ordered_json line = {
          {"ts", detail::format_rfc3339(std::chrono::system_clock::now())},
          {"level", to_string(level)},
          {"event", event}};
      if (job_id) line["job_id"] = *job_id;
      if (fields.is_object()) {
        for (auto it = fields.begin(); it != fields.end(); ++it)
          line[it.key()] = it.value();
      }
      sink_(level, line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    } catch (...) {
      // Logging must never take down the work it describes.
    }
  }

  LogLevel level_ = LogLevel::off;
  LogSink sink_;
};

}  // namespace rebound
