// SqliteJobStore: the durable, embedded JobStore (one SQLite file in WAL mode, group commit).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "rebound/store/job_store.hpp"

namespace rebound {

struct SqliteJobStoreOptions {
  /// Finished jobs (final, callback delivered, given up or not wanted) are deleted this long after
  /// they finished. 0 keeps them forever.
  std::chrono::seconds retention{std::chrono::hours(24)};
  /// How often the pruning runs. It deletes at most 1,000 jobs a transaction, the writes queued
  /// meanwhile committed between two, until none is left past the retention: a retention lowered
  /// from days to hours, or a start on an old file, does not hold the submissions for the whole
  /// deletion.
  std::chrono::seconds prune_interval{std::chrono::minutes(1)};
  /// While the store fails (disk full, a write error), how often the writes that failed are tried
  /// again; with none waiting, a one-row probe write tells when the store works again.
  std::chrono::milliseconds retry_interval{250};
};

/// A JobStore in one SQLite file, for a single server process.
///
/// Durability: `put` returns only after the job is committed to disk (WAL, `synchronous=FULL`), so
/// a 202 means the job survives a crash. Writes from all threads are grouped into one transaction
/// by a writer thread that the store starts and joins (group commit; it also prunes): concurrent
/// submissions share one fsync. State changes (`mark_running`, `finish_job`, `record_attempt`,
/// `renew`, `complete`, `update_callback`) are queued to the same writer without waiting; every
/// read waits until the writes issued before it are committed, so reads see them. The writer
/// applies job_state.hpp's rules to each job's row (read once a transaction, written once, the
/// columns that changed); who holds a lease is kept in memory and checked when the call is made
/// (the file is this process's alone), so `finish_job`, `record_attempt` and `renew` answer at
/// once. Submissions go ahead of queued state changes, and a transaction with a submission in it
/// takes at most 512 of them: a burst of deliveries does not make a 202 wait for its whole backlog.
///
/// After a crash, `list_unfinished` returns every job that was accepted and not finished; the
/// JobQueue runs them again and resumes their callbacks (at least once).
///
/// Failures: a transaction that fails (disk full, an I/O error) fails the submissions in it
/// (`put` throws StoreUnavailable) and sets `failure()`; the state changes in it are kept, in
/// order, and tried again every `retry_interval` until they commit, so nothing accepted is lost
/// while the process lives. The file is checked before every commit and by `failure()`: when it was
/// deleted or replaced (SQLite would go on writing to the deleted file, and lose it all at the next
/// start), every commit fails until the process restarts on a restored file.
///
/// The file is opened in exclusive locking mode: a second process that opens it fails at once
/// rather than sharing it. Thread-safety: every method is thread-safe.
class SqliteJobStore final : public JobStore {
 public:
  /// Opens or creates the database at `path`. Throws rebound::Error when it cannot.
  explicit SqliteJobStore(const std::string& path, SqliteJobStoreOptions options = {});
  ~SqliteJobStore() override;
  SqliteJobStore(const SqliteJobStore&) = delete;
  SqliteJobStore& operator=(const SqliteJobStore&) = delete;

  using JobStore::put;
  PutOutcome put(const Job& job, const std::optional<Lease>& claim) override;
  /// Answered from the writer thread once the job is committed, with the other writes of its
  /// transaction: submissions wait for a commit without holding a thread each.
  void async_put(const Job& job, const std::optional<Lease>& claim, PutDone done) override;
  std::vector<PutOutcome> put_many(const std::vector<PutRequest>& requests) override;
  std::optional<JobRecord> get(const std::string& id) const override;
  /// One wait for the writes under way, then each read (the store's lock taken once).
  std::vector<std::optional<JobRecord>> get_many(
      const std::vector<std::string>& ids) const override;
  std::vector<JobRecord> claim_jobs(std::size_t max, const Lease& lease, TimePoint now) override;
  bool renew(const std::string& id, const Lease& lease, TimePoint now) override;
  /// One write to the writer for all of them.
  std::vector<bool> renew_all(const std::vector<std::pair<std::string, Lease>>& leases,
                              TimePoint now) override;
  void mark_running(const std::string& id, TimePoint now) override;
  std::optional<std::size_t> queue_position(const std::string& id) const override;
  bool finish_job(const std::string& id, const std::string& holder, const JobOutcome& outcome,
                  const std::optional<Lease>& deliver, TimePoint now) override;
  /// Answered on the caller's thread as finish_job is (the leases are this process's), or, with
  /// `want_record`, from the writer thread once the write is committed, with the record its
  /// transaction made of the job.
  void async_finish_job(const std::string& id, const std::string& holder, const JobOutcome& outcome,
                        const std::optional<Lease>& deliver, TimePoint now, bool want_record,
                        FinishDone done) override;
  /// `store` for async_put and for an async_finish_job that wants the record.
  AnswerThread answer_thread(AsyncCall call, bool record_asked) const noexcept override;
  std::vector<JobRecord> claim_callbacks(std::size_t max, const Lease& lease,
                                         TimePoint now) override;
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
  std::vector<JobRecord> list_unfinished(std::size_t limit) const override;
  std::optional<std::string> failure() const override;

  /// Transactions committed so far (each may hold many writes).
  std::size_t commits() const;
  /// Deletes finished jobs older than the retention now (in batches of 1,000, other writes
  /// committed between two); returns how many. Also runs by itself.
  std::size_t prune();
  /// The same as of `now`: jobs that finished more than the retention before it.
  std::size_t prune(std::chrono::system_clock::time_point now);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  // finish_job; with `done`, answered through it after the commit with the record as written.
  bool finish(const std::string& id, const std::string& holder, const JobOutcome& outcome,
              const std::optional<Lease>& deliver, TimePoint now, FinishDone* done);
};

/// Turns off SQLite's process-wide memory statistics (SQLITE_CONFIG_MEMSTATUS). They take one
/// global mutex on every SQLite allocation; under a full write load the store's threads queued on
/// it (docs/benchmarks.md). Call once at start, before anything in the process uses SQLite:
/// afterwards SQLite refuses the change and this returns false. It affects every SQLite user in
/// the process (sqlite3_memory_used() then reports 0), so the library never calls it by itself;
/// rebound-server does.
bool disable_sqlite_memory_statistics() noexcept;

}  // namespace rebound
