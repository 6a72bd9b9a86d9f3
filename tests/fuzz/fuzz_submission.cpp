// libFuzzer target: request validation (the body of POST /v1/inferences, and of
// POST /v1/inferences:batch) never crashes, and its answer is always either a valid job or a
// 400/413/422 error with a code and a message, for the body and for each job of a batch.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/submission.hpp"

namespace {

void check_error(const rebound::detail::ApiError& e) {
  if (e.status != 400 && e.status != 413 && e.status != 422) std::abort();
  if (e.code.empty() || e.message.empty()) std::abort();
  (void)e.to_json().dump();
}

void check(const rebound::detail::SubmissionParse& r) {
  if (r.job.has_value() == r.error.has_value()) std::abort();
  if (r.error) return check_error(*r.error);
  if (!rebound::detail::is_valid_job_id(r.job->id)) std::abort();
  if (!r.job->callback_url.empty() &&
      !rebound::detail::parse_callback_url(r.job->callback_url).url) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  static const rebound::AddressGuard strict;
  static const rebound::AddressGuard permissive(true, {"*.corp.example", "10.0.0.0/8"});
  for (const auto* guard : {&strict, &permissive}) {
    check(rebound::detail::parse_submission(body, *guard));
    const auto batch = rebound::detail::parse_batch_submission(body, *guard);
    if (batch.error) {
      if (!batch.jobs.empty()) std::abort();
      check_error(*batch.error);
    } else {
      if (batch.jobs.empty() || batch.jobs.size() > rebound::detail::max_batch_jobs) std::abort();
      for (const auto& job : batch.jobs)
        check(job);
    }
  }
  return 0;
}
