// SqliteJobStore: one connection, a writer thread that groups writes into transactions, and
// reads that wait for the writes issued before them.
#include "rebound/store/sqlite_job_store.hpp"

#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "common/attempt_log.hpp"
#include "common/test_hook.hpp"
#include "rebound/detail/json.hpp"
#include "rebound/detail/servers_seen.hpp"
#include "rebound/error.hpp"
#include "rebound/store/job_state.hpp"
#include "store/sqlite_testing.hpp"

namespace rebound {
namespace detail {
namespace {
TestHook<bool> prune_batch_hook;
TestHook<> queued_hook;
}  // namespace

void set_sqlite_prune_batch_hook(std::function<void(bool)> hook) {
  prune_batch_hook.set(std::move(hook));
}

void set_sqlite_queued_hook(std::function<void()> hook) {
  queued_hook.set(std::move(hook));
}
}  // namespace detail

namespace {

// The file keeps a JobStatus and a CallbackState as their numbers, and the SQL below compares
// them so ("status < 2": not final; "cb_state = 3": given up). The numbers are on disk: these
// checks stop a change of either enum's order from silently changing what stored rows mean.
static_assert(static_cast<int>(JobStatus::queued) == 0 &&
                  static_cast<int>(JobStatus::running) == 1 &&
                  static_cast<int>(JobStatus::succeeded) == 2 &&
                  static_cast<int>(JobStatus::failed) == 3 &&
                  static_cast<int>(JobStatus::expired) == 4 &&
                  static_cast<int>(JobStatus::cancelled) == 5,
              "the SQLite schema stores JobStatus by number: 0-1 not final, 2-5 final");
static_assert(static_cast<int>(CallbackState::none) == 0 &&
                  static_cast<int>(CallbackState::pending) == 1 &&
                  static_cast<int>(CallbackState::delivered) == 2 &&
                  static_cast<int>(CallbackState::failed) == 3,
              "the SQLite schema stores CallbackState by number");

constexpr const char* schema = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  id             TEXT PRIMARY KEY,
  callback_url   TEXT    NOT NULL,
  input          TEXT    NOT NULL,
  created_at_ms  INTEGER NOT NULL,
  status         INTEGER NOT NULL,
  result         TEXT,
  error_code     TEXT,
  error_message  TEXT,
  cb_state       INTEGER NOT NULL DEFAULT 0,
  cb_attempts    INTEGER NOT NULL DEFAULT 0,
  cb_last_error  TEXT,
  finished_at_ms INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_unfinished ON jobs (created_at_ms) WHERE finished_at_ms IS NULL;
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs (finished_at_ms) WHERE finished_at_ms IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_failed_page ON jobs (created_at_ms, id) WHERE cb_state = 3;
DROP INDEX IF EXISTS jobs_failed_callbacks;
CREATE TABLE IF NOT EXISTS store_probe (id INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL);
)sql";

// Version 2: the store is the queue. job_due_ms: when a job that is not final can be claimed (its
// creation, or the end of the lease that holds it); cb_due_ms: the same for a pending callback
// (its next attempt, or the end of its lease); the callback's retry schedule. Files of version 1
// gain the columns, and the work they hold becomes due.
constexpr const char* schema_v2 = R"sql(
ALTER TABLE jobs ADD COLUMN job_due_ms INTEGER;
ALTER TABLE jobs ADD COLUMN cb_due_ms INTEGER;
ALTER TABLE jobs ADD COLUMN cb_next_at_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN cb_delivery_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN cb_delivery_started_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN cb_previous_delay_ms INTEGER NOT NULL DEFAULT 0;
UPDATE jobs SET job_due_ms = created_at_ms WHERE status < 2;
UPDATE jobs SET cb_state = 1 WHERE status >= 2 AND callback_url != '' AND cb_state = 0;
UPDATE jobs SET cb_due_ms = 0 WHERE cb_state = 1;
CREATE INDEX jobs_job_due ON jobs (job_due_ms) WHERE job_due_ms IS NOT NULL;
CREATE INDEX jobs_cb_due ON jobs (cb_due_ms) WHERE cb_due_ms IS NOT NULL;
PRAGMA user_version = 2;
)sql";

// Version 3: the job API of issue 14. A job's priority, its own time in queue, the events its
// callback hears, its trace context, and when it started and ended. Jobs are claimed by priority,
// then due time; queued jobs are counted by (priority, creation) for their queue position.
constexpr const char* schema_v3 = R"sql(
ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 5;
ALTER TABLE jobs ADD COLUMN max_queue_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN webhook_events INTEGER NOT NULL DEFAULT 2;
ALTER TABLE jobs ADD COLUMN traceparent TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN started_at_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN ended_at_ms INTEGER NOT NULL DEFAULT 0;
DROP INDEX jobs_job_due;
CREATE INDEX jobs_job_due ON jobs (priority, job_due_ms) WHERE job_due_ms IS NOT NULL;
CREATE INDEX jobs_queued ON jobs (priority, created_at_ms, id) WHERE status = 0;
PRAGMA user_version = 3;
)sql";

// Version 4: the operator console (issue 23). Each job keeps its latest callback attempts (a JSON
// array of at most max_attempt_log), and every job is listed newest first from an index.
constexpr const char* schema_v4 = R"sql(
ALTER TABLE jobs ADD COLUMN attempt_log TEXT NOT NULL DEFAULT '[]';
CREATE INDEX jobs_created ON jobs (created_at_ms, id);
PRAGMA user_version = 4;
)sql";

// Version 5: the tenant is a field of the job (Job::tenant). The id column keeps the job's key
// ("tenant/id", rebound/tenant.hpp); a file of version 4 gets each key's tenant from its one '/'
// (tenant names and ids hold none), once, here.
constexpr const char* schema_v5 = R"sql(
ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
UPDATE jobs SET tenant = substr(id, 1, instr(id, '/') - 1) WHERE instr(id, '/') > 0;
PRAGMA user_version = 5;
)sql";

// Version 6: a tenant's dead letters are an index range of their own, so that paging through
// them costs the same however many other tenants have (and never reads theirs).
constexpr const char* schema_v6 = R"sql(
CREATE INDEX jobs_failed_tenant ON jobs (tenant, created_at_ms, id) WHERE cb_state = 3;
PRAGMA user_version = 6;
)sql";

// Version 7: a claim of jobs takes turns across tenants (job_state::claim_turns), each tenant's
// due jobs an index range of their own, by priority then due time.
constexpr const char* schema_v7 = R"sql(
DROP INDEX IF EXISTS jobs_job_due;
CREATE INDEX jobs_tenant_due ON jobs (tenant, priority, job_due_ms) WHERE job_due_ms IS NOT NULL;
PRAGMA user_version = 7;
)sql";

// Version 8: the model and version a job runs on (Job::model, issue 40); a job stored before has
// none (its bodies name none).
constexpr const char* schema_v8 = R"sql(
ALTER TABLE jobs ADD COLUMN model TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN model_version TEXT NOT NULL DEFAULT '';
PRAGMA user_version = 8;
)sql";

// Leases live in this process (the file is opened exclusively), so at open nothing holds any
// work: what a crashed process held is due again at once, and retries keep their schedule.
constexpr const char* release_leases = R"sql(
UPDATE jobs SET job_due_ms = created_at_ms WHERE job_due_ms IS NOT NULL;
UPDATE jobs SET cb_due_ms = cb_next_at_ms WHERE cb_due_ms IS NOT NULL;
)sql";

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A prepared statement, reset and cleared after each use.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) {
    if (sqlite3_prepare_v3(db, sql.c_str(), -1, SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr) !=
        SQLITE_OK) {
      throw Error(std::string("sqlite: cannot prepare statement: ") + sqlite3_errmsg(db));
    }
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& bind(int i, std::int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Statement& bind_null(int i) {
    sqlite3_bind_null(stmt_, i);
    return *this;
  }
  int param(const char* name) const { return sqlite3_bind_parameter_index(stmt_, name); }
  // Steps once; true while a row is available.
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    // Reset at once: a statement left in its error state would make the next use's binds fail
    // (SQLITE_MISUSE), and its step run again with this use's values.
    const std::string what = std::string("sqlite: ") + sqlite3_errmsg(sqlite3_db_handle(stmt_));
    reset();
    throw Error(what);
  }
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  std::string text(int col) const {
    const auto* p = sqlite3_column_text(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p),
                           static_cast<std::size_t>(sqlite3_column_bytes(stmt_, col)))
             : std::string();
  }
  std::int64_t integer(int col) const { return sqlite3_column_int64(stmt_, col); }
  bool is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

#define RECORD_COLUMNS_AFTER_RESULT                                                              \
  "error_code, error_message, cb_state, cb_attempts, cb_last_error, cb_next_at_ms, "             \
  "cb_delivery_attempts, cb_delivery_started_ms, cb_previous_delay_ms, priority, max_queue_ms, " \
  "webhook_events, traceparent, started_at_ms, ended_at_ms"
// A record's columns, read by read_record (the log at 21); the request (input) and the result
// at 2 and 5.
#define RECORD_COLUMNS_WITH(input, result, log)                                                  \
  "id, callback_url, " input ", created_at_ms, status, " result ", " RECORD_COLUMNS_AFTER_RESULT \
  ", " log ", tenant, model, model_version"
// The columns the rules derive (25, 26, 27), read beside a record by the writer.
#define DERIVED_COLUMNS ", job_due_ms, cb_due_ms, finished_at_ms"
constexpr const char* record_columns = RECORD_COLUMNS_WITH("input", "result", "attempt_log");
// A job's row as the writer reads it to apply job_state's rules: the record (`full`: with its input
// and result, else without) and the columns the rules derive.
constexpr const char* row_columns_full =
    RECORD_COLUMNS_WITH("input", "result", "attempt_log") DERIVED_COLUMNS;
constexpr const char* row_columns_state =
    RECORD_COLUMNS_WITH("'null'", "NULL", "attempt_log") DERIVED_COLUMNS;
// The same columns for a list entry: no input, result or attempts are read (read_record sees
// null and an empty log).
constexpr const char* entry_columns = RECORD_COLUMNS_WITH("'null'", "NULL", "'[]'");
#undef DERIVED_COLUMNS
#undef RECORD_COLUMNS_WITH
#undef RECORD_COLUMNS_AFTER_RESULT

using TimePoint = std::chrono::system_clock::time_point;

