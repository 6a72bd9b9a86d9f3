// What the JobQueue's synchronous calls answer: a submission, a redelivery, a cancellation, and
// the counters of the batches it ran.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "rebound/errc.hpp"
#include "rebound/model.hpp"

namespace rebound {

/// What `JobQueue::submit` did.
enum class SubmitStatus {
  accepted,           ///< stored and queued; it will reach a final state
  duplicate,          ///< the same request was submitted before: nothing new was queued
  conflict,           ///< the id is taken by a different request
  queue_full,         ///< `queue_capacity` jobs are in flight; try again later
  not_ready,          ///< the model is not ready
  shutting_down,      ///< `shutdown` has begun
  store_unavailable,  ///< the JobStore failed (see JobQueue::store_failure); nothing was accepted
  invalid_input,      ///< `Model::validate` refused the input; nothing was stored
  no_transport,       ///< a callback URL, and no CallbackTransport to send it with
  tenant_quota,       ///< the job's tenant holds its share (`tenant_share`) of the queue; try later
};

/// The error code an asynchronous call completes with for a refusal; success for `accepted` and
/// `duplicate`.
inline boost::system::error_code to_error_code(SubmitStatus status) noexcept {
  switch (status) {
    case SubmitStatus::accepted:
    case SubmitStatus::duplicate:
      return {};
    case SubmitStatus::conflict:
      return errc::id_conflict;
    case SubmitStatus::queue_full:
      return errc::queue_full;
    case SubmitStatus::not_ready:
      return errc::not_ready;
    case SubmitStatus::shutting_down:
      return errc::shutting_down;
    case SubmitStatus::store_unavailable:
      return errc::store_unavailable;
    case SubmitStatus::invalid_input:
      return errc::invalid_input;
    case SubmitStatus::no_transport:
      return errc::no_transport;
    case SubmitStatus::tenant_quota:
      return errc::tenant_quota;
  }
  return errc::shutting_down;
}

/// Called once with the result of a synchronous invocation, on an inference thread.
using InvocationHandler = std::function<void(const Prediction&)>;

/// How `JobQueue::submit(Job, SubmitHandler)` answers: the status, and (for `invalid_input`)
/// what the model said of the input.
using SubmitHandler = std::function<void(SubmitStatus, const ErrorInfo& invalid)>;

/// Counters of the batches run so far.
struct BatchStats {
  std::uint64_t batches = 0;  ///< predict_batch calls
  std::uint64_t items = 0;    ///< jobs and invocations in them
  std::size_t largest_batch = 0;
  std::uint64_t resumed = 0;  ///< jobs claimed from the store (at construction, or later)
};

/// What `JobQueue::redeliver` did.
enum class RedeliverStatus {
  accepted,       ///< the callback is being delivered again, with a fresh attempt budget
  not_found,      ///< no job with that id
  not_failed,     ///< the job's callback is not `failed` (none, pending or delivered)
  queue_full,     ///< `queue_capacity` jobs are in flight; try again later
  shutting_down,  ///< `shutdown` has begun
  no_transport,   ///< this queue has no CallbackTransport: another server must deliver it
  tenant_quota,   ///< the job's tenant holds its share of the queue (`tenant_share`)
};

/// What `JobQueue::cancel` did.
enum class CancelStatus {
  cancelled,         ///< the job was queued or running; it is `cancelled` now
  not_found,         ///< no job with that id
  already_finished,  ///< the job was final already: nothing changed
};

}  // namespace rebound
