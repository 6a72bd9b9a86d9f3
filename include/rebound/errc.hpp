// rebound::errc: why the JobQueue refused or could not finish an asynchronous operation, as a
// boost::system error code (category "rebound").
#pragma once

#include <string>
#include <type_traits>

#include <boost/system/error_code.hpp>

namespace rebound {

/// The one vocabulary of refusals: every JobQueue call that can say no (submit, async_submit,
/// submit_many, async_wait, async_invoke, cancel, redeliver) says it with one of these, and
/// rebound::Server answers each with one HTTP status and code (docs/http-api.md). Zero is
/// success; every other value is a refusal or an operation that could not finish. A model's own
/// failures are not among them: they are `Prediction::failure` codes, in the job's outcome.
/// Compare with `==`:
///   if (ec == rebound::errc::queue_full) { ... try again later ... }
enum class errc {
  id_conflict = 1,    ///< the id is taken by a different request (HTTP 409 id_conflict)
  invalid_input,      ///< `Model::validate` refused the input (HTTP 422)
  queue_full,         ///< `queue_capacity` jobs in flight, or the store is full (HTTP 503)
  not_ready,          ///< the model is not ready (HTTP 503 not_ready)
  store_unavailable,  ///< the JobStore fails; nothing was accepted (HTTP 503)
  shutting_down,      ///< the queue is stopping, or was destroyed before the job was final
  no_transport,       ///< the job has a callback URL and no CallbackTransport can send it
  not_found,          ///< an id the store does not know: async_wait, cancel, redeliver (HTTP 404)
  too_many_waiters,   ///< `max_waiting` asynchronous waits are registered already
  tenant_quota,       ///< the job's tenant holds its share of the queue (HTTP 429)
  invalid_job,        ///< the Job breaks a rule (id, callback URL, priority...): Submitted::reason
                      ///< names the field (HTTP 422 invalid_field)
  not_failed,         ///< `redeliver` of a job whose callback has not failed (HTTP 409)
  already_final,      ///< `cancel` of a job that had ended already (HTTP 409)
  tenant_rate,        ///< the job's tenant submits faster than its rate allows (HTTP 429)
  model_not_found,    ///< the job names a model the queue does not serve (HTTP 404)
  version_unavailable,  ///< the job names a version of its model that is not ready (HTTP 409)
  load_failed,          ///< a model version could not be loaded (ModelVersionInfo::error says why)
  version_in_route,     ///< an unload of a version its model's route sends traffic to (HTTP 409)
  route_changed,  ///< a route change that named a generation another change replaced (HTTP 412)
  invalid_route,  ///< a ModelRoute that is not one: percentages, repeated versions (HTTP 422)
  no_loader,      ///< a load on a queue whose ModelRepository has no ModelLoader
};

/// The snake_case name of `e`, as rebound::Server's error answers spell it ("queue_full").
inline const char* to_string(errc e) noexcept {
  switch (e) {
    case errc::id_conflict:
      return "id_conflict";
    case errc::invalid_input:
      return "invalid_input";
    case errc::queue_full:
      return "queue_full";
    case errc::not_ready:
      return "not_ready";
    case errc::store_unavailable:
      return "store_unavailable";
    case errc::shutting_down:
      return "shutting_down";
    case errc::no_transport:
      return "no_transport";
    case errc::not_found:
      return "not_found";
    case errc::too_many_waiters:
      return "too_many_waiters";
    case errc::tenant_quota:
      return "tenant_quota";
    case errc::tenant_rate:
      return "tenant_rate";
    case errc::invalid_job:
      return "invalid_job";
    case errc::not_failed:
      return "not_failed";
    case errc::already_final:
      return "already_final";
    case errc::model_not_found:
      return "model_not_found";
    case errc::version_unavailable:
      return "version_unavailable";
    case errc::load_failed:
      return "load_failed";
    case errc::version_in_route:
      return "version_in_route";
    case errc::route_changed:
      return "route_changed";
    case errc::invalid_route:
      return "invalid_route";
    case errc::no_loader:
      return "no_loader";
  }
  return "unknown";
}

namespace detail {
class ErrorCategory final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "rebound"; }
  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::id_conflict:
        return "a different job with this id was already submitted";
      case errc::invalid_input:
        return "the model refused the input";
      case errc::queue_full:
        return "the queue is full; try again later";
      case errc::not_ready:
        return "the model is not ready";
      case errc::store_unavailable:
        return "the job store is failing";
      case errc::shutting_down:
        return "the job queue is shutting down";
      case errc::no_transport:
        return "the job has a callback URL and no callback transport is configured";
      case errc::not_found:
        return "no job with this id";
      case errc::too_many_waiters:
        return "too many asynchronous waits at once";
      case errc::tenant_quota:
        return "the tenant holds its share of the queue; try again later";
      case errc::tenant_rate:
        return "the tenant submits faster than its rate allows; try again later";
      case errc::invalid_job:
        return "the job breaks a rule of submission";
      case errc::not_failed:
        return "the job's callback has not failed";
      case errc::already_final:
        return "the job had ended already";
      case errc::model_not_found:
        return "no model of that name";
      case errc::version_unavailable:
        return "that version of the model is not ready";
      case errc::load_failed:
        return "the model version could not be loaded";
      case errc::version_in_route:
        return "the model's route sends traffic to that version";
      case errc::route_changed:
        return "the model's route changed since the generation named";
      case errc::invalid_route:
        return "the route is not one";
      case errc::no_loader:
        return "the model repository has no loader";
    }
    return "unknown rebound error";
  }
};
}  // namespace detail

/// The category of rebound::errc (name "rebound"). A singleton; thread-safe.
inline const boost::system::error_category& error_category() noexcept {
  static const detail::ErrorCategory category;
  return category;
}

inline boost::system::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

}  // namespace rebound

namespace boost::system {
template <>
struct is_error_code_enum<rebound::errc> : std::true_type {};
}  // namespace boost::system
