// For the PostgreSQL store's tests only: not part of the library's interface.
#pragma once

#include <functional>

namespace rebound::detail {

// Called by every PostgresJobStore's writer between reading the rows of a transaction and
// writing them (an empty function: none), so that a test can change a row in that window and see
// the writer go again on the row as changed.
void set_postgres_writer_read_hook(std::function<void()> hook);

}  // namespace rebound::detail
