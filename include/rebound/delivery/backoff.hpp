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
  std::chrono::milliseconds elapsed{0};         ///< Time since the first attempt started.
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

class Constant final : public BackoffPolicy {
 public:
  explicit Constant(std::chrono::milliseconds delay) : delay_(delay) {
    if (delay.count() < 0) throw Error("backoff: delays must not be negative");
  }
  std::optional<std::chrono::milliseconds> next_delay(const RetryContext&) const override {
    return delay_;
  }

 private:
  std::chrono::milliseconds delay_;
};

class Fibonacci final : public BackoffPolicy {
 public:
  Fibonacci(std::chrono::milliseconds base, std::chrono::milliseconds cap)
      : base_(base), cap_(cap) {
    if (base.count() < 0 || cap.count() < 0) throw Error("backoff: delays must not be negative");
  }
  std::optional<std::chrono::milliseconds> next_delay(const RetryContext& ctx) const override {
    // base * F(attempts) with F(1) = F(2) = 1; stop adding once past the cap (no overflow).
    double a = 1, b = 1;
    for (int i = 2; i < ctx.attempts && a * base_.count() < cap_.count(); ++i) {
      const double next = a + b;
      b = a;
      a = next;
    }
    const double ms =
        std::min(a * static_cast<double>(base_.count()), static_cast<double>(cap_.count()));
    return std::chrono::milliseconds(static_cast<long long>(ms));
  }

 private:
  std::chrono::milliseconds base_;
  std::chrono::milliseconds cap_;
};

class EqualJitter final : public BackoffPolicy {
 public:
  EqualJitter(BackoffPolicyPtr inner, RandomSource random)
      : inner_(std::move(inner)), random_(std::move(random)) {
    if (!inner_ || !random_)
      throw Error("backoff: equal_jitter needs a policy and a random source");
  }
  std::optional<std::chrono::milliseconds> next_delay(const RetryContext& ctx) const override {
    const auto delay = inner_->next_delay(ctx);
    if (!delay) return std::nullopt;
    const double half = static_cast<double>(delay->count()) / 2.0;
    const double r = std::clamp(random_(), 0.0, 1.0);
    return std::chrono::milliseconds(static_cast<long long>(half + half * r));
  }

 private:
  BackoffPolicyPtr inner_;
  RandomSource random_;
};

class DecorrelatedJitter final : public BackoffPolicy {
 public:
  DecorrelatedJitter(std::chrono::milliseconds base, std::chrono::milliseconds cap,
                     RandomSource random)
      : base_(base), cap_(cap), random_(std::move(random)) {
    if (base.count() < 0 || cap.count() < 0) throw Error("backoff: delays must not be negative");
    if (!random_) throw Error("backoff: decorrelated_jitter needs a random source");
  }
  std::optional<std::chrono::milliseconds> next_delay(const RetryContext& ctx) const override {
    // AWS: sleep = min(cap, random_between(base, previous_sleep * 3)), starting from base.
    const double prev = ctx.attempts <= 1 || ctx.previous_delay < base_
                            ? static_cast<double>(base_.count())
                            : static_cast<double>(ctx.previous_delay.count());
    const double lo = static_cast<double>(base_.count());
    const double hi = prev * 3.0;
    const double r = std::clamp(random_(), 0.0, 1.0);
    const double ms = std::min(static_cast<double>(cap_.count()), lo + (hi - lo) * r);
    return std::chrono::milliseconds(static_cast<long long>(ms));
  }

 private:
  std::chrono::milliseconds base_;
  std::chrono::milliseconds cap_;
  RandomSource random_;
};

class MaxElapsed final : public BackoffPolicy {
 public:
  MaxElapsed(BackoffPolicyPtr inner, std::chrono::milliseconds limit)
      : inner_(std::move(inner)), limit_(limit) {
    if (!inner_) throw Error("backoff: max_elapsed needs a policy");
    if (limit.count() < 0) throw Error("backoff: max_elapsed must not be negative");
  }
  std::optional<std::chrono::milliseconds> next_delay(const RetryContext& ctx) const override {
    const auto delay = inner_->next_delay(ctx);
    if (!delay || ctx.elapsed + *delay > limit_) return std::nullopt;
    return delay;
  }

 private:
  BackoffPolicyPtr inner_;
  std::chrono::milliseconds limit_;
};

class FromFunction final : public BackoffPolicy {
 public:
  using Function = std::function<std::optional<std::chrono::milliseconds>(const RetryContext&)>;
  explicit FromFunction(Function f) : f_(std::move(f)) {
    if (!f_) throw Error("backoff: from_function needs a function");
  }
  std::optional<std::chrono::milliseconds> next_delay(const RetryContext& ctx) const override {
    return f_(ctx);
  }

