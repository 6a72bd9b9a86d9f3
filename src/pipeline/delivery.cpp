// Delivery: one callback attempt, and its record in the store.
#include "delivery.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include <boost/asio/post.hpp>

#include "common/trace_context.hpp"
#include "rebound/detail/json.hpp"
#include "rebound/detail/wire.hpp"
#include "rebound/tenant.hpp"

namespace rebound::detail {
namespace {

// The submission's trace goes on: each request made for the job is a new span of the same trace.
void continue_trace(CallbackMessage& message, const Job& job) {
  if (is_valid_traceparent(job.traceparent)) {
    message.extra_headers.emplace_back("traceparent", child_traceparent(job.traceparent));
    message.parent_span_id = job.traceparent.substr(36, 16);
  }
}

}  // namespace

void Delivery::start(JobRecord record, std::string holder, Claim claim) {
  const TimePoint at = clock_();
  record.callback.state = CallbackState::pending;
  record.callback.next_attempt_at = at;
  record.callback.delivery_attempts = 0;
  record.callback.delivery_started_at = at;
  record.callback.previous_delay = std::chrono::milliseconds(0);
  attempt(record, std::move(holder), std::move(claim));
}

void Delivery::attempt(const JobRecord& record, std::string holder, Claim claim) {
  const std::string id = key_of(record.job);
  const std::string& tenant = record.job.tenant;
  const CallbackInfo before = record.callback;
  if (gate_) {
    // Its receiver's circuit is open or it is paused: back to the store from here, without
    // building a request that would not be sent.
    if (auto deferred = gate_->defer_now(record.job.callback_url, tenant, attempt_timeout_)) {
      claim.take_lease(leases_, id, std::move(holder), false);
      claim.charge(0);  // nothing of it stays in memory
      AttemptReport report;
      report.attempt = before.attempts;
      report.verdict = AttemptVerdict::deferred;
      report.next_delay = deferred->retry_in;
      report.error = deferred->message;
      report.response = std::move(*deferred);
      attempted(id, tenant, std::make_shared<Claim>(std::move(claim)), before, report, TimePoint{});
      return;
    }
  }
  CallbackMessage message{id,
                          record.job.callback_url,
                          dump_json(to_callback_json(record)),
                          webhook_id_of(record.job),
                          before.attempts,
                          {},
                          tenant,
                          {}};
  continue_trace(message, record.job);
  RetryState state;
  state.attempts = before.delivery_attempts;
  state.previous_delay = before.previous_delay;
  if (before.delivery_started_at != TimePoint{}) {
    state.elapsed = std::max(std::chrono::milliseconds(0),
                             std::chrono::duration_cast<std::chrono::milliseconds>(
                                 clock_() - before.delivery_started_at));
  }
  // Renewed while it lasts: an attempt may wait in the transport (behind a receiver's other
  // requests, or its open circuit) for longer than a lease.
  claim.take_lease(leases_, id, std::move(holder), false);
  // The attempt holds its body (and the transport a copy of it) instead of the job's input.
  claim.charge(2 * message.body.capacity() + message.url.capacity() + sizeof(CallbackMessage));
  auto held = std::make_shared<Claim>(std::move(claim));
  sender_.attempt(std::move(message), state,
                  [this, keep = owner(), id, tenant, before, held,
                   sent_at = clock_()](const AttemptReport& report) {
                    if (report.verdict == AttemptVerdict::deferred)
                      return defer_later(id, tenant, held, before, report);
                    attempted(id, tenant, held, before, report, sent_at);
                  });
}

void Delivery::defer_later(const std::string& id, const std::string& tenant,
                           std::shared_ptr<Claim> claim, const CallbackInfo& before,
                           const AttemptReport& report) {
  claim->charge(0);  // its request is gone: nothing of it stays in memory while it waits here
  {
    std::lock_guard<std::mutex> lock(deferrals_mutex_);
    deferrals_.push_back({id, tenant, std::move(claim), before, report});
    if (recording_deferrals_) return;
    recording_deferrals_ = true;
  }
  post_deferrals();
}

void Delivery::post_deferrals() {
  try {
    boost::asio::post(sender_.get_executor(), [this, keep = owner()] { record_deferrals(); });
  } catch (...) {
    // Not posted (out of memory): the next deferral posts again. Until then the queued claims
    // keep their slots, and their leases are renewed.
    std::lock_guard<std::mutex> lock(deferrals_mutex_);
    recording_deferrals_ = false;
  }
}

void Delivery::record_deferrals() {
  std::vector<Deferral> slice;
  {
    std::lock_guard<std::mutex> lock(deferrals_mutex_);
    const std::size_t n = std::min(deferral_slice, deferrals_.size());
    for (std::size_t i = 0; i < n; ++i) {
      slice.push_back(std::move(deferrals_.front()));
      deferrals_.pop_front();
    }
  }
  for (Deferral& d : slice) {
    try {
      attempted(d.id, d.tenant, d.claim, d.before, d.report, TimePoint{});
    } catch (...) {
      // Not recorded (out of memory): the claim goes, its lease runs out in the store, and the
      // callback is claimed again then. The slices after it still run.
    }
  }
  {
    std::lock_guard<std::mutex> lock(deferrals_mutex_);
    if (deferrals_.empty()) {
      recording_deferrals_ = false;
      return;
    }
  }
  // The next slice after whatever else is ready on the executor (the reactor's turn included).
  post_deferrals();
}

void Delivery::notify_started(const Job& job) {
  if (!job.wants_started_callback()) return;
  if (started_in_flight_.fetch_add(1) >= admission_.capacity()) {
    --started_in_flight_;
    return;
  }
  nlohmann::json body = {{"id", job.id}, {"status", "running"}};
  if (!job.model.name.empty()) body["model"] = to_model_json(job.model);
  CallbackMessage message{key_of(job),
                          job.callback_url,
                          dump_json(body),
                          // ('~' is in no job id nor tenant name: "msg_x_started" is
                          // job x_started's own webhook-id.)
                          webhook_id_of(job) + "~started",
                          0,
                          {},
                          job.tenant,
                          {}};
  // (The submission's traceparent as is: this notification's request records no span, so it
  // names none of its own that the receiver's spans would hang from.)
  if (is_valid_traceparent(job.traceparent))
    message.extra_headers.emplace_back("traceparent", job.traceparent);
  sender_.deliver(std::move(message), nullptr,
                  [this, keep = owner()](const DeliveryReport&) { --started_in_flight_; });
}

std::string Delivery::signature_schemes(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(schemes_mutex_);
  auto it = schemes_.find(tenant);
  if (it != schemes_.end()) return it->second;
  bool hmac = false, ed25519 = false;
  for (const auto& key : sender_.signing_keys_for(tenant)) {
    hmac = hmac || key.rfind("whsec_", 0) == 0;
    ed25519 = ed25519 || key.rfind("whsk_", 0) == 0;
  }
  std::string schemes = hmac ? "v1" : "";
  if (ed25519) schemes += hmac ? ",v1a" : "v1a";
  if (schemes_.size() >= 1024) schemes_.clear();
  return schemes_.emplace(tenant, std::move(schemes)).first->second;
}

void Delivery::attempted(const std::string& id, const std::string& tenant,
                         const std::shared_ptr<Claim>& claim, const CallbackInfo& before,
                         const AttemptReport& report, TimePoint sent_at) {
  const std::string holder = claim->holder();
  std::optional<CallbackAttempt> made;
  if (report.verdict != AttemptVerdict::deferred && sent_at != TimePoint{}) {
    made.emplace();
    made->at = sent_at;
    made->http_status = report.response.error == TransportError::none ? report.response.status : 0;
    if (report.verdict != AttemptVerdict::delivered)
      made->error = report.error.substr(0, max_attempt_error_bytes);
    made->latency =
        std::max(std::chrono::milliseconds(0),
                 std::chrono::duration_cast<std::chrono::milliseconds>(clock_() - sent_at));
    made->signatures = signature_schemes(tenant);
  }
  CallbackInfo after = before;
  AttemptReport given_up;
  const AttemptReport* heard = &report;
  if (report.verdict == AttemptVerdict::deferred) {
    if (before.delivery_started_at != TimePoint{} &&
        clock_() - before.delivery_started_at >= max_deferral_) {
      // Waited behind a receiver that never came back for too long: a dead letter now.
      given_up = report;
      given_up.verdict = AttemptVerdict::give_up;
      given_up.error = "deferred for longer than the longest deferral allowed: " + report.error;
      heard = &given_up;
      after.last_error = given_up.error;
    }
  } else {
    after.attempts = report.attempt;
    after.delivery_attempts = before.delivery_attempts + 1;
    after.last_error = report.error;
  }
  switch (heard->verdict) {
    case AttemptVerdict::deferred:
      // Not sent: back to the store, due when the transport asked, with no attempt spent. It
      // holds no slot and no memory meanwhile, however long the receiver's circuit stays open.
      after.state = CallbackState::pending;
      after.next_attempt_at = clock_() + report.next_delay;
      break;
    case AttemptVerdict::delivered:
      after.state = CallbackState::delivered;
      break;
    case AttemptVerdict::give_up:
      after.state = CallbackState::failed;
      break;
    case AttemptVerdict::retry:
      after.state = CallbackState::pending;
      after.next_attempt_at = clock_() + report.next_delay;
      after.previous_delay = report.next_delay;
      break;
  }
  observe_([&](auto& o) { o.on_attempt(id, *heard); });
  store_.write_until_stored<bool, JobStore::WriteDone>(
      owner(), "record_attempt", id, {JobStore::AsyncCall::record_attempt},
      [this, id, holder, after, made](JobLeaseStore& s, JobStore::WriteDone done) {
        s.async_record_attempt(id, holder, after, clock_(), made, std::move(done));
      },
      [this, id, claim, after](bool recorded) {
        claim->release();
        if (!recorded) observe_([&](auto& o) { o.on_lease_lost(id, "record_attempt"); });
        if (recorded && after.state == CallbackState::pending)
          events_.wake_pump(after.next_attempt_at);
      },
      [claim] { claim->release(); });
}

}  // namespace rebound::detail
