// The intake: how a submission comes in (src/pipeline/intake.cpp). Internal to rebound.
#pragma once

#include <optional>
#include <vector>

#include <boost/system/error_code.hpp>
#include <nlohmann/json.hpp>

#include "front_door.hpp"
#include "pipeline.hpp"
#include "rebound/detail/completion.hpp"
#include "rebound/job.hpp"
#include "rebound/job_queue_status.hpp"
#include "work_item.hpp"
#include "work_queue.hpp"

namespace rebound::detail {

/// A refusal, and a job taken (a `duplicate` of the same request, or new).
inline Submitted refused(boost::system::error_code why) {
  Submitted s;
  s.error = why;
  return s;
}
inline Submitted taken(bool duplicate = false) {
  Submitted s;
  s.duplicate = duplicate;
  return s;
}

/// The model's verdict on an input; one that throws refuses it too.
std::optional<ErrorInfo> validate(const Model& model, const nlohmann::json& input);

/// The version `ref` names, its empty fields filled in (the default model; the version its route
/// picks for `tenant` and `id`, an invocation's in turn): `ref` names the version chosen, whose
/// Model is returned (held for the caller). Null when the queue does not serve it now, with
/// `refusal` saying why (model_not_found, version_unavailable; `reason` and `field` set).
std::shared_ptr<Model> choose_model(Pipeline& core, ModelRef& ref, std::string_view tenant,
                                    std::string_view id, Submitted& refusal);

/// One submission: checked (the job's rules, a transport for its callback, the model's
/// validation), admitted, stored with this queue's claim (or parked in the store beyond the
/// prefetch), and queued, answered through `done` once the store's asynchronous put answers
/// (JobStore::async_put): on this thread when the store answers at once, else on the queue's
/// executor (no thread waits for the store); a refusal for room looked up in a store whose reads
/// wait, on the pump's thread (Pipeline::read_on_pump). The admission entry and the job's slot
/// travel with the put. `rules_checked`: the caller has checked the job's rules (check_job)
/// already, with the queue's guard. `waiter` (async_submit): registered for the job's end before it
/// can run, and completed with shutting_down when the queue closes first; the caller completes it
/// on a refusal
/// (`done` is told).
void submit_async_to(Pipeline& core, WorkQueue<WorkItem>& queue, Job job,
                     FrontDoor::SubmitAnswer done, bool rules_checked = false,
                     std::shared_ptr<Completion<JobRecord>> waiter = nullptr);

/// Many submissions with one store write (JobStore::put_many), each answered as submit_async_to
/// would answer it alone (JobQueue::submit_many says how repeated ids are told).
std::vector<Submitted> submit_all_to(Pipeline& core, WorkQueue<WorkItem>& queue,
                                     std::vector<Job>& jobs, bool rules_checked = false);

}  // namespace rebound::detail
