// For the SQLite store's tests only: not part of the library's interface.
#pragma once

#include <functional>

namespace rebound::detail {

// Called after each batch of a pruning (SqliteJobStore::prune, or its writer's own), with no lock
// of the store held (an empty function: none), so that a test can see a write committed between
// two batches.
void set_sqlite_prune_batch_hook(std::function<void()> hook);

}  // namespace rebound::detail
