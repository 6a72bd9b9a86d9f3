// The JobStore contract, one suite run against every store: the memory store, SQLite on a real
// file, the failing fake while it works, and Redis (a real redis-server) when it is built.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "rebound/detail/wire.hpp"
#include "rebound/store/memory_job_store.hpp"
#include "rebound/store/sqlite_job_store.hpp"
#include "support/failing_store.hpp"
#include "support/put_all.hpp"
#include "support/temp_dir.hpp"
#ifdef REBOUND_TEST_REDIS
#include "rebound/store/redis_job_store.hpp"
#include "support/redis_server.hpp"
#endif
#ifdef REBOUND_TEST_POSTGRES
#include "rebound/store/postgres_job_store.hpp"
#include "support/postgres_server.hpp"
#endif

using rebound::CallbackState;
using rebound::Job;
using rebound::JobStatus;
using rebound::JobStore;
using rebound::PutOutcome;
using rebound::test::put_all;

namespace {

struct MemoryStore {
  static constexpr const char* name = "memory";
  std::unique_ptr<JobStore> make() { return std::make_unique<rebound::MemoryJobStore>(); }
};

struct SqliteStore {
  static constexpr const char* name = "sqlite";
  rebound::test::TempDir dir;
  std::unique_ptr<JobStore> make() {
    return std::make_unique<rebound::SqliteJobStore>(dir.file("jobs.db"));
  }
};

struct FailingStoreWhileItWorks {
  static constexpr const char* name = "failing fake";
  std::unique_ptr<JobStore> make() {
    return std::make_unique<rebound::test::FailingStore>(
        std::make_shared<rebound::test::FailingStore::Switch>());
  }
};

#ifdef REBOUND_TEST_REDIS
struct RedisStore {
  static constexpr const char* name = "redis";
  rebound::test::RedisServer server;
  std::unique_ptr<JobStore> make() {
    return std::make_unique<rebound::RedisJobStore>(rebound::parse_redis_uri(server.uri()));
  }
};
// Every call its own round trip on the caller's thread (RedisJobStoreOptions::batch_writes off).
struct RedisStoreUnbatched {
  static constexpr const char* name = "redis, unbatched";
  rebound::test::RedisServer server;
  std::unique_ptr<JobStore> make() {
    auto options = rebound::parse_redis_uri(server.uri());
    options.batch_writes = false;
    return std::make_unique<rebound::RedisJobStore>(options);
  }
};
// The same store on a Redis Cluster node (cluster mode, every slot its own): every script must
// declare a key, and every key it touches must share that key's slot.
struct RedisClusterStore {
  static constexpr const char* name = "redis cluster";
  rebound::test::RedisServer server{rebound::test::RedisServer::ClusterNode{}};
  std::unique_ptr<JobStore> make() {
    return std::make_unique<rebound::RedisJobStore>(rebound::parse_redis_uri(server.uri()));
  }
};
#endif

#ifdef REBOUND_TEST_POSTGRES
// A real PostgreSQL (one for the whole run), each test in a schema of its own.
struct PostgresStore {
  static constexpr const char* name = "postgres";
  std::string uri =
      rebound::test::shared_postgres().uri(rebound::test::PostgresServer::fresh_schema());
  std::unique_ptr<JobStore> make() {
    return std::make_unique<rebound::PostgresJobStore>(rebound::parse_postgres_uri(uri));
  }
};
#define POSTGRES_STORES , PostgresStore
#else
#define POSTGRES_STORES
#endif

using time_point = std::chrono::system_clock::time_point;

// Stores keep times to the millisecond.
time_point at_ms(long long ms) {
  return time_point(std::chrono::milliseconds(ms));
}

const time_point t0 = at_ms(1764000000000);

// A job named "tenant/id" is that tenant's (its tenant and its id apart, as a JobQueue hands a
// job to a store, whose key is then the name); any other name is the single tenant's id.
Job tenanted(Job job) {
  const auto slash = job.id.find('/');
  if (slash != std::string::npos) {
    job.tenant = job.id.substr(0, slash);
    job.id.erase(0, slash + 1);
  }
  return job;
}

Job make(const std::string& id, long long created_ms = 1764000000000,
         const std::string& url = "http://example.com/cb",
         nlohmann::json input = {{"x", 1}, {"text", "naïve ✓"}}) {
  return tenanted(Job{id, url, std::move(input), at_ms(created_ms)});
}

const rebound::JobOutcome succeeded{JobStatus::succeeded, {{"label", "setosa"}}, std::nullopt};
std::vector<std::string> ids_of(const std::vector<rebound::JobRecord>& records) {
  std::vector<std::string> ids;
  for (const auto& r : records)
    ids.push_back(rebound::key_of(r.job));
  return ids;
}

}  // namespace

#ifdef REBOUND_TEST_REDIS
#define STORES                                                                         \
  MemoryStore, SqliteStore, FailingStoreWhileItWorks, RedisStore, RedisStoreUnbatched, \
      RedisClusterStore POSTGRES_STORES
#else
#define STORES MemoryStore, SqliteStore, FailingStoreWhileItWorks POSTGRES_STORES
#endif

TEST_CASE_TEMPLATE("store contract: put creates once - a duplicate and a conflict are told apart",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  CHECK(store->put(make("a")) == PutOutcome::created);
  CHECK(store->put(make("a")) == PutOutcome::duplicate);
  CHECK(store->put(make("a", 1764000000000, "http://example.com/cb", 2)) == PutOutcome::conflict);
  CHECK(store->put(make("a", 1764000000000, "http://example.com/other")) == PutOutcome::conflict);
  CHECK(store->put(make("b", 1764000000000, "")) == PutOutcome::created);
  // An input written differently that parses to the same JSON is the same request.
  CHECK(store->put(make("n", 1764000000000, "", {{"x", 1}, {"y", 2.5}})) == PutOutcome::created);
  CHECK(store->put(make("n", 1764000000000, "", {{"x", 1.0}, {"y", 2.5}})) ==
        PutOutcome::duplicate);
  CHECK(store->put(make("n", 1764000000000, "", {{"x", 2}, {"y", 2.5}})) == PutOutcome::conflict);
  const auto a = store->get("a");
  REQUIRE(a.has_value());
  CHECK(a->job.id == "a");
  CHECK(a->job.callback_url == "http://example.com/cb");
  CHECK(a->job.input == make("a").input);
  CHECK(a->job.created_at == at_ms(1764000000000));
  CHECK(a->status == JobStatus::queued);
  CHECK(a->callback.state == CallbackState::none);
  CHECK(store->get("b")->job.callback_url.empty());
  CHECK_FALSE(store->get("missing").has_value());
  CHECK_FALSE(store->failure().has_value());
}

TEST_CASE_TEMPLATE("store contract: put_many answers each job as put would - in order", Factory,
                   STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  REQUIRE(store->put(make("taken")) == PutOutcome::created);
  const rebound::Lease worker{"worker", at_ms(1764000060000)};
  std::vector<Job> jobs;
  jobs.reserve(300);
  jobs.push_back(make("held"));
  jobs.push_back(make("taken"));                                 // the same request: duplicate
  jobs.push_back(make("taken", 1764000000000, "", {{"x", 2}}));  // another: conflict
  jobs.push_back(make("twice", 1764000000001));
  jobs.push_back(make("twice", 1764000000001));                  // the same, in one call
  jobs.push_back(make("twice", 1764000000001, "", {{"x", 3}}));  // another, in one call
  // More than one batch of the Redis store's (256 calls).
  for (int i = 0; i < 294; ++i)
    jobs.push_back(make("n" + std::to_string(i), 1764000000002 + i));
  std::vector<rebound::PutRequest> puts;
  for (const Job& job : jobs)
    puts.push_back({&job, std::nullopt});
  puts[0].claim = worker;
  const std::vector<PutOutcome> outcomes = store->put_many(puts);
  REQUIRE(outcomes.size() == jobs.size());
  CHECK(outcomes[0] == PutOutcome::created);
  CHECK(outcomes[1] == PutOutcome::duplicate);
  CHECK(outcomes[2] == PutOutcome::conflict);
  CHECK(outcomes[3] == PutOutcome::created);
  CHECK(outcomes[4] == PutOutcome::duplicate);
  CHECK(outcomes[5] == PutOutcome::conflict);
  CHECK(std::count(outcomes.begin() + 6, outcomes.end(), PutOutcome::created) == 294);
  CHECK(store->get("n293")->job.created_at == at_ms(1764000000002 + 293));
  CHECK(store->get("twice")->job.input == make("twice").input);
  CHECK(store->put(make("n7", 1764000000002 + 7)) == PutOutcome::duplicate);
  // The claimed job is the worker's; the others wait for a claim, oldest first.
  const auto claimed =
      ids_of(store->claim_jobs(400, {"other", at_ms(1764000200000)}, at_ms(1764000001000)));
  CHECK(claimed.size() == 296);  // taken, twice, n0..n293
  CHECK(std::find(claimed.begin(), claimed.end(), "held") == claimed.end());
  CHECK(claimed.front() == "taken");
  CHECK(claimed.back() == "n293");
  CHECK(store->renew("held", {"worker", at_ms(1764000090000)}, t0));
  CHECK(store->put_many({}).empty());
}

