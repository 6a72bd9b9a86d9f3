// CallbackSender: one Delivery object per message, driven by transport answers and Asio timers.
#include "rebound/delivery/callback_sender.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/read_clock.hpp"
#include "common/retry_after.hpp"
#include "common/unsent.hpp"
#include "rebound/delivery/webhook_signature.hpp"
#include "rebound/version.hpp"

namespace rebound {

struct CallbackSender::State {
  boost::asio::any_io_executor executor;
  std::unique_ptr<CallbackTransport> transport;
  CallbackSenderOptions options;
  WebhookSigner signer;  // the signing keys, parsed once

  // Tenants' signers, parsed (or derived) once each; a bounded cache, as the tenants of a shared
  // store are whatever its servers were given.
  mutable std::mutex tenants_mutex;
  mutable std::unordered_map<std::string, WebhookSigner> tenants;
  static constexpr std::size_t max_cached_tenants = 4096;

  std::vector<std::string> keys_for(const std::string& tenant) const {
    if (tenant.empty()) return options.signing_secrets;
    auto set = options.tenant_signing_secrets.find(tenant);
    if (set != options.tenant_signing_secrets.end()) return set->second;
    return derive_webhook_keys(options.signing_secrets, tenant);
  }

  WebhookSigner signer_for(const std::string& tenant) const {
    if (tenant.empty() || (signer.empty() && options.tenant_signing_secrets.empty())) return signer;
    std::lock_guard<std::mutex> lock(tenants_mutex);
    auto it = tenants.find(tenant);
    if (it != tenants.end()) return it->second;
    if (tenants.size() >= max_cached_tenants) tenants.clear();
    return tenants.emplace(tenant, WebhookSigner(keys_for(tenant))).first->second;
  }

  mutable std::mutex mutex;
  mutable std::condition_variable idle;
  std::size_t in_flight = 0;

  void finished_one() {
    std::lock_guard<std::mutex> lock(mutex);
    if (--in_flight == 0) idle.notify_all();
  }
};

namespace {

std::string describe(const CallbackResponse& r) {
  if (r.error == TransportError::none) return "HTTP " + std::to_string(r.status);
  return r.message.empty() ? std::string("transport error") : r.message;
}

// The options' clock, or the system's where a user clock throws: the answer to an attempt is
// heard on the executor, where a throw would end its thread's run.
std::chrono::system_clock::time_point now_of(const CallbackSenderOptions& options) noexcept {
  return detail::read_clock<std::chrono::system_clock>(options.now);
}

template <typename F, typename... Args>
void call_quietly(const F& f, Args&&... args) noexcept {
  if (!f) return;
  try {
    f(std::forward<Args>(args)...);
  } catch (...) {
    // A user callback must not take down a delivery or a worker thread.
  }
}

class Delivery final : public std::enable_shared_from_this<Delivery> {
 public:
  // `single`: one attempt, reported to on_attempt, and no retry (CallbackSender::attempt).
  Delivery(std::shared_ptr<CallbackSender::State> state, CallbackMessage message,
           AttemptObserver on_attempt, DeliveryHandler on_done, bool single = false,
           RetryState before = {})
      : state_(std::move(state)),
        message_(std::move(message)),
        on_attempt_(std::move(on_attempt)),
        on_done_(std::move(on_done)),
        timer_(state_->executor),
        started_(std::chrono::steady_clock::now()),
        single_(single),
        before_(before),
        previous_delay_(before.previous_delay) {}

  // An attempt that cannot be sent (the transport, or building its request, threw) is a failed
  // attempt, retried as a broken connection is: the delivery goes on, and its count in
  // `in_flight` is given back when it ends, as every delivery's is. A transport that answered
  // before it threw, or answers twice, is heard once: its first answer counts. An answer to an
  // earlier attempt (a copy of its handler called late) counts for nothing.
  void attempt() {
    try {
      send();
    } catch (const std::exception& e) {
      on_unsent(e.what());
    } catch (...) {
      on_unsent("unknown error");
    }
  }

 private:
  void on_unsent(const char* what) {
    if (!take_answer(attempt_.load() >> 1)) return;
    on_response(detail::unsent_response(what));
  }

  // Whether this is the first answer to attempt `number` while it is the latest attempt.
  bool take_answer(std::uint64_t number) {
    std::uint64_t unanswered = number << 1;
    return attempt_.compare_exchange_strong(unanswered, unanswered | 1);
  }

