// PostgresJobStore: a pool of libpq connections for claims and reads, and writer threads (each
// with its connection; a job's writes in the order they came, never in two open transactions at
// once) that apply the state rules of job_state.hpp to the rows they read, many callers' writes a
// transaction, each row written only if no other transaction changed it since (its xmin).
#include "rebound/store/postgres_job_store.hpp"

#include <fcntl.h>
#include <libpq-fe.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "common/attempt_log.hpp"
#include "common/test_hook.hpp"
#include "rebound/detail/json.hpp"
#include "rebound/detail/redact.hpp"
#include "rebound/error.hpp"
#include "rebound/store/job_state.hpp"
#include "store/postgres_testing.hpp"

namespace rebound {
namespace detail {
namespace {
TestHook<> writer_read_hook;
}  // namespace

void set_postgres_writer_read_hook(std::function<void()> hook) {
  writer_read_hook.set(std::move(hook));
}
}  // namespace detail

namespace {

using TimePoint = std::chrono::system_clock::time_point;
using Clock = std::chrono::steady_clock;

std::int64_t to_ms(TimePoint t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}
TimePoint from_ms(std::int64_t ms) {
  return TimePoint(std::chrono::milliseconds(ms));
}
std::int64_t wall_ms() {
  return to_ms(std::chrono::system_clock::now());
}

// The schema's version this build writes; migrations below bring an older one up to it.
// The writer sends its rows as values of the jobs table's row type (Rows): a migration that adds
// or drops a column of jobs changes that type under every server of an older build still running
// on the database, whose writes then fail (a record of the old width). Such a migration gives the
// writes a composite type of their own first, in a release before it.
constexpr int schema_version = 1;

// The columns of a job's row, in the order every statement below names them. Text for the enums
// (job.hpp's to_string, read back with from_string), milliseconds since the epoch for times.
// job_due_ms, cb_due_ms: job_state::job_due and callback_due (the claims' indexes); finished_ms:
// when job_state::is_finished became true (what the pruning deletes by).
constexpr const char* columns[] = {
    "key",        "tenant",       "id",         "url",          "input",     "created_ms",
    "priority",   "max_queue_ms", "events",     "trace",        "model",     "mver",
    "status",     "started_ms",   "ended_ms",   "result",       "err_code",  "err_msg",
    "cb_state",   "cb_attempts",  "cb_error",   "cb_next_ms",   "cb_da",     "cb_started_ms",
    "cb_prev_ms", "attempts",     "job_holder", "job_until_ms", "cb_holder", "cb_until_ms",
    "job_due_ms", "cb_due_ms",    "finished_ms"};
constexpr std::size_t column_count = sizeof(columns) / sizeof(columns[0]);
// The first column a write after the insert may change (the job's request is never rewritten).
constexpr std::size_t first_mutable = 11;  // mver: the version that ran it (JobOutcome)
// Their types, as PostgreSQL's OIDs (pg_type.h: text, bigint, integer), for the rows the writer
// sends in the binary format (Rows).
constexpr std::uint32_t text_oid = 25, bigint_oid = 20, integer_oid = 23;
constexpr std::uint32_t column_types[] = {
    text_oid,   text_oid,    text_oid,   text_oid,   text_oid,  bigint_oid,  integer_oid,
    bigint_oid, integer_oid, text_oid,   text_oid,   text_oid,  text_oid,    bigint_oid,
    bigint_oid, text_oid,    text_oid,   text_oid,   text_oid,  integer_oid, text_oid,
    bigint_oid, integer_oid, bigint_oid, bigint_oid, text_oid,  text_oid,    bigint_oid,
    text_oid,   bigint_oid,  bigint_oid, bigint_oid, bigint_oid};
static_assert(sizeof(column_types) / sizeof(column_types[0]) == column_count);

// The migrations, by the version each makes. {schema} stands for the quoted schema name.
constexpr const char* migration_1 = R"sql(
CREATE TABLE {schema}.jobs (
  key text COLLATE "C" PRIMARY KEY,
  tenant text COLLATE "C" NOT NULL,
  id text NOT NULL,
  url text NOT NULL,
  input text,
  created_ms bigint NOT NULL,
  priority integer NOT NULL,
  max_queue_ms bigint NOT NULL,
  events integer NOT NULL,
  trace text NOT NULL,
  model text COLLATE "C" NOT NULL,
  mver text COLLATE "C" NOT NULL,
  status text NOT NULL,
  started_ms bigint,
  ended_ms bigint,
  result text,
  err_code text,
  err_msg text,
  cb_state text NOT NULL,
  cb_attempts integer NOT NULL,
  cb_error text NOT NULL,
  cb_next_ms bigint NOT NULL,
  cb_da integer NOT NULL,
  cb_started_ms bigint NOT NULL,
  cb_prev_ms bigint NOT NULL,
  attempts text,
  job_holder text,
  job_until_ms bigint,
  cb_holder text,
  cb_until_ms bigint,
  job_due_ms bigint,
  cb_due_ms bigint,
  finished_ms bigint
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
CREATE INDEX jobs_tenant_due ON {schema}.jobs (tenant, priority, job_due_ms)
  WHERE job_due_ms IS NOT NULL;
CREATE INDEX jobs_cb_due ON {schema}.jobs (cb_due_ms) WHERE cb_due_ms IS NOT NULL;
CREATE INDEX jobs_created ON {schema}.jobs (created_ms, key);
CREATE INDEX jobs_finished ON {schema}.jobs (finished_ms) WHERE finished_ms IS NOT NULL;
CREATE INDEX jobs_failed ON {schema}.jobs (tenant, created_ms, key) WHERE cb_state = 'failed';
CREATE TABLE {schema}.servers (
  id text COLLATE "C" PRIMARY KEY, leases bigint NOT NULL, seen_ms bigint NOT NULL);
CREATE TABLE {schema}.claim_turn (
  one boolean PRIMARY KEY DEFAULT true CHECK (one), tenant text COLLATE "C");
INSERT INTO {schema}.claim_turn (tenant) VALUES (NULL);
CREATE TABLE {schema}.paused_origins (origin text COLLATE "C" PRIMARY KEY);
CREATE TABLE {schema}.model_configs (
  name text COLLATE "C" PRIMARY KEY, config text NOT NULL, generation bigint NOT NULL);
)sql";

// A claim of jobs: the tenants with work due (a skip scan of jobs_tenant_due), each one's
// due jobs by priority then due time (at most $2, those another claim holds skipped, and those of
// the versions skipped: $5, $6), numbered; the turns: the first job of every tenant, starting after
// the tenant the last claim served (claim_turn, shared by every server), then the second ones...
// (job_state::claim_turns); the jobs taken leased to $3 until $4, and the tenant of the last one
// remembered (written only when it changes: one tenant's claims never wait for each other). Each
// job's row is answered after its number and whether its tenant came after the wrap. (Each
// tenant's scan is jobs_tenant_due's order, read no further than the limit: of jobs due at the
// same millisecond, which come first is the index's.) The rows taken are updated through the
// primary key with the keys as an array (`= ANY(ARRAY(...))`), not by a join alone: to the
// planner a table of some thousands of rows looked cheaper to hash whole than to probe a claim's
// rows, and every claim that took work read the whole table. (Both claims.)
// The skip scan names the due time too: an entry not due yet (a lease's end: a job leased, or the
// entry of a row finished since, dead until vacuum removes it) is passed over in the index,
// without a visit to the table. Without it, each step read the table for every entry before the
// first one of a live row: after a burst of 10,000 jobs leased at their put and finished, an
// empty claim visited 10,000 dead rows (benchmarks.md). (Once such a lease's end has passed, its
// dead entry is visited again, until a scan marks it dead or vacuum removes it.)
constexpr const char* claim_jobs_template = R"sql(
WITH RECURSIVE t(tenant) AS (
  (SELECT tenant FROM {jobs} WHERE job_due_ms IS NOT NULL AND job_due_ms <= $1
   ORDER BY tenant LIMIT 1)
  UNION ALL
  SELECT (SELECT j.tenant FROM {jobs} j WHERE j.job_due_ms IS NOT NULL AND j.job_due_ms <= $1
          AND j.tenant > t.tenant ORDER BY j.tenant LIMIT 1)
  FROM t WHERE t.tenant IS NOT NULL),
c AS (
  SELECT c.key, c.tenant, row_number() OVER (PARTITION BY c.tenant
                                             ORDER BY c.priority, c.job_due_ms, c.key) AS pos
  FROM t CROSS JOIN LATERAL (
    SELECT j.key, j.tenant, j.priority, j.job_due_ms FROM {jobs} j
    WHERE j.tenant = t.tenant AND j.job_due_ms IS NOT NULL AND j.job_due_ms <= $1
      AND (cardinality($5::text[]) = 0 OR
           (j.model, j.mver) NOT IN (SELECT * FROM unnest($5::text[], $6::text[])))
    ORDER BY j.priority, j.job_due_ms LIMIT $2 FOR UPDATE SKIP LOCKED) c
  WHERE t.tenant IS NOT NULL),
p AS (
  SELECT c.key, c.tenant, c.pos, (l.tenant IS NOT NULL AND c.tenant <= l.tenant) AS wrapped
  FROM c CROSS JOIN {turn} l
  ORDER BY 3, 4, 2 LIMIT $2),
moved AS (
  UPDATE {turn} AS l SET tenant = x.tenant
  FROM (SELECT tenant FROM p ORDER BY pos DESC, wrapped DESC, tenant DESC LIMIT 1) x
  WHERE l.tenant IS DISTINCT FROM x.tenant RETURNING 1)
UPDATE {jobs} AS j SET job_holder = $3, job_until_ms = $4, job_due_ms = $4
FROM p WHERE j.key = p.key AND j.key = ANY(ARRAY(SELECT key FROM p))
RETURNING p.pos, p.wrapped, )sql";

// A claim of callbacks: the due ones, earliest first, leased to $3 until $4; each answered with
// the time it was due. In jobs_cb_due's order, read no further than the limit: of callbacks due
// at the same millisecond, which come first is the index's (as in the SQLite store). (A second
// key to sort by would read and sort every due callback at each claim: a backlog of them after a
// receiver's outage made each claim cost as much as the backlog.)
constexpr const char* claim_callbacks_template = R"sql(
WITH c AS (
  SELECT key, cb_due_ms AS was FROM {jobs} WHERE cb_due_ms IS NOT NULL AND cb_due_ms <= $1
  ORDER BY cb_due_ms LIMIT $2 FOR UPDATE SKIP LOCKED)
UPDATE {jobs} AS j SET cb_holder = $3, cb_until_ms = $4, cb_due_ms = $4
FROM c WHERE j.key = c.key AND j.key = ANY(ARRAY(SELECT key FROM c))
RETURNING c.was, )sql";

// A limit as a bigint parameter: one past its range (SIZE_MAX, "all") read as its largest value.
std::int64_t bigint_limit(std::size_t limit) {
  return static_cast<std::int64_t>(
      std::min<std::size_t>(limit, std::numeric_limits<std::int64_t>::max()));
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
    text.replace(at, from.size(), to);
    at += to.size();
  }
  return text;
}

// `text` as PostgreSQL's text can hold it: valid UTF-8 without NUL (either replaced by U+FFFD),
// as dump_json writes JSON. Error messages, callback errors and trace headers come from models and
// receivers: one byte the database refuses must not fail a whole transaction of other jobs.
// The length of the well-formed UTF-8 sequence at `i` of `t` (not NUL, not overlong, not a
// surrogate, not past U+10FFFF), or 0.
std::size_t sequence_at(const std::string& t, std::size_t i) {
  const auto c = static_cast<unsigned char>(t[i]);
  const std::size_t n = c == 0             ? 0
                        : c < 0x80         ? 1
                        : (c >> 5) == 0x6  ? 2
                        : (c >> 4) == 0xE  ? 3
                        : (c >> 3) == 0x1E ? 4
                                           : 0;
  if (n == 0 || i + n > t.size()) return 0;
  if (n == 1) return 1;
  std::uint32_t cp = c & (0xFF >> (n + 1));
  for (std::size_t k = 1; k < n; ++k) {
    const auto next = static_cast<unsigned char>(t[i + k]);
    if ((next & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (next & 0x3F);
  }
  const bool overlong = (n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
  return overlong || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF ? 0 : n;
}

std::string clean(std::string text) {
  std::string out;
  bool replaced = false;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = sequence_at(text, i);
    if (n == 0 && !replaced) {
      out.assign(text, 0, i);  // (a clean text is answered as it is, without a copy)
      replaced = true;
    }
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    if (replaced) out.append(text, i, n);
    i += n;
  }
  return replaced ? out : text;
}

// Appends `value` to a Postgres array literal as a quoted element ("b\"c").
void append_element(std::string& out, const std::string& value) {
  out += '"';
  for (const char c : value) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  out += '"';
}

// A Postgres array literal of texts: {"a","b\"c"}.
std::string text_array(const std::vector<std::string>& values) {
  std::string out = "{";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += ',';
    append_element(out, values[i]);
  }
  return out + "}";
}

// Rows gathered column by column, sent as one array a column: `unnest` of small arrays (an update's
// flags and versions).
class Columns {
 public:
  explicit Columns(std::size_t n) : columns_(n) {}
  // Adds a row: its values from `first` on.
  void add(const std::vector<std::optional<std::string>>& row, std::size_t first) {
    for (std::size_t k = 0; k < columns_.size(); ++k) {
      std::string& out = columns_[k];
      out += out.empty() ? '{' : ',';
      const auto& v = row[first + k];
      if (!v) {
        out += "NULL";
      } else {
        append_element(out, *v);
      }
    }
  }
  std::vector<std::optional<std::string>> arrays() const {
    std::vector<std::optional<std::string>> out;
    for (const auto& c : columns_)
      out.emplace_back(c.empty() ? "{}" : c + "}");
    return out;
  }

 private:
  std::vector<std::string> columns_;
};

// Whole rows of the jobs table, sent as one array of the table's row type in PostgreSQL's binary
// format (array_recv of record_recv: each field its type's OID, its length and its bytes): a
// statement of a fixed text whatever the number of rows, one function for Postgres to scan, and
// nothing for it to parse. Measured against the forms before it (batches of 100, PostgreSQL's
// CPU a row): an array a column (33 arrays, each unnested into a tuplestore of its own) cost a
// third of an insert more than one array of rows, and an array of rows in the text format (a
// record literal in an array literal, each field quoted twice) about 5 us a row more to parse.
class Rows {
 public:
  // `row_type`: the OID of the jobs table's row type in this database (Impl::row_type).
  explicit Rows(std::uint32_t row_type) : row_type_(row_type) {}

  // Adds a row: its values in `columns` order, as row_params makes them (integers as decimal
  // text); none: NULL. Texts are made storable (clean) here: a binary parameter is sent as is.
  void add(const std::vector<std::optional<std::string>>& row) {
    if (row.size() != column_count)
      throw StoreUnavailable("postgres job store: a row of " + std::to_string(row.size()) +
                             " columns");
    const std::size_t start = body_.size();
    put32(body_, 0);  // (the record's length, set below)
    put32(body_, static_cast<std::uint32_t>(column_count));
    for (std::size_t k = 0; k < column_count; ++k) {
      put32(body_, column_types[k]);
      const auto& v = row[k];
      if (!v) {
        put32(body_, 0xFFFFFFFFu);  // (-1: NULL)
      } else if (column_types[k] == bigint_oid) {
        put32(body_, 8);
        const auto n = static_cast<std::uint64_t>(integer(*v));
        put32(body_, static_cast<std::uint32_t>(n >> 32));
        put32(body_, static_cast<std::uint32_t>(n));
      } else if (column_types[k] == integer_oid) {
        put32(body_, 4);
        put32(body_, static_cast<std::uint32_t>(static_cast<std::int32_t>(integer(*v))));
      } else {
        const std::string text = clean(*v);
        put32(body_, static_cast<std::uint32_t>(text.size()));
        body_ += text;
      }
    }
    const auto length = static_cast<std::uint32_t>(body_.size() - start - 4);
    for (int i = 0; i < 4; ++i)
      body_[start + i] = static_cast<char>(length >> (24 - 8 * i));
    ++rows_;
  }

  // The array: one dimension of the rows added (none: an empty array).
  std::string array() const {
    std::string out;
    put32(out, rows_ ? 1 : 0);  // dimensions
    put32(out, 0);              // (no NULL element)
    put32(out, row_type_);
    if (rows_) {
      put32(out, rows_);
      put32(out, 1);  // (the first index)
    }
    return out + body_;
  }

 private:
  static void put32(std::string& out, std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8)
      out += static_cast<char>((v >> shift) & 0xFF);
  }
  // A column's integer as row_params wrote it (std::to_string: always one).
  static std::int64_t integer(const std::string& text) {
    std::int64_t n = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (error != std::errc() || end != text.data() + text.size())
      throw StoreUnavailable("postgres job store: not an integer: " + text);
    return n;
  }

  std::uint32_t row_type_;
  std::uint32_t rows_ = 0;
  std::string body_;
};