// What an asynchronous write answered, waited for (a store may answer on its own thread).
std::pair<bool, bool> answer_of(const std::function<void(JobStore::WriteDone)>& write) {
  auto promise = std::make_shared<std::promise<std::pair<bool, bool>>>();
  auto answered = promise->get_future();
  write([promise](std::exception_ptr error, bool answer) {
    promise->set_value({error == nullptr, answer});
  });
  REQUIRE(answered.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  return answered.get();
}

// What async_finish_job answered (nullopt: it failed), waited for; checks that it answered where
// answer_thread says: before returning, on this thread, when it says `caller`.
std::optional<JobStore::FinishAnswer> finish_answer(JobStore& store, const std::string& id,
                                                    const std::string& holder,
                                                    const rebound::JobOutcome& outcome,
                                                    const std::optional<rebound::Lease>& deliver,
                                                    bool want_record, time_point now = t0) {
  auto promise = std::make_shared<std::promise<std::optional<JobStore::FinishAnswer>>>();
  auto answered = promise->get_future();
  const auto caller = std::this_thread::get_id();
  auto on_caller = std::make_shared<std::atomic<bool>>(false);
  store.async_finish_job(
      id, holder, outcome, deliver, now, want_record,
      [promise, caller, on_caller](std::exception_ptr error, JobStore::FinishAnswer answer) {
        *on_caller = std::this_thread::get_id() == caller;
        promise->set_value(error ? std::nullopt : std::optional(std::move(answer)));
      });
  const bool returned_answered =
      answered.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  if (store.answer_thread(JobStore::AsyncCall::finish_job, want_record) ==
      JobStore::AnswerThread::caller) {
    CHECK(returned_answered);
    CHECK(on_caller->load());
  }
  REQUIRE(answered.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  return answered.get();
}

// What async_put answered (nullopt: it failed), waiting for it; a second answer fails the test.
std::optional<PutOutcome> async_put(JobStore& store, const Job& job,
                                    const std::optional<rebound::Lease>& claim = std::nullopt) {
  auto promise = std::make_shared<std::promise<std::optional<PutOutcome>>>();
  auto answers = std::make_shared<std::atomic<int>>(0);
  auto answered = promise->get_future();
  store.async_put(job, claim, [promise, answers](std::exception_ptr error, PutOutcome outcome) {
    if (++*answers > 1) return;
    promise->set_value(error ? std::nullopt : std::optional<PutOutcome>(outcome));
  });
  REQUIRE(answered.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  const auto out = answered.get();
  CHECK(answers->load() == 1);
  return out;
}

TEST_CASE_TEMPLATE("store contract: async_put answers once as put would - claimed when asked",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  CHECK(async_put(*store, make("a")) == PutOutcome::created);
  CHECK(async_put(*store, make("a")) == PutOutcome::duplicate);
  CHECK(async_put(*store, make("a", 1764000000000, "http://example.com/other")) ==
        PutOutcome::conflict);
  // Answered once the job is stored: the next read sees it.
  REQUIRE(store->get("a").has_value());
  CHECK(store->get("a")->job.input == make("a").input);
  // With a claim the job is leased at once: nobody claims it before the lease ends.
  CHECK(async_put(*store, make("b"), rebound::Lease{"worker", at_ms(1764000060000)}) ==
        PutOutcome::created);
  CHECK(ids_of(store->claim_jobs(10, {"other", at_ms(1764000200000)}, at_ms(1764000000000))) ==
        std::vector<std::string>{"a"});
  CHECK(ids_of(store->claim_jobs(10, {"other", at_ms(1764000200000)}, at_ms(1764000060001))) ==
        std::vector<std::string>{"b"});
}

TEST_CASE_TEMPLATE(
    "store contract: the asynchronous writes and renew_all answer as the calls they stand for",
    Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  const rebound::Lease worker{"worker", at_ms(1764000060000)};
  REQUIRE(store->put(make("a"), worker) == PutOutcome::created);
  REQUIRE(store->put(make("b"), worker) == PutOutcome::created);
  const rebound::Lease deliver{"deliver", at_ms(1764000060000)};
  const auto finished_a = finish_answer(*store, "a", "worker", succeeded, deliver, false);
  REQUIRE(finished_a);
  CHECK(finished_a->held);
  CHECK_FALSE(finished_a->record);  // (not asked for)
  const auto finished_b = finish_answer(*store, "b", "stranger", succeeded, deliver, true);
  REQUIRE(finished_b);
  CHECK_FALSE(finished_b->held);
  CHECK_FALSE(finished_b->record);
  CHECK(store->get("a")->status == JobStatus::succeeded);
  CHECK(store->get("b")->status == JobStatus::queued);

  rebound::CallbackInfo delivered;
  delivered.state = CallbackState::delivered;
  delivered.attempts = 1;
  rebound::CallbackAttempt attempt;
  attempt.at = t0;
  attempt.http_status = 200;
  CHECK(answer_of([&](JobStore::WriteDone done) {
          store->async_record_attempt("a", "deliver", delivered, t0, attempt, std::move(done));
        }) == std::pair<bool, bool>{true, true});
  // Its lease ended with the record: a second record is refused.
  CHECK(answer_of([&](JobStore::WriteDone done) {
          store->async_record_attempt("a", "deliver", delivered, t0, attempt, std::move(done));
        }) == std::pair<bool, bool>{true, false});
  const auto a = store->get("a");
  CHECK(a->callback.state == CallbackState::delivered);
  REQUIRE(a->attempt_log.size() == 1);
  CHECK(a->attempt_log[0].http_status == 200);

  // One answer per lease, in order: b is held, a is finished, the third is unknown.
  const auto renewed = store->renew_all({{"b", {"worker", at_ms(1764000120000)}},
                                         {"a", {"worker", at_ms(1764000120000)}},
                                         {"missing", {"worker", at_ms(1764000120000)}}},
                                        t0);
  CHECK(renewed == std::vector<bool>{true, false, false});
  // b's lease runs to the new end: not claimable before it.
  CHECK(store->claim_jobs(10, {"other", at_ms(1764000200000)}, at_ms(1764000100000)).empty());
  CHECK(ids_of(store->claim_jobs(10, {"other", at_ms(1764000200000)}, at_ms(1764000120001))) ==
        std::vector<std::string>{"b"});
}

TEST_CASE_TEMPLATE("store contract: a finish asked for the record answers it as get reads it",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  const rebound::Lease worker{"worker", at_ms(1764000060000)};
  const rebound::Lease deliver{"deliver", at_ms(1764000060000)};
  rebound::Job with_callback = make("cb");
  with_callback.tenant = "acme";
  with_callback.input = nlohmann::json{{"text", "hello"}, {"n", 3}};
  REQUIRE(store->put(with_callback, worker) == PutOutcome::created);
  rebound::Job plain = make("plain", 1764000000000, "");
  REQUIRE(store->put(plain, worker) == PutOutcome::created);
  store->mark_running("plain", t0);  // (queued to a writer, ahead of the finish)

  rebound::JobOutcome ok = succeeded;
  ok.result = nlohmann::json{{"label", "positive"}, {"score", 0.75}};
  // Times between milliseconds, which the durable stores keep to the millisecond: the answer
  // reads as a read does.
  const time_point later = t0 + std::chrono::microseconds(1234567);
  ok.finished_at = later;
  const std::string cb_key = rebound::key_of(with_callback);
  const auto answer = finish_answer(*store, cb_key, "worker", ok, deliver, true, later);
  REQUIRE(answer);
  CHECK(answer->held);
  // (A store may answer none, as the default does: the fake does, for the JobQueue's tests of
  // reading a job back. The library's stores answer it.)
  if (std::string_view(Factory::name) == "failing fake") return;
  REQUIRE(answer->record);
  const auto stored = store->get(cb_key);
  REQUIRE(stored);
  // What a wait is answered with: the job as get reads it, its input and result included.
  CHECK(answer->record->job.id == "cb");
  CHECK(answer->record->job.tenant == "acme");
  CHECK(answer->record->job.input == with_callback.input);
  CHECK(answer->record->job.input == stored->job.input);
  CHECK(answer->record->status == JobStatus::succeeded);
  CHECK(answer->record->outcome.result == ok.result);
  CHECK(answer->record->outcome.result == stored->outcome.result);
  CHECK(answer->record->callback.state == CallbackState::pending);
  CHECK(answer->record->callback.state == stored->callback.state);
  CHECK(answer->record->job.callback_url == stored->job.callback_url);
  // Whole, as the HTTP front renders a job and its callback.
  CHECK(rebound::detail::to_status_json(*answer->record) ==
        rebound::detail::to_status_json(*stored));
  CHECK(rebound::detail::to_callback_json(*answer->record) ==
        rebound::detail::to_callback_json(*stored));
  CHECK(answer->record->outcome.finished_at == stored->outcome.finished_at);
  CHECK(answer->record->callback.next_attempt_at == stored->callback.next_attempt_at);
  CHECK(answer->record->callback.delivery_started_at == stored->callback.delivery_started_at);

  rebound::JobOutcome bad(JobStatus::failed, nullptr, rebound::ErrorInfo{"model_error", "boom"},
                          t0);
  const auto failed = finish_answer(*store, "plain", "worker", bad, std::nullopt, true);
  REQUIRE(failed);
  CHECK(failed->held);
  REQUIRE(failed->record);
  CHECK(failed->record->status == JobStatus::failed);
  REQUIRE(failed->record->outcome.error);
  CHECK(failed->record->outcome.error->code == "model_error");
  CHECK(failed->record->callback.state == CallbackState::none);
  CHECK(failed->record->started_at == store->get("plain")->started_at);
  CHECK(failed->record->started_at == t0);  // (the mark queued before it is in the record)

  // A second acknowledgement: not held, no record, nothing changed.
  const auto again = finish_answer(*store, "plain", "worker", ok, std::nullopt, true);
  REQUIRE(again);
  CHECK_FALSE(again->held);
  CHECK_FALSE(again->record);
  CHECK(store->get("plain")->status == JobStatus::failed);
}

TEST_CASE_TEMPLATE("store contract: a record follows its job from queued to delivered", Factory,
                   STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  store->put(make("a"));
  store->mark_running("a", t0);
  CHECK(store->get("a")->status == JobStatus::running);
  store->complete("a", succeeded);
  auto record = store->get("a");
  CHECK(record->status == JobStatus::succeeded);
  CHECK(record->outcome.result == nlohmann::json{{"label", "setosa"}});
  CHECK_FALSE(record->outcome.error.has_value());
  store->mark_running("a", t0);  // a final job never moves back
  CHECK(store->get("a")->status == JobStatus::succeeded);
  store->update_callback("a", {CallbackState::pending, 2, "HTTP 503"});
  record = store->get("a");
  CHECK(record->callback.state == CallbackState::pending);
  CHECK(record->callback.attempts == 2);
  CHECK(record->callback.last_error == "HTTP 503");
  store->update_callback("a", {CallbackState::delivered, 3, {}});
  CHECK(store->get("a")->callback.state == CallbackState::delivered);
  CHECK(store->get("a")->callback.attempts == 3);

  store->put(make("b"));
  store->complete("b", {JobStatus::failed, nullptr, rebound::ErrorInfo{"model_error", "boom"}});
  record = store->get("b");
  CHECK(record->status == JobStatus::failed);
  REQUIRE(record->outcome.error.has_value());
  CHECK(record->outcome.error->code == "model_error");
  CHECK(record->outcome.error->message == "boom");

  // Unknown ids are ignored, without throwing.
  store->mark_running("missing", t0);
  store->complete("missing", succeeded);
  store->update_callback("missing", {CallbackState::delivered, 1, {}});
  CHECK_FALSE(store->get("missing").has_value());
}

TEST_CASE_TEMPLATE("store contract: get_many answers each id as get would - in the ids' order",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  CHECK(store->get_many({}).empty());
  REQUIRE(store->put(make("queued")) == PutOutcome::created);
  REQUIRE(store->put(make("acme/7", 1764000000001)) == PutOutcome::created);
  REQUIRE(store->put(make("done", 1764000000002)) == PutOutcome::created);
  store->mark_running("done", t0 + std::chrono::seconds(1));
  store->complete("done", succeeded);
  store->update_callback("done", {CallbackState::pending, 2, "HTTP 503"});
  const std::vector<std::string> ids{"done", "missing", "acme/7", "queued", "done", "7"};
  const auto many = store->get_many(ids);
  REQUIRE(many.size() == ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CAPTURE(ids[i]);
    const auto one = store->get(ids[i]);
    REQUIRE(many[i].has_value() == one.has_value());
    if (!one) continue;
    CHECK(rebound::key_of(many[i]->job) == ids[i]);
    CHECK(many[i]->job.tenant == one->job.tenant);
    CHECK(many[i]->job.input == one->job.input);
    CHECK(many[i]->job.created_at == one->job.created_at);
    CHECK(many[i]->status == one->status);
    CHECK(many[i]->started_at == one->started_at);
    CHECK(many[i]->outcome.result == one->outcome.result);
    CHECK(many[i]->callback.state == one->callback.state);
    CHECK(many[i]->callback.attempts == one->callback.attempts);
    CHECK(many[i]->callback.last_error == one->callback.last_error);
  }
  CHECK_FALSE(many[1].has_value());  // unknown
  CHECK_FALSE(many[5].has_value());  // "7" is acme's id, not a key of the single tenant
  CHECK(many[0]->status == JobStatus::succeeded);
  CHECK(many[0]->outcome.result == nlohmann::json{{"label", "setosa"}});
  CHECK(many[0]->callback.state == CallbackState::pending);
  CHECK(many[4]->status == JobStatus::succeeded);
  CHECK(many[2]->job.tenant == "acme");
  CHECK(many[3]->status == JobStatus::queued);
}

TEST_CASE_TEMPLATE("store contract: unfinished jobs are listed oldest first - finished ones never",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  store->put(make("running", 1764000000002));
  store->put(make("queued", 1764000000001));
  store->put(make("undelivered", 1764000000003));
  store->put(make("delivered", 1764000000000));
  store->put(make("poll-only", 1764000000004, ""));
  store->put(make("given-up", 1764000000005));
  store->mark_running("running", t0);
  store->complete("undelivered", succeeded);
  store->update_callback("undelivered", {CallbackState::pending, 1, "HTTP 500"});
  store->complete("delivered", succeeded);
  store->update_callback("delivered", {CallbackState::delivered, 1, {}});
  store->complete("poll-only", succeeded);
  store->complete("given-up", succeeded);
  store->update_callback("given-up", {CallbackState::failed, 5, "HTTP 500"});

  std::vector<std::string> ids;
  for (const auto& r : store->list_unfinished(100))
    ids.push_back(rebound::key_of(r.job));
  CHECK(ids == std::vector<std::string>{"queued", "running", "undelivered"});
  CHECK(store->list_unfinished(2).size() == 2);
  CHECK(store->list_unfinished(0).empty());
}

TEST_CASE_TEMPLATE("store contract: given-up callbacks are listed newest first", Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  for (int i = 0; i < 4; ++i) {
    const std::string id = "job-" + std::to_string(i);
    store->put(make(id, 1764000000000 + i));
    store->complete(id, succeeded);
    store->update_callback(
        id, {i == 2 ? CallbackState::delivered : CallbackState::failed, 5, "HTTP 500"});
  }
  std::vector<std::string> ids;
  for (const auto& r : store->list_failed_callbacks(100))
    ids.push_back(rebound::key_of(r.job));
  CHECK(ids == std::vector<std::string>{"job-3", "job-1", "job-0"});
  CHECK(store->list_failed_callbacks(1).front().job.id == "job-3");
  CHECK(store->list_failed_callbacks(1).front().callback.last_error == "HTTP 500");
  // Redelivery moves a job out of the list.
  store->update_callback("job-3", {CallbackState::pending, 5, {}});
  CHECK(store->list_failed_callbacks(100).size() == 2);
}

TEST_CASE_TEMPLATE("store contract: a tenant's given-up callbacks are listed apart", Factory,
                   STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  // Many of another tenant's, newer, before the few of this one's.
  for (int i = 0; i < 300; ++i) {
    Job job = make(std::to_string(i), 1764000000000 + i);
    job.tenant = i < 3 ? "acme" : "globex";
    store->put(job);
    const std::string key = rebound::key_of(job);
    store->complete(key, succeeded);
    store->update_callback(key, {CallbackState::failed, 5, "HTTP 500"});
  }
  std::vector<std::string> ids;
  for (const auto& r : store->list_failed_callbacks_with_prefix("acme/", 10)) {
    CHECK(r.job.tenant == "acme");
    ids.push_back(r.job.id);
  }
  CHECK(ids == std::vector<std::string>{"2", "1", "0"});
  CHECK(store->list_failed_callbacks_with_prefix("acme/", 2).size() == 2);
  CHECK(store->list_failed_callbacks_with_prefix("globex/", 500).size() == 297);
  CHECK(store->list_failed_callbacks_with_prefix("", 500).size() == 300);
  CHECK(store->list_failed_callbacks_with_prefix("initech/", 10).empty());
}

TEST_CASE_TEMPLATE("store contract: a job's tenant is a field of its own - kept apart from its id",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  Job acme = make("7", 1764000000001);
  acme.tenant = "acme";
  const Job mine = make("7", 1764000000002);  // the single tenant's job of the same id
  REQUIRE(store->put(acme) == PutOutcome::created);
  REQUIRE(store->put(mine) == PutOutcome::created);
  CHECK(store->put(acme) == PutOutcome::duplicate);
  auto a = store->get("acme/7");
  REQUIRE(a);
  CHECK(a->job.tenant == "acme");
  CHECK(a->job.id == "7");
  auto m = store->get("7");
  REQUIRE(m);
  CHECK(m->job.tenant.empty());
  CHECK(m->job.id == "7");
  // Claims and listings hand the tenant back as well.
  const auto claimed = store->claim_jobs(10, rebound::Lease{"worker", t0 + std::chrono::hours(1)},
                                         t0 + std::chrono::seconds(1));
  REQUIRE(claimed.size() == 2);
  for (const auto& r : claimed)
    CHECK(rebound::key_of(r.job) == (r.job.tenant.empty() ? "7" : "acme/7"));
  rebound::JobFilter filter;
  filter.id_prefix = "acme/";
  const rebound::JobPage page = store->list_jobs(filter, std::nullopt, 10);
  REQUIRE(page.jobs.size() == 1);
  CHECK(page.jobs[0].job.tenant == "acme");
  CHECK(page.jobs[0].job.id == "7");
  CHECK(store->list_jobs(rebound::JobFilter{}, std::nullopt, 10).jobs.size() == 2);
}

TEST_CASE_TEMPLATE(
    "store contract: given-up callbacks page newest first - without inputs or results", Factory,
    STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  // acme's seven, three of them made in the same millisecond (ordered by id), between globex's.
  const std::vector<std::pair<std::string, long long>> jobs = {
      {"acme/a", 10}, {"globex/x", 15}, {"acme/b", 20},        {"acme/c", 20},
      {"acme/d", 20}, {"acme/e", 30},   {"globex/y", 35},      {"acme/f", 40},
      {"acme/g", 50}, {"globex/z", 60}, {"acme/delivered", 70}};
  for (const auto& [id, ms] : jobs) {
    store->put(
        make(id, 1764000000000 + ms, "http://example.com/cb", {{"big", std::string(1000, 'i')}}));
    store->complete(id, {JobStatus::succeeded, {{"big", std::string(1000, 'r')}}, std::nullopt});
    store->update_callback(
        id,
        {id == "acme/delivered" ? CallbackState::delivered : CallbackState::failed, 5, "HTTP 500"});
  }
  // Two made in the same millisecond, apart by microseconds (as the memory store keeps them):
  // cursors keep milliseconds, so both are in their place, by id.
  for (const auto& [id, us] :
       {std::pair<std::string, int>{"acme/sub-2", 300}, {"acme/sub-1", 700}}) {
    store->put(tenanted(Job{id,
                            "http://example.com/cb",
                            {{"big", std::string(1000, 'i')}},
                            at_ms(1764000000045) + std::chrono::microseconds(us)}));
    store->complete(id, {JobStatus::succeeded, {{"big", std::string(1000, 'r')}}, std::nullopt});
    store->update_callback(id, {CallbackState::failed, 5, "HTTP 500"});
  }
  auto page_through = [&](const std::string& prefix, std::size_t limit) {
    std::vector<std::string> ids;
    std::optional<rebound::ListCursor> after;
    for (int pages = 0; pages < 20; ++pages) {
      const rebound::JobPage page = store->failed_callbacks_page(prefix, after, limit);
      CHECK(page.jobs.size() <= limit);
      for (const auto& r : page.jobs) {
        ids.push_back(rebound::key_of(r.job));
        CHECK(r.job.id.find('/') == std::string::npos);  // the tenant apart, never in the id
        CHECK(r.job.input.is_null());
        CHECK(r.outcome.result.is_null());
        CHECK(r.status == JobStatus::succeeded);
        CHECK(r.callback.last_error == "HTTP 500");
        CHECK(r.job.callback_url == "http://example.com/cb");
      }
      if (!page.next) break;
      after = page.next;
    }
    return ids;
  };
  const std::vector<std::string> acme = {"acme/g", "acme/sub-2", "acme/sub-1", "acme/f", "acme/e",
                                         "acme/d", "acme/c",     "acme/b",     "acme/a"};
  CHECK(page_through("acme/", 2) == acme);
  CHECK(page_through("acme/", 1) == acme);
  CHECK(page_through("acme/", 9) == acme);
  CHECK(page_through("acme/", 100) == acme);
  CHECK(page_through("", 3).size() == 12);
  CHECK(page_through("initech/", 3).empty());
  // The entry a cursor names is redelivered meanwhile: the next page goes on after it all the same.
  const rebound::JobPage first = store->failed_callbacks_page("acme/", std::nullopt, 6);
  REQUIRE(first.next);
  CHECK(first.next->id == "acme/d");
  store->update_callback("acme/d", {CallbackState::pending, 5, {}});
  CHECK(ids_of(store->failed_callbacks_page("acme/", first.next, 10).jobs) ==
        std::vector<std::string>{"acme/c", "acme/b", "acme/a"});
}

TEST_CASE_TEMPLATE(
    "store contract: the queue's numbers - queued by priority - running - callbacks owed", Factory,
    STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  auto stats = store->queue_stats();
  REQUIRE(stats);
  CHECK(stats->queued == 0);
  CHECK_FALSE(stats->oldest_queued);
  auto with_priority = [](Job job, int priority) {
    job.priority = priority;
    return job;
  };
  store->put(with_priority(make("p2-old", 1764000000010), 2));
  store->put(with_priority(make("p2-new", 1764000000020), 2));
  store->put(with_priority(make("p7", 1764000000005), 7));  // the oldest of all
  store->put(make("runs", 1764000000030));
  store->put(make("done", 1764000000040));
  store->mark_running("runs", t0);
  store->complete("done", succeeded);
  store->update_callback("done", {CallbackState::pending, 0, {}});  // its callback is owed
  stats = store->queue_stats();
  REQUIRE(stats);
  CHECK(stats->queued == 3);
  CHECK(stats->running == 1);
  CHECK(stats->queued_by_priority == std::vector<std::pair<int, std::size_t>>{{2, 2}, {7, 1}});
  REQUIRE(stats->oldest_queued);
  CHECK(*stats->oldest_queued == at_ms(1764000000005));
  CHECK(stats->callbacks_waiting == 1);
  // Cancelled and finished jobs leave the numbers.
  store->cancel("p7", {JobStatus::cancelled, nullptr, rebound::ErrorInfo{"cancelled", "x"}}, t0);
  store->complete("runs", succeeded);
  store->update_callback("done", {CallbackState::delivered, 1, {}});
  stats = store->queue_stats();
  REQUIRE(stats);
  CHECK(stats->queued == 2);
  CHECK(stats->running == 0);
  CHECK(stats->queued_by_priority == std::vector<std::pair<int, std::size_t>>{{2, 2}});
  CHECK(*stats->oldest_queued == at_ms(1764000000010));
  CHECK(stats->callbacks_waiting == 1);  // "runs" ended: its callback is owed now
}

namespace {
using namespace std::chrono_literals;
rebound::Lease lease(const std::string& holder, time_point until) {
  return rebound::Lease{holder, until};
}
}  // namespace

TEST_CASE_TEMPLATE(
    "store contract: jobs are claimed once - oldest first - and again when the "
    "lease runs out",
    Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  store->put(make("b", 1764000000002));
  store->put(make("a", 1764000000001));
  store->put(make("held", 1764000000000), lease("server-1/1", t0 + 29s));
  CHECK(ids_of(store->claim_jobs(10, lease("server-2/1", t0 + 30s), t0 + 1s)) ==
        std::vector<std::string>{"a", "b"});
  CHECK(store->claim_jobs(10, lease("server-3/1", t0 + 40s), t0 + 2s).empty());  // all held

  // The holder renews; a stranger cannot.
  CHECK(store->renew("a", lease("server-2/1", t0 + 60s), t0 + 20s));
  CHECK_FALSE(store->renew("a", lease("server-3/1", t0 + 90s), t0 + 20s));
  CHECK_FALSE(store->renew("missing", lease("server-2/1", t0 + 60s), t0 + 20s));

  // At t0 + 31 s the leases of "held" and "b" have run out (in that order); "a" was renewed.
  auto taken = store->claim_jobs(10, lease("server-3/2", t0 + 61s), t0 + 31s);
  CHECK(ids_of(taken) == std::vector<std::string>{"held", "b"});
  CHECK(taken.front().job.input == make("held").input);

  // A late acknowledgement is refused and writes nothing; the new holder's is taken.
  CHECK_FALSE(store->finish_job("b", "server-2/1", succeeded, std::nullopt, t0 + 32s));
  CHECK(store->get("b")->status == JobStatus::queued);
  CHECK_FALSE(store->renew("b", lease("server-2/1", t0 + 90s), t0 + 32s));
  CHECK(store->finish_job("b", "server-3/2", succeeded, std::nullopt, t0 + 32s));
  CHECK(store->get("b")->status == JobStatus::succeeded);
  CHECK_FALSE(store->finish_job("b", "server-3/2", succeeded, std::nullopt, t0 + 33s));  // once

  // An acknowledgement after the lease ran out is refused even when nobody claimed it since.
  CHECK_FALSE(store->finish_job("a", "server-2/1", succeeded, std::nullopt, t0 + 61s));
  // And a final job is never claimed again.
  CHECK(ids_of(store->claim_jobs(10, lease("server-4/1", t0 + 200s), t0 + 100s)) ==
        std::vector<std::string>{"a", "held"});  // in the order their leases ran out
}

TEST_CASE_TEMPLATE("store contract: a callback waits in the store until its next attempt is due",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  store->put(make("job"), lease("s/1", t0 + 30s));
  store->put(make("poll-only", 1764000000000, ""), lease("s/1", t0 + 30s));
  // Finished with the callback claimed at once by the finishing server.
  REQUIRE(store->finish_job("job", "s/1", succeeded, lease("s/2", t0 + 40s), t0 + 10s));
  REQUIRE(store->finish_job("poll-only", "s/1", succeeded, lease("s/2", t0 + 40s), t0 + 10s));
  auto record = store->get("job");
  CHECK(record->callback.state == CallbackState::pending);
  CHECK(record->callback.next_attempt_at == t0 + 10s);
  CHECK(store->get("poll-only")->callback.state == CallbackState::none);
  CHECK(store->list_unfinished(10).size() == 1);  // the callback is owed
  CHECK(store->claim_callbacks(10, lease("t/1", t0 + 80s), t0 + 11s).empty());  // s/2 holds it

  // The first attempt failed: the next is due in an hour.
  rebound::CallbackInfo retry = record->callback;
  retry.attempts = 1;
  retry.delivery_attempts = 1;
  retry.last_error = "HTTP 503";
  retry.next_attempt_at = t0 + 1h;
  retry.previous_delay = 3590s;
  CHECK_FALSE(store->record_attempt("job", "t/1", retry, t0 + 12s));  // not the holder
  REQUIRE(store->record_attempt("job", "s/2", retry, t0 + 12s));
  CHECK_FALSE(store->record_attempt("job", "s/2", retry, t0 + 12s));  // its lease ended with it
  CHECK(store->claim_callbacks(10, lease("t/2", t0 + 90s), t0 + 59min).empty());
  auto due = store->claim_callbacks(10, lease("t/3", t0 + 1h + 30s), t0 + 1h);
  REQUIRE(due.size() == 1);
  CHECK(due[0].callback.attempts == 1);
  CHECK(due[0].callback.delivery_attempts == 1);
  CHECK(due[0].callback.last_error == "HTTP 503");
  CHECK(due[0].callback.previous_delay == 3590s);
  CHECK(due[0].outcome.result == succeeded.result);

  // The holder of a claim that ran out cannot record; the next holder delivers.
  auto again = store->claim_callbacks(10, lease("t/4", t0 + 2h), t0 + 1h + 31s);
  REQUIRE(again.size() == 1);
  rebound::CallbackInfo delivered = retry;
  delivered.state = CallbackState::delivered;
  delivered.attempts = 2;
  delivered.last_error.clear();
  CHECK_FALSE(store->record_attempt("job", "t/3", delivered, t0 + 1h + 32s));
  REQUIRE(store->record_attempt("job", "t/4", delivered, t0 + 1h + 32s));
  CHECK(store->get("job")->callback.state == CallbackState::delivered);
  CHECK(store->list_unfinished(10).empty());
  CHECK(store->claim_callbacks(10, lease("t/5", t0 + 5h), t0 + 4h).empty());
}

TEST_CASE_TEMPLATE("store contract: redelivery takes a failed callback back - once", Factory,
                   STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  store->put(make("job"), lease("s/1", t0 + 30s));
  REQUIRE(store->finish_job("job", "s/1", succeeded, lease("s/2", t0 + 30s), t0));
  CHECK(store->redeliver("job", lease("r/1", t0 + 30s), t0) ==
        rebound::RedeliverOutcome::not_failed);
  CHECK(store->redeliver("missing", lease("r/1", t0 + 30s), t0) ==
        rebound::RedeliverOutcome::not_found);
  rebound::CallbackInfo given_up;
  given_up.state = CallbackState::failed;
  given_up.attempts = 5;
  given_up.delivery_attempts = 5;
  given_up.last_error = "HTTP 500";
  REQUIRE(store->record_attempt("job", "s/2", given_up, t0 + 1s));
  CHECK(store->redeliver("job", lease("r/2", t0 + 60s), t0 + 2s) ==
        rebound::RedeliverOutcome::redelivered);
  CHECK(store->redeliver("job", lease("r/3", t0 + 60s), t0 + 2s) ==
        rebound::RedeliverOutcome::not_failed);
  auto record = store->get("job");
  CHECK(record->callback.state == CallbackState::pending);
  CHECK(record->callback.attempts == 5);           // counts keep adding up
  CHECK(record->callback.delivery_attempts == 0);  // a fresh budget
  CHECK(record->callback.last_error.empty());      // and no error yet in it
  CHECK(store->list_failed_callbacks(10).empty());
  rebound::CallbackInfo delivered = record->callback;
  delivered.state = CallbackState::delivered;
  delivered.attempts = 6;
  CHECK(store->record_attempt("job", "r/2", delivered, t0 + 3s));
}

namespace {
Job with_priority(const std::string& id, int priority, long long created_ms) {
  Job job = make(id, created_ms);
  job.priority = priority;
  return job;
}
}  // namespace

TEST_CASE_TEMPLATE("store contract: jobs are claimed by priority - then oldest first", Factory,
                   STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  store->put(with_priority("low-old", 9, 1764000000000));
  store->put(with_priority("normal-new", 5, 1764000000003));
  store->put(with_priority("urgent", 0, 1764000000004));
  store->put(with_priority("normal-old", 5, 1764000000001));
  store->put(with_priority("held-urgent", 0, 1764000000000), lease("s/1", t0 + 29s));
  // Two at a time: the urgent one, then the older of the two normal ones.
  CHECK(ids_of(store->claim_jobs(2, lease("s/2", t0 + 30s), t0 + 1s)) ==
        std::vector<std::string>{"urgent", "normal-old"});
  CHECK(ids_of(store->claim_jobs(10, lease("s/3", t0 + 30s), t0 + 1s)) ==
        std::vector<std::string>{"normal-new", "low-old"});
  // When the leases run out, priority still comes first, then the lease that ran out first.
  CHECK(ids_of(store->claim_jobs(2, lease("s/4", t0 + 90s), t0 + 31s)) ==
        std::vector<std::string>{"held-urgent", "urgent"});
}

TEST_CASE_TEMPLATE("store contract: tenants take turns at claims - a priority orders its own jobs",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  // evil floods at the highest priority, before anyone else; acme and the default tenant wait at
  // lower ones.
  for (int i = 1; i <= 4; ++i)
    store->put(with_priority("evil/e" + std::to_string(i), 0, 1764000000000 + i));
  store->put(with_priority("acme/a1", 5, 1764000000010));
  store->put(with_priority("acme/a2", 5, 1764000000011));
  store->put(with_priority("acme/urgent", 1, 1764000000012));  // acme's own priority: first of its
  store->put(with_priority("d1", 9, 1764000000020));
  // One each, in turns by tenant name (the default tenant's name is empty), each its best first.
  CHECK(ids_of(store->claim_jobs(3, lease("s/1", t0 + 30s), t0 + 1s)) ==
        std::vector<std::string>{"d1", "acme/urgent", "evil/e1"});
  // The turns go on where the last claim left them, also one job at a time (a server with room
  // for one claims one): the tenant after evil is the default one, which has none left.
  CHECK(ids_of(store->claim_jobs(1, lease("s/2", t0 + 30s), t0 + 1s)) ==
        std::vector<std::string>{"acme/a1"});
  CHECK(ids_of(store->claim_jobs(1, lease("s/2", t0 + 30s), t0 + 1s)) ==
        std::vector<std::string>{"evil/e2"});
  CHECK(ids_of(store->claim_jobs(1, lease("s/2", t0 + 30s), t0 + 1s)) ==
        std::vector<std::string>{"acme/a2"});
  CHECK(ids_of(store->claim_jobs(10, lease("s/3", t0 + 30s), t0 + 1s)) ==
        std::vector<std::string>{"evil/e3", "evil/e4"});
  // Leases that run out are claimed again by the same turns.
  CHECK(ids_of(store->claim_jobs(2, lease("s/4", t0 + 90s), t0 + 31s)) ==
        std::vector<std::string>{"d1", "acme/urgent"});
}

TEST_CASE_TEMPLATE(
    "store contract: a claim that takes other work leaves a lease that ran out to its holder",
    Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  // s/1 holds acme's job until t0 + 30 s; the claim's turn then goes to the tenant after acme.
  store->put(make("acme/a1"));
  REQUIRE(ids_of(store->claim_jobs(1, lease("s/1", t0 + 30s), t0 + 1s)) ==
          std::vector<std::string>{"acme/a1"});
  store->put(make("zeta/z1"));
  // A claim with a clock past that lease's end, room for one: zeta's turn, so it takes zeta's job
  // and leaves acme's, whose lease has run out by its clock.
  CHECK(ids_of(store->claim_jobs(1, lease("s/2", t0 + 90s), t0 + 31s)) ==
        std::vector<std::string>{"zeta/z1"});
  // s/1's clock is behind: by it the lease is live, and nobody took the job, so its finish is
  // taken (the job does not run again, its result is kept).
  CHECK(store->finish_job("acme/a1", "s/1", succeeded, std::nullopt, t0 + 29s));
  const auto record = store->get("acme/a1");
  REQUIRE(record.has_value());
  CHECK(record->status == JobStatus::succeeded);
  CHECK(record->outcome.result == succeeded.result);
  CHECK(store->claim_jobs(10, lease("s/3", t0 + 200s), t0 + 60s).empty());  // (zeta's is held)
}

TEST_CASE_TEMPLATE(
    "store contract: the job API fields round trip - started_at and finished_at are kept", Factory,
    STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  Job job = make("a");
  job.priority = 2;
  job.max_queue = 2500ms;
  job.webhook_events = rebound::webhook_started | rebound::webhook_completed;
  job.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  REQUIRE(store->put(job, lease("s/1", t0 + 30s)) == PutOutcome::created);
  auto record = store->get("a");
  REQUIRE(record.has_value());
  CHECK(record->job.priority == 2);
  CHECK(record->job.max_queue == 2500ms);
  CHECK(record->job.webhook_events == (rebound::webhook_started | rebound::webhook_completed));
  CHECK(record->job.traceparent == job.traceparent);
  CHECK(record->started_at == time_point{});
  CHECK(record->outcome.finished_at == time_point{});
  // The same id with another priority, time in queue or events is another request.
  CHECK(store->put(job) == PutOutcome::duplicate);
  Job other = job;
  other.priority = 3;
  CHECK(store->put(other) == PutOutcome::conflict);
  other = job;
  other.max_queue = 1s;
  CHECK(store->put(other) == PutOutcome::conflict);
  other = job;
  other.webhook_events = rebound::webhook_completed;
  CHECK(store->put(other) == PutOutcome::conflict);
  other = job;
  other.traceparent.clear();  // another span retrying the same request
  CHECK(store->put(other) == PutOutcome::duplicate);

  store->mark_running("a", t0 + 1s);
  CHECK(store->get("a")->started_at == t0 + 1s);
  rebound::JobOutcome outcome = succeeded;
  outcome.finished_at = t0 + 3s;
  REQUIRE(store->finish_job("a", "s/1", outcome, std::nullopt, t0 + 3s));
  record = store->get("a");
  CHECK(record->started_at == t0 + 1s);
  CHECK(record->outcome.finished_at == t0 + 3s);

  // Without a lease, too.
  store->put(make("b"));
  outcome.finished_at = t0 + 5s;
  store->complete("b", outcome);
  CHECK(store->get("b")->outcome.finished_at == t0 + 5s);
}

TEST_CASE_TEMPLATE(
    "store contract: a job keeps the model and version it runs on - in claims and reads and lists",
    Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  Job job = make("m1");
  job.model = rebound::ModelRef{"iris", "12"};
  REQUIRE(store->put(job) == PutOutcome::created);
  REQUIRE(store->put(make("plain")) == PutOutcome::created);  // stored by an older server: none
  const rebound::ModelRef iris{"iris", "12"};
  CHECK(store->get("m1")->job.model == iris);
  CHECK(store->get("plain")->job.model.empty());
  auto claimed = store->claim_jobs(10, lease("s/1", t0 + 30s), t0);
  REQUIRE(claimed.size() == 2);
  for (const auto& r : claimed)
    CHECK(r.job.model == (r.job.id == "m1" ? iris : rebound::ModelRef{}));
  CHECK(store->get_many({key_of(job)})[0]->job.model == iris);
  bool listed = false;
  for (const auto& r : store->list_unfinished(10))
    if (r.job.id == "m1") listed = r.job.model == iris;
  CHECK(listed);
  // The name is part of the request, the version the server's choice (a route may choose another
  // for a resubmission); a job stored with no model matches any.
  Job again = job;
  again.model.version = "13";
  CHECK(store->put(again) == PutOutcome::duplicate);
  again.model.name = "resnet";
  CHECK(store->put(again) == PutOutcome::conflict);
  Job named = make("plain");
  named.model = iris;
  CHECK(store->put(named) == PutOutcome::duplicate);
  CHECK(store->get("m1")->job.model == iris);  // neither put wrote over it
  // A job another version ran (an unload that rerouted it) is recorded with that version; one the
  // stored version ran keeps it.
  rebound::JobOutcome rerouted{JobStatus::succeeded, nlohmann::json{{"by", "13"}}, std::nullopt};
  rerouted.ran_on_version = "13";
  REQUIRE(store->finish_job("m1", "s/1", rerouted, std::nullopt, t0 + 1s));
  CHECK(store->get("m1")->job.model == rebound::ModelRef{"iris", "13"});
  CHECK(store->get("m1")->outcome.result == nlohmann::json{{"by", "13"}});
  REQUIRE(store->finish_job("plain", "s/1", succeeded, std::nullopt, t0 + 1s));
  CHECK(store->get("plain")->job.model.empty());
  Job kept = make("m2");
  kept.model = iris;
  REQUIRE(store->put(kept) == PutOutcome::created);
  REQUIRE(store->claim_jobs(10, lease("s/2", t0 + 30s), t0).size() == 1);
  REQUIRE(store->finish_job("m2", "s/2", succeeded, std::nullopt, t0 + 1s));
  CHECK(store->get("m2")->job.model == iris);
}

TEST_CASE_TEMPLATE("store contract: a queued job's position counts the queued jobs before it",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  store->put(with_priority("p5-first", 5, 1764000000001));
  store->put(with_priority("p5-second", 5, 1764000000002));
  store->put(with_priority("p9", 9, 1764000000000));
  store->put(with_priority("p0", 0, 1764000000003), lease("s/1", t0 + 30s));  // claimed, queued
  CHECK(store->queue_position("p0") == std::optional<std::size_t>(0));
  CHECK(store->queue_position("p5-first") == std::optional<std::size_t>(1));
  CHECK(store->queue_position("p5-second") == std::optional<std::size_t>(2));
  CHECK(store->queue_position("p9") == std::optional<std::size_t>(3));
  // Once running it has no position, and those behind it move up.
  store->mark_running("p0", t0);
  CHECK_FALSE(store->queue_position("p0").has_value());
  CHECK(store->queue_position("p9") == std::optional<std::size_t>(2));
  store->complete("p5-first", succeeded);
  CHECK(store->queue_position("p9") == std::optional<std::size_t>(1));
  CHECK_FALSE(store->queue_position("p5-first").has_value());
  CHECK_FALSE(store->queue_position("missing").has_value());
}

TEST_CASE_TEMPLATE(
    "store contract: cancel ends a job not final yet - once - and refuses its holder", Factory,
    STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  const rebound::JobOutcome cancelled{JobStatus::cancelled, nullptr,
                                      rebound::ErrorInfo{"cancelled", "cancelled"}, t0 + 5s};
  store->put(make("queued"));
  store->put(make("held"), lease("s/1", t0 + 30s));
  store->put(make("poll-only", 1764000000000, ""), lease("s/1", t0 + 30s));
  store->mark_running("held", t0 + 1s);
  CHECK(store->cancel("queued", cancelled, t0 + 5s) == rebound::CancelOutcome::cancelled);
  CHECK(store->cancel("held", cancelled, t0 + 5s) == rebound::CancelOutcome::cancelled);
  CHECK(store->cancel("poll-only", cancelled, t0 + 5s) == rebound::CancelOutcome::cancelled);
  CHECK(store->cancel("held", cancelled, t0 + 6s) == rebound::CancelOutcome::already_finished);
  CHECK(store->cancel("missing", cancelled, t0 + 6s) == rebound::CancelOutcome::not_found);
  auto record = store->get("held");
  CHECK(record->status == JobStatus::cancelled);
  REQUIRE(record->outcome.error.has_value());
  CHECK(record->outcome.error->code == "cancelled");
  CHECK(record->outcome.finished_at == t0 + 5s);
  CHECK(record->started_at == t0 + 1s);
  // Its holder's acknowledgement and renewal are refused; nothing claims it as a job again.
  CHECK_FALSE(store->finish_job("held", "s/1", succeeded, std::nullopt, t0 + 7s));
  CHECK_FALSE(store->renew("held", lease("s/1", t0 + 60s), t0 + 7s));
  CHECK(store->get("held")->status == JobStatus::cancelled);
  CHECK(store->claim_jobs(10, lease("s/2", t0 + 90s), t0 + 60s).empty());
  // The callbacks that hear the end are due at once; a poll-only job is done.
  auto due = ids_of(store->claim_callbacks(10, lease("s/2", t0 + 90s), t0 + 5s));
  std::sort(due.begin(), due.end());  // both due at the same time: either order
  CHECK(due == std::vector<std::string>{"held", "queued"});
  CHECK(store->get("poll-only")->callback.state == CallbackState::none);
  CHECK(store->list_unfinished(10).size() == 2);  // the two callbacks are owed
  // A finished job is not cancelled.
  store->put(make("done"), lease("s/1", t0 + 30s));
  REQUIRE(store->finish_job("done", "s/1", succeeded, std::nullopt, t0 + 8s));
  CHECK(store->cancel("done", cancelled, t0 + 9s) == rebound::CancelOutcome::already_finished);
  CHECK(store->get("done")->status == JobStatus::succeeded);
}

TEST_CASE_TEMPLATE("store contract: a job keeps its latest callback attempts", Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  store->put(make("job"), lease("s/1", t0 + 30s));
  REQUIRE(store->finish_job("job", "s/1", succeeded, lease("d/0", t0 + 30s), t0));
  CHECK(store->get("job")->attempt_log.empty());
  // Twelve attempts, each given up and redelivered; a deferral (no attempt) in between.
  for (int i = 0; i < 12; ++i) {
    rebound::CallbackAttempt attempt;
    attempt.at = t0 + std::chrono::seconds(i);
    attempt.http_status = i == 11 ? 200 : 500 + i;
    attempt.error = i == 11 ? "" : "HTTP " + std::to_string(500 + i) + std::string(400, 'x');
    attempt.latency = std::chrono::milliseconds(10 + i);
    attempt.signatures = "v1,v1a";
    rebound::CallbackInfo after;
    after.state = i == 11 ? CallbackState::delivered : CallbackState::failed;
    after.attempts = i + 1;
    const std::string holder = "d/" + std::to_string(i);
    if (i == 5) {
      rebound::CallbackInfo deferred = store->get("job")->callback;
      deferred.next_attempt_at = t0;
      REQUIRE(store->record_attempt("job", holder, deferred, t0 + 5s, std::nullopt));
      REQUIRE(store->claim_callbacks(1, lease(holder, t0 + 30s), t0 + 5s).size() == 1);
    }
    REQUIRE(store->record_attempt("job", holder, after, attempt.at, attempt));
    if (i < 11) {
      REQUIRE(store->redeliver("job", lease("d/" + std::to_string(i + 1), t0 + 60s), attempt.at) ==
              rebound::RedeliverOutcome::redelivered);
    }
  }
  const auto record = store->get("job");
  REQUIRE(record);
  const auto& log = record->attempt_log;
  REQUIRE(log.size() == rebound::max_attempt_log);
  CHECK(log.front().at == t0 + 2s);  // the two oldest went
  CHECK(log.front().http_status == 502);
  CHECK(log.front().error.size() == rebound::max_attempt_error_bytes);
  CHECK(log.front().error.rfind("HTTP 502", 0) == 0);
  CHECK(log.back().http_status == 200);
  CHECK(log.back().error.empty());
  CHECK(log.back().latency == std::chrono::milliseconds(21));
  CHECK(log.back().signatures == "v1,v1a");
  // Listings leave the log out.
  const auto page = store->list_jobs({}, std::nullopt, 10);
  REQUIRE(page.jobs.size() == 1);
  CHECK(page.jobs[0].attempt_log.empty());
}

TEST_CASE_TEMPLATE("store contract: jobs are listed newest first - filtered - in pages", Factory,
                   STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  Job high = make("queued-high", 1764000000001);
  high.priority = 2;
  store->put(high);
  store->put(make("queued", 1764000000002));
  store->put(make("running", 1764000000003));
  store->mark_running("running", t0);
  store->put(make("delivered", 1764000000004), lease("s/1", t0 + 30s));
  REQUIRE(store->finish_job("delivered", "s/1", succeeded, lease("d/1", t0 + 30s), t0));
  REQUIRE(store->record_attempt("delivered", "d/1", {CallbackState::delivered, 1, {}}, t0));
  store->put(make("dead", 1764000000005), lease("s/1", t0 + 30s));
  REQUIRE(store->finish_job("dead", "s/1", succeeded, lease("d/2", t0 + 30s), t0));
  REQUIRE(store->record_attempt("dead", "d/2", {CallbackState::failed, 5, "HTTP 500"}, t0));
  store->put(make("acme/a", 1764000000006));
  store->put(make("acme/b", 1764000000006));  // the same millisecond: by id

  auto list = [&](rebound::JobFilter filter, std::size_t limit = 100) {
    std::vector<std::string> ids;
    std::optional<rebound::ListCursor> after;
    for (int pages = 0; pages < 50; ++pages) {
      const rebound::JobPage page = store->list_jobs(filter, after, limit);
      CHECK(page.jobs.size() <= limit);
      for (const auto& r : page.jobs) {
        CHECK(r.job.input.is_null());
        ids.push_back(rebound::key_of(r.job));
      }
      if (!page.next) break;
      after = page.next;
    }
    return ids;
  };
  using ids = std::vector<std::string>;
  const ids all{"acme/b", "acme/a", "dead", "delivered", "running", "queued", "queued-high"};
  CHECK(list({}) == all);
  CHECK(list({}, 2) == all);  // pages of two add up to the whole listing
  CHECK(list({}, 1) == all);
  rebound::JobFilter queued;
  queued.status = JobStatus::queued;
  CHECK(list(queued) == ids{"acme/b", "acme/a", "queued", "queued-high"});
  rebound::JobFilter high_priority;
  high_priority.priority = 2;
  CHECK(list(high_priority) == ids{"queued-high"});
  rebound::JobFilter dead;
  dead.callback_state = CallbackState::failed;
  CHECK(list(dead) == ids{"dead"});
  rebound::JobFilter running;
  running.status = JobStatus::running;
  CHECK(list(running) == ids{"running"});
  rebound::JobFilter succeeded_delivered;
  succeeded_delivered.status = JobStatus::succeeded;
  succeeded_delivered.callback_state = CallbackState::delivered;
  CHECK(list(succeeded_delivered) == ids{"delivered"});
  rebound::JobFilter tenant;
  tenant.id_prefix = "acme/";
  CHECK(list(tenant) == ids{"acme/b", "acme/a"});
  CHECK(list(tenant, 1) == ids{"acme/b", "acme/a"});
  tenant.status = JobStatus::running;
  CHECK(list(tenant).empty());

  // The dead letters are counted for the console.
  const auto stats = store->queue_stats();
  REQUIRE(stats);
  CHECK(stats->callbacks_failed == 1);
  REQUIRE(store->redeliver("dead", lease("r/1", t0 + 60s), t0) ==
          rebound::RedeliverOutcome::redelivered);
  CHECK(store->queue_stats()->callbacks_failed == 0);
}

TEST_CASE_TEMPLATE("store contract: servers are seen as they report - for an hour", Factory,
                   STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  CHECK(store->servers(t0).empty());
  store->report_server("server-a", 3, t0);
  store->report_server("server-b", 0, t0 + 1s);
  store->report_server("server-a", 5, t0 + 2s);
  auto seen = store->servers(t0 + 3s);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].id == "server-a");  // seen last
  CHECK(seen[0].leases == 5);
  CHECK(seen[0].last_seen == t0 + 2s);
  CHECK(seen[1].id == "server-b");
  CHECK(seen[1].leases == 0);
  // An hour later without a word, a server is gone.
  store->report_server("server-b", 1, t0 + 30min);
  seen = store->servers(t0 + 1h + 10s);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].id == "server-b");
}

