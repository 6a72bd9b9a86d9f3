// FrontDoor: the two calls of JobQueue that rebound::Server makes without an Asio completion, so
// that its answers need no hop through the queue's io executor: a submission answered on the
// calling thread when the store answers at once, and an invocation answered on the inference
// worker that ran it. Internal to rebound (src/): users call JobQueue::submit and async_invoke.
#pragma once

#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "rebound/job.hpp"
#include "rebound/job_queue_status.hpp"
#include "rebound/model.hpp"
#include "work_item.hpp"

namespace rebound {
class JobQueue;

namespace detail {

struct FrontDoor {
  /// Called exactly once with what the submission came to.
  using SubmitAnswer = std::function<void(const Submitted&)>;

  /// JobQueue::submit for a job whose rules the caller has checked already, with the same
  /// functions and the queue's own guard (common/submission.hpp's parser does): they are not
  /// checked twice. `answer` runs on this thread before the call returns when the store answers
  /// at once (memory), else on the queue's io executor once the store's own thread has the job
  /// (SQLite after the group commit its job went in, PostgreSQL after its commit, Redis once
  /// Redis has it), or on the store pump's thread for a refusal for room whose id it looked up
  /// (a store whose reads wait).
  static void submit(JobQueue& queue, Job job, SubmitAnswer answer);

  /// JobQueue::submit_many for jobs whose rules the caller has checked already.
  static std::vector<Submitted> submit_many(JobQueue& queue, std::vector<Job> jobs);

  /// Runs `input` through the model as `async_invoke` does; `on_result` is called exactly once
  /// (InvokeAnswer: on the worker that ran it, or at shutdown) when the answer is success, and
  /// never otherwise. `tenant`: whose invocation it is (its rate, its share, its turn); `model`:
  /// the version it runs on (empty fields: the defaults; refused when not served, with
  /// `reason` saying why).
  static Submitted invoke(JobQueue& queue, nlohmann::json input, InvokeAnswer on_result,
                          const std::string& tenant = {}, ModelRef model = {});

  /// The version an invocation of `model` runs on (its empty fields filled in as `invoke` does:
  /// a route's split picks in turn), to hand to `invoke` pinned; a refusal as `invoke`'s.
  static Submitted choose_model(JobQueue& queue, ModelRef& model, const std::string& tenant = {});
};

}  // namespace detail
}  // namespace rebound
