// PostgresJobStore: the JobStore that several servers share on a PostgreSQL database (PostgreSQL
// 12 or later, tested with 15; through libpq).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rebound/store/job_store.hpp"

namespace rebound {

struct PostgresJobStoreOptions {
  /// What libpq connects with: a `postgresql://` URI or `key=value` words
  /// (https://www.postgresql.org/docs/current/libpq-connect.html). A password is best left out of
  /// it (command lines and logs show it): libpq reads $PGPASSWORD and ~/.pgpass by itself.
  /// `connect_timeout=2` and `client_encoding=UTF8` are added when it names none.
  std::string conninfo = "postgresql://localhost/postgres";
  /// The schema that holds the store's tables, created when missing (letters, digits and '_', 1
  /// to 63, starting with a letter or '_'). Servers that share a schema share one queue; others on
  /// the same database are apart. Table names are written out with it in every statement: the
  /// store sets no `search_path` (no session state, so a pooler in transaction mode is fine).
  std::string schema = "rebound";
  /// Connections opened at most for the calling threads (at least 1); each writer and the pruner
  /// have one more.
  std::size_t connections = 4;
  /// The longest any statement may take: kept by the client (a statement unanswered this long, in
  /// sending or in waiting, has its connection closed and the call fails with StoreUnavailable, so
  /// a hung database or a cut connection never holds a server's threads longer) and sent with
  /// every transaction of the writer, the queue stats and the migration (`SET LOCAL
  /// statement_timeout` and `idle_in_transaction_session_timeout`: the server ends the transaction
  /// of a client that went away, releasing its rows). Claims and reads are single statements
  /// bounded by the client alone: one abandoned past the deadline may still complete on the
  /// server (a claim's leases then run out unused). A commit whose answer is lost this way may
  /// have been written: its calls fail, and retried they answer as for work already done (a put
  /// `duplicate`, a finish false).
  std::chrono::milliseconds statement_timeout{5000};
  /// Finished jobs (final, callback delivered, given up or not wanted) are deleted this long after
  /// they finished, in batches of 1,000 rows, each its own short transaction. 0 keeps them.
  std::chrono::seconds retention{std::chrono::hours(24)};
  /// How often the pruning runs.
  std::chrono::seconds prune_interval{std::chrono::minutes(1)};
  /// The writes of every calling thread (put, mark_running, finish_job, record_attempt, renew,
  /// cancel, redeliver) gather while a writer's transaction is out and go in one transaction of
  /// at most this many (at least 1), and about 16 MiB of new jobs (group commit: one WAL flush for
  /// all of them).
  std::size_t max_batch = 512;
  /// Writer threads, each with its connection (1 to 64; `?writers=N` in the URI). One writer
  /// takes the writes queued into its transaction; a second transaction starts beside one under
  /// way only when a quarter of max_batch writes are waiting (a transaction costs PostgreSQL
  /// about a millisecond of CPU whatever it holds, so small ones are not split further), and
  /// never with a write of a job whose earlier writes are in a transaction not yet committed: a
  /// job's writes are made in the order they came, and two writers of one store never touch the
  /// same row at once. A PostgreSQL backend runs one transaction's statements on one core: under
  /// a load of many writes at once (batch submission) the second writer's statements run while
  /// the first's transaction waits for its flush or its answers, and when one writer's
  /// transaction waits for a row another server holds, the writes queued behind it go into the
  /// other's once a quarter of max_batch wait (fewer wait for it, up to the statement timeout).
  /// docs/benchmarks.md ("Two writers") measures 1 against 2.
  std::size_t writers = 2;
  /// Prepares each statement with parameters once a connection (a named, server-side prepared
  /// statement) and runs it prepared, so that the server parses and analyses the store's
  /// statements once a session instead of once a call (`?prepared=1` in the URI). Each call is
  /// still planned for its values (the connection sets `plan_cache_mode = force_custom_plan`: a
  /// generic plan, which knows neither a claim's limit nor a batch's size, cost more than it
  /// saved). docs/benchmarks.md measures it: about a quarter of the Postgres CPU a job polled,
  /// level with callbacks. Off by default, and for a direct connection or a session-mode pooler
  /// only: prepared statements and that setting are session state, which a pooler in transaction
  /// mode does not keep (PgBouncer answers "prepared statement does not exist", and the store
  /// reconnects and fails the call; PgBouncer 1.21's `max_prepared_statements` would keep the
  /// statements but not the setting).
  bool prepared_statements = false;
  /// Wake-ups across servers (`?notify=1` in the URI): a transaction of the writer that leaves
  /// work any server may claim now (a job put unclaimed because this server had no room, a lease
  /// handed back at shutdown, a callback due) sends one `NOTIFY` with its commit (from the
  /// application, never a trigger: one a transaction of many jobs, and none for the jobs this
  /// server runs itself), and the store listens on a connection of its own (`LISTEN`), so that
  /// the JobQueues of the other servers claim that work at once instead of at their next poll
  /// (watch_work). Without it they find it within JobQueueOptions::poll_interval (1 s). Off by
  /// default, and for a direct connection or a pooler in session mode only: `LISTEN` is session
  /// state, and behind a pooler in transaction mode it is not supported (the listening session
  /// is whichever server connection the pooler lent). The channel is `rebound_` and the schema
  /// (cut to 63 bytes). A notifying commit holds, through its WAL flush, a lock that every
  /// notifying commit of the PostgreSQL cluster takes (they go one at a time): one a writer's
  /// transaction, not one a job. If PostgreSQL's notification queue is full (a listening
  /// session anywhere on the cluster that stopped reading), the writer commits the same writes
  /// again without the notification. The listening connection is one more than `connections`
  /// and the writer's and pruner's. The store's destructor may wait for the listener's call
  /// under way: a statement (at most the statement timeout) or, while the database cannot be
  /// reached, a connection attempt (libpq's connect_timeout, 2 s a host by default).
  bool notify = false;
};

/// Reads a `postgresql://` or `postgres://` URI (rebound-server's `--store`) into options: the
/// URI goes to libpq as is, but for `schema=NAME` (the store's schema), `prepared=1`
/// (PostgresJobStoreOptions::prepared_statements), `notify=1` (PostgresJobStoreOptions::notify)
/// and `writers=N` (PostgresJobStoreOptions::writers) among its query parameters, which are taken
/// out. Throws rebound::Error for any other scheme, a schema name that is not allowed, or a value
/// out of its range.
PostgresJobStoreOptions parse_postgres_uri(std::string_view uri);

/// A JobStore in a PostgreSQL database, shared by every server that names the same database and
/// schema: the store is the queue (DESIGN.md), each job one row of `<schema>.jobs`.
///
/// How it treats Postgres:
/// - Every job's state change is job_state.hpp's rule, applied in this process to the row read
///   inside a writer's transaction: the rules are the memory store's, not a copy in SQL. The
///   row is read without a lock and written only if it is still the version read (its `xmin`);
///   when another transaction changed one meanwhile (another server's cancel, a claim), the
///   transaction is rolled back and made again with its rows read `FOR UPDATE`, so no write is
///   decided on a row as it was (retried_transactions(); so is one PostgreSQL ends for a
///   deadlock or a serialization failure, up to twice).
///   The writes of all calling threads gather into one transaction (group commit; a second
///   writer's beside it when many wait, PostgresJobStoreOptions::writers): a `put`
///   returns (and `async_put` answers) once its transaction is committed, so a 202 means the job
///   is stored; with a synchronous standby it survives a failover.
/// - Claims are one statement each: the due rows, each tenant's by priority then due time, locked
///   `FOR UPDATE SKIP LOCKED`, so servers claiming at once never wait for each other's rows.
///   Tenants take turns (job_state::claim_turns) across every server: the tenant served last is
///   one row of the schema, written only when it changes.
/// - No session state: no `LISTEN`, no session advisory locks, no prepared statements, no `SET`
///   outside a transaction (unless asked: PostgresJobStoreOptions::prepared_statements, which
///   also sets the session's `plan_cache_mode`, and PostgresJobStoreOptions::notify, whose
///   listening connection holds a `LISTEN`). The store works behind PgBouncer in transaction
///   mode. The schema is created or migrated at start under a transaction's advisory lock, so
///   servers that start together agree.
/// - Finished jobs are deleted past the retention in small batches, by a thread and a connection
///   of the store's own: no long transaction of the store's holds back vacuum.
/// - Texts PostgreSQL cannot hold (a NUL, bytes that are not UTF-8: an error message a model
///   wrote, a receiver's answer) are stored with U+FFFD in their place.
///
/// Failures: a statement that fails or times out throws StoreUnavailable and `failure()` says why
/// until a statement succeeds again (the JobQueue then refuses submissions, `/ping` answers 503,
/// and writes for accepted jobs are tried again); a broken connection is opened again at its next
/// use. Leases are rows: a server that dies (`kill -9`) leaves its leases to run out, and the
/// other servers claim its jobs and callbacks then.
///
/// Thread-safety: every method is thread-safe.
class PostgresJobStore final : public JobStore {
 public:
  /// Connects and creates or migrates the schema. Throws rebound::Error when it cannot (the
  /// message names the database, never its password).
  explicit PostgresJobStore(PostgresJobStoreOptions options);
  ~PostgresJobStore() override;
  PostgresJobStore(const PostgresJobStore&) = delete;
  PostgresJobStore& operator=(const PostgresJobStore&) = delete;

