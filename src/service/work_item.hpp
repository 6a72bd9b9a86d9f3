// What the queue holds: a job to run under a lease, or an invocation waiting for its result.
#pragma once

#include <chrono>
#include <string>

#include "rebound/job.hpp"
#include "rebound/job_queue_status.hpp"

namespace rebound::detail {

struct WorkItem {
  Job job;
  InvocationHandler reply;  // set for an invocation: no store, no callback
  std::string holder;       // the lease a job is run under
  std::chrono::steady_clock::time_point enqueued = std::chrono::steady_clock::now();
};

}  // namespace rebound::detail
