// SqliteJobStore: the JobStore contract on a real SQLite file, durability across reopening,
// group commit, the single-process lock, pruning, and a JobQueue resuming a store's unfinished
// jobs.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <sqlite3.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include "rebound/delivery/curl_transport.hpp"
#include "rebound/job_queue.hpp"
#include "rebound/store/sqlite_job_store.hpp"
#include "store/sqlite_testing.hpp"
#include "support/put_all.hpp"
#include "support/receiver.hpp"
#include "support/scoped_hook.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using rebound::CallbackState;
using rebound::Job;
using rebound::JobStatus;
using rebound::PutOutcome;
using rebound::SqliteJobStore;

namespace {

// The store's file in a fresh folder.
struct TempDb {
  rebound::test::TempDir dir;
  std::string path() const { return dir.file("jobs.db"); }
};

// What files before schema 8 lacked: the model a job runs on (schema 8 adds the columns).
#define DROP_MODEL_COLUMNS \
  "ALTER TABLE jobs DROP COLUMN model; ALTER TABLE jobs DROP COLUMN model_version; "

// Runs `sql` on the store's file as another program would (the store closed): true when it ran.
bool exec_on_file(const std::string& path, const char* sql) {
  sqlite3* raw = nullptr;
  const bool ran = sqlite3_open(path.c_str(), &raw) == SQLITE_OK &&
                   sqlite3_exec(raw, sql, nullptr, nullptr, nullptr) == SQLITE_OK;
  sqlite3_close(raw);
  return ran;
}

Job make(const std::string& id, const std::string& url = "http://example.com/cb",
         nlohmann::json input = {{"x", 1}}) {
  return Job{id, url, std::move(input), std::chrono::system_clock::now()};
}

// The clock of the tests that pass their own times.
const auto fixed_now =
    std::chrono::system_clock::time_point(std::chrono::milliseconds(1'700'000'000'000));

// Puts `prefix`0 .. `prefix`(n-1), held by `lease` (as the server that accepts a job holds it).
void put_held(SqliteJobStore& store, const std::string& prefix, int n,
              const rebound::Lease& lease) {
  for (int i = 0; i < n; ++i)
    REQUIRE(store.put(make(prefix + std::to_string(i)), lease) == PutOutcome::created);
}

}  // namespace

TEST_CASE("sqlite: everything survives closing and reopening the file") {
  TempDb db;
  const auto created = std::chrono::system_clock::now();
  {
    SqliteJobStore store(db.path());
    store.put(Job{"queued", "http://example.com/cb", {1, 2}, created});
    store.put(make("running"));
    store.mark_running("running", std::chrono::system_clock::now());
    store.put(make("undelivered"));
    store.complete("undelivered", {JobStatus::succeeded, "OK", std::nullopt});
    store.update_callback("undelivered", {CallbackState::pending, 1, "HTTP 500"});
    store.put(make("done"));
    store.complete("done", {JobStatus::succeeded, "OK", std::nullopt});
    store.update_callback("done", {CallbackState::delivered, 1, {}});
    store.put(make("dead"));
    store.complete("dead", {JobStatus::succeeded, "OK", std::nullopt});
    store.update_callback("dead", {CallbackState::failed, 5, "HTTP 500"});
  }
  SqliteJobStore store(db.path());
  auto q = store.get("queued");
  REQUIRE(q);
  CHECK(q->job.input == nlohmann::json({1, 2}));
  CHECK(
      std::chrono::duration_cast<std::chrono::milliseconds>(q->job.created_at - created).count() ==
      0);
  std::set<std::string> unfinished;
  for (const auto& r : store.list_unfinished(100))
    unfinished.insert(r.job.id);
  CHECK(unfinished == std::set<std::string>{"queued", "running", "undelivered"});
  auto failed = store.list_failed_callbacks(10);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].job.id == "dead");
  CHECK(store.get("done")->callback.state == CallbackState::delivered);
}

TEST_CASE("sqlite: a file from before the tenant field gets each job's tenant in place - once") {
  TempDb db;
  {
    SqliteJobStore store(db.path());
    Job acme = make("7");
    acme.tenant = "acme";
    REQUIRE(store.put(acme) == PutOutcome::created);
    REQUIRE(store.put(make("plain")) == PutOutcome::created);
  }
  // What a file of version 4 held: the key alone said whose job it was.
  CHECK(exec_on_file(db.path(),
                     "DROP INDEX jobs_failed_tenant; DROP INDEX jobs_tenant_due; "
                     "CREATE INDEX jobs_job_due ON jobs (priority, job_due_ms) WHERE job_due_ms "
                     "IS NOT NULL; ALTER TABLE jobs DROP COLUMN tenant; " DROP_MODEL_COLUMNS
                     "PRAGMA user_version = 4;"));
  SqliteJobStore store(db.path());
  const auto acme = store.get("acme/7");
  REQUIRE(acme);
  CHECK(acme->job.tenant == "acme");
  CHECK(acme->job.id == "7");
  const auto plain = store.get("plain");
  REQUIRE(plain);
  CHECK(plain->job.tenant.empty());
  CHECK(plain->job.id == "plain");
}

