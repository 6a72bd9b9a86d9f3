// RedisJobStore beyond the contract suite: its URI, several stores (servers) on one Redis, and a
// Redis that stops, hangs, restarts or fills up. Every test runs a real redis-server.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>

#include "rebound/error.hpp"
#include "rebound/job_queue.hpp"
#include "rebound/store/redis_job_store.hpp"
#include "store/redis/cluster.hpp"
#include "support/fake_clock.hpp"
#include "support/held_model.hpp"
#include "support/put_all.hpp"
#include "support/quiesce.hpp"
#include "support/redis_server.hpp"
#include "support/submitting.hpp"

using rebound::Job;
using rebound::JobStatus;
using rebound::Lease;
using rebound::PutOutcome;
using rebound::RedisJobStore;
using rebound::RedisJobStoreOptions;
using namespace std::chrono_literals;

namespace {

using time_point = std::chrono::system_clock::time_point;

time_point at_ms(long long ms) {
  return time_point(std::chrono::milliseconds(ms));
}

Job make(const std::string& id, nlohmann::json input = {{"x", 1}}) {
  return Job{id, "http://example.com/cb", std::move(input), at_ms(1764000000000)};
}

RedisJobStoreOptions options_for(const rebound::test::RedisServer& server) {
  RedisJobStoreOptions o = rebound::parse_redis_uri(server.uri());
  o.connect_timeout = 500ms;
  // Short, for the tests of a hung Redis; not so short that a call under a sanitizer's slowdown
  // and a loaded machine (appendfsync always) times out by itself.
  o.command_timeout = 1500ms;
  o.reconnect_min = 20ms;
  o.reconnect_max = 100ms;
  return o;
}

// The answer of `f`, once it came within 20 s (a test that fails does not hang).
template <typename T>
T answer_of(std::future<T> f) {
  REQUIRE(f.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  return f.get();
}

// Calls `probe` until it answers true, for up to `limit`.
template <typename Probe>
bool eventually(Probe&& probe, std::chrono::milliseconds limit = 20000ms) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (probe()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return probe();
}

}  // namespace

TEST_CASE("redis URIs: host and port and database and user - never a password") {
  auto o = rebound::parse_redis_uri("redis://10.0.0.5:6380/3");
  CHECK(o.host == "10.0.0.5");
  CHECK(o.port == 6380);
  CHECK(o.db == 3);
  o = rebound::parse_redis_uri("redis://cache.internal");
  CHECK(o.host == "cache.internal");
  CHECK(o.port == 6379);
  CHECK(o.db == 0);
  o = rebound::parse_redis_uri("redis://[::1]:7000/1");
  CHECK(o.host == "::1");
  CHECK(o.port == 7000);
  CHECK(o.db == 1);
  o = rebound::parse_redis_uri("redis://worker@10.0.0.5");
  CHECK(o.username == "worker");
  CHECK(o.password.empty());
  CHECK_THROWS_WITH_AS(rebound::parse_redis_uri("redis://worker:secret@10.0.0.5"),
                       doctest::Contains("REBOUND_REDIS_PASSWORD"), rebound::Error);
  // The key prefix: a Redis Cluster hash tag by default, another by ?prefix=.
  CHECK(o.key_prefix == "{rebound}");
  o = rebound::parse_redis_uri("redis://10.0.0.5:6380/3?prefix={eu-queue}");
  CHECK(o.key_prefix == "{eu-queue}");
  CHECK(o.db == 3);
  CHECK(o.port == 6380);
  CHECK(rebound::parse_redis_uri("redis://h?prefix=rebound").key_prefix == "rebound");
  // Writes acknowledged once N replicas have them (WAIT): none asked for unless given.
  CHECK(o.replicas == 0);
  o = rebound::parse_redis_uri("redis://h?replicas=2&prefix={eu}");
  CHECK(o.replicas == 2);
  CHECK(o.key_prefix == "{eu}");
  CHECK(rebound::parse_redis_uri("redis://h?prefix={eu}&replicas=1").replicas == 1);
  for (const char* bad : {"http://10.0.0.5",
                          "redis://",
                          "redis://:6379",
                          "redis://h:0",
                          "redis://h:65536",
                          "redis://h:12x",
                          "redis://h:",
                          "redis://h/x",
                          "redis://h/",
                          "redis://[::1",
                          "redis://[::1]x",
                          "redis://::1",
                          "redis://h?prefix=",
                          "redis://h?prefix=a:b",
                          "redis://h?prefix=a b",
                          "redis://h?prefix=%7Beu%7D",
                          "redis://h?prefix=eu#x",
                          "redis://h?prefix={}",
                          "redis://h?prefix={open",
                          "redis://h?db=1",
                          "redis://h?prefix=a&prefix=b",
                          "redis://h?replicas=",
                          "redis://h?replicas=17",
                          "redis://h?replicas=-1",
                          "redis://h?replicas=1x",
                          "redis://h?replicas=1&replicas=2",
                          "redis://h?prefix={a}&",
                          "redis://h?",
                          "redis://h?prefix={a}&wait=1"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(rebound::parse_redis_uri(bad), rebound::Error);
  }
}

TEST_CASE("redis: a Redis that cannot be reached or evicts keys is refused at construction") {
  rebound::test::RedisServer server({"--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"});
  CHECK_THROWS_WITH_AS(RedisJobStore(options_for(server)), doctest::Contains("allkeys-lru"),
                       rebound::Error);
  auto gone = options_for(server);
  server.stop();
  CHECK_THROWS_WITH_AS(RedisJobStore{gone}, doctest::Contains("cannot use the redis job store"),
                       rebound::Error);
}

TEST_CASE("redis: servers on one Redis share one queue - one job per id and one claim per job") {
  rebound::test::RedisServer server;
  std::vector<std::unique_ptr<RedisJobStore>> stores;
  for (int i = 0; i < 3; ++i)
    stores.push_back(std::make_unique<RedisJobStore>(options_for(server)));

  // The same id put on three servers at once, 50 times over: exactly one is created each time.
  for (int round = 0; round < 50; ++round) {
    const std::string id = "race-" + std::to_string(round);
    std::atomic<int> created{0}, duplicates{0};
    std::vector<std::thread> threads;
    for (auto& store : stores) {
      threads.emplace_back([&, s = store.get()] {
        const PutOutcome outcome = s->put(make(id), Lease{"holder", at_ms(1764000030000)});
        if (outcome == PutOutcome::created) ++created;
        if (outcome == PutOutcome::duplicate) ++duplicates;
      });
    }
    for (auto& t : threads)
      t.join();
    CHECK(created == 1);
    CHECK(duplicates == 2);
  }
  // A different request under a taken id is a conflict on any server.
  CHECK(stores[2]->put(make("race-0", {{"x", 2}})) == PutOutcome::conflict);

  // 200 unclaimed jobs claimed by three servers at once: each goes to exactly one.
  for (int i = 0; i < 200; ++i)
    REQUIRE(stores[0]->put(make("job-" + std::to_string(i))) == PutOutcome::created);
  std::vector<std::vector<std::string>> claimed(3);
  std::vector<std::thread> threads;
  for (int s = 0; s < 3; ++s) {
    threads.emplace_back([&, s] {
      for (;;) {
        auto got = stores[s]->claim_jobs(
            7, Lease{"server-" + std::to_string(s), at_ms(1764000100000)}, at_ms(1764000000000));
        if (got.empty()) return;
        for (auto& r : got)
          claimed[s].push_back(r.job.id);
      }
    });
  }
  for (auto& t : threads)
    t.join();
  std::vector<std::string> all;
  for (auto& c : claimed)
    all.insert(all.end(), c.begin(), c.end());
  std::sort(all.begin(), all.end());
  CHECK(all.size() == 200);
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());

  // A server whose lease ran out loses the job to another, and its late acknowledgement is refused.
  const std::string id = claimed[0].front();
  auto taken =
      stores[1]->claim_jobs(1000, Lease{"late-comer", at_ms(1764000200000)}, at_ms(1764000100001));
  CHECK(taken.size() == 250);  // the 200, and the 50 raced ones whose put-time lease ran out
  const rebound::JobOutcome done{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  CHECK_FALSE(stores[0]->finish_job(id, "server-0", done, std::nullopt, at_ms(1764000100002)));
  CHECK(stores[2]->finish_job(id, "late-comer", done, std::nullopt, at_ms(1764000100002)));
  CHECK(stores[0]->get(id)->status == JobStatus::succeeded);
}

TEST_CASE("redis: claims leave the versions skipped in place - model configs are compare-and-set") {
  rebound::test::RedisServer server;
  RedisJobStore one(options_for(server)), two(options_for(server));
  // 30 jobs: every third of iris/2, the rest of iris/1; one tenant, one priority, in order.
  for (int i = 0; i < 30; ++i) {
    Job job = make("v-" + std::to_string(100 + i));
    job.created_at = at_ms(1764000000000 + i);
    job.model = {"iris", i % 3 == 0 ? "2" : "1"};
    REQUIRE(one.put(job) == PutOutcome::created);
  }
  const auto now = at_ms(1764000001000);
  const std::vector<rebound::ModelRef> skip{{"iris", "2"}, {"other", "1"}};
  auto got = one.claim_jobs_except(25, Lease{"one", at_ms(1764000100000)}, now, skip);
  CHECK(got.size() == 20);  // every job of iris/1, none of iris/2
  for (const auto& r : got)
    CHECK(r.job.model == rebound::ModelRef{"iris", "1"});
  CHECK(got.front().job.id == "v-101");  // in their order
  // What was skipped is where it was, for a server that serves it.
  auto rest = two.claim_jobs(25, Lease{"two", at_ms(1764000100000)}, now);
  REQUIRE(rest.size() == 10);
  CHECK(rest.front().job.id == "v-100");
  for (const auto& r : rest)
    CHECK(r.job.model == rebound::ModelRef{"iris", "2"});
  // Nothing to skip: a plain claim.
  CHECK(one.claim_jobs_except(5, Lease{"one", at_ms(1764000100000)}, now, {}).empty());

  // Model configs: shared by every store on the Redis, written only on the generation read.
  REQUIRE(one.model_configs());
  CHECK(one.model_configs()->empty());
  CHECK(one.put_model_config("iris", R"({"a":1})", 0) == std::optional<std::uint64_t>(1));
  CHECK_FALSE(two.put_model_config("iris", R"({"a":2})", 0));  // someone wrote it first
  CHECK(two.put_model_config("iris", R"({"a":2})", 1) == std::optional<std::uint64_t>(2));
  const auto configs = one.model_configs();
  REQUIRE(configs->size() == 1);
  CHECK(configs->front().name == "iris");
  CHECK(configs->front().generation == 2);
  CHECK(configs->front().config == R"({"a":2})");
}

TEST_CASE(
    "redis: more skipped jobs than a claim reads hold back the others for a few claims only") {
  rebound::test::RedisServer server;
  RedisJobStore one(options_for(server)), two(options_for(server));
  // 2,500 jobs of iris/2 (which server one leaves alone) ahead of 10 of iris/1, in one tenant's
  // one priority; then 10 more of iris/2 at priority 0.
  std::vector<Job> jobs;
  for (int i = 0; i < 2510; ++i) {
    jobs.push_back(make("s-" + std::to_string(10000 + i)));
    jobs.back().created_at = at_ms(1764000000000 + i);
    jobs.back().model = {"iris", i < 2500 ? "2" : "1"};
  }
  for (int i = 0; i < 10; ++i) {
    jobs.push_back(make("s-urgent-" + std::to_string(i)));
    jobs.back().created_at = at_ms(1764000005000 + i);
    jobs.back().model = {"iris", "2"};
    jobs.back().priority = 0;
  }
  rebound::test::put_all(one, jobs);
  const auto now = at_ms(1764000010000);
  const std::vector<rebound::ModelRef> skip{{"iris", "2"}};
  // A claim reads at most 1,000 of them: the iris/1 jobs come within three claims, in order.
  std::vector<std::string> got;
  int claims = 0;
  while (got.empty() && claims < 3) {
    ++claims;
    for (const auto& r : one.claim_jobs_except(5, Lease{"one", at_ms(1764000100000)}, now, skip))
      got.push_back(r.job.id);
  }
  REQUIRE(got.size() == 5);
  CHECK(got.front() == "s-12500");
  CHECK(got.back() == "s-12504");
  // The next claim goes on after them (from the last skipped job before the first found).
  const auto next = one.claim_jobs_except(10, Lease{"one", at_ms(1764000100000)}, now, skip);
  REQUIRE(next.size() == 5);
  CHECK(next.front().job.id == "s-12505");
  // Another server's claim, which skips nothing (or other versions), starts from the front.
  const auto urgent =
      two.claim_jobs_except(3, Lease{"two", at_ms(1764000100000)}, now, {{"iris", "9"}});
  REQUIRE(urgent.size() == 3);
  CHECK(urgent.front().job.id == "s-urgent-0");
  const auto front = two.claim_jobs(8, Lease{"two", at_ms(1764000100000)}, now);
  REQUIRE(front.size() == 8);
  CHECK(front[6].job.id == "s-urgent-9");
  CHECK(front[7].job.id == "s-10000");
  // Nothing left for server one: its claims read to the end and begin again, finding none.
  for (int i = 0; i < 4; ++i)
    CHECK(one.claim_jobs_except(10, Lease{"one", at_ms(1764000100000)}, now, skip).empty());
}

TEST_CASE("redis: get_many of more ids than one pipeline holds answers each - in order") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  // 600 ids in three slices (256 a round trip), every 7th unknown, and one asked again at the
  // end (in another slice than its first).
  std::vector<rebound::PutRequest> puts;
  std::vector<Job> jobs;
  jobs.reserve(600);
  std::vector<std::string> ids;
  for (int i = 0; i < 600; ++i) {
    ids.push_back("many-" + std::to_string(i));
    if (i % 7 == 0) continue;
    jobs.push_back(make(ids.back(), {{"n", i}}));
  }
  for (const Job& job : jobs)
    puts.push_back({&job, std::nullopt});
  store.put_many(puts);
  ids.push_back("many-1");
  const auto records = store.get_many(ids);
  REQUIRE(records.size() == ids.size());
  for (std::size_t i = 0; i < 600; ++i) {
    CAPTURE(i);
    if (i % 7 == 0) {
      CHECK_FALSE(records[i].has_value());
      continue;
    }
    REQUIRE(records[i].has_value());
    CHECK(records[i]->job.id == ids[i]);
    CHECK(records[i]->job.input == nlohmann::json{{"n", i}});
  }
  REQUIRE(records.back().has_value());
  CHECK(records.back()->job.id == "many-1");
}

TEST_CASE("redis: a Redis that stops fails the store at once - it recovers when Redis is back") {
  rebound::test::RedisServer server({"--appendonly", "yes", "--appendfsync", "always"});
  RedisJobStore store(options_for(server));
  REQUIRE(store.put(make("before")) == PutOutcome::created);
  CHECK_FALSE(store.failure());

  server.stop(SIGKILL);
  CHECK_THROWS_AS(store.put(make("during")), rebound::StoreUnavailable);
  CHECK_THROWS_AS(store.get("before"), rebound::StoreUnavailable);
  const auto why = store.failure();
  REQUIRE(why.has_value());
  CHECK(why->find("redis job store") != std::string::npos);
  // While Redis is away, calls fail fast (no connection attempt per call).
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i)
    CHECK_THROWS_AS(store.get("before"), rebound::StoreUnavailable);
  CHECK(std::chrono::steady_clock::now() - started < 5s);

