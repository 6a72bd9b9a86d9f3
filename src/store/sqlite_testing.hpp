// For the SQLite store's tests only: not part of the library's interface.
#pragma once

#include <functional>

namespace rebound::detail {

// Called after each batch of a pruning (SqliteJobStore::prune, or its writer's own), with no lock
// of the store held (an empty function: none), so that a test can see a write committed between
// two batches; `went_on`: the batch ran because the one before was full, before the prune
// interval came round again (not the first of prune(), nor one the interval started). On the
// writer's thread the hook must not wait for a write of the store (the writer is the thread that
// would commit it).
void set_sqlite_prune_batch_hook(std::function<void(bool went_on)> hook);

// Called after each write is queued for the writer (a put, a claim, a finish...), on the caller's
// thread (an empty function: none), so that a test can tell when the calls it made are queued
// behind a writer it holds. The caller may hold the store's lease lock: the hook must not call the
// store.
void set_sqlite_queued_hook(std::function<void()> hook);

}  // namespace rebound::detail