std::int64_t to_ms(TimePoint t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

TimePoint from_ms(std::int64_t ms) {
  return TimePoint(std::chrono::milliseconds(ms));
}

// `with_log`: the attempt log parsed (else left empty: column 21 is the caller's).
JobRecord read_record(const Statement& s, bool with_log = true) {
  JobRecord r;
  r.job.tenant = s.text(22);
  r.job.id = std::string(id_in_key(s.text(0), r.job.tenant));  // the id column holds the key
  r.job.callback_url = s.text(1);
  // Stored by this store after validation; parsed with the same depth bound all the same, as the
  // file may come from elsewhere (a model's output may be large: no cost bound). What is refused
  // reads as null.
  if (detail::parse_untrusted_json(s.text(2), r.job.input, SIZE_MAX) !=
      detail::JsonParseError::none)
    r.job.input = nullptr;
  r.job.created_at = from_ms(s.integer(3));
  // (A number outside the enum, which only another program could have written, reads as failed.)
  const auto status = s.integer(4);
  r.status = status >= 0 && status <= 5 ? static_cast<JobStatus>(status) : JobStatus::failed;
  if (!s.is_null(5) && detail::parse_untrusted_json(s.text(5), r.outcome.result, SIZE_MAX) !=
                           detail::JsonParseError::none)
    r.outcome.result = nullptr;
  if (!s.is_null(6)) r.outcome.error = ErrorInfo{s.text(6), s.text(7)};
  const auto state = s.integer(8);
  r.callback.state =
      state >= 0 && state <= 3 ? static_cast<CallbackState>(state) : CallbackState::none;
  r.callback.attempts = static_cast<int>(s.integer(9));
  r.callback.last_error = s.text(10);
  r.callback.next_attempt_at = from_ms(s.integer(11));
  r.callback.delivery_attempts = static_cast<int>(s.integer(12));
  r.callback.delivery_started_at = from_ms(s.integer(13));
  r.callback.previous_delay = std::chrono::milliseconds(s.integer(14));
  r.job.priority = static_cast<int>(s.integer(15));
  r.job.max_queue = std::chrono::milliseconds(s.integer(16));
  r.job.webhook_events = static_cast<std::uint8_t>(s.integer(17));
  r.job.traceparent = s.text(18);
  r.started_at = from_ms(s.integer(19));
  r.outcome.finished_at = from_ms(s.integer(20));
  if (with_log) r.attempt_log = detail::attempt_log_from_json(s.text(21));
  r.job.model = ModelRef{s.text(23), s.text(24)};
  return r;
}

// The columns a state change may write, in the order of a row update's mask bits (Impl::Row).
enum StateColumn : unsigned {
  status_col,
  result_col,
  error_code_col,
  error_message_col,
  started_col,
  ended_col,
  job_due_col,
  cb_state_col,
  cb_attempts_col,
  cb_last_error_col,
  cb_next_col,
  cb_delivery_attempts_col,
  cb_delivery_started_col,
  cb_previous_delay_col,
  cb_due_col,
  attempt_log_col,
  finished_col,
  model_version_col,
  state_column_count
};
constexpr const char* state_column_names[state_column_count] = {"status",
                                                                "result",
                                                                "error_code",
                                                                "error_message",
                                                                "started_at_ms",
                                                                "ended_at_ms",
                                                                "job_due_ms",
                                                                "cb_state",
                                                                "cb_attempts",
                                                                "cb_last_error",
                                                                "cb_next_at_ms",
                                                                "cb_delivery_attempts",
                                                                "cb_delivery_started_ms",
                                                                "cb_previous_delay_ms",
                                                                "cb_due_ms",
                                                                "attempt_log",
                                                                "finished_at_ms",
                                                                "model_version"};

// One column's value, as a row update compares and binds it.
struct Value {
  enum class Kind { null, integer, text } kind = Kind::null;
  std::int64_t integer = 0;
  std::string text;

  static Value of(std::int64_t v) {
    Value out;
    out.kind = Kind::integer;
    out.integer = v;
    return out;
  }
  static Value of(std::string v) {
    Value out;
    out.kind = Kind::text;
    out.text = std::move(v);
    return out;
  }
  static Value of(const std::optional<TimePoint>& t) { return t ? of(to_ms(*t)) : Value(); }
  static Value of(const std::optional<std::int64_t>& v) { return v ? of(*v) : Value(); }
  bool operator==(const Value& o) const {
    return kind == o.kind && integer == o.integer && text == o.text;
  }
};
using StateValues = std::array<Value, state_column_count>;

// `outcome` without its result: the writer applies the rest by job_state's rules and writes the
// result as the text the caller's thread made of it (one copy of a model's output the fewer).
JobOutcome outcome_without_result(const JobOutcome& o) {
  JobOutcome out(o.status, nullptr, o.error, o.finished_at);
  out.ran_on_version = o.ran_on_version;
  return out;
}

std::string result_text(const JobOutcome& o) {
  return o.status == JobStatus::succeeded ? detail::dump_json(o.result) : std::string();
}

}  // namespace

struct SqliteJobStore::Impl {
  struct Write {
    std::function<void()> apply;      // runs inside the transaction
    std::function<void()> committed;  // after COMMIT (may be empty)
    // After ROLLBACK (may be empty): a waited-for write is told instead of tried again; one
    // nobody waits for is told each time before it goes back to be tried again, and when the
    // store closes failing.
    std::function<void(std::exception_ptr)> failed;
    bool waited_for = false;  // a caller blocks for its answer: on failure it is told, not retried
    // Goes ahead of the bookkeeping (a submission: a new id, which no queued write is about).
    // A waited-for write that must see the writes before it (a claim, a redelivery) stays in order.
    bool ahead = false;
  };

  // A job's row in the writer's transaction: read at its first use (`rows`), changed by
  // job_state's rules as each write of the transaction applies them in order, written before the
  // commit (or before a claim reads the indexes, or when max_rows are held), the columns that
  // changed only. So a job's mark_running and its finish in one transaction (a short model under
  // load) are one row write, as are a finish and its callback's first attempt. Its finish time is
  // when it first became finished (a later update of a finished job does not move it).
  struct Row {
    // The record, and its leases as the rules see them: the file keeps when each lease ends (the
    // due times job_state::job_due and callback_due make of them), not who holds it, which the
    // maps below know. A row read has a lease by nobody ending at its due time, which the rules
    // read as the same due time (and nobody holds); a write whose caller held a lease puts that
    // lease in its place before it applies its rule.
    StoredJob s;
    std::optional<std::int64_t> finished_ms;  // when job_state::is_finished became true
    bool full = false;  // its input and result are in `s` (a claim answers them)
    // Its attempt log is in `s` (else `log_text` holds it as stored, parsed only for a rule that
    // adds to it: a renewal or a finish costs no JSON).
    bool log_read = false;
    std::string log_text;
    bool dirty = false;       // changed since it was read or written
    bool result_set = false;  // its outcome was written: its result column goes with it
    std::string result_text;  // that result (a job that succeeded), as the caller dumped it
    bool log_set = false;     // an attempt joined its log
    StateValues stored{};     // the state columns as the file has them
  };

  SqliteJobStoreOptions options;
  std::string path;
  dev_t file_device = 0;  // the file opened, to notice it deleted or replaced under us
  ino_t file_inode = 0;
  // The same for its write-ahead log (path-wal), which the writer rebuilds (rebuild_wal); read by
  // failure() from any thread. (No -shm file is used: with exclusive locking SQLite keeps the
  // WAL index in this process's memory.)
  std::atomic<std::uint64_t> wal_device{0}, wal_inode{0};
  sqlite3* db = nullptr;
  mutable std::mutex db_mutex;  // the connection and its statements
  std::unique_ptr<Statement> insert, select_one, select_state, count_ahead, select_due_jobs,
      select_due_callbacks, select_failed, select_failed_page, select_failed_tenant_page,
      select_unfinished, delete_finished, probe, first_due_tenant, next_due_tenant;
  // The writer's (under db_mutex): a row update for each set of columns written together (a bit
  // a StateColumn), prepared at its first use.
  std::unordered_map<std::uint32_t, std::unique_ptr<Statement>> row_updates;
  // The writer's, for the transaction under way: the rows its writes read and changed. Past
  // max_rows they are written and forgotten (a transaction of a backlog of renewals), to be read
  // again by a later write: each write puts its caller's lease in place itself.
  std::unordered_map<std::string, Row> rows;
  static constexpr std::size_t max_rows = 4096;
  mutable std::mutex servers_mutex;
  detail::ServersSeen servers_seen;  // guarded by servers_mutex

  // Who holds which work. In memory: the file is this process's alone (exclusive lock), so when
  // the process ends every lease ends with it, as a lease that runs out would.
  mutable std::mutex lease_mutex;
  std::unordered_map<std::string, Lease> job_leases, callback_leases;
  // Jobs whose cancellation is queued and not yet committed: no lease is given on them (a put or
  // a claim that commits first) and no acknowledgement taken. The lease the cancellation took, or
  // one given meanwhile, is withheld: given back unless the job ends cancelled (not found, already
  // final, or the transaction failed: whoever holds it goes on).
  std::unordered_set<std::string> cancelling;
  std::unordered_map<std::string, Lease> withheld;
  // Under lease_mutex: `lease` becomes the job's, or is withheld while a cancellation waits.
  void give_job_lease(std::string key, const Lease& lease) {
    (cancelling.count(key) ? withheld : job_leases)[std::move(key)] = lease;
  }
  // Work whose lease a queued write ends (finish_job and complete end the job's, record_attempt
  // and update_callback the callback's), with how many such writes of each id wait for the
  // writer: a claim applied before them leaves it alone (one applied after sees what they wrote,
  // in the same transaction or a later one; a transaction that fails tries them again before any
  // claim queued after them). The lease leaves the map when the call is made, and the row keeps
  // it until the write is applied; otherwise a claim queued before the write, made with a clock
  // past the lease's end, would take the work, and the holder's write (answered true) would be
  // refused: the job run twice, the first answer lost.
  using Ending = std::unordered_map<std::string, std::size_t>;
  Ending ending_jobs, ending_callbacks;
  // Under lease_mutex: the write that ends the lease on `id` in `ending` is being queued.
  static void ending_queued(Ending& ending, const std::string& id) { ++ending[id]; }
  // Under lease_mutex: one such write applied, or not queued after all: claims decide again.
  static void ending_done_locked(Ending& ending, const std::string& id) {
    const auto it = ending.find(id);
    if (it != ending.end() && --it->second == 0) ending.erase(it);
  }
  // The writer's only: the writes of this kind applied (their first try) and not yet taken off
  // the counts. Taken off, under the lease lock it takes anyway, before a claim reads the due
  // rows, and once at the end of each transaction: one lock a transaction, not one a write.
  std::vector<std::pair<Ending*, std::string>> endings_applied;
  void ending_applied(Ending& ending, const std::string& id) {
    endings_applied.emplace_back(&ending, id);
  }
  void take_off_endings_locked() {
    for (const auto& [ending, id] : endings_applied)
      ending_done_locked(*ending, id);
    endings_applied.clear();
  }

