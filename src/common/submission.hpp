// Validation of a job submission (the body of POST /v1/inferences) and the API's error shape.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/callback_url.hpp"
#include "common/job_rules.hpp"
#include "rebound/delivery/address_guard.hpp"
#include "rebound/detail/json.hpp"
#include "rebound/job.hpp"

namespace rebound::detail {

/// An error answer of the HTTP API: status, machine code, human message, and the field at fault.
struct ApiError {
  int status = 400;
  std::string code;
  std::string message;
  std::string field;  ///< empty when no single field is at fault

  /// `{"error": {"code", "message", "field"?}}`
  nlohmann::json to_json() const {
    nlohmann::json error = {{"code", code}, {"message", message}};
    if (!field.empty()) error["field"] = field;
    return {{"error", std::move(error)}};
  }
};

/// The 400 (413 for `amplifying`) answer for a request body that parse_untrusted_json refused;
/// nullopt when it parsed.
inline std::optional<ApiError> json_body_error(JsonParseError error) {
  switch (error) {
    case JsonParseError::none:
      break;
    case JsonParseError::invalid:
      return ApiError{
          400,
          "invalid_json",
          "The request body is not valid JSON (or holds a number past a double's range).",
          {}};
    case JsonParseError::too_deep:
      return ApiError{400,
                      "invalid_json",
                      "The request body nests arrays and objects deeper than " +
                          std::to_string(max_json_depth) + " levels.",
                      {}};
    case JsonParseError::amplifying:
      return ApiError{413,
                      "payload_too_large",
                      "The request body would take more than " +
                          std::to_string(json_amplification_limit) +
                          " times its size in memory once parsed (arrays of empty arrays or "
                          "objects, and the like).",
                      {}};
    case JsonParseError::too_complex:
      return ApiError{400,
                      "invalid_json",
                      "The request body has too many values: at most " +
                          std::to_string(json_cost_limit) +
                          ", where each array, object and object member counts 5.",
                      {}};
  }
  return std::nullopt;
}

/// The result of parse_submission: a job ready to store, or the error to answer with.
struct SubmissionParse {
  std::optional<Job> job;
  std::optional<ApiError> error;
  std::string id;  ///< with an error: the job's id when it was a valid one (else empty)
};

/// Validates a submission body: `{"id": string, "callback_url"?: string, "input"?: any,
/// "priority"?: 0-9, "max_queue_seconds"?: number, "webhook_events"?: ["started", "completed"],
/// "model"?: string, "version"?: string or positive integer}`.
/// Unknown fields are ignored; `callback_url: null` means no callback, and `null` for the others
/// means their default. The job's `created_at` is left for the caller to set. Never throws on bad
/// input.
inline SubmissionParse parse_submission_object(nlohmann::json& doc, const AddressGuard& guard);

/// The same, for the body of `POST /v1/inferences`: JSON text that must be one submission object.
inline SubmissionParse parse_submission(std::string_view body, const AddressGuard& guard) {
  nlohmann::json doc;
  if (auto error = json_body_error(
          detail::parse_untrusted_json(body, doc, json_cost_limit, /*limit_amplification=*/true))) {
    return {std::nullopt, std::move(error), {}};
  }
  if (!doc.is_object()) {
    return {std::nullopt,
            ApiError{400, "invalid_json", "The request body must be a JSON object.", {}},
            {}};
  }
  return parse_submission_object(doc, guard);
}

/// Most jobs in one batch submission (`POST /v1/inferences:batch`).
inline constexpr std::size_t max_batch_jobs = 1000;

/// The result of parse_batch_submission: one parse per job, in order, or the error that refuses
/// the whole body.
struct BatchSubmissionParse {
  std::vector<SubmissionParse> jobs;
  std::optional<ApiError> error;
};

/// Validates a batch submission body, `{"jobs": [submission, ...]}` with 1 to max_batch_jobs
/// submissions, each checked as parse_submission checks a body (a job that is not an object is
/// `400 invalid_json` on its own, as its own body would be). The inputs are moved out of the parsed
/// body. Never throws on bad input.
inline BatchSubmissionParse parse_batch_submission(std::string_view body,
                                                   const AddressGuard& guard) {
  nlohmann::json doc;
  if (auto error = json_body_error(
          detail::parse_untrusted_json(body, doc, json_cost_limit, /*limit_amplification=*/true))) {
    return {{}, std::move(error)};
  }
  if (!doc.is_object()) {
    return {{}, ApiError{400, "invalid_json", "The request body must be a JSON object.", {}}};
  }
  auto jobs = doc.find("jobs");
  if (jobs == doc.end() || !jobs->is_array() || jobs->empty() || jobs->size() > max_batch_jobs) {
    return {{},
            ApiError{422, "invalid_field",
                     "The field 'jobs' must be an array of 1 to " + std::to_string(max_batch_jobs) +
                         " submissions.",
                     "jobs"}};
  }
  BatchSubmissionParse out;
  out.jobs.reserve(jobs->size());
  for (nlohmann::json& item : *jobs) {
    if (!item.is_object()) {
      // As the job's own POST would be answered.
      out.jobs.push_back(
          {std::nullopt, ApiError{400, "invalid_json", "Each job must be a JSON object.", {}}, {}});
    } else {
      out.jobs.push_back(parse_submission_object(item, guard));
    }
  }
  return out;
}

/// Validates one submission, an object (the body of `POST /v1/inferences`, or one of a batch's
/// jobs); its input is moved out. The JSON's shape is checked here (types, the event names, a
/// `max_queue_seconds` of at least 1 ms: over HTTP an absent field is the default); what the Job
/// may hold is decided by `check_job`, the rule `JobQueue::submit` applies from C++, so both
/// refuse the same jobs with the same field and sentence.
inline SubmissionParse parse_submission_object(nlohmann::json& doc, const AddressGuard& guard) {
  auto invalid = [](std::string field, std::string message) {
    return SubmissionParse{
        std::nullopt, ApiError{422, "invalid_field", std::move(message), std::move(field)}, {}};
  };
  Job job;
  auto id = doc.find("id");
  if (id == doc.end() || id->is_null()) return invalid("id", "The field 'id' is required.");
  if (!id->is_string()) return invalid("id", "The field 'id' must be a string.");
  job.id = id->get<std::string>();
  if (!is_valid_job_id(job.id)) return invalid("id", job_id_rule());
  // From here on an error names the job too (a batch's result says whose it is).
  auto invalid_job = [&job, &invalid](std::string field, std::string message) {
    SubmissionParse out = invalid(std::move(field), std::move(message));
    out.id = job.id;
    return out;
  };
  // A field whose JSON cannot be a Job's value is left at its default and noted; check_job then
  // judges the job, and of its complaint and the note, the one about the field check_job looks at
  // first is answered: a job with two faults is told the same one as from C++.
  std::optional<BrokenRule> shape;
  auto note = [&shape](const char* field, std::string message) {
    if (!shape) shape = BrokenRule{field, std::move(message)};
  };
  auto url = doc.find("callback_url");
  if (url != doc.end() && !url->is_null()) {
    if (!url->is_string()) {
      note("callback_url", "The field 'callback_url' must be a string.");
    } else if (url->get_ref<const std::string&>().empty()) {
      // Over HTTP no callback is null or absent; "" is a URL that is not one (to C++: none).
      auto broken = check_callback_url("", guard);
      note("callback_url", broken ? std::move(broken->message) : std::string());
    } else {
      job.callback_url = url->get<std::string>();
    }
  }
  auto priority = doc.find("priority");
  if (priority != doc.end() && !priority->is_null()) {
    if (!priority->is_number_integer()) {
      note("priority", priority_rule());
    } else {
      // Far outside 0-9 is as wrong as 10: saturated, so that no value wraps into the range.
      job.priority = priority->is_number_unsigned()
                         ? static_cast<int>(std::min<std::uint64_t>(priority->get<std::uint64_t>(),
                                                                    std::uint64_t{1000}))
                         : static_cast<int>(std::clamp<std::int64_t>(priority->get<std::int64_t>(),
                                                                     -1000, 1000));
    }
  }
  auto max_queue = doc.find("max_queue_seconds");
  if (max_queue != doc.end() && !max_queue->is_null()) {
    const double seconds = max_queue->is_number() ? max_queue->get<double>() : -1;
    if (!(seconds >= 0.001)) {
      // (0 too: over HTTP the queue's own time-to-live is an absent field.)
      note("max_queue_seconds", max_queue_rule());
    } else {
      // (Beyond the limit, a week and a second: check_job refuses it, and nothing overflows.)
      job.max_queue = std::chrono::milliseconds(
          static_cast<long long>(std::min(seconds, max_queue_seconds_limit + 1) * 1000 + 0.5));
    }
  }
  auto events = doc.find("webhook_events");
  if (events != doc.end() && !events->is_null()) {
    // At most two names (docs/openapi.json: maxItems 2), a name given twice being that name; an
    // empty array is an empty set, which check_job refuses.
    std::uint8_t set = 0;
    bool known = events->is_array() && events->size() <= 2;
    for (std::size_t i = 0; known && i < events->size(); ++i) {
      const auto& event = (*events)[i];
      if (event == "started") {
        set |= webhook_started;
      } else if (event == "completed") {
        set |= webhook_completed;
      } else {
        known = false;
      }
    }
    if (known) {
      job.webhook_events = set;
    } else {
      note("webhook_events", webhook_events_rule());
    }
  }
  auto model = doc.find("model");
  if (model != doc.end() && !model->is_null()) {
    if (!model->is_string() || model->get_ref<const std::string&>().empty()) {
      note("model", model_rule());
    } else {
      job.model.name = model->get<std::string>();
    }
  }
  auto version = doc.find("version");
  if (version != doc.end() && !version->is_null()) {
    // Its decimal text, or a positive integer (a JSON number with a fraction or past 18 digits is
    // not one); check_job judges the text.
    if (version->is_string() && !version->get_ref<const std::string&>().empty()) {
      job.model.version = version->get<std::string>();
    } else if (version->is_number_unsigned() && version->get<std::uint64_t>() > 0) {
      job.model.version = std::to_string(version->get<std::uint64_t>());
    } else {
      note("version", version_rule());
    }
  }
  std::optional<BrokenRule> broken = check_job(job, guard);
  if (shape && (!broken || rule_rank(shape->field) < rule_rank(broken->field)))
    broken = std::move(shape);
  if (broken) return invalid_job(std::move(broken->field), std::move(broken->message));
  auto input = doc.find("input");
  if (input != doc.end()) job.input = std::move(*input);
  return {std::move(job), std::nullopt, {}};
}

}  // namespace rebound::detail