 private:
  Function f_;
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
    return std::chrono::milliseconds(
        static_cast<long long>(static_cast<double>(delay->count()) * r));
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

/// The same delay every time.
inline BackoffPolicyPtr constant(std::chrono::milliseconds delay) {
  return std::make_shared<detail::Constant>(delay);
}

/// `base * F(attempts)` over the Fibonacci numbers 1, 1, 2, 3, 5, 8, ..., capped at `cap`.
inline BackoffPolicyPtr fibonacci(std::chrono::milliseconds base = std::chrono::seconds(1),
                                  std::chrono::milliseconds cap = std::chrono::seconds(60)) {
  return std::make_shared<detail::Fibonacci>(base, cap);
}

/// `base * factor^(attempts-1)`, capped at `cap`: with the defaults 1 s, 2 s, 4 s, ... 60 s.
inline BackoffPolicyPtr exponential(std::chrono::milliseconds base = std::chrono::seconds(1),
                                    double factor = 2.0,
                                    std::chrono::milliseconds cap = std::chrono::seconds(60)) {
  return std::make_shared<detail::Exponential>(base, factor, cap);
}

/// AWS "full jitter": a uniform random delay between 0 and what `inner` would wait.
inline BackoffPolicyPtr full_jitter(BackoffPolicyPtr inner,
                                    RandomSource random = default_random()) {
  return std::make_shared<detail::FullJitter>(std::move(inner), std::move(random));
}

/// AWS "equal jitter": half of what `inner` would wait, plus a uniform random part of the other
/// half.
inline BackoffPolicyPtr equal_jitter(BackoffPolicyPtr inner,
                                     RandomSource random = default_random()) {
  return std::make_shared<detail::EqualJitter>(std::move(inner), std::move(random));
}

/// AWS "decorrelated jitter": `min(cap, uniform(base, previous_delay * 3))`, starting from `base`.
/// A complete schedule on its own (it needs no inner policy).
inline BackoffPolicyPtr decorrelated_jitter(
    std::chrono::milliseconds base = std::chrono::seconds(1),
    std::chrono::milliseconds cap = std::chrono::seconds(60),
    RandomSource random = default_random()) {
  return std::make_shared<detail::DecorrelatedJitter>(base, cap, std::move(random));
}

/// Gives up when the next attempt would start more than `limit` after the first one began.
inline BackoffPolicyPtr max_elapsed(BackoffPolicyPtr inner, std::chrono::milliseconds limit) {
  return std::make_shared<detail::MaxElapsed>(std::move(inner), limit);
}

/// A policy from a function (thread-safe, as every policy): return a delay, or nullopt to give up.
inline BackoffPolicyPtr from_function(
    std::function<std::optional<std::chrono::milliseconds>(const RetryContext&)> f) {
  return std::make_shared<detail::FromFunction>(std::move(f));
}

/// Gives up once `max_tries` attempts have been made (so `max_tries(p, 5)` makes 5 attempts).
inline BackoffPolicyPtr max_tries(BackoffPolicyPtr inner, int max_tries) {
  return std::make_shared<detail::MaxTries>(std::move(inner), max_tries);
}

/// Waits at least as long as the receiver's `Retry-After` asks, but never longer than `cap`;
/// when `inner` gives up, so does this.
inline BackoffPolicyPtr respect_retry_after(
    BackoffPolicyPtr inner, std::chrono::milliseconds cap = std::chrono::minutes(5)) {
  return std::make_shared<detail::RespectRetryAfter>(std::move(inner), cap);
}

/// The shape of a schedule, for configuration files and command lines.
enum class Schedule { exponential, constant, fibonacci, decorrelated };
/// The jitter applied to exponential, constant and fibonacci schedules.
enum class Jitter { none, full, equal };

/// A complete delivery policy described by values; `make_policy` turns it into a BackoffPolicy.
struct Config {
  Schedule schedule = Schedule::exponential;
  std::chrono::milliseconds base = std::chrono::seconds(1);
  double factor = 2.0;  ///< exponential only
  std::chrono::milliseconds cap = std::chrono::seconds(60);
  Jitter jitter = Jitter::full;  ///< ignored by decorrelated, which is a jitter itself
  int max_tries = 5;
  std::chrono::milliseconds max_elapsed{0};                             ///< 0: no limit
  std::chrono::milliseconds retry_after_cap = std::chrono::minutes(5);  ///< 0: ignore Retry-After
};

/// Builds max_tries(max_elapsed(respect_retry_after(jitter(schedule)))) from a Config.
/// Throws rebound::Error for values no policy accepts.
inline BackoffPolicyPtr make_policy(const Config& c, RandomSource random = default_random()) {
  BackoffPolicyPtr p;
  switch (c.schedule) {
    case Schedule::exponential:
      p = exponential(c.base, c.factor, c.cap);
      break;
    case Schedule::constant:
      p = constant(std::min(c.base, c.cap));
      break;
    case Schedule::fibonacci:
      p = fibonacci(c.base, c.cap);
      break;
    case Schedule::decorrelated:
      p = decorrelated_jitter(c.base, c.cap, random);
      break;
  }
  if (c.schedule != Schedule::decorrelated) {
    if (c.jitter == Jitter::full) p = full_jitter(std::move(p), random);
    if (c.jitter == Jitter::equal) p = equal_jitter(std::move(p), random);
  }
  if (c.retry_after_cap.count() > 0) p = respect_retry_after(std::move(p), c.retry_after_cap);
  if (c.max_elapsed.count() > 0) p = max_elapsed(std::move(p), c.max_elapsed);
  return max_tries(std::move(p), c.max_tries);
}

/// rebound's default, the seed's `backoff.expo` with `max_tries=5`: exponential from 1 s, doubling,
/// capped at 60 s, with full jitter, `Retry-After` honoured up to 5 minutes, 5 attempts in all.
inline BackoffPolicyPtr default_policy(int tries = 5, RandomSource random = default_random()) {
  Config c;
  c.max_tries = tries;
  return make_policy(c, std::move(random));
}

}  // namespace backoff
}  // namespace rebound