  mutable std::mutex queue_mutex;
  mutable std::condition_variable queue_changed;  // writes queued, or committed
  // Writes someone waits for (submissions) go ahead of bookkeeping nobody waits for (a job's
  // state, its callback's progress), and a transaction with a submission in it takes at most
  // max_background_per_transaction of the latter: under a burst of deliveries a submission waits
  // for one short transaction, not for the whole backlog (which, when nobody waits, still goes in
  // one transaction and one fsync). Each queue keeps its own order; writes in different queues
  // are about different jobs (a job's updates come after its insert committed), so the
  // reordering is invisible.
  static constexpr std::size_t max_background_per_transaction = 512;
  // How often an idle writer looks at its files (two stat calls).
  static constexpr std::chrono::milliseconds file_check_interval{1000};
  std::deque<Write> waited_queue, background_queue;
  // The writer's only: the tenant whose job a claim took last (job_state::claim_turns).
  std::optional<std::string> last_turn;
  std::uint64_t enqueued[2] = {0, 0};   // writes handed to the writer: waited for, background
  std::uint64_t committed[2] = {0, 0};  // writes whose transaction ended (committed or rolled back)
  std::size_t commit_count = 0;
  // Why the last transaction failed; empty while the store works. While it is set, the
  // bookkeeping writes of that transaction wait at the head of their queue and are tried again
  // every retry interval (a probe write when there are none), and reads stop waiting for them.
  std::string failure;
  // A failure that ended before failure() was asked (under queue_mutex): failure() tells it once,
  // so that every fault is seen (a log line) however soon the store got over it.
  mutable std::string unreported;
  bool stopping = false;
  std::thread writer;

  template <typename T>
  T write_and_wait(std::function<T()> apply, std::function<void(T&)> committed, bool ahead = false,
                   std::function<void()> first = {});
  using Leases = std::unordered_map<std::string, Lease>;
  // Under lease_mutex: whether a claim at `now` may take `id` by the maps: no live lease in
  // `leases` (for jobs, none withheld while a cancellation waits either), no write queued that
  // ends one (`ending`).
  bool free_locked(const Leases& leases, const Ending& ending, const std::string& id,
                   TimePoint now) const {
    if (ending.count(id)) return false;
    const auto held = leases.find(id);
    if (held != leases.end() && held->second.until > now) return false;
    if (&leases != &job_leases) return true;
    const auto kept = withheld.find(id);
    return kept == withheld.end() || kept->second.until <= now;
  }
  // A due job, and its tenant.
  struct Due {
    std::string id;
    const std::string* tenant = nullptr;  // (in the claim's list of tenants; null: a callback)
  };
  // The claim's last look, under one lock, at the ids it is about to take, in its order: the first
  // `max` still free stay in `due` (a holder may have renewed or ended its lease since due_ids
  // looked, its clock behind this claim's), and the leases that ran out on them are forgotten
  // now, not when the claim commits, so that a late acknowledgement is refused when it is made.
  // Only on those: a lease that ran out on work the claim leaves stays its holder's (its finish is
  // taken, as every store takes it), unless the claim's transaction fails after this.
  void take_free(Leases& leases, const Ending& ending, std::vector<Due>& due, std::size_t max,
                 TimePoint now) {
    std::lock_guard<std::mutex> lock(lease_mutex);
    take_off_endings_locked();
    std::size_t kept = 0;
    for (std::size_t i = 0; i < due.size() && kept < max; ++i) {
      if (!free_locked(leases, ending, due[i].id, now)) continue;
      leases.erase(due[i].id);
      if (kept != i) due[kept] = std::move(due[i]);
      ++kept;
    }
    due.resize(kept);
  }
  std::vector<std::string> due_ids(Statement& select, const Leases& leases, const Ending& ending,
                                   std::size_t max, TimePoint now, int priority = 0,
                                   const std::string* tenant = nullptr);
  std::vector<Due> due_jobs(std::vector<std::string>& tenants, std::size_t max, TimePoint now);
  std::vector<JobRecord> claim(bool callbacks, std::size_t max, const Lease& lease, TimePoint now);
  static Leases::iterator live(Leases& leases, const std::string& id, const std::string& holder,
                               TimePoint now);
  std::optional<Lease> release(Leases& leases, const std::string& id, const std::string& holder,
                               TimePoint now);
  PutOutcome insert_job(const Job& job, const std::optional<Lease>& claim);

  // ---- In the writer's transaction: job_state's rules on the rows ----
  // The row of `key` (read at its first use in the transaction; `full`: with its input and
  // result), or null when there is none.
  Row* load(const std::string& key, bool full = false);
  // After a rule changed `r` at `at_ms`: to be written, finished as job_state::is_finished says.
  static void changed(Row& r, std::int64_t at_ms);
  // What the state columns of `r` are by its record and leases (the result and the log only when
  // they were written: they are not read back).
  static StateValues values_of(const Row& r);
  // Writes the columns of `r` that changed since it was read; writes every changed row.
  void write_row(const std::string& key, Row& r);
  void write_rows();
  Statement& update_for(std::uint32_t columns);
  // Puts the caller's lease `held` (checked in the maps when the call was made) in the row's
  // place `slot` and answers true, keeping the lease it replaces in `before`; false, changing
  // nothing, when the row's lease does not end when `held` does: a claim took the work after
  // `held` ran out (the caller's clock behind the claimer's), and the write is refused, as the
  // memory store refuses it.
  static bool swap_in(std::optional<Lease>& slot, const Lease& held, std::optional<Lease>& before) {
    if (!slot || to_ms(slot->until) != to_ms(held.until)) return false;
    before = std::exchange(slot, held);
    return true;
  }
  struct Renewal;
  std::optional<Renewal> renew_held(const std::string& id, const Lease& lease, TimePoint now);
  void apply(Row& r, const Renewal& renewal, TimePoint now);
  // Queues a state change nobody waits for: `rule` applied to the job's row, if it exists. With
  // `ending` (lease_mutex held): a write that ends a lease, counted there until it is applied.
  void change(const std::string& key, std::function<void(Row&)> rule, Ending* ending = nullptr);
  // Queues `w`, a write that ends a lease on `key` (lease_mutex held), counted in `ending` until
  // the writer first applies it.
  void enqueue_ending(Ending& ending, const std::string& key, Write w);

  void exec(const char* sql) {
    char* message = nullptr;
    if (sqlite3_exec(db, sql, nullptr, nullptr, &message) != SQLITE_OK) {
      std::string what = message ? message : "unknown error";
      sqlite3_free(message);
      throw Error(std::string("sqlite: ") + what);
    }
  }

  void open(const std::string& path) {
    if (sqlite3_open_v2(path.c_str(), &db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK) {
      const std::string what = db ? sqlite3_errmsg(db) : "out of memory";
      sqlite3_close(db);
      db = nullptr;
      throw Error("cannot open the job store " + path + ": " + what);
    }
    this->path = path;
    try {
      // SQLite opens a file it cannot write read-only, quietly; a store must write.
      if (sqlite3_db_readonly(db, "main") == 1)
        throw Error(
            "it can only be opened read-only (a read-only disk, or a file this user "
            "cannot write)");
      remember_file();
      exec("PRAGMA locking_mode = EXCLUSIVE");
      exec("PRAGMA journal_mode = WAL");
      exec("PRAGMA synchronous = FULL");
      // Takes the exclusive lock now, so a second server on the same file fails at start. The
      // write-ahead log exists from here on, for as long as the store is open.
      exec("BEGIN IMMEDIATE; COMMIT");
      remember_wal();
      exec(schema);
      if (user_version() < 2) {
        exec("BEGIN IMMEDIATE");
        exec(schema_v2);
        exec("COMMIT");
      }
      if (user_version() < 3) {
        exec("BEGIN IMMEDIATE");
        exec(schema_v3);
        exec("COMMIT");
      }
      if (user_version() < 4) {
        exec("BEGIN IMMEDIATE");
        exec(schema_v4);
        exec("COMMIT");
      }
      if (user_version() < 5) {
        exec("BEGIN IMMEDIATE");
        exec(schema_v5);
        exec("COMMIT");
      }
      if (user_version() < 6) {
        exec("BEGIN IMMEDIATE");
        exec(schema_v6);
        exec("COMMIT");
      }
      if (user_version() < 7) {
        exec("BEGIN IMMEDIATE");
        exec(schema_v7);
        exec("COMMIT");
      }
      if (user_version() < 8) {
        exec("BEGIN IMMEDIATE");
        exec(schema_v8);
        exec("COMMIT");
      }
      exec(release_leases);
      insert = std::make_unique<Statement>(
          db,
          "INSERT INTO jobs (id, callback_url, input, created_at_ms, status, job_due_ms, priority, "
          "max_queue_ms, webhook_events, traceparent, tenant, model, model_version) "
          "VALUES (?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING");
      select_one = std::make_unique<Statement>(
          db, std::string("SELECT ") + row_columns_full + " FROM jobs WHERE id = ?");
      select_state = std::make_unique<Statement>(
          db, std::string("SELECT ") + row_columns_state + " FROM jobs WHERE id = ?");
      count_ahead = std::make_unique<Statement>(
          db,
          "SELECT COUNT(*) FROM jobs WHERE status = 0 AND (priority < :p OR (priority = :p AND "
          "(created_at_ms < :c OR (created_at_ms = :c AND id < :id))))");
      // One tenant (?3) and priority (?2) at a time, each an index range: due jobs, without
      // stepping over the leased ones of a higher priority.
      select_due_jobs = std::make_unique<Statement>(
          db,
          "SELECT id FROM jobs WHERE tenant = ?3 AND priority = ?2 AND job_due_ms <= ?1 "
          "ORDER BY job_due_ms");
      // The tenants with jobs not final, one at a time from the index (a skip over its ranges).
      first_due_tenant = std::make_unique<Statement>(
          db, "SELECT tenant FROM jobs WHERE job_due_ms IS NOT NULL ORDER BY tenant LIMIT 1");
      next_due_tenant = std::make_unique<Statement>(
          db,
          "SELECT tenant FROM jobs WHERE job_due_ms IS NOT NULL AND tenant > ? ORDER BY tenant "
          "LIMIT 1");
      select_due_callbacks = std::make_unique<Statement>(
          db, "SELECT id FROM jobs WHERE cb_due_ms <= ? ORDER BY cb_due_ms");
      select_failed = std::make_unique<Statement>(
          db, std::string("SELECT ") + record_columns +
                  " FROM jobs WHERE cb_state = 3 AND substr(id, 1, length(?2)) = ?2"
                  " ORDER BY created_at_ms DESC LIMIT ?1");
      // A page of dead letters: an index range from the cursor (?3, ?4) down.
      select_failed_page = std::make_unique<Statement>(
          db, std::string("SELECT ") + entry_columns +
                  " FROM jobs WHERE cb_state = 3 AND (created_at_ms, id) < (?3, ?4)"
                  " AND substr(id, 1, length(?2)) = ?2"
                  " ORDER BY created_at_ms DESC, id DESC LIMIT ?1");
      // One tenant's page (?5): its own index range (jobs_failed_tenant), nobody else's rows.
      select_failed_tenant_page = std::make_unique<Statement>(
          db, std::string("SELECT ") + entry_columns +
                  " FROM jobs WHERE cb_state = 3 AND tenant = ?5 AND (created_at_ms, id) < (?3, ?4)"
                  " AND substr(id, 1, length(?2)) = ?2"
                  " ORDER BY created_at_ms DESC, id DESC LIMIT ?1");
      select_unfinished = std::make_unique<Statement>(
          db, std::string("SELECT ") + record_columns +
                  " FROM jobs WHERE finished_at_ms IS NULL ORDER BY created_at_ms LIMIT ?");
      delete_finished = std::make_unique<Statement>(
          db,
          "DELETE FROM jobs WHERE rowid IN (SELECT rowid FROM jobs WHERE finished_at_ms IS NOT "
          "NULL AND finished_at_ms < ?1 ORDER BY finished_at_ms LIMIT ?2)");
      probe = std::make_unique<Statement>(
          db, "INSERT OR REPLACE INTO store_probe (id, at_ms) VALUES (1, ?)");
    } catch (const Error& e) {
      close();
      throw Error("cannot use the job store " + path + ": " + e.what() +
                  (std::string(e.what()).find("locked") != std::string::npos
                       ? " (is another rebound-server using it?)"
                       : ""));
    }
  }

  void close() {
    for (auto* statement :
         {&insert, &select_one, &select_state, &count_ahead, &select_due_jobs, &first_due_tenant,
          &next_due_tenant, &select_due_callbacks, &select_failed, &select_failed_page,
          &select_failed_tenant_page, &select_unfinished, &delete_finished, &probe})
      statement->reset();
    row_updates.clear();
    if (db) sqlite3_close(db);
    db = nullptr;
  }

  int user_version() {
    Statement s(db, "PRAGMA user_version");
    return s.step() ? static_cast<int>(s.integer(0)) : 0;
  }

  void remember_file() {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      file_device = st.st_dev;
      file_inode = st.st_ino;
    }
  }