bool valid_schema(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  if (!(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// One statement's parameters: texts, or NULL.
using Params = std::vector<std::optional<std::string>>;

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, ResultDeleter>;

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
    s.pop_back();
  return s;
}

// One libpq connection, opened at its first use and again after it broke. Every statement has a
// deadline: one unanswered in time is cancelled and its connection closed.
class Connection {
 public:
  // `prepared`: the statements with parameters are prepared (named, once a connection) and run
  // prepared (PostgresJobStoreOptions::prepared_statements).
  Connection(std::string conninfo, std::chrono::milliseconds timeout, bool prepared)
      : conninfo_(std::move(conninfo)), timeout_(timeout), prepare_(prepared) {}
  ~Connection() { close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Since when the statement under way has waited (ms of the steady clock; 0: none under way).
  std::int64_t busy_since() const { return busy_since_.load(std::memory_order_relaxed); }

  // Runs one statement with parameters (the extended protocol; unnamed, so that nothing stays on
  // the server between transactions, unless statements are prepared). The first `binary`
  // parameters are in PostgreSQL's binary format (Rows), sent as they are; the others are texts.
  Result exec(const std::string& sql, const Params& params = {}, std::size_t binary = 0) {
    sqlstate_.clear();  // (a statement that fails before the server answers has none)
    open();
    // Every text made storable (clean): what a model, a receiver or a caller put in an error, a
    // header or an id is stored with U+FFFD for what PostgreSQL refuses (a NUL, bytes that are
    // not UTF-8), and a read for such a key finds nothing rather than failing.
    std::vector<std::string> texts;
    texts.reserve(params.size());
    std::vector<const char*> values;
    values.reserve(params.size());
    std::vector<int> lengths(params.size(), 0), formats(params.size(), 0);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      texts.push_back(!p ? std::string() : i < binary ? std::string() : clean(*p));
      if (i < binary && p) {
        lengths[i] = static_cast<int>(p->size());
        formats[i] = 1;
      }
    }
    for (std::size_t i = 0; i < params.size(); ++i)
      values.push_back(!params[i] ? nullptr : i < binary ? params[i]->data() : texts[i].c_str());
    Busy busy(*this);
    const auto deadline = Clock::now() + timeout_;
    const int n = static_cast<int>(values.size());
    const std::string* name = prepare_ ? prepared(sql, n, deadline) : nullptr;
    const int sent = name ? PQsendQueryPrepared(pg_, name->c_str(), n, values.data(),
                                                lengths.data(), formats.data(), 0)
                          : PQsendQueryParams(pg_, sql.c_str(), n, nullptr, values.data(),
                                              lengths.data(), formats.data(), 0);
    if (!sent) fail("cannot send");
    flush(deadline);
    return collect(deadline);
  }

  // The SQLSTATE of the error the server answered the last statement with ("" when none, or
  // when the statement failed otherwise).
  const std::string& sqlstate() const { return sqlstate_; }

  // Runs statements without parameters, several at once ("BEGIN; SET LOCAL ..."): the simple
  // protocol.
  Result exec_simple(const std::string& sql) {
    sqlstate_.clear();
    open();
    Busy busy(*this);
    return send_simple(sql);
  }

  void close() {
    if (pg_) PQfinish(pg_);
    pg_ = nullptr;
    prepared_.clear();  // (a server's prepared statements end with its session)
  }

  // Whether a session is open (kept from an earlier call, or opened by this one).
  bool is_open() const { return pg_ != nullptr; }

  // The socket to wait on for notifications (LISTEN), or -1 while closed.
  int socket() const { return pg_ ? PQsocket(pg_) : -1; }

  // Reads what the socket holds and answers how many notifications (LISTEN) came with another
  // payload than `own`, freeing them all. Throws StoreUnavailable (closing the connection) when
  // it was lost.
  std::size_t notifications(const std::string& own) {
    if (!pg_) return 0;
    if (!PQconsumeInput(pg_)) fail("connection lost");
    std::size_t n = 0;
    while (PGnotify* note = PQnotifies(pg_)) {
      if (own != note->extra) ++n;
      PQfreemem(note);
    }
    if (PQstatus(pg_) != CONNECTION_OK) fail("connection lost");
    return n;
  }

 private:
  // The name `sql` is prepared under on this connection, preparing it first (its parse and analysis
  // are the server's once a session, not once a call); null past max_prepared distinct texts,
  // which then run unnamed.
  const std::string* prepared(const std::string& sql, int params, Clock::time_point deadline) {
    const auto known = prepared_.find(sql);
    if (known != prepared_.end()) return &known->second;
    if (prepared_.size() >= max_prepared) return nullptr;
    std::string name = "rebound_" + std::to_string(prepared_.size() + 1);
    if (!PQsendPrepare(pg_, name.c_str(), sql.c_str(), params, nullptr)) fail("cannot send");
    flush(deadline);
    collect(deadline);  // (throws, closing the connection, when the server refuses it)
    return &prepared_.emplace(sql, std::move(name)).first->second;
  }

  // The store's statements with parameters are a few dozen texts; more are not kept.
  static constexpr std::size_t max_prepared = 64;

  struct Busy {
    explicit Busy(Connection& c) : c(c) {
      c.busy_since_.store(
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
                  .count() |
              1,
          std::memory_order_relaxed);
    }
    ~Busy() { c.busy_since_.store(0, std::memory_order_relaxed); }
    Connection& c;
  };

  void open() {
    if (pg_ && PQstatus(pg_) == CONNECTION_OK) return;
    close();
    pg_ = PQconnectdb(conninfo_.c_str());
    if (PQstatus(pg_) != CONNECTION_OK) {
      const std::string why = trimmed(PQerrorMessage(pg_));
      close();
      throw StoreUnavailable("postgres job store: cannot connect: " + why);
    }
    // The server's notices ("... already exists, skipping") are not for the process's stderr.
    PQsetNoticeProcessor(
        pg_, [](void*, const char*) {}, nullptr);
    // Sending never blocks either: a statement larger than the socket's buffer is written as the
    // server reads it, within the statement's deadline (flush).
    if (PQsetnonblocking(pg_, 1) != 0) fail("cannot make the connection non-blocking");
    // Prepared statements are planned for the values of each call, as unnamed ones are: a
    // generic plan knows neither a claim's limit nor the size of a batch's arrays. (And a session
    // a pooler hands back holds none of this store's names from before.)
    if (prepare_) send_simple("SET plan_cache_mode = force_custom_plan; DEALLOCATE ALL");
  }

  // Sends statements without parameters on the open connection and reads their answer, within
  // the timeout.
  Result send_simple(const std::string& sql) {
    const auto deadline = Clock::now() + timeout_;
    if (!PQsendQuery(pg_, sql.c_str())) fail("cannot send");
    flush(deadline);
    return collect(deadline);
  }

  // Waits for `events` on the socket until `deadline`; past it the connection is closed (no
  // cancel request: that would be a new connection to a server that may not answer it either)
  // and the call fails. The server ends a transaction's statement by itself (SET LOCAL
  // statement_timeout, and idle_in_transaction_session_timeout once the client is gone).
  void wait_for(short events, Clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      close();
      throw StoreUnavailable("postgres job store: no answer within " +
                             std::to_string(timeout_.count()) + " ms (connection closed)");
    }
    pollfd fd{PQsocket(pg_), events, 0};
    const int ready = ::poll(&fd, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (ready < 0 && errno != EINTR) fail("poll");
    if (ready > 0 && (fd.revents & (POLLIN | POLLERR | POLLHUP)) && !PQconsumeInput(pg_))
      fail("connection lost");
  }

  // Writes what libpq holds of the statement sent.
  void flush(Clock::time_point deadline) {
    for (;;) {
      const int left = PQflush(pg_);
      if (left == 0) return;
      if (left < 0) fail("cannot send");
      wait_for(POLLOUT | POLLIN, deadline);
    }
  }

  [[noreturn]] void fail(const std::string& what) {
    const std::string why = pg_ ? trimmed(PQerrorMessage(pg_)) : std::string();
    close();
    throw StoreUnavailable("postgres job store: " + what + (why.empty() ? "" : ": " + why));
  }

  // Reads every result of the statement(s) sent, waiting at most the timeout; the last result
  // that carries rows (or the last) is answered, the first error thrown.
  Result collect(Clock::time_point deadline) {
    Result answer;
    std::string error;
    sqlstate_.clear();
    for (;;) {
      while (PQisBusy(pg_))
        wait_for(POLLIN, deadline);
      Result r(PQgetResult(pg_));
      if (!r) break;
      const auto status = PQresultStatus(r.get());
      if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
        if (error.empty()) error = trimmed(PQresultErrorMessage(r.get()));
        if (error.empty()) error = PQresStatus(status);
        if (const char* code = PQresultErrorField(r.get(), PG_DIAG_SQLSTATE);
            sqlstate_.empty() && code)
          sqlstate_ = code;
      } else if (!answer || status == PGRES_TUPLES_OK) {
        answer = std::move(r);
      }
    }
    if (PQstatus(pg_) != CONNECTION_OK) fail("connection lost");
    if (!error.empty()) {
      // A transaction left in an unknown state is not reused: the next use opens a fresh one.
      close();
      throw StoreUnavailable("postgres job store: " + error);
    }
    return answer;
  }

  std::string conninfo_;
  std::chrono::milliseconds timeout_;
  bool prepare_ = false;
  std::unordered_map<std::string, std::string> prepared_;  // statement text -> its name
  PGconn* pg_ = nullptr;
  std::atomic<std::int64_t> busy_since_{0};
  std::string sqlstate_;
};

// Reading a result's fields.
bool is_null(const PGresult* r, int row, int col) {
  return PQgetisnull(r, row, col) != 0;
}
std::string text_at(const PGresult* r, int row, int col) {
  return std::string(PQgetvalue(r, row, col), static_cast<std::size_t>(PQgetlength(r, row, col)));
}
std::int64_t int_at(const PGresult* r, int row, int col) {
  if (is_null(r, row, col)) return 0;
  return std::strtoll(PQgetvalue(r, row, col), nullptr, 10);
}

// A row's fields by column (in `columns` order): as read (a statement's result), or as the
// writer wrote them (its parameters, kept in memory: Impl::remember).
struct ResultFields {
  const PGresult* r;
  int row;
  int first;
  bool null(int i) const { return is_null(r, row, first + i); }
  std::string text(int i) const { return text_at(r, row, first + i); }
  std::int64_t integer(int i) const { return int_at(r, row, first + i); }
};
struct ParamFields {
  const Params& p;
  bool null(int i) const { return !p[static_cast<std::size_t>(i)]; }
  std::string text(int i) const {
    return null(i) ? std::string() : *p[static_cast<std::size_t>(i)];
  }
  std::int64_t integer(int i) const {
    return null(i) ? 0 : std::strtoll(p[static_cast<std::size_t>(i)]->c_str(), nullptr, 10);
  }
};

// What the database holds is what this store wrote, but a shared database is not trusted to be
// well formed: a JSON text is read with a request's bounds, anything else as null.
template <class Fields>
nlohmann::json json_of(const Fields& f, int i) {
  if (f.null(i)) return nullptr;
  nlohmann::json out;
  if (detail::parse_untrusted_json(f.text(i), out, SIZE_MAX) != detail::JsonParseError::none)
    return nullptr;
  return out;
}

// A row (its columns in `columns` order from `first`) as a stored job, and the time it finished.
struct Row {
  StoredJob s;
  std::optional<std::int64_t> finished_ms;
};

template <class Fields>
Row row_of(const Fields& f) {
  Row out;
  JobRecord& rec = out.s.record;
  rec.job.tenant = f.text(1);
  rec.job.id = f.text(2);
  rec.job.callback_url = f.text(3);
  rec.job.input = json_of(f, 4);
  rec.job.created_at = from_ms(f.integer(5));
  rec.job.priority = static_cast<int>(f.integer(6));
  rec.job.max_queue = std::chrono::milliseconds(f.integer(7));
  rec.job.webhook_events = static_cast<std::uint8_t>(f.integer(8));
  rec.job.traceparent = f.text(9);
  rec.job.model.name = f.text(10);
  rec.job.model.version = f.text(11);
  rec.status = from_string<JobStatus>(f.text(12)).value_or(JobStatus::failed);
  if (!f.null(13)) rec.started_at = from_ms(f.integer(13));
  if (!f.null(14)) rec.outcome.finished_at = from_ms(f.integer(14));
  if (rec.status == JobStatus::succeeded) rec.outcome.result = json_of(f, 15);
  if (!f.null(16)) rec.outcome.error = ErrorInfo{f.text(16), f.text(17)};
  CallbackInfo& cb = rec.callback;
  cb.state = from_string<CallbackState>(f.text(18)).value_or(CallbackState::none);
  cb.attempts = static_cast<int>(f.integer(19));
  cb.last_error = f.text(20);
  cb.next_attempt_at = from_ms(f.integer(21));
  cb.delivery_attempts = static_cast<int>(f.integer(22));
  cb.delivery_started_at = from_ms(f.integer(23));
  cb.previous_delay = std::chrono::milliseconds(f.integer(24));
  if (!f.null(25)) rec.attempt_log = detail::attempt_log_from_json(f.text(25));
  if (!f.null(26)) out.s.job_lease = Lease{f.text(26), from_ms(f.integer(27))};
  if (!f.null(28)) out.s.callback_lease = Lease{f.text(28), from_ms(f.integer(29))};
  if (!f.null(32)) out.finished_ms = f.integer(32);
  return out;
}

Row read_row(const PGresult* r, int row, int first = 0) {
  return row_of(ResultFields{r, row, first});
}

JobRecord read_record(const PGresult* r, int row, int first = 0) {
  return std::move(read_row(r, row, first).s.record);
}

std::optional<std::string> ms_param(const std::optional<TimePoint>& t) {
  if (!t) return std::nullopt;
  return std::to_string(to_ms(*t));
}

// Which of a row's columns row_params gives (the others NULL).
enum class RowColumns {
  all,
  changeable,  // the key and those an update may change (first_mutable on: the request's never)
  as_read,     // all but input and result: what the writer's read gives of a row it compares not
};

// A stored job as its row's parameters, in `columns` order; `finished_ms` as the row keeps it.
Params row_params(const StoredJob& s, std::optional<std::int64_t> finished_ms,
                  RowColumns which = RowColumns::all) {
  const JobRecord& rec = s.record;
  const Job& job = rec.job;
  Params p;
  p.reserve(column_count);
  p.emplace_back(key_of(job));
  if (which != RowColumns::changeable) {
    p.emplace_back(job.tenant);
    p.emplace_back(job.id);
    p.emplace_back(job.callback_url);
    if (which == RowColumns::all) {
      p.emplace_back(detail::dump_json(job.input));
    } else {
      p.emplace_back(std::nullopt);
    }
    p.emplace_back(std::to_string(to_ms(job.created_at)));
    p.emplace_back(std::to_string(job.priority));
    p.emplace_back(std::to_string(job.max_queue.count()));
    p.emplace_back(std::to_string(job.webhook_events));
    p.emplace_back(job.traceparent);
    p.emplace_back(job.model.name);
  } else {
    p.resize(first_mutable);
  }
  p.emplace_back(job.model.version);
  p.emplace_back(std::string(to_string(rec.status)));
  p.push_back(rec.started_at == TimePoint{} ? std::nullopt
                                            : ms_param(std::optional<TimePoint>(rec.started_at)));
  p.push_back(rec.outcome.finished_at == TimePoint{}
                  ? std::nullopt
                  : ms_param(std::optional<TimePoint>(rec.outcome.finished_at)));
  if (rec.status == JobStatus::succeeded && !rec.outcome.result.is_null() &&
      which != RowColumns::as_read) {
    p.emplace_back(detail::dump_json(rec.outcome.result));
  } else {
    p.emplace_back(std::nullopt);
  }
  if (rec.outcome.error) {
    p.emplace_back(rec.outcome.error->code);
    p.emplace_back(rec.outcome.error->message);
  } else {
    p.emplace_back(std::nullopt);
    p.emplace_back(std::nullopt);
  }
  const CallbackInfo& cb = rec.callback;
  p.emplace_back(std::string(to_string(cb.state)));
  p.emplace_back(std::to_string(cb.attempts));
  p.emplace_back(cb.last_error);
  p.emplace_back(std::to_string(to_ms(cb.next_attempt_at)));
  p.emplace_back(std::to_string(cb.delivery_attempts));
  p.emplace_back(std::to_string(to_ms(cb.delivery_started_at)));
  p.emplace_back(std::to_string(cb.previous_delay.count()));
  if (rec.attempt_log.empty()) {
    p.emplace_back(std::nullopt);
  } else {
    p.emplace_back(detail::attempt_log_to_json(rec.attempt_log));
  }
  if (s.job_lease) {
    p.emplace_back(s.job_lease->holder);
    p.emplace_back(std::to_string(to_ms(s.job_lease->until)));
  } else {
    p.emplace_back(std::nullopt);
    p.emplace_back(std::nullopt);
  }
  if (s.callback_lease) {
    p.emplace_back(s.callback_lease->holder);
    p.emplace_back(std::to_string(to_ms(s.callback_lease->until)));
  } else {
    p.emplace_back(std::nullopt);
    p.emplace_back(std::nullopt);
  }
  p.push_back(ms_param(job_state::job_due(s)));
  p.push_back(ms_param(job_state::callback_due(s)));
  p.push_back(finished_ms ? std::optional<std::string>(std::to_string(*finished_ms))
                          : std::nullopt);
  return p;
}

// The select list of every column, and the one for a listing (no input, result or attempts).
std::string column_list(const char* table_alias = nullptr) {
  std::string out;
  for (std::size_t i = 0; i < column_count; ++i) {
    if (i) out += ", ";
    if (table_alias) out += std::string(table_alias) + ".";
    out += columns[i];
  }
  return out;
}

std::string listing_columns() {
  std::string out;
  for (std::size_t i = 0; i < column_count; ++i) {
    if (i) out += ", ";
    const std::string c = columns[i];
    out += (c == "input" || c == "result" || c == "attempts") ? "NULL" : c;
  }
  return out;
}

// Where a job's key ends its tenant ("tenant/..."): the tenant a prefix is confined to, if any.
std::optional<std::string> tenant_of_prefix(const std::string& prefix) {
  const auto slash = prefix.find('/');
  if (slash == std::string::npos) return std::nullopt;
  return prefix.substr(0, slash);
}

}  // namespace

