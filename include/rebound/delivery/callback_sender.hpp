// CallbackSender: delivers a job's result to its callback URL, retrying on timers under a policy.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include "rebound/delivery/attempt.hpp"
#include "rebound/delivery/backoff.hpp"
#include "rebound/delivery/callback_transport.hpp"

namespace rebound {

struct CallbackSenderOptions {
  BackoffPolicyPtr backoff = backoff::default_policy();
  /// Decides each attempt's verdict; one that throws leaves default_classifier's verdict.
  ResponseClassifier classifier = default_classifier;
  std::chrono::milliseconds timeout{10000};  ///< per attempt
  /// `deliver` gives a message up once the transport has deferred it (TransportError::deferred)
  /// for longer than this in all, so that nothing waits in memory for a receiver that stays down.
  std::chrono::milliseconds max_deferral{std::chrono::minutes(10)};
  /// Keys to sign every callback with (Standard Webhooks): "whsec_..." shared secrets (HMAC,
  /// `v1`) and "whsk_..." Ed25519 signing keys (`v1a`, verified with the public key). Each adds
  /// one signature to `webhook-signature`, so receivers can rotate keys. Empty: not signed.
  std::vector<std::string> signing_secrets;
  /// The keys of named tenants, where one is set by hand; every other tenant's keys are derived
  /// from `signing_secrets` (derive_webhook_keys). See CallbackMessage::tenant.
  std::map<std::string, std::vector<std::string>> tenant_signing_secrets;
  /// Clock for `webhook-timestamp` and the attempts' times; inject a fixed one in tests. One that
  /// throws costs each attempt as a request that could not be sent (reported with the system's
  /// time), never the delivery.
  std::function<std::chrono::system_clock::time_point()> now = [] {
    return std::chrono::system_clock::now();
  };
};

/// Where a delivery stands before an attempt, for a caller that keeps the retry schedule itself
/// (`CallbackSender::attempt`): what the backoff policy needs to pick the delay after it.
struct RetryState {
  int attempts = 0;                             ///< attempts of this delivery already made
  std::chrono::milliseconds previous_delay{0};  ///< the delay chosen after the last of them
  std::chrono::milliseconds elapsed{0};         ///< since this delivery's first attempt
};

/// Delivers callbacks with retries.
///
/// Each `deliver` call runs on its own: an attempt goes to the transport; a failed attempt asks the
/// backoff policy for a delay and waits on a `boost::asio::steady_timer` on the executor you pass
/// in (no thread sleeps); a delivered or abandoned message ends with one DeliveryReport. A request
/// the transport defers (TransportError::deferred, from an OriginGate) is sent again when it asks,
/// without spending an attempt.
///
/// Headers on every attempt: `Content-Type: application/json`, `User-Agent: rebound/<version>`,
/// `webhook-id`, `webhook-timestamp`, and `webhook-signature` when a signing secret is set.
///
/// Example:
///   boost::asio::io_context io;
///   rebound::CallbackSender sender(
///       io.get_executor(), std::make_unique<rebound::OriginGate>(
///                              std::make_unique<rebound::CurlTransport>(io.get_executor())));
///   sender.deliver({"job-1", "https://example.com/hook", R"({"id":"job-1"})", "msg_job-1"},
///                  nullptr, [](const rebound::DeliveryReport& r) { ... });
///
/// Observers and handlers run on the executor or a transport thread, never under a lock; an
/// exception they throw is swallowed. Thread-safety: every method is thread-safe.
/// Lifetime: the executor must outlive deliveries in flight. The sender may be destroyed first:
/// deliveries in flight keep the transport and the options alive until they end.
class CallbackSender final {
 public:
  CallbackSender(boost::asio::any_io_executor executor,
                 std::unique_ptr<CallbackTransport> transport, CallbackSenderOptions options = {});
  ~CallbackSender();
  CallbackSender(const CallbackSender&) = delete;
  CallbackSender& operator=(const CallbackSender&) = delete;

  /// Starts delivering `message`. `on_attempt` (may be null) hears every attempt; `on_done` (may be
  /// null) hears the end. Returns at once. Throws (std::bad_alloc) only when nothing was started;
  /// neither handler is called then.
  void deliver(CallbackMessage message, AttemptObserver on_attempt, DeliveryHandler on_done);

  /// Makes one attempt at `message` and reports it to `on_attempt`, exactly once: delivered,
  /// give_up, retry with the delay the policy chose from `state`, or deferred (not sent, no
  /// attempt spent) with the delay the transport asked for. Sets no timer: the caller
  /// schedules the next attempt (rebound::JobQueue keeps the schedule in its JobStore, so a retry
  /// hours away costs no memory). Returns at once. Throws (std::bad_alloc) only when nothing was
  /// started; `on_attempt` is not called then.
  ///
  /// Example:
  ///   sender.attempt(message, {2, 400ms, 1200ms}, [](const rebound::AttemptReport& r) {
  ///     if (r.verdict == rebound::AttemptVerdict::retry) schedule(r.next_delay);
  ///   });
  void attempt(CallbackMessage message, RetryState state, AttemptObserver on_attempt);

  /// The "whpk_..." public keys of the Ed25519 signing keys, in order (GET /v1/webhook-keys).
  const std::vector<std::string>& public_keys() const;

  /// The keys messages for `tenant` are signed with: those set for it in
  /// `tenant_signing_secrets`, else derived from `signing_secrets` and its name; for "" the
  /// sender's own. What a tenant's receivers verify with (GET /v1/webhook-secret).
  std::vector<std::string> signing_keys_for(const std::string& tenant) const;

  /// The public keys of `tenant`'s signing keys, in order.
  std::vector<std::string> public_keys_for(const std::string& tenant) const;

  /// Deliveries started and not yet ended.
  std::size_t in_flight() const;

  /// The receiver origins the transport tracks (CallbackTransport::endpoints).
  std::vector<EndpointStatus> endpoints() const;

  /// Waits until no delivery is in flight, or until `timeout`. True when none is.
  bool wait_idle(std::chrono::steady_clock::duration timeout) const;

  boost::asio::any_io_executor get_executor() const;

  struct State;  // shared with deliveries in flight

 private:
  std::shared_ptr<State> state_;
};

}  // namespace rebound