  void send() {
    const auto& options = state_->options;
    const std::uint64_t number = (attempt_.load() >> 1) + 1;
    attempt_.store(number << 1);
    try {
      sent_at_ = options.now();
    } catch (...) {
      sent_at_ = std::chrono::system_clock::now();  // what the unsent attempt reports
      throw;
    }
    CallbackRequest request;
    request.url = message_.url;
    request.body = message_.body;
    request.tenant = message_.tenant;
    request.timeout = options.timeout;
    const auto timestamp =
        std::chrono::duration_cast<std::chrono::seconds>(sent_at_.time_since_epoch()).count();
    request.headers = {{"Content-Type", "application/json"},
                       {"User-Agent", std::string("rebound/") + version},
                       {"webhook-id", message_.webhook_id},
                       {"webhook-timestamp", std::to_string(timestamp)}};
    for (const auto& header : message_.extra_headers)
      request.headers.push_back(header);
    const WebhookSigner signer = state_->signer_for(message_.tenant);
    if (!signer.empty()) {
      request.headers.emplace_back("webhook-signature",
                                   signer.sign(message_.webhook_id, timestamp, message_.body));
    }
    // The transport calls back on its own thread; hop to the executor, and hand the only
    // reference over so that the transport thread never releases the last one.
    auto self = shared_from_this();
    state_->transport->send(std::move(request), [self, number](CallbackResponse response) mutable {
      // (null: this handler was called before, and handed its reference over then)
      if (!self || !self->take_answer(number)) return;
      auto executor = self->state_->executor;
      boost::asio::post(executor, [self = std::move(self), response = std::move(response)] {
        self->on_response(response);
      });
    });
  }

  void on_response(const CallbackResponse& response) {
    const auto& options = state_->options;
    if (response.error == TransportError::deferred) return on_deferred(response);
    ++attempts_;
    AttemptReport report;
    report.attempt = message_.previous_attempts + attempts_;
    for (const auto& header : message_.extra_headers)
      if (header.first == "traceparent") report.traceparent = header.second;
    report.parent_span_id = message_.parent_span_id;
    report.started_at = sent_at_;
    report.finished_at = now_of(options);
    report.response = response;
    report.verdict = default_classifier(response);
    try {
      if (options.classifier) report.verdict = options.classifier(response);
    } catch (...) {
      // A classifier that throws decides nothing: the default's verdict stands.
    }
    // A request that was sent is an attempt: only the transport defers.
    if (report.verdict == AttemptVerdict::deferred) report.verdict = AttemptVerdict::retry;
    if (report.verdict != AttemptVerdict::delivered) report.error = describe(response);

    if (report.verdict == AttemptVerdict::retry) {
      RetryContext ctx;
      ctx.attempts = before_.attempts + attempts_;
      ctx.previous_delay = previous_delay_;
      ctx.elapsed = before_.elapsed + std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - started_);
      if (!response.retry_after.empty()) {
        ctx.retry_after = detail::parse_retry_after(response.retry_after, now_of(options));
      }
      std::optional<std::chrono::milliseconds> delay;
      try {
        delay = options.backoff->next_delay(ctx);
      } catch (...) {
        delay.reset();  // a user policy that throws gives up rather than losing the delivery
      }
      if (delay) {
        report.next_delay = *delay;
        previous_delay_ = *delay;
      } else {
        report.verdict = AttemptVerdict::give_up;
      }
    }
    call_quietly(on_attempt_, report);
    if (single_) {
      state_->finished_one();
      return;
    }

