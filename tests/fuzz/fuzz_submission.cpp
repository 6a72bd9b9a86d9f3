// libFuzzer target: request validation (the body of POST /v1/inferences) never crashes, and its
// answer is always either a valid job or a 400/422 error with a code and a message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "rebound/detail/submission.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  static const rebound::AddressGuard strict;
  static const rebound::AddressGuard permissive(true, {"*.corp.example", "10.0.0.0/8"});
  for (const auto* guard : {&strict, &permissive}) {
    const auto r = rebound::detail::parse_submission(body, *guard);
    if (r.job.has_value() == r.error.has_value()) std::abort();
    if (r.error) {
      if (r.error->status != 400 && r.error->status != 422) std::abort();
      if (r.error->code.empty() || r.error->message.empty()) std::abort();
      (void)r.error->to_json().dump();
    } else {
      if (!rebound::detail::is_valid_job_id(r.job->id)) std::abort();
      if (!r.job->callback_url.empty() &&
          !rebound::detail::parse_callback_url(r.job->callback_url).url) {
        std::abort();
      }
    }
  }
  return 0;
}
