// Kept for one release: `Service` is now `JobQueue` (rebound/job_queue.hpp), and `ServiceOptions`
// is `JobQueueOptions`. docs/api.md has the migration note.
#pragma once

#include "rebound/job_queue.hpp"

namespace rebound {

using Service [[deprecated("rebound::Service is rebound::JobQueue now")]] = JobQueue;
using ServiceOptions [[deprecated("rebound::ServiceOptions is rebound::JobQueueOptions now")]] =
    JobQueueOptions;

}  // namespace rebound