// Code that needs one part of a store takes that part (JobStore's three interfaces): a worker knows
// the lease protocol, a reader the read side, a fleet view the coordination.
static_assert(std::is_base_of_v<rebound::JobLeaseStore, rebound::MemoryJobStore> &&
              std::is_base_of_v<rebound::JobReadStore, rebound::SqliteJobStore> &&
              std::is_base_of_v<rebound::FleetStore, rebound::test::FailingStore>);

namespace {

// Claims one job, runs it and acknowledges it: what it answered for, or nullopt.
std::optional<std::string> work_one(rebound::JobLeaseStore& leases, time_point now) {
  const rebound::Lease lease{"worker/1", now + 30s};
  auto claimed = leases.claim_jobs(1, lease, now);
  if (claimed.empty()) return std::nullopt;
  const std::string key = rebound::key_of(claimed.front().job);
  leases.mark_running(key, now);
  if (!leases.finish_job(key, lease.holder, succeeded, std::nullopt, now)) return std::nullopt;
  return key;
}

// The keys of the jobs whose callback is pending, newest first, as a console lists them.
std::vector<std::string> pending_callbacks(const rebound::JobReadStore& reads) {
  rebound::JobFilter filter;
  filter.callback_state = CallbackState::pending;
  std::vector<std::string> keys;
  for (const auto& r : reads.list_jobs(filter, std::nullopt, 10).jobs)
    keys.push_back(rebound::key_of(r.job));
  return keys;
}

}  // namespace

