// Delivery: a job's callback, one attempt at a time. Between attempts the schedule lives in the
// store (`next_attempt_at`), so a waiting retry costs no memory and no slot.
#pragma once

#include <atomic>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "admission.hpp"
#include "claim.hpp"
#include "events.hpp"
#include "leases.hpp"
#include "observers.hpp"
#include "rebound/delivery/callback_sender.hpp"
#include "rebound/delivery/origin_gate.hpp"
#include "rebound/job.hpp"
#include "store_access.hpp"

namespace rebound::detail {

/// Thread-safe. Every attempt holds a slot of `admission`, freed once the attempt is recorded.
/// `schedule` asks the pump to look for due work at a time (the next attempt of a retry).
/// `owner` (the pipeline) is kept alive while an attempt is in flight.
class Delivery {
 public:
  using TimePoint = std::chrono::system_clock::time_point;

  /// `max_deferral`: a callback deferred (its receiver's circuit open, paused) this long after
  /// its delivery started is given up. `gate`: the gate in front of the transport (null: none),
  /// asked before each attempt whether it would be deferred (then no request is built and nothing
  /// goes through the io thread); `attempt_timeout`: the attempts' timeout. `events` hears each
  /// retry's time (wake_pump) and keeps the parts alive while an attempt is in flight.
  Delivery(CallbackSender& sender, StoreAccess& store, Leases& leases, Admission& admission,
           Observers& observe, Clock clock, PipelineEvents& events, OriginGate* gate,
           std::chrono::milliseconds attempt_timeout, std::chrono::milliseconds max_deferral)
      : sender_(sender),
        store_(store),
        leases_(leases),
        admission_(admission),
        observe_(observe),
        clock_(std::move(clock)),
        events_(events),
        gate_(gate),
        attempt_timeout_(attempt_timeout),
        max_deferral_(max_deferral) {}

  /// Sends the first attempt of a callback `holder` has just claimed with the job's outcome, in
  /// the slot of `claim` (the job's, whose lease it replaces).
  void start(JobRecord record, std::string holder, Claim claim);

  /// Sends the next attempt of a pending callback that `holder` has claimed, in the slot of
  /// `claim`; the claim holds `holder`'s lease until the attempt is recorded.
  void attempt(const JobRecord& record, std::string holder, Claim claim);

  /// Tells the callback URL that `job` started running (`webhook_events` with "started"), when it
  /// asked to. Best effort: retried by the sender's policy in memory (not in the store, so a
  /// crash loses it), at most `admission`'s capacity at once; beyond that it is skipped.
  void notify_started(const Job& job);

 private:
  // What follows an attempt: its record in the store (pending with the next time, delivered or
  // failed) and the observers.
  // `sent_at`: when the attempt went to the transport (the epoch for a deferral, which is no
  // attempt and is not logged).
  // `id`: the job's store key; `tenant`: whose keys signed the attempt.
  void attempted(const std::string& id, const std::string& tenant,
                 const std::shared_ptr<Claim>& claim, const CallbackInfo& before,
                 const AttemptReport& report, TimePoint sent_at);
  // A deferral the transport answered. As an origin's circuit opens (or it is paused), the gate
  // sends back everything that waited for it at once: thousands of answers, each its own handler
  // on the io executor, one after another before the reactor's next turn. Each only queues its
  // deferral here; the store writes that follow run `deferral_slice` at a time, each slice a
  // handler of its own, so that the other origins' deliveries go on between them. A deferral
  // still queued when the JobQueue goes is dropped with its claim (its lease runs out in the
  // store; ~JobQueue stops the store access before the parts go, so the slot it frees wakes no
  // pump).
  void defer_later(const std::string& id, const std::string& tenant, std::shared_ptr<Claim> claim,
                   const CallbackInfo& before, const AttemptReport& report);
  void post_deferrals();
  void record_deferrals();
  struct Deferral {
    std::string id;
    std::string tenant;
    std::shared_ptr<Claim> claim;
    CallbackInfo before;
    AttemptReport report;
  };
  static constexpr std::size_t deferral_slice = 32;
  // The signature schemes a tenant's callbacks carry ("v1", "v1,v1a", ""), for the attempt log.
  std::string signature_schemes(const std::string& tenant);

  CallbackSender& sender_;
  StoreAccess& store_;
  Leases& leases_;
  Admission& admission_;
  Observers& observe_;
  const Clock clock_;
  PipelineEvents& events_;
  OriginGate* const gate_;
  const std::chrono::milliseconds attempt_timeout_;
  const std::chrono::milliseconds max_deferral_;
  // What async work holds to keep the parts alive.
  std::shared_ptr<const void> owner() const { return events_.keep_alive(); }
  std::atomic<std::size_t> started_in_flight_{0};
  std::mutex deferrals_mutex_;
  std::deque<Deferral> deferrals_;    // guarded by deferrals_mutex_, as is:
  bool recording_deferrals_ = false;  // a record_deferrals is posted or running
  std::mutex schemes_mutex_;
  std::unordered_map<std::string, std::string> schemes_;  // by tenant; guarded by schemes_mutex_
};

}  // namespace rebound::detail