PostgresJobStoreOptions parse_postgres_uri(std::string_view uri) {
  const bool ok = uri.rfind("postgresql://", 0) == 0 || uri.rfind("postgres://", 0) == 0;
  if (!ok) throw Error("store '" + detail::redacted_uri(uri) + "': not a postgresql:// URI");
  PostgresJobStoreOptions options;
  const auto flag = [&](const std::string& name, const std::string& value) {
    if (value != "0" && value != "1" && value != "true" && value != "false") {
      throw Error("store '" + detail::redacted_uri(uri) + "': " + name +
                  " must be 1, 0, true or false");
    }
    return value == "1" || value == "true";
  };
  std::string rest(uri);
  const auto q = rest.find('?');
  if (q != std::string::npos) {
    std::string query = rest.substr(q + 1);
    rest.erase(q);
    std::string kept;
    std::size_t at = 0;
    while (at <= query.size()) {
      const auto amp = query.find('&', at);
      const std::string pair = query.substr(at, amp == std::string::npos ? amp : amp - at);
      if (pair.rfind("schema=", 0) == 0) {
        options.schema = pair.substr(7);
      } else if (pair.rfind("prepared=", 0) == 0) {
        options.prepared_statements = flag("prepared", pair.substr(9));
      } else if (pair.rfind("notify=", 0) == 0) {
        options.notify = flag("notify", pair.substr(7));
      } else if (pair.rfind("writers=", 0) == 0) {
        const std::string value = pair.substr(8);
        const bool digits = !value.empty() && value.size() <= 2 &&
                            value.find_first_not_of("0123456789") == std::string::npos;
        const int writers = digits ? std::stoi(value) : 0;
        if (writers < 1 || writers > 64)
          throw Error("store '" + detail::redacted_uri(uri) + "': writers must be 1 to 64");
        options.writers = static_cast<std::size_t>(writers);
      } else if (!pair.empty()) {
        kept += (kept.empty() ? "" : "&") + pair;
      }
      if (amp == std::string::npos) break;
      at = amp + 1;
    }
    if (!kept.empty()) rest += "?" + kept;
  }
  if (!valid_schema(options.schema)) {
    throw Error("store '" + detail::redacted_uri(uri) +
                "': schema must be 1 to 63 letters, digits or '_', not starting with a digit");
  }
  options.conninfo = rest;
  return options;
}

struct PostgresJobStore::Impl {
  // A write for the writer's transaction.
  struct Op {
    enum Kind { put, mark, finish, attempt, renew, cancel, redeliver, complete, set_callback };
    Op(Kind k, std::string id) : kind(k), key(std::move(id)) {}
    Kind kind;
    std::string key;
    std::uint64_t seq = 0;  // its place in the queue of writes
    Job job;                // put
    std::optional<Lease> lease;
    std::string holder;
    JobOutcome outcome;
    CallbackInfo callback;
    std::optional<CallbackAttempt> attempt_made;
    TimePoint now{};
    // The answer (a PutOutcome, a bool, a CancelOutcome, a RedeliverOutcome) or the error.
    std::function<void(std::exception_ptr, int)> done;
    // A finish that answers the record it wrote: filled in by the op's rule (each try).
    std::shared_ptr<std::optional<JobRecord>> record;
  };

  PostgresJobStoreOptions options;
  std::string conninfo;
  std::string schema;  // quoted
  std::string jobs;    // the quoted table names
  // The OID of the jobs table's row type, read once the schema is migrated (before any write):
  // the type of the rows the writer sends (Rows). (PostgreSQL checks the type of each field of a
  // row, not the array's: a table made again with the same columns, which has another OID, takes
  // the same rows.)
  std::atomic<std::uint32_t> row_type{0};
  std::string begin_bounded;  // BEGIN, with the timeouts
  std::string begin_writer;   // ... and the writer's planner settings

  // The pool for the calling threads' claims and reads.
  mutable std::mutex pool_mutex;
  mutable std::condition_variable pool_free;
  mutable std::vector<std::unique_ptr<Connection>> idle;
  mutable std::size_t opened = 0;
  mutable std::vector<Connection*> all;  // for failure(): every connection, the writer's too

  // The writers: threads, each with a connection, that take the queued writes into their
  // transactions. A second transaction starts beside one under way only when a quarter of a full
  // one is waiting (a transaction costs Postgres about a millisecond of CPU whatever it holds:
  // parsing, planning, round trips), and never with the writes of a job whose earlier writes are
  // in the other: a job's writes are made in the order they came, and two writers of this store
  // never touch the same row at once.
  struct Writer {
    std::unique_ptr<Connection> connection;
    std::thread thread;
    std::unordered_set<std::string> keys;  // of the ops in its transaction under way
    bool stalled = false;  // found only other writers' jobs queued: waits for one to end
  };
  std::mutex write_mutex;
  std::condition_variable write_wanted;
  std::deque<Op> pending;
  bool stopping = false;
  std::vector<std::unique_ptr<Writer>> writers;
  std::size_t writing = 0;     // writers with a transaction under way
  std::uint64_t enqueued = 0;  // ops queued so far (each op's seq)
  std::uint64_t transactions_ended = 0;
  // Reads see the marks (mark_running, whose callers do not wait) issued before them: the marks
  // queued or in a transaction, by their seq.
  std::set<std::uint64_t> marks_open;
  std::condition_variable marks_written;
  std::atomic<std::size_t> commits{0};
  std::atomic<std::size_t> retried{0};  // transactions made again (commit_notifying)
  // The writers' memory of rows they wrote (remember, recall): a row's next write in a few
  // seconds (a callback's end after the finish that leased it to this server, a finish after the
  // put of a job this server runs) takes it from here rather than reading it.
  struct Remembered {
    Params row;  // its columns as stored (clean), as the writer's read would give them (as_read)
    std::string version;  // its xmin after the write
    Clock::time_point until;
    std::list<std::string>::iterator at;  // in remembered_order
    std::size_t bytes = 0;
  };
  std::mutex remembered_mutex;
  std::unordered_map<std::string, Remembered> remembered;
  std::list<std::string> remembered_order;  // oldest first
  std::size_t remembered_bytes = 0;
  std::atomic<std::size_t> recalled_rows{0};
  // Bounds: a row is remembered for 5 s, at most 16,384 rows and 16 MiB (the oldest forgotten
  // first), none larger than 16 KiB (a long attempt log). A row takes about 1.3 KiB as counted:
  // 16 MiB holds the rows of the 10,000 jobs a server takes in at once by default (the queue's
  // capacity). 4,096 rows and 4 MiB (about 3,200 rows) were too few for submissions of 1,000
  // jobs a request with callbacks: the oldest were forgotten before their next write, which read
  // them (1.4 rows read a job).
  static constexpr auto remember_for = std::chrono::seconds(5);
  static constexpr std::size_t max_remembered = 16384, max_remembered_bytes = 16 << 20,
                               max_remembered_row = 16 << 10;
  static constexpr std::size_t remembered_overhead = 160;  // a map node, a list node, the entry
  // The pruner.
  std::unique_ptr<Connection> prune_connection;
  std::thread pruner;
  std::mutex prune_mutex;  // pruner_stopping
  std::condition_variable prune_wake;
  bool pruner_stopping = false;
  std::mutex prune_run_mutex;  // one prune at a time (the thread's, or a caller's prune())
  std::atomic<Clock::time_point> next_prune{Clock::now()};