TEST_CASE("sqlite: a tenant's dead-letter page is its own index range - nobody else's rows") {
  TempDb db;
  {
    SqliteJobStore store(db.path());
    REQUIRE(store.put(make("x")) == PutOutcome::created);
  }
  // What the store asks for one tenant's page, as SQLite plans it: a range of the tenant's own
  // index, newest first, with no sort and no other tenant's rows in the walk.
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(db.path().c_str(), &raw) == SQLITE_OK);
  sqlite3_stmt* plan = nullptr;
  REQUIRE(sqlite3_prepare_v2(raw,
                             "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE cb_state = 3 AND "
                             "tenant = 'globex' AND (created_at_ms, id) < (9000000000000, '') "
                             "ORDER BY created_at_ms DESC, id DESC LIMIT 10",
                             -1, &plan, nullptr) == SQLITE_OK);
  std::string steps;
  while (sqlite3_step(plan) == SQLITE_ROW)
    steps += std::string(reinterpret_cast<const char*>(sqlite3_column_text(plan, 3))) + "\n";
  sqlite3_finalize(plan);
  sqlite3_close(raw);
  CAPTURE(steps);
  CHECK(steps.find("jobs_failed_tenant (tenant=? AND") != std::string::npos);
  CHECK(steps.find("TEMP B-TREE") == std::string::npos);
}

TEST_CASE("sqlite: a file of schema 5 gets the tenants' dead-letter index in place") {
  TempDb db;
  {
    SqliteJobStore store(db.path());
    Job acme = make("7");
    acme.tenant = "acme";
    REQUIRE(store.put(acme) == PutOutcome::created);
  }
  auto has_index = [&] {
    sqlite3* raw = nullptr;
    REQUIRE(sqlite3_open(db.path().c_str(), &raw) == SQLITE_OK);
    sqlite3_stmt* s = nullptr;
    REQUIRE(sqlite3_prepare_v2(raw,
                               "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND "
                               "name = 'jobs_failed_tenant'",
                               -1, &s, nullptr) == SQLITE_OK);
    REQUIRE(sqlite3_step(s) == SQLITE_ROW);
    const bool found = sqlite3_column_int(s, 0) == 1;
    sqlite3_finalize(s);
    sqlite3_close(raw);
    return found;
  };
  CHECK(has_index());
  // What a file of version 5 held: no such index.
  CHECK(exec_on_file(db.path(),
                     "DROP INDEX jobs_failed_tenant; DROP INDEX jobs_tenant_due; CREATE INDEX "
                     "jobs_job_due ON jobs (priority, job_due_ms) WHERE job_due_ms IS NOT "
                     "NULL; " DROP_MODEL_COLUMNS "PRAGMA user_version = 5;"));
  CHECK_FALSE(has_index());
  {
    SqliteJobStore store(db.path());
    CHECK(store.get("acme/7"));
    CHECK(store.failed_callbacks_page("acme/", std::nullopt, 10).jobs.empty());
  }
  CHECK(has_index());
}

namespace {
// How SQLite plans `sql` on the file at `path`: its steps, one a line.
std::string query_plan(const std::string& path, const std::string& sql) {
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &raw) == SQLITE_OK);
  sqlite3_stmt* plan = nullptr;
  REQUIRE(sqlite3_prepare_v2(raw, ("EXPLAIN QUERY PLAN " + sql).c_str(), -1, &plan, nullptr) ==
          SQLITE_OK);
  std::string steps;
  while (sqlite3_step(plan) == SQLITE_ROW)
    steps += std::string(reinterpret_cast<const char*>(sqlite3_column_text(plan, 3))) + "\n";
  sqlite3_finalize(plan);
  sqlite3_close(raw);
  return steps;
}
}  // namespace

TEST_CASE("sqlite: a file of schema 6 gets each tenant's due range in place - claims take turns") {
  TempDb db;
  {
    SqliteJobStore store(db.path());
    REQUIRE(store.put(make("x")) == PutOutcome::created);
  }
  // What a file of version 6 held: the due jobs of every tenant in one index.
  CHECK(exec_on_file(db.path(),
                     "DROP INDEX jobs_tenant_due; CREATE INDEX jobs_job_due ON jobs (priority, "
                     "job_due_ms) WHERE job_due_ms IS NOT NULL; " DROP_MODEL_COLUMNS
                     "PRAGMA user_version = 6;"));
  {
    SqliteJobStore store(db.path());
    Job flood = make("f1");
    flood.tenant = "evil";
    flood.priority = 0;
    REQUIRE(store.put(flood) == PutOutcome::created);
    const auto now = std::chrono::system_clock::now() + std::chrono::hours(1);
    const auto first = store.claim_jobs(1, {"s/1", now + std::chrono::seconds(30)}, now);
    REQUIRE(first.size() == 1);
    CHECK(first[0].job.id == "x");  // the default tenant's turn first, whatever evil's priority
  }
  // A claim's queries, as SQLite plans them: the tenants found by a skip over the index, and
  // each tenant's due jobs of one priority a range of it, in order (no sort, no other tenant's).
  const std::string next_tenant = query_plan(
      db.path(),
      "SELECT tenant FROM jobs WHERE job_due_ms IS NOT NULL AND tenant > 'a' ORDER BY tenant "
      "LIMIT 1");
  CAPTURE(next_tenant);
  CHECK(next_tenant.find("jobs_tenant_due (tenant>?)") != std::string::npos);
  const std::string due = query_plan(db.path(),
                                     "SELECT id FROM jobs WHERE tenant = 'acme' AND priority = 5 "
                                     "AND job_due_ms <= 1 ORDER BY job_due_ms");
  CAPTURE(due);
  CHECK(due.find("jobs_tenant_due (tenant=? AND priority=? AND job_due_ms<?)") !=
        std::string::npos);
  CHECK(due.find("TEMP B-TREE") == std::string::npos);
}

