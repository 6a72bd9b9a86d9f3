// Probe: what tests ask of a JobQueue that users never need: to wait until it is quiet, so that
// "nothing happened" is asserted once nothing can happen any more, not after a sleep. Internal to
// rebound (src/); tests reach it through tests/support/quiesce.hpp.
#pragma once

#include <chrono>

namespace rebound {
class JobQueue;

namespace detail {

struct Probe {
  /// Waits up to `timeout` until `queue` is quiet: a pump pass that began after the call has
  /// ended (whatever was due then is claimed), no capacity slot is taken (no job waits or runs,
  /// no callback attempt is under way), the sender has nothing in flight (`started` callbacks
  /// included), and every handler posted to its io executor before that has run; twice over, for
  /// what one round set going. False when it did not get quiet in time
  /// (a held model, a receiver that does not answer).
  static bool quiesce(JobQueue& queue, std::chrono::milliseconds timeout);

  /// Waits up to `timeout` for a whole pass of the queue's store pump that began after the call
  /// (what a poll interval would bring: claims, the poll hook): for a test that asserts what a
  /// pass did not do while work is held. False when none ended in time.
  static bool pump_pass(JobQueue& queue, std::chrono::milliseconds timeout);
};

}  // namespace detail
}  // namespace rebound
