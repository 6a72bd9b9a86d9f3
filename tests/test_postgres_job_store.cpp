// PostgresJobStore on a real PostgreSQL, beyond the contract suite and the differential test
// (which run it too): its URI, its schema made once by servers starting together, two stores on
// one queue, pruning, a database that stops and comes back, and a statement that hangs.
#include <doctest/doctest.h>

#include <boost/asio/use_future.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "rebound/error.hpp"
#include "rebound/job_queue.hpp"
#include "rebound/model.hpp"
#include "rebound/store/make_store.hpp"
#include "rebound/store/postgres_job_store.hpp"
#include "store/postgres_testing.hpp"
#include "support/postgres_server.hpp"
#include "support/receiver.hpp"
#include "support/scoped_hook.hpp"

using namespace std::chrono_literals;
using rebound::Job;
using rebound::JobStatus;
using rebound::Lease;
using rebound::PostgresJobStore;
using rebound::PutOutcome;
using rebound::test::PostgresServer;
using rebound::test::shared_postgres;

namespace {

Job job_named(const std::string& id) {
  Job job = rebound::make_job(id, {{"x", 1}}, "http://127.0.0.1:9/cb");
  job.created_at = std::chrono::system_clock::now();
  return job;
}

rebound::PostgresJobStoreOptions options_for(const std::string& uri) {
  return rebound::parse_postgres_uri(uri);
}

using ReadHook = rebound::test::ScopedHook<rebound::detail::set_postgres_writer_read_hook>;

}  // namespace