TEST_CASE("sqlite: a file of schema 7 gains the model columns in place - its jobs name none") {
  TempDb db;
  {
    SqliteJobStore store(db.path());
    REQUIRE(store.put(make("old")) == PutOutcome::created);
  }
  // What a file of version 7 held: no model columns.
  CHECK(exec_on_file(db.path(), DROP_MODEL_COLUMNS "PRAGMA user_version = 7;"));
  SqliteJobStore store(db.path());
  CHECK(store.get("old")->job.model.empty());
  Job named = make("new");
  named.model = {"iris", "3"};
  REQUIRE(store.put(named) == PutOutcome::created);
  CHECK(store.get("new")->job.model == rebound::ModelRef{"iris", "3"});
  Job again = make("old");
  again.model = {"iris", "3"};
  CHECK(store.put(again) == PutOutcome::duplicate);  // stored by an older server: matches any
}

TEST_CASE("sqlite: a status or callback state another program wrote out of range reads safely") {
  TempDb db;
  {
    SqliteJobStore store(db.path());
    REQUIRE(store.put(make("odd")) == PutOutcome::created);
  }
  CHECK(exec_on_file(db.path(), "UPDATE jobs SET status = 9, cb_state = -4 WHERE id = 'odd';"));
  SqliteJobStore store(db.path());
  const auto odd = store.get("odd");
  REQUIRE(odd);
  CHECK(odd->status == rebound::JobStatus::failed);
  CHECK(odd->callback.state == rebound::CallbackState::none);
}

TEST_CASE("sqlite: concurrent submissions share commits (group commit)") {
  TempDb db;
  SqliteJobStore store(db.path());
  const std::size_t before = store.commits();
  constexpr int threads = 8, per_thread = 50;
  std::vector<std::thread> ts;
  std::atomic<int> created{0};
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        created += store.put(make("g-" + std::to_string(t) + "-" + std::to_string(i))) ==
                   PutOutcome::created;
      }
    });
  }
  for (auto& t : ts)
    t.join();
  CHECK(created == threads * per_thread);
  const std::size_t commits = store.commits() - before;
  MESSAGE((threads * per_thread) << " durable puts in " << commits << " commits");
  CHECK(commits < static_cast<std::size_t>(threads * per_thread));
  CHECK(store.list_unfinished(1000).size() == threads * per_thread);
}

TEST_CASE("sqlite: one thread's asynchronous puts wait for no commit - they share commits") {
  TempDb db;
  SqliteJobStore store(db.path());
  const std::size_t before = store.commits();
  constexpr int jobs = 400;
  std::mutex mutex;
  std::condition_variable all_answered;
  int created = 0, answered = 0, on_caller = 0;
  const auto caller = std::this_thread::get_id();
  for (int i = 0; i < jobs; ++i) {
    store.async_put(make("a-" + std::to_string(i)), std::nullopt,
                    [&](std::exception_ptr error, PutOutcome outcome) {
                      std::lock_guard<std::mutex> lock(mutex);
                      created += !error && outcome == PutOutcome::created;
                      on_caller += std::this_thread::get_id() == caller;
                      if (++answered == jobs) all_answered.notify_all();
                    });
  }
  std::unique_lock<std::mutex> lock(mutex);
  REQUIRE(all_answered.wait_for(lock, std::chrono::seconds(30), [&] { return answered == jobs; }));
  CHECK(created == jobs);
  CHECK(on_caller == 0);  // answered from the writer, after the commit
  const std::size_t commits = store.commits() - before;
  MESSAGE(jobs << " asynchronous puts from one thread in " << commits << " commits");
  CHECK(commits < static_cast<std::size_t>(jobs) / 4);
  CHECK(store.list_unfinished(1000).size() == jobs);
}

TEST_CASE("sqlite: a job marked running and finished in one transaction keeps when it started") {
  // A short model under load: the mark and the finish reach the writer together and are written
  // as one row write (the row read once a transaction). Either way, a reader sees the same.
  TempDb db;
  SqliteJobStore store(db.path());
  const auto t0 = fixed_now;
  const rebound::Lease lease{"worker", t0 + 1h};
  constexpr int jobs = 300;
  put_held(store, "f-", jobs, lease);
  REQUIRE(store.put(make("only-marked"), lease) == PutOutcome::created);
  REQUIRE(store.put(make("never-marked"), lease) == PutOutcome::created);
  const rebound::JobOutcome done(JobStatus::succeeded, nlohmann::json{{"y", 2}}, std::nullopt,
                                 t0 + 5s);
  const std::size_t before = store.commits();
  for (int i = 0; i < jobs; ++i) {
    const std::string id = "f-" + std::to_string(i);
    store.mark_running(id, t0 + std::chrono::milliseconds(i));
    REQUIRE(store.finish_job(id, "worker", done, std::nullopt, t0 + 5s));
  }
  store.mark_running("only-marked", t0 + 7s);
  REQUIRE(store.finish_job("never-marked", "worker", done, std::nullopt, t0 + 5s));
  store.mark_running("never-marked", t0 + 9s);  // after its finish: changes nothing
  for (int i = 0; i < jobs; ++i) {
    const auto r = store.get("f-" + std::to_string(i));
    REQUIRE(r);
    CHECK(r->status == JobStatus::succeeded);
    CHECK(r->started_at == t0 + std::chrono::milliseconds(i));
    CHECK(r->outcome.result == nlohmann::json{{"y", 2}});
  }
  MESSAGE((2 * jobs) << " marks and finishes in " << store.commits() - before << " commits");
  const auto marked = store.get("only-marked");
  CHECK(marked->status == JobStatus::running);
  CHECK(marked->started_at == t0 + 7s);
  const auto unmarked = store.get("never-marked");
  CHECK(unmarked->status == JobStatus::succeeded);
  CHECK(unmarked->started_at == std::chrono::system_clock::time_point{});
}

