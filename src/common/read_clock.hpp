// Internal: a user's clock, read where a throw must not escape.
#pragma once

namespace rebound::detail {

/// `clock()`, or `Real::now()` where it throws. CallbackSender (system_clock) and OriginGate
/// (steady_clock) read their injected clocks on an executor's thread or under a request's end,
/// where a throw would end that thread's run or leave a request half done.
template <class Real, class UserClock>
typename Real::time_point read_clock(const UserClock& clock) noexcept {
  try {
    return clock();
  } catch (...) {
    return Real::now();
  }
}

}  // namespace rebound::detail
