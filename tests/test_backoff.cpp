// Backoff policies: exact schedules with an injected random source, composition, Retry-After.
#include <doctest/doctest.h>

#include "common/retry_after.hpp"
#include "rebound/delivery/backoff.hpp"
#include "rebound/delivery/callback_transport.hpp"

using namespace std::chrono_literals;
using rebound::RetryContext;
namespace backoff = rebound::backoff;

namespace {
std::optional<std::chrono::milliseconds> after(const rebound::BackoffPolicyPtr& p, int attempts) {
  RetryContext ctx;
  ctx.attempts = attempts;
  return p->next_delay(ctx);
}
}  // namespace

TEST_CASE("exponential doubles from the base and stops growing at the cap") {
  auto p = backoff::exponential(100ms, 2.0, 1000ms);
  CHECK(after(p, 1) == 100ms);
  CHECK(after(p, 2) == 200ms);
  CHECK(after(p, 3) == 400ms);
  CHECK(after(p, 4) == 800ms);
  CHECK(after(p, 5) == 1000ms);
  CHECK(after(p, 60) == 1000ms);  // no overflow far past the cap
}

TEST_CASE("exponential refuses a factor below 1 and negative delays") {
  CHECK_THROWS_AS(backoff::exponential(100ms, 0.5), rebound::Error);
  CHECK_THROWS_AS(backoff::exponential(-1ms), rebound::Error);
}

TEST_CASE("full jitter scales the inner delay by the random draw") {
  double draw = 0.25;
  auto p = backoff::full_jitter(backoff::exponential(1000ms, 2.0, 60s), [&] { return draw; });
  CHECK(after(p, 1) == 250ms);
  CHECK(after(p, 3) == 1000ms);
  draw = 0.0;
  CHECK(after(p, 3) == 0ms);
  draw = 0.999;
  CHECK(after(p, 2) == 1998ms);
}

TEST_CASE("full jitter with the default random source stays within [0 - inner]") {
  auto p = backoff::full_jitter(backoff::exponential(1000ms));
  for (int i = 0; i < 200; ++i) {
    auto d = after(p, 3);
    REQUIRE(d.has_value());
    CHECK(*d >= 0ms);
    CHECK(*d <= 4000ms);
  }
}

TEST_CASE("max_tries gives up once that many attempts were made") {
  auto p = backoff::max_tries(backoff::exponential(10ms), 3);
  CHECK(after(p, 1) == 10ms);
  CHECK(after(p, 2) == 20ms);
  CHECK_FALSE(after(p, 3).has_value());
  CHECK_FALSE(after(p, 4).has_value());
  CHECK_THROWS_AS(backoff::max_tries(backoff::exponential(), 0), rebound::Error);
}

TEST_CASE("respect_retry_after waits at least Retry-After - up to its cap") {
  auto p = backoff::respect_retry_after(backoff::exponential(100ms), 5s);
  RetryContext ctx;
  ctx.attempts = 1;
  ctx.retry_after = 2s;
  CHECK(p->next_delay(ctx) == 2000ms);
  ctx.retry_after = 1h;
  CHECK(p->next_delay(ctx) == 5000ms);
  ctx.retry_after = 10ms;  // shorter than the policy's own delay: the policy wins
  CHECK(p->next_delay(ctx) == 100ms);
  auto stopped = backoff::max_tries(backoff::respect_retry_after(backoff::exponential(100ms)), 1);
  CHECK_FALSE(stopped->next_delay(ctx).has_value());
}

TEST_CASE("the default policy is the seed's: expo from 1 s with full jitter - 5 tries") {
  auto p = backoff::default_policy(5, [] { return 1.0; });
  CHECK(after(p, 1) == 1000ms);
  CHECK(after(p, 2) == 2000ms);
  CHECK(after(p, 3) == 4000ms);
  CHECK(after(p, 4) == 8000ms);
  CHECK_FALSE(after(p, 5).has_value());
}

TEST_CASE("a user-defined policy plugs in like the built-in ones") {
  struct EveryOtherSecond final : rebound::BackoffPolicy {
    std::optional<std::chrono::milliseconds> next_delay(const RetryContext& ctx) const override {
      return ctx.attempts % 2 ? 0ms : 1000ms;
    }
  };
  auto p = backoff::max_tries(std::make_shared<EveryOtherSecond>(), 4);
  CHECK(after(p, 1) == 0ms);
  CHECK(after(p, 2) == 1000ms);
  CHECK_FALSE(after(p, 4).has_value());
}

