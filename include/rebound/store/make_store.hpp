// make_store: a JobStore from a URI ("memory", "sqlite:PATH", "redis://..."), as rebound-server's
// --store takes it.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "rebound/detail/redact.hpp"
#include "rebound/error.hpp"
#include "rebound/store/job_store.hpp"
#include "rebound/store/memory_job_store.hpp"
// Each store is there when the program links its library: rebound::sqlite (in rebound::rebound)
// defines REBOUND_HAS_SQLITE, rebound::redis REBOUND_HAS_REDIS, rebound::postgres
// REBOUND_HAS_POSTGRES.
#if defined(REBOUND_HAS_SQLITE)
#include "rebound/store/sqlite_job_store.hpp"
#endif
#if defined(REBOUND_HAS_REDIS)
#include "rebound/store/redis_job_store.hpp"
#endif
#if defined(REBOUND_HAS_POSTGRES)
#include "rebound/store/postgres_job_store.hpp"
#endif

namespace rebound {

/// What `make_store` passes on to the store it makes; what a store does not use is ignored.
struct StoreSettings {
  /// SQLite and Redis: how long a finished job is kept for polling (0: forever).
  std::chrono::seconds retention{std::chrono::hours(24)};
  /// The memory store's budget in bytes (MemoryJobStoreOptions::max_bytes).
  std::size_t memory_max_bytes = std::size_t{1} << 30;
  /// Redis: the password (AUTH); never put it in the URI, which command lines and logs show.
  std::optional<std::string> redis_password;
};

// Which stores make_store knows depends on the libraries a translation unit is built with: each
// combination is a function of its own (an inline namespace), so that two parts of one program
// built with different rebound targets never share one definition.
#if defined(REBOUND_HAS_SQLITE)
#define REBOUND_DETAIL_STORES_S _sqlite
#else
#define REBOUND_DETAIL_STORES_S
#endif
#if defined(REBOUND_HAS_REDIS)
#define REBOUND_DETAIL_STORES_R _redis
#else
#define REBOUND_DETAIL_STORES_R
#endif
#if defined(REBOUND_HAS_POSTGRES)
#define REBOUND_DETAIL_STORES_P _postgres
#else
#define REBOUND_DETAIL_STORES_P
#endif
#define REBOUND_DETAIL_CAT2(a, b, c, d) a##b##c##d
#define REBOUND_DETAIL_CAT(a, b, c, d) REBOUND_DETAIL_CAT2(a, b, c, d)
#define REBOUND_DETAIL_STORES                                                         \
  REBOUND_DETAIL_CAT(stores_memory, REBOUND_DETAIL_STORES_S, REBOUND_DETAIL_STORES_R, \
                     REBOUND_DETAIL_STORES_P)
/// `uri` as a log line or an error may show it: a password in it ("user:secret@") replaced by
/// "***". rebound-server prints its store this way.
inline std::string redacted_store_uri(std::string_view uri) {
  return detail::redacted_uri(uri);
}

inline namespace REBOUND_DETAIL_STORES {

/// Makes a JobStore from a URI:
/// - `memory`: a MemoryJobStore (jobs are lost with the process);
/// - `sqlite:PATH`: a SqliteJobStore in that file (needs rebound::sqlite);
/// - `redis://[user@]host[:port][/db][?prefix=name][&replicas=N]`: a RedisJobStore that several
///   servers share (needs rebound::redis);
/// - `postgresql://[user@]host[:port]/db[?schema=name]` (or `postgres://`): a PostgresJobStore
///   that several servers share (needs rebound::postgres; the password from $PGPASSWORD or
///   ~/.pgpass, as libpq reads them).
/// Throws rebound::Error with a message that names the URI for anything else, for a store this
/// program was not linked with, and when the store cannot be opened.
///
/// Example:
///   rebound::JobQueue queue(std::make_unique<MyModel>(), rebound::make_store("sqlite:jobs.db"));
///
/// Thread-safety: any thread; each call makes a new store.
inline std::unique_ptr<JobStore> make_store(std::string_view uri,
                                            const StoreSettings& settings = {}) {
  if (uri == "memory") {
    MemoryJobStoreOptions options;
    options.max_bytes = settings.memory_max_bytes;
    return std::make_unique<MemoryJobStore>(options);
  }
  constexpr std::string_view sqlite = "sqlite:";
  if (uri.substr(0, sqlite.size()) == sqlite) {
    if (uri.size() == sqlite.size()) {
      throw Error("store '" + detail::redacted_uri(uri) +
                  "': sqlite needs a path, e.g. sqlite:jobs.db");
    }
#if defined(REBOUND_HAS_SQLITE)
    SqliteJobStoreOptions options;
    options.retention = settings.retention;
    return std::make_unique<SqliteJobStore>(std::string(uri.substr(sqlite.size())), options);
#else
    throw Error("store '" + detail::redacted_uri(uri) +
                "': this program has no SQLite support (link rebound::sqlite)");
#endif
  }
  if (uri.substr(0, 8) == "redis://") {
#if defined(REBOUND_HAS_REDIS)
    RedisJobStoreOptions options = parse_redis_uri(uri);
    options.retention = settings.retention;
    if (settings.redis_password) options.password = *settings.redis_password;
    return std::make_unique<RedisJobStore>(options);
#else
    throw Error("store '" + detail::redacted_uri(uri) +
                "': this program has no Redis support (link rebound::redis)");
#endif
  }
  if (uri.substr(0, 13) == "postgresql://" || uri.substr(0, 11) == "postgres://") {
#if defined(REBOUND_HAS_POSTGRES)
    PostgresJobStoreOptions options = parse_postgres_uri(uri);
    options.retention = settings.retention;
    return std::make_unique<PostgresJobStore>(options);
#else
    throw Error("store '" + detail::redacted_uri(uri) +
                "': this program has no PostgreSQL support (link rebound::postgres)");
#endif
  }
  throw Error("unsupported store '" + detail::redacted_uri(uri) +
              "': use memory, sqlite:<path>, redis://host[:port][/db][?prefix=name][&replicas=N]"
              " or postgresql://[user@]host[:port]/db[?schema=name]");
}

}  // namespace REBOUND_DETAIL_STORES

}  // namespace rebound