TEST_CASE("sqlite: a job's finish and its callback's attempts in one transaction apply in order") {
  // The writer reads a job's row once a transaction and applies each queued write's rule
  // (job_state.hpp) to it in order, writing it once: under load a finish, its callback's attempt
  // and a renewal reach it together. What a reader sees is what they would leave one by one.
  TempDb db;
  SqliteJobStore store(db.path());
  const auto t0 = fixed_now;
  const rebound::Lease lease{"worker", t0 + 1h};
  constexpr int jobs = 200;
  put_held(store, "a-", jobs, lease);
  REQUIRE(store.put(make("quiet", ""), lease) == PutOutcome::created);  // no callback
  const rebound::JobOutcome done(JobStatus::succeeded, nlohmann::json{{"y", 3}}, std::nullopt,
                                 t0 + 5s);
  rebound::CallbackInfo retry;  // the first attempt failed: due again at t0 + 10 s
  retry.state = CallbackState::pending;
  retry.attempts = 1;
  retry.last_error = "HTTP 500";
  retry.next_attempt_at = t0 + 10s;
  retry.delivery_attempts = 1;
  retry.delivery_started_at = t0 + 5s;
  retry.previous_delay = 5s;
  rebound::CallbackAttempt first;
  first.at = t0 + 6s;
  first.http_status = 500;
  first.error = "HTTP 500";
  const std::size_t before = store.commits();
  for (int i = 0; i < jobs; ++i) {
    const std::string id = "a-" + std::to_string(i);
    const rebound::Lease deliver{"send-" + std::to_string(i), t0 + 1h};
    store.mark_running(id, t0 + 1s);
    REQUIRE(store.finish_job(id, "worker", done, deliver, t0 + 5s));
    REQUIRE(store.record_attempt(id, deliver.holder, retry, t0 + 6s, first));
    // The attempt ended the delivery's lease: a renewal of it now is refused.
    CHECK_FALSE(store.renew(id, rebound::Lease{deliver.holder, t0 + 2h}, t0 + 6s));
  }
  REQUIRE(store.finish_job("quiet", "worker", done, std::nullopt, t0 + 5s));
  CHECK(store.claim_callbacks(1000, rebound::Lease{"early", t0 + 1h}, t0 + 9s).empty());
  for (int i = 0; i < jobs; ++i) {
    const auto r = store.get("a-" + std::to_string(i));
    REQUIRE(r);
    CHECK(r->status == JobStatus::succeeded);
    CHECK(r->started_at == t0 + 1s);
    CHECK(r->outcome.result == nlohmann::json{{"y", 3}});
    CHECK(r->callback.state == CallbackState::pending);
    CHECK(r->callback.attempts == 1);
    CHECK(r->callback.last_error == "HTTP 500");
    CHECK(r->callback.next_attempt_at == t0 + 10s);
    REQUIRE(r->attempt_log.size() == 1);
    CHECK(r->attempt_log[0].http_status == 500);
  }
  MESSAGE((4 * jobs) << " writes of " << jobs << " jobs in " << store.commits() - before
                     << " commits");
  // Due at their next attempt, with what a sender needs; delivered the second time, after a
  // renewal of that claim.
  const auto claimed = store.claim_callbacks(1000, rebound::Lease{"second", t0 + 1h}, t0 + 10s);
  REQUIRE(claimed.size() == static_cast<std::size_t>(jobs));
  rebound::CallbackInfo delivered = retry;
  delivered.state = CallbackState::delivered;
  delivered.attempts = 2;
  delivered.last_error.clear();
  rebound::CallbackAttempt second;
  second.at = t0 + 12s;
  second.http_status = 200;
  for (const auto& r : claimed) {
    CHECK(r.job.input == nlohmann::json{{"x", 1}});
    CHECK(r.outcome.result == nlohmann::json{{"y", 3}});
    REQUIRE(store.renew(r.job.id, rebound::Lease{"second", t0 + 2h}, t0 + 11s));
    REQUIRE(store.record_attempt(r.job.id, "second", delivered, t0 + 12s, second));
  }
  const auto last = store.get("a-0");
  REQUIRE(last);
  CHECK(last->callback.state == CallbackState::delivered);
  REQUIRE(last->attempt_log.size() == 2);
  CHECK(last->attempt_log[1].http_status == 200);
  CHECK(store.claim_callbacks(1000, rebound::Lease{"third", t0 + 3h}, t0 + 3h).empty());
  // Each is finished as of the write that finished it: the job without a callback at its finish,
  // the others at their delivery; pruning goes by that.
  CHECK(store.prune(t0 + 24h + 6s) == 1);
  CHECK_FALSE(store.get("quiet"));
  CHECK(store.get("a-0"));
  CHECK(store.prune(t0 + 24h + 13s) == static_cast<std::size_t>(jobs));
  CHECK(store.list_unfinished(10).empty());
}