TEST_CASE("Retry-After parses as seconds and as an HTTP-date") {
  using std::chrono::system_clock;
  const auto now = system_clock::from_time_t(1445412450);  // Wed, 21 Oct 2015 07:27:30 GMT
  CHECK(rebound::detail::parse_retry_after("120", now) == 120000ms);
  CHECK(rebound::detail::parse_retry_after(" 0 ", now) == 0ms);
  CHECK(rebound::detail::parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now) == 30000ms);
  CHECK(rebound::detail::parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now) == 0ms);
  CHECK_FALSE(rebound::detail::parse_retry_after("soon", now).has_value());
  CHECK_FALSE(rebound::detail::parse_retry_after("-5", now).has_value());
  CHECK_FALSE(rebound::detail::parse_retry_after("", now).has_value());
  CHECK_FALSE(rebound::detail::parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT trailing", now)
                  .has_value());
  // Found by fuzzing: dates far from now used to overflow std::chrono (undefined behaviour).
  CHECK_FALSE(
      rebound::detail::parse_retry_after("Wed, 21 Oct 99999999 07:28:00 GMT", now).has_value());
  CHECK(rebound::detail::parse_retry_after("Fri, 31 Dec 7999 23:59:59 GMT", now) ==
        std::chrono::milliseconds(999999999LL * 1000));  // clamped
}

