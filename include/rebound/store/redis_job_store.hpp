// RedisJobStore: the JobStore that several servers share (Redis 5 or later, tested with 7.0;
// through hiredis).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rebound/store/job_store.hpp"

namespace rebound {

struct RedisJobStoreOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;  ///< the logical database (SELECT)
  /// For Redis 6 ACLs (AUTH username password); empty: the default user.
  std::string username;
  /// Empty: no AUTH. rebound-server takes it from $REBOUND_REDIS_PASSWORD, never from its command
  /// line (which every user of the machine can read).
  std::string password;
  /// Every key starts with it (1 to 64 letters, digits, '_', '.', '-' and braces): servers that
  /// share a prefix share one queue; others on the same Redis are apart. The default is a Redis
  /// Cluster hash tag, so that all of a queue's keys hash to one slot and each script runs on the
  /// node that owns it; on a cluster a prefix must hold one (`{name}`, refused otherwise), and
  /// several prefixes spread queues over the nodes. (Before 0.1's release the default was
  /// "rebound": pass `?prefix=rebound` to keep a queue stored under it.)
  std::string key_prefix = "{rebound}";
  /// Connections opened at most, shared by the threads that call the store.
  std::size_t connections = 16;
  std::chrono::milliseconds connect_timeout{2000};
  /// The longest a command may take before the connection is given up (a hung Redis does not
  /// hang the server's threads).
  std::chrono::milliseconds command_timeout{5000};
  /// `failure()` (so `/ping`) reports the store failing once calls have waited this long with no
  /// answer from Redis (frozen, overloaded, or cut off by a firewall), before any command times
  /// out. The probe that tells when it works again takes at most 1.6 s, and one that fails holds
  /// off the next for the reconnect backoff (the calls meanwhile answer from it).
  std::chrono::milliseconds unanswered_limit{1000};
  /// While Redis cannot be reached, new connections are tried after this delay, doubling up to
  /// `reconnect_max`; every call in between fails at once (StoreUnavailable).
  std::chrono::milliseconds reconnect_min{100};
  std::chrono::milliseconds reconnect_max{5000};
  /// Finished jobs expire this long after they finished (a Redis key expiry). 0: kept forever.
  std::chrono::seconds retention{std::chrono::hours(24)};
  /// Batches the writes on a job's way (put, mark_running, finish_job, record_attempt and
  /// renew_all) of every calling thread: one connection thread of the store's own sends what has
  /// gathered while its last round trip was out as one script call, pipelined (at most 256 calls
  /// or 1 MiB in one). Redis then spends a fraction of a round trip per job, and the asynchronous
  /// forms (async_put, async_finish_job, async_record_attempt) hold no caller's thread: the
  /// batch thread answers them. An idle store sends at once. mark_running returns without
  /// waiting; a call of the same thread made after it sees it. false: every call is its own round
  /// trip on the caller's thread (a JobQueue's io thread and workers wait for them), and no
  /// thread is started.
  bool batch_writes = true;
  /// Redis replicates asynchronously: a master that crashes may take its last writes with it,
  /// acknowledged or not. With `replicas` = N > 0 every script call is followed by `WAIT N
  /// replica_timeout`, and a call that reached fewer replicas in that time throws
  /// StoreUnavailable (its write stands on the master; a put retried with the same id is
  /// idempotent): what was acknowledged survives the crash of a master whose replica takes over.
  /// 0: acknowledged once the master has it (a planned failover loses nothing; a crash may lose
  /// the last writes).
  std::size_t replicas = 0;
  /// How long a call waits for its replicas; shorter than `command_timeout`.
  std::chrono::milliseconds replica_timeout{1000};
};