  void remember_wal() {
    struct stat st {};
    if (::stat((path + "-wal").c_str(), &st) == 0) {
      wal_device = static_cast<std::uint64_t>(st.st_dev);
      wal_inode = static_cast<std::uint64_t>(st.st_ino);
    }
  }

  // Why the file under `path` is not the one this store has open (deleted, or replaced by a
  // restore or a second deployment), or empty. SQLite goes on writing to an open file that was
  // deleted, and everything written then is lost at the next start, so this is checked before
  // every commit, by failure(), and every second while the writer is idle.
  std::string file_problem() const {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      return "the database file " + path + " was deleted; restore it and restart";
    }
    if (st.st_dev != file_device || st.st_ino != file_inode) {
      return "the database file " + path + " was replaced by another file; restart to use it";
    }
    return wal_problem();
  }

  // The same for the write-ahead log: what was committed since the last checkpoint lives only
  // there, and a log deleted under an open store is gone at the next start. The writer rebuilds
  // it (rebuild_wal).
  std::string wal_problem() const {
    const std::string wal = path + "-wal";
    struct stat st {};
    if (::stat(wal.c_str(), &st) != 0) return "the write-ahead log " + wal + " was deleted";
    if (static_cast<std::uint64_t>(st.st_dev) != wal_device ||
        static_cast<std::uint64_t>(st.st_ino) != wal_inode)
      return "the write-ahead log " + wal + " was replaced by another file";
    return {};
  }

  // Under db_mutex, outside a transaction, when only the write-ahead log is wrong: what the open
  // log holds is checkpointed into the database file (its own, still open), and a new log is made
  // at the path (a file put there instead is removed). Nothing committed is lost. Throws when
  // SQLite cannot.
  void rebuild_wal() {
    exec("PRAGMA wal_checkpoint(TRUNCATE)");
    journal_mode("delete");
    journal_mode("wal");
    exec("BEGIN IMMEDIATE; COMMIT");
    remember_wal();
  }

  // Sets the journal mode; throws unless SQLite answers that it is the mode now (it answers the
  // old one, without an error, when it cannot change it).
  void journal_mode(const std::string& mode) {
    Statement s(db, "PRAGMA journal_mode = " + mode);
    const bool changed = s.step() && s.text(0) == mode;
    s.reset();
    if (!changed) throw Error("sqlite: the journal mode could not be set to " + mode);
  }

  // Queues a write, in its queue.
  void enqueue(Write w) {
    {
      std::lock_guard<std::mutex> lock(queue_mutex);
      if (stopping) throw StoreUnavailable("the job store is closed");
      ++enqueued[w.ahead ? 0 : 1];
      (w.ahead ? waited_queue : background_queue).push_back(std::move(w));
      queue_changed.notify_all();
    }
    detail::queued_hook();  // (never throws: the callers take a throw for a write not queued)
  }

  // Waits until every write queued before now has been through a transaction, or the store
  // fails (reads then see what is committed, not writes that wait for the store to recover).
  void wait_for_writes() const {
    std::unique_lock<std::mutex> lock(queue_mutex);
    const std::uint64_t waited = enqueued[0], background = enqueued[1];
    queue_changed.wait(lock, [&] {
      return !failure.empty() || (committed[0] >= waited && committed[1] >= background);
    });
  }

  void run_writer() {
    auto last_prune = std::chrono::steady_clock::now();
    bool pruning = false;  // the last batch of a pruning was full: more to delete
    for (;;) {
      std::deque<Write> batch;
      std::size_t waited = 0;
      bool probing = false;
      {
        std::unique_lock<std::mutex> lock(queue_mutex);
        auto queued = [this] { return !waited_queue.empty() || !background_queue.empty(); };
        if (failure.empty()) {
          queue_changed.wait_for(lock,
                                 pruning ? std::chrono::milliseconds(0)
                                         : std::min<std::chrono::milliseconds>(
                                               options.prune_interval, file_check_interval),
                                 [&] { return stopping || queued(); });
        } else {
          // Failing: a submission is tried at once (it is answered either way); the rest waits
          // for the retry interval.
          queue_changed.wait_for(lock, options.retry_interval,
                                 [&] { return stopping || !waited_queue.empty(); });
        }
        if (stopping && (!queued() || !failure.empty())) {
          // Nothing left, or a store that fails: what is still queued is dropped (a submission is
          // told so). Accepted jobs are still in the file as they were, and run again at the
          // next start.
          fail_all_queued(lock);
          return;
        }
        batch.swap(waited_queue);
        waited = batch.size();
        if (waited == 0) {
          batch.swap(background_queue);  // nobody waits: one transaction (one fsync) for all
        } else {
          for (std::size_t i = 0; i < max_background_per_transaction && !background_queue.empty();
               ++i) {
            batch.push_back(std::move(background_queue.front()));
            background_queue.pop_front();
          }
        }
        probing = batch.empty() && !failure.empty();
      }
      // Idle: a file deleted or replaced under the store is noticed (and a log rebuilt) now, not
      // at the next write.
      if (batch.empty() && !probing && !file_problem().empty()) probing = true;
      if (!batch.empty() || probing) commit(batch, waited);
      // One batch a turn of the loop, the writes queued meanwhile committed before the next;
      // a full batch goes on at the next turn without waiting for the interval.
      const bool due = std::chrono::steady_clock::now() - last_prune >= options.prune_interval;
      if (options.retention.count() > 0 && (pruning || due)) {
        if (due) last_prune = std::chrono::steady_clock::now();
        try {
          pruning = prune_some(now_ms(), !due) == prune_batch;
        } catch (...) {
          pruning = false;  // Pruning is housekeeping: it retries at the next interval.
        }
      }
    }
  }

  // Called with queue_mutex held, when the writer stops for good.
  void fail_all_queued(std::unique_lock<std::mutex>& lock) {
    std::deque<Write> dropped;
    dropped.swap(waited_queue);
    committed[0] += dropped.size();
    committed[1] += background_queue.size();
    for (auto& w : background_queue)
      if (w.waited_for || w.failed) dropped.push_back(std::move(w));  // (an answer owed)
    background_queue.clear();
    queue_changed.notify_all();
    lock.unlock();
    // (An exception object for each waiter: none is rethrown on two threads.)
    for (auto& w : dropped) {
      if (w.failed) {
        w.failed(
            std::make_exception_ptr(StoreUnavailable("the job store closed while it was failing")));
      }
    }
  }

  // Commits `batch`, whose first `waited` writes are waited for; an empty batch is a probe of a
  // failing store. On failure the waited-for writes are told, and the others go back to the head
  // of their queue, in order, to be tried again.
  void commit(std::deque<Write>& batch, std::size_t waited) {
    std::exception_ptr error;
    std::string why;
    {
      std::lock_guard<std::mutex> lock(db_mutex);
      try {
        // A transaction a failure left open (SQLite ends some by itself, not all) ends here.
        if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
        rows.clear();
        exec("BEGIN IMMEDIATE");
        for (auto& w : batch)
          w.apply();
        write_rows();
        if (batch.empty()) {
          probe->bind(1, now_ms()).step();
          probe->reset();
        }
        why = file_problem();
        if (!why.empty()) throw StoreUnavailable(why);
        exec("COMMIT");
      } catch (const std::exception& e) {
        error = std::current_exception();
        if (why.empty()) why = e.what();
      } catch (...) {
        error = std::current_exception();
        if (why.empty()) why = "unknown error";
      }
      rows.clear();  // (rolled back: the rows are read again when the writes are retried)
      if (!endings_applied.empty()) {
        // (Rolled back too: the writes are tried again before any claim queued after them.)
        std::lock_guard<std::mutex> lock(lease_mutex);
        take_off_endings_locked();
      }
      if (error) sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
      // The database file is right and only its log is not: rebuilt now, so that the retry of
      // this batch (the next probe, within the retry interval) commits again.
      if (error && wal_problem() == why) {
        try {
          rebuild_wal();
          why += "; the store checkpointed the open log into the database file and made a new one";
        } catch (const std::exception& e) {
          why += std::string("; rebuilding it failed: ") + e.what();
        }
      }
    }
    if (error) {
      error = std::make_exception_ptr(StoreUnavailable("sqlite job store: " + why));
      // Known as failing before a waiter hears of it: whoever it tells asks failure() next.
      std::lock_guard<std::mutex> lock(queue_mutex);
      failure = "sqlite job store: " + why;
      unreported = failure;
    }
    if (!error) {
      // Counted before anyone hears of the commit: a caller told its write is in the file sees
      // it in commits() (the count moved after the answers, and a test read it between).
      std::lock_guard<std::mutex> lock(queue_mutex);
      failure.clear();
      ++commit_count;
    }
    std::deque<Write> retry;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      Write& w = batch[i];
      if (!error) {
        if (w.committed) w.committed();
      } else if (w.waited_for) {
        // (An exception object for each waiter: none is rethrown on two threads.)
        if (w.failed)
          w.failed(std::make_exception_ptr(StoreUnavailable("sqlite job store: " + why)));
      } else {
        if (w.failed)
          w.failed(std::make_exception_ptr(StoreUnavailable("sqlite job store: " + why)));
        retry.push_back(std::move(w));
      }
    }
    std::lock_guard<std::mutex> lock(queue_mutex);
    committed[0] += waited;
    committed[1] += batch.size() - waited;
    if (error) {
      failure = "sqlite job store: " + why;
      unreported = failure;
      enqueued[1] += retry.size();
      background_queue.insert(background_queue.begin(), std::make_move_iterator(retry.begin()),
                              std::make_move_iterator(retry.end()));
    }
    queue_changed.notify_all();
  }

  // Pruning deletes at most this many jobs a transaction, the store's lock let go between two:
  // a retention lowered from days to hours, or a start on an old file, deleted every job past it
  // in one statement, and every put waited for it (the writer and its lock held throughout).
  static constexpr std::size_t prune_batch = 1000;

  // Deletes at most prune_batch of the jobs that finished more than the retention before `at`
  // (ms since the epoch), oldest first; returns how many. `went_on`: after a full batch (for the
  // tests' hook).
  std::size_t prune_some(std::int64_t at, bool went_on) {
    std::size_t deleted = 0;
    {
      std::lock_guard<std::mutex> lock(db_mutex);
      delete_finished->bind(1, at - static_cast<std::int64_t>(options.retention.count()) * 1000)
          .bind(2, static_cast<std::int64_t>(prune_batch));
      delete_finished->step();
      delete_finished->reset();
      deleted = static_cast<std::size_t>(sqlite3_changes(db));
    }
    detail::prune_batch_hook(went_on);
    return deleted;
  }

  // All of them, batch after batch (prune()); the writer commits what is queued between two.
  std::size_t prune_at(std::int64_t at) {
    std::size_t total = 0;
    for (;;) {
      const std::size_t deleted = prune_some(at, total > 0);
      total += deleted;
      if (deleted < prune_batch) return total;
    }
  }

  // `cursor`: the (created_at_ms, id) bound of a page, bound as ?3 and ?4.
  std::vector<JobRecord> select_list(
      Statement& s, std::size_t limit, const std::optional<std::string>& prefix = {},
      const std::optional<std::pair<std::int64_t, std::string>>& cursor = {},
      const std::optional<std::string>& tenant = {}) const {
    wait_for_writes();
    std::lock_guard<std::mutex> lock(db_mutex);
    std::vector<JobRecord> out;
    s.bind(1, static_cast<std::int64_t>(std::min<std::size_t>(limit, INT64_MAX)));
    if (prefix) s.bind(2, *prefix);
    if (cursor) s.bind(3, cursor->first).bind(4, cursor->second);
    if (tenant) s.bind(5, *tenant);
    try {
      while (s.step())
        out.push_back(read_record(s));
    } catch (const std::exception& e) {
      s.reset();
      throw StoreUnavailable(std::string("sqlite job store: ") + e.what());
    }
    s.reset();
    return out;
  }
};

