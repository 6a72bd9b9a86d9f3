// What the queue holds: a job to run under a lease, or an invocation waiting for its result.
#pragma once

#include <chrono>
#include <string>

#include "claim.hpp"
#include "rebound/job.hpp"
#include "rebound/job_queue_status.hpp"

namespace rebound::detail {

/// Move-only: its claim (the slot, and a job's lease) goes with it and is given back when the
/// item is done with, whatever path it takes.
struct WorkItem {
  Job job;
  InvocationHandler reply;  // set for an invocation: no store, no callback
  Claim claim;              // the slot; for a job also the lease it is run under
  std::chrono::steady_clock::time_point enqueued = std::chrono::steady_clock::now();
};

}  // namespace rebound::detail
