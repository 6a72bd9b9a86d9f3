// JobQueueOptions::prefetch: jobs accepted beyond it wait in the store (no memory in the process,
// only their capacity slot) and are claimed as the workers drain, in the store's order. With the
// memory store and a SQLite file; real JobQueues, a model the test holds.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rebound/job_queue.hpp"
#include "rebound/store/memory_job_store.hpp"
#include "rebound/store/sqlite_job_store.hpp"
#include "support/failing_store.hpp"
#include "support/held_model.hpp"
#include "support/receiver.hpp"
#include "support/submitting.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using rebound::JobStatus;
using rebound::test::eventually;

namespace {

using rebound::test::Held;
using rebound::test::HeldModel;

void open(Held& held) {
  held.open();
}

// The jobs' numbers (their input "n") in the order they reached the model.
std::vector<int> ran_order(Held& held) {
  std::vector<int> out;
  for (const std::string& input : held.order())
    out.push_back(nlohmann::json::parse(input).value("n", -1));
  return out;
}

std::size_t ran(Held& held) {
  return held.order().size();
}

rebound::Job numbered(int n, int priority = rebound::default_priority) {
  rebound::Job job = rebound::make_job("job-" + std::to_string(n), {{"n", n}});
  job.priority = priority;
  return job;
}

rebound::JobQueueOptions options(std::size_t prefetch, std::size_t capacity) {
  rebound::JobQueueOptions o;
  o.workers = 1;
  o.prefetch = prefetch;
  o.queue_capacity = capacity;
  // No poll to fall back on: parked jobs must be claimed because the workers drained, on time.
  o.poll_interval = 1h;
  o.drain_on_destroy = 0ms;
  return o;
}

std::unique_ptr<rebound::JobStore> make(const std::string& kind, const std::string& path) {
  if (kind == "memory") return std::make_unique<rebound::MemoryJobStore>();
  return std::make_unique<rebound::SqliteJobStore>(path);
}

// Submits jobs 0 to count - 1, each accepted.
void submit_all(rebound::JobQueue& queue, int count) {
  for (int n = 0; n < count; ++n)
    REQUIRE(rebound::test::submitted(queue, numbered(n)) == "accepted");
}

// A queue on a SQLite file of its own, with the order model held until opened.
struct OnSqlite {
  OnSqlite(std::size_t prefetch, std::size_t capacity)
      : queue(std::make_unique<HeldModel>(shared),
              std::make_unique<rebound::SqliteJobStore>(dir.file("q.db")),
              options(prefetch, capacity)) {}
  rebound::test::TempDir dir;
  std::shared_ptr<Held> shared = std::make_shared<Held>();
  rebound::JobQueue queue;
};

}  // namespace

TEST_CASE("prefetch: jobs beyond it wait in the store - not in memory - and run in order") {
  for (const std::string kind : {"memory", "sqlite"}) {
    CAPTURE(kind);
    rebound::test::TempDir dir;
    auto shared = std::make_shared<Held>();
    rebound::JobQueue queue(std::make_unique<HeldModel>(shared), make(kind, dir.file("q.db")),
                            options(8, 100));
    REQUIRE(rebound::test::submitted(queue, numbered(0)) == "accepted");
    const std::size_t one = queue.telemetry().work_bytes();
    REQUIRE(one > 0);
    for (int n = 1; n < 100; ++n)
      REQUIRE(rebound::test::submitted(queue, numbered(n)) == "accepted");
    // Every accepted job holds its slot, the parked ones included: the 101st is refused.
    CHECK(rebound::test::submitted(queue, numbered(100)) == "queue_full");
    CHECK(queue.telemetry().in_flight() == 100);
    CHECK(queue.telemetry().queue_depth() >= 99);
    // Memory holds the prefetch and the job running, not the 100 accepted.
    CHECK(queue.telemetry().work_bytes() <= 10 * one);
    const auto stats = queue.telemetry().queue_stats();
    REQUIRE(stats);
    CHECK(stats->queued + stats->running == 100);  // the worker holds one
    // The store keeps the parked ones as any queued job: polls see them.
    auto last = queue.find("job-99");
    REQUIRE(last);
    CHECK(last->status == JobStatus::queued);

    open(*shared);
    REQUIRE(eventually([&] { return ran(*shared) == 100; }, 30s));
    REQUIRE(eventually([&] { return queue.telemetry().in_flight() == 0; }));
    // One worker and one priority: first come, first served, across memory and the store.
    const std::vector<int> order = ran_order(*shared);
    CHECK(std::is_sorted(order.begin(), order.end()));
    CHECK(queue.find("job-99")->status == JobStatus::succeeded);
    // Claimed back from the store, not taken over from another run.
    CHECK(queue.telemetry().batch_stats().resumed == 0);
    // The slots are free again.
    CHECK(rebound::test::submitted(queue, numbered(100)) == "accepted");
  }
}