/// Reads `redis://[username@]host[:port][/db][?prefix=name][&replicas=N]` (an IPv6 host in
/// brackets; `prefix`: RedisJobStoreOptions::key_prefix; `replicas`:
/// RedisJobStoreOptions::replicas, 0 to 16) into `options`, keeping its other fields. On a Redis
/// Cluster the host is any node. Throws rebound::Error for anything else, and for a password in the
/// URI (give it in RedisJobStoreOptions::password).
RedisJobStoreOptions parse_redis_uri(std::string_view uri, RedisJobStoreOptions options = {});

/// A JobStore in Redis: every server on the same Redis (and key prefix) shares one queue.
///
/// Layout (every key under `key_prefix`): a hash per job (`<prefix>:job:<id>`: the request, its
/// status and outcome, its callback state, and the lease on it: holder and until); sorted sets of
/// due times, one for jobs (`<prefix>:jobs:due`) and one for callbacks
/// (`<prefix>:callbacks:due`): a claim takes the members whose time has come and moves them to the
/// end of its lease, so a crashed server's work is due again when its lease runs out; the given-up
/// callbacks (`<prefix>:callbacks:failed`) and the jobs not finished (`<prefix>:unfinished`), by
/// creation time. Every call is one Lua script, atomic in Redis: the same id put on two servers at
/// once is one job, two redeliveries at once are one, and a late acknowledgement is refused.
/// Finished jobs expire after `retention`. A put of a taken id is told a duplicate or a conflict
/// inside Redis when the inputs' texts match or the request differs elsewhere, so its answer
/// stays small whatever the stored input's size. Inputs whose texts differ (1 and 1.0) are
/// compared as JSON here, with the stored one sent back only when it is at most twice as long as
/// the new one plus 64 bytes (beyond that: a conflict).
///
/// `record_attempt` of a callback that ended (delivered or failed) keeps the retry schedule it had
/// while pending (`CallbackInfo::next_attempt_at`, `delivery_attempts`, `delivery_started_at`,
/// `previous_delay`): only a pending callback's schedule is used, and a redelivery starts it again.
/// Its state, attempts and last error are written as given.
///
/// Durability follows Redis's persistence: with `appendonly yes` and `appendfsync always` an
/// accepted job survives a crash of Redis; with `everysec` up to a second of writes can be lost
/// (docs/operations.md). Redis must not evict keys: a `maxmemory-policy` of `allkeys-*` is refused
/// at construction; at `maxmemory` with `noeviction`, `put` answers `full`.
///
/// Leases compare the times the servers pass in (their clocks): keep the servers' clocks in step
/// (NTP) to well within a lease.
///
/// Failures: a connection error or timeout (or LOADING, READONLY: the connection is dropped and a
/// new one made, which follows a failover that moves a DNS name) throws StoreUnavailable and sets
/// `failure()` until a command works again; failed connects are retried with a backoff. The
/// process must ignore SIGPIPE (`signal(SIGPIPE, SIG_IGN)`, as rebound-server does): hiredis
/// writes to sockets that Redis may have closed. Lists and claims take at most 100,000 jobs per
/// call (one script blocks Redis for every server).
///
/// Threads: with `batch_writes` (the default) the store starts one connection thread for the
/// batched writes, joined by its destructor once what is queued is sent; every other call runs
/// on the caller's thread over a pooled connection. Thread-safety: every method is thread-safe.
class RedisJobStore final : public JobStore {
 public:
  /// Connects and loads the scripts. Throws rebound::Error when Redis cannot be used (unreachable,
  /// authentication refused, older than 5, an evicting memory policy).
  explicit RedisJobStore(RedisJobStoreOptions options = {});
  ~RedisJobStore() override;
  RedisJobStore(const RedisJobStore&) = delete;
  RedisJobStore& operator=(const RedisJobStore&) = delete;