  using JobStore::put;
  PutOutcome put(const Job& job, const std::optional<Lease>& claim) override;
  /// Answered from a writer thread once the job's transaction is committed.
  void async_put(const Job& job, const std::optional<Lease>& claim, PutDone done) override;
  std::vector<PutOutcome> put_many(const std::vector<PutRequest>& requests) override;
  std::optional<JobRecord> get(const std::string& id) const override;
  std::vector<std::optional<JobRecord>> get_many(
      const std::vector<std::string>& ids) const override;
  std::vector<JobRecord> claim_jobs(std::size_t max, const Lease& lease, TimePoint now) override;
  std::vector<JobRecord> claim_jobs_except(std::size_t max, const Lease& lease, TimePoint now,
                                           const std::vector<ModelRef>& skip) override;
  bool renew(const std::string& id, const Lease& lease, TimePoint now) override;
  std::vector<bool> renew_all(const std::vector<std::pair<std::string, Lease>>& leases,
                              TimePoint now) override;
  /// Returns without waiting: the mark goes with a writer's next transaction (a finish of the
  /// same job issued after it is applied after it; a read issued after it waits for it).
  void mark_running(const std::string& id, TimePoint now) override;
  bool finish_job(const std::string& id, const std::string& holder, const JobOutcome& outcome,
                  const std::optional<Lease>& deliver, TimePoint now) override;
  /// Answered from a writer thread once committed; with `want_record`, with the record its
  /// transaction wrote (the job's input read with the row it changes: no second read).
  void async_finish_job(const std::string& id, const std::string& holder, const JobOutcome& outcome,
                        const std::optional<Lease>& deliver, TimePoint now, bool want_record,
                        FinishDone done) override;
  /// `store` for every asynchronous call: the writer threads answer them.
  AnswerThread answer_thread(AsyncCall call, bool record_asked) const noexcept override;
  CancelOutcome cancel(const std::string& id, const JobOutcome& outcome, TimePoint now) override;
  std::vector<JobRecord> claim_callbacks(std::size_t max, const Lease& lease,
                                         TimePoint now) override;
  using JobStore::record_attempt;
  bool record_attempt(const std::string& id, const std::string& holder, const CallbackInfo& after,
                      TimePoint now, const std::optional<CallbackAttempt>& attempt) override;
  void async_record_attempt(const std::string& id, const std::string& holder,
                            const CallbackInfo& after, TimePoint now,
                            const std::optional<CallbackAttempt>& attempt, WriteDone done) override;
  RedeliverOutcome redeliver(const std::string& id, const Lease& claim, TimePoint now) override;
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
  std::vector<JobRecord> list_unfinished(std::size_t limit) const override;
  std::optional<std::size_t> queue_position(const std::string& id) const override;