SqliteJobStore::SqliteJobStore(const std::string& path, SqliteJobStoreOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (options.prune_interval.count() <= 0)
    throw Error("SqliteJobStore: prune_interval must be > 0");
  if (options.retry_interval.count() <= 0)
    throw Error("SqliteJobStore: retry_interval must be > 0");
  impl_->options = options;
  impl_->open(path);
  impl_->writer = std::thread([impl = impl_.get()] { impl->run_writer(); });
}

SqliteJobStore::~SqliteJobStore() {
  {
    std::lock_guard<std::mutex> lock(impl_->queue_mutex);
    impl_->stopping = true;
    impl_->queue_changed.notify_all();
  }
  impl_->writer.join();  // commits what is queued first
  impl_->close();
}

// Runs `apply` in the writer's next transaction and waits for it to commit; `committed` runs
// after the commit, before the answer is returned. Throws StoreUnavailable when it fails.
template <typename T>
T SqliteJobStore::Impl::write_and_wait(std::function<T()> apply, std::function<void(T&)> committed,
                                       bool ahead, std::function<void()> first) {
  auto out = std::make_shared<T>();
  auto done = std::make_shared<std::promise<T>>();
  auto result = done->get_future();
  Write write{[apply = std::move(apply), out] { *out = apply(); },
              [committed = std::move(committed), done, out] {
                if (committed) committed(*out);
                done->set_value(std::move(*out));
              },
              [done](std::exception_ptr e) { done->set_exception(e); }, true, ahead};
  if (first) {
    // `first` changes the leases, and the write is queued under the same lock: a lease check
    // made after it sees its change, and its write comes after any write queued before.
    std::lock_guard<std::mutex> lock(lease_mutex);
    first();
    enqueue(std::move(write));
  } else {
    enqueue(std::move(write));
  }
  return result.get();
}

// The ids among the due rows of `select` (bound to :now, and to `priority` and `tenant` for
// jobs) that free_locked finds free, at most `max`: the rows whose due time came but whose lease
// was renewed by a write still queued are skipped, so the map decides. Rows whose lease a write
// not yet applied ends (`ending`) are skipped too: that write decides. Nothing is taken here: a
// claim of jobs may leave some of these to the next claim (the tenants' turns), and a lease that
// ran out stays its holder's until a claim takes the work (take_free).
std::vector<std::string> SqliteJobStore::Impl::due_ids(Statement& select, const Leases& leases,
                                                       const Ending& ending, std::size_t max,
                                                       TimePoint now, int priority,
                                                       const std::string* tenant) {
  std::vector<std::string> ids;
  select.bind(1, to_ms(now));
  if (tenant) select.bind(2, static_cast<std::int64_t>(priority)).bind(3, *tenant);
  try {
    std::lock_guard<std::mutex> lock(lease_mutex);
    take_off_endings_locked();  // (the writes applied before this claim decide no more)
    while (ids.size() < max && select.step()) {
      std::string id = select.text(0);
      if (free_locked(leases, ending, id, now)) ids.push_back(std::move(id));
    }
  } catch (...) {
    select.reset();
    throw;
  }
  select.reset();
  return ids;
}

// The due jobs a claim of `max` may take, in the order it takes them (up to `max` of each tenant,
// so more than `max` in all): each tenant's by priority, then due time, the tenants taking turns
// (job_state::claim_turns) from the one after the last that had a job taken. `names`: the tenants
// (the answer points into it). In the writer's transaction; the claim moves the turn with each job
// it takes (so two claims in one transaction take turns too), and it stays moved if the
// transaction rolls back: after a store fault a tenant may lose one turn.
std::vector<SqliteJobStore::Impl::Due> SqliteJobStore::Impl::due_jobs(
    std::vector<std::string>& names, std::size_t max, TimePoint now) {
  // The tenants with due jobs, and how many of each; `tenant`: the last one looked at.
  names.clear();
  std::vector<std::vector<std::string>> due;
  std::vector<std::size_t> claimable;
  std::optional<std::string> tenant;
  for (;;) {
    Statement& next = tenant ? *next_due_tenant : *first_due_tenant;
    if (tenant) next.bind(1, *tenant);
    tenant.reset();
    try {
      if (next.step()) tenant = next.text(0);
    } catch (...) {
      next.reset();
      throw;
    }
    next.reset();
    if (!tenant) break;
    std::vector<std::string> mine;
    for (int p = highest_priority; p <= lowest_priority && mine.size() < max; ++p) {
      for (auto& id :
           due_ids(*select_due_jobs, job_leases, ending_jobs, max - mine.size(), now, p, &*tenant))
        mine.push_back(std::move(id));
    }
    if (mine.empty()) continue;
    names.push_back(*tenant);
    claimable.push_back(mine.size());
    due.push_back(std::move(mine));
  }
  std::vector<Due> order;
  for (const auto& [t, position] : job_state::claim_turns(names, claimable, last_turn))
    order.push_back({std::move(due[t][position]), &names[t]});
  return order;
}

std::vector<JobRecord> SqliteJobStore::Impl::claim(bool callbacks, std::size_t max,
                                                   const Lease& lease, TimePoint now) {
  if (max == 0) return {};
  return write_and_wait<std::vector<JobRecord>>(
      [this, callbacks, max, lease, now] {
        write_rows();  // the indexes as this transaction's writes left them
        std::vector<JobRecord> out;
        auto& leases = callbacks ? callback_leases : job_leases;
        const Ending& ending = callbacks ? ending_callbacks : ending_jobs;
        std::vector<std::string> tenants;
        std::vector<Due> due;
        if (callbacks) {
          for (auto& id : due_ids(*select_due_callbacks, leases, ending, max, now))
            due.push_back({std::move(id)});
        } else {
          due = due_jobs(tenants, max, now);
        }
        take_free(leases, ending, due, max, now);
        for (const Due& d : due) {
          Row* r = load(d.id, true);
          if (!r || !(callbacks ? job_state::claim_callback(r->s, lease, now)
                                : job_state::claim_job(r->s, lease, now)))
            continue;
          if (d.tenant) last_turn = *d.tenant;
          changed(*r, to_ms(now));
          // The answer takes the input and result (the row keeps its state columns only).
          nlohmann::json input = std::move(r->s.record.job.input);
          nlohmann::json result = std::move(r->s.record.outcome.result);
          r->full = false;
          out.push_back(r->s.record);
          out.back().job.input = std::move(input);
          out.back().outcome.result = std::move(result);
        }
        return out;
      },
      [this, callbacks, lease](std::vector<JobRecord>& claimed) {
        std::lock_guard<std::mutex> lock(lease_mutex);
        auto& leases = callbacks ? callback_leases : job_leases;
        for (const auto& r : claimed) {
          std::string key = key_of(r.job);
          if (callbacks)
            leases[std::move(key)] = lease;
          else
            give_job_lease(std::move(key), lease);
        }
      });
}

// `holder`'s lease on `id` when it is live, else end(). Called with lease_mutex held.
SqliteJobStore::Impl::Leases::iterator SqliteJobStore::Impl::live(Leases& leases,
                                                                  const std::string& id,
                                                                  const std::string& holder,
                                                                  TimePoint now) {
  auto it = leases.find(id);
  if (it == leases.end() || !job_state::holds(it->second, holder, now)) return leases.end();
  return it;
}

// Ends `holder`'s lease on `id` when it is live: the lease it was. Called with lease_mutex held.
std::optional<Lease> SqliteJobStore::Impl::release(Leases& leases, const std::string& id,
                                                   const std::string& holder, TimePoint now) {
  auto it = live(leases, id, holder, now);
  if (it == leases.end()) return std::nullopt;
  std::optional<Lease> held = std::move(it->second);
  leases.erase(it);
  return held;
}