  using JobStore::put;
  PutOutcome put(const Job& job, const std::optional<Lease>& claim) override;
  /// With `batch_writes`, queued for the batch thread, which answers it once Redis has (no
  /// caller's thread waits for the round trip); else put on the caller's thread.
  void async_put(const Job& job, const std::optional<Lease>& claim, PutDone done) override;
  std::vector<PutOutcome> put_many(const std::vector<PutRequest>& requests) override;
  std::optional<JobRecord> get(const std::string& id) const override;
  /// The reads pipelined on one connection: one round trip for every 256 ids.
  std::vector<std::optional<JobRecord>> get_many(
      const std::vector<std::string>& ids) const override;
  std::vector<JobRecord> claim_jobs(std::size_t max, const Lease& lease, TimePoint now) override;
  std::vector<JobRecord> claim_jobs_except(std::size_t max, const Lease& lease, TimePoint now,
                                           const std::vector<ModelRef>& skip) override;
  bool renew(const std::string& id, const Lease& lease, TimePoint now) override;
  std::vector<bool> renew_all(const std::vector<std::pair<std::string, Lease>>& leases,
                              TimePoint now) override;
  void mark_running(const std::string& id, TimePoint now) override;
  std::optional<std::size_t> queue_position(const std::string& id) const override;
  bool finish_job(const std::string& id, const std::string& holder, const JobOutcome& outcome,
                  const std::optional<Lease>& deliver, TimePoint now) override;
  std::vector<JobRecord> claim_callbacks(std::size_t max, const Lease& lease,
                                         TimePoint now) override;
  /// With `want_record`, the script answers the job's hash as it wrote it (no second read).
  void async_finish_job(const std::string& id, const std::string& holder, const JobOutcome& outcome,
                        const std::optional<Lease>& deliver, TimePoint now, bool want_record,
                        FinishDone done) override;
  /// `store` when writes are batched (the batch thread answers puts and acknowledgements);
  /// `caller` otherwise.
  AnswerThread answer_thread(AsyncCall call, bool record_asked) const noexcept override;
  void async_record_attempt(const std::string& id, const std::string& holder,
                            const CallbackInfo& after, TimePoint now,
                            const std::optional<CallbackAttempt>& attempt, WriteDone done) override;
  using JobStore::record_attempt;
  bool record_attempt(const std::string& id, const std::string& holder, const CallbackInfo& after,
                      TimePoint now, const std::optional<CallbackAttempt>& attempt) override;
  RedeliverOutcome redeliver(const std::string& id, const Lease& claim, TimePoint now) override;
  CancelOutcome cancel(const std::string& id, const JobOutcome& outcome, TimePoint now) override;
  void complete(const std::string& id, const JobOutcome& outcome) override;
  void update_callback(const std::string& id, const CallbackInfo& callback) override;
  std::vector<JobRecord> list_failed_callbacks(std::size_t limit) const override;
  std::vector<JobRecord> list_failed_callbacks_with_prefix(const std::string& id_prefix,
                                                           std::size_t limit) const override;
  JobPage failed_callbacks_page(const std::string& id_prefix,
                                const std::optional<ListCursor>& after,
                                std::size_t limit) const override;
  std::optional<QueueStats> queue_stats() const override;
  JobPage list_jobs(const JobFilter& filter, const std::optional<ListCursor>& after,
                    std::size_t limit) const override;
  void report_server(const std::string& id, std::size_t leases, TimePoint now) override;
  std::vector<ServerSeen> servers(TimePoint now) const override;
  /// Pauses are kept in the store (a set of at most 10,000 origins): every server holds them.
  bool set_origin_paused(const std::string& origin, bool paused) override;
  std::optional<std::vector<std::string>> paused_origins() const override;
  std::optional<std::uint64_t> put_model_config(const std::string& name, const std::string& config,
                                                std::uint64_t if_generation) override;
  std::optional<std::vector<ModelConfig>> model_configs() const override;
  /// Looks at no more than 2,000 jobs waiting since `since`.
  std::vector<ModelRef> waiting_versions(const std::vector<ModelRef>& versions,
                                         TimePoint since) const override;
  std::vector<JobRecord> list_unfinished(std::size_t limit) const override;
  std::optional<std::string> failure() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rebound