  server.start();  // the same port and folder: the append-only file kept what was acknowledged
  CHECK(eventually([&] { return !store.failure(); }));
  const auto before = store.get("before");
  REQUIRE(before.has_value());
  CHECK(before->status == JobStatus::queued);
  CHECK_FALSE(store.get("during").has_value());
  CHECK(store.put(make("after")) == PutOutcome::created);
}

TEST_CASE(
    "redis: a Redis restarted between two calls costs no failed call - idle connections are "
    "replaced") {
  for (const bool batches : {true, false}) {
    CAPTURE(batches);
    rebound::test::RedisServer server({"--appendonly", "yes", "--appendfsync", "always"});
    auto options = options_for(server);
    options.batch_writes = batches;
    RedisJobStore store(options);
    REQUIRE(store.put(make("before")) == PutOutcome::created);
    REQUIRE(store.get("before").has_value());  // (the connections it used now idle)

    server.stop();  // SIGTERM: Redis closes every connection once its file is written
    server.start();
    // The first calls after the restart go out on new connections: none fails.
    CHECK(store.put(make("after")) == PutOutcome::created);
    CHECK(store.get("before").has_value());
    CHECK(store.get("after").has_value());
    CHECK_FALSE(store.failure());
  }
}

TEST_CASE("redis: a hung Redis times out instead of hanging the caller") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  REQUIRE(store.put(make("a")) == PutOutcome::created);
  server.pause();
  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(store.get("a"), rebound::StoreUnavailable);
  CHECK(std::chrono::steady_clock::now() - started < 5s);
  CHECK(store.failure().has_value());
  server.resume();
  CHECK(eventually([&] { return !store.failure(); }));
  CHECK(store.get("a").has_value());
}

TEST_CASE("redis: a frozen Redis is reported within 2 s - each look at it takes less than 2 s") {
  rebound::test::RedisServer server;
  RedisJobStoreOptions o = rebound::parse_redis_uri(server.uri());
  o.command_timeout = 10s;  // far longer than the report may take
  RedisJobStore store(o);
  REQUIRE(store.put(make("a")) == PutOutcome::created);
  CHECK_FALSE(store.failure());
  server.pause();
  // A caller (the pump, a poll) waits on Redis meanwhile, as a server's would.
  auto waiting = std::async(std::launch::async, [&] {
    try {
      store.get("a");
    } catch (const rebound::StoreUnavailable&) {
    }
  });
  const auto frozen = std::chrono::steady_clock::now();
  std::optional<std::string> why;
  auto slowest = 0ms;
  while (!why && std::chrono::steady_clock::now() - frozen < 5s) {
    const auto asked = std::chrono::steady_clock::now();
    why = store.failure();
    slowest = std::max(slowest, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::steady_clock::now() - asked));
    std::this_thread::sleep_for(50ms);
  }
  REQUIRE(why.has_value());
  CHECK(why->find("no answer") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - frozen < 2500ms);  // SageMaker: 2 s, and one 50 ms nap
  CHECK(slowest < 2s);
  server.resume();
  waiting.get();
  CHECK(eventually([&] { return !store.failure(); }));
  CHECK(store.get("a").has_value());
}

namespace {
// How many connections `server` has accepted since it started (INFO stats), -1 when unknown.
long long connections_received(const rebound::test::RedisServer& server) {
  const std::string line = "redis-cli -p " + std::to_string(server.port()) +
                           " INFO stats 2>/dev/null | grep total_connections_received";
  long long n = -1;
  if (FILE* pipe = ::popen(line.c_str(), "r")) {
    char buffer[256];
    if (std::fgets(buffer, sizeof buffer, pipe)) {
      const std::string text(buffer);
      const auto colon = text.find(':');
      if (colon != std::string::npos) n = std::stoll(text.substr(colon + 1));
    }
    ::pclose(pipe);
  }
  return n;
}
}  // namespace

TEST_CASE(
    "redis: a look at a frozen Redis that failed answers the next ones until the backoff ends") {
  // A /ping a second on a frozen Redis: each look that waited for it (up to 1.6 s, on the HTTP
  // thread) holds off the next ones for the reconnect backoff, so the others answer from it.
  rebound::test::RedisServer server;
  RedisJobStoreOptions o = options_for(server);
  o.reconnect_min = 30s;
  o.reconnect_max = 30s;
  RedisJobStore store(o);
  REQUIRE(store.put(make("a")) == PutOutcome::created);
  const long long before = connections_received(server);
  REQUIRE(before > 0);
  server.pause();
  CHECK_THROWS_AS(store.get("a"), rebound::StoreUnavailable);
  for (int ping = 0; ping < 6; ++ping)
    CHECK(store.failure().has_value());
  server.resume();
  // (The connections made while Redis was stopped wait in its backlog and are counted now.)
  const long long after = connections_received(server);
  INFO("connections while frozen: " << after - before);
  // One look, and this count's own connection (and a reconnect of the get, if it made one).
  CHECK(after - before <= 3);
}