SqliteJobStore::Impl::Row* SqliteJobStore::Impl::load(const std::string& key, bool full) {
  auto it = rows.find(key);
  if (it != rows.end()) {
    if (!full || it->second.full) return &it->second;
    write_row(it->first, it->second);  // its changes in the file, then read whole
    rows.erase(it);
  }
  if (rows.size() >= max_rows) {
    write_rows();
    rows.clear();
  }
  Statement& q = full ? *select_one : *select_state;
  q.bind(1, key);
  Row r;
  try {
    if (!q.step()) {
      q.reset();
      return nullptr;
    }
    r.s.record = read_record(q, full);
    r.full = r.log_read = full;
    if (!full) r.log_text = q.text(21);
    // A lease by nobody (a holder no caller has: holders are never empty, nor this) ending at
    // the row's due time: the rules read it as that due time.
    static const std::string nobody("\0", 1);
    if (!q.is_null(25)) r.s.job_lease = Lease{nobody, from_ms(q.integer(25))};
    if (!q.is_null(26)) r.s.callback_lease = Lease{nobody, from_ms(q.integer(26))};
    if (!q.is_null(27)) r.finished_ms = q.integer(27);
    r.stored = values_of(r);
    // The due columns as the file has them: a row that disagrees with the rules (a job final
    // and still due: only another program could write it) is written right with this
    // transaction, so that claims stop finding it.
    const Value job_due = Value::of(q.is_null(25) ? std::nullopt : std::optional(q.integer(25)));
    const Value cb_due = Value::of(q.is_null(26) ? std::nullopt : std::optional(q.integer(26)));
    r.dirty = !(job_due == r.stored[job_due_col]) || !(cb_due == r.stored[cb_due_col]);
    r.stored[job_due_col] = job_due;
    r.stored[cb_due_col] = cb_due;
  } catch (...) {
    q.reset();
    throw;
  }
  q.reset();
  return &rows.emplace(key, std::move(r)).first->second;
}

void SqliteJobStore::Impl::changed(Row& r, std::int64_t at_ms) {
  r.dirty = true;
  if (!job_state::is_finished(r.s.record)) {
    r.finished_ms.reset();
  } else if (!r.finished_ms) {
    r.finished_ms = at_ms;
  }
}

StateValues SqliteJobStore::Impl::values_of(const Row& r) {
  const JobRecord& rec = r.s.record;
  const CallbackInfo& cb = rec.callback;
  StateValues v;
  v[status_col] = Value::of(static_cast<std::int64_t>(rec.status));
  if (r.result_set && rec.status == JobStatus::succeeded) v[result_col] = Value::of(r.result_text);
  if (rec.outcome.error) {
    v[error_code_col] = Value::of(rec.outcome.error->code);
    v[error_message_col] = Value::of(rec.outcome.error->message);
  }
  v[started_col] = Value::of(to_ms(rec.started_at));
  v[ended_col] = Value::of(to_ms(rec.outcome.finished_at));
  v[job_due_col] = Value::of(job_state::job_due(r.s));
  v[cb_state_col] = Value::of(static_cast<std::int64_t>(cb.state));
  v[cb_attempts_col] = Value::of(static_cast<std::int64_t>(cb.attempts));
  v[cb_last_error_col] = Value::of(cb.last_error);
  v[cb_next_col] = Value::of(to_ms(cb.next_attempt_at));
  v[cb_delivery_attempts_col] = Value::of(static_cast<std::int64_t>(cb.delivery_attempts));
  v[cb_delivery_started_col] = Value::of(to_ms(cb.delivery_started_at));
  v[cb_previous_delay_col] = Value::of(static_cast<std::int64_t>(cb.previous_delay.count()));
  v[cb_due_col] = Value::of(job_state::callback_due(r.s));
  if (r.log_set) v[attempt_log_col] = Value::of(detail::attempt_log_to_json(rec.attempt_log));
  v[finished_col] = Value::of(r.finished_ms);
  v[model_version_col] = Value::of(rec.job.model.version);
  return v;
}

void SqliteJobStore::Impl::write_row(const std::string& key, Row& r) {
  if (!r.dirty) return;
  StateValues now = values_of(r);
  std::uint32_t columns = 0;
  for (unsigned c = 0; c < state_column_count; ++c) {
    const bool write = c == result_col        ? r.result_set
                       : c == attempt_log_col ? r.log_set
                                              : !(now[c] == r.stored[c]);
    if (write) columns |= 1u << c;
  }
  if (columns != 0) {
    Statement& u = update_for(columns);
    int i = 0;
    for (unsigned c = 0; c < state_column_count; ++c) {
      if ((columns & (1u << c)) == 0) continue;
      const Value& value = now[c];
      ++i;
      if (value.kind == Value::Kind::integer) {
        u.bind(i, value.integer);
      } else if (value.kind == Value::Kind::text) {
        u.bind(i, value.text);
      } else {
        u.bind_null(i);
      }
    }
    u.bind(i + 1, key);
    try {
      u.step();
    } catch (...) {
      u.reset();
      throw;
    }
    u.reset();
  }
  r.stored = std::move(now);
  r.stored[result_col] = r.stored[attempt_log_col] = Value();  // (not compared: not kept)
  r.dirty = r.result_set = r.log_set = false;
  r.result_text.clear();
}

void SqliteJobStore::Impl::write_rows() {
  for (auto& [key, r] : rows)
    write_row(key, r);
}

Statement& SqliteJobStore::Impl::update_for(std::uint32_t columns) {
  auto& statement = row_updates[columns];
  if (!statement) {
    std::string sql = "UPDATE jobs SET ";
    int n = 0;
    for (unsigned c = 0; c < state_column_count; ++c) {
      if ((columns & (1u << c)) == 0) continue;
      if (n > 0) sql += ", ";
      sql += state_column_names[c];
      sql += " = ?" + std::to_string(++n);
    }
    sql += " WHERE id = ?" + std::to_string(n + 1);
    statement = std::make_unique<Statement>(db, sql);
  }
  return *statement;
}

void SqliteJobStore::Impl::change(const std::string& key, std::function<void(Row&)> rule,
                                  Ending* ending) {
  Write w{[this, key, rule = std::move(rule)] {
            if (Row* r = load(key)) rule(*r);
          },
          {},
          {}};
  if (ending) {
    enqueue_ending(*ending, key, std::move(w));
  } else {
    enqueue(std::move(w));
  }
}

void SqliteJobStore::Impl::enqueue_ending(Ending& ending, const std::string& key, Write w) {
  ending_queued(ending, key);
  w.apply = [this, &ending, key, apply = std::move(w.apply), first = true]() mutable {
    apply();
    if (first) {
      ending_applied(ending, key);
      first = false;  // (once: not again when a failed transaction retries it)
    }
  };
  try {
    enqueue(std::move(w));
  } catch (...) {
    ending_done_locked(ending, key);
    throw;
  }
}

// Inserts one job in the writer's transaction.
PutOutcome SqliteJobStore::Impl::insert_job(const Job& job, const std::optional<Lease>& claim) {
  Statement& s = *insert;
  const std::string key = key_of(job);
  s.bind(1, key).bind(2, job.callback_url).bind(3, detail::dump_json(job.input));
  s.bind(4, to_ms(job.created_at));
  s.bind(5, to_ms(claim ? claim->until : job.created_at));  // job_state::created's due time
  s.bind(6, static_cast<std::int64_t>(job.priority));
  s.bind(7, static_cast<std::int64_t>(job.max_queue.count()));
  s.bind(8, static_cast<std::int64_t>(job.webhook_events));
  s.bind(9, job.traceparent);
  s.bind(10, job.tenant);
  s.bind(11, job.model.name).bind(12, job.model.version);
  s.step();
  s.reset();
  if (sqlite3_changes(db) == 1) return PutOutcome::created;
  const Row* existing = load(key, true);
  return existing ? job_state::put_again(existing->s, job) : PutOutcome::conflict;
}

// All in one transaction of the writer: one commit (one fsync) for the lot.
std::vector<PutOutcome> SqliteJobStore::put_many(const std::vector<PutRequest>& requests) {
  Impl* impl = impl_.get();
  return impl_->write_and_wait<std::vector<PutOutcome>>(
      [impl, &requests] {
        std::vector<PutOutcome> out;
        out.reserve(requests.size());
        for (const PutRequest& r : requests)
          out.push_back(impl->insert_job(*r.job, r.claim));
        return out;
      },
      [impl, &requests](std::vector<PutOutcome>& outcomes) {
        std::lock_guard<std::mutex> lock(impl->lease_mutex);
        for (std::size_t i = 0; i < requests.size(); ++i) {
          const PutRequest& r = requests[i];
          if (outcomes[i] != PutOutcome::created || !r.claim) continue;
          std::string key = key_of(*r.job);
          impl->give_job_lease(std::move(key), *r.claim);
        }
      },
      true);  // durable once this returns
}

PutOutcome SqliteJobStore::put(const Job& job, const std::optional<Lease>& claim) {
  Impl* impl = impl_.get();
  return impl_->write_and_wait<PutOutcome>(
      [impl, job, claim] { return impl->insert_job(job, claim); },
      [impl, id = key_of(job), claim](PutOutcome& outcome) {
        if (outcome != PutOutcome::created || !claim) return;
        std::lock_guard<std::mutex> lock(impl->lease_mutex);
        impl->give_job_lease(id, *claim);
      },
      true);  // durable once this returns created
}

void SqliteJobStore::async_put(const Job& job, const std::optional<Lease>& claim, PutDone done) {
  Impl* impl = impl_.get();
  auto outcome = std::make_shared<PutOutcome>(PutOutcome::created);
  auto answer = std::make_shared<PutDone>(std::move(done));
  Impl::Write write{[impl, job, claim, outcome] { *outcome = impl->insert_job(job, claim); },
                    [impl, id = key_of(job), claim, outcome, answer] {
                      if (*outcome == PutOutcome::created && claim) {
                        std::lock_guard<std::mutex> lock(impl->lease_mutex);
                        impl->give_job_lease(id, *claim);
                      }
                      (*answer)(nullptr, *outcome);
                    },
                    [answer](std::exception_ptr error) { (*answer)(error, PutOutcome::created); },
                    true, true};  // durable once answered created; ahead of the bookkeeping
  try {
    impl_->enqueue(std::move(write));
  } catch (...) {
    (*answer)(std::current_exception(), PutOutcome::created);  // the store is closed
  }
}

std::optional<JobRecord> SqliteJobStore::get(const std::string& id) const {
  impl_->wait_for_writes();
  std::lock_guard<std::mutex> lock(impl_->db_mutex);
  Statement& s = *impl_->select_one;
  s.bind(1, id);
  std::optional<JobRecord> out;
  try {
    if (s.step()) out = read_record(s);
  } catch (const std::exception& e) {
    s.reset();
    throw StoreUnavailable(std::string("sqlite job store: ") + e.what());
  }
  s.reset();
  return out;
}