TEST_CASE(
    "prefetch: parked jobs of several tenants are claimed in turns - a priority is a "
    "tenant's own") {
  for (const std::string kind : {"memory", "sqlite"}) {
    CAPTURE(kind);
    rebound::test::TempDir dir;
    auto shared = std::make_shared<Held>();
    rebound::JobQueue queue(std::make_unique<HeldModel>(shared), make(kind, dir.file("q.db")),
                            options(1, 100));
    // evil floods at the highest priority first; acme's two come after, at the default one.
    for (int n = 0; n < 20; ++n) {
      rebound::Job job = numbered(n, 0);
      job.tenant = "evil";
      REQUIRE(rebound::test::submitted(queue, job) == "accepted");
    }
    for (int n = 100; n < 102; ++n) {
      rebound::Job job = numbered(n);
      job.tenant = "acme";
      REQUIRE(rebound::test::submitted(queue, job) == "accepted");
    }
    open(*shared);
    REQUIRE(eventually([&] { return ran(*shared) == 22; }, 30s));
    // The two the queue held when the model opened (the one running, the prefetched one) are
    // evil's; from then on each claim takes the next tenant's turn: acme's go in the next four.
    const std::vector<int> order = ran_order(*shared);
    CAPTURE(order);
    const auto position = [&](int n) {
      return std::find(order.begin(), order.end(), n) - order.begin();
    };
    CHECK(position(100) < 5);
    CHECK(position(101) < 7);
    // And each tenant's own in its order.
    CHECK(position(100) < position(101));
    std::vector<int> evil;
    std::copy_if(order.begin(), order.end(), std::back_inserter(evil),
                 [](int n) { return n < 20; });
    CHECK(std::is_sorted(evil.begin(), evil.end()));
  }
}

TEST_CASE("prefetch: submissions whose store answer is still to come count in it") {
  auto store = std::make_shared<rebound::test::FailingStore::Switch>();
  auto shared = std::make_shared<Held>();
  rebound::JobQueue queue(std::make_unique<HeldModel>(shared),
                          std::make_unique<rebound::test::FailingStore>(store), options(8, 100));
  REQUIRE(rebound::test::submitted(queue, numbered(0)) == "accepted");
  const std::size_t one = queue.telemetry().work_bytes();
  REQUIRE(one > 0);
  // 49 submissions at once, each waiting for its put (as SQLite's wait for the group commit).
  store->puts.close();
  std::mutex m;
  int accepted = 0;
  for (int n = 1; n < 50; ++n) {
    queue.submit(numbered(n), [&](boost::system::error_code ec, const rebound::Submitted& s) {
      std::lock_guard<std::mutex> lock(m);
      accepted += !ec && !s.duplicate;
    });
  }
  REQUIRE(eventually([&] { return store->puts.waiting() == 49; }));
  store->puts.open();
  REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> lock(m);
    return accepted == 49;
  }));
  // Memory holds about the prefetch (and the job running), not the 50: the rest wait in the
  // store. (A parked job is in the store before its submission has marked its slot parked: the
  // pump may claim a few of them then, so the bound is twice the prefetch, not the prefetch.)
  CHECK(queue.telemetry().work_bytes() <= 18 * one);
  open(*shared);
  REQUIRE(eventually([&] { return ran(*shared) == 50; }, 30s));
}

TEST_CASE("prefetch: a parked job that is cancelled gives its slot back once the store drains") {
  OnSqlite q(2, 10);
  rebound::JobQueue& queue = q.queue;
  auto shared = q.shared;
  submit_all(queue, 10);
  CHECK(rebound::test::submitted(queue, numbered(10)) == "queue_full");
  // The last ones wait in the store: cancelled there, they never come back to this queue.
  for (int n = 5; n < 10; ++n)
    CHECK_FALSE(queue.cancel("job-" + std::to_string(n)));
  open(*shared);
  REQUIRE(eventually([&] { return ran(*shared) == 5; }, 30s));
  // Once the store has no job left to claim, the cancelled ones' slots are free.
  REQUIRE(eventually([&] { return queue.telemetry().in_flight() == 0; }));
  for (int n = 10; n < 20; ++n)
    CHECK(rebound::test::submitted(queue, numbered(n)) == "accepted");
  REQUIRE(eventually([&] { return ran(*shared) == 15; }, 30s));
}