TEST_CASE("redis: at maxmemory a put answers full - the work already accepted still finishes") {
  rebound::test::RedisServer server({"--maxmemory", "8mb", "--maxmemory-policy", "noeviction"});
  RedisJobStore store(options_for(server));
  const auto now = std::chrono::system_clock::now();
  REQUIRE(store.put(make("accepted"), Lease{"worker", now + 60s}) == PutOutcome::created);
  const std::string big(64 * 1024, 'x');
  bool full = false;
  int created = 0;
  for (int i = 0; i < 1000 && !full; ++i) {
    const PutOutcome outcome = store.put(make("big-" + std::to_string(i), {{"blob", big}}));
    full = outcome == PutOutcome::full;
    if (outcome == PutOutcome::created) ++created;
  }
  CHECK(full);
  CHECK(created > 0);
  // The asynchronous put (a submission's) answers the same, not a failing store. (Redis's used
  // memory moves a little between calls, more so on a busy machine: one put after a refused one
  // may still fit, so a few are sent until one is refused.)
  std::pair<bool, PutOutcome> async_answer{true, PutOutcome::created};
  for (int i = 0; i < 20 && async_answer == std::make_pair(true, PutOutcome::created); ++i) {
    std::promise<std::pair<bool, PutOutcome>> answered;
    store.async_put(make("big-async-" + std::to_string(i), {{"blob", big}}), std::nullopt,
                    [&answered](std::exception_ptr error, PutOutcome outcome) {
                      answered.set_value({error == nullptr, outcome});
                    });
    async_answer = answer_of(answered.get_future());
  }
  CHECK(async_answer == std::make_pair(true, PutOutcome::full));
  CHECK_FALSE(store.failure());
  CHECK(store.get("big-0").has_value());
  // Redis 7 lets the other calls past maxmemory: the accepted job is acknowledged and its
  // callback moves on.
  const rebound::JobOutcome done{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  CHECK(store.finish_job("accepted", "worker", done, Lease{"cb", now + 60s}, now));
  rebound::CallbackInfo delivered;
  delivered.state = rebound::CallbackState::delivered;
  delivered.attempts = 1;
  CHECK(store.record_attempt("accepted", "cb", delivered, now));
  CHECK(store.get("accepted")->callback.state == rebound::CallbackState::delivered);
}

namespace {
// Makes `job` (with a callback URL) a dead letter at `now`: stored, run, its callback given up.
// Puts `job` (of its tenant) and gives its callback up, as a JobQueue would.
void give_up_callback(RedisJobStore& store, const Job& job,
                      std::chrono::system_clock::time_point now) {
  const std::string key = rebound::key_of(job);
  REQUIRE(store.put(job, Lease{"w", now + 60s}) == PutOutcome::created);
  const rebound::JobOutcome done{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  REQUIRE(store.finish_job(key, "w", done, Lease{"cb", now + 60s}, now));
  rebound::CallbackInfo given_up;
  given_up.state = rebound::CallbackState::failed;
  given_up.attempts = 3;
  REQUIRE(store.record_attempt(key, "cb", given_up, now));
}
}  // namespace

TEST_CASE("redis: a put waits for Redis on no caller's thread - the batch thread answers it") {
  rebound::test::RedisServer server;
  RedisJobStoreOptions o = options_for(server);
  o.command_timeout = 30s;  // the pause below must not time the put out (nor a connect)
  o.connect_timeout = 30s;
  RedisJobStore store(o);
  CHECK(store.answer_thread(rebound::JobStore::AsyncCall::put, false) ==
        rebound::JobStore::AnswerThread::store);
  REQUIRE(store.put(make("warm")) == PutOutcome::created);
  using PutAnswer = std::pair<bool, PutOutcome>;
  auto put_async = [&](const Job& job) {
    auto promise = std::make_shared<std::promise<PutAnswer>>();
    auto answer = promise->get_future();
    store.async_put(job, std::nullopt, [promise](std::exception_ptr error, PutOutcome outcome) {
      promise->set_value({error == nullptr, outcome});
    });
    return answer;
  };
  server.pause();
  // The call returns at once, Redis frozen; its answer waits for Redis.
  auto returned = std::async(std::launch::async, [&] { return put_async(make("a")); });
  const bool returned_in_time = returned.wait_for(5s) == std::future_status::ready;
  std::this_thread::sleep_for(50ms);
  server.resume();
  REQUIRE(returned_in_time);
  CHECK(answer_of(returned.get()) == PutAnswer{true, PutOutcome::created});
  // The same request written differently (1 and 1.0) is a duplicate; another is a conflict.
  CHECK(answer_of(put_async(make("a", {{"x", 1.0}}))) == PutAnswer{true, PutOutcome::duplicate});
  CHECK(answer_of(put_async(make("a", {{"x", 2}}))) == PutAnswer{true, PutOutcome::conflict});
  CHECK(store.get("a").has_value());
}

TEST_CASE("redis: a submission on the queue's io thread does not wait for Redis") {
  rebound::test::RedisServer server;
  RedisJobStoreOptions store_options = options_for(server);
  store_options.command_timeout = 30s;
  store_options.connect_timeout = 30s;
  // (Before the queue: its io thread may still set them when a check below fails.)
  std::promise<boost::system::error_code> accepted;
  std::promise<std::pair<boost::system::error_code, rebound::JobRecord>> ended;
  std::promise<void> returned;
  rebound::JobQueueOptions o;
  o.workers = 1;
  rebound::JobQueue queue(std::make_unique<rebound::EchoModel>(),
                          std::make_unique<RedisJobStore>(store_options), o);
  REQUIRE(rebound::test::submitted(queue, Job{"warm", "", {{"x", 0}}, {}}) == "accepted");
  server.pause();
  // Both forms of a submission, started on the io thread (a coroutine's, a handler's): each call
  // returns while Redis is frozen, and each answers once Redis does.
  boost::asio::post(queue.get_executor(), [&] {
    queue.submit(
        Job{"a", "", {{"x", 1}}, {}},
        [&](boost::system::error_code ec, const rebound::Submitted&) { accepted.set_value(ec); });
    queue.async_submit(Job{"b", "", {{"x", 2}}, {}},
                       [&](boost::system::error_code ec, rebound::JobRecord r) {
                         ended.set_value({ec, std::move(r)});
                       });
    returned.set_value();
  });
  const bool returned_in_time = returned.get_future().wait_for(5s) == std::future_status::ready;
  auto accepted_answer = accepted.get_future();
  auto ended_answer = ended.get_future();
  const bool answered_early = accepted_answer.wait_for(50ms) == std::future_status::ready;
  server.resume();
  REQUIRE(returned_in_time);
  CHECK_FALSE(answered_early);  // (the answer waits for Redis: there is a round trip)
  CHECK_FALSE(answer_of(std::move(accepted_answer)));
  auto [ec, record] = answer_of(std::move(ended_answer));
  CHECK_FALSE(ec);
  CHECK(record.status == JobStatus::succeeded);
  CHECK(record.outcome.result == nlohmann::json{{"x", 2}});
  // The same request again completes with the first one's end, never run twice.
  auto again = queue.async_submit(Job{"b", "", {{"x", 2}}, {}}, boost::asio::use_future);
  CHECK(answer_of(std::move(again)).outcome.result == nlohmann::json{{"x", 2}});
}

TEST_CASE("redis: a wait and a full queue's look-up on the io thread do not wait for Redis") {
  rebound::test::RedisServer server;
  RedisJobStoreOptions store_options = options_for(server);
  store_options.command_timeout = 30s;
  store_options.connect_timeout = 30s;
  using Answer = std::pair<boost::system::error_code, rebound::Submitted>;
  // (Before the queue: its io thread may still set them when a check below fails.)
  std::promise<Answer> again, other;
  std::promise<std::future<rebound::JobRecord>> waited;
  std::promise<void> returned;
  rebound::JobQueueOptions o;
  o.workers = 1;
  o.queue_capacity = 1;
  auto model = std::make_unique<rebound::test::HeldModel>();
  auto* held = model.get();
  rebound::JobQueue queue(std::move(model), std::make_unique<RedisJobStore>(store_options), o);
  struct Open {
    rebound::test::HeldModel* model;
    ~Open() { model->open(); }  // (also when a check below fails: the queue's end waits for it)
  } open_at_end{held};
  REQUIRE(rebound::test::submitted(queue, Job{"running", "", {{"x", 1}}, {}}) == "accepted");
  REQUIRE(held->wait_started(1));  // it holds the queue's one slot
  server.pause();
  // On the io thread: a wait, and two submissions refused for room, whose ids are looked up in
  // the store (a resubmission is a duplicate, not queue_full). Each call returns while Redis is
  // frozen; the answers come once Redis does.
  boost::asio::post(queue.get_executor(), [&] {
    waited.set_value(queue.async_wait("running", boost::asio::use_future));
    queue.submit(Job{"running", "", {{"x", 1}}, {}},
                 [&](boost::system::error_code ec, const rebound::Submitted& s) {
                   again.set_value({ec, s});
                 });
    queue.submit(Job{"other", "", {{"x", 2}}, {}},
                 [&](boost::system::error_code ec, const rebound::Submitted& s) {
                   other.set_value({ec, s});
                 });
    returned.set_value();
  });
  const bool returned_in_time = returned.get_future().wait_for(5s) == std::future_status::ready;
  auto again_answer = again.get_future();
  const bool answered_early = again_answer.wait_for(50ms) == std::future_status::ready;
  server.resume();
  REQUIRE(returned_in_time);
  CHECK_FALSE(answered_early);  // (the look-up waits for Redis)
  const Answer resubmitted = answer_of(std::move(again_answer));
  CHECK_FALSE(resubmitted.first);
  CHECK(resubmitted.second.duplicate);
  CHECK(answer_of(other.get_future()).first == rebound::errc::queue_full);
  held->open();
  auto ended = answer_of(waited.get_future());
  CHECK(answer_of(std::move(ended)).outcome.result == nlohmann::json{{"echo", {{"x", 1}}}});
}

TEST_CASE("redis: a dead letter that expired is not listed again when its id is reused") {
  rebound::test::RedisServer server;
  auto options = options_for(server);
  options.retention = 1s;
  RedisJobStore store(options);
  give_up_callback(store, make("reused"), std::chrono::system_clock::now());
  REQUIRE(store.list_failed_callbacks(10).size() == 1);
  REQUIRE(eventually([&] { return !store.get("reused").has_value(); }, 5000ms));
  REQUIRE(store.put(make("reused")) == PutOutcome::created);
  CHECK(store.list_failed_callbacks(10).empty());
  CHECK(store.get("reused")->status == JobStatus::queued);
}

TEST_CASE("redis: a key prefix with ':' is refused - prefixes must not overlap") {
  rebound::test::RedisServer server;
  auto options = options_for(server);
  options.key_prefix = "a:job";
  CHECK_THROWS_AS(RedisJobStore{options}, rebound::Error);
}

TEST_CASE("redis: finished jobs expire after the retention - unfinished ones never") {
  rebound::test::RedisServer server;
  auto options = options_for(server);
  options.retention = 1s;
  RedisJobStore store(options);
  REQUIRE(store.put(make("done")) == PutOutcome::created);
  REQUIRE(store.put(make("waiting")) == PutOutcome::created);
  const auto now = std::chrono::system_clock::now();
  auto claimed = store.claim_jobs(10, Lease{"h", now + 60s}, now);
  REQUIRE(claimed.size() == 2);
  // A job without a callback is finished by its acknowledgement; with one, by its delivery.
  const rebound::JobOutcome done{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  REQUIRE(store.finish_job("done", "h", done, Lease{"d", now + 60s}, now));
  rebound::CallbackInfo delivered;
  delivered.state = rebound::CallbackState::delivered;
  delivered.attempts = 1;
  REQUIRE(store.record_attempt("done", "d", delivered, now));
  CHECK(eventually([&] { return !store.get("done").has_value(); }, 5000ms));
  CHECK(store.get("waiting").has_value());
  CHECK(store.list_unfinished(10).size() == 1);
}

TEST_CASE("redis: pauses are kept in the store - every server holds them") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  CHECK(store.paused_origins() == std::vector<std::string>{});
  store.set_origin_paused("https://b.example:443", true);
  store.set_origin_paused("http://a.example:80", true);
  store.set_origin_paused("http://a.example:80", true);
  CHECK(store.paused_origins() ==
        std::vector<std::string>{"http://a.example:80", "https://b.example:443"});
  store.set_origin_paused("https://b.example:443", false);
  CHECK(store.paused_origins() == std::vector<std::string>{"http://a.example:80"});

  // Two servers on this Redis: a pause made through one holds on the other, and so does the
  // resume made through that one.
  auto queue = [&](const char* id) {
    rebound::JobQueueOptions o;
    o.server_id = id;
    o.poll_interval = 50ms;
    return std::make_unique<rebound::JobQueue>(std::make_unique<rebound::EchoModel>(),
                                               std::make_unique<RedisJobStore>(options_for(server)),
                                               o);
  };
  auto one = queue("one"), two = queue("two");
  CHECK(one->operations().pause_origin("https://hooks.example/x") == "https://hooks.example:443");
  CHECK(eventually(
      [&] {
        const auto paused = two->operations().paused_origins();
        return std::find(paused.begin(), paused.end(), "https://hooks.example:443") != paused.end();
      },
      5000ms));
  CHECK(two->operations().resume_origin("https://hooks.example"));
  CHECK(eventually(
      [&] {
        const auto paused = one->operations().paused_origins();
        return std::find(paused.begin(), paused.end(), "https://hooks.example:443") == paused.end();
      },
      5000ms));
  CHECK(store.paused_origins() == std::vector<std::string>{"http://a.example:80"});
  // The origins another writer left in the store hold here as well.
  CHECK(eventually(
      [&] {
        const auto paused = one->operations().paused_origins();
        return std::find(paused.begin(), paused.end(), "http://a.example:80") != paused.end();
      },
      5000ms));
}

namespace {
// What redis-cli answers to one command against `server` (its first line).
std::string redis_cli(const rebound::test::RedisServer& server, const std::string& command) {
  const std::string line =
      "redis-cli -p " + std::to_string(server.port()) + " " + command + " 2>/dev/null";
  std::string out;
  if (FILE* pipe = ::popen(line.c_str(), "r")) {
    char buffer[256];
    if (std::fgets(buffer, sizeof buffer, pipe)) out = buffer;
    ::pclose(pipe);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r'))
    out.pop_back();
  return out;
}

std::vector<std::string> listed(const RedisJobStore& store) {
  std::vector<std::string> ids;
  for (const auto& r : store.list_jobs({}, std::nullopt, 100).jobs)
    ids.push_back(r.job.id);
  return ids;
}
}  // namespace

TEST_CASE("redis: every job is listed however old - expired ones leave the listing's set") {
  rebound::test::RedisServer server;
  auto options = options_for(server);
  options.retention = 1s;
  RedisJobStore store(options);
  const auto now = std::chrono::floor<std::chrono::milliseconds>(std::chrono::system_clock::now());
  // Created an hour ago: one never finished, one finished just now (its retention runs from now).
  REQUIRE(store.put(Job{"old", "", 1, now - 1h}) == PutOutcome::created);
  REQUIRE(store.put(Job{"done", "", 1, now - 1h + 1ms}) == PutOutcome::created);
  REQUIRE(store.put(Job{"recent", "", 1, now - 1h + 2ms}) == PutOutcome::created);
  store.complete("recent", {JobStatus::succeeded, 1, std::nullopt});
  REQUIRE(store.put(Job{"new-0", "", 1, now}) == PutOutcome::created);
  CHECK(listed(store) == std::vector<std::string>{"new-0", "recent", "done", "old"});
  store.complete("done", {JobStatus::succeeded, 1, std::nullopt});
  REQUIRE(eventually([&] { return !store.get("done").has_value(); }, 5000ms));
  // Puts sweep the set: the expired member leaves, the living ones stay, however old.
  for (int i = 1; i < 10; ++i)
    REQUIRE(store.put(Job{"new-" + std::to_string(i), "", 1, now + std::chrono::milliseconds(i)}) ==
            PutOutcome::created);
  const auto ids = listed(store);
  REQUIRE(ids.size() == 11);
  CHECK(ids.back() == "old");
  CHECK(std::find(ids.begin(), ids.end(), "done") == ids.end());
  CHECK(std::find(ids.begin(), ids.end(), "recent") == ids.end());  // expired too
  CHECK(redis_cli(server, "ZCARD {rebound}:jobs") == "11");
}

TEST_CASE("redis: a dead letter that expired leaves the count of failed callbacks") {
  rebound::test::RedisServer server;
  auto options = options_for(server);
  options.retention = 1s;
  RedisJobStore store(options);
  const auto now = std::chrono::floor<std::chrono::milliseconds>(std::chrono::system_clock::now());
  give_up_callback(store, Job{"dead", "http://receiver.test/cb", 1, now - 1h}, now);
  CHECK(store.queue_stats()->callbacks_failed == 1);
  REQUIRE(eventually([&] { return !store.get("dead").has_value(); }, 5000ms));
  SUBCASE("at the puts' sweep of the listing") {
    for (int i = 0; i < 3; ++i)
      REQUIRE(store.put(Job{"new-" + std::to_string(i), "", 1, now}) == PutOutcome::created);
  }
  SUBCASE("at a server's report - a quiet store") {
    // No put after it: the servers' reports (every third of a lease) sweep too, so the count (and
    // an alert on it) falls back by itself. A read of the servers sweeps nothing.
    CHECK(store.servers(now).empty());
    CHECK(store.queue_stats()->callbacks_failed == 1);
    store.report_server("server-a", 0, now);
    CHECK(redis_cli(server, "ZCARD {rebound}:jobs") == "0");
  }
  // /metrics' rebound_callbacks_failed falls back.
  CHECK(store.queue_stats()->callbacks_failed == 0);
  CHECK(redis_cli(server, "ZCARD {rebound}:callbacks:failed") == "0");
}

TEST_CASE("redis: a store written before the listing's set gets it from its unfinished jobs") {
  rebound::test::RedisServer server;
  {
    RedisJobStore store(options_for(server));
    REQUIRE(store.put(make("waiting")) == PutOutcome::created);
  }
  REQUIRE(redis_cli(server, "DEL {rebound}:jobs") == "1");  // as an older rebound left it
  RedisJobStore store(options_for(server));
  CHECK(listed(store) == std::vector<std::string>{"waiting"});
}

TEST_CASE(
    "redis: a tenant's job an older server filed among everyone's is claimed - then filed "
    "as its tenant's") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  const auto now = std::chrono::floor<std::chrono::milliseconds>(std::chrono::system_clock::now());
  Job old = make("7");
  old.tenant = "acme";
  old.created_at = now - 1h;
  REQUIRE(store.put(old) == PutOutcome::created);
  Job plain = make("plain");
  plain.created_at = now;
  REQUIRE(store.put(plain) == PutOutcome::created);
  CHECK(redis_cli(server, "SMEMBERS {rebound}:jobs:due-tenants") == "acme");
  CHECK(redis_cli(server, "ZCARD {rebound}:jobs:due-of:acme") == "1");
  // An older server filed every tenant's jobs in one set: moved there, as it would have been.
  const std::string score = redis_cli(server, "ZSCORE {rebound}:jobs:due-of:acme acme/7");
  REQUIRE(redis_cli(server, "ZADD {rebound}:jobs:due " + score + " acme/7") == "1");
  REQUIRE(redis_cli(server, "DEL {rebound}:jobs:due-of:acme") == "1");
  CHECK(store.queue_stats()->queued == 2);
  // Claimed in the default tenant's set, where it is found (it is the oldest there), and filed
  // under its tenant's from then on.
  const auto claimed = store.claim_jobs(1, {"s/1", now + 30s}, now);
  REQUIRE(claimed.size() == 1);
  CHECK(rebound::key_of(claimed[0].job) == "acme/7");
  CHECK(redis_cli(server, "ZSCORE {rebound}:jobs:due acme/7").empty());
  CHECK_FALSE(redis_cli(server, "ZSCORE {rebound}:jobs:due-of:acme acme/7").empty());
  CHECK(store.renew("acme/7", {"s/1", now + 60s}, now + 1s));
  // Its lease holds where it is filed now: nobody else claims it before the lease ends.
  CHECK(rebound::key_of(store.claim_jobs(5, {"s/2", now + 90s}, now + 40s).at(0).job) == "plain");
  CHECK(store.claim_jobs(5, {"s/2", now + 90s}, now + 40s).empty());
  // An acknowledgement takes it out of both sets (an older server's entry would be in the first).
  REQUIRE(redis_cli(server, "ZADD {rebound}:jobs:due " + score + " acme/7") == "1");
  CHECK(store.finish_job("acme/7", "s/1", {JobStatus::succeeded, 1, std::nullopt}, std::nullopt,
                         now + 41s));
  CHECK(redis_cli(server, "ZSCORE {rebound}:jobs:due acme/7").empty());
  CHECK(redis_cli(server, "ZSCORE {rebound}:jobs:due-of:acme acme/7").empty());
  CHECK(store.claim_jobs(5, {"s/3", now + 300s}, now + 200s).size() == 1);  // plain's lease ended
  // A tenant whose set emptied leaves the tenants named (a put names it again).
  CHECK(redis_cli(server, "SMEMBERS {rebound}:jobs:due-tenants").empty());
}

TEST_CASE(
    "redis: a paused origin holds from a server's start - as the gate names it - up to a cap") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  store.set_origin_paused("https://hooks.example:443", true);
  // Written in another form by something else (redis-cli): held as the gate names it, not toggled.
  REQUIRE(redis_cli(server, "SADD {rebound}:paused https://Other.example") == "1");
  REQUIRE(redis_cli(server, "SADD {rebound}:paused not-an-origin") == "1");
  rebound::JobQueueOptions o;
  o.server_id = "fresh";
  auto clock = std::make_shared<rebound::test::FakeClock>();
  o.clock = rebound::test::clock_of(clock);
  rebound::JobQueue queue(std::make_unique<rebound::EchoModel>(),
                          std::make_unique<RedisJobStore>(options_for(server)), o);
  // Before anything was claimed or sent: the constructor read them.
  CHECK(queue.operations().paused_origins() ==
        std::vector<std::string>{"https://hooks.example:443", "https://other.example:443"});
  // Pauses are synced at most once a second (of the queue's clock): past that bound, a whole
  // pass of the pump syncs them. Nothing flaps.
  clock->advance(1100ms);
  REQUIRE(rebound::test::pump_pass(queue));
  CHECK(queue.operations().paused_origins() ==
        std::vector<std::string>{"https://hooks.example:443", "https://other.example:443"});

  // At most 10,000 are kept: one more is refused, not taken for a failing store.
  REQUIRE(redis_cli(server,
                    "EVAL \"for i = 1, 10000 do redis.call('SADD', KEYS[1], "
                    "'http://h' .. i .. '.test:80') end return 1\" 1 {rebound}:paused") == "1");
  CHECK_FALSE(store.set_origin_paused("http://one-more.test:80", true));
  CHECK(store.set_origin_paused("https://hooks.example:443", true));  // already kept: fine
  CHECK_THROWS_AS(queue.operations().pause_origin("http://one-more.test"), rebound::Error);
  CHECK_FALSE(queue.telemetry().store_failure().has_value());
  // 10,003 kept (the three above too): room again once four go.
  for (const char* origin : {"http://h1.test:80", "http://h2.test:80", "http://h3.test:80"})
    CHECK(store.set_origin_paused(origin, false));
  CHECK_FALSE(store.set_origin_paused("http://one-more.test:80", true));
  CHECK(store.set_origin_paused("http://h4.test:80", false));
  CHECK(store.set_origin_paused("http://one-more.test:80", true));
}

namespace {
// How often Redis ran `command` (INFO commandstats; a script's commands count too).
long long calls_of(const rebound::test::RedisServer& server, const std::string& command) {
  const std::string line =
      "redis-cli -p " + std::to_string(server.port()) + " INFO commandstats 2>/dev/null";
  long long calls = 0;
  if (FILE* pipe = ::popen(line.c_str(), "r")) {
    char buffer[512];
    while (std::fgets(buffer, sizeof buffer, pipe)) {
      const std::string text(buffer);
      const std::string key = "cmdstat_" + command + ":calls=";
      if (text.rfind(key, 0) == 0) calls = std::stoll(text.substr(key.size()));
    }
    ::pclose(pipe);
  }
  return calls;
}

// The scripts Redis has run.
long long scripts_run(const rebound::test::RedisServer& server) {
  return calls_of(server, "evalsha");
}

// What an asynchronous write answers: (worked, answer), or nullopt when it did not end in time.
using Answer = std::future<std::pair<bool, bool>>;
rebound::JobStore::WriteDone into(std::shared_ptr<std::promise<std::pair<bool, bool>>> promise) {
  return [promise](std::exception_ptr error, bool answer) {
    promise->set_value({error == nullptr, answer});
  };
}

// A write's `done`, whose answer comes to the last future in `answers`.
rebound::JobStore::WriteDone into(std::vector<Answer>& answers) {
  auto promise = std::make_shared<std::promise<std::pair<bool, bool>>>();
  answers.push_back(promise->get_future());
  return into(promise);
}

// The same for an acknowledgement (async_finish_job): (worked, held).
rebound::JobStore::FinishDone finished_into(
    std::shared_ptr<std::promise<std::pair<bool, bool>>> promise) {
  return [promise](std::exception_ptr error, rebound::JobStore::FinishAnswer answer) {
    promise->set_value({error == nullptr, answer.held});
  };
}
rebound::JobStore::FinishDone finished_into(std::vector<Answer>& answers) {
  auto promise = std::make_shared<std::promise<std::pair<bool, bool>>>();
  answers.push_back(promise->get_future());
  return finished_into(promise);
}
}  // namespace

TEST_CASE("redis: writes of many callers share round trips - each caller gets its own answer") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  const auto now = std::chrono::system_clock::now();
  const Lease worker{"worker", now + 60s};
  // 16 threads put 50 jobs each at once; each id is put twice (once changed): every caller hears
  // what happened to its own job, whatever else went in the same call.
  std::vector<std::thread> threads;
  std::atomic<int> created{0}, duplicates{0}, conflicts{0}, wrong{0};
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const std::string id = "job-" + std::to_string(t % 8) + "-" + std::to_string(i);
        const PutOutcome outcome = store.put(make(id, {{"x", t < 8 ? 1 : 2}}), worker);
        if (outcome == PutOutcome::created) ++created;
        if (outcome == PutOutcome::duplicate) ++duplicates;
        if (outcome == PutOutcome::conflict) ++conflicts;
        if (outcome == PutOutcome::full) ++wrong;
      }
    });
  }
  for (auto& t : threads)
    t.join();
  CHECK(created == 400);
  CHECK(duplicates + conflicts == 400);
  CHECK(conflicts == 400 - duplicates);
  CHECK(wrong == 0);

  // 400 acknowledgements started at once from one thread, half of them by a stranger: they go out
  // in a few calls, and each hears its own answer.
  REQUIRE(redis_cli(server, "CONFIG RESETSTAT") == "OK");
  std::vector<Answer> answers;
  const rebound::JobOutcome done{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  for (int t = 0; t < 8; ++t) {
    for (int i = 0; i < 50; ++i) {
      store.async_finish_job("job-" + std::to_string(t) + "-" + std::to_string(i),
                             i % 2 == 0 ? "worker" : "stranger", done, std::nullopt, now, false,
                             finished_into(answers));
    }
  }
  for (std::size_t n = 0; n < answers.size(); ++n) {
    REQUIRE(answers[n].wait_for(10s) == std::future_status::ready);
    CHECK(answers[n].get() == std::pair<bool, bool>{true, n % 2 == 0});
  }
  const long long calls = scripts_run(server);
  CHECK(calls >= 2);  // at most 256 in one
  MESSAGE("400 acknowledgements in " << calls << " calls");
  CHECK(calls <= 200);  // not one each
  CHECK(store.get("job-3-10")->status == JobStatus::succeeded);
  CHECK(store.get("job-3-11")->status == JobStatus::queued);

  // renew_all: one answer per lease, in order, in a few calls too.
  std::vector<std::pair<std::string, Lease>> leases;
  for (int i = 0; i < 50; ++i)
    leases.emplace_back("job-5-" + std::to_string(i), Lease{"worker", now + 120s});
  REQUIRE(redis_cli(server, "CONFIG RESETSTAT") == "OK");
  const auto renewed = store.renew_all(leases, now);
  REQUIRE(renewed.size() == 50);
  for (int i = 0; i < 50; ++i)
    CHECK(renewed[i] == (i % 2 == 1));  // the ones finished above are not held any more
  CHECK(scripts_run(server) <= 10);
}