std::vector<std::optional<JobRecord>> SqliteJobStore::get_many(
    const std::vector<std::string>& ids) const {
  std::vector<std::optional<JobRecord>> out;
  if (ids.empty()) return out;
  out.reserve(ids.size());
  impl_->wait_for_writes();
  std::lock_guard<std::mutex> lock(impl_->db_mutex);
  Statement& s = *impl_->select_one;
  try {
    for (const std::string& id : ids) {
      s.bind(1, id);
      std::optional<JobRecord> record;
      if (s.step()) record = read_record(s);
      s.reset();
      out.push_back(std::move(record));
    }
  } catch (const std::exception& e) {
    s.reset();
    throw StoreUnavailable(std::string("sqlite job store: ") + e.what());
  }
  return out;
}

std::optional<std::size_t> SqliteJobStore::queue_position(const std::string& id) const {
  impl_->wait_for_writes();
  std::lock_guard<std::mutex> lock(impl_->db_mutex);
  Statement& s = *impl_->select_one;
  Statement& count = *impl_->count_ahead;
  try {
    s.bind(1, id);
    std::optional<JobRecord> record;
    if (s.step()) record = read_record(s);
    s.reset();
    if (!record || record->status != JobStatus::queued) return std::nullopt;
    count.bind(count.param(":p"), static_cast<std::int64_t>(record->job.priority));
    count.bind(count.param(":c"), to_ms(record->job.created_at));
    count.bind(count.param(":id"), id);
    const std::size_t ahead = count.step() ? static_cast<std::size_t>(count.integer(0)) : 0;
    count.reset();
    return ahead;
  } catch (const std::exception& e) {
    s.reset();
    count.reset();
    throw StoreUnavailable(std::string("sqlite job store: ") + e.what());
  }
}

std::vector<JobRecord> SqliteJobStore::claim_jobs(std::size_t max, const Lease& lease,
                                                  TimePoint now) {
  return impl_->claim(false, max, lease, now);
}

std::vector<JobRecord> SqliteJobStore::claim_callbacks(std::size_t max, const Lease& lease,
                                                       TimePoint now) {
  return impl_->claim(true, max, lease, now);
}

// A renewal the maps allowed: which lease it lengthens, as it was, and to what.
struct SqliteJobStore::Impl::Renewal {
  std::string id;
  bool callback = false;
  Lease held;   // the lease the rule renews, as the caller held it
  Lease lease;  // the renewal
};

// Under lease_mutex: lengthens `holder`'s live lease on `id` in the maps (its job's, else its
// callback's); the renewal its write applies, or nullopt when it holds none.
std::optional<SqliteJobStore::Impl::Renewal> SqliteJobStore::Impl::renew_held(const std::string& id,
                                                                              const Lease& lease,
                                                                              TimePoint now) {
  Leases* leases = &job_leases;
  auto it = live(*leases, id, lease.holder, now);
  if (it == leases->end() && cancelling.count(id)) {
    // A cancellation waits: its holder still renews the lease withheld (given back unless the
    // job ends cancelled; its write comes after the cancellation's).
    leases = &withheld;
    it = live(*leases, id, lease.holder, now);
  }
  if (it == leases->end()) {
    leases = &callback_leases;
    it = live(*leases, id, lease.holder, now);
    if (it == leases->end()) return std::nullopt;
  }
  Renewal renewal{id, leases == &callback_leases, it->second, lease};
  it->second.until = lease.until;
  return renewal;
}

// job_state::renew on the row, with the caller's lease in place.
void SqliteJobStore::Impl::apply(Row& r, const Renewal& renewal, TimePoint now) {
  std::optional<Lease>& slot = renewal.callback ? r.s.callback_lease : r.s.job_lease;
  std::optional<Lease> before;
  if (!swap_in(slot, renewal.held, before)) return;
  if (job_state::renew(r.s, renewal.lease, now) == job_state::Renewed::none) {
    slot = std::move(before);
    return;
  }
  changed(r, to_ms(now));
}

bool SqliteJobStore::renew(const std::string& id, const Lease& lease, TimePoint now) {
  // Queued under the lease lock, so that the writes of whatever ends this lease after (a finish,
  // an attempt) come after this one.
  std::lock_guard<std::mutex> lock(impl_->lease_mutex);
  auto renewal = impl_->renew_held(id, lease, now);
  if (!renewal) return false;
  impl_->change(id, [impl = impl_.get(), renewal = std::move(*renewal), now](Impl::Row& r) {
    impl->apply(r, renewal, now);
  });
  return true;
}

// One write for them all (a server renews every lease it holds each third of a lease).
std::vector<bool> SqliteJobStore::renew_all(
    const std::vector<std::pair<std::string, Lease>>& leases, TimePoint now) {
  std::vector<bool> out;
  out.reserve(leases.size());
  std::vector<Impl::Renewal> renewals;
  std::lock_guard<std::mutex> lock(impl_->lease_mutex);
  for (const auto& [id, lease] : leases) {
    auto renewal = impl_->renew_held(id, lease, now);
    out.push_back(renewal.has_value());
    if (renewal) renewals.push_back(std::move(*renewal));
  }
  if (renewals.empty()) return out;
  Impl* impl = impl_.get();
  impl_->enqueue({[impl, renewals = std::move(renewals), now] {
                    for (const auto& renewal : renewals) {
                      if (Impl::Row* r = impl->load(renewal.id)) impl->apply(*r, renewal, now);
                    }
                  },
                  {},
                  {}});
  return out;
}

void SqliteJobStore::mark_running(const std::string& id, TimePoint now) {
  impl_->change(id, [now](Impl::Row& r) {
    if (job_state::mark_running(r.s, now)) Impl::changed(r, to_ms(now));
  });
}

bool SqliteJobStore::finish_job(const std::string& id, const std::string& holder,
                                const JobOutcome& outcome, const std::optional<Lease>& deliver,
                                TimePoint now) {
  return finish(id, holder, outcome, deliver, now, nullptr);
}

void SqliteJobStore::async_finish_job(const std::string& id, const std::string& holder,
                                      const JobOutcome& outcome,
                                      const std::optional<Lease>& deliver, TimePoint now,
                                      bool want_record, FinishDone done) {
  FinishAnswer answer;
  try {
    answer.held = finish(id, holder, outcome, deliver, now, want_record ? &done : nullptr);
  } catch (...) {
    return done(std::current_exception(), FinishAnswer{});
  }
  // Answered now unless the writer answers it (want_record, held: `done` was moved there).
  if (!want_record || !answer.held) done(nullptr, std::move(answer));
}

JobStore::AnswerThread SqliteJobStore::answer_thread(AsyncCall call,
                                                     bool record_asked) const noexcept {
  const bool writer = call == AsyncCall::put || (call == AsyncCall::finish_job && record_asked);
  return writer ? AnswerThread::store : AnswerThread::caller;
}

bool SqliteJobStore::finish(const std::string& id, const std::string& holder,
                            const JobOutcome& outcome, const std::optional<Lease>& deliver,
                            TimePoint now, FinishDone* done) {
  std::string result = result_text(outcome);
  // Queued under the lease lock, so that a cancellation (which takes the lease under the same
  // lock) is either refused this acknowledgement or queued after its write.
  std::lock_guard<std::mutex> lock(impl_->lease_mutex);
  if (impl_->cancelling.count(id)) return false;
  std::optional<Lease> held = impl_->release(impl_->job_leases, id, holder, now);
  if (!held) return false;
  // With `done`: the record as this write leaves it, for the answer after the commit (the row
  // read whole, its result the caller's; made again by each try of a failed transaction).
  std::shared_ptr<std::optional<JobRecord>> record;
  std::shared_ptr<nlohmann::json> result_json;
  if (done) {
    record = std::make_shared<std::optional<JobRecord>>();
    result_json = std::make_shared<nlohmann::json>(outcome.result);
  }
  auto rule = [held = std::move(held), holder, outcome = outcome_without_result(outcome),
               result = std::move(result), deliver, now, record, result_json](Impl::Row& r) {
    if (record) record->reset();
    std::optional<Lease> before;
    if (!Impl::swap_in(r.s.job_lease, *held, before)) return;
    if (!job_state::finish(r.s, holder, outcome,
                           r.s.record.job.wants_completion_callback() ? deliver : std::nullopt,
                           now)) {
      r.s.job_lease = std::move(before);  // final already (nothing else ends a held lease)
      return;
    }
    r.result_set = true;
    r.result_text = result;  // (copied: a failed transaction applies the write again)
    r.full = false;          // (its result is in result_text now)
    Impl::changed(r, to_ms(now));
    if (record) {
      *record = r.s.record;
      (*record)->outcome.result = *result_json;
      detail::times_as_stored(**record);
    }
  };
  if (deliver) impl_->callback_leases[id] = *deliver;
  if (!done) {
    impl_->change(id, std::move(rule), &impl_->ending_jobs);
    return true;
  }
  // Answered once: with the record when its transaction commits, or, when a transaction fails
  // first (or the store closes failing), at once without one (the lease was held: the write is
  // tried again with the bookkeeping, as finish_job's is, and a waiter reads the job back).
  struct Answer {
    FinishDone done;
    bool given = false;  // (the writer's thread only)
  };
  auto answer = std::make_shared<Answer>(Answer{std::move(*done)});
  Impl* impl = impl_.get();
  try {
    impl_->enqueue_ending(impl_->ending_jobs, id,
                          {[impl, id, rule = std::move(rule)] {
                             if (Impl::Row* r = impl->load(id, true)) rule(*r);
                           },
                           [answer, record] {
                             if (std::exchange(answer->given, true)) return;
                             answer->done(nullptr, FinishAnswer{true, std::move(*record)});
                           },
                           [answer](std::exception_ptr) {
                             if (std::exchange(answer->given, true)) return;
                             answer->done(nullptr, FinishAnswer{true, std::nullopt});
                           }});
  } catch (...) {
    *done = std::move(answer->done);  // (the caller answers the error)
    throw;
  }
  return true;
}

bool SqliteJobStore::record_attempt(const std::string& id, const std::string& holder,
                                    const CallbackInfo& after, TimePoint now,
                                    const std::optional<CallbackAttempt>& attempt) {
  std::lock_guard<std::mutex> lock(impl_->lease_mutex);
  std::optional<Lease> held = impl_->release(impl_->callback_leases, id, holder, now);
  if (!held) return false;
  impl_->change(
      id,
      [held = std::move(held), holder, after, now, attempt](Impl::Row& r) {
        std::optional<Lease> before;
        if (!Impl::swap_in(r.s.callback_lease, *held, before)) return;
        if (attempt && !r.log_read) {
          r.s.record.attempt_log = detail::attempt_log_from_json(r.log_text);
          r.log_read = true;
        }
        if (!job_state::record_attempt(r.s, holder, after, now, attempt)) {
          r.s.callback_lease = std::move(before);
          return;
        }
        if (attempt) r.log_set = true;
        Impl::changed(r, to_ms(now));
      },
      &impl_->ending_callbacks);
  return true;
}