  // Wake-ups (options.notify): the writer's commit that notifies (its payload this store's
  // random name, so that its own listener leaves it), and the listener: a thread and a
  // connection of its own, stopped through a pipe its waits also watch.
  std::string own_name;
  std::string notify_commit_sql;
  std::string listen_sql;
  std::unique_ptr<Connection> listen_connection;
  std::thread listener;
  int listener_stop[2] = {-1, -1};
  std::mutex watch_mutex;  // watchers; held while they are called
  std::map<std::uint64_t, std::function<void()>> watchers;
  std::uint64_t next_watch = 1;

  // The claims' statements.
  std::string claim_jobs_sql;
  std::string claim_callbacks_sql;
  std::string insert_sql;
  std::string versions_sql;
  std::string update_sql;
  std::string writer_select_sql;
  std::string writer_lock_sql;
  std::string get_many_sql;  // (get's too: made once, not at each read)

  mutable std::mutex failure_mutex;
  mutable std::optional<std::string> failure;

  explicit Impl(PostgresJobStoreOptions o) : options(std::move(o)) {
    if (!valid_schema(options.schema)) throw Error("postgres job store: schema name not allowed");
    conninfo = options.conninfo;
    const bool is_uri =
        conninfo.rfind("postgres", 0) == 0 && conninfo.find("://") != std::string::npos;
    // A bounded connect, and texts exchanged as UTF-8 whatever the database's encoding.
    for (const char* setting : {"connect_timeout=2", "client_encoding=UTF8"}) {
      const std::string name = std::string(setting).substr(0, std::string(setting).find('='));
      if (conninfo.find(name) != std::string::npos) continue;
      if (is_uri) {
        conninfo += (conninfo.find('?') == std::string::npos ? "?" : "&");
        conninfo += setting;
      } else {
        conninfo += std::string(" ") + setting;
      }
    }
    if (options.prune_interval.count() <= 0) options.prune_interval = std::chrono::seconds(1);
    schema = "\"" + options.schema + "\"";
    jobs = schema + ".jobs";
    // The channel: letters, digits and '_' (the schema's), so it is written into the statements
    // as it is; at most 63 bytes, as PostgreSQL's names.
    const std::string channel = ("rebound_" + options.schema).substr(0, 63);
    std::random_device random;
    for (int i = 0; i < 4; ++i) {
      char part[9];
      std::snprintf(part, sizeof part, "%08x", static_cast<unsigned>(random()));
      own_name += part;
    }
    notify_commit_sql = "SELECT pg_notify('" + channel + "', '" + own_name + "'); COMMIT";
    listen_sql = "LISTEN \"" + channel + "\"";
    // Every transaction bounds its statements on the server too, and ends by itself when its
    // client stops talking in the middle of it (a paused or cut-off server must not keep its
    // rows locked until TCP gives up, which would hide them from every other server's claims).
    // READ COMMITTED whatever the role's or database's default: the writer's update re-reads a
    // row another transaction changed meanwhile and finds its version moved; at a stricter level
    // it would fail instead (40001). (The claims are statements of their own, at the database's
    // level: operations.md asks for READ COMMITTED, PostgreSQL's default.)
    const std::string ms = std::to_string(options.statement_timeout.count());
    begin_bounded = "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = " + ms +
                    "; SET LOCAL idle_in_transaction_session_timeout = " + ms;
    // The writer's rows found by key, one index probe each: every statement of its transactions
    // names its rows by key, and to the planner a table of some thousands of rows looked cheaper
    // to read whole than to probe a batch's keys (a batch of 125 finishes read all 9,000 rows of
    // the table twice: the read, and the update's hash join on a sequential scan; with only that
    // scan off, a hash join on the whole primary key): each transaction's cost grew with the jobs
    // kept. No JIT either: a plan's cost past its threshold (a disabled path counts 1e10) would
    // compile each statement, tens of milliseconds for one that takes one.
    begin_writer = begin_bounded +
                   "; SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off"
                   "; SET LOCAL enable_mergejoin = off; SET LOCAL jit = off";
    if (options.connections == 0) options.connections = 1;
    if (options.max_batch == 0) options.max_batch = 1;
    options.writers = std::clamp<std::size_t>(options.writers, 1, 64);
    for (std::size_t i = 0; i < options.writers; ++i) {
      auto w = std::make_unique<Writer>();
      w->connection = std::make_unique<Connection>(conninfo, options.statement_timeout,
                                                   options.prepared_statements);
      all.push_back(w->connection.get());
      writers.push_back(std::move(w));
    }
    prune_connection = std::make_unique<Connection>(conninfo, options.statement_timeout,
                                                    options.prepared_statements);
    claim_jobs_sql = sql(claim_jobs_template) + column_list("j");
    // The writer's two writes: the new rows, and the rows changed (their columns from mver on).
    // Rows travel as arrays of the table's own row type (Rows): `columns` is the table's column
    // order, which each migration keeps (a column added goes last, in both).
    insert_sql = "INSERT INTO " + jobs + " (" + column_list() +
                 ") SELECT * FROM unnest($1::" + jobs +
                 "[]) ON CONFLICT (key) DO NOTHING RETURNING key, xmin::text";
    update_sql = "UPDATE " + jobs + " AS j SET ";
    for (std::size_t k = first_mutable; k < column_count; ++k) {
      const std::string c = columns[k];
      update_sql +=
          (k == first_mutable ? "" : ", ") + c + " = " +
          (c == "result" ? "CASE WHEN v.result_set THEN v.result ELSE j.result END" : "v." + c);
    }
    // A row is written only as the version read (its xmin; NULL: inserted by this transaction):
    // one another transaction changed meanwhile is left out of the keys answered.
    update_sql += " FROM unnest($1::" + jobs + "[], $2::boolean[], $3::text[]) AS v(" +
                  column_list() +
                  ", result_set, version) WHERE j.key = v.key AND (v.version IS NULL OR "
                  "j.xmin = v.version::xid) RETURNING j.key, j.xmin::text";
    // The writer's read: input only for the keys of $2, result never.
    writer_select_sql = "SELECT ";
    for (std::size_t k = 0; k < column_count; ++k) {
      const std::string c = columns[k];
      writer_select_sql +=
          (k ? ", " : "") + (c == "input"    ? "CASE WHEN key = ANY($2::text[]) THEN input END"
                             : c == "result" ? std::string("NULL")
                                             : c);
    }
    // (and the row's version, xmin, after the columns). Without a lock: a row lock is a write of
    // the row (WAL, a dirtied page) that the update after it writes again; the update checks the
    // version instead. The locking form is for a transaction made again after a row changed under
    // it, or after a deadlock (commit_notifying).
    writer_select_sql += ", xmin::text FROM " + jobs + " WHERE key = ANY($1::text[]) ORDER BY key";
    writer_lock_sql = writer_select_sql + " FOR UPDATE";
    // The rows of $1 that are still the versions of $2 (one index probe a key).
    versions_sql =
        "SELECT j.key FROM unnest($1::text[], $2::text[]) AS v(key, version) CROSS JOIN "
        "LATERAL (SELECT key FROM " +
        jobs + " WHERE jobs.key = v.key AND jobs.xmin = v.version::xid LIMIT 1) AS j";
    claim_callbacks_sql = sql(claim_callbacks_template) + column_list("j");
    // One index probe an id, whatever the planner thinks of the table: `key = ANY(...)` of a
    // hundred ids read a table of some thousands of rows whole (the writer's read did), and a join
    // could be a hash join on it; a LATERAL subquery with a LIMIT is a nested loop.
    get_many_sql = "SELECT j.* FROM unnest($1::text[]) AS k(key) CROSS JOIN LATERAL (SELECT " +
                   column_list() + " FROM " + jobs + " WHERE jobs.key = k.key LIMIT 1) AS j";
  }

  std::string sql(const std::string& text) const {
    return replace_all(replace_all(text, "{jobs}", jobs), "{turn}", schema + ".claim_turn");
  }

  void noted(const std::exception& e) const {
    std::lock_guard<std::mutex> lock(failure_mutex);
    failure = e.what();
  }
  void worked() const {
    std::lock_guard<std::mutex> lock(failure_mutex);
    failure.reset();
  }

  // Runs `use` with a connection of the pool; a failure is noted (failure()) and thrown.
  template <typename Use>
  auto with_connection(Use&& use) const -> decltype(use(std::declval<Connection&>())) {
    std::unique_ptr<Connection> c;
    {
      std::unique_lock<std::mutex> lock(pool_mutex);
      pool_free.wait(lock, [&] { return !idle.empty() || opened < options.connections; });
      if (!idle.empty()) {
        c = std::move(idle.back());
        idle.pop_back();
      } else {
        c = std::make_unique<Connection>(conninfo, options.statement_timeout,
                                         options.prepared_statements);
        all.push_back(c.get());
        ++opened;
      }
    }
    struct Back {
      const Impl& impl;
      std::unique_ptr<Connection>& c;
      ~Back() {
        std::lock_guard<std::mutex> lock(impl.pool_mutex);
        impl.idle.push_back(std::move(c));
        impl.pool_free.notify_one();
      }
    } back{*this, c};
    try {
      auto answer = use(*c);
      worked();
      return answer;
    } catch (const StoreUnavailable& e) {
      noted(e);
      throw;
    }
  }

  // The schema, made or brought up to date under a transaction's advisory lock (no session
  // state): servers that start together wait for each other here.
  void migrate() {
    with_connection([&](Connection& c) {
      c.exec_simple(begin_bounded);
      c.exec("SELECT pg_advisory_xact_lock(hashtext($1))", {"rebound schema " + options.schema});
      c.exec_simple("CREATE SCHEMA IF NOT EXISTS " + schema + "; CREATE TABLE IF NOT EXISTS " +
                    schema + ".meta (version integer NOT NULL)");
      Result r = c.exec("SELECT version FROM " + schema + ".meta");
      int version = PQntuples(r.get()) > 0 ? static_cast<int>(int_at(r.get(), 0, 0)) : 0;
      if (version > schema_version) {
        c.exec_simple("ROLLBACK");
        throw Error("postgres job store: schema " + options.schema + " is of version " +
                    std::to_string(version) + ", newer than this build's " +
                    std::to_string(schema_version));
      }
      if (version < 1) c.exec_simple(replace_all(migration_1, "{schema}", schema));
      if (version == 0) {
        c.exec("INSERT INTO " + schema + ".meta (version) VALUES ($1)",
               {std::to_string(schema_version)});
      } else if (version < schema_version) {
        c.exec("UPDATE " + schema + ".meta SET version = $1", {std::to_string(schema_version)});
      }
      read_row_type(c);
      c.exec_simple("COMMIT");
      return 0;
    });
  }

  // The OID of the jobs table's row type, the type of the rows the writer sends (Rows).
  void read_row_type(Connection& c) {
    Result type = c.exec("SELECT $1::regtype::oid", {jobs});
    row_type = static_cast<std::uint32_t>(int_at(type.get(), 0, 0));
  }

  // ---- The writer ----

  void enqueue(Op op) {
    {
      std::unique_lock<std::mutex> lock(write_mutex);
      if (stopping) {
        lock.unlock();
        auto error = std::make_exception_ptr(StoreUnavailable("postgres job store: closed"));
        answer(op, error, 0);
        return;
      }
      // Keyed as stored (clean): a key PostgreSQL cannot hold is the U+FFFD form of it throughout.
      op.key = clean(std::move(op.key));
      op.seq = ++enqueued;
      if (op.kind == Op::mark) marks_open.insert(op.seq);
      pending.push_back(std::move(op));
      // (A writer that waits beside one writing would not start yet: not woken for nothing.)
      if (writing > 0 && pending.size() < second_writer_at()) return;
    }
    write_wanted.notify_one();
  }

  // The writes waiting that start a transaction beside one under way: a quarter of a full one.
  std::size_t second_writer_at() const { return std::max<std::size_t>(1, options.max_batch / 4); }

  // Waits until the marks issued before now are written (or failed): what a read does first.
  void wait_for_marks() const {
    auto& self = const_cast<Impl&>(*this);
    std::unique_lock<std::mutex> lock(self.write_mutex);
    const std::uint64_t target = self.enqueued;
    self.marks_written.wait_for(lock, options.statement_timeout * 2, [&] {
      return self.marks_open.empty() || *self.marks_open.begin() > target || self.stopping;
    });
  }

  // Makes `op` answer a future, and returns it.
  static std::future<int> promised(Op& op) {
    auto promise = std::make_shared<std::promise<int>>();
    op.done = [promise](std::exception_ptr error, int answer) {
      if (error) {
        promise->set_exception(error);
      } else {
        promise->set_value(answer);
      }
    };
    return promise->get_future();
  }

  // Enqueues `op` and waits for its answer.
  int write_and_wait(Op op) {
    auto answer = promised(op);
    enqueue(std::move(op));
    return answer.get();
  }

  // The ops of the calls that have a synchronous and an asynchronous form.
  static Op put_op(const Job& job, const std::optional<Lease>& claim) {
    Op op(Op::put, key_of(job));
    op.job = job;
    // As it will be stored, so that putting it again compares alike (clean).
    op.job.id = clean(std::move(op.job.id));
    op.job.tenant = clean(std::move(op.job.tenant));
    op.job.callback_url = clean(std::move(op.job.callback_url));
    op.lease = claim;
    return op;
  }
  static Op finish_op(const std::string& id, const std::string& holder, const JobOutcome& outcome,
                      const std::optional<Lease>& deliver, TimePoint now) {
    Op op(Op::finish, id);
    op.holder = holder;
    op.outcome = outcome;
    // As it will be stored (clean), so that the record a finish answers reads as get reads it.
    if (op.outcome.error) {
      op.outcome.error->code = clean(std::move(op.outcome.error->code));
      op.outcome.error->message = clean(std::move(op.outcome.error->message));
    }
    op.outcome.ran_on_version = clean(std::move(op.outcome.ran_on_version));
    op.lease = deliver;
    op.now = now;
    return op;
  }
  static Op attempt_op(const std::string& id, const std::string& holder, const CallbackInfo& after,
                       TimePoint now, const std::optional<CallbackAttempt>& attempt) {
    Op op(Op::attempt, id);
    op.holder = holder;
    op.callback = after;
    op.now = now;
    op.attempt_made = attempt;
    return op;
  }
  static Op renew_op(const std::string& id, const Lease& lease, TimePoint now) {
    Op op(Op::renew, id);
    op.lease = lease;
    op.now = now;
    return op;
  }