TEST_CASE("redis: a Redis that hangs under a batch fails every call in it - none waits forever") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));  // commands time out after 1.5 s
  const auto now = std::chrono::system_clock::now();
  for (int i = 0; i < 20; ++i)
    REQUIRE(store.put(make("held-" + std::to_string(i)), Lease{"worker", now + 60s}) ==
            PutOutcome::created);
  server.pause();
  const auto started = std::chrono::steady_clock::now();
  std::vector<Answer> answers;
  const rebound::JobOutcome done{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  for (int i = 0; i < 20; ++i) {
    store.async_finish_job("held-" + std::to_string(i), "worker", done, std::nullopt, now, false,
                           finished_into(answers));
  }
  auto put = std::async(std::launch::async, [&] { return store.put(make("during")); });
  for (auto& answer : answers) {
    REQUIRE(answer.wait_for(10s) == std::future_status::ready);
    CHECK(answer.get().first == false);  // failed: the JobQueue writes it again later
  }
  REQUIRE(put.wait_for(10s) == std::future_status::ready);
  // Failed behind the batch, with the reason the batch failed for (never an empty message).
  CHECK_THROWS_WITH_AS(put.get(), doctest::Contains("redis job store"), rebound::StoreUnavailable);
  CHECK(std::chrono::steady_clock::now() - started < 5s);
  CHECK(store.failure().has_value());

  server.resume();
  CHECK(eventually([&] { return !store.failure(); }));
  // A write whose answer timed out may still have reached Redis (it ran when Redis woke up), as
  // with any timeout: written again, it is acknowledged if it had not, refused if it had.
  const bool applied = store.get("held-0")->status == JobStatus::succeeded;
  CHECK(store.finish_job("held-0", "worker", done, std::nullopt, now) == !applied);
  CHECK(store.get("held-0")->status == JobStatus::succeeded);
}