namespace {

// Puts `n` jobs in one write on another thread, to keep the store's writer busy while the test
// queues what it wants in the writer's next transaction.
std::thread busy_writer(SqliteJobStore& store, const std::string& prefix, int n) {
  auto jobs = std::make_shared<std::vector<Job>>();
  for (int i = 0; i < n; ++i)
    jobs->push_back(
        make(prefix + std::to_string(i), "", nlohmann::json{{"pad", std::string(512, 'x')}}));
  return std::thread([&store, jobs] {
    std::vector<rebound::PutRequest> requests;
    for (const Job& job : *jobs)
      requests.push_back(rebound::PutRequest{&job, std::nullopt});
    store.put_many(requests);
  });
}

}  // namespace

TEST_CASE("sqlite: writes queued together are answered with what the file holds") {
  // A duplicate put reads a job's row whole; a finish then rewrites its outcome; a claim of its
  // callback in the same transaction answers the result, not the row as the put read it.
  TempDb db;
  SqliteJobStore store(db.path());
  const auto t0 = fixed_now;
  for (int round = 0; round < 10; ++round) {
    const std::string id = "j-" + std::to_string(round);
    REQUIRE(store.put(make(id), rebound::Lease{"w", t0 + 1h}) == PutOutcome::created);
    std::thread busy = busy_writer(store, "pad-" + std::to_string(round) + "-", 400);
    std::this_thread::sleep_for(2ms);
    std::promise<PutOutcome> again;
    store.async_put(make(id), std::nullopt,
                    [&](std::exception_ptr, PutOutcome outcome) { again.set_value(outcome); });
    const rebound::JobOutcome done(JobStatus::succeeded, nlohmann::json{{"y", round}}, std::nullopt,
                                   t0 + 5s);
    REQUIRE(store.finish_job(id, "w", done, std::nullopt, t0 + 5s));
    const auto claimed = store.claim_callbacks(10, rebound::Lease{"c", t0 + 2h}, t0 + 6s);
    busy.join();
    CHECK(again.get_future().get() == PutOutcome::duplicate);
    REQUIRE(claimed.size() == 1);
    CHECK(claimed[0].job.input == nlohmann::json{{"x", 1}});
    CHECK(claimed[0].outcome.result == nlohmann::json{{"y", round}});
    REQUIRE(
        store.record_attempt(id, "c", rebound::CallbackInfo{CallbackState::delivered}, t0 + 7s));
  }
}

TEST_CASE("sqlite: an acknowledgement queued behind another server's claim does not overwrite it") {
  // A worker whose lease ran out acknowledges with its clock behind the claimer's: the maps still
  // name it (the claim is not committed yet), so the call is taken, but its write finds the job
  // claimed by another (the row's lease ends when the new one does) and changes nothing.
  TempDb db;
  SqliteJobStore store(db.path());
  const auto t0 = fixed_now;
  for (int round = 0; round < 10; ++round) {
    const std::string id = "k-" + std::to_string(round);
    REQUIRE(store.put(make(id, ""), rebound::Lease{"late", t0 + 10s}) == PutOutcome::created);
    std::thread busy = busy_writer(store, "pad-" + std::to_string(round) + "-", 400);
    std::this_thread::sleep_for(2ms);
    std::vector<rebound::JobRecord> claimed;
    std::thread claimer([&] {
      claimed = store.claim_jobs(10, rebound::Lease{"new", t0 + 1h}, t0 + 11s);
    });
    std::this_thread::sleep_for(1ms);
    const rebound::JobOutcome stale(JobStatus::succeeded, nlohmann::json{{"from", "late"}},
                                    std::nullopt, t0 + 9s);
    const bool taken = store.finish_job(id, "late", stale, std::nullopt, t0 + 9s);
    claimer.join();
    busy.join();
    const auto first = store.get(id);
    REQUIRE(first);
    if (claimed.empty()) {
      // The late acknowledgement reached the writer before the claim: the job is its.
      CHECK(taken);
      CHECK(first->outcome.result == nlohmann::json{{"from", "late"}});
      continue;
    }
    REQUIRE(claimed.size() == 1);
    CHECK(first->status == JobStatus::queued);  // claimed, not finished by the late one
    const rebound::JobOutcome mine(JobStatus::succeeded, nlohmann::json{{"from", "new"}},
                                   std::nullopt, t0 + 12s);
    REQUIRE(store.finish_job(id, "new", mine, std::nullopt, t0 + 12s));
    const auto record = store.get(id);
    REQUIRE(record);
    CHECK(record->outcome.result == nlohmann::json{{"from", "new"}});
  }
}

TEST_CASE("sqlite: renew_all renews what each holder holds - one write") {
  TempDb db;
  SqliteJobStore store(db.path());
  const auto t0 = fixed_now;
  std::vector<std::pair<std::string, rebound::Lease>> renewals;
  for (int i = 0; i < 100; ++i) {
    const std::string id = "r-" + std::to_string(i);
    REQUIRE(store.put(make(id), rebound::Lease{"w", t0 + 10s}) == PutOutcome::created);
    renewals.emplace_back(id, rebound::Lease{i % 10 == 0 ? "other" : "w", t0 + 1h});
  }
  renewals.emplace_back("unknown", rebound::Lease{"w", t0 + 1h});
  const std::size_t before = store.commits();
  const auto answers = store.renew_all(renewals, t0 + 5s);
  REQUIRE(answers.size() == renewals.size());
  for (std::size_t i = 0; i < 100; ++i)
    CHECK(answers[i] == (i % 10 != 0));
  CHECK_FALSE(answers.back());
  // Past the old leases, only the jobs whose lease was not renewed are claimable.
  const auto claimed = store.claim_jobs(200, rebound::Lease{"c", t0 + 2h}, t0 + 11s);
  CHECK(claimed.size() == 10);
  for (const auto& r : claimed)
    CHECK(std::stoi(r.job.id.substr(2)) % 10 == 0);
  CHECK(store.commits() - before <= 2);  // the renewals' write, and the claim's
  CHECK(store.claim_jobs(200, rebound::Lease{"c2", t0 + 3h}, t0 + 1h + 1s).size() == 90);
}