  // Calls an op's `done`, which must not throw (one that does is not the store's failure, and
  // must not cost the rest of its batch their answers).
  static void answer(Op& op, std::exception_ptr error, int value) noexcept {
    if (!op.done) return;
    try {
      op.done(error, value);
    } catch (...) {
    }
  }

  // The bytes a put brings to its transaction, about (its input and texts): a batch stops short of
  // 16 MiB of them, which a connection sends well within the statement timeout.
  static std::size_t put_bytes(const Op& op) {
    return op.kind == Op::put ? detail::json_footprint(op.job.input) + op.job.callback_url.size() +
                                    op.key.size() + 256
                              : 64;
  }

  // Takes into `batch` the queued ops this writer may write now: in the order they came, skipping
  // those of a job another writer's transaction holds (and so every later op of that job), at most
  // max_batch and about 16 MiB of new jobs.
  void take(Writer& w, std::deque<Op>& batch) {
    const auto held_elsewhere = [&](const std::string& key) {
      for (const auto& other : writers) {
        if (other.get() != &w && other->keys.count(key)) return true;
      }
      return false;
    };
    std::deque<Op> skipped;
    std::size_t bytes = 0;
    auto it = pending.begin();
    for (; it != pending.end() && batch.size() < options.max_batch; ++it) {
      if (held_elsewhere(it->key)) {
        skipped.push_back(std::move(*it));
        continue;
      }
      if (!batch.empty() && bytes + put_bytes(*it) > (std::size_t{16} << 20)) break;
      bytes += put_bytes(*it);
      w.keys.insert(it->key);
      batch.push_back(std::move(*it));
    }
    pending.erase(pending.begin(), it);
    for (auto back = skipped.rbegin(); back != skipped.rend(); ++back)
      pending.push_front(std::move(*back));
  }