TEST_CASE("redis: scripts Redis forgot are loaded again - a batch after SCRIPT FLUSH works") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  const auto now = std::chrono::system_clock::now();
  REQUIRE(store.put(make("before"), Lease{"worker", now + 60s}) == PutOutcome::created);
  REQUIRE(redis_cli(server, "SCRIPT FLUSH") == "OK");
  CHECK(store.put(make("after"), Lease{"worker", now + 60s}) == PutOutcome::created);
  REQUIRE(redis_cli(server, "SCRIPT FLUSH") == "OK");
  const rebound::JobOutcome done{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  CHECK(store.finish_job("before", "worker", done, std::nullopt, now));
  CHECK(store.get("before")->status == JobStatus::succeeded);
  CHECK_FALSE(store.failure().has_value());
}

TEST_CASE("redis: mark_running is not waited for - yet it is sent before the store closes") {
  rebound::test::RedisServer server;
  const auto now = std::chrono::system_clock::now();
  {
    RedisJobStore store(options_for(server));
    for (int i = 0; i < 100; ++i)
      REQUIRE(store.put(make("job-" + std::to_string(i))) == PutOutcome::created);
    for (int i = 0; i < 100; ++i)
      store.mark_running("job-" + std::to_string(i), now);
  }  // destroyed at once: what was queued goes out first
  RedisJobStore other(options_for(server));
  for (int i = 0; i < 100; ++i)
    CHECK(other.get("job-" + std::to_string(i))->status == JobStatus::running);
  // A store made after another on this thread (perhaps where the other lived) does not wait for
  // the other's unwaited writes.
  for (int round = 0; round < 20; ++round) {
    auto store = std::make_unique<RedisJobStore>(options_for(server));
    store->mark_running("job-0", now);
    CHECK(store->get("job-0")->status == JobStatus::running);
  }
}

namespace {
// A stand-in for Redis that speaks enough RESP for a store to start, then answers the batched
// scripts as told: the first one after `delay`, the later ones with LOADING (as a Redis that
// restarts and reads its append-only file answers) while `loading`. Every connection is served
// on a thread of its own.
class ScriptedRedis {
 public:
  // `script_answer`: when not empty, every script call past the start's is answered this (set
  // before any thread starts: the threads read it unguarded).
  explicit ScriptedRedis(std::string script_answer = {})
      : script_answer_(std::move(script_answer)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t size = sizeof addr;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &size);
    port_ = ntohs(addr.sin_port);
    REQUIRE(::listen(listener_, 16) == 0);
    acceptor_ = std::thread([this] {
      for (;;) {
        const int fd = ::accept(listener_, nullptr, nullptr);
        if (fd < 0) return;
        std::lock_guard<std::mutex> lock(mutex_);
        fds_.push_back(fd);
        threads_.emplace_back([this, fd] { serve(fd); });
      }
    });
  }
  ~ScriptedRedis() {
    ::shutdown(listener_, SHUT_RDWR);
    ::close(listener_);
    acceptor_.join();
    std::lock_guard<std::mutex> lock(mutex_);
    for (int fd : fds_)
      ::shutdown(fd, SHUT_RDWR);
    for (auto& t : threads_)
      t.join();
    for (int fd : fds_)
      ::close(fd);
  }
  int port() const { return port_; }

  std::chrono::milliseconds delay{0};
  std::atomic<bool> loading{true};
  std::atomic<int> batches{0};

 private:
  void serve(int fd) {
    std::string in;
    char buffer[65536];
    for (;;) {
      std::vector<std::string> args;
      while (!parse(in, args)) {
        const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
        if (n <= 0) return;
        in.append(buffer, static_cast<std::size_t>(n));
      }
      const std::string out = answer(args) + "\r\n";
      if (::send(fd, out.data(), out.size(), MSG_NOSIGNAL) < 0) return;
    }
  }