TEST_CASE("sqlite: a cancellation whose transaction fails leaves the job to its holder") {
  TempDb db;
  SqliteJobStore store(db.path());
  const auto t0 = fixed_now;
  REQUIRE(store.put(make("held"), rebound::Lease{"w", t0 + 60s}) == PutOutcome::created);
  std::filesystem::remove(db.path());  // every transaction fails from here on
  const rebound::JobOutcome cancelled{JobStatus::cancelled, nullptr,
                                      rebound::ErrorInfo{"cancelled", "by the test"}};
  CHECK_THROWS_AS(store.cancel("held", cancelled, t0 + 1s), rebound::StoreUnavailable);
  // The job was not cancelled: its holder still holds it (renews, and its acknowledgement would
  // be taken), rather than losing it and running it again after the lease.
  CHECK(store.renew("held", rebound::Lease{"w", t0 + 90s}, t0 + 2s));
  CHECK_FALSE(store.renew("held", rebound::Lease{"other", t0 + 90s}, t0 + 2s));
}

TEST_CASE("sqlite: a second store on the same file is refused") {
  TempDb db;
  SqliteJobStore first(db.path());
  try {
    SqliteJobStore second(db.path());
    FAIL("the second store opened");
  } catch (const rebound::Error& e) {
    CHECK(std::string(e.what()).find("another rebound-server") != std::string::npos);
  }
  CHECK_THROWS_AS(SqliteJobStore("/nonexistent/dir/jobs.db"), rebound::Error);
}