TEST_CASE("Retry-After takes all three HTTP-date forms of RFC 9110") {
  using std::chrono::system_clock;
  const auto now = system_clock::from_time_t(1445412450);  // Wed, 21 Oct 2015 07:27:30 GMT
  // The obsolete RFC 850 form, with its two-digit year.
  CHECK(rebound::detail::parse_retry_after("Wednesday, 21-Oct-15 07:28:00 GMT", now) == 30000ms);
  // asctime, with a two-digit day or a space and one digit.
  CHECK(rebound::detail::parse_retry_after("Wed Oct 21 07:28:00 2015", now) == 30000ms);
  CHECK(rebound::detail::parse_retry_after("Wed Oct  1 07:28:00 2015", now) == 0ms);
  CHECK_FALSE(rebound::detail::parse_retry_after("Wed Oct 1 07:28:00 2015", now).has_value());
  // A two-digit year more than 50 years ahead is in the past century.
  CHECK(rebound::detail::parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now) == 0ms);
  CHECK(rebound::detail::parse_retry_after("Monday, 21-Oct-30 07:27:30 GMT", now) ==
        std::chrono::milliseconds((rebound::detail::days_from_civil(2030, 10, 21) -
                                   rebound::detail::days_from_civil(2015, 10, 21)) *
                                  86400 * 1000));
  // Names in any case; dates that do not exist are refused.
  CHECK(rebound::detail::parse_retry_after("wed, 21 OCT 2015 07:28:00 GMT", now) == 30000ms);
  CHECK_FALSE(rebound::detail::parse_retry_after("Sun, 29 Feb 2015 07:28:00 GMT", now).has_value());
  CHECK(rebound::detail::parse_retry_after("Mon, 29 Feb 2016 07:28:00 GMT", now).has_value());
  CHECK_FALSE(rebound::detail::parse_retry_after("Thu, 31 Apr 2016 07:28:00 GMT", now).has_value());
  CHECK_FALSE(rebound::detail::parse_retry_after("Wed, 21 Oct 2015 24:00:00 GMT", now).has_value());
  CHECK_FALSE(rebound::detail::parse_retry_after("Wed, 21 Oct 2015 07:28:00 UTC", now).has_value());
  CHECK_FALSE(rebound::detail::parse_retry_after("Wed, 21 Okt 2015 07:28:00 GMT", now).has_value());
  // The process locale plays no part (strptime's %a and %b follow LC_TIME).
  CHECK(rebound::detail::parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT", 2015) == 0);
  CHECK(rebound::detail::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT", 2015) == 784111777);
  CHECK(rebound::detail::parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT", 2015) == 784111777);
  CHECK(rebound::detail::parse_http_date("Sun Nov  6 08:49:37 1994", 2015) == 784111777);
}

TEST_CASE("constant waits the same every time") {
  auto p = backoff::constant(250ms);
  CHECK(after(p, 1) == 250ms);
  CHECK(after(p, 9) == 250ms);
}

TEST_CASE("fibonacci grows 1 1 2 3 5 8 times the base up to the cap") {
  auto p = backoff::fibonacci(100ms, 700ms);
  std::vector<std::chrono::milliseconds> got;
  for (int a = 1; a <= 8; ++a)
    got.push_back(*after(p, a));
  CHECK(got == std::vector<std::chrono::milliseconds>{100ms, 100ms, 200ms, 300ms, 500ms, 700ms,
                                                      700ms, 700ms});
  CHECK(after(backoff::fibonacci(1ms, 1h), 1000) == 3600000ms);  // capped, no overflow
}

TEST_CASE("equal jitter waits half the inner delay plus a random share of the other half") {
  double draw = 0.0;
  auto p = backoff::equal_jitter(backoff::exponential(1000ms), [&] { return draw; });
  CHECK(after(p, 1) == 500ms);
  CHECK(after(p, 2) == 1000ms);
  draw = 0.5;
  CHECK(after(p, 2) == 1500ms);
  draw = 1.0;
  CHECK(after(p, 3) == 4000ms);
}

TEST_CASE("decorrelated jitter draws between the base and three times the previous delay") {
  double draw = 1.0;
  auto p = backoff::decorrelated_jitter(100ms, 1000ms, [&] { return draw; });
  RetryContext ctx;
  ctx.attempts = 1;
  CHECK(p->next_delay(ctx) == 300ms);  // uniform(100, 3 * 100) at the top
  ctx.attempts = 2;
  ctx.previous_delay = 300ms;
  CHECK(p->next_delay(ctx) == 900ms);
  ctx.previous_delay = 900ms;
  CHECK(p->next_delay(ctx) == 1000ms);  // capped
  draw = 0.0;
  CHECK(p->next_delay(ctx) == 100ms);  // never below the base
  draw = 0.5;
  ctx.previous_delay = 200ms;
  CHECK(p->next_delay(ctx) == 350ms);  // 100 + (600 - 100) / 2
}

TEST_CASE("max_elapsed gives up when the next attempt would start past the limit") {
  auto p = backoff::max_elapsed(backoff::constant(1000ms), 10s);
  RetryContext ctx;
  ctx.attempts = 3;
  ctx.elapsed = 8s;
  CHECK(p->next_delay(ctx) == 1000ms);
  ctx.elapsed = 9s;
  CHECK(p->next_delay(ctx) == 1000ms);  // starts exactly at the limit
  ctx.elapsed = 9001ms;
  CHECK_FALSE(p->next_delay(ctx).has_value());
}

TEST_CASE("from_function turns a user function into a policy") {
  auto p = backoff::max_tries(backoff::from_function([](const RetryContext& ctx) {
                                return std::optional<std::chrono::milliseconds>(ctx.attempts * 7ms);
                              }),
                              3);
  CHECK(after(p, 1) == 7ms);
  CHECK(after(p, 2) == 14ms);
  CHECK_FALSE(after(p, 3).has_value());
  CHECK_THROWS_AS(backoff::from_function(nullptr), rebound::Error);
}

TEST_CASE("make_policy composes a schedule from a Config") {
  backoff::Config c;
  c.schedule = backoff::Schedule::fibonacci;
  c.base = 10ms;
  c.cap = 1s;
  c.jitter = backoff::Jitter::none;
  c.max_tries = 4;
  auto p = backoff::make_policy(c);
  CHECK(after(p, 1) == 10ms);
  CHECK(after(p, 3) == 20ms);
  CHECK_FALSE(after(p, 4).has_value());

  c.schedule = backoff::Schedule::exponential;
  c.jitter = backoff::Jitter::equal;
  auto half = backoff::make_policy(c, [] { return 0.0; });
  CHECK(after(half, 3) == 20ms);  // 40 ms halved

  c.max_elapsed = 100ms;
  c.jitter = backoff::Jitter::none;
  auto bounded = backoff::make_policy(c);
  RetryContext ctx;
  ctx.attempts = 2;
  ctx.elapsed = 95ms;
  CHECK_FALSE(bounded->next_delay(ctx).has_value());

  c.max_elapsed = 0ms;
  c.retry_after_cap = 0ms;  // Retry-After ignored
  ctx.elapsed = 0ms;
  ctx.retry_after = 30s;
  CHECK(backoff::make_policy(c)->next_delay(ctx) == 20ms);
}