  void run_writer(Writer& w) {
    std::unique_lock<std::mutex> lock(write_mutex);
    // What this writer last found nothing to take in (all of it another writer's jobs): it waits
    // for something new before it looks again.
    std::uint64_t looked_enqueued = 0, looked_ended = 0;
    bool found_nothing = false;
    for (;;) {
      write_wanted.wait(lock, [&] {
        if (stopping && pending.empty()) return true;
        if (pending.empty()) return false;
        if (found_nothing && enqueued == looked_enqueued && transactions_ended == looked_ended)
          return false;
        // Alone, or beside another transaction when a quarter of a full one waits.
        return writing == 0 || pending.size() >= second_writer_at() || stopping;
      });
      if (pending.empty() && stopping) return;
      std::deque<Op> batch;
      take(w, batch);
      if (batch.empty()) {
        found_nothing = w.stalled = true;
        looked_enqueued = enqueued;
        looked_ended = transactions_ended;
        continue;
      }
      found_nothing = w.stalled = false;
      ++writing;
      const bool closing = stopping;
      lock.unlock();
      std::exception_ptr error;
      std::vector<int> answers;
      try {
        answers = commit_notifying(*w.connection, batch);
        ++commits;
        worked();
      } catch (const StoreUnavailable& e) {
        noted(e);
        error = std::current_exception();
      } catch (const std::exception& e) {
        StoreUnavailable wrapped(std::string("postgres job store: ") + e.what());
        noted(wrapped);
        error = std::make_exception_ptr(wrapped);
      }
      if (error) {
        // The marks (whose callers do not wait) go again with the next transaction (before any
        // later op of their jobs, which were not taken while these were out).
        lock.lock();
        for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
          if (it->kind == Op::mark && pending.size() < 100000) pending.push_front(std::move(*it));
        }
        lock.unlock();
        if (!closing) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (batch[i].kind == Op::mark && error) continue;
        answer(batch[i], error, error ? 0 : answers[i]);
      }
      lock.lock();
      // (A mark that failed counts as written for the reads waiting: it goes again later.)
      for (const Op& op : batch) {
        if (op.kind == Op::mark) marks_open.erase(op.seq);
      }
      w.keys.clear();
      --writing;
      ++transactions_ended;
      marks_written.notify_all();
      // (This writer takes what is queued next itself: another is woken only when it stalled on
      // this one's jobs, and its flag cleared, so that it looks again once and is not woken after
      // every later transaction. Waking one for nothing after every transaction cost a context
      // switch a transaction, and handed the next transaction to the other thread and connection.)
      bool wake = false;
      for (auto& other : writers)
        wake = std::exchange(other->stalled, false) || wake;
      if (wake) write_wanted.notify_all();
      if (stopping && error) {
        // Closing on a failing database: what is left cannot be written.
        std::deque<Op> left = std::move(pending);
        pending.clear();
        marks_open.clear();
        lock.unlock();
        for (Op& op : left)
          answer(op, error, 0);
        return;
      }
    }
  }

  struct Entry {
    StoredJob s;
    std::optional<std::int64_t> finished_ms;
    bool exists = false;      // a row in the table (loaded, or inserted by this transaction)
    bool dirty = false;       // to be written
    bool result_set = false;  // its result written by an op (else the stored one stays: not read)
    std::size_t inserted_by = SIZE_MAX;  // the put that inserted it in this transaction
    std::optional<std::string> version;  // its xmin as read (none: inserted by this transaction)
    std::optional<std::string> written;  // its xmin once this transaction wrote it
    bool recalled = false;               // taken from the writers' memory (recall), not read
  };

  // One transaction for `batch` (commit), made again when it could not be made as it was:
  // - a row it read changed (or went) before its update wrote it (another server's writer or
  //   cancel, a claim, the pruner): rolled back, and made again with every row it reads locked
  //   (`FOR UPDATE`, in key order), on which nothing else can write before the commit;
  // - PostgreSQL ended it for a deadlock (40P01) or a serialization failure (40001): two servers'
  //   writers whose updates took the same rows' locks in different orders (an update locks in the
  //   order its plan visits the rows). Nothing of it was written; made again the same way, up to
  //   twice;
  // - its NOTIFY (options.notify) was refused for PostgreSQL's full notification queue (54000,
  //   at the commit): once more without it (a lost wake-up costs the other servers a poll, not the
  //   writes).
  std::vector<int> commit_notifying(Connection& c, std::deque<Op>& batch) {
    bool notify = options.notify, locked = false;
    int conflicts = 0;
    for (;;) {
      try {
        if (auto answers = commit(c, batch, notify, locked)) return *answers;
        if (locked)
          throw StoreUnavailable("postgres job store: a locked row changed under its update");
        locked = true;
        ++retried;
      } catch (const StoreUnavailable&) {
        const std::string state = c.sqlstate();
        if (notify && state == "54000") {
          notify = false;
        } else if ((state == "40P01" || state == "40001") && conflicts < 2) {
          ++conflicts;
          ++retried;
          locked = true;
        } else {
          throw;
        }
      }
    }
  }

  // One try of a transaction for `batch`: the puts inserted, the rows the others touch read
  // (`locked`: for update), each op applied in order by job_state's rules, the changed rows
  // written (each only as the version read), committed. The answers, one per op, in order; none
  // when a row changed between its read and its update (the transaction rolled back).
  std::optional<std::vector<int>> commit(Connection& c, std::deque<Op>& batch, bool notify,
                                         bool locked) {
    std::vector<int> answers(batch.size(), 0);
    std::map<std::string, Entry> rows;
    for (Op& op : batch) {
      if (op.record) op.record->reset();  // (what a try rolled back wrote)
    }
    begin(c);
    try {
      // 1. The puts, each key once (in key order, so that two servers' transactions lock alike).
      std::map<std::string, std::size_t> puts;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (batch[i].kind == Op::put) puts.emplace(batch[i].key, i);
      }
      // Inserts the rows of `wanted` (key -> its first put); those inserted join `rows`, the
      // others (taken already) are answered by the row read below.
      const auto insert = [&](const std::map<std::string, std::size_t>& wanted) {
        Rows values(row_type);
        for (const auto& [key, i] : wanted)
          values.add(row_params(job_state::created(batch[i].job, batch[i].lease), std::nullopt));
        Result r = c.exec(insert_sql, {values.array()}, 1);
        for (int row = 0; row < PQntuples(r.get()); ++row) {
          const auto i = wanted.at(text_at(r.get(), row, 0));
          Entry e;
          e.s = job_state::created(batch[i].job, batch[i].lease);
          e.exists = true;
          e.inserted_by = i;
          e.written = text_at(r.get(), row, 1);
          rows.emplace(batch[i].key, std::move(e));
        }
      };
      if (!puts.empty()) insert(puts);
      // 2. The rows the rest touch (those not in `rows` yet), each with its version. Their input
      // is read only where a put must compare its request with the stored one, their result
      // never (an op that ends the job writes one; the others leave it as stored): a renewal or
      // an attempt does not move a job's input or result through the connection, nor rewrite
      // the result.
      // A locked try reads every row (what it recalled may be why the try before failed).
      if (!locked) recall(batch, rows);
      for (int pass = 0; pass < 3; ++pass) {
        std::vector<std::string> keys, compared;
        for (const Op& op : batch) {
          if (rows.count(op.key)) continue;
          keys.push_back(op.key);
          if (op.kind == Op::put || op.record) compared.push_back(op.key);
        }
        std::sort(keys.begin(), keys.end());
        keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
        if (keys.empty()) break;
        Result r = c.exec(locked ? writer_lock_sql : writer_select_sql,
                          {text_array(keys), text_array(compared)});
        for (int row = 0; row < PQntuples(r.get()); ++row) {
          Row read = read_row(r.get(), row);
          Entry e;
          e.s = std::move(read.s);
          e.finished_ms = read.finished_ms;
          e.exists = true;
          e.version = text_at(r.get(), row, static_cast<int>(column_count));
          rows.emplace(text_at(r.get(), row, 0), std::move(e));
        }
        forget_other_versions(rows);
        // A put whose key was taken when it was inserted, and deleted (pruned) before it was
        // read: inserted again.
        std::map<std::string, std::size_t> again;
        for (const auto& [key, i] : puts) {
          if (!rows.count(key)) again.emplace(key, i);
        }
        if (again.empty()) break;
        insert(again);
      }
      if (!locked) detail::writer_read_hook();
      // 3. The rules, and 4. the rows changed, one statement, each only as the version read.
      for (std::size_t i = 0; i < batch.size(); ++i)
        answers[i] = apply(batch[i], i, rows);
      // A recalled row is checked by its update's version; one that no op changed is checked by
      // a read of its version (its ops' answers came from memory): changed, the transaction is
      // made again reading it.
      if (!unchanged_as_recalled(c, rows) || !write(c, rows)) {
        // A row another transaction changed or deleted after it was read: nothing of this one
        // stays (its rows are unlocked before any is locked again, in key order: no deadlock with
        // a writer that waits for one of them).
        forget_recalled(rows);
        c.exec_simple("ROLLBACK");
        return std::nullopt;
      }
      // 5. The commit, with one NOTIFY when a row it leaves may be claimed now by any server.
      c.exec_simple(notify && claimable_now(batch, rows) ? notify_commit_sql : "COMMIT");
    } catch (...) {
      forget_all();  // (begin: a connection lost)
      c.close();     // (the transaction ends with the connection)
      throw;
    }
    remember(rows);
    return answers;
  }

  // Begins a writer's transaction. A kept connection that broke while it was idle (the database
  // restarted, a pooler or a firewall closed it) fails at once at this first statement, before
  // anything of the transaction was sent: opened again, once. (A second writer idle through a
  // restart would otherwise fail the first transaction it takes after it with store_unavailable.)
  // One that fails later, or slowly (a frozen database: the timeout), is not tried again here.
  // A writer's connection lost forgets the rows remembered (remember; here, and where a
  // transaction fails): it may be a failover that lost the last commits, whose transaction ids
  // the new primary then gives again, so that a remembered version could match a row another
  // transaction wrote.
  void begin(Connection& c) {
    const bool kept = c.is_open();
    const auto started = Clock::now();
    try {
      c.exec_simple(begin_writer);
    } catch (const StoreUnavailable&) {
      if (!kept || !c.sqlstate().empty() || Clock::now() - started > options.statement_timeout / 10)
        throw;
      c.close();
      forget_all();
      c.exec_simple(begin_writer);
    }
  }

  // Writes the dirty rows of `rows` in one statement, each only if it is still the version read:
  // whether all were (none changed or deleted since).
  bool write(Connection& c, std::map<std::string, Entry>& rows) {
    std::vector<std::pair<const std::string*, Entry*>> dirty;
    for (auto& [key, e] : rows) {
      if (e.dirty) dirty.emplace_back(&key, &e);
    }
    if (dirty.empty()) return true;
    Rows values(row_type);
    Columns flags(2);
    for (auto& [key, e] : dirty) {
      const bool was_finished = e->finished_ms.has_value();
      if (job_state::is_finished(e->s.record)) {
        if (!was_finished) e->finished_ms = wall_ms();
      } else {
        e->finished_ms.reset();
      }
      // (the request's columns, never rewritten, go as NULL: a job's input is not sent again)
      values.add(row_params(e->s, e->finished_ms, RowColumns::changeable));
      flags.add({e->result_set ? "t" : "f", e->version}, 0);
    }
    Params params{values.array()};
    for (auto& a : flags.arrays())
      params.push_back(std::move(a));
    Result r = c.exec(update_sql, params, 1);
    const int n = PQntuples(r.get());
    for (int row = 0; row < n; ++row) {
      const auto it = rows.find(text_at(r.get(), row, 0));
      if (it != rows.end()) it->second.written = text_at(r.get(), row, 1);
    }
    return static_cast<std::size_t>(n) == dirty.size();
  }

  // Whether every row taken from memory that no op changed is still the version remembered.
  bool unchanged_as_recalled(Connection& c, const std::map<std::string, Entry>& rows) {
    std::vector<std::string> keys, versions;
    for (const auto& [key, e] : rows) {
      if (!e.recalled || e.dirty) continue;
      keys.push_back(key);
      versions.push_back(*e.version);
    }
    if (keys.empty()) return true;
    Result r = c.exec(versions_sql, {text_array(keys), text_array(versions)});
    return static_cast<std::size_t>(PQntuples(r.get())) == keys.size();
  }

  // ---- The writers' memory of the rows they wrote ----
  //
  // A row is remembered after the commit that wrote it when it is to be written again (its job or
  // its callback not ended) and nobody else is to change it for as long as it is remembered: each
  // of its due times (a claim's, job_state's job_due and callback_due: a lease's end, a retry's
  // time) after that. A row changed meanwhile all the same (another server's cancel, a clock far
  // ahead) fails its update's version check, and the transaction is made again with every row
  // read and locked; a row that no op changed has its version read (unchanged_as_recalled: its
  // answers came from memory). So what a transaction decides on a row is always on the row as
  // stored.

  void remember(const std::map<std::string, Entry>& rows) {
    const TimePoint horizon =
        std::chrono::system_clock::now() + remember_for + std::chrono::seconds(1);
    std::vector<std::pair<std::string, Remembered>> keep;
    std::vector<std::string> drop;
    for (const auto& [key, e] : rows) {
      if (!e.written) continue;
      // (a job ended with its callback is written again only by a redelivery: not remembered)
      const auto job = job_state::job_due(e.s), callback = job_state::callback_due(e.s);
      if (e.finished_ms || (job && *job <= horizon) || (callback && *callback <= horizon)) {
        drop.push_back(key);
        continue;
      }
      Remembered r;
      r.row = row_params(e.s, e.finished_ms, RowColumns::as_read);
      for (auto& v : r.row) {
        if (!v) continue;
        *v = clean(std::move(*v));
        r.bytes += v->size() + sizeof(std::string);
      }
      r.bytes += 2 * key.size() + remembered_overhead;  // (the key twice, the nodes)
      if (r.bytes > max_remembered_row) {
        drop.push_back(key);
        continue;
      }
      r.version = *e.written;
      keep.emplace_back(key, std::move(r));
    }
    std::lock_guard<std::mutex> lock(remembered_mutex);
    // (Taken under the lock: the order of remembered_order is the order of the times.)
    const auto now = Clock::now(), until = now + remember_for;
    for (const auto& key : drop)
      forget(key);
    for (auto& [key, r] : keep) {
      forget(key);
      r.until = until;
      r.at = remembered_order.insert(remembered_order.end(), key);
      remembered_bytes += r.bytes;
      remembered.emplace(key, std::move(r));
    }
    while (remembered.size() > max_remembered || remembered_bytes > max_remembered_bytes) {
      const std::string oldest = remembered_order.front();
      forget(oldest);
    }
    // The rows past their time go at each write (the list is in the order of their times: each
    // remembered for the same while), so that the memory of a burst is given back.
    while (!remembered_order.empty()) {
      const auto it = remembered.find(remembered_order.front());
      if (it == remembered.end() || it->second.until > now) break;
      forget(it);
    }
  }

  // Takes the rows of `batch`'s ops from memory where it has them, into `rows`: not those an op
  // compares with its request (a put, a finish that answers the record: they need the input).
  void recall(const std::deque<Op>& batch, std::map<std::string, Entry>& rows) {
    std::set<std::string> read;
    for (const Op& op : batch) {
      if (op.kind == Op::put || op.record) read.insert(op.key);
    }
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(remembered_mutex);
    if (remembered.empty()) return;
    for (const Op& op : batch) {
      if (rows.count(op.key) || read.count(op.key)) continue;
      const auto it = remembered.find(op.key);
      if (it == remembered.end()) continue;
      if (it->second.until <= now) {
        forget(op.key);
        continue;
      }
      Row row = row_of(ParamFields{it->second.row});
      Entry e;
      e.s = std::move(row.s);
      e.finished_ms = row.finished_ms;
      e.exists = true;
      e.version = it->second.version;
      e.recalled = true;
      rows.emplace(op.key, std::move(e));
      ++recalled_rows;
    }
  }

  // Forgets the rows remembered at another version than the one `rows` read (changed since).
  void forget_other_versions(const std::map<std::string, Entry>& rows) {
    std::lock_guard<std::mutex> lock(remembered_mutex);
    if (remembered.empty()) return;
    for (const auto& [key, e] : rows) {
      if (e.recalled || !e.version) continue;
      const auto it = remembered.find(key);
      if (it != remembered.end() && it->second.version != *e.version) forget(key);
    }
  }

  void forget_all() {
    std::lock_guard<std::mutex> lock(remembered_mutex);
    remembered.clear();
    remembered_order.clear();
    remembered_bytes = 0;
  }

  // Forgets the rows of a transaction that did not commit that it took from memory (one of them
  // may be why).
  void forget_recalled(const std::map<std::string, Entry>& rows) {
    std::lock_guard<std::mutex> lock(remembered_mutex);
    for (const auto& [key, e] : rows) {
      if (e.recalled) forget(key);
    }
  }

  void forget(const std::string& key) {  // (under remembered_mutex)
    const auto it = remembered.find(key);
    if (it != remembered.end()) forget(it);
  }
  void forget(std::unordered_map<std::string, Remembered>::iterator it) {
    remembered_bytes -= it->second.bytes;
    remembered_order.erase(it->second.at);
    remembered.erase(it);
  }

  // Whether a row that `batch` inserted or changed is work any server may claim now: a job put
  // unclaimed, a lease handed back (or run out), a callback due (job_state's due times). Now is the
  // latest of the wall clock and the batch's times (a test's clock may run ahead).
  static bool claimable_now(const std::deque<Op>& batch, const std::map<std::string, Entry>& rows) {
    TimePoint now = std::chrono::system_clock::now();
    for (const Op& op : batch)
      now = std::max({now, op.now, op.kind == Op::put ? op.job.created_at : now});
    for (const auto& [key, e] : rows) {
      if (!e.dirty && e.inserted_by == SIZE_MAX) continue;
      const auto job = job_state::job_due(e.s);
      const auto callback = job_state::callback_due(e.s);
      if ((job && *job <= now) || (callback && *callback <= now)) return true;
    }
    return false;
  }

  static bool wants_callback(const StoredJob& s) {
    return s.record.job.wants_completion_callback();
  }

  // One op by job_state's rules on the rows of its transaction: its answer.
  int apply(Op& op, std::size_t index, std::map<std::string, Entry>& rows) {
    auto it = rows.find(op.key);
    Entry* e = it == rows.end() ? nullptr : &it->second;
    // A job put later in this batch is not there yet for the ops queued before its put.
    if (e && e->inserted_by != SIZE_MAX && index < e->inserted_by) e = nullptr;
    switch (op.kind) {
      case Op::put:
        if (!e) return static_cast<int>(PutOutcome::conflict);  // (cannot happen: read above)
        if (e->inserted_by == index) return static_cast<int>(PutOutcome::created);
        return static_cast<int>(job_state::put_again(e->s, op.job));
      case Op::mark:
        if (e && job_state::mark_running(e->s, op.now)) e->dirty = true;
        return 0;
      case Op::finish:
        if (!e || !job_state::finish(e->s, op.holder, op.outcome,
                                     wants_callback(e->s) ? op.lease : std::nullopt, op.now))
          return 0;
        e->dirty = true;
        e->result_set = true;
        if (op.record) {
          *op.record = e->s.record;
          detail::times_as_stored(**op.record);
        }
        return 1;
      case Op::attempt:
        if (!e || !job_state::record_attempt(e->s, op.holder, op.callback, op.now, op.attempt_made))
          return 0;
        e->dirty = true;
        return 1;
      case Op::renew: {
        if (!e) return 0;
        const auto renewed = job_state::renew(e->s, *op.lease, op.now);
        if (renewed == job_state::Renewed::none) return 0;
        e->dirty = true;
        return 1;
      }
      case Op::cancel: {
        if (!e) return static_cast<int>(CancelOutcome::not_found);
        const auto answer = job_state::cancel(e->s, op.outcome, op.now);
        if (answer == CancelOutcome::cancelled) e->dirty = e->result_set = true;
        return static_cast<int>(answer);
      }
      case Op::redeliver: {
        if (!e) return static_cast<int>(RedeliverOutcome::not_found);
        const auto answer = job_state::redeliver(e->s, *op.lease, op.now);
        if (answer == RedeliverOutcome::redelivered) e->dirty = true;
        return static_cast<int>(answer);
      }
      case Op::complete:
        if (e) {
          job_state::complete(e->s, op.outcome);
          e->dirty = e->result_set = true;
        }
        return 0;
      case Op::set_callback:
        if (e) {
          job_state::update_callback(e->s, op.callback);
          e->dirty = true;
        }
        return 0;
    }
    return 0;
  }

  // ---- Claims and reads ----

  std::vector<JobRecord> claim_jobs(std::size_t max, const Lease& lease, TimePoint now,
                                    const std::vector<ModelRef>& skip) {
    if (max == 0) return {};
    std::vector<std::string> skip_models, skip_versions;
    for (const ModelRef& m : skip) {
      skip_models.push_back(m.name);
      skip_versions.push_back(m.version);
    }

    const std::string& text = claim_jobs_sql;
    const Params params{std::to_string(to_ms(now)),
                        std::to_string(bigint_limit(max)),
                        lease.holder,
                        std::to_string(to_ms(lease.until)),
                        text_array(skip_models),
                        text_array(skip_versions)};
    struct Taken {
      std::int64_t pos;
      bool wrapped;
      JobRecord record;
    };
    std::vector<Taken> taken = with_connection([&](Connection& c) {
      Result r = c.exec(text, params);
      std::vector<Taken> out;
      for (int row = 0; row < PQntuples(r.get()); ++row) {
        out.push_back({int_at(r.get(), row, 0), text_at(r.get(), row, 1) == "t",
                       read_record(r.get(), row, 2)});
      }
      return out;
    });
    // The order of the turns (the statement's answer comes in any order).
    std::sort(taken.begin(), taken.end(), [&](const Taken& a, const Taken& b) {
      if (a.pos != b.pos) return a.pos < b.pos;
      if (a.wrapped != b.wrapped) return !a.wrapped;
      return a.record.job.tenant < b.record.job.tenant;
    });
    std::vector<JobRecord> out;
    out.reserve(taken.size());
    for (auto& t : taken)
      out.push_back(std::move(t.record));
    return out;
  }

  std::vector<JobRecord> claim_callbacks(std::size_t max, const Lease& lease, TimePoint now) {
    if (max == 0) return {};
    const std::string& text = claim_callbacks_sql;
    struct Taken {
      std::int64_t was;
      JobRecord record;
    };
    std::vector<Taken> taken = with_connection([&](Connection& c) {
      Result r = c.exec(text, {std::to_string(to_ms(now)), std::to_string(bigint_limit(max)),
                               lease.holder, std::to_string(to_ms(lease.until))});
      std::vector<Taken> out;
      for (int row = 0; row < PQntuples(r.get()); ++row)
        out.push_back({int_at(r.get(), row, 0), read_record(r.get(), row, 1)});
      return out;
    });
    std::sort(taken.begin(), taken.end(), [](const Taken& a, const Taken& b) {
      return a.was != b.was ? a.was < b.was : key_of(a.record.job) < key_of(b.record.job);
    });
    std::vector<JobRecord> out;
    for (auto& t : taken)
      out.push_back(std::move(t.record));
    return out;
  }

  std::vector<JobRecord> records(const std::string& text, const Params& params) const {
    wait_for_marks();
    return with_connection([&](Connection& c) {
      Result r = c.exec(text, params);
      std::vector<JobRecord> out;
      for (int row = 0; row < PQntuples(r.get()); ++row)
        out.push_back(read_record(r.get(), row));
      return out;
    });
  }

  // A page newest first of the rows that `where` (with `params`) picks, after `after`.
  JobPage page(std::string where, Params params, const std::optional<ListCursor>& after,
               std::size_t limit) const {
    JobPage out;
    if (limit == 0) return out;
    limit = std::min<std::size_t>(limit, 100000);  // (as SqliteJobStore: limit + 1 must not wrap)
    if (after) {
      where += " AND (created_ms, key) < ($" + std::to_string(params.size() + 1) + "::bigint, $" +
               std::to_string(params.size() + 2) + "::text)";
      params.push_back(std::to_string(to_ms(after->created_at)));
      params.push_back(after->id);
    }
    params.push_back(std::to_string(limit + 1));
    const std::string text = "SELECT " + listing_columns() + " FROM " + jobs + " WHERE " + where +
                             " ORDER BY created_ms DESC, key DESC LIMIT $" +
                             std::to_string(params.size()) + "::bigint";
    out.jobs = records(text, params);
    if (out.jobs.size() > limit) {
      out.jobs.resize(limit);
      const JobRecord& last = out.jobs.back();
      out.next = ListCursor{std::chrono::floor<std::chrono::milliseconds>(last.job.created_at),
                            key_of(last.job)};
    }
    return out;
  }

  // A page of the listing (list_jobs): as page, but reading at most 20 x limit + 1,000 rows of
  // jobs_created a call (as SqliteJobStore), so that a filter that matches few jobs of many never
  // scans the whole table in one statement; a page may then hold fewer than `limit` entries and
  // still have a `next` (where the reading stopped).
  JobPage bounded_page(const std::string& where, Params params,
                       const std::optional<ListCursor>& after, std::size_t limit) const {
    JobPage out;
    if (limit == 0) return out;
    limit = std::min<std::size_t>(limit, 10000);  // (as SqliteJobStore: the scan must not wrap)
    if (where == "TRUE") return page(where, std::move(params), after, limit);  // (no filter)
    std::string range = "TRUE";
    if (after) {
      range = "(created_ms, key) < ($" + std::to_string(params.size() + 1) + "::bigint, $" +
              std::to_string(params.size() + 2) + "::text)";
      params.push_back(std::to_string(to_ms(after->created_at)));
      params.push_back(after->id);
    }
    const std::size_t scan = 20 * limit + 1000;
    params.push_back(std::to_string(scan));
    const std::string text = "SELECT " + listing_columns() + ", (" + where + ") FROM " + jobs +
                             " WHERE " + range + " ORDER BY created_ms DESC, key DESC LIMIT $" +
                             std::to_string(params.size()) + "::bigint";
    wait_for_marks();
    return with_connection([&](Connection& c) {
      Result r = c.exec(text, params);
      const int rows = PQntuples(r.get());
      for (int row = 0; row < rows; ++row) {
        if (text_at(r.get(), row, static_cast<int>(column_count)) != "t") continue;
        if (out.jobs.size() == limit) {
          const JobRecord& last = out.jobs.back();
          out.next = ListCursor{std::chrono::floor<std::chrono::milliseconds>(last.job.created_at),
                                key_of(last.job)};
          return out;
        }
        out.jobs.push_back(read_record(r.get(), row));
      }
      if (static_cast<std::size_t>(rows) == scan) {
        // Read as far as allowed: the next page starts after the last row read.
        out.next = ListCursor{from_ms(int_at(r.get(), rows - 1, 5)), text_at(r.get(), rows - 1, 0)};
      }
      return out;
    });
  }

  // The condition on a key's prefix (and, when it names one, the tenant, for the index).
  static std::string prefix_condition(const std::string& prefix, Params& params) {
    if (prefix.empty()) return "TRUE";
    std::string where;
    if (auto tenant = tenant_of_prefix(prefix)) {
      params.push_back(*tenant);
      where += "tenant = $" + std::to_string(params.size()) + " AND ";
    }
    params.push_back(prefix);
    const std::string p = "$" + std::to_string(params.size());
    return where + "left(key, length(" + p + ")) = " + p;
  }

  ~Impl() {
    for (int fd : listener_stop) {
      if (fd >= 0) ::close(fd);
    }
  }

  // Stops and joins the threads started (the listener, the writer once it wrote what is queued,
  // the pruner).
  void stop_threads() {
    if (listener.joinable()) {
      const char stop = 1;
      while (::write(listener_stop[1], &stop, 1) < 0 && errno == EINTR) {
      }
      listener.join();
    }
    {
      std::lock_guard<std::mutex> lock(write_mutex);
      stopping = true;
    }
    write_wanted.notify_all();
    for (auto& w : writers) {
      if (w->thread.joinable()) w->thread.join();
    }
    {
      std::lock_guard<std::mutex> lock(prune_mutex);
      pruner_stopping = true;
    }
    prune_wake.notify_all();
    if (pruner.joinable()) pruner.join();
  }

  // Calls every watcher (watch_work), under watch_mutex: unwatch_work waits for a call under way.
  // One that throws is not the listener's end.
  void wake_watchers() {
    std::lock_guard<std::mutex> lock(watch_mutex);
    for (auto& [id, woken] : watchers) {
      try {
        woken();
      } catch (...) {
      }
    }
  }

  // The listener (options.notify): LISTENs on its own connection (the constructor's first try is
  // made before the store is used), wakes the watchers when notifications of other stores came
  // (at most every 100 ms, whatever the fleet writes; a pump that handed a claim back for room
  // leaves them until its next pass: StorePump::wake_for_store), and LISTENs
  // again every 10 s (a connection lost without a word is found then, within the statement
  // timeout). A lost connection is opened again after 0.1 s, then up to 2 s apart, and the
  // watchers are woken once it listens again: what was sent meanwhile is not known.
  void run_listener(bool listening) {
    constexpr auto wake_spacing = std::chrono::milliseconds(100);
    auto backoff = std::chrono::milliseconds(100);
    auto next_check = Clock::now() + std::chrono::seconds(10);
    Clock::time_point last_wake{};
    bool owed = false;  // a wake-up the spacing holds back
    for (;;) {
      Clock::time_point wait_until;
      try {
        if (!listening) {
          listen_connection->exec_simple(listen_sql);
          listening = true;
          backoff = std::chrono::milliseconds(100);
          next_check = Clock::now() + std::chrono::seconds(10);
          owed = true;
        } else if (Clock::now() >= next_check) {
          listen_connection->exec_simple(listen_sql);
          next_check = Clock::now() + std::chrono::seconds(10);
        }
        if (listen_connection->notifications(own_name) > 0) owed = true;
        const auto now = Clock::now();
        if (owed && now - last_wake >= wake_spacing) {
          wake_watchers();
          last_wake = now;
          owed = false;
        }
        wait_until = owed ? std::min(next_check, last_wake + wake_spacing) : next_check;
      } catch (...) {  // (StoreUnavailable; anything else is treated alike)
        listen_connection->close();
        listening = false;
        wait_until = Clock::now() + backoff;
        backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::seconds(2));
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(wait_until - Clock::now()).count();
      pollfd fds[2] = {{listener_stop[0], POLLIN, 0},
                       {listening ? listen_connection->socket() : -1, POLLIN, 0}};
      if (::poll(fds, 2, static_cast<int>(std::clamp<std::int64_t>(left, 1, 10000))) < 0 &&
          errno != EINTR) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (fds[0].revents) return;
    }
  }

  // The pruner: a thread and a connection of its own, so that a busy writer never starves it and
  // a prune never holds a write back.
  void run_pruner() {
    std::unique_lock<std::mutex> lock(prune_mutex);
    for (;;) {
      prune_wake.wait_until(lock, next_prune.load(),
                            [&] { return pruner_stopping || Clock::now() >= next_prune.load(); });
      if (pruner_stopping) return;
      if (Clock::now() < next_prune.load()) continue;  // (a caller's prune() moved it on)
      lock.unlock();
      prune_now(wall_ms());
      lock.lock();
    }
  }

  // Deletes the jobs finished before now - retention, 1,000 rows a transaction for as long as
  // there are full batches, and the servers not seen for an hour. A row locked by a write under
  // way is skipped (never waited for: no deadlock with a writer), and one that became unfinished
  // in between (a redelivery) is kept: the condition is checked again on the row deleted. (A
  // writer that read a row deleted here before its update makes its transaction again, and its
  // ops then find no job.)
  std::size_t prune_now(std::int64_t now_ms) {
    std::lock_guard<std::mutex> one_at_a_time(prune_run_mutex);
    next_prune = Clock::now() + options.prune_interval;
    std::size_t deleted = 0;
    try {
      if (options.retention.count() > 0) {
        const std::int64_t cutoff =
            now_ms -
            std::chrono::duration_cast<std::chrono::milliseconds>(options.retention).count();
        // (the rows deleted by key as an array, probed: as `key IN (...)` a semi join that read
        // the whole table for every batch of a backlog)
        const std::string text = "DELETE FROM " + jobs + " WHERE key = ANY(ARRAY(SELECT key FROM " +
                                 jobs +
                                 " WHERE finished_ms < $1 ORDER BY finished_ms LIMIT 1000"
                                 " FOR UPDATE SKIP LOCKED)) AND finished_ms < $1";
        for (;;) {
          Result r = prune_connection->exec(text, {std::to_string(cutoff)});
          const auto n = static_cast<std::size_t>(std::strtoull(PQcmdTuples(r.get()), nullptr, 10));
          deleted += n;
          if (n < 1000) break;
          std::lock_guard<std::mutex> lock(prune_mutex);
          if (pruner_stopping) break;
        }
      }
      prune_connection->exec("DELETE FROM " + schema + ".servers WHERE seen_ms < $1",
                             {std::to_string(now_ms - 3600 * 1000)});
    } catch (const StoreUnavailable&) {
      // (the next run tries again; the calls that fail meanwhile say so)
    }
    return deleted;
  }
};