TEST_CASE("postgres store: its URI names the database and the schema") {
  auto o = rebound::parse_postgres_uri("postgresql://app@db.internal:6432/jobs?schema=queue_1");
  CHECK(o.conninfo == "postgresql://app@db.internal:6432/jobs");
  CHECK(o.schema == "queue_1");
  o = rebound::parse_postgres_uri("postgres://db/jobs?sslmode=require&schema=s&application_name=x");
  CHECK(o.conninfo == "postgres://db/jobs?sslmode=require&application_name=x");
  CHECK(o.schema == "s");
  CHECK(rebound::parse_postgres_uri("postgresql:///jobs").schema == "rebound");
  CHECK_FALSE(rebound::parse_postgres_uri("postgresql:///jobs").prepared_statements);
  o = rebound::parse_postgres_uri("postgresql://db/jobs?prepared=1&sslmode=disable");
  CHECK(o.prepared_statements);
  CHECK(o.conninfo == "postgresql://db/jobs?sslmode=disable");
  CHECK_FALSE(
      rebound::parse_postgres_uri("postgresql://db/jobs?prepared=false").prepared_statements);
  CHECK_THROWS_WITH_AS(rebound::parse_postgres_uri("postgresql://db/jobs?prepared=yes"),
                       doctest::Contains("prepared must be"), rebound::Error);
  CHECK_FALSE(rebound::parse_postgres_uri("postgresql:///jobs").notify);
  o = rebound::parse_postgres_uri("postgresql://db/jobs?notify=true&schema=q");
  CHECK(o.notify);
  CHECK(o.conninfo == "postgresql://db/jobs");
  CHECK_THROWS_WITH_AS(rebound::parse_postgres_uri("postgresql://db/jobs?notify=on"),
                       doctest::Contains("notify must be"), rebound::Error);
  CHECK(rebound::parse_postgres_uri("postgresql:///jobs").writers == 2);
  o = rebound::parse_postgres_uri("postgresql://db/jobs?writers=5");
  CHECK(o.writers == 5);
  CHECK(o.conninfo == "postgresql://db/jobs");
  for (const char* bad : {"0", "65", "x", "", "-1", "123"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(
        rebound::parse_postgres_uri(std::string("postgresql://db/jobs?writers=") + bad),
        doctest::Contains("writers must be 1 to 64"), rebound::Error);
  }
  CHECK_THROWS_AS(rebound::parse_postgres_uri("postgresql://db/jobs?schema=a;drop"),
                  rebound::Error);
  CHECK_THROWS_AS(rebound::parse_postgres_uri("postgresql://db/jobs?schema=1a"), rebound::Error);
  CHECK_THROWS_AS(rebound::parse_postgres_uri("mysql://db/jobs"), rebound::Error);
  // make_store takes both schemes; a database that is not there is a clear error at start.
  CHECK_THROWS_WITH_AS(rebound::make_store("postgresql://postgres@127.0.0.1:1/none"),
                       doctest::Contains("cannot connect"), rebound::Error);
}

TEST_CASE("postgres store: servers starting together make the schema once - and share a queue") {
  const std::string uri = shared_postgres().uri(PostgresServer::fresh_schema());
  std::vector<std::future<std::unique_ptr<PostgresJobStore>>> starting;
  for (int i = 0; i < 4; ++i) {
    starting.push_back(std::async(
        std::launch::async, [&] { return std::make_unique<PostgresJobStore>(options_for(uri)); }));
  }
  std::vector<std::unique_ptr<PostgresJobStore>> stores;
  for (auto& s : starting)
    stores.push_back(s.get());
  // What one accepts, another claims; a job is claimed once however many claim at once.
  for (int i = 0; i < 40; ++i)
    REQUIRE(stores[i % 4]->put(job_named("j" + std::to_string(i))) == PutOutcome::created);
  const auto now = std::chrono::system_clock::now();
  std::vector<std::future<std::vector<rebound::JobRecord>>> claims;
  for (int i = 0; i < 4; ++i) {
    claims.push_back(std::async(std::launch::async, [&, i] {
      std::vector<rebound::JobRecord> taken;
      for (int round = 0; round < 10; ++round) {
        auto some = stores[i]->claim_jobs(3, Lease{"s" + std::to_string(i), now + 30s}, now);
        taken.insert(taken.end(), some.begin(), some.end());
      }
      return taken;
    }));
  }
  std::set<std::string> seen;
  std::size_t total = 0;
  for (auto& c : claims) {
    for (const auto& r : c.get()) {
      seen.insert(r.job.id);
      ++total;
    }
  }
  CHECK(total == 40);
  CHECK(seen.size() == 40);
  // Another schema on the same database is another queue.
  PostgresJobStore other(options_for(shared_postgres().uri(PostgresServer::fresh_schema())));
  CHECK_FALSE(other.get("j0"));
  CHECK(stores[3]->get("j0"));
}

TEST_CASE(
    "postgres store: a row changed after the writer read it - its ops go again on the change") {
  // The writer reads rows without locking them and writes each only as the version it read: a
  // cancel that another server commits in between must win over a finish decided on the row as
  // it was, and the finish must say it did not end the job.
  const std::string uri = shared_postgres().uri(PostgresServer::fresh_schema());
  PostgresJobStore a(options_for(uri));
  PostgresJobStore b(options_for(uri));
  const auto now = std::chrono::system_clock::now();
  REQUIRE(a.put(job_named("raced"), Lease{"a", now + 30s}) == PutOutcome::created);
  REQUIRE(a.put(job_named("calm"), Lease{"a", now + 30s}) == PutOutcome::created);
  std::atomic<bool> armed{true};
  std::optional<rebound::CancelOutcome> cancelled;
  ReadHook hook([&] {
    if (!armed.exchange(false)) return;  // (b's writer calls it too: once is the race)
    cancelled =
        b.cancel("raced", {JobStatus::cancelled, nullptr, rebound::ErrorInfo{"cancelled", "by b"}},
                 now + 1s);
  });
  const rebound::JobOutcome ok{JobStatus::succeeded, {{"y", 2}}, std::nullopt};
  const std::size_t retried = a.retried_transactions();
  const bool finished = a.finish_job("raced", "a", ok, std::nullopt, now + 2s);
  CHECK(a.retried_transactions() == retried + 1);  // (the update found the row changed)
  REQUIRE(cancelled);
  CHECK(*cancelled == rebound::CancelOutcome::cancelled);
  CHECK_FALSE(finished);
  auto raced = b.get("raced");
  REQUIRE(raced);
  CHECK(raced->status == JobStatus::cancelled);
  REQUIRE(raced->outcome.error);
  CHECK(raced->outcome.error->message == "by b");
  // Rows nobody else changed are written at once, as before.
  CHECK(a.finish_job("calm", "a", ok, std::nullopt, now + 3s));
  CHECK(b.get("calm")->status == JobStatus::succeeded);
}

TEST_CASE(
    "postgres store: a second writer takes the writes that gathered - each job's in the order they "
    "came") {
  // While one writer's transaction is open, the writes that gather (a quarter of a full
  // transaction or more) go into another writer's transaction, never one of a job whose earlier
  // writes are in a transaction not yet committed: each finish below must find its job's put
  // committed (a finish read before it would answer false).
  const std::string schema = PostgresServer::fresh_schema();
  constexpr int jobs = 600;
  // (What the answers and the hook use is declared before the store: it outlives its writers.)
  std::mutex m;
  std::condition_variable answered;
  int puts_created = 0, finishes_held = 0, answers = 0, failures = 0;
  std::atomic<bool> armed{true};
  bool answered_while_open = false;
  auto options = options_for(shared_postgres().uri(schema));
  CHECK(options.writers == 2);  // (the default)
  PostgresJobStore store(options);
  const auto now = std::chrono::system_clock::now();
  const rebound::JobOutcome ok{JobStatus::succeeded, {{"y", 2}}, std::nullopt};
  ReadHook hook([&] {
    if (!armed.exchange(false)) return;
    // Inside the first writer's open transaction: every job put, then every job finished.
    for (int i = 0; i < jobs; ++i) {
      store.async_put(job_named("j" + std::to_string(i)), Lease{"a", now + 60s},
                      [&](std::exception_ptr e, PutOutcome o) {
                        std::lock_guard<std::mutex> lock(m);
                        ++answers;
                        if (e) ++failures;
                        if (!e && o == PutOutcome::created) ++puts_created;
                        answered.notify_all();
                      });
    }
    for (int i = 0; i < jobs; ++i) {
      store.async_finish_job("j" + std::to_string(i), "a", ok, std::nullopt, now + 1s, false,
                             [&](std::exception_ptr e, rebound::JobStore::FinishAnswer a) {
                               std::lock_guard<std::mutex> lock(m);
                               ++answers;
                               if (e) ++failures;
                               if (!e && a.held) ++finishes_held;
                               answered.notify_all();
                             });
    }
    // The other writer answers some while this transaction is still open (within its 5 s
    // bounds).
    std::unique_lock<std::mutex> lock(m);
    answered_while_open = answered.wait_for(lock, 3s, [&] { return answers > 0; });
  });
  REQUIRE(store.put(job_named("first")) == PutOutcome::created);
  {
    std::unique_lock<std::mutex> lock(m);
    REQUIRE(answered.wait_for(lock, 30s, [&] { return answers == 2 * jobs; }));
  }
  CHECK(answered_while_open);
  CHECK(failures == 0);
  CHECK(puts_created == jobs);
  CHECK(finishes_held == jobs);
  for (int i = 0; i < jobs; i += 37) {
    const auto record = store.get("j" + std::to_string(i));
    REQUIRE(record);
    CHECK(record->status == JobStatus::succeeded);
  }
  CHECK(store.retried_transactions() == 0);  // (two writers of one store never meet on a row)
}

TEST_CASE("postgres store: a writer that PostgreSQL ends for a deadlock makes its writes again") {
  // The writer's update takes its rows' locks as it goes; another transaction that holds one of
  // them and then waits for a row the writer inserted closes a cycle, and PostgreSQL ends one of
  // the two (40P01). The writer's writes are then made again, not answered with an error.
  PostgresServer& pg = shared_postgres();
  const std::string schema = PostgresServer::fresh_schema();
  // (What the writer's answers and the hook use is declared before the store, so that it outlives
  // the store's writer however the test ends; the hook is cleared first.)
  std::promise<PutOutcome> put;
  std::promise<rebound::JobStore::FinishAnswer> finish;
  std::future<void> other;
  std::atomic<int> reads{0};
  PostgresJobStore a(options_for(pg.uri(schema)));
  const auto now = std::chrono::system_clock::now();
  REQUIRE(a.put(job_named("held"), Lease{"a", now + 30s}) == PutOutcome::created);
  const auto deadlocks = [&] {
    const std::string n =
        pg.psql("SELECT deadlocks FROM pg_stat_database WHERE datname = 'postgres'");
    return n.empty() ? -1 : std::stoll(n);
  };
  const long long deadlocks_before = deadlocks();
  REQUIRE(deadlocks_before >= 0);
  const rebound::JobOutcome ok{JobStatus::succeeded, {{"y", 2}}, std::nullopt};
  ReadHook hook([&] {
    const int read = ++reads;
    if (read == 1) {
      // In the first transaction: the two writes that go together into the next one.
      a.async_put(job_named("inserted"), Lease{"a", now + 30s},
                  [&](std::exception_ptr e, PutOutcome o) {
                    if (e) return put.set_exception(e);
                    put.set_value(o);
                  });
      a.async_finish_job("held", "a", ok, std::nullopt, now + 1s, true,
                         [&](std::exception_ptr e, rebound::JobStore::FinishAnswer answer) {
                           if (e) return finish.set_exception(e);
                           finish.set_value(std::move(answer));
                         });
      return;
    }
    if (read != 2) return;
    // The second has inserted "inserted" and read "held". Another session locks "held", then
    // inserts "inserted" too (waiting for the writer's insert), and rolls back; with a long
    // deadlock_timeout of its own, so that the writer, whose update then waits for "held", is the
    // one PostgreSQL ends.
    other = std::async(std::launch::async, [&pg, schema] {
      pg.psql("SET deadlock_timeout = '20s'; BEGIN; SELECT key FROM " + schema +
                  ".jobs WHERE key = 'held' FOR UPDATE; CREATE TEMP TABLE copy AS SELECT * "
                  "FROM " +
                  schema +
                  ".jobs WHERE key = 'held'; UPDATE copy SET key = 'inserted'; "
                  "INSERT INTO " +
                  schema + ".jobs SELECT * FROM copy ON CONFLICT DO NOTHING; ROLLBACK",
              "other.out");
    });
    // Until the other session waits for the writer's insert (holding "held"): the writer's
    // update then closes the cycle, and its own deadlock check (after 1 s) finds it. (Within the
    // writer's 5 s idle-in-transaction bound.)
    const auto deadline = std::chrono::steady_clock::now() + 4s;
    while (std::chrono::steady_clock::now() < deadline &&
           pg.psql("SELECT count(*) FROM pg_locks WHERE NOT granted", "poll.out") == "0\n")
      std::this_thread::sleep_for(10ms);
  });
  const std::size_t retried = a.retried_transactions();
  a.async_put(job_named("first"), std::nullopt, [](std::exception_ptr, PutOutcome) {});
  auto put_answer = put.get_future();
  auto finish_answer = finish.get_future();
  REQUIRE(put_answer.wait_for(30s) == std::future_status::ready);
  REQUIRE(finish_answer.wait_for(30s) == std::future_status::ready);
  CHECK(put_answer.get() == PutOutcome::created);
  const auto answer = finish_answer.get();
  CHECK(answer.held);
  REQUIRE(answer.record);
  CHECK(answer.record->status == JobStatus::succeeded);
  REQUIRE(other.valid());
  other.get();
  CHECK(a.retried_transactions() >= retried + 1);
  CHECK(a.get("held")->status == JobStatus::succeeded);
  CHECK(a.get("inserted")->status == JobStatus::queued);
  // (PostgreSQL's statistics reach the view within a second or so)
  CHECK(rebound::test::eventually([&] { return deadlocks() > deadlocks_before; }, 5000ms));
}

TEST_CASE(
    "postgres store: a row another server changed since this one wrote it - the change counts") {
  // Two servers on one database: a job the other one cancelled, or took over when the first
  // one's lease ran out, is neither finished nor renewed by the first from what it wrote before.
  const std::string uri = shared_postgres().uri(PostgresServer::fresh_schema());
  PostgresJobStore a(options_for(uri));
  PostgresJobStore b(options_for(uri));
  const auto now = std::chrono::system_clock::now();
  REQUIRE(a.put(job_named("cancelled"), Lease{"a", now + 30s}) == PutOutcome::created);
  REQUIRE(a.put(job_named("taken"), Lease{"a", now + 1s}) == PutOutcome::created);
  a.mark_running("cancelled", now);
  a.mark_running("taken", now);
  REQUIRE(a.get("taken")->status == JobStatus::running);
  CHECK(b.cancel("cancelled",
                 {JobStatus::cancelled, nullptr, rebound::ErrorInfo{"cancelled", "by b"}},
                 now + 1s) == rebound::CancelOutcome::cancelled);
  const auto taken = b.claim_jobs(10, Lease{"b", now + 60s}, now + 2s);
  REQUIRE(taken.size() == 1);
  CHECK(taken[0].job.id == "taken");
  const rebound::JobOutcome ok{JobStatus::succeeded, {{"y", 2}}, std::nullopt};
  CHECK_FALSE(a.finish_job("cancelled", "a", ok, std::nullopt, now + 3s));
  // (at a time its own lease still covers, as a server whose clock is behind would)
  CHECK_FALSE(a.finish_job("taken", "a", ok, std::nullopt, now + 500ms));
  CHECK(a.get("cancelled")->status == JobStatus::cancelled);
  // b holds it now: its finish is the one that counts, and a renewal by a is refused.
  CHECK_FALSE(a.renew("taken", Lease{"a", now + 90s}, now + 500ms));
  CHECK(b.finish_job("taken", "b", ok, std::nullopt, now + 5s));
  CHECK(a.get("taken")->status == JobStatus::succeeded);
}

TEST_CASE("postgres store: writes and reads find rows by key - they do not read the jobs kept") {
  // The writer's statements and get_many name their rows by key. To the planner a table of some
  // thousands of rows looked cheaper to read whole than to probe a hundred times (a batch of 125
  // finishes read all 9,000 rows of the benchmark's table twice: the writer's read, and its
  // update's hash join), so each call cost more the more jobs were kept. Counted with the
  // table's statistics (pg_stat_user_tables: the rows sequential scans read, and those index
  // scans fetched: a join on the whole primary key reads every row too), which a backend sends
  // once a second at most: each look calls the store once more on the same connection, a
  // second after the last, until they show the calls looked at.
  const std::string schema = PostgresServer::fresh_schema();
  const std::string jobs = schema + ".jobs";
  auto options = options_for(shared_postgres().uri(schema));
  options.writers = 1;      // (one connection for the writes,
  options.connections = 1;  // one for the reads: whose statistics the pokes below send)
  PostgresJobStore store(options);
  const PostgresServer& pg = shared_postgres();
  const auto now = std::chrono::system_clock::now();
  const rebound::JobOutcome ok{JobStatus::succeeded, {{"y", 2}}, std::nullopt};
  Job seed = job_named("seed");
  seed.callback_url.clear();  // (finished when it ends: no callback owed)
  REQUIRE(store.put(seed, Lease{"h", now + 60s}) == PutOutcome::created);
  REQUIRE(store.finish_job("seed", "h", ok, std::nullopt, now));
  // 8,000 finished jobs kept (copies of the seed's row), and the planner told so.
  constexpr int kept = 8000;
  pg.psql("INSERT INTO " + jobs + " SELECT r.* FROM " + jobs + " j, generate_series(1, " +
          std::to_string(kept) +
          ") g, LATERAL jsonb_populate_record(j, jsonb_build_object('key', 'kept' || g, 'id', "
          "'kept' || g)) r; ANALYZE " +
          jobs);
  REQUIRE(pg.psql("SELECT count(*) FROM " + jobs) == std::to_string(kept + 1) + "\n");
  struct Counters {
    std::int64_t seq_read = -1, index_fetched = -1, written = -1, deleted = -1;
    std::int64_t rows_read() const { return seq_read + index_fetched; }
  };
  const auto counters = [&] {
    const std::string out = pg.psql(
        "SELECT seq_tup_read, idx_tup_fetch, n_tup_ins + n_tup_upd, n_tup_del FROM "
        "pg_stat_user_tables "
        "WHERE schemaname = '" +
        schema + "' AND relname = 'jobs'");
    Counters c;
    std::sscanf(out.c_str(), "%" SCNd64 "|%" SCNd64 "|%" SCNd64 "|%" SCNd64, &c.seq_read,
                &c.index_fetched, &c.written, &c.deleted);
    return c;
  };
  // Looks until `seen` holds, each time after a second and a call of `poke`.
  const auto settled = [&](const std::function<void()>& poke,
                           const std::function<bool(const Counters&)>& seen) {
    Counters c = counters();
    for (int i = 0; i < 10 && !seen(c); ++i) {
      std::this_thread::sleep_for(1100ms);
      poke();
      c = counters();
    }
    REQUIRE(seen(c));
    return c;
  };
  int pokes = 0;
  const auto put_one = [&] {
    REQUIRE(store.put(job_named("poke" + std::to_string(pokes++))) == PutOutcome::created);
  };
  const Counters before =
      settled(put_one, [&](const Counters& c) { return c.written >= kept + 2 + pokes; });
  const int pokes_before = pokes;

  SUBCASE("the writer") {
    // 100 jobs put and finished, as a server's writes gather.
    constexpr int batch = 100;
    std::vector<std::future<bool>> answers;
    for (int i = 0; i < batch; ++i) {
      auto put = std::make_shared<std::promise<bool>>();
      answers.push_back(put->get_future());
      store.async_put(job_named("j" + std::to_string(i)), Lease{"h", now + 60s},
                      [put](std::exception_ptr e, PutOutcome o) {
                        put->set_value(!e && o == PutOutcome::created);
                      });
    }
    for (int i = 0; i < batch; ++i) {
      auto finish = std::make_shared<std::promise<bool>>();
      answers.push_back(finish->get_future());
      store.async_finish_job("j" + std::to_string(i), "h", ok, std::nullopt, now + 1s, false,
                             [finish](std::exception_ptr e, rebound::JobStore::FinishAnswer a) {
                               finish->set_value(!e && a.held);
                             });
    }
    for (auto& a : answers)
      REQUIRE(a.get());
    const Counters after = settled(put_one, [&](const Counters& c) {
      return c.written >= before.written + 2 * batch + (pokes - pokes_before);
    });
    CHECK(after.rows_read() - before.rows_read() < kept);  // (before: at least the table once)
  }

  SUBCASE("the claims") {
    // 100 jobs put for any server, and 100 whose callbacks are due.
    constexpr int batch = 100;
    for (int i = 0; i < batch; ++i) {
      REQUIRE(store.put(job_named("due" + std::to_string(i))) == PutOutcome::created);
      REQUIRE(store.put(job_named("cb" + std::to_string(i)), Lease{"h", now + 60s}) ==
              PutOutcome::created);
      REQUIRE(store.finish_job("cb" + std::to_string(i), "h", ok, std::nullopt, now));
    }
    const Counters ready = settled(put_one, [&](const Counters& c) {
      return c.written >= before.written + 3 * batch + (pokes - pokes_before);
    });
    const auto later = std::chrono::system_clock::now() + 1s;
    REQUIRE(store.claim_jobs(batch, Lease{"c", later + 60s}, later).size() == batch);
    REQUIRE(store.claim_callbacks(batch, Lease{"c", later + 60s}, later).size() == batch);
    const Counters after =
        settled([&] { REQUIRE(store.get("seed")); },
                [&](const Counters& c) { return c.written >= ready.written + 2 * batch; });
    CHECK(after.rows_read() - ready.rows_read() < kept);
  }

  SUBCASE("the pruning") {
    // Every kept job past the retention, deleted in batches of 1,000: each row read about twice
    // (found by its finish time, then deleted by its key), not the table again at each batch.
    const std::size_t deleted = store.prune(std::chrono::system_clock::now() + 48h);
    REQUIRE(deleted == static_cast<std::size_t>(kept) + 1);
    const Counters after =
        settled([&] { store.prune(std::chrono::system_clock::now()); },
                [&](const Counters& c) { return c.deleted >= before.deleted + kept + 1; });
    CHECK(after.rows_read() - before.rows_read() < 3 * static_cast<std::int64_t>(deleted));
  }

  SUBCASE("get_many") {
    std::vector<std::string> ids;
    for (int i = 1; i <= kept; i += kept / 200)
      ids.push_back("kept" + std::to_string(i));
    const auto records = store.get_many(ids);
    REQUIRE(records.size() == ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      REQUIRE(records[i]);
      CHECK(records[i]->job.id == ids[i]);
    }
    // (the rows it fetched show, one way or the other)
    const Counters after = settled([&] { REQUIRE(store.get("seed")); },
                                   [&](const Counters& c) {
                                     return c.index_fetched - before.index_fetched >=
                                                static_cast<std::int64_t>(ids.size()) ||
                                            c.seq_read - before.seq_read >= kept;
                                   });
    CHECK(after.rows_read() - before.rows_read() < kept);
  }
}

TEST_CASE("postgres store: finished jobs are deleted past the retention - the rest kept") {
  auto options = options_for(shared_postgres().uri(PostgresServer::fresh_schema()));
  options.retention = 1h;
  PostgresJobStore store(options);
  const auto now = std::chrono::system_clock::now();
  for (int i = 0; i < 2500; ++i) {
    Job job = job_named("done" + std::to_string(i));
    job.callback_url.clear();
    REQUIRE(store.put(job, Lease{"h", now + 30s}) == PutOutcome::created);
  }
  std::vector<std::pair<std::string, Lease>> none;
  const rebound::JobOutcome ok{JobStatus::succeeded, {{"y", 2}}, std::nullopt};
  for (int i = 0; i < 2500; ++i)
    REQUIRE(store.finish_job("done" + std::to_string(i), "h", ok, std::nullopt, now));
  REQUIRE(store.put(job_named("waiting")) == PutOutcome::created);
  CHECK(store.prune(std::chrono::system_clock::now()) == 0);          // within the retention
  CHECK(store.prune(std::chrono::system_clock::now() + 2h) == 2500);  // in batches of 1,000
  CHECK_FALSE(store.get("done7"));
  CHECK(store.get("waiting"));
}

TEST_CASE("postgres store: a database that stops fails the calls - and they work when it is back") {
  bool prepared = false;
  SUBCASE("statements unnamed") {}
  SUBCASE("statements prepared - prepared again in the new sessions") {
    prepared = true;
  }
  PostgresServer db;
  auto options = options_for(db.uri());
  options.statement_timeout = 2s;
  options.prepared_statements = prepared;
  PostgresJobStore store(options);
  const auto now = std::chrono::system_clock::now();
  REQUIRE(store.put(job_named("before")) == PutOutcome::created);
  CHECK_FALSE(store.failure());
  db.stop("immediate");
  CHECK_THROWS_AS(store.put(job_named("during")), rebound::StoreUnavailable);
  CHECK_THROWS_AS(store.claim_jobs(1, Lease{"h", now + 30s}, now), rebound::StoreUnavailable);
  REQUIRE(store.failure());
  db.start();
  // The next calls open new connections.
  std::optional<PutOutcome> put;
  for (int i = 0; i < 50 && !put; ++i) {
    try {
      put = store.put(job_named("after"));
    } catch (const rebound::StoreUnavailable&) {
      std::this_thread::sleep_for(100ms);
    }
  }
  REQUIRE(put);
  CHECK(*put == PutOutcome::created);
  CHECK_FALSE(store.failure());
  const auto later = std::chrono::system_clock::now();
  const auto claimed = store.claim_jobs(5, Lease{"h", later + 30s}, later);
  REQUIRE(claimed.size() == 2);
  // Every statement of the job's way works on the new connections (prepared: once each there).
  for (int round = 0; round < 3; ++round) {
    const std::string id = "more" + std::to_string(round);
    REQUIRE(store.put(job_named(id), Lease{"h", later + 30s}) == PutOutcome::created);
    store.mark_running(id, later);
    REQUIRE(store.finish_job(
        id, "h", rebound::JobOutcome{JobStatus::succeeded, {{"y", round}}, std::nullopt},
        Lease{"send", later + 30s}, later));
    const auto record = store.get(id);
    REQUIRE(record);
    CHECK(record->status == JobStatus::succeeded);
    CHECK(record->outcome.result == nlohmann::json{{"y", round}});
    CHECK(record->callback.state == rebound::CallbackState::pending);
  }
  CHECK(store.claim_callbacks(10, Lease{"late", later + 1h}, later + 31s).size() == 3);
}

TEST_CASE("postgres store: a statement that waits too long is cancelled - the store says so") {
  const std::string schema = PostgresServer::fresh_schema();
  auto options = options_for(shared_postgres().uri(schema));
  options.statement_timeout = 1s;
  PostgresJobStore store(options);
  REQUIRE(store.put(job_named("a")) == PutOutcome::created);
  // Another session holds the table's lock for 4 s: the store's writes wait for it.
  auto holder = std::async(std::launch::async, [&] {
    return shared_postgres().psql("BEGIN; LOCK TABLE " + schema +
                                  ".jobs IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(4); COMMIT;");
  });
  std::this_thread::sleep_for(500ms);
  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(store.put(job_named("b")), rebound::StoreUnavailable);
  CHECK(std::chrono::steady_clock::now() - started < 3s);
  CHECK(store.failure());
  holder.get();
  CHECK(store.put(job_named("c")) == PutOutcome::created);
  CHECK_FALSE(store.failure());
}

TEST_CASE("postgres store: a frozen database fails calls within the timeout - not forever") {
  PostgresServer db;
  auto options = options_for(db.uri());
  options.statement_timeout = 1s;
  PostgresJobStore store(options);
  REQUIRE(store.put(job_named("before")) == PutOutcome::created);
  db.pause();
  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(store.put(job_named("frozen")), rebound::StoreUnavailable);
  CHECK_THROWS_AS(store.get("before"), rebound::StoreUnavailable);
  CHECK(std::chrono::steady_clock::now() - started < 8s);  // (connecting again has 2 s too)
  CHECK(store.failure());
  db.resume();
  std::optional<PutOutcome> put;
  for (int i = 0; i < 50 && !put; ++i) {
    try {
      put = store.put(job_named("thawed"));
    } catch (const rebound::StoreUnavailable&) {
      std::this_thread::sleep_for(100ms);
    }
  }
  CHECK(put == PutOutcome::created);
  CHECK(store.get("before"));
}

TEST_CASE("postgres store: texts PostgreSQL refuses are stored replaced - never fail a batch") {
  PostgresJobStore store(options_for(shared_postgres().uri(PostgresServer::fresh_schema())));
  const auto now = std::chrono::system_clock::now();
  REQUIRE(store.put(job_named("bad"), Lease{"h", now + 30s}) == PutOutcome::created);
  REQUIRE(store.put(job_named("good"), Lease{"h", now + 30s}) == PutOutcome::created);
  // A model's error with a NUL and a byte that is not UTF-8, finished beside a healthy job.
  const rebound::JobOutcome failed{JobStatus::failed, nullptr,
                                   rebound::ErrorInfo{"model_error", std::string("a\0b\xff c", 6)}};
  const rebound::JobOutcome ok{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  std::promise<bool> first, second;
  const auto held_into = [](std::promise<bool>& p) {
    return [&p](std::exception_ptr e, rebound::JobStore::FinishAnswer v) {
      if (e)
        p.set_exception(e);
      else
        p.set_value(v.held);
    };
  };
  store.async_finish_job("bad", "h", failed, std::nullopt, now, false, held_into(first));
  store.async_finish_job("good", "h", ok, std::nullopt, now, false, held_into(second));
  CHECK(first.get_future().get());
  CHECK(second.get_future().get());
  const auto bad = store.get("bad");
  REQUIRE(bad);
  REQUIRE(bad->outcome.error);
  CHECK(bad->outcome.error->message ==
        "a\xEF\xBF\xBD"
        "b\xEF\xBF\xBD c");
  CHECK(store.get("good")->status == JobStatus::succeeded);
  // A read for a key PostgreSQL could not hold finds nothing, and the store is well.
  CHECK_FALSE(store.get(std::string("\xff\0x", 3)));
  CHECK_FALSE(store.failure());
  // A job put under such a key (the library's caller chose it: the HTTP front allows none) is
  // stored under its U+FFFD form, found by the key it was put with, and fails nobody's batch.
  const std::string odd("odd\xff", 4);
  CHECK(store.put(job_named(odd), Lease{"h", now + 30s}) == PutOutcome::created);
  CHECK(store.put(job_named(odd)) == PutOutcome::duplicate);
  CHECK(store.finish_job(odd, "h", ok, std::nullopt, now));
  CHECK(store.get(odd));
  CHECK_FALSE(store.failure());
}

TEST_CASE("postgres store: every column comes back as written - the writer's rows in binary") {
  // The writer sends its rows in PostgreSQL's binary format (an array of the table's row type):
  // texts with every character the text forms had to quote, integers at their edges, NULLs beside
  // empty texts, through the insert and through the update (which sends the request's columns as
  // NULL and must leave them as stored).
  PostgresJobStore store(options_for(shared_postgres().uri(PostgresServer::fresh_schema())));
  const auto now = std::chrono::floor<std::chrono::milliseconds>(std::chrono::system_clock::now());
  Job job = rebound::make_job(
      "q\"u\\o(t,e){s} 'x' NULL",
      {{"s", "a\"b\\c{d}(e),f\n"}, {"n", -9007199254740991}, {"u", "\u00e9\u6f22"}},
      "http://127.0.0.1:9/cb?a=\"b\"&c=\\d");
  job.tenant = "tenant (\"t\"), {x}";
  job.created_at = now;
  job.priority = 9;
  job.max_queue = std::chrono::milliseconds(864'000'000'000);  // (past 32 bits)
  job.webhook_events = rebound::webhook_completed | rebound::webhook_started;
  job.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  job.model = rebound::ModelRef{"m,(x)", "12"};
  const std::string key = rebound::key_of(job);
  REQUIRE(store.put(job, Lease{"h", now + 30s}) == PutOutcome::created);
  const auto same_request = [&](const rebound::JobRecord& r) {
    CHECK(r.job.id == job.id);
    CHECK(r.job.tenant == job.tenant);
    CHECK(r.job.callback_url == job.callback_url);
    CHECK(r.job.input == job.input);
    CHECK(r.job.created_at == job.created_at);
    CHECK(r.job.priority == 9);
    CHECK(r.job.max_queue == job.max_queue);
    CHECK(r.job.webhook_events == job.webhook_events);
    CHECK(r.job.traceparent == job.traceparent);
    CHECK(r.job.model.name == "m,(x)");
  };
  const auto put = store.get(key);
  REQUIRE(put);
  same_request(*put);
  CHECK(put->job.model.version == "12");
  CHECK(put->status == JobStatus::queued);
  CHECK_FALSE(put->outcome.error);

  // The finish (an update): a result (its error columns NULL), the version that ran it, then an
  // attempt: an error text, times before and after 1970, a delay past 32 bits.
  rebound::JobOutcome ok{JobStatus::succeeded, {{"r", "\"}\\"}, {"big", 1LL << 40}}, std::nullopt};
  ok.ran_on_version = "13";
  REQUIRE(store.finish_job(key, "h", ok, Lease{"cb", now + 30s}, now + 5ms));
  rebound::CallbackInfo tried;
  tried.state = rebound::CallbackState::pending;
  tried.attempts = 3;
  tried.last_error = "HTTP 500: \"(nope)\", {x}";
  tried.next_attempt_at = std::chrono::system_clock::time_point{} - 1h;  // (before 1970: due)
  tried.delivery_attempts = 3;
  tried.delivery_started_at = now + 1ms;
  tried.previous_delay = std::chrono::milliseconds(4'000'000'000);
  REQUIRE(store.record_attempt(key, "cb", tried, now + 6ms));
  const auto done = store.get(key);
  REQUIRE(done);
  same_request(*done);
  CHECK(done->status == JobStatus::succeeded);
  CHECK(done->outcome.result == ok.result);
  CHECK_FALSE(done->outcome.error);
  CHECK(done->job.model.version == "13");
  CHECK(done->callback.attempts == 3);
  CHECK(done->callback.last_error == tried.last_error);
  CHECK(done->callback.next_attempt_at == tried.next_attempt_at);
  CHECK(done->callback.delivery_started_at == tried.delivery_started_at);
  CHECK(done->callback.previous_delay == tried.previous_delay);
  CHECK_FALSE(store.failure());
}

TEST_CASE("postgres store: a jobs table made again under a running server - its writes go on") {
  // The writer sends rows of the table's row type, named by its OID, read at start: a table made
  // again (a restore, a schema recreated by hand) has another. PostgreSQL checks each field's
  // type, not the array's, so the writes go on; the rows the writer remembers are the old
  // table's versions, and its next write of one finds it changed and reads it.
  const std::string schema = PostgresServer::fresh_schema();
  PostgresJobStore store(options_for(shared_postgres().uri(schema)));
  const auto now = std::chrono::system_clock::now();
  REQUIRE(store.put(job_named("before"), Lease{"h", now + 30s}) == PutOutcome::created);
  const std::string made = shared_postgres().psql(
      "BEGIN; ALTER TABLE " + schema + ".jobs RENAME TO jobs_old; CREATE TABLE " + schema +
      ".jobs (LIKE " + schema + ".jobs_old INCLUDING ALL); INSERT INTO " + schema +
      ".jobs SELECT * FROM " + schema + ".jobs_old; DROP TABLE " + schema + ".jobs_old; COMMIT");
  REQUIRE(made == "");
  CHECK(store.put(job_named("after"), Lease{"h", now + 30s}) == PutOutcome::created);
  const std::size_t retried = store.retried_transactions();
  const rebound::JobOutcome ok{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  CHECK(store.finish_job("before", "h", ok, std::nullopt, now));
  CHECK(store.retried_transactions() == retried + 1);  // (from memory, then read)
  CHECK(store.get("before")->status == JobStatus::succeeded);
  CHECK(store.get("after"));
  CHECK_FALSE(store.failure());
}

TEST_CASE("postgres store: pruning keeps a job that is owed a callback again") {
  auto options = options_for(shared_postgres().uri(PostgresServer::fresh_schema()));
  PostgresJobStore store(options);
  const auto now = std::chrono::system_clock::now();
  REQUIRE(store.put(job_named("dead"), Lease{"h", now + 30s}) == PutOutcome::created);
  const rebound::JobOutcome ok{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  REQUIRE(store.finish_job("dead", "h", ok, Lease{"cb", now + 30s}, now));
  rebound::CallbackInfo given_up;
  given_up.state = rebound::CallbackState::failed;
  REQUIRE(store.record_attempt("dead", "cb", given_up, now));
  REQUIRE(store.redeliver("dead", Lease{"cb2", now + 30s}, now) ==
          rebound::RedeliverOutcome::redelivered);
  CHECK(store.prune(now + 48h) == 0);
  REQUIRE(store.get("dead"));
  // The result written at the finish survives the attempts and the redelivery (not rewritten).
  CHECK(store.get("dead")->outcome.result == nlohmann::json{{"y", 1}});
}

namespace {

// Counts a store's wake-ups (watch_work) and waits for them.
struct Wakes {
  std::mutex mutex;
  std::condition_variable changed;
  int count = 0;

  std::function<void()> watcher() {
    return [this] {
      std::lock_guard<std::mutex> lock(mutex);
      ++count;
      changed.notify_all();
    };
  }
  int now() {
    std::lock_guard<std::mutex> lock(mutex);
    return count;
  }
  // True once more than `than` came, within 5 s.
  bool more_than(int than) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, 5s, [&] { return count > than; });
  }
};

}  // namespace

TEST_CASE("postgres store: notify=1 wakes the other servers for work anyone may claim - not else") {
  const std::string uri = shared_postgres().uri(PostgresServer::fresh_schema()) + "&notify=1";
  REQUIRE(options_for(uri).notify);
  Wakes wakes, own;  // (before the stores: they outlive their listeners)
  PostgresJobStore a(options_for(uri)), b(options_for(uri));
  const auto watch = b.watch_work(wakes.watcher());
  REQUIRE(watch != 0);
  a.watch_work(own.watcher());
  const auto now = std::chrono::system_clock::now();
  // A job its server runs itself (put claimed) wakes no one.
  REQUIRE(a.put(job_named("mine"), Lease{"a", now + 30s}) == PutOutcome::created);
  std::this_thread::sleep_for(500ms);
  CHECK(wakes.now() == 0);
  // A job put for anyone (its server had no room for it) wakes the other servers.
  REQUIRE(a.put(job_named("anyone")) == PutOutcome::created);
  CHECK(wakes.more_than(0));
  // So does a lease handed back (a server that stops).
  int seen = wakes.now();
  REQUIRE(a.renew("mine", Lease{"a", now}, now));
  CHECK(wakes.more_than(seen));
  // Once unwatched, never again.
  b.unwatch_work(watch);
  seen = wakes.now();
  REQUIRE(a.put(job_named("later")) == PutOutcome::created);
  std::this_thread::sleep_for(500ms);
  CHECK(wakes.now() == seen);
  // A store's own notifications do not wake it.
  CHECK(own.now() == 0);
  // Without notify a store wakes no one: its queues poll.
  PostgresJobStore plain(options_for(shared_postgres().uri(PostgresServer::fresh_schema())));
  CHECK(plain.watch_work(wakes.watcher()) == 0);
}

TEST_CASE("postgres store: the listener of notify=1 listens again after its connection is cut") {
  const std::string schema = PostgresServer::fresh_schema();
  const std::string uri = shared_postgres().uri(schema) + "&notify=1";
  Wakes wakes;  // (before the stores: it outlives their listeners)
  PostgresJobStore a(options_for(uri)), b(options_for(uri));
  b.watch_work(wakes.watcher());
  // Both stores' listening sessions ended by the server.
  const std::string cut = shared_postgres().psql(
      "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = 'LISTEN ' ||"
      " chr(34) || 'rebound_" +
      schema + "' || chr(34)");
  REQUIRE(std::stoi(cut) == 2);
  // Listening again, the store wakes its watchers once (what came meanwhile is not known)...
  REQUIRE(wakes.more_than(0));
  // ... and hears the next notification.
  const int seen = wakes.now();
  REQUIRE(a.put(job_named("after")) == PutOutcome::created);
  CHECK(wakes.more_than(seen));
}

TEST_CASE("postgres store: a JobQueue with notify=1 runs a job another server left at once") {
  // The same queue (its poll a minute) with and without notify=1 on both servers' stores.
  for (const bool notify : {false, true}) {
    CAPTURE(notify);
    const std::string uri =
        shared_postgres().uri(PostgresServer::fresh_schema()) + (notify ? "&notify=1" : "");
    PostgresJobStore other(options_for(uri));  // another server's store
    rebound::JobQueueOptions o;
    o.workers = 1;
    o.poll_interval = 60s;  // (without a wake-up the job waits for the next poll)
    rebound::JobQueue queue(std::make_unique<rebound::EchoModel>(),
                            std::make_unique<PostgresJobStore>(options_for(uri)), o);
    Job job = job_named("left");
    job.callback_url.clear();
    REQUIRE(other.put(job) == PutOutcome::created);  // for anyone: its server had no room
    std::optional<rebound::JobRecord> record;
    rebound::test::eventually(
        [&] {
          record = other.get("left");
          return record && record->status == JobStatus::succeeded;
        },
        notify ? 10s : 2s);
    REQUIRE(record);
    if (!notify) {
      CHECK(record->status == JobStatus::queued);  // after 2 s: it waits for the poll
      continue;
    }
    CHECK(record->status == JobStatus::succeeded);
    CHECK(record->outcome.result == nlohmann::json{{"x", 1}});
  }
}

namespace {
std::size_t counter(const rebound::JobStore& store, const std::string& name) {
  for (const auto& c : store.counters()) {
    if (c.name == name) return static_cast<std::size_t>(c.value);
  }
  FAIL("no counter " << name);
  return 0;
}
}  // namespace

TEST_CASE("postgres store: a row written last is taken from memory - and read again if changed") {
  // The writer remembers the rows it wrote that are to be written again and that nobody else is
  // to change meanwhile (every due time of theirs leased past the memory's life): a job's finish
  // after the put of the server that runs it, a callback's end after the finish that leased it to
  // this server. A row changed all the same (another server with the same holder's name, here)
  // fails its update's version check: the write is decided again on the row as stored.
  const std::string uri = shared_postgres().uri(PostgresServer::fresh_schema());
  PostgresJobStore a(options_for(uri));
  const auto now = std::chrono::system_clock::now();
  const rebound::JobOutcome ok{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  rebound::CallbackInfo delivered;
  delivered.state = rebound::CallbackState::delivered;
  delivered.attempts = 1;

  REQUIRE(a.put(job_named("calm"), Lease{"h", now + 30s}) == PutOutcome::created);
  const std::size_t recalled = counter(a, "rows_recalled_total");
  REQUIRE(a.finish_job("calm", "h", ok, Lease{"cb", now + 30s}, now));
  CHECK(counter(a, "rows_recalled_total") == recalled + 1);  // (the put's row)
  REQUIRE(a.record_attempt("calm", "cb", delivered, now + 1ms));
  CHECK(counter(a, "rows_recalled_total") == recalled + 2);  // (the finish's row)
  CHECK(a.get("calm")->callback.state == rebound::CallbackState::delivered);
  CHECK(a.retried_transactions() == 0);
  // A job's end is not remembered (only a redelivery writes it again), nor a job that any server
  // may claim now (put without a lease): each is read.
  REQUIRE(a.put(job_named("open")) == PutOutcome::created);
  CHECK(a.cancel("open", {JobStatus::cancelled, nullptr, rebound::ErrorInfo{"cancelled", "x"}},
                 now) == rebound::CancelOutcome::cancelled);
  CHECK(counter(a, "rows_recalled_total") == recalled + 2);

  // Another server changes the row after this one remembered it: its delivery of the callback
  // (it names the same holder) ends the lease.
  REQUIRE(a.put(job_named("changed"), Lease{"h", now + 30s}) == PutOutcome::created);
  REQUIRE(a.finish_job("changed", "h", ok, Lease{"cb", now + 30s}, now));
  PostgresJobStore b(options_for(uri));
  rebound::CallbackInfo retry;
  retry.state = rebound::CallbackState::pending;
  retry.attempts = 1;
  retry.last_error = "HTTP 503 (from b)";
  retry.next_attempt_at = now + 1h;
  REQUIRE(b.record_attempt("changed", "cb", retry, now + 1ms));
  // From memory, the lease is a's to end; as stored, nobody holds it: refused, nothing written.
  const std::size_t retried = a.retried_transactions();
  CHECK_FALSE(a.record_attempt("changed", "cb", delivered, now + 2ms));
  CHECK(a.retried_transactions() == retried + 1);
  const auto stored = a.get("changed");
  REQUIRE(stored);
  CHECK(stored->callback.state == rebound::CallbackState::pending);
  CHECK(stored->callback.last_error == "HTTP 503 (from b)");
  // And what the refused try read is not remembered in its place: the next write reads too.
  const std::size_t before = counter(a, "rows_recalled_total");
  CHECK(a.redeliver("changed", Lease{"cb2", now + 30s}, now + 3ms) ==
        rebound::RedeliverOutcome::not_failed);
  CHECK(counter(a, "rows_recalled_total") == before);

  // A write that memory would refuse (no change to check by version) is decided on the row as
  // stored too: another server gave up the callback and redelivered it under a lease named as
  // one of this server's.
  REQUIRE(a.put(job_named("handed"), Lease{"h", now + 30s}) == PutOutcome::created);
  REQUIRE(a.finish_job("handed", "h", ok, Lease{"cb", now + 30s}, now));
  rebound::CallbackInfo given_up = retry;
  given_up.state = rebound::CallbackState::failed;
  REQUIRE(b.record_attempt("handed", "cb", given_up, now + 1ms));
  REQUIRE(b.redeliver("handed", Lease{"cb2", now + 30s}, now + 2ms) ==
          rebound::RedeliverOutcome::redelivered);
  CHECK(a.record_attempt("handed", "cb2", delivered, now + 3ms));
  CHECK(a.get("handed")->callback.state == rebound::CallbackState::delivered);
}

// Puts `n` jobs named `prefix` and a number, 1,000 a put_many, leased to "h" for a minute.
std::vector<Job> put_leased(PostgresJobStore& store, const std::string& prefix, int n,
                            std::chrono::system_clock::time_point now) {
  std::vector<Job> jobs;
  jobs.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    jobs.push_back(job_named(prefix + std::to_string(i)));
  for (int from = 0; from < n; from += 1000) {
    std::vector<rebound::PutRequest> requests;
    for (int i = from; i < std::min(n, from + 1000); ++i)
      requests.push_back({&jobs[static_cast<std::size_t>(i)], Lease{"h", now + 60s}});
    for (const PutOutcome o : store.put_many(requests))
      REQUIRE(o == PutOutcome::created);
  }
  return jobs;
}

TEST_CASE("postgres store: the rows of ten thousand jobs in flight are all taken from memory") {
  // A server takes in up to its queue's capacity at once (10,000 by default): each of those
  // jobs' next write (the finish after the put, the callback's end after the finish) finds its
  // row in the writers' memory. (With 4 MiB of memory, about 3,200 rows, the oldest were
  // forgotten before their next write and read again.)
  const std::string uri = shared_postgres().uri(PostgresServer::fresh_schema());
  PostgresJobStore store(options_for(uri));
  const auto now = std::chrono::system_clock::now();
  // A row is remembered for 5 s: where the writes took longer than 4 s (a sanitizer's build on
  // a busy machine), the oldest rows may rightly have been forgotten, and the counts are not
  // checked.
  const auto in_time = [](std::chrono::steady_clock::time_point since) {
    const bool fast = std::chrono::steady_clock::now() - since < 4s;
    if (!fast) MESSAGE("the writes took more than 4 s: the rows recalled are not counted");
    return fast;
  };
  const auto started = std::chrono::steady_clock::now();
  constexpr int n = 10000;
  const std::vector<Job> jobs = put_leased(store, "inflight-", n, now);
  const std::size_t recalled = counter(store, "rows_recalled_total");
  // Every finish at once (the writer groups them), then every callback's end.
  const auto all =
      [&](const std::function<void(const std::string&, std::function<void(bool)>)>& call) {
        // (Shared with the answers: those still to come when a check below fails outlive it.)
        struct Answers {
          std::mutex m;
          std::condition_variable cv;
          int answered = 0, written = 0;
        };
        auto answers = std::make_shared<Answers>();
        for (const Job& job : jobs) {
          call(job.id, [answers](bool ok) {
            std::lock_guard<std::mutex> lock(answers->m);
            ++answers->answered;
            answers->written += ok;
            answers->cv.notify_all();
          });
        }
        std::unique_lock<std::mutex> lock(answers->m);
        REQUIRE(answers->cv.wait_for(lock, 60s, [&] { return answers->answered == n; }));
        return answers->written;
      };
  const rebound::JobOutcome ok{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  const auto finishing = std::chrono::steady_clock::now();  // (the finishes' rows from here)
  CHECK(all([&](const std::string& id, std::function<void(bool)> done) {
          store.async_finish_job(id, "h", ok, Lease{"cb", now + 60s}, now, false,
                                 [done](std::exception_ptr e, auto a) { done(!e && a.held); });
        }) == n);
  if (in_time(started)) CHECK(counter(store, "rows_recalled_total") == recalled + n);
  const std::size_t recalled_finishes = counter(store, "rows_recalled_total");
  rebound::CallbackInfo delivered;
  delivered.state = rebound::CallbackState::delivered;
  delivered.attempts = 1;
  CHECK(all([&](const std::string& id, std::function<void(bool)> done) {
          store.async_record_attempt(id, "cb", delivered, now + 1ms, std::nullopt,
                                     [done](std::exception_ptr e, bool a) { done(!e && a); });
        }) == n);
  if (in_time(finishing)) CHECK(counter(store, "rows_recalled_total") == recalled_finishes + n);
  CHECK(store.get("inflight-9999")->callback.state == rebound::CallbackState::delivered);
  CHECK(store.retried_transactions() == 0);
}

TEST_CASE("postgres store: the writers' memory is bounded - the oldest rows are forgotten first") {
  // 16,384 rows or 16 MiB a store (about 12,000 rows of these jobs as counted): after 20,000
  // puts the first job's row is no longer remembered (its finish reads it), the last one's is.
  const std::string uri = shared_postgres().uri(PostgresServer::fresh_schema());
  PostgresJobStore store(options_for(uri));
  const auto now = std::chrono::system_clock::now();
  const auto started = std::chrono::steady_clock::now();
  constexpr int n = 20000;
  const std::vector<Job> jobs = put_leased(store, "bounded-", n, now);
  const rebound::JobOutcome ok{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  const auto finish = [&](const std::string& id) {
    std::promise<bool> held;
    store.async_finish_job(id, "h", ok, std::nullopt, now, false,
                           [&held](std::exception_ptr e, auto a) { held.set_value(!e && a.held); });
    return held.get_future().get();
  };
  const std::size_t before = counter(store, "rows_recalled_total");
  CHECK(finish("bounded-0"));
  CHECK(counter(store, "rows_recalled_total") == before);  // read from the database
  CHECK(finish("bounded-" + std::to_string(n - 1)));
  // (Remembered for 5 s: checked where the writes took less than 4 s.)
  if (std::chrono::steady_clock::now() - started < 4s)
    CHECK(counter(store, "rows_recalled_total") == before + 1);
  else
    MESSAGE("the writes took more than 4 s: the last row's recall is not checked");
  CHECK(store.get("bounded-0")->status == JobStatus::succeeded);
  CHECK(store.retried_transactions() == 0);
}

TEST_CASE("postgres store: /metrics counts the writers' transactions - and those made again") {
  // JobStore::counters, rendered by the queue's metrics (rebound-server's /metrics).
  const std::string uri = shared_postgres().uri(PostgresServer::fresh_schema());
  rebound::JobQueueOptions o;
  o.workers = 1;
  auto owned = std::make_unique<PostgresJobStore>(options_for(uri));
  PostgresJobStore& store = *owned;
  rebound::JobQueue queue(std::make_unique<rebound::EchoModel>(), std::move(owned), o);
  const auto value_of = [](const std::string& text, const std::string& name) {
    const auto at = text.find("\n" + name + " ");
    REQUIRE_MESSAGE(at != std::string::npos, name);
    return std::stoull(text.substr(at + name.size() + 2));
  };
  Job job = job_named("counted");
  job.callback_url.clear();
  queue.submit(job, boost::asio::use_future).get();  // (accepted: stored)
  rebound::test::eventually(
      [&] {
        const auto record = store.get("counted");
        return record && record->status == JobStatus::succeeded;
      },
      10s);
  const std::string text = queue.telemetry().render_metrics();
  CHECK(text.find("# TYPE rebound_store_transactions_total counter\n") != std::string::npos);
  CHECK(value_of(text, "rebound_store_transactions_total") >= 2);  // (the put, the finish)
  CHECK(value_of(text, "rebound_store_transactions_total") <= store.commits());
  CHECK(value_of(text, "rebound_store_transactions_retried_total") == 0);
  // A transaction made again shows: another server cancels the job this one holds, after this
  // one read it (the writer's read hook), so its update finds the row changed.
  Job held = job_named("contended");
  held.callback_url.clear();
  const auto now = std::chrono::system_clock::now();
  REQUIRE(store.put(held, Lease{"me", now + 60s}) == PutOutcome::created);
  PostgresJobStore other(options_for(uri));
  std::atomic<bool> armed{true};
  {
    ReadHook hook([&] {
      if (!armed.exchange(false)) return;
      CHECK(other.cancel("contended",
                         {JobStatus::cancelled, nullptr, rebound::ErrorInfo{"cancelled", "by b"}},
                         now) == rebound::CancelOutcome::cancelled);
    });
    store.renew("contended", Lease{"me", now + 90s}, now);
  }
  CHECK(value_of(queue.telemetry().render_metrics(), "rebound_store_transactions_retried_total") ==
        store.retried_transactions());
  CHECK(store.retried_transactions() >= 1);
}
