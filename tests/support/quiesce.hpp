// quiesce(queue): waits until a JobQueue is quiet (detail::Probe: a fresh pump pass, no slot
// taken, its io executor drained), so that a test asserts that something did not happen once it
// no longer can, instead of after a sleep.
#pragma once

#include <chrono>

#include "pipeline/probe.hpp"
#include "rebound/job_queue.hpp"

namespace rebound::test {

inline bool quiesce(JobQueue& queue,
                    std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  return detail::Probe::quiesce(queue, timeout);
}

/// One whole pass of the queue's store pump, begun after the call (detail::Probe::pump_pass).
inline bool pump_pass(JobQueue& queue,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  return detail::Probe::pump_pass(queue, timeout);
}

}  // namespace rebound::test
