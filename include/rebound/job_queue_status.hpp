// What the JobQueue answers a submission with, and the counters of the batches it ran.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <boost/system/error_code.hpp>

#include "rebound/errc.hpp"
#include "rebound/job.hpp"

namespace rebound {

/// What a submission came to (`JobQueue::submit`, one per job of `submit_many`). Taken (new or
/// the same request again) when `error` is success; else `error` is the rebound::errc that
/// refused it, and for `invalid_job` and `invalid_input`, `reason` and `field` say why.
struct Submitted {
  boost::system::error_code error;  ///< success, or why it was refused (rebound::errc)
  /// The same request was submitted before (`Job::same_request_as`): nothing new was queued; the
  /// job answers as the first one does.
  bool duplicate = false;
  /// For invalid_job: `{"invalid_field", a sentence naming the field}`; for invalid_input: what
  /// `Model::validate` said; for model_not_found and version_unavailable: a sentence naming the
  /// model or version asked for. Empty otherwise.
  ErrorInfo reason;
  /// For invalid_job: the Job member at fault, as the HTTP API names it ("id", "callback_url",
  /// "priority", "max_queue_seconds", "webhook_events", "model", "version"); for invalid_input:
  /// "input"; for model_not_found: "model"; for version_unavailable: "version".
  std::string field;

  /// True when the queue holds the job (new or a duplicate).
  explicit operator bool() const noexcept { return !error; }
};

/// Counters of the batches run so far.
struct BatchStats {
  std::uint64_t batches = 0;  ///< predict_batch calls
  std::uint64_t items = 0;    ///< jobs and invocations in them
  std::size_t largest_batch = 0;
  std::uint64_t resumed = 0;  ///< jobs claimed from the store (at construction, or later)
};

}  // namespace rebound