TEST_CASE_TEMPLATE("store contract: each of the three parts serves through its own interface",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  rebound::JobLeaseStore& leases = *store;
  const rebound::JobReadStore& reads = *store;
  rebound::FleetStore& fleet = *store;

  CHECK(leases.put(make("acme/a", 1764000000000)) == PutOutcome::created);
  CHECK(leases.put(make("b", 1764000001000)) == PutOutcome::created);
  // Tenants in turns, in name order: the default tenant's (named "") first.
  CHECK(work_one(leases, t0 + 2s) == std::optional<std::string>("b"));
  CHECK(work_one(leases, t0 + 2s) == std::optional<std::string>("acme/a"));
  CHECK_FALSE(work_one(leases, t0 + 2s).has_value());  // nothing left to claim

  // What the worker wrote, the reader sees.
  const auto a = reads.get("acme/a");
  REQUIRE(a.has_value());
  CHECK(a->status == JobStatus::succeeded);
  CHECK(a->job.tenant == "acme");
  CHECK(a->callback.state == CallbackState::pending);
  CHECK(pending_callbacks(reads) == std::vector<std::string>{"b", "acme/a"});
  const auto both = reads.get_many({"b", "missing"});
  REQUIRE(both.size() == 2);
  REQUIRE(both[0].has_value());
  CHECK(both[0]->status == JobStatus::succeeded);
  CHECK_FALSE(both[1].has_value());
  CHECK(leases.put(make("c", 1764000002000)) == PutOutcome::created);
  CHECK(reads.queue_position("c") == std::optional<std::size_t>(0));
  CHECK(leases.cancel("c", {JobStatus::cancelled, nullptr, std::nullopt}, t0 + 3s) ==
        rebound::CancelOutcome::cancelled);
  CHECK(reads.get("c")->status == JobStatus::cancelled);
  CHECK_FALSE(reads.queue_position("c").has_value());

  fleet.report_server("server-a", 2, t0 + 3s);
  const auto seen = fleet.servers(t0 + 4s);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].id == "server-a");
  CHECK(seen[0].leases == 2);
}