PostgresJobStore::PostgresJobStore(PostgresJobStoreOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  try {
    impl_->migrate();
  } catch (const StoreUnavailable& e) {
    std::string why = e.what();
    const std::string prefix = "postgres job store: ";
    if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
    throw Error("postgres job store (schema " + impl_->options.schema + "): " + why);
  }
  // A retention shorter than the interval is pruned as often as it lasts (at most every second).
  auto& o = impl_->options;
  if (o.retention.count() > 0 && o.retention < o.prune_interval)
    o.prune_interval = std::max(o.retention, std::chrono::seconds(1));
  impl_->next_prune =
      Clock::now() + std::min<Clock::duration>(o.prune_interval, std::chrono::seconds(5));
  bool listening = false;
  if (o.notify) {
    if (::pipe2(impl_->listener_stop, O_CLOEXEC) != 0)
      throw Error(std::string("postgres job store: pipe: ") + std::strerror(errno));
    impl_->listen_connection = std::make_unique<Connection>(impl_->conninfo, o.statement_timeout,
                                                            /*prepared=*/false);
    // The first LISTEN before the store is used: a job another server notifies of from here on is
    // heard. One that fails is tried again by the thread.
    try {
      impl_->listen_connection->exec_simple(impl_->listen_sql);
      listening = true;
    } catch (const StoreUnavailable&) {
      impl_->listen_connection->close();
    }
  }
  try {
    for (auto& w : impl_->writers)
      w->thread = std::thread([this, &w = *w] { impl_->run_writer(w); });
    impl_->pruner = std::thread([this] { impl_->run_pruner(); });
    if (o.notify)
      impl_->listener = std::thread([this, listening] { impl_->run_listener(listening); });
  } catch (...) {
    impl_->stop_threads();  // (a thread that could not start: those started end)
    throw;
  }
}

PostgresJobStore::~PostgresJobStore() {
  impl_->stop_threads();
}

PutOutcome PostgresJobStore::put(const Job& job, const std::optional<Lease>& claim) {
  return static_cast<PutOutcome>(impl_->write_and_wait(Impl::put_op(job, claim)));
}

void PostgresJobStore::async_put(const Job& job, const std::optional<Lease>& claim, PutDone done) {
  Impl::Op op = Impl::put_op(job, claim);
  op.done = [done = std::move(done)](std::exception_ptr error, int answer) {
    done(error, static_cast<PutOutcome>(answer));
  };
  impl_->enqueue(std::move(op));
}