TEST_CASE("prefetch: shutdown runs the parked jobs too - past its deadline they stay queued") {
  rebound::test::TempDir dir;
  const std::string path = dir.file("q.db");
  {
    auto shared = std::make_shared<Held>();
    rebound::JobQueue queue(std::make_unique<HeldModel>(shared),
                            std::make_unique<rebound::MemoryJobStore>(), options(4, 100));
    submit_all(queue, 40);
    open(*shared);
    // The drain runs every accepted job, those parked in the store as those in memory.
    CHECK(queue.shutdown(30s));
    CHECK(ran(*shared) == 40);
    CHECK(queue.find("job-39")->status == JobStatus::succeeded);
  }
  {
    auto shared = std::make_shared<Held>();
    rebound::JobQueue queue(std::make_unique<HeldModel>(shared),
                            std::make_unique<rebound::SqliteJobStore>(path), options(4, 100));
    submit_all(queue, 40);
    // Nothing can run: the deadline passes with jobs parked, and shutdown does not wait for them.
    CHECK_FALSE(queue.shutdown(0ms));
    CHECK(queue.telemetry().in_flight() <= 1);  // at most the one the worker holds
    open(*shared);
  }
  // The next start on the same file finds every job that had not run, queued, and runs them.
  auto shared = std::make_shared<Held>();
  open(*shared);
  rebound::JobQueue queue(std::make_unique<HeldModel>(shared),
                          std::make_unique<rebound::SqliteJobStore>(path), options(4, 100));
  REQUIRE(eventually(
      [&] {
        for (int n = 0; n < 40; ++n) {
          auto r = queue.find("job-" + std::to_string(n));
          if (!r || r->status != JobStatus::succeeded) return false;
        }
        return true;
      },
      30s));
  CHECK(ran(*shared) >= 39);
}

TEST_CASE("prefetch: an urgent job is not parked behind less urgent ones") {
  OnSqlite q(4, 100);
  rebound::JobQueue& queue = q.queue;
  auto shared = q.shared;
  submit_all(queue, 20);
  REQUIRE(rebound::test::submitted(queue, numbered(1000, rebound::highest_priority)) == "accepted");
  open(*shared);
  REQUIRE(eventually([&] { return ran(*shared) == 21; }, 30s));
  // The worker held job 0 when it came; the urgent one runs next, before the 19 waiting.
  const std::vector<int> order = ran_order(*shared);
  const auto at = std::find(order.begin(), order.end(), 1000) - order.begin();
  CHECK(at <= 1);
}

TEST_CASE("prefetch: a restart with a backlog many times the prefetch drains without polls") {
  rebound::test::TempDir dir;
  const std::string path = dir.file("q.db");
  {
    rebound::SqliteJobStore store(path);
    for (int n = 0; n < 300; ++n)
      REQUIRE(store.put(numbered(n)) == rebound::PutOutcome::created);
  }
  auto shared = std::make_shared<Held>();
  open(*shared);
  rebound::JobQueue queue(std::make_unique<HeldModel>(shared),
                          std::make_unique<rebound::SqliteJobStore>(path), options(4, 1000));
  // Claimed a prefetch at a time as the worker drains: with polls an hour apart, only the
  // wake-ups of the drain can bring them all in.
  REQUIRE(eventually([&] { return ran(*shared) == 300; }, 30s));
  // Counted after each claim is handed on: the last count can trail the last job.
  CHECK(eventually([&] { return queue.telemetry().batch_stats().resumed == 300; }));
}

TEST_CASE("prefetch: a shutdown past its deadline leaves the parked jobs queued and says so") {
  OnSqlite q(4, 100);
  rebound::JobQueue& queue = q.queue;
  auto shared = q.shared;
  submit_all(queue, 20);
  // The one running is held past the deadline: the parked jobs are not drained, and the answer is
  // false. Once it has finished, nothing else ran.
  CHECK_FALSE(queue.shutdown(10ms));
  open(*shared);
  REQUIRE(eventually([&] { return queue.telemetry().in_flight() == 0; }));
  CHECK(ran(*shared) == 1);
  CHECK(queue.find("job-19")->status == JobStatus::queued);
}