namespace {

// The keys a listing shows when its cursors are followed, `limit` a page (at most 1,000 pages).
std::vector<std::string> listed_by_pages(const rebound::JobReadStore& store,
                                         const rebound::JobFilter& filter, std::size_t limit) {
  std::vector<std::string> keys;
  std::optional<rebound::ListCursor> after;
  for (int pages = 0; pages < 1000; ++pages) {
    const rebound::JobPage page = store.list_jobs(filter, after, limit);
    CHECK(page.jobs.size() <= limit);
    for (const auto& r : page.jobs)
      keys.push_back(rebound::key_of(r.job));
    if (!page.next) break;
    after = page.next;
  }
  return keys;
}

}  // namespace

TEST_CASE_TEMPLATE("store contract: a listing that matches little still reaches every match",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  // The one match is the oldest, behind 1,200 others: a store may bound what one call reads, and
  // answer short pages with a cursor, but following the cursors finds it.
  Job match = make("match", 1764000000000, "");
  match.priority = 0;
  store->put(match);
  for (int i = 1; i <= 1200; ++i)
    store->put(make("other-" + std::to_string(i), 1764000000000 + i, ""));
  rebound::JobFilter filter;
  filter.priority = 0;
  CHECK(listed_by_pages(*store, filter, 1) == std::vector<std::string>{"match"});
}

