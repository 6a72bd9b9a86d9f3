// The Redis store's codec: how a job's fields are written into script arguments and read back
// from a job's hash. Internal to rebound::redis (src/store/redis); not installed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/attempt_log.hpp"
#include "rebound/detail/json.hpp"
#include "rebound/job.hpp"
#include "rebound/store/job_store.hpp"
#include "store/redis/reply.hpp"

namespace rebound::detail::redis {

using TimePoint = std::chrono::system_clock::time_point;

inline std::int64_t to_ms(TimePoint t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

inline TimePoint from_ms(std::int64_t ms) {
  return TimePoint(std::chrono::milliseconds(ms));
}

inline std::string ms_text(TimePoint t) {
  return std::to_string(to_ms(t));
}

// The score of a job filed by priority, then time (the scripts' job_score): priority * 2^42 + ms.
inline std::string job_score(int priority, TimePoint t) {
  // (Clamped far outside 0..9 only so that the product cannot overflow.)
  return std::to_string(
      static_cast<std::int64_t>(std::clamp(priority, -1000, 1000)) * 4398046511104LL + to_ms(t));
}

// The enum texts are job.hpp's (to_string, from_string). An unknown status reads as failed, an
// unknown callback state as none (a field another program wrote).
inline const char* to_text(JobStatus s) {
  return to_string(s).data();  // (to_string's views are of string literals)
}

inline const char* to_text(CallbackState s) {
  return to_string(s).data();
}

// What Redis holds is what this store wrote, but a shared Redis is not trusted to be well formed:
// depth and cost are bounded as for a request; anything else reads as null.
inline nlohmann::json parse_json(std::string_view s) {
  nlohmann::json out;
  if (s.empty() || detail::parse_untrusted_json(s, out, SIZE_MAX) != detail::JsonParseError::none) {
    return nullptr;
  }
  return out;
}

// A job's hash (field, value, ...) as a record.
inline JobRecord read_record(std::string_view id, const redisReply* fields) {
  JobRecord r;
  r.job.id = std::string(id);
  if (!fields || fields->type != REDIS_REPLY_ARRAY) return r;
  std::optional<std::string> err_code, err_msg;
  bool has_tenant = false;
  for (std::size_t i = 0; i + 1 < fields->elements; i += 2) {
    const std::string_view name = text(fields->element[i]);
    const std::string_view value = text(fields->element[i + 1]);
    if (name == "url") {
      r.job.callback_url = std::string(value);
    } else if (name == "input") {
      r.job.input = parse_json(value);
    } else if (name == "created") {
      r.job.created_at = from_ms(number(value));
    } else if (name == "status") {
      r.status = from_string<JobStatus>(value).value_or(JobStatus::failed);
    } else if (name == "result") {
      r.outcome.result = parse_json(value);
    } else if (name == "err_code") {
      err_code = std::string(value);
    } else if (name == "err_msg") {
      err_msg = std::string(value);
    } else if (name == "cb_state") {
      r.callback.state = from_string<CallbackState>(value).value_or(CallbackState::none);
    } else if (name == "cb_attempts") {
      r.callback.attempts = static_cast<int>(number(value));
    } else if (name == "cb_error") {
      r.callback.last_error = std::string(value);
    } else if (name == "cb_next") {
      r.callback.next_attempt_at = from_ms(number(value));
    } else if (name == "cb_da") {
      r.callback.delivery_attempts = static_cast<int>(number(value));
    } else if (name == "cb_started") {
      r.callback.delivery_started_at = from_ms(number(value));
    } else if (name == "cb_prev") {
      r.callback.previous_delay = std::chrono::milliseconds(number(value));
    } else if (name == "priority") {
      r.job.priority = static_cast<int>(number(value));
    } else if (name == "maxq") {
      r.job.max_queue = std::chrono::milliseconds(number(value));
    } else if (name == "events") {
      r.job.webhook_events = static_cast<std::uint8_t>(number(value));
    } else if (name == "trace") {
      r.job.traceparent = std::string(value);
    } else if (name == "tenant") {
      r.job.tenant = std::string(value);
      has_tenant = true;
    } else if (name == "model") {
      r.job.model.name = std::string(value);
    } else if (name == "mver") {
      r.job.model.version = std::string(value);
    } else if (name == "started") {
      r.started_at = from_ms(number(value));
    } else if (name == "ended") {
      r.outcome.finished_at = from_ms(number(value));
    } else if (name == "attempts") {
      // One JSON object a line (kRecordAttempt): read as the array the durable stores share.
      std::string array = "[";
      for (const char c : value)
        array += c == '\n' ? ',' : c;
      r.attempt_log = detail::attempt_log_from_json(array + "]");
    }
  }
  if (r.status != JobStatus::succeeded) r.outcome.result = nullptr;
  if (err_code) r.outcome.error = ErrorInfo{*err_code, err_msg.value_or("")};
  if (!has_tenant) {
    // Written before the tenant was a field (an older build, or not reached yet by tenants.lua):
    // its key is all there is to say whose job it is.
    const auto slash = r.job.id.find('/');
    if (slash != std::string::npos && slash > 0) r.job.tenant = r.job.id.substr(0, slash);
  }
  if (!r.job.tenant.empty()) r.job.id = std::string(id_in_key(r.job.id, r.job.tenant));
  return r;
}

// A script's 1 (held, renewed, recorded).
inline bool is_one(const redisReply* r) {
  return r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

// (id, fields, id, fields, ...) as records.
inline std::vector<JobRecord> read_records(const redisReply* r) {
  std::vector<JobRecord> out;
  if (!r || r->type != REDIS_REPLY_ARRAY) return out;
  out.reserve(r->elements / 2);
  for (std::size_t i = 0; i + 1 < r->elements; i += 2)
    out.push_back(read_record(text(r->element[i]), r->element[i + 1]));
  return out;
}

inline void append_outcome(std::vector<std::string>& args, const JobOutcome& outcome) {
  args.push_back(to_text(outcome.status));
  args.push_back(outcome.status == JobStatus::succeeded ? detail::dump_json(outcome.result) : "");
  args.push_back(outcome.error ? "1" : "0");
  args.push_back(outcome.error ? outcome.error->code : "");
  args.push_back(outcome.error ? outcome.error->message : "");
}

inline void append_callback(std::vector<std::string>& args, const CallbackInfo& cb) {
  args.push_back(to_text(cb.state));
  args.push_back(std::to_string(cb.attempts));
  args.push_back(cb.last_error);
  args.push_back(ms_text(cb.next_attempt_at));
  args.push_back(std::to_string(cb.delivery_attempts));
  args.push_back(ms_text(cb.delivery_started_at));
  args.push_back(std::to_string(cb.previous_delay.count()));
}

}  // namespace rebound::detail::redis