  // One command off the front of `in`, when it is all there.
  static bool parse(std::string& in, std::vector<std::string>& args) {
    std::size_t at = 0;
    auto line = [&](std::string& out) {
      const auto end = in.find("\r\n", at);
      if (end == std::string::npos) return false;
      out = in.substr(at, end - at);
      at = end + 2;
      return true;
    };
    std::string head;
    if (!line(head) || head.empty() || head[0] != '*') return false;
    const int count = std::stoi(head.substr(1));
    std::vector<std::string> out;
    for (int i = 0; i < count; ++i) {
      std::string size;
      if (!line(size)) return false;
      const auto length = static_cast<std::size_t>(std::stoul(size.substr(1)));
      if (in.size() < at + length + 2) return false;
      out.push_back(in.substr(at, length));
      at += length + 2;
    }
    in.erase(0, at);
    args = std::move(out);
    return true;
  }

  std::string answer(const std::vector<std::string>& args) {
    auto bulk = [](const std::string& s) { return "$" + std::to_string(s.size()) + "\r\n" + s; };
    if (args[0] == "INFO") return bulk("redis_version:7.0.15");
    if (args[0] == "CONFIG")
      return "*2\r\n" + bulk("maxmemory-policy") + "\r\n" + bulk("noeviction");
    if (args[0] == "SCRIPT") return bulk(std::string(40, 'a'));
    if (args[0] == "EXISTS") return ":0";  // no queue under the old default prefix
    // EVALSHA sha 1 <prefix>:jobs <prefix> (the call's arguments).
    if (args[0] != "EVALSHA" || args.size() <= 5) return ":1";  // the index script
    if (args.size() == 7 && args[5] == "0" && args[6].empty())
      return "*1\r\n:-1";  // the tenants migration's first call: nothing to do
    if (!script_answer_.empty()) return script_answer_;
    // A batch: (op, count, args...) after the prefix; a put (op 0) answers {0}, the rest 1.
    if (batches++ > 0) {
      if (loading) return "-LOADING Redis is loading the dataset in memory";
    } else {
      std::this_thread::sleep_for(delay);
    }
    std::string out;
    int ops = 0;
    for (std::size_t i = 5; i + 1 < args.size(); i += 2 + std::stoul(args[i + 1])) {
      out += args[i] == "0" ? "*1\r\n:0\r\n" : ":1\r\n";
      ++ops;
    }
    return "*" + std::to_string(ops) + "\r\n" + out.substr(0, out.size() - 2);
  }

  const std::string script_answer_;
  int listener_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::mutex mutex_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
};
}  // namespace

TEST_CASE(
    "redis: cancel and redeliver answered with something not a number fail - never 'not found'") {
  ScriptedRedis redis("$2\r\nno");  // a string where the scripts answer a number
  RedisJobStoreOptions options;
  options.port = redis.port();
  options.command_timeout = 2000ms;
  options.batch_writes = false;
  RedisJobStore store(options);
  const auto now = std::chrono::system_clock::now();
  const rebound::JobOutcome cancelled{JobStatus::cancelled, nullptr,
                                      rebound::ErrorInfo{"cancelled", "by a test"}};
  CHECK_THROWS_WITH_AS(store.cancel("a", cancelled, now),
                       doctest::Contains("unexpected answer to cancel"), rebound::StoreUnavailable);
  CHECK_THROWS_WITH_AS(store.redeliver("a", Lease{"operator", now + 30s}, now),
                       doctest::Contains("unexpected answer to redeliver"),
                       rebound::StoreUnavailable);
}

TEST_CASE("redis: a Redis that answers LOADING to a batch fails its calls - no crash and no hang") {
  ScriptedRedis redis;
  redis.delay = 1000ms;
  RedisJobStoreOptions options;
  options.port = redis.port();
  options.command_timeout = 2000ms;
  RedisJobStore store(options);
  const auto now = std::chrono::system_clock::now();
  const rebound::JobOutcome done{JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  // The first batch is answered late; meanwhile a put and an acknowledgement gather into the
  // next, whose first answer (the puts') is LOADING: the connection is dropped, and the
  // acknowledgements' answer is never read from it.
  auto first = std::make_shared<std::promise<std::pair<bool, bool>>>();
  Answer first_answer = first->get_future();
  store.async_finish_job("a", "worker", done, std::nullopt, now, false, finished_into(first));
  // Its batch reached Redis (whose answer then waits out the delay): what comes next gathers.
  const auto sent_by = std::chrono::steady_clock::now() + 5s;
  while (redis.batches.load() == 0 && std::chrono::steady_clock::now() < sent_by)
    std::this_thread::sleep_for(1ms);
  REQUIRE(redis.batches.load() == 1);
  auto put = std::async(std::launch::async, [&] { return store.put(make("b")); });
  auto second = std::make_shared<std::promise<std::pair<bool, bool>>>();
  Answer second_answer = second->get_future();
  store.async_finish_job("c", "worker", done, std::nullopt, now, false, finished_into(second));
  REQUIRE(first_answer.wait_for(5s) == std::future_status::ready);
  CHECK(first_answer.get() == std::pair<bool, bool>{true, true});
  REQUIRE(put.wait_for(5s) == std::future_status::ready);
  CHECK_THROWS_AS(put.get(), rebound::StoreUnavailable);
  REQUIRE(second_answer.wait_for(5s) == std::future_status::ready);
  CHECK(second_answer.get().first == false);
  // Redis is back: the next batch goes out on a new connection. (A put queued while the failed
  // batch was still being answered fails with it, as what waits behind a failed batch does: the
  // first that goes out after it is created.)
  redis.loading = false;
  CHECK(eventually([&] {
    try {
      return store.put(make("d")) == PutOutcome::created;
    } catch (const rebound::StoreUnavailable&) {
      return false;
    }
  }));
}

TEST_CASE("redis: a JobQueue destroyed with acknowledgements in flight ends cleanly") {
  rebound::test::RedisServer server;
  std::vector<std::string> ids;
  for (int round = 0; round < 3; ++round) {
    rebound::JobQueueOptions o;
    o.drain_on_destroy = 0ms;
    o.workers = 2;
    rebound::JobQueue queue(std::make_unique<rebound::EchoModel>(),
                            std::make_unique<RedisJobStore>(options_for(server)), o);
    for (int i = 0; i < 300; ++i) {
      ids.push_back("r" + std::to_string(round) + "-" + std::to_string(i));
      Job job{ids.back(), "", {{"x", i}}, std::chrono::system_clock::now()};
      REQUIRE(rebound::test::submitted(queue, job) == "accepted");
    }
    // Destroyed at once: the workers' acknowledgements are still queued for Redis, and their
    // answers come back after the queue's io thread has stopped.
  }
  // Nothing accepted was lost: each job is finished, or waits with a lease that runs out.
  RedisJobStore store(options_for(server));
  int finished = 0;
  for (const auto& id : ids) {
    const auto record = store.get(id);
    REQUIRE(record.has_value());
    if (record->status == JobStatus::succeeded) ++finished;
  }
  CHECK(finished > 0);
}

TEST_CASE("redis: a job marked running and finished in one batch is marked by its finish") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  const auto now = std::chrono::floor<std::chrono::milliseconds>(std::chrono::system_clock::now());
  REQUIRE(store.put(make("x"), Lease{"worker", now + 60s}) == PutOutcome::created);
  REQUIRE(store.put(make("behind")) == PutOutcome::created);
  REQUIRE(redis_cli(server, "CONFIG RESETSTAT") == "OK");
  // Redis stalls under a put; the mark and the acknowledgement of x gather behind it.
  server.pause();
  auto blocker = std::async(std::launch::async, [&] { return store.put(make("blocker")); });
  std::this_thread::sleep_for(300ms);  // (the put sent; well within the command timeout)
  const auto started = now - 3s;
  store.mark_running("x", started);
  auto acknowledged = std::make_shared<std::promise<std::pair<bool, bool>>>();
  Answer answer = acknowledged->get_future();
  const rebound::JobOutcome done{JobStatus::succeeded, {{"y", 1}}, std::nullopt, now};
  store.async_finish_job("x", "worker", done, std::nullopt, now, false,
                         finished_into(acknowledged));
  std::this_thread::sleep_for(50ms);
  server.resume();
  REQUIRE(answer.wait_for(10s) == std::future_status::ready);
  CHECK(answer.get() == std::pair<bool, bool>{true, true});
  REQUIRE(blocker.wait_for(10s) == std::future_status::ready);
  CHECK(blocker.get() == PutOutcome::created);
  CHECK(calls_of(server, "hget") == 0);  // mark_running's script never ran
  const auto x = store.get("x");
  CHECK(x->status == JobStatus::succeeded);
  CHECK(x->started_at == started);  // kept, though the mark itself was not sent
  CHECK_FALSE(store.queue_position("x").has_value());
  CHECK(store.queue_position("behind") == std::optional<std::size_t>(0));  // x left the queue
}

TEST_CASE("redis: jobs stored before the tenant field get theirs from their key - once") {
  rebound::test::RedisServer server;
  {
    RedisJobStore store(options_for(server));
    Job acme = make("7");
    acme.tenant = "acme";
    REQUIRE(store.put(acme) == PutOutcome::created);
    REQUIRE(store.put(make("plain")) == PutOutcome::created);
    CHECK(redis_cli(server, "HGET {rebound}:job:acme/7 tenant") == "acme");
    CHECK(redis_cli(server, "GET {rebound}:schema") == "3");  // a new store is marked at once
  }
  // As an older build wrote it: no tenant field, and no mark; and a listing entry whose job has
  // expired meanwhile (its hash gone), which the migration must not bring back.
  REQUIRE(redis_cli(server, "HDEL {rebound}:job:acme/7 tenant") == "1");
  REQUIRE(redis_cli(server, "DEL {rebound}:schema") == "1");
  REQUIRE(redis_cli(server, "ZADD {rebound}:jobs 1764000000000 gone/1") == "1");
  {
    RedisJobStore store(options_for(server));
    CHECK(redis_cli(server, "HGET {rebound}:job:acme/7 tenant") == "acme");  // migrated in place
    const auto acme = store.get("acme/7");
    REQUIRE(acme);
    CHECK(acme->job.tenant == "acme");
    CHECK(acme->job.id == "7");
    CHECK(store.get("plain")->job.tenant.empty());
    CHECK(redis_cli(server, "HGET {rebound}:job:plain tenant").empty());
    CHECK(redis_cli(server, "EXISTS {rebound}:job:gone/1") == "0");
    CHECK_FALSE(store.get("gone/1"));
    CHECK(redis_cli(server, "GET {rebound}:schema") == "3");
  }
  // One an older server writes after the migration (a rolling upgrade) is read as its key says.
  REQUIRE(redis_cli(server, "HDEL {rebound}:job:acme/7 tenant") == "1");
  RedisJobStore store(options_for(server));
  CHECK(store.get("acme/7")->job.tenant == "acme");
  CHECK(store.get("acme/7")->job.id == "7");
}

