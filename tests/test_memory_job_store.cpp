// MemoryJobStore: what it adds to the store contract (test_job_store_contract.cpp): bounded
// memory, in finished jobs kept and in bytes.
#include <doctest/doctest.h>

#include "rebound/store/memory_job_store.hpp"

using rebound::CallbackState;
using rebound::Job;
using rebound::JobStatus;
using rebound::PutOutcome;

namespace {
Job make(const std::string& id, const std::string& url = "http://example.com/cb", int input = 1) {
  return Job{id, url, input, std::chrono::system_clock::now()};
}
}  // namespace

TEST_CASE("only finished jobs are forgotten - oldest first - beyond max_finished") {
  rebound::MemoryJobStore store(2);
  for (const char* id : {"a", "b", "c", "pending"})
    store.put(make(id));
  store.put(make("poll-only", ""));
  for (const char* id : {"a", "b", "c"}) {
    store.complete(id, {JobStatus::succeeded, 1, std::nullopt});
    store.update_callback(id, {CallbackState::delivered, 1, {}});
  }
  CHECK_FALSE(store.get("a").has_value());  // the oldest finished one went
  CHECK(store.get("b").has_value());
  CHECK(store.get("c").has_value());
  store.complete("pending", {JobStatus::succeeded, 1, std::nullopt});
  store.update_callback("pending", {CallbackState::pending, 1, "HTTP 500"});
  store.complete("poll-only", {JobStatus::succeeded, 1, std::nullopt});  // finished: no callback
  CHECK(store.get("pending").has_value());  // never dropped while its callback is pending
  CHECK(store.get("poll-only").has_value());
  CHECK_FALSE(store.get("b").has_value());
  CHECK(store.size() == 3);
}

namespace {
// A job whose input is a string of `mib` MiB.
Job big(const std::string& id, std::size_t mib) {
  return Job{id, "http://example.com/cb", std::string(mib << 20, 'x'),
             std::chrono::system_clock::now()};
}
void finish(rebound::MemoryJobStore& store, const std::string& id) {
  store.complete(id, {JobStatus::succeeded, 1, std::nullopt});
  store.update_callback(id, {CallbackState::delivered, 1, {}});
}
}  // namespace

TEST_CASE(
    "the memory store stays within its byte budget - finished jobs go first - then put is "
    "refused") {
  rebound::MemoryJobStoreOptions options;
  options.max_bytes = 8u << 20;
  rebound::MemoryJobStore store(options);
  int created = 0;
  for (int i = 0; i < 20; ++i) {
    if (store.put(big("job-" + std::to_string(i), 1)) == PutOutcome::created) ++created;
  }
  // Seven 1 MiB inputs and their bookkeeping fit in 8 MiB; the rest were refused, not stored.
  CHECK(created == 7);
  CHECK(store.size() == 7);
  CHECK(store.bytes() <= options.max_bytes);
  CHECK(store.bytes() > (7u << 20));  // it counts the inputs
  CHECK(store.put(big("job-7", 1)) == PutOutcome::full);
  CHECK(store.put(big("job-0", 1)) == PutOutcome::duplicate);  // a stored job still answers

  // Finished jobs make room, oldest first; unfinished ones are never dropped.
  finish(store, "job-2");
  finish(store, "job-0");
  CHECK(store.put(big("job-7", 1)) == PutOutcome::created);
  CHECK_FALSE(store.get("job-2").has_value());  // finished first: forgotten first
  CHECK(store.get("job-0").has_value());
  CHECK(store.put(big("job-8", 1)) == PutOutcome::created);
  CHECK_FALSE(store.get("job-0").has_value());
  CHECK(store.put(big("job-9", 1)) == PutOutcome::full);
  for (const char* id : {"job-1", "job-3", "job-4", "job-5", "job-6", "job-7", "job-8"})
    CHECK(store.get(id).has_value());
  CHECK(store.bytes() <= options.max_bytes);

  // A result counts too: a finished job's large result makes room by evicting older ones.
  store.complete("job-1", {JobStatus::succeeded, std::string(3u << 20, 'r'), std::nullopt});
  CHECK(store.bytes() > options.max_bytes);  // unfinished (callback owed): kept, over budget
  store.update_callback("job-1", {CallbackState::delivered, 1, {}});
  CHECK(store.bytes() <= options.max_bytes);
  CHECK_FALSE(store.get("job-1").has_value());  // the only finished job, and it had to go
}

TEST_CASE("a job finished - redelivered - and finished again is not evicted by its first finish") {
  rebound::MemoryJobStore store(2);
  for (const char* id : {"a", "b", "c"})
    store.put(make(id));
  finish(store, "a");
  store.update_callback("a", {CallbackState::failed, 5, "HTTP 500"});  // given up
  store.update_callback("a", {CallbackState::pending, 5, {}});         // redelivered
  finish(store, "b");
  store.update_callback("a", {CallbackState::delivered, 6, {}});  // finished again, after b
  finish(store, "c");  // three finished, two kept: b (the oldest finish) goes, not a
  CHECK(store.get("a").has_value());
  CHECK_FALSE(store.get("b").has_value());
  CHECK(store.get("c").has_value());
  CHECK(store.size() == 2);
}

