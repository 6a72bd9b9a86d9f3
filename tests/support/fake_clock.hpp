// The tests' one clock, moved by hand, for JobQueueOptions::clock (and, as a steady clock, for
// OriginGateOptions::clock): time-dependent behaviour (time in queue, retry schedules, leases,
// breakers) is tested without sleeping.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

namespace rebound::test {

/// Starts at the real time (stores that prune by the wall clock keep what it stamps), then moves
/// only when told.
struct FakeClock {
  std::atomic<std::int64_t> ms{std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count()};
  std::chrono::system_clock::time_point now() const {
    return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms.load()));
  }
  void advance(std::chrono::milliseconds d) { ms += d.count(); }
};

/// The clock as JobQueueOptions::clock takes it; `clock` must outlive its users.
inline std::function<std::chrono::system_clock::time_point()> clock_of(
    const std::shared_ptr<FakeClock>& clock) {
  return [clock] { return clock->now(); };
}

/// The same clock as a steady one (for OriginGateOptions::clock): it moves with `clock`.
inline std::function<std::chrono::steady_clock::time_point()> steady_of(
    const std::shared_ptr<FakeClock>& clock) {
  return [clock] { return std::chrono::steady_clock::time_point(clock->now().time_since_epoch()); };
}

}  // namespace rebound::test