CancelOutcome SqliteJobStore::cancel(const std::string& id, const JobOutcome& outcome,
                                     TimePoint now) {
  Impl* impl = impl_.get();
  std::string result = result_text(outcome);
  // Cancelled, the job holds no lease afterwards; else the lease withheld meanwhile is given back
  // (see `cancelling`): a cancellation whose transaction failed took the holder's lease away, and
  // the job ran again after it.
  struct Done {
    Impl* impl;
    const std::string& id;
    bool cancelled = false;
    ~Done() {
      std::lock_guard<std::mutex> lock(impl->lease_mutex);
      impl->cancelling.erase(id);
      const auto held = impl->withheld.find(id);
      if (held != impl->withheld.end()) {
        if (!cancelled) impl->job_leases.emplace(id, std::move(held->second));
        impl->withheld.erase(held);
      }
      if (cancelled) impl->job_leases.erase(id);
    }
  } done{impl, id};
  const CancelOutcome answer = impl_->write_and_wait<CancelOutcome>(
      [impl, id, outcome = outcome_without_result(outcome), result = std::move(result), now] {
        Impl::Row* r = impl->load(id);
        if (!r) return CancelOutcome::not_found;
        const CancelOutcome answer = job_state::cancel(r->s, outcome, now);
        if (answer == CancelOutcome::cancelled) {
          r->result_set = true;
          r->result_text = result;
          r->full = false;
          Impl::changed(*r, to_ms(now));
        }
        return answer;
      },
      {}, false,
      // Whoever holds the job loses it now: its acknowledgement is refused from here on, and an
      // acknowledgement made before is queued before this write (the job is final then).
      [impl, id] {
        const auto held = impl->job_leases.find(id);
        if (held != impl->job_leases.end()) {
          impl->withheld[id] = std::move(held->second);
          impl->job_leases.erase(held);
        }
        impl->cancelling.insert(id);
      });
  done.cancelled = answer == CancelOutcome::cancelled;
  return answer;
}

RedeliverOutcome SqliteJobStore::redeliver(const std::string& id, const Lease& claim,
                                           TimePoint now) {
  Impl* impl = impl_.get();
  return impl_->write_and_wait<RedeliverOutcome>(
      [impl, id, claim, now] {
        Impl::Row* r = impl->load(id);
        if (!r) return RedeliverOutcome::not_found;
        const RedeliverOutcome answer = job_state::redeliver(r->s, claim, now);
        if (answer == RedeliverOutcome::redelivered) Impl::changed(*r, to_ms(now));
        return answer;
      },
      [impl, id, claim](RedeliverOutcome& outcome) {
        if (outcome != RedeliverOutcome::redelivered) return;
        std::lock_guard<std::mutex> lock(impl->lease_mutex);
        impl->callback_leases[id] = claim;
      });
}

void SqliteJobStore::complete(const std::string& id, const JobOutcome& outcome) {
  std::lock_guard<std::mutex> lock(impl_->lease_mutex);
  impl_->job_leases.erase(id);
  impl_->change(
      id,
      [outcome = outcome_without_result(outcome), result = result_text(outcome),
       at = now_ms()](Impl::Row& r) {
        job_state::complete(r.s, outcome);
        r.result_set = true;
        r.result_text = result;
        r.full = false;
        Impl::changed(r, at);
      },
      &impl_->ending_jobs);
}

void SqliteJobStore::update_callback(const std::string& id, const CallbackInfo& callback) {
  std::lock_guard<std::mutex> lock(impl_->lease_mutex);
  impl_->callback_leases.erase(id);
  impl_->change(
      id,
      [callback, at = now_ms()](Impl::Row& r) {
        job_state::update_callback(r.s, callback);
        Impl::changed(r, at);
      },
      &impl_->ending_callbacks);
}

std::vector<JobRecord> SqliteJobStore::list_failed_callbacks(std::size_t limit) const {
  return impl_->select_list(*impl_->select_failed, limit, "");
}

std::vector<JobRecord> SqliteJobStore::list_failed_callbacks_with_prefix(
    const std::string& id_prefix, std::size_t limit) const {
  return impl_->select_list(*impl_->select_failed, limit, id_prefix);
}

JobPage SqliteJobStore::failed_callbacks_page(const std::string& id_prefix,
                                              const std::optional<ListCursor>& after,
                                              std::size_t limit) const {
  JobPage page;
  if (limit == 0) return page;
  limit = std::min<std::size_t>(limit, 100000);
  // A prefix "tenant/..." is one tenant's: its own index range.
  const auto slash = id_prefix.find('/');
  std::optional<std::string> tenant;
  if (slash != std::string::npos) tenant = id_prefix.substr(0, slash);
  page.jobs = impl_->select_list(
      tenant ? *impl_->select_failed_tenant_page : *impl_->select_failed_page, limit + 1, id_prefix,
      std::make_pair(after ? to_ms(after->created_at) : INT64_MAX, after ? after->id : ""), tenant);
  if (page.jobs.size() > limit) {
    page.jobs.pop_back();
    page.next = ListCursor{page.jobs.back().job.created_at, key_of(page.jobs.back().job)};
  }
  return page;
}

std::optional<QueueStats> SqliteJobStore::queue_stats() const {
  impl_->wait_for_writes();
  std::lock_guard<std::mutex> lock(impl_->db_mutex);
  QueueStats stats;
  try {
    // Queued: the jobs_queued index, one range per priority. Running: the unfinished ones (a
    // bounded set: what is in the queue). Callbacks: the jobs_cb_due index.
    Statement queued(impl_->db,
                     "SELECT priority, COUNT(*), MIN(created_at_ms) FROM jobs WHERE status = 0 "
                     "GROUP BY priority ORDER BY priority");
    while (queued.step()) {
      const auto n = static_cast<std::size_t>(queued.integer(1));
      stats.queued += n;
      stats.queued_by_priority.emplace_back(static_cast<int>(queued.integer(0)), n);
      const TimePoint oldest = from_ms(queued.integer(2));
      if (!stats.oldest_queued || oldest < *stats.oldest_queued) stats.oldest_queued = oldest;
    }
    Statement running(impl_->db,
                      "SELECT COUNT(*) FROM jobs WHERE finished_at_ms IS NULL AND status = 1");
    if (running.step()) stats.running = static_cast<std::size_t>(running.integer(0));
    Statement callbacks(impl_->db, "SELECT COUNT(*) FROM jobs WHERE cb_due_ms IS NOT NULL");
    if (callbacks.step()) stats.callbacks_waiting = static_cast<std::size_t>(callbacks.integer(0));
    Statement failed(impl_->db, "SELECT COUNT(*) FROM jobs WHERE cb_state = 3");
    if (failed.step()) stats.callbacks_failed = static_cast<std::size_t>(failed.integer(0));
  } catch (const std::exception& e) {
    throw StoreUnavailable(std::string("sqlite job store: ") + e.what());
  }
  return stats;
}

JobPage SqliteJobStore::list_jobs(const JobFilter& filter, const std::optional<ListCursor>& after,
                                  std::size_t limit) const {
  JobPage page;
  if (limit == 0) return page;
  limit = std::min<std::size_t>(limit, 10000);
  // An index range (jobs_created) from the cursor down, filtered as it is read, and at most
  // `scan` rows of it a call (the lock is the writer's too): a page may end short, its cursor at
  // the last row read.
  const std::size_t scan = 20 * limit + 1000;
  impl_->wait_for_writes();
  std::lock_guard<std::mutex> lock(impl_->db_mutex);
  std::size_t scanned = 0;
  std::optional<ListCursor> last;
  try {
    // Dead letters have their own index (jobs_failed_page): the bound then counts only them.
    const bool failed_only = filter.callback_state == CallbackState::failed;
    Statement s(impl_->db, std::string("SELECT ") + entry_columns +
                               " FROM jobs WHERE (created_at_ms, id) < (?1, ?2)" +
                               (failed_only ? " AND cb_state = 3" : "") +
                               " ORDER BY created_at_ms DESC, id DESC LIMIT ?3");
    s.bind(1, after ? to_ms(after->created_at) : INT64_MAX);
    s.bind(2, after ? after->id : std::string());
    s.bind(3, static_cast<std::int64_t>(scan));
    while (page.jobs.size() <= limit && s.step()) {
      JobRecord record = read_record(s);
      ++scanned;
      last = ListCursor{record.job.created_at, key_of(record.job)};
      if (filter.matches(record)) page.jobs.push_back(std::move(record));
    }
  } catch (const std::exception& e) {
    throw StoreUnavailable(std::string("sqlite job store: ") + e.what());
  }
  if (page.jobs.size() > limit) {
    page.jobs.pop_back();
    page.next = ListCursor{page.jobs.back().job.created_at, key_of(page.jobs.back().job)};
  } else if (scanned == scan) {
    page.next = last;
  }
  return page;
}

void SqliteJobStore::report_server(const std::string& id, std::size_t leases, TimePoint now) {
  std::lock_guard<std::mutex> lock(impl_->servers_mutex);
  impl_->servers_seen.note(id, leases, now);
}

std::vector<ServerSeen> SqliteJobStore::servers(TimePoint now) const {
  std::lock_guard<std::mutex> lock(impl_->servers_mutex);
  return impl_->servers_seen.list(now);
}

std::vector<JobRecord> SqliteJobStore::list_unfinished(std::size_t limit) const {
  return impl_->select_list(*impl_->select_unfinished, limit);
}

std::optional<std::string> SqliteJobStore::failure() const {
  std::string problem = impl_->file_problem();  // the file as it is now, before the last write
  if (!problem.empty()) return "sqlite job store: " + problem;
  std::lock_guard<std::mutex> lock(impl_->queue_mutex);
  if (!impl_->failure.empty()) {
    impl_->unreported.clear();  // the spell is seen as it is
    return impl_->failure;
  }
  // A spell that began and ended between two looks (a log rebuilt at once): told once.
  if (!impl_->unreported.empty()) return std::exchange(impl_->unreported, {});
  return std::nullopt;
}

std::size_t SqliteJobStore::commits() const {
  std::lock_guard<std::mutex> lock(impl_->queue_mutex);
  return impl_->commit_count;
}

bool disable_sqlite_memory_statistics() noexcept {
  return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0) == SQLITE_OK;
}

std::size_t SqliteJobStore::prune() {
  return prune(std::chrono::system_clock::now());
}

std::size_t SqliteJobStore::prune(std::chrono::system_clock::time_point now) {
  impl_->wait_for_writes();
  return impl_->prune_at(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count());
}

}  // namespace rebound