namespace {

using PruneHook = rebound::test::ScopedHook<rebound::detail::set_sqlite_prune_batch_hook>;
using QueuedHook = rebound::test::ScopedHook<rebound::detail::set_sqlite_queued_hook>;

// Puts `n` poll-only jobs done-0 .. done-(n-1) and finishes them as of `finished`.
void put_finished(SqliteJobStore& store, int n, std::chrono::system_clock::time_point finished) {
  std::vector<Job> batch;
  for (int i = 0; i < n; ++i)
    batch.push_back(make("done-" + std::to_string(i), ""));
  rebound::test::put_all(store, batch);
  const auto now = std::chrono::system_clock::now() + 1s;
  REQUIRE(store.claim_jobs(n, rebound::Lease{"w", now + 1h}, now).size() ==
          static_cast<std::size_t>(n));
  for (const Job& job : batch)
    REQUIRE(store.finish_job(job.id, "w", {JobStatus::succeeded, 1, std::nullopt}, std::nullopt,
                             finished));
}

// Holds the store's writer in the pruning hook (at its next turn past the prune interval) from
// hold() until release(), or until it goes out of scope (once an object): declared after the store,
// so that the store (which joins its writer) closes after. Its state outlives it in the hooks,
// which the writer and the callers may still call. It counts the writes queued while it holds.
class WriterHold {
 public:
  WriterHold()
      : state_(std::make_shared<State>()),
        hook_([state = state_](bool) {
          std::unique_lock<std::mutex> lock(state->mutex);
          if (!state->armed) return;
          state->armed = false;
          state->holding = true;
          state->changed.notify_all();
          state->changed.wait(lock, [&] { return state->released; });  // the writer waits here
        }),
        queued_([state = state_] {
          std::lock_guard<std::mutex> lock(state->mutex);
          if (!state->holding || state->released) return;
          ++state->queued;
          state->changed.notify_all();
        }) {}
  ~WriterHold() { release(); }
  WriterHold(const WriterHold&) = delete;
  WriterHold& operator=(const WriterHold&) = delete;
  void hold() {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->armed = true;
    state_->changed.wait(lock, [&] { return state_->holding; });
  }
  // Waits until `n` writes were queued since the writer was held (calls made on other threads
  // wait behind it then), for at most 30 s: false if they were not.
  bool wait_queued(std::size_t n) {
    std::unique_lock<std::mutex> lock(state_->mutex);
    return state_->changed.wait_for(lock, 30s, [&] { return state_->queued >= n; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->released = true;
    state_->changed.notify_all();
  }
  // Options whose writer reaches the hook within a second.
  static rebound::SqliteJobStoreOptions options() {
    rebound::SqliteJobStoreOptions o;
    o.retention = 1h;
    o.prune_interval = 1s;
    return o;
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable changed;
    bool armed = false, holding = false, released = false;
    std::size_t queued = 0;  // writes queued while holding
  };
  std::shared_ptr<State> state_;
  PruneHook hook_;
  QueuedHook queued_;
};

}  // namespace

TEST_CASE("sqlite: a holder renews while a cancellation waits - kept when the cancellation fails") {
  TempDb db;
  SqliteJobStore store(db.path(), WriterHold::options());
  std::future<rebound::CancelOutcome> cancel;  // (waited for after the writer is released)
  WriterHold writer;
  const auto t0 = fixed_now;
  REQUIRE(store.put(make("held"), rebound::Lease{"w", t0 + 60s}) == PutOutcome::created);
  writer.hold();
  std::filesystem::remove(db.path());  // the cancellation's transaction will fail
  const rebound::JobOutcome cancelled{JobStatus::cancelled, nullptr,
                                      rebound::ErrorInfo{"cancelled", "by the test"}};
  cancel = std::async(std::launch::async, [&] { return store.cancel("held", cancelled, t0); });
  REQUIRE(writer.wait_queued(1));  // (the cancellation, behind the held writer)
  CHECK(store.renew("held", rebound::Lease{"w", t0 + 90s}, t0 + 1s));
  writer.release();
  CHECK_THROWS_AS(cancel.get(), rebound::StoreUnavailable);
  // Past the lease it had, the renewal made during the cancellation holds.
  CHECK(store.renew("held", rebound::Lease{"w", t0 + 120s}, t0 + 70s));
}

TEST_CASE("sqlite: a finish made as its lease ends is not lost to a claim queued before it") {
  // The holder finishes just before its lease ends; a claim made with a clock just past that end
  // was queued before the finish's write. The claim used to take the job (the row still held the
  // old lease, the map no longer), and the finish, answered true, was then refused: the job ran
  // again and its first result was lost. Likewise a callback attempt recorded as its lease ends.
  TempDb db;
  SqliteJobStore store(db.path(), WriterHold::options());
  std::future<std::vector<rebound::JobRecord>> jobs, callbacks;  // (read after the release)
  WriterHold writer;
  // (The real clock: the writer prunes what finished more than its hour of retention ago.)
  const auto t0 =
      std::chrono::time_point_cast<std::chrono::milliseconds>(std::chrono::system_clock::now());
  const rebound::Lease held{"w", t0 + 30s};
  REQUIRE(store.put(make("job"), held) == PutOutcome::created);
  REQUIRE(store.put(make("callback"), held) == PutOutcome::created);
  const rebound::JobOutcome done(JobStatus::succeeded, nlohmann::json{{"y", 1}}, std::nullopt,
                                 t0 + 1s);
  const rebound::Lease deliver{"d", t0 + 30s};
  REQUIRE(store.finish_job("callback", "w", done, deliver, t0 + 1s));
  store.get("callback");  // (committed: the callback is the delivery's now)
  writer.hold();
  jobs = std::async(std::launch::async, [&] {
    return store.claim_jobs(10, rebound::Lease{"late", t0 + 2h}, t0 + 31s);
  });
  callbacks = std::async(std::launch::async, [&] {
    return store.claim_callbacks(10, rebound::Lease{"late", t0 + 2h}, t0 + 31s);
  });
  REQUIRE(writer.wait_queued(2));  // (both claims, behind the held writer)
  // (Its callback's delivery holds a lease past every claim below.)
  CHECK(store.finish_job("job", "w", done, rebound::Lease{"d", t0 + 4h}, t0 + 29s));
  rebound::CallbackInfo delivered;
  delivered.state = CallbackState::delivered;
  delivered.attempts = 1;
  delivered.delivery_attempts = 1;
  delivered.delivery_started_at = t0 + 2s;
  CHECK(store.record_attempt("callback", "d", delivered, t0 + 29s, std::nullopt));
  writer.release();
  CHECK(jobs.get().empty());
  CHECK(callbacks.get().empty());
  const auto job = store.get("job");
  REQUIRE(job);
  CHECK(job->status == JobStatus::succeeded);
  CHECK(job->outcome.result == nlohmann::json{{"y", 1}});
  const auto callback = store.get("callback");
  REQUIRE(callback);
  CHECK(callback->callback.state == CallbackState::delivered);
  // Nothing left to claim later either.
  CHECK(store.claim_jobs(10, rebound::Lease{"later", t0 + 3h}, t0 + 3h).empty());
  CHECK(store.claim_callbacks(10, rebound::Lease{"later", t0 + 3h}, t0 + 3h).empty());
}

TEST_CASE("sqlite: pruning deletes in batches - a put commits between two") {
  // A retention lowered from days to hours (or a start on an old file) has many jobs to delete:
  // one statement held the store's lock throughout, and every submission waited for all of it.
  TempDb db;
  rebound::SqliteJobStoreOptions o;
  o.retention = 1h;
  o.prune_interval = 24h;  // only the explicit prune() below runs
  SqliteJobStore store(db.path(), o);
  constexpr int jobs = 2500;
  const auto now = std::chrono::system_clock::now() + 1s;
  put_finished(store, jobs, now);
  // After the first batch, a submission: answered before the pruning goes on.
  int batches = 0, put_after = 0;
  std::size_t pruned = 0;
  {
    const PruneHook hook([&](bool) {
      if (++batches == 1) {
        CHECK(store.put(make("during")) == PutOutcome::created);
        put_after = batches;
      }
    });
    pruned = store.prune(now + 2h);
  }
  CHECK(pruned == static_cast<std::size_t>(jobs));
  CHECK(batches == 3);  // 1,000, 1,000 and 500
  CHECK(put_after == 1);
  CHECK(store.get("during"));
  CHECK_FALSE(store.get("done-0"));
  CHECK_FALSE(store.get("done-2499"));
}

TEST_CASE("sqlite: the writer's own pruning goes on at once while its batches are full") {
  // Not one batch a prune interval: a backlog of 2,500 is gone at the first interval, its
  // batches after a full one run at once (the writer commits what is queued between two).
  TempDb db;
  rebound::SqliteJobStoreOptions o;
  o.retention = 1h;
  o.prune_interval = 2s;  // (a batch of 1,000 takes milliseconds, under a sanitizer too)
  std::mutex mutex;
  std::vector<bool> went_on;
  const PruneHook hook([&](bool on) {
    std::lock_guard<std::mutex> lock(mutex);
    went_on.push_back(on);  // (on the writer's thread: no write of the store here)
  });
  SqliteJobStore store(db.path(), o);
  put_finished(store, 2500, std::chrono::system_clock::now() - 2h);
  for (int i = 0; i < 200; ++i) {  // up to 20 s
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (went_on.size() >= 3) break;
    }
    std::this_thread::sleep_for(100ms);
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    REQUIRE(went_on.size() >= 3);
    CHECK(went_on[0] == false);  // at the interval
    CHECK(went_on[1] == true);   // at once after it, not at the next interval
    CHECK(went_on[2] == true);
  }
  CHECK_FALSE(store.get("done-0"));
  CHECK_FALSE(store.get("done-2499"));
}

TEST_CASE("sqlite: finished jobs are pruned after the retention - unfinished ones never") {
  TempDb db;
  rebound::SqliteJobStoreOptions o;
  o.retention = 1s;
  o.prune_interval = 1h;  // only the explicit prune() below runs
  SqliteJobStore store(db.path(), o);
  store.put(make("finished"));
  store.complete("finished", {JobStatus::succeeded, 1, std::nullopt});
  store.update_callback("finished", {CallbackState::delivered, 1, {}});
  store.put(make("poll-only", ""));
  store.complete("poll-only", {JobStatus::succeeded, 1, std::nullopt});
  store.put(make("waiting"));
  const auto now = std::chrono::system_clock::now();
  CHECK(store.prune(now) == 0);  // not old enough yet
  CHECK(store.prune(now + 1100ms) == 2);
  CHECK_FALSE(store.get("finished"));
  CHECK_FALSE(store.get("poll-only"));
  CHECK(store.get("waiting"));
}

namespace {
// Counts predictions, to see which recovered jobs ran again.
class CountingModel final : public rebound::Model {
 public:
  explicit CountingModel(std::atomic<int>& calls) : calls_(calls) {}
  std::string name() const override { return "counting"; }
  rebound::Prediction predict(const nlohmann::json& input) override {
    ++calls_;
    return rebound::Prediction::success(input);
  }