TEST_CASE("redis: a tenant's dead letters are paged from its own set - whatever another holds") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  const auto now = std::chrono::system_clock::now();
  // Gives up the callback of `tenant`'s job `id`, created at `ms`.
  auto dead_letter = [&](const std::string& tenant, const std::string& id, std::int64_t ms) {
    Job job = make(id);
    job.tenant = tenant;
    job.created_at = at_ms(ms);
    give_up_callback(store, job, now);
  };
  dead_letter("acme", "old", 1764000000000);
  // More of evil's, all newer, than a page looks through in one call (20 * limit + 1,000).
  for (int i = 0; i < 1300; ++i)
    dead_letter("evil", "e" + std::to_string(i), 1764000000001 + i);
  auto page = store.failed_callbacks_page("acme/", std::nullopt, 10);
  REQUIRE(page.jobs.size() == 1);  // on its first page, not behind a cursor through evil's
  CHECK(page.jobs[0].job.id == "old");
  CHECK_FALSE(page.next);
  CHECK(store.list_failed_callbacks_with_prefix("acme/", 10).size() == 1);
  auto evil = store.failed_callbacks_page("evil/", std::nullopt, 10);
  CHECK(evil.jobs.size() == 10);
  CHECK(evil.jobs[0].job.id == "e1299");
  CHECK(evil.next);
  CHECK(store.failed_callbacks_page("", std::nullopt, 5).jobs.size() == 5);  // everyone's
  CHECK(redis_cli(server, "ZCARD {rebound}:callbacks:failed-of:evil") == "1300");
  // A redelivered dead letter leaves its tenant's set; given up again, it is back.
  REQUIRE(store.redeliver("acme/old", Lease{"cb", now + 60s}, now) ==
          rebound::RedeliverOutcome::redelivered);
  CHECK(store.failed_callbacks_page("acme/", std::nullopt, 10).jobs.empty());
  CHECK(redis_cli(server, "ZCARD {rebound}:callbacks:failed-of:acme") == "0");
  rebound::CallbackInfo given_up;
  given_up.state = rebound::CallbackState::failed;
  given_up.attempts = 3;
  REQUIRE(store.record_attempt("acme/old", "cb", given_up, now));
  CHECK(store.failed_callbacks_page("acme/", std::nullopt, 10).jobs.size() == 1);
}

TEST_CASE("redis: dead letters stored before the tenants' sets get them on the next start - once") {
  rebound::test::RedisServer server;
  const auto now = std::chrono::system_clock::now();
  {
    RedisJobStore old(options_for(server));
    for (int i = 0; i < 2500; ++i) {  // more than one slice of the migration's walk
      Job job = make(std::to_string(i));
      job.tenant = i % 2 ? "acme" : "globex";
      give_up_callback(old, job, now);
    }
    // As an older build left it: every tenant's dead letters in the one set, and no mark (so the
    // start below takes both steps, the tenant fields, then the sets).
    REQUIRE(redis_cli(server, "DEL {rebound}:callbacks:failed-of:acme") == "1");
    REQUIRE(redis_cli(server, "DEL {rebound}:callbacks:failed-of:globex") == "1");
    REQUIRE(redis_cli(server, "DEL {rebound}:schema") == "1");
    // Until a start has walked them, listings walk everyone's set: nothing is hidden.
    CHECK(old.failed_callbacks_page("acme/", std::nullopt, 3000).jobs.size() == 1250);
    CHECK(old.list_failed_callbacks_with_prefix("globex/", 3000).size() == 1250);
  }
  RedisJobStore store(options_for(server));
  CHECK(redis_cli(server, "GET {rebound}:schema") == "3");
  CHECK(redis_cli(server, "ZCARD {rebound}:callbacks:failed-of:acme") == "1250");
  CHECK(redis_cli(server, "ZCARD {rebound}:callbacks:failed-of:globex") == "1250");
  CHECK(redis_cli(server, "ZCARD {rebound}:callbacks:failed") == "2500");
  const auto page = store.failed_callbacks_page("acme/", std::nullopt, 3000);
  CHECK(page.jobs.size() == 1250);
}

TEST_CASE("redis: a batch writes each sorted set once - the last write of each job wins") {
  rebound::test::RedisServer server;
  auto options = options_for(server);
  options.command_timeout = 10s;  // Redis is held still below while 21 threads queue their calls
  RedisJobStore store(options);
  const auto now = std::chrono::floor<std::chrono::milliseconds>(std::chrono::system_clock::now());
  const Lease worker{"worker", now + 60s};
  const std::string url = "http://receiver.test/cb";
  // held: finished, then its callback's lease renewed; sent: finished, then delivered; kept: held
  // and renewed. All of it in one batch, behind a put that Redis stalls under.
  for (const char* id : {"held", "sent", "kept"})
    REQUIRE(store.put(Job{id, url, 1, now}, worker) == PutOutcome::created);
  REQUIRE(redis_cli(server, "CONFIG RESETSTAT") == "OK");
  server.pause();
  auto blocker = std::async(std::launch::async, [&] { return store.put(make("blocker")); });
  std::this_thread::sleep_for(100ms);
  std::vector<std::future<PutOutcome>> puts;
  for (int i = 0; i < 20; ++i) {
    puts.push_back(std::async(std::launch::async,
                              [&store, i] { return store.put(make("new-" + std::to_string(i))); }));
  }
  const rebound::JobOutcome done{JobStatus::succeeded, {{"y", 1}}, std::nullopt, now};
  std::vector<Answer> answers;
  store.mark_running("held", now);
  store.async_finish_job("held", "worker", done, Lease{"sender", now + 30s}, now, false,
                         finished_into(answers));
  store.async_finish_job("sent", "worker", done, Lease{"sender", now + 30s}, now, false,
                         finished_into(answers));
  rebound::CallbackInfo delivered;
  delivered.state = rebound::CallbackState::delivered;
  delivered.attempts = 1;
  store.async_record_attempt("sent", "sender", delivered, now,
                             rebound::CallbackAttempt{now, 200, "", 2ms, ""}, into(answers));
  // Queued after the writes above: the callback's lease is renewed after it was filed.
  auto renewed = std::async(std::launch::async, [&] {
    return store.renew_all(
        {{"held", Lease{"sender", now + 90s}}, {"kept", Lease{"worker", now + 120s}}}, now);
  });
  std::this_thread::sleep_for(500ms);
  server.resume();
  REQUIRE(blocker.wait_for(10s) == std::future_status::ready);
  CHECK(blocker.get() == PutOutcome::created);
  for (auto& put : puts) {
    REQUIRE(put.wait_for(10s) == std::future_status::ready);
    CHECK(put.get() == PutOutcome::created);
  }
  for (auto& a : answers) {
    REQUIRE(a.wait_for(10s) == std::future_status::ready);
    CHECK(a.get() == std::pair<bool, bool>{true, true});
  }
  REQUIRE(renewed.wait_for(10s) == std::future_status::ready);
  CHECK(renewed.get() == std::vector<bool>{true, true});

  // Two batches (the blocker's, then everything else): a few ZADDs and ZREMs, not four a put.
  const long long zadds = calls_of(server, "zadd");
  const long long zrems = calls_of(server, "zrem");
  MESSAGE("21 puts, 2 finishes, a delivery and 2 renewals: " << zadds << " ZADD, " << zrems
                                                             << " ZREM");
  CHECK(zadds <= 11);
  CHECK(zrems <= 4);

  // What each job's last write said.
  CHECK(store.get("sent")->callback.state == rebound::CallbackState::delivered);
  CHECK(store.get("held")->callback.state == rebound::CallbackState::pending);
  CHECK_FALSE(store.queue_position("held").has_value());
  // (make()'s jobs were created long before kept.)
  CHECK(store.queue_position("kept") == std::optional<std::size_t>(21));
  CHECK(redis_cli(server, "ZSCORE {rebound}:unfinished sent").empty());
  CHECK(redis_cli(server, "ZCARD {rebound}:unfinished") == "23");
  CHECK(redis_cli(server, "ZCARD {rebound}:jobs") == "24");
  CHECK(redis_cli(server, "ZCARD {rebound}:queued") == "22");
  // held's callback is due when its renewed lease ends, not when the first one did.
  CHECK(store.claim_callbacks(10, Lease{"other", now + 200s}, now + 60s).empty());
  const auto callbacks = store.claim_callbacks(10, Lease{"other", now + 200s}, now + 100s);
  REQUIRE(callbacks.size() == 1);
  CHECK(callbacks[0].job.id == "held");
  // kept stays leased until its renewal's end; the new jobs are there to claim.
  const auto claimed = store.claim_jobs(100, Lease{"other", now + 200s}, now + 90s);
  CHECK(claimed.size() == 21);
  for (const auto& record : claimed)
    CHECK(record.job.id != "kept");
  CHECK(store.claim_jobs(100, Lease{"other", now + 200s}, now + 121s).size() == 1);
}

TEST_CASE("redis: a call that fails in a batch leaves the sorted sets as it found them") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  const auto now = std::chrono::floor<std::chrono::milliseconds>(std::chrono::system_clock::now());
  REQUIRE(store.put(Job{"x", "http://receiver.test/cb", 1, now}, Lease{"worker", now + 60s}) ==
          PutOutcome::created);
  const rebound::JobOutcome done{JobStatus::succeeded, {{"y", 1}}, std::nullopt, now};
  REQUIRE(store.finish_job("x", "worker", done, Lease{"sender", now + 30s}, now));
  // Something else dropped the field a given-up callback is filed by: the record fails, and
  // writes nothing (the callback stays in the due set, under its lease).
  REQUIRE(redis_cli(server, "HDEL {rebound}:job:x created") == "1");
  rebound::CallbackInfo given_up;
  given_up.state = rebound::CallbackState::failed;
  given_up.attempts = 3;
  CHECK_THROWS_AS(store.record_attempt("x", "sender", given_up, now), rebound::StoreUnavailable);
  // Still owed, and claimed again once the sender's lease runs out.
  CHECK_FALSE(redis_cli(server, "ZSCORE {rebound}:callbacks:due x").empty());
  const auto again = store.claim_callbacks(10, Lease{"other", now + 90s}, now + 31s);
  REQUIRE(again.size() == 1);
  CHECK(again[0].job.id == "x");
}

