// What the queue holds: a job to run under a lease, or an invocation waiting for its result.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <boost/system/error_code.hpp>

#include "claim.hpp"
#include "rebound/detail/json.hpp"
#include "rebound/job.hpp"
#include "rebound/model.hpp"

namespace rebound::detail {

struct VersionStats;

/// How an invocation is answered, exactly once: success with the model's Prediction (failed or
/// not, whatever its code), or a refusal of the queue's (errc::shutting_down: taken off the queue
/// at shutdown) with a failed Prediction that says so.
using InvokeAnswer = std::function<void(boost::system::error_code, const Prediction&)>;

/// Move-only: its claim (the slot, and a job's lease) goes with it and is given back when the
/// item is done with, whatever path it takes.
struct WorkItem {
  Job job;
  InvokeAnswer reply;  // set for an invocation: no store, no callback
  Claim claim;         // the slot; for a job also the lease it is run under
  std::chrono::steady_clock::time_point enqueued = std::chrono::steady_clock::now();
  // The version it runs on, held from its acceptance (a submission, an invocation) so that an
  // unload waits for it; null for a job claimed from the store (the runner looks it up).
  std::shared_ptr<Model> model;
  // Set on a batch's first item as it leaves the work queue: the version its batch was counted
  // against (VersionStats::taken), counted down by the same pointer once the batch ran.
  VersionStats* taken_from = nullptr;
  // Sent from the version it was pinned to, unloaded with QueuedJobs::reroute, to the one its
  // model's route chose: its finish records that version.
  bool rerouted = false;
};

/// What a job holds in memory while it waits or runs: its input's tree, its strings, the item.
inline std::size_t work_bytes(const Job& job) {
  return sizeof(WorkItem) + json_footprint(job.input) + job.id.capacity() + job.tenant.capacity() +
         job.callback_url.capacity() + job.traceparent.capacity();
}

}  // namespace rebound::detail