    if (report.verdict == AttemptVerdict::retry) {
      timer_.expires_after(report.next_delay);
      timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
        if (!ec)
          self->attempt();
        else
          self->finish(false, "delivery cancelled");
      });
      return;
    }
    finish(report.verdict == AttemptVerdict::delivered, report.error);
  }

  // Not sent, and not an attempt: tried again when the transport asked, with nothing spent.
  void on_deferred(const CallbackResponse& response) {
    const auto delay = std::max(std::chrono::milliseconds(1), response.retry_in);
    if (single_) {
      AttemptReport report;
      report.attempt = message_.previous_attempts + attempts_;
      report.response = response;
      report.verdict = AttemptVerdict::deferred;
      report.next_delay = delay;
      report.error = describe(response);
      report.started_at = report.finished_at = now_of(state_->options);
      call_quietly(on_attempt_, report);
      state_->finished_one();
      return;
    }
    deferred_ += delay;
    if (deferred_ > state_->options.max_deferral) {
      return finish(false, "deferred for longer than max_deferral: " + describe(response));
    }
    timer_.expires_after(delay);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec)
        self->attempt();
      else
        self->finish(false, "delivery cancelled");
    });
  }

  void finish(bool delivered, const std::string& last_error) {
    DeliveryReport done{delivered, message_.previous_attempts + attempts_, last_error};
    call_quietly(on_done_, done);
    state_->finished_one();
  }

  std::shared_ptr<CallbackSender::State> state_;
  CallbackMessage message_;
  AttemptObserver on_attempt_;
  DeliveryHandler on_done_;
  boost::asio::steady_timer timer_;
  std::chrono::steady_clock::time_point started_;
  std::chrono::system_clock::time_point sent_at_{};  // the latest attempt's request went out
  bool single_;
  RetryState before_;
  int attempts_ = 0;
  // The latest attempt's number (counted from 1) shifted left by one, its low bit set once it is
  // answered (by the transport, or as unsent): one answer an attempt, and none for an earlier one.
  std::atomic<std::uint64_t> attempt_{0};
  std::chrono::milliseconds previous_delay_;
  std::chrono::milliseconds deferred_{0};  // waited in all at the transport's request
};

}  // namespace

CallbackSender::CallbackSender(boost::asio::any_io_executor executor,
                               std::unique_ptr<CallbackTransport> transport,
                               CallbackSenderOptions options)
    : state_(std::make_shared<State>()) {
  if (!transport) throw Error("CallbackSender: a transport is required");
  if (!options.backoff) throw Error("CallbackSender: a backoff policy is required");
  if (options.timeout.count() <= 0) throw Error("CallbackSender: the timeout must be positive");
  try {
    state_->signer = WebhookSigner(options.signing_secrets);
    for (const auto& [tenant, keys] : options.tenant_signing_secrets)
      WebhookSigner check(keys);
  } catch (const Error& e) {
    throw Error(std::string("CallbackSender: ") + e.what());
  }
  if (!options.now) throw Error("CallbackSender: a clock is required");
  state_->executor = std::move(executor);
  state_->transport = std::move(transport);
  state_->options = std::move(options);
}

CallbackSender::~CallbackSender() = default;

namespace {
// Counts `delivery` in flight and starts it on the executor; a post that throws (an allocation)
// gives the count back and throws on, so that the caller knows nothing was started.
void start(CallbackSender::State& state, std::shared_ptr<Delivery> delivery) {
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    ++state.in_flight;
  }
  try {
    boost::asio::post(state.executor, [delivery = std::move(delivery)] { delivery->attempt(); });
  } catch (...) {
    state.finished_one();
    throw;
  }
}
}  // namespace

void CallbackSender::deliver(CallbackMessage message, AttemptObserver on_attempt,
                             DeliveryHandler on_done) {
  start(*state_, std::make_shared<Delivery>(state_, std::move(message), std::move(on_attempt),
                                            std::move(on_done)));
}

void CallbackSender::attempt(CallbackMessage message, RetryState state,
                             AttemptObserver on_attempt) {
  start(*state_, std::make_shared<Delivery>(state_, std::move(message), std::move(on_attempt),
                                            nullptr, true, state));
}

const std::vector<std::string>& CallbackSender::public_keys() const {
  return state_->signer.public_keys();
}

std::vector<std::string> CallbackSender::signing_keys_for(const std::string& tenant) const {
  return state_->keys_for(tenant);
}

// Derived at each call, not cached: a name nobody signs for costs what a tenant's does, and
// never pushes a tenant's signer out of the cache (GET /v1/webhook-keys?tenant= is open).
std::vector<std::string> CallbackSender::public_keys_for(const std::string& tenant) const {
  if (tenant.empty()) return state_->signer.public_keys();
  return WebhookSigner(state_->keys_for(tenant)).public_keys();
}

std::vector<EndpointStatus> CallbackSender::endpoints() const {
  return state_->transport->endpoints();
}

std::size_t CallbackSender::in_flight() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->in_flight;
}

bool CallbackSender::wait_idle(std::chrono::steady_clock::duration timeout) const {
  std::unique_lock<std::mutex> lock(state_->mutex);
  return state_->idle.wait_for(lock, timeout, [this] { return state_->in_flight == 0; });
}

boost::asio::any_io_executor CallbackSender::get_executor() const {
  return state_->executor;
}

}  // namespace rebound