  void report_server(const std::string& id, std::size_t leases, TimePoint now) override;
  std::vector<ServerSeen> servers(TimePoint now) const override;
  bool set_origin_paused(const std::string& origin, bool paused) override;
  std::optional<std::vector<std::string>> paused_origins() const override;
  std::optional<std::uint64_t> put_model_config(const std::string& name, const std::string& config,
                                                std::uint64_t if_generation) override;
  std::optional<std::vector<ModelConfig>> model_configs() const override;
  std::vector<ModelRef> waiting_versions(const std::vector<ModelRef>& versions,
                                         TimePoint since) const override;

  /// With PostgresJobStoreOptions::notify: `woken` is called on the store's listening thread
  /// when notifications of other stores came (of this one's own writes: never), at most every
  /// 100 ms (several coalesce into one call), and once after its connection was opened again
  /// (what came meanwhile is not known). Without: 0, never called.
  std::uint64_t watch_work(std::function<void()> woken) override;
  void unwatch_work(std::uint64_t watch) override;

  std::optional<std::string> failure() const override;

  /// Transactions the writers committed so far (each may hold many writes).
  std::size_t commits() const;
  /// The writers' transactions made again so far: a row one read was changed by another
  /// transaction before its update (another server, a claim), or PostgreSQL ended it for a
  /// deadlock with another server's writer. Nothing of such a try stays; its writes are made
  /// again with the rows read locked. A number that keeps growing says the servers contend for
  /// the same jobs.
  std::size_t retried_transactions() const;
  /// commits() and retried_transactions(), for `/metrics`: `rebound_store_transactions_total` and
  /// `rebound_store_transactions_retried_total`; and `rebound_store_rows_recalled_total`, the rows
  /// the writers took from their memory of what they last wrote instead of reading them (a
  /// finish after the put of the server that runs the job, a callback's end after the finish
  /// that leased it to this server).
  std::vector<StoreCounter> counters() const override;
  /// Deletes the jobs that finished more than the retention before `now`, in batches; returns
  /// how many. Also runs by itself every prune_interval.
  std::size_t prune(TimePoint now);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rebound
