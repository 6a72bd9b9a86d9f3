// Internal: a user's clock, read where a throw must not escape.
#pragma once

namespace rebound::detail {

/// `clock()`, or `Real::now()` where it throws. CallbackSender (system_clock, as an attempt is
/// answered) and OriginGate (steady_clock, in each call and as a request ends) read their injected
/// clocks where a throw would end an executor's run or leave a request half done.
template <class Real, class UserClock>
typename Real::time_point read_clock(const UserClock& clock) noexcept {
  try {
    return clock();
  } catch (...) {
    return Real::now();
  }
}

}  // namespace rebound::detail