TEST_CASE_TEMPLATE("store contract: a listing's cursor in a crowded millisecond goes on past it",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  // 1,100 jobs of one millisecond (a batch submission), the one match last in the listing's order
  // (by id, newest first): a store that bounds what one call reads answers a cursor inside that
  // millisecond, and the page after it must go on from there, not read the bound away again on
  // the jobs listed already (the Redis store ended such a listing early, as if nothing were left).
  constexpr long long ms = 1764000000000;
  Job match = make("a-match", ms, "");
  match.priority = 0;
  store->put(match);
  for (int i = 0; i < 1100; ++i)
    store->put(make("other-" + std::to_string(1000 + i), ms, ""));
  rebound::JobFilter filter;
  filter.priority = 0;
  CHECK(listed_by_pages(*store, filter, 1) == std::vector<std::string>{"a-match"});
  // Unfiltered, in pages of 7 that cut the millisecond anywhere: every job once, in order.
  const std::vector<std::string> all = listed_by_pages(*store, {}, 7);
  REQUIRE(all.size() == 1101);
  CHECK(all.front() == "other-2099");
  CHECK(all.back() == "a-match");
  CHECK(std::is_sorted(all.rbegin(), all.rend()));
}

TEST_CASE_TEMPLATE("store contract: a limit of SIZE_MAX reads as many as the store gives", Factory,
                   STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  // A library caller's "everything": a store may answer fewer than asked (with a cursor), never
  // none (PostgresJobStore's `LIMIT limit + 1` wrapped to 0, and a bigint out of range failed).
  constexpr std::size_t all = SIZE_MAX;
  store->put(make("queued", 1764000000001));
  store->put(make("dead", 1764000000002), lease("s/1", t0 + 30s));
  REQUIRE(store->finish_job("dead", "s/1", succeeded, lease("d/1", t0 + 30s), t0));
  REQUIRE(store->record_attempt("dead", "d/1", {CallbackState::failed, 5, "HTTP 500"}, t0));
  CHECK(ids_of(store->list_jobs({}, std::nullopt, all).jobs) ==
        std::vector<std::string>{"dead", "queued"});
  rebound::JobFilter queued;
  queued.status = JobStatus::queued;
  CHECK(ids_of(store->list_jobs(queued, std::nullopt, all).jobs) ==
        std::vector<std::string>{"queued"});
  CHECK(ids_of(store->failed_callbacks_page("", std::nullopt, all).jobs) ==
        std::vector<std::string>{"dead"});
  CHECK(ids_of(store->list_failed_callbacks(all)) == std::vector<std::string>{"dead"});
  CHECK(ids_of(store->list_unfinished(all)) == std::vector<std::string>{"queued"});
  CHECK(store->claim_callbacks(all, lease("c/1", t0 + 2h), t0 + 1h).empty());
  CHECK(ids_of(store->claim_jobs(all, lease("w/1", t0 + 2h), t0 + 1h)) ==
        std::vector<std::string>{"queued"});
}

