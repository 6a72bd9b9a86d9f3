// The value types of callback attempts: what one attempt reports, how a delivery ends, and how a
// response is judged. Observers (observer.hpp) read them without the sender.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "rebound/delivery/callback_transport.hpp"

namespace rebound {

/// What to do after one attempt. `deferred` is not an attempt: the transport did not send the
/// request (TransportError::deferred: the receiver's circuit is open, it is paused, or it is at
/// its limits) and asks to be tried again after `AttemptReport::next_delay`; no attempt is spent.
enum class AttemptVerdict { delivered, retry, give_up, deferred };

/// Decides an attempt's verdict from what the transport reported. Must be thread-safe.
using ResponseClassifier = std::function<AttemptVerdict(const CallbackResponse&)>;

/// rebound's default: any 2xx is delivered; `410 Gone` and a refused or unusable address give up
/// at once; everything else (transport errors, timeouts, redirects, other statuses) is retried.
inline AttemptVerdict default_classifier(const CallbackResponse& r) {
  if (r.error == TransportError::invalid_url || r.error == TransportError::refused_address) {
    return AttemptVerdict::give_up;
  }
  if (r.error != TransportError::none) return AttemptVerdict::retry;
  if (r.status >= 200 && r.status < 300) return AttemptVerdict::delivered;
  if (r.status == 410) return AttemptVerdict::give_up;
  return AttemptVerdict::retry;
}

/// One result to deliver.
struct CallbackMessage {
  std::string job_id;
  std::string url;
  std::string body;           ///< JSON, sent as is
  std::string webhook_id;     ///< the `webhook-id` header: the same on every attempt
  int previous_attempts = 0;  ///< attempts already made before this delivery (shown in reports)
  /// Sent on every attempt as well, after the standard headers (e.g. `traceparent`).
  std::vector<std::pair<std::string, std::string>> extra_headers;
  /// The tenant the message is for (rebound/tenant.hpp): signed with that tenant's keys
  /// (CallbackSender::signing_keys_for). Empty: the sender's own keys.
  std::string tenant;
  /// For tracers: the span whose trace the attempts' `traceparent` headers continue (16 hex;
  /// empty: none). Each attempt's own span id is the parent id of the header it carried.
  std::string parent_span_id;
};

/// Reported after every attempt (and, by CallbackSender::attempt, after a deferral).
struct AttemptReport {
  int attempt = 0;  ///< 1-based, counting `previous_attempts`; for a deferral, the attempts so far
  CallbackResponse response;
  AttemptVerdict verdict = AttemptVerdict::retry;  ///< give_up also when the policy stops retrying
  std::chrono::milliseconds next_delay{0};         ///< when `verdict` is retry or deferred
  std::string error;           ///< a one-line description of a failed attempt, e.g. "HTTP 503"
  std::string traceparent;     ///< the `traceparent` the attempt carried, if any
  std::string parent_span_id;  ///< CallbackMessage::parent_span_id
  /// When the request went out and when its answer (or failure) came back; for a deferral, both
  /// are when it was deferred.
  std::chrono::system_clock::time_point started_at{}, finished_at{};
};

/// Reported once, when a delivery ends.
struct DeliveryReport {
  bool delivered = false;
  int attempts = 0;
  std::string last_error;
};

using AttemptObserver = std::function<void(const AttemptReport&)>;
using DeliveryHandler = std::function<void(const DeliveryReport&)>;

}  // namespace rebound
