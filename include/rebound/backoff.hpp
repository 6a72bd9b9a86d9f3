// Backoff policies: how long to wait before the next callback attempt, or whether to give up.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <utility>

#include "rebound/error.hpp"

namespace rebound {

/// What a BackoffPolicy knows when it decides about the next attempt.
struct RetryContext {
  int attempts = 1;  ///< Attempts made so far, including the one that just failed (>= 1).
  std::chrono::milliseconds previous_delay{0};  ///< The delay chosen before the failed attempt.
  std::chrono::milliseconds elapsed{0};          ///< Time since the first attempt started.
  /// The receiver's `Retry-After`, when its answer carried one that could be parsed.
  std::optional<std::chrono::milliseconds> retry_after;
};

/// Decides the delay before the next attempt, or gives up (`std::nullopt`).
///
/// Policies are immutable after construction and hold no per-delivery state (everything a policy
/// needs arrives in RetryContext), so one policy object serves every delivery at once.
/// Implementations must be thread-safe. Compose them with the functions in `rebound::backoff`.
class BackoffPolicy {
 public:
  virtual ~BackoffPolicy() = default;
  virtual std::optional<std::chrono::milliseconds> next_delay(const RetryContext& ctx) const = 0;
};

using BackoffPolicyPtr = std::shared_ptr<const BackoffPolicy>;

/// A source of uniform random numbers in [0, 1). Must be thread-safe; inject a fixed one in tests.
using RandomSource = std::function<double()>;

namespace backoff {

/// A thread-safe RandomSource: one Mersenne Twister per thread, seeded from std::random_device.
inline RandomSource default_random() {
  return [] {
    thread_local std::mt19937_64 engine{std::random_device{}()};
    return std::uniform_real_distribution<double>(0.0, 1.0)(engine);
  };
}

namespace detail {

class Exponential final : public BackoffPolicy {
 public:
  Exponential(std::chrono::milliseconds base, double factor, std::chrono::milliseconds cap)
      : base_(base), factor_(factor), cap_(cap) {
    if (base.count() < 0 || cap.count() < 0) throw Error("backoff: delays must not be negative");
    if (!(factor >= 1.0)) throw Error("backoff: exponential factor must be at least 1");
  }
  std::optional<std::chrono::milliseconds> next_delay(const RetryContext& ctx) const override {
    const double exponent = std::max(0, ctx.attempts - 1);
    const double ms = static_cast<double>(base_.count()) * std::pow(factor_, exponent);
    const double capped = std::min(ms, static_cast<double>(cap_.count()));
    return std::chrono::milliseconds(static_cast<long long>(capped));
  }

 private:
  std::chrono::milliseconds base_;
  double factor_;
  std::chrono::milliseconds cap_;
};

class FullJitter final : public BackoffPolicy {
 public:
  FullJitter(BackoffPolicyPtr inner, RandomSource random)
      : inner_(std::move(inner)), random_(std::move(random)) {
    if (!inner_ || !random_) throw Error("backoff: full_jitter needs a policy and a random source");
  }
  std::optional<std::chrono::milliseconds> next_delay(const RetryContext& ctx) const override {
    const auto delay = inner_->next_delay(ctx);
    if (!delay) return std::nullopt;
    const double r = std::clamp(random_(), 0.0, 1.0);
    return std::chrono::milliseconds(static_cast<long long>(static_cast<double>(delay->count()) * r));
  }

 private:
  BackoffPolicyPtr inner_;
  RandomSource random_;
};

class MaxTries final : public BackoffPolicy {
 public:
  MaxTries(BackoffPolicyPtr inner, int max_tries) : inner_(std::move(inner)), max_(max_tries) {
    if (!inner_) throw Error("backoff: max_tries needs a policy");
    if (max_tries < 1) throw Error("backoff: max_tries must be at least 1");
  }
  std::optional<std::chrono::milliseconds> next_delay(const RetryContext& ctx) const override {
    if (ctx.attempts >= max_) return std::nullopt;
    return inner_->next_delay(ctx);
  }

 private:
  BackoffPolicyPtr inner_;
  int max_;
};

class RespectRetryAfter final : public BackoffPolicy {
 public:
  RespectRetryAfter(BackoffPolicyPtr inner, std::chrono::milliseconds cap)
      : inner_(std::move(inner)), cap_(cap) {
    if (!inner_) throw Error("backoff: respect_retry_after needs a policy");
    if (cap.count() < 0) throw Error("backoff: the Retry-After cap must not be negative");
  }
  std::optional<std::chrono::milliseconds> next_delay(const RetryContext& ctx) const override {
    const auto delay = inner_->next_delay(ctx);
    if (!delay || !ctx.retry_after) return delay;
    return std::max(*delay, std::min(*ctx.retry_after, cap_));
  }

 private:
  BackoffPolicyPtr inner_;
  std::chrono::milliseconds cap_;
};

}  // namespace detail

/// `base * factor^(attempts-1)`, capped at `cap`: with the defaults 1 s, 2 s, 4 s, ... 60 s.
inline BackoffPolicyPtr exponential(
    std::chrono::milliseconds base = std::chrono::seconds(1), double factor = 2.0,
    std::chrono::milliseconds cap = std::chrono::seconds(60)) {
  return std::make_shared<detail::Exponential>(base, factor, cap);
}

/// AWS "full jitter": a uniform random delay between 0 and what `inner` would wait.
inline BackoffPolicyPtr full_jitter(BackoffPolicyPtr inner,
                                    RandomSource random = default_random()) {
  return std::make_shared<detail::FullJitter>(std::move(inner), std::move(random));
}

/// Gives up once `max_tries` attempts have been made (so `max_tries(p, 5)` makes 5 attempts).
inline BackoffPolicyPtr max_tries(BackoffPolicyPtr inner, int max_tries) {
  return std::make_shared<detail::MaxTries>(std::move(inner), max_tries);
}

/// Waits at least as long as the receiver's `Retry-After` asks, but never longer than `cap`;
/// when `inner` gives up, so does this.
inline BackoffPolicyPtr respect_retry_after(BackoffPolicyPtr inner,
                                            std::chrono::milliseconds cap = std::chrono::minutes(5)) {
  return std::make_shared<detail::RespectRetryAfter>(std::move(inner), cap);
}

/// rebound's default, the seed's `backoff.expo` with `max_tries=5`: exponential from 1 s, doubling,
/// capped at 60 s, with full jitter, `Retry-After` honoured up to 5 minutes, 5 attempts in all.
inline BackoffPolicyPtr default_policy(int tries = 5, RandomSource random = default_random()) {
  return max_tries(respect_retry_after(full_jitter(exponential(), std::move(random))), tries);
}

}  // namespace backoff
}  // namespace rebound