TEST_CASE_TEMPLATE("store contract: a job's lease and its callback's lease are not one another's",
                   T, STORES) {
  T fixture;
  auto store = fixture.make();
  // One holder name on both (a store used by hand may do it; a JobQueue's claims never do).
  REQUIRE(store->put(make("a"), lease("h", t0 + 30s)) == PutOutcome::created);
  rebound::CallbackInfo delivered;
  delivered.state = rebound::CallbackState::delivered;
  delivered.attempts = 1;
  // Under the job's lease, no callback attempt is recorded: the job has no callback yet.
  CHECK_FALSE(store->record_attempt("a", "h", delivered, t0));
  CHECK(store->get("a")->callback.state == rebound::CallbackState::none);
  // Acknowledged, its callback claimed by the same name: a second acknowledgement of the job
  // under the callback's lease is refused, and the outcome stays the first.
  REQUIRE(store->finish_job("a", "h", succeeded, lease("h", t0 + 30s), t0));
  const rebound::JobOutcome other{JobStatus::failed, nullptr, rebound::ErrorInfo{"x", "y"}};
  CHECK_FALSE(store->finish_job("a", "h", other, std::nullopt, t0));
  const auto record = store->get("a");
  CHECK(record->status == JobStatus::succeeded);
  CHECK(record->callback.state == rebound::CallbackState::pending);
  // The callback's own acknowledgement goes through.
  CHECK(store->record_attempt("a", "h", delivered, t0));
}

