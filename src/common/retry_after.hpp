// Internal: the `Retry-After` parser CallbackSender uses. A custom CallbackTransport passes the raw
// header in CallbackResponse::retry_after and need not parse it.
#pragma once

#include <algorithm>
#include <chrono>
#include <ctime>
#include <optional>
#include <string_view>

#include "common/http_date.hpp"

namespace rebound::detail {

/// Parses a `Retry-After` value, either delay-seconds ("120") or an HTTP-date
/// in any of RFC 9110's three forms ("Wed, 21 Oct 2015 07:28:00 GMT", "Wednesday, 21-Oct-15
/// 07:28:00 GMT", "Wed Oct 21 07:28:00 2015"), into a delay from `now`, whatever the process
/// locale. A date in the past gives 0.
/// Returns nullopt for anything else. Never throws.
inline std::optional<std::chrono::milliseconds> parse_retry_after(
    std::string_view value, std::chrono::system_clock::time_point now) {
  while (!value.empty() && value.front() == ' ')
    value.remove_prefix(1);
  while (!value.empty() && value.back() == ' ')
    value.remove_suffix(1);
  if (value.empty() || value.size() > 64) return std::nullopt;
  bool digits = true;
  for (char c : value)
    digits = digits && c >= '0' && c <= '9';
  if (digits) {
    if (value.size() > 9) return std::chrono::milliseconds(999999999LL * 1000);
    long long seconds = 0;
    for (char c : value)
      seconds = seconds * 10 + (c - '0');
    return std::chrono::milliseconds(seconds * 1000);
  }
  const std::time_t now_seconds = std::chrono::system_clock::to_time_t(now);
  std::tm now_utc{};
  gmtime_r(&now_seconds, &now_utc);
  const std::optional<long long> when = detail::parse_http_date(value, 1900LL + now_utc.tm_year);
  if (!when) return std::nullopt;
  // Far-future dates would overflow std::chrono's nanoseconds: work in seconds, clamped.
  const long long delta = *when - static_cast<long long>(now_seconds);
  if (delta <= 0) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(std::min(delta, 999999999LL) * 1000);
}

}  // namespace rebound::detail