 private:
  std::atomic<int>& calls_;
};
}  // namespace

TEST_CASE("a JobQueue on a store with unfinished jobs runs them again and delivers what is owed") {
  TempDb db;
  rebound::test::Receiver receiver;
  {
    SqliteJobStore store(db.path());
    store.put(make("was-queued", receiver.url(), 1));
    store.put(make("was-running", receiver.url(), 2));
    store.mark_running("was-running", std::chrono::system_clock::now());
    store.put(make("was-delivering", receiver.url(), 3));
    store.complete("was-delivering", {JobStatus::succeeded, 30, std::nullopt});
    store.update_callback("was-delivering", {CallbackState::pending, 2, "HTTP 503"});
    store.put(make("was-done", receiver.url(), 4));
    store.complete("was-done", {JobStatus::succeeded, 40, std::nullopt});
    store.update_callback("was-done", {CallbackState::delivered, 1, {}});
  }
  std::atomic<int> calls{0};
  boost::asio::thread_pool pool(2);
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  std::thread io_thread([&] { io.run(); });
  {
    rebound::CurlTransportOptions to;
    to.guard = rebound::AddressGuard(true);
    rebound::JobQueueOptions so;
    so.delivery.backoff = rebound::backoff::max_tries(rebound::backoff::constant(10ms), 3);
    rebound::JobQueue service(pool.get_executor(), io.get_executor(),
                              std::make_unique<CountingModel>(calls),
                              std::make_unique<SqliteJobStore>(db.path()),
                              std::make_unique<rebound::CurlTransport>(io.get_executor(), to), so);
    CHECK(service.telemetry().batch_stats().resumed == 3);
    REQUIRE(receiver.wait_for(3));
    REQUIRE(service.shutdown(10s));
    CHECK(calls == 2);  // the queued and the running job ran again; the finished one did not
    std::map<std::string, nlohmann::json> results;
    for (const auto& r : receiver.received()) {
      auto body = nlohmann::json::parse(r.body);
      results[body["id"]] = body["result"];
    }
    CHECK(results.size() == 3);
    CHECK(results["was-queued"] == 1);
    CHECK(results["was-running"] == 2);
    CHECK(results["was-delivering"] == 30);
    CHECK(service.find("was-delivering")->callback.attempts == 3);  // counts carry on
    CHECK(service.find("was-queued")->callback.state == CallbackState::delivered);
  }
  work.reset();
  io_thread.join();
  pool.join();
}

TEST_CASE("sqlite: memory statistics can be turned off only before SQLite is first used") {
  // CTest runs each case in a process of its own, where this is the first use of SQLite; run
  // together with the other cases, SQLite may be in use already and the change is refused.
  const bool turned_off = rebound::disable_sqlite_memory_statistics();
  TempDb db;
  {
    SqliteJobStore store(db.path());
    REQUIRE(store.put(make("a")) == PutOutcome::created);
    REQUIRE(store.get("a").has_value());
    // With statistics off SQLite counts nothing; with them on, an open store holds memory.
    if (turned_off) {
      CHECK(sqlite3_memory_used() == 0);
    } else {
      CHECK(sqlite3_memory_used() > 0);
    }
  }
  // SQLite is initialised now: too late to change, and the function says so.
  CHECK_FALSE(rebound::disable_sqlite_memory_statistics());
}