TEST_CASE_TEMPLATE("store contract: jobs behind many of a version left alone are claimed", Factory,
                   STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  if (!store->model_configs()) return;  // a store of one server claims every version
  // 6,000 jobs of iris/2 ahead of 10 of iris/1: more than one claim of any store reads past.
  std::vector<Job> jobs;
  jobs.reserve(6010);
  for (int i = 0; i < 6010; ++i) {
    jobs.push_back(make("k" + std::to_string(10000 + i), 1764000000000 + i));
    jobs.back().model = {"iris", i < 6000 ? "2" : "1"};
  }
  put_all(*store, jobs);
  const time_point now = t0 + 10s;
  std::vector<std::string> got;
  for (int claims = 0; claims < 10 && got.size() < 10; ++claims) {
    for (const auto& r : store->claim_jobs_except(4, lease("one", t0 + 60s), now, {{"iris", "2"}}))
      got.push_back(r.job.id);
  }
  CHECK(got == std::vector<std::string>{"k16000", "k16001", "k16002", "k16003", "k16004", "k16005",
                                        "k16006", "k16007", "k16008", "k16009"});
  // What was left alone is still first for a server that serves it.
  const auto front = store->claim_jobs(2, lease("two", t0 + 60s), now);
  REQUIRE(front.size() == 2);
  CHECK(front[0].job.id == "k10000");
  CHECK(front[1].job.id == "k10001");
}

TEST_CASE_TEMPLATE(
    "store contract: a job found behind skipped ones and left to another tenant's "
    "turn is claimed next",
    Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  if (!store->model_configs()) return;  // a store of one server claims every version
  // Two jobs each of the default tenant and acme; beta's two behind and among 5,500 of iris/2
  // (past what one claim of any store reads: it stops after b1).
  std::vector<Job> jobs;
  jobs.reserve(5506);
  const auto add = [&](const std::string& id, long long ms, const std::string& version) {
    jobs.push_back(make(id, 1764000000000 + ms));
    jobs.back().model = {"iris", version};
  };
  add("x0", 0, "1");
  add("x1", 1, "1");
  add("acme/y0", 0, "1");
  add("acme/y1", 1, "1");
  for (int i = 0; i < 5500; ++i)
    add("beta/s" + std::to_string(i), i, "2");
  add("beta/b1", 994, "1");  // (in s994's millisecond: before it, by id)
  add("beta/b2", 5600, "1");
  put_all(*store, jobs);
  // Two a claim, the tenants in turns: beta's b1, found by the first claim but not its turn, is
  // not passed over by the claims after it (it comes before b2).
  std::vector<std::string> got;
  for (int claims = 0; claims < 12 && got.size() < 6; ++claims) {
    for (const auto& r :
         store->claim_jobs_except(2, lease("one", t0 + 60s), t0 + 10s, {{"iris", "2"}}))
      got.push_back(rebound::key_of(r.job));
  }
  REQUIRE(got.size() == 6);
  const auto at = [&](const std::string& key) {
    return std::find(got.begin(), got.end(), key) - got.begin();
  };
  CHECK(at("beta/b1") < at("beta/b2"));
  CHECK(at("beta/b1") <= 3);  // in the second claim's turn
  CHECK(at("x0") < at("x1"));
  CHECK(at("acme/y0") < at("acme/y1"));
}

TEST_CASE_TEMPLATE("store contract: a fleet's store says which versions have jobs nobody claims",
                   Factory, STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  // Jobs of iris/1 (claimed below) and iris/2 (left alone); one of iris/3 created later; a
  // tenant's job of iris/4 at another priority; iris/5 held under a lease renewed past the
  // times asked about; iris/6 finished.
  for (int i = 0; i < 9; ++i) {
    Job job = make("w-" + std::to_string(i), 1764000000000 + i);
    job.model = {"iris", i % 3 == 0 ? "2" : "1"};
    REQUIRE(store->put(job) == PutOutcome::created);
  }
  Job late = make("w-late", 1764000005000);
  late.model = {"iris", "3"};
  REQUIRE(store->put(late) == PutOutcome::created);
  Job tenants = make("acme/w-t", 1764000000500);
  tenants.model = {"iris", "4"};
  tenants.priority = 0;
  REQUIRE(store->put(tenants) == PutOutcome::created);
  Job held = make("w-held");
  held.model = {"iris", "5"};
  REQUIRE(store->put(held, lease("five", t0 + 30s)) == PutOutcome::created);
  CHECK(store->renew("w-held", lease("five", t0 + 100s), t0 + 20s));
  Job done = make("w-done");
  done.model = {"iris", "6"};
  REQUIRE(store->put(done, lease("six", t0 + 30s)) == PutOutcome::created);
  REQUIRE(store->finish_job("w-done", "six", {JobStatus::succeeded, {{"y", 1}}, std::nullopt},
                            std::nullopt, t0 + 1s));
  const std::vector<rebound::ModelRef> asked{{"iris", "1"}, {"iris", "2"}, {"iris", "3"},
                                             {"iris", "4"}, {"iris", "5"}, {"iris", "6"}};
  const auto versions_of = [](std::vector<rebound::ModelRef> refs) {
    std::vector<std::string> out;
    for (const auto& r : refs)
      out.push_back(r.name + "/" + r.version);
    std::sort(out.begin(), out.end());
    return out;
  };
  const auto waiting = store->waiting_versions(asked, t0 + 2s);
  if (!store->model_configs()) {
    CHECK(waiting.empty());  // a store of one server: nothing to say
    return;
  }
  // Before any claim: every version with jobs by then, none held, none finished.
  CHECK(versions_of(waiting) == std::vector<std::string>{"iris/1", "iris/2", "iris/4"});
  CHECK(store->waiting_versions(asked, t0 - 1s).empty());  // nothing waited that long
  CHECK(store->waiting_versions({{"iris", "2"}}, t0 + 2s) ==
        std::vector<rebound::ModelRef>{{"iris", "2"}});  // only what is asked about
  // Claimed (the versions 2 and 4 left alone), iris/1 has nobody's jobs waiting; with the lease
  // run out, it has again. The renewed lease still holds iris/5's job.
  CHECK(store->claim_jobs_except(6, lease("one", t0 + 60s), t0 + 3s, {{"iris", "2"}, {"iris", "4"}})
            .size() == 6);
  CHECK(versions_of(store->waiting_versions(asked, t0 + 4s)) ==
        std::vector<std::string>{"iris/2", "iris/4"});
  CHECK(versions_of(store->waiting_versions(asked, t0 + 61s)) ==
        std::vector<std::string>{"iris/1", "iris/2", "iris/3", "iris/4"});
}