TEST_CASE("redis: a score Redis refuses costs only that job's place in a set - the batch stands") {
  rebound::test::RedisServer server;
  auto options = options_for(server);
  options.command_timeout = 10s;  // Redis is held still below while the records queue
  RedisJobStore store(options);
  const auto now = std::chrono::floor<std::chrono::milliseconds>(std::chrono::system_clock::now());
  const rebound::JobOutcome done{JobStatus::succeeded, {{"y", 1}}, std::nullopt, now};
  for (const char* id : {"bad", "good"}) {
    REQUIRE(store.put(Job{id, "http://receiver.test/cb", 1, now}, Lease{"worker", now + 60s}) ==
            PutOutcome::created);
    REQUIRE(store.finish_job(id, "worker", done, Lease{"sender", now + 30s}, now));
  }
  // Something else wrote a creation time that is not a number: a given-up callback is filed by it.
  REQUIRE(redis_cli(server, "HSET {rebound}:job:bad created not-a-time") == "0");
  server.pause();
  auto blocker = std::async(std::launch::async, [&] { return store.put(make("blocker")); });
  std::this_thread::sleep_for(300ms);
  rebound::CallbackInfo given_up;
  given_up.state = rebound::CallbackState::failed;
  given_up.attempts = 3;
  std::vector<Answer> answers;
  for (const char* id : {"bad", "good"}) {
    store.async_record_attempt(id, "sender", given_up, now, std::nullopt, into(answers));
  }
  std::this_thread::sleep_for(300ms);
  server.resume();
  REQUIRE(blocker.wait_for(10s) == std::future_status::ready);
  CHECK(blocker.get() == PutOutcome::created);
  for (auto& a : answers) {
    REQUIRE(a.wait_for(10s) == std::future_status::ready);
    CHECK(a.get() == std::pair<bool, bool>{true, true});
  }
  // Both recorded and out of the due set; the good one is listed as given up, the bad one cannot
  // be.
  CHECK(store.get("good")->callback.state == rebound::CallbackState::failed);
  CHECK(store.get("bad")->callback.state == rebound::CallbackState::failed);
  CHECK(redis_cli(server, "ZCARD {rebound}:callbacks:due") == "0");
  CHECK_FALSE(redis_cli(server, "ZSCORE {rebound}:callbacks:failed good").empty());
  CHECK(redis_cli(server, "ZSCORE {rebound}:callbacks:failed bad").empty());
}

TEST_CASE("redis: a call that fails in a batch fails alone - the others in it stand") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  // Something else wrote a key where a job's hash would be: the put of that id fails there.
  REQUIRE(redis_cli(server, "SET {rebound}:job:broken x") == "OK");
  server.pause();  // the three puts below gather behind this one
  auto blocker = std::async(std::launch::async, [&] { return store.put(make("blocker")); });
  std::this_thread::sleep_for(100ms);
  auto before = std::async(std::launch::async, [&] { return store.put(make("before")); });
  auto broken = std::async(std::launch::async, [&] { return store.put(make("broken")); });
  auto after = std::async(std::launch::async, [&] { return store.put(make("after")); });
  std::this_thread::sleep_for(100ms);
  server.resume();
  CHECK(blocker.get() == PutOutcome::created);
  CHECK(before.get() == PutOutcome::created);
  CHECK_THROWS_AS(broken.get(), rebound::StoreUnavailable);
  CHECK(after.get() == PutOutcome::created);
  CHECK(store.get("after")->status == JobStatus::queued);
}

TEST_CASE("redis: resubmitting a large job does not send its input back") {
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  const nlohmann::json big = {{"blob", std::string(1 << 20, 'x')}};
  REQUIRE(store.put(make("large", big)) == PutOutcome::created);
  const auto sent = [&] {
    const std::string line =
        "redis-cli -p " + std::to_string(server.port()) + " INFO stats 2>/dev/null";
    long long bytes = -1;
    if (FILE* pipe = ::popen(line.c_str(), "r")) {
      char buffer[512];
      while (std::fgets(buffer, sizeof buffer, pipe)) {
        const std::string text(buffer);
        if (text.rfind("total_net_output_bytes:", 0) == 0) bytes = std::stoll(text.substr(23));
      }
      ::pclose(pipe);
    }
    return bytes;
  };
  const long long start = sent();
  REQUIRE(start >= 0);
  for (int i = 0; i < 20; ++i) {
    CHECK(store.put(make("large", big)) == PutOutcome::duplicate);
    CHECK(store.put(make("large", {{"blob", "other"}})) == PutOutcome::conflict);
  }
  CHECK(sent() - start < (1 << 20));  // 40 answers, not 40 MiB
}

TEST_CASE("redis cluster: a prefix without a hash tag is refused - one with a tag works") {
  rebound::test::RedisServer server{rebound::test::RedisServer::ClusterNode{}};
  auto options = options_for(server);
  options.key_prefix = "rebound";  // its keys would hash to many slots
  CHECK_THROWS_WITH_AS(RedisJobStore{options}, doctest::Contains("hash tag"), rebound::Error);
  // Two queues under two tags on one cluster: each its own.
  options.key_prefix = "{a}";
  RedisJobStore a(options);
  options.key_prefix = "{b}";
  RedisJobStore b(options);
  REQUIRE(a.put(make("x")) == PutOutcome::created);
  CHECK(b.get("x") == std::nullopt);
  REQUIRE(b.put(make("x")) == PutOutcome::created);
  CHECK(redis_cli(server, "EXISTS {a}:job:x") == "1");
  CHECK(redis_cli(server, "EXISTS {b}:job:x") == "1");
}

TEST_CASE(
    "redis: a store on the new default prefix refuses a Redis holding a queue under the old") {
  rebound::test::RedisServer server;
  REQUIRE(redis_cli(server, "ZADD rebound:unfinished 1764000000000 old-job") == "1");
  CHECK_THROWS_WITH_AS(RedisJobStore(options_for(server)), doctest::Contains("?prefix=rebound"),
                       rebound::Error);
  auto options = options_for(server);
  options.key_prefix = "rebound";  // the old queue, as it was
  RedisJobStore old(options);
  CHECK(old.get("old-job") == std::nullopt);  // (a listing entry without its hash)
  options.key_prefix = "{other}";             // or a new queue beside it
  RedisJobStore other(options);
  CHECK(other.put(make("x")) == PutOutcome::created);
}

TEST_CASE("redis cluster: slots and redirections are read as Redis Cluster writes them") {
  namespace rc = rebound::detail::redis;
  CHECK(rc::crc16("123456789") == 0x31C3);  // CRC-16/XMODEM's check value
  CHECK(rc::key_slot("foo") == 12182);
  CHECK(rc::key_slot("{user1000}.following") == rc::key_slot("{user1000}.followers"));
  CHECK(rc::key_slot("foo{}{bar}") == rc::crc16("foo{}{bar}") % 16384);  // an empty tag hashes all
  CHECK(rc::key_slot("foo{{bar}}zap") == rc::key_slot("{bar"));
  // And as a real node counts: the store's keys all go to its prefix's slot.
  rebound::test::RedisServer node{rebound::test::RedisServer::ClusterNode{}};
  CHECK(redis_cli(node, "CLUSTER KEYSLOT {rebound}:jobs") ==
        std::to_string(rc::key_slot("{rebound}:jobs")));
  CHECK(redis_cli(node, "CLUSTER KEYSLOT {eu}:job:42") == std::to_string(rc::key_slot("{eu}")));

  auto moved = rc::parse_redirect("MOVED 3999 127.0.0.1:6381");
  REQUIRE(moved);
  CHECK_FALSE(moved->ask);
  CHECK(moved->slot == 3999);
  CHECK(moved->node == rc::NodeAddress{"127.0.0.1", 6381});
  auto ask = rc::parse_redirect("ASK 16383 ::1:7000");
  REQUIRE(ask);
  CHECK(ask->ask);
  CHECK(ask->node == rc::NodeAddress{"::1", 7000});
  CHECK(ask->node.text() == "[::1]:7000");
  // A cluster that announces no address: the node is the one that answered.
  auto unnamed = rc::parse_redirect("MOVED 7 :7001");
  REQUIRE(unnamed);
  CHECK(unnamed->node == rc::NodeAddress{"", 7001});
  for (const char* not_one :
       {"MOVED", "MOVED 3999", "MOVED 16384 h:1", "MOVED x h:1", "MOVED 1 h", "MOVED 1 h:0",
        "MOVED 1 h:65536", "MOVED 1 h:", "ERR MOVED 1 h:1", "ASKING 1 h:1", "MOVED 1 h:1x"}) {
    CAPTURE(not_one);
    CHECK_FALSE(rc::parse_redirect(not_one));
  }
}

TEST_CASE(
    "redis: with replicas=1 a write counts once a replica has it - the store fails without one") {
  // (No delay before a full copy to a replica that comes back: Redis 7 waits 5 s by default.)
  rebound::test::RedisServer master({"--repl-diskless-sync-delay", "0"});
  rebound::test::RedisServer replica({"--replicaof", "127.0.0.1", std::to_string(master.port())});
  // (Linked, and past its first full copy.)
  REQUIRE(eventually(
      [&] {
        return redis_cli(replica, "INFO replication | grep master_link_status") ==
               "master_link_status:up";
      },
      10000ms));
  for (const bool batched : {true, false}) {
    CAPTURE(batched);
    auto o = options_for(master);
    o.replicas = 1;
    o.command_timeout = 2000ms;
    o.replica_timeout = 1000ms;
    o.batch_writes = batched;
    RedisJobStore store(o);
    const std::string id = batched ? "batched" : "direct";
    REQUIRE(store.put(make(id + "-1")) == PutOutcome::created);
    // Acknowledged: the replica has it (WAIT answered after it did).
    CHECK(redis_cli(replica, "EXISTS {rebound}:job:" + id + "-1") == "1");
    CHECK_FALSE(store.failure());

    replica.stop(SIGKILL);
    CHECK_THROWS_AS(store.put(make(id + "-2")), rebound::StoreUnavailable);
    const auto why = store.failure();
    REQUIRE(why);
    CHECK(why->find("replicas") != std::string::npos);
    CHECK(store.get(id + "-1"));  // reads go on, and do not make the store look well
    CHECK(store.failure());

    replica.start();  // back as a replica: it copies the master, then acknowledges again
    REQUIRE(eventually([&] { return !store.failure(); }, 10000ms));
    // The refused put stands on the master: sent again, it is the same job.
    CHECK(store.put(make(id + "-2")) == PutOutcome::duplicate);
    CHECK(redis_cli(replica, "EXISTS {rebound}:job:" + id + "-2") == "1");
  }
  auto o = options_for(master);
  o.replicas = 1;
  o.replica_timeout = o.command_timeout;
  CHECK_THROWS_WITH_AS(RedisJobStore{o}, doctest::Contains("replica timeout"), rebound::Error);
}

TEST_CASE("redis store: one page reads at most 20000 entries - the rest after its cursor") {
  // One script blocks Redis for every server of the fleet: a library caller's limit of 100,000
  // must not make one call read (and HMGET) as many, nor 20 x the limit more.
  rebound::test::RedisServer server;
  RedisJobStore store(options_for(server));
  std::vector<Job> jobs;
  for (int i = 0; i < 20500; ++i) {
    jobs.push_back(make("job-" + std::to_string(100000 + i)));
    jobs.back().created_at = at_ms(1764000000000 + i);
  }
  rebound::test::put_all(store, jobs);
  const rebound::JobPage first = store.list_jobs({}, std::nullopt, 100000);
  CHECK(first.jobs.size() == 20000);
  REQUIRE(first.next.has_value());
  CHECK(rebound::key_of(first.jobs.front().job) == "job-120499");
  const rebound::JobPage rest = store.list_jobs({}, first.next, 100000);
  CHECK(rest.jobs.size() == 500);
  CHECK_FALSE(rest.next.has_value());
  CHECK(rebound::key_of(rest.jobs.back().job) == "job-100000");
}