std::vector<PutOutcome> PostgresJobStore::put_many(const std::vector<PutRequest>& requests) {
  std::vector<std::future<int>> answers;
  answers.reserve(requests.size());
  for (const PutRequest& r : requests) {
    Impl::Op op = Impl::put_op(*r.job, r.claim);
    answers.push_back(Impl::promised(op));
    impl_->enqueue(std::move(op));
  }
  std::vector<PutOutcome> out;
  std::exception_ptr first_error;
  for (auto& f : answers) {
    try {
      out.push_back(static_cast<PutOutcome>(f.get()));
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
  return out;
}

std::optional<JobRecord> PostgresJobStore::get(const std::string& id) const {
  return get_many({id}).front();
}

std::vector<std::optional<JobRecord>> PostgresJobStore::get_many(
    const std::vector<std::string>& ids) const {
  std::vector<std::optional<JobRecord>> out(ids.size());
  if (ids.empty()) return out;
  const auto found = impl_->records(impl_->get_many_sql, {text_array(ids)});
  std::map<std::string, const JobRecord*> by_key;
  for (const auto& r : found)
    by_key[key_of(r.job)] = &r;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto it = by_key.find(clean(ids[i]));
    if (it != by_key.end()) out[i] = *it->second;
  }
  return out;
}

std::vector<JobRecord> PostgresJobStore::claim_jobs(std::size_t max, const Lease& lease,
                                                    TimePoint now) {
  return impl_->claim_jobs(max, lease, now, {});
}

std::vector<JobRecord> PostgresJobStore::claim_jobs_except(std::size_t max, const Lease& lease,
                                                           TimePoint now,
                                                           const std::vector<ModelRef>& skip) {
  return impl_->claim_jobs(max, lease, now, skip);
}

bool PostgresJobStore::renew(const std::string& id, const Lease& lease, TimePoint now) {
  return impl_->write_and_wait(Impl::renew_op(id, lease, now)) != 0;
}

std::vector<bool> PostgresJobStore::renew_all(
    const std::vector<std::pair<std::string, Lease>>& leases, TimePoint now) {
  std::vector<std::future<int>> answers;
  for (const auto& [id, lease] : leases) {
    Impl::Op op = Impl::renew_op(id, lease, now);
    answers.push_back(Impl::promised(op));
    impl_->enqueue(std::move(op));
  }
  std::vector<bool> out;
  for (auto& f : answers)
    out.push_back(f.get() != 0);
  return out;
}

void PostgresJobStore::mark_running(const std::string& id, TimePoint now) {
  Impl::Op op(Impl::Op::mark, id);
  op.now = now;
  impl_->enqueue(std::move(op));
}

bool PostgresJobStore::finish_job(const std::string& id, const std::string& holder,
                                  const JobOutcome& outcome, const std::optional<Lease>& deliver,
                                  TimePoint now) {
  return impl_->write_and_wait(Impl::finish_op(id, holder, outcome, deliver, now)) != 0;
}

void PostgresJobStore::async_finish_job(const std::string& id, const std::string& holder,
                                        const JobOutcome& outcome,
                                        const std::optional<Lease>& deliver, TimePoint now,
                                        bool want_record, FinishDone done) {
  Impl::Op op = Impl::finish_op(id, holder, outcome, deliver, now);
  if (want_record) op.record = std::make_shared<std::optional<JobRecord>>();
  op.done = [done = std::move(done), record = op.record](std::exception_ptr error, int answer) {
    FinishAnswer out;
    out.held = !error && answer != 0;
    if (out.held && record) out.record = std::move(*record);
    done(error, std::move(out));
  };
  impl_->enqueue(std::move(op));
}

JobStore::AnswerThread PostgresJobStore::answer_thread(AsyncCall, bool) const noexcept {
  return AnswerThread::store;
}

CancelOutcome PostgresJobStore::cancel(const std::string& id, const JobOutcome& outcome,
                                       TimePoint now) {
  Impl::Op op(Impl::Op::cancel, id);
  op.outcome = outcome;
  op.now = now;
  return static_cast<CancelOutcome>(impl_->write_and_wait(std::move(op)));
}

std::vector<JobRecord> PostgresJobStore::claim_callbacks(std::size_t max, const Lease& lease,
                                                         TimePoint now) {
  return impl_->claim_callbacks(max, lease, now);
}

bool PostgresJobStore::record_attempt(const std::string& id, const std::string& holder,
                                      const CallbackInfo& after, TimePoint now,
                                      const std::optional<CallbackAttempt>& attempt) {
  return impl_->write_and_wait(Impl::attempt_op(id, holder, after, now, attempt)) != 0;
}

void PostgresJobStore::async_record_attempt(const std::string& id, const std::string& holder,
                                            const CallbackInfo& after, TimePoint now,
                                            const std::optional<CallbackAttempt>& attempt,
                                            WriteDone done) {
  Impl::Op op = Impl::attempt_op(id, holder, after, now, attempt);
  op.done = [done = std::move(done)](std::exception_ptr error, int answer) {
    done(error, answer != 0);
  };
  impl_->enqueue(std::move(op));
}

RedeliverOutcome PostgresJobStore::redeliver(const std::string& id, const Lease& claim,
                                             TimePoint now) {
  Impl::Op op(Impl::Op::redeliver, id);
  op.lease = claim;
  op.now = now;
  return static_cast<RedeliverOutcome>(impl_->write_and_wait(std::move(op)));
}

void PostgresJobStore::complete(const std::string& id, const JobOutcome& outcome) {
  Impl::Op op(Impl::Op::complete, id);
  op.outcome = outcome;
  impl_->write_and_wait(std::move(op));
}

void PostgresJobStore::update_callback(const std::string& id, const CallbackInfo& callback) {
  Impl::Op op(Impl::Op::set_callback, id);
  op.callback = callback;
  impl_->write_and_wait(std::move(op));
}

std::vector<JobRecord> PostgresJobStore::list_failed_callbacks(std::size_t limit) const {
  return list_failed_callbacks_with_prefix("", limit);
}

std::vector<JobRecord> PostgresJobStore::list_failed_callbacks_with_prefix(
    const std::string& id_prefix, std::size_t limit) const {
  if (limit == 0) return {};
  Params params;
  const std::string where = "cb_state = 'failed' AND " + Impl::prefix_condition(id_prefix, params);
  params.push_back(std::to_string(bigint_limit(limit)));
  return impl_->records("SELECT " + column_list() + " FROM " + impl_->jobs + " WHERE " + where +
                            " ORDER BY created_ms DESC, key DESC LIMIT $" +
                            std::to_string(params.size()) + "::bigint",
                        params);
}

JobPage PostgresJobStore::failed_callbacks_page(const std::string& id_prefix,
                                                const std::optional<ListCursor>& after,
                                                std::size_t limit) const {
  Params params;
  const std::string where = "cb_state = 'failed' AND " + Impl::prefix_condition(id_prefix, params);
  JobPage page = impl_->page(where, std::move(params), after, limit);
  return page;
}

std::optional<QueueStats> PostgresJobStore::queue_stats() const {
  impl_->wait_for_marks();
  return impl_->with_connection([&](Connection& c) {
    QueueStats stats;
    // One statement over the three partial indexes (the unfinished jobs, the callbacks owed, the
    // given up): never a scan of the whole table, whatever its statistics say at the moment (the
    // planner preferred one while a load was changing most rows, and then each /metrics cost a
    // scan of every job kept). Its own short transaction, so that the setting ends with it.
    Result r = c.exec_simple(
        "BEGIN; SET LOCAL enable_seqscan = off; SELECT status, priority, count(*), "
        "min(created_ms) FROM " +
        impl_->jobs +
        " WHERE job_due_ms IS NOT NULL GROUP BY status, priority UNION ALL SELECT '#callbacks', 0,"
        " count(*), 0 FROM " +
        impl_->jobs +
        " WHERE cb_due_ms IS NOT NULL UNION ALL SELECT"
        " '#failed', 0, count(*), 0 FROM " +
        impl_->jobs + " WHERE cb_state = 'failed'; COMMIT");
    for (int row = 0; row < PQntuples(r.get()); ++row) {
      const std::string status = text_at(r.get(), row, 0);
      const auto n = static_cast<std::size_t>(int_at(r.get(), row, 2));
      if (status == "queued") {
        stats.queued += n;
        stats.queued_by_priority.emplace_back(static_cast<int>(int_at(r.get(), row, 1)), n);
        const TimePoint oldest = from_ms(int_at(r.get(), row, 3));
        if (!stats.oldest_queued || oldest < *stats.oldest_queued) stats.oldest_queued = oldest;
      } else if (status == "running") {
        stats.running += n;
      } else if (status == "#callbacks") {
        stats.callbacks_waiting = n;
      } else if (status == "#failed") {
        stats.callbacks_failed = n;
      }
    }
    std::sort(stats.queued_by_priority.begin(), stats.queued_by_priority.end());
    return std::optional<QueueStats>(stats);
  });
}

JobPage PostgresJobStore::list_jobs(const JobFilter& filter, const std::optional<ListCursor>& after,
                                    std::size_t limit) const {
  Params params;
  std::string where = Impl::prefix_condition(filter.id_prefix, params);
  if (filter.status) {
    params.emplace_back(std::string(to_string(*filter.status)));
    where += " AND status = $" + std::to_string(params.size());
  }
  if (filter.callback_state) {
    params.emplace_back(std::string(to_string(*filter.callback_state)));
    where += " AND cb_state = $" + std::to_string(params.size());
  }
  if (filter.priority) {
    params.emplace_back(std::to_string(*filter.priority));
    where += " AND priority = $" + std::to_string(params.size()) + "::integer";
  }
  return impl_->bounded_page(where, std::move(params), after, limit);
}

std::vector<JobRecord> PostgresJobStore::list_unfinished(std::size_t limit) const {
  if (limit == 0) return {};
  return impl_->records("SELECT " + column_list() + " FROM " + impl_->jobs +
                            " WHERE finished_ms IS NULL ORDER BY created_ms, key LIMIT $1::bigint",
                        {std::to_string(bigint_limit(limit))});
}

std::optional<std::size_t> PostgresJobStore::queue_position(const std::string& id) const {
  impl_->wait_for_marks();
  return impl_->with_connection([&](Connection& c) -> std::optional<std::size_t> {
    Result r = c.exec("SELECT (SELECT count(*) FROM " + impl_->jobs +
                          " o WHERE o.status = 'queued' AND o.job_due_ms IS NOT NULL AND"
                          " (o.priority < j.priority OR (o.priority = j.priority AND"
                          " (o.created_ms, o.key) < (j.created_ms, j.key)))) FROM " +
                          impl_->jobs + " j WHERE j.key = $1 AND j.status = 'queued'",
                      {id});
    if (PQntuples(r.get()) == 0) return std::nullopt;
    return static_cast<std::size_t>(int_at(r.get(), 0, 0));
  });
}

void PostgresJobStore::report_server(const std::string& id, std::size_t leases, TimePoint now) {
  impl_->with_connection([&](Connection& c) {
    c.exec("INSERT INTO " + impl_->schema +
               ".servers (id, leases, seen_ms) VALUES ($1, $2, $3) ON CONFLICT (id) DO UPDATE"
               " SET leases = EXCLUDED.leases, seen_ms = EXCLUDED.seen_ms",
           {id, std::to_string(leases), std::to_string(to_ms(now))});
    return 0;
  });
}

std::vector<ServerSeen> PostgresJobStore::servers(TimePoint now) const {
  return impl_->with_connection([&](Connection& c) {
    Result r = c.exec("SELECT id, leases, seen_ms FROM " + impl_->schema +
                          ".servers WHERE seen_ms > $1 ORDER BY seen_ms DESC, id",
                      {std::to_string(to_ms(now) - 3600 * 1000)});
    std::vector<ServerSeen> out;
    for (int row = 0; row < PQntuples(r.get()); ++row) {
      out.push_back({text_at(r.get(), row, 0), from_ms(int_at(r.get(), row, 2)),
                     static_cast<std::size_t>(int_at(r.get(), row, 1))});
    }
    return out;
  });
}

bool PostgresJobStore::set_origin_paused(const std::string& origin, bool paused) {
  return impl_->with_connection([&](Connection& c) {
    if (!paused) {
      c.exec("DELETE FROM " + impl_->schema + ".paused_origins WHERE origin = $1", {origin});
      return true;
    }
    // At most 10,000 kept, as on Redis: one statement, so two servers at once cannot pass it.
    Result r = c.exec("INSERT INTO " + impl_->schema +
                          ".paused_origins (origin) SELECT $1 WHERE (SELECT count(*) FROM " +
                          impl_->schema + ".paused_origins) < 10000 OR EXISTS (SELECT 1 FROM " +
                          impl_->schema +
                          ".paused_origins WHERE origin = $1) ON CONFLICT (origin) DO NOTHING"
                          " RETURNING 1",
                      {origin});
    if (PQntuples(r.get()) > 0) return true;
    Result known =
        c.exec("SELECT 1 FROM " + impl_->schema + ".paused_origins WHERE origin = $1", {origin});
    return PQntuples(known.get()) > 0;
  });
}

std::optional<std::vector<std::string>> PostgresJobStore::paused_origins() const {
  return impl_->with_connection([&](Connection& c) {
    Result r = c.exec("SELECT origin FROM " + impl_->schema + ".paused_origins ORDER BY origin");
    std::vector<std::string> out;
    for (int row = 0; row < PQntuples(r.get()); ++row)
      out.push_back(text_at(r.get(), row, 0));
    return std::optional<std::vector<std::string>>(std::move(out));
  });
}

std::optional<std::uint64_t> PostgresJobStore::put_model_config(const std::string& name,
                                                                const std::string& config,
                                                                std::uint64_t if_generation) {
  return impl_->with_connection([&](Connection& c) -> std::optional<std::uint64_t> {
    Result r = if_generation == 0
                   ? c.exec("INSERT INTO " + impl_->schema +
                                ".model_configs (name, config, generation) VALUES ($1, $2, 1)"
                                " ON CONFLICT (name) DO NOTHING RETURNING generation",
                            {name, config})
                   : c.exec("UPDATE " + impl_->schema +
                                ".model_configs SET config = $2, generation = generation + 1"
                                " WHERE name = $1 AND generation = $3 RETURNING generation",
                            {name, config, std::to_string(if_generation)});
    if (PQntuples(r.get()) == 0) return std::nullopt;
    return static_cast<std::uint64_t>(int_at(r.get(), 0, 0));
  });
}

std::optional<std::vector<ModelConfig>> PostgresJobStore::model_configs() const {
  return impl_->with_connection([&](Connection& c) {
    Result r = c.exec("SELECT name, config, generation FROM " + impl_->schema +
                      ".model_configs ORDER BY name");
    std::vector<ModelConfig> out;
    for (int row = 0; row < PQntuples(r.get()); ++row) {
      out.push_back({text_at(r.get(), row, 0), text_at(r.get(), row, 1),
                     static_cast<std::uint64_t>(int_at(r.get(), row, 2))});
    }
    return std::optional<std::vector<ModelConfig>>(std::move(out));
  });
}

std::vector<ModelRef> PostgresJobStore::waiting_versions(const std::vector<ModelRef>& versions,
                                                         TimePoint since) const {
  if (versions.empty()) return {};
  std::vector<std::string> names, numbers;
  for (const ModelRef& m : versions) {
    names.push_back(m.name);
    numbers.push_back(m.version);
  }
  return impl_->with_connection([&](Connection& c) {
    Result r = c.exec(
        "SELECT v.name, v.version FROM unnest($1::text[], $2::text[]) AS"
        " v(name, version) WHERE EXISTS (SELECT 1 FROM " +
            impl_->jobs +
            " j WHERE j.job_due_ms IS NOT NULL AND j.job_due_ms <= $3 AND"
            " j.model = v.name AND j.mver = v.version)",
        {text_array(names), text_array(numbers), std::to_string(to_ms(since))});
    std::vector<ModelRef> out;
    for (int row = 0; row < PQntuples(r.get()); ++row)
      out.push_back({text_at(r.get(), row, 0), text_at(r.get(), row, 1)});
    return out;
  });
}

std::uint64_t PostgresJobStore::watch_work(std::function<void()> woken) {
  if (!impl_->options.notify || !woken) return 0;
  std::lock_guard<std::mutex> lock(impl_->watch_mutex);
  const std::uint64_t watch = impl_->next_watch++;
  impl_->watchers.emplace(watch, std::move(woken));
  return watch;
}

void PostgresJobStore::unwatch_work(std::uint64_t watch) {
  if (watch == 0) return;
  std::lock_guard<std::mutex> lock(impl_->watch_mutex);
  impl_->watchers.erase(watch);
}

std::optional<std::string> PostgresJobStore::failure() const {
  {
    std::lock_guard<std::mutex> lock(impl_->failure_mutex);
    if (impl_->failure) return impl_->failure;
  }
  // A statement that has waited more than a second with no answer: the database is frozen, or
  // cut off, before any statement times out.
  const std::int64_t now =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
          .count();
  std::lock_guard<std::mutex> lock(impl_->pool_mutex);
  for (const Connection* c : impl_->all) {
    const std::int64_t since = c->busy_since();
    if (since != 0 && now - since > 1000)
      return std::string("postgres job store: a statement has waited more than 1 s");
  }
  return std::nullopt;
}

std::size_t PostgresJobStore::commits() const {
  return impl_->commits.load();
}

std::size_t PostgresJobStore::retried_transactions() const {
  return impl_->retried.load();
}

std::vector<StoreCounter> PostgresJobStore::counters() const {
  return {
      {"transactions_total", "PostgreSQL transactions the store's writers committed.", commits()},
      {"transactions_retried_total",
       "PostgreSQL writer transactions made again: a row changed under them (another "
       "server), a deadlock or a serialization failure.",
       retried_transactions()},
      {"rows_recalled_total",
       "Rows the PostgreSQL writers took from their memory of what they last wrote, instead of "
       "reading them.",
       impl_->recalled_rows.load()}};
}

std::size_t PostgresJobStore::prune(TimePoint now) {
  return impl_->prune_now(to_ms(now));
}

}  // namespace rebound