TEST_CASE("json_footprint grows with what a value holds") {
  using rebound::detail::json_footprint;
  CHECK(json_footprint(nullptr) < 64);
  CHECK(json_footprint(std::string(1 << 20, 'x')) >= (1u << 20));
  nlohmann::json many = nlohmann::json::array();
  for (int i = 0; i < 1000; ++i)
    many.push_back({{"key-that-is-long-enough-to-allocate", i}});
  CHECK(json_footprint(many) > 1000 * 64);
  CHECK(json_footprint(many) < 1000 * 512);
}

TEST_CASE("a put that cannot fit even without the finished jobs evicts none of them") {
  rebound::MemoryJobStoreOptions options;
  options.max_bytes = 8u << 20;
  rebound::MemoryJobStore store(options);
  for (int i = 0; i < 5; ++i)
    REQUIRE(store.put(big("unfinished-" + std::to_string(i), 1)) == PutOutcome::created);
  REQUIRE(store.put(big("finished", 1)) == PutOutcome::created);
  finish(store, "finished");
  for (int i = 0; i < 10; ++i)  // a client sending large bodies again and again
    CHECK(store.put(big("too-big-" + std::to_string(i), 3)) == PutOutcome::full);
  CHECK(store.get("finished").has_value());  // its result is still there to poll
  CHECK(store.put(big("fits-after-eviction", 2)) == PutOutcome::created);
  CHECK_FALSE(store.get("finished").has_value());
}

TEST_CASE("a claim steps over hundreds of renewed leases to the job due behind them") {
  // A renewal that makes a lease longer leaves the job filed under the lease's first end; the
  // claim that finds it there, still held, files it again (a slice at a time).
  using namespace std::chrono_literals;
  rebound::MemoryJobStore store;
  const auto t0 = std::chrono::system_clock::time_point(std::chrono::seconds(1764000000));
  for (int i = 0; i < 600; ++i) {
    Job j = make("held-" + std::to_string(1000 + i));
    j.created_at = t0;
    REQUIRE(store.put(j) == PutOutcome::created);
  }
  const auto held = store.claim_jobs(600, {"s/1", t0 + 30s}, t0);
  REQUIRE(held.size() == 600);
  std::vector<std::pair<std::string, rebound::Lease>> leases;
  for (const auto& r : held)
    leases.push_back({r.job.id, {"s/1", t0 + 90s}});
  CHECK(store.renew_all(leases, t0 + 10s) == std::vector<bool>(600, true));
  Job late = make("late");
  late.created_at = t0 + 40s;  // due after the first end of the 600 leases
  REQUIRE(store.put(late) == PutOutcome::created);

  const auto got = store.claim_jobs(10, {"s/2", t0 + 120s}, t0 + 60s);
  REQUIRE(got.size() == 1);
  CHECK(got[0].job.id == "late");
  CHECK(store.claim_jobs(10, {"s/2", t0 + 120s}, t0 + 80s).empty());  // all still held
  // Once the renewed leases run out, the 600 are claimable again, oldest first.
  const auto again = store.claim_jobs(1000, {"s/3", t0 + 200s}, t0 + 91s);
  REQUIRE(again.size() == 600);
  CHECK(again.front().job.id == "held-1000");
  // A lease handed back (renewed to now) is claimable at once.
  CHECK(store.renew("held-1000", {"s/3", t0 + 92s}, t0 + 92s));
  const auto handed = store.claim_jobs(10, {"s/4", t0 + 300s}, t0 + 92s);
  REQUIRE(handed.size() == 1);
  CHECK(handed[0].job.id == "held-1000");
  // Made longer, then shorter but still past where it is filed: held until the shorter end.
  CHECK(store.renew("held-1000", {"s/4", t0 + 400s}, t0 + 100s));
  CHECK(store.renew("held-1000", {"s/4", t0 + 350s}, t0 + 110s));
  // (the other 599 and "late", whose leases ran out at t0 + 200 s and 120 s, are claimed; it is
  // not)
  const auto others = store.claim_jobs(1000, {"s/5", t0 + 500s}, t0 + 320s);
  CHECK(others.size() == 600);
  for (const auto& r : others)
    CHECK(r.job.id != "held-1000");
  const auto after = store.claim_jobs(1000, {"s/6", t0 + 600s}, t0 + 351s);
  REQUIRE(after.size() == 1);
  CHECK(after[0].job.id == "held-1000");
}

TEST_CASE("a callback whose lease was renewed is claimed again only once the renewal runs out") {
  using namespace std::chrono_literals;
  rebound::MemoryJobStore store;
  const auto t0 = std::chrono::system_clock::time_point(std::chrono::seconds(1764000000));
  for (int i = 0; i < 300; ++i) {
    const std::string id = "cb-" + std::to_string(1000 + i);
    Job j = make(id);
    j.created_at = t0;
    REQUIRE(store.put(j) == PutOutcome::created);
    store.complete(id, {JobStatus::succeeded, 1, std::nullopt});
    store.update_callback(id, {CallbackState::pending, 1, "HTTP 503"});  // due at once
  }
  const auto held = store.claim_callbacks(300, {"s/1", t0 + 30s}, t0);
  REQUIRE(held.size() == 300);
  std::vector<std::pair<std::string, rebound::Lease>> leases;
  for (const auto& r : held)
    leases.push_back({r.job.id, {"s/1", t0 + 90s}});
  CHECK(store.renew_all(leases, t0 + 10s) == std::vector<bool>(300, true));
  CHECK(store.claim_callbacks(10, {"s/2", t0 + 200s}, t0 + 60s).empty());
  CHECK(store.claim_callbacks(1000, {"s/2", t0 + 200s}, t0 + 91s).size() == 300);
}
