// MemoryJobStore: what it adds to the store contract (test_job_store_contract.cpp): bounded
// memory, in finished jobs kept and in bytes.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rebound/store/memory_job_store.hpp"
#include "support/forwarding_store.hpp"

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

TEST_CASE("a job created at the clock's minimum is queued - claimed - finished and forgotten") {
  // The store files an entry in no queue under the clock's minimum: a job due then must still be
  // in the queue, and leave it when it finishes (under ASan, a key left behind is a
  // use-after-free once the job is forgotten).
  using namespace std::chrono_literals;
  rebound::MemoryJobStore store(1);
  const auto t0 = std::chrono::system_clock::time_point::min();
  Job j = make("early");
  j.created_at = t0;
  REQUIRE(store.put(j) == PutOutcome::created);
  CHECK(store.queue_position("early") == std::optional<std::size_t>(0));
  const auto now = std::chrono::system_clock::now();
  const auto held = store.claim_jobs(5, {"s/1", now + 30s}, now);
  REQUIRE(held.size() == 1);
  CHECK(held.front().job.id == "early");
  CHECK(store.renew("early", {"s/1", now + 60s}, now));
  REQUIRE(store.finish_job("early", "s/1", {JobStatus::succeeded, 1, std::nullopt},
                           rebound::Lease{"s/1", t0}, now));
  // The callback, its lease ending at the minimum too, is claimable at once; delivered, the job
  // is finished, and the next finished job makes the store forget it.
  const auto callbacks = store.claim_callbacks(5, {"s/2", now + 30s}, now);
  REQUIRE(callbacks.size() == 1);
  REQUIRE(store.record_attempt("early", "s/2", {CallbackState::delivered, 1, {}}, now));
  REQUIRE(store.put(make("later")) == PutOutcome::created);
  finish(store, "later");
  CHECK_FALSE(store.get("early").has_value());
  CHECK(store.claim_jobs(5, {"s/1", now + 30s}, now).empty());
  CHECK(store.claim_callbacks(5, {"s/1", now + 30s}, now).empty());
  CHECK(store.size() == 1);
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

// The state rules themselves (job_state.hpp), with no store around them: what a store of one's
// own builds on.
TEST_CASE("job state: each rule answers and changes one stored job as a store must") {
  namespace js = rebound::job_state;
  using namespace std::chrono_literals;
  const auto t0 = std::chrono::system_clock::time_point(std::chrono::milliseconds(1764000000000));
  Job job{"j", "http://example.com/cb", {{"x", 1}}, t0};
  rebound::StoredJob s = js::created(job, std::nullopt);
  CHECK(s.record.status == JobStatus::queued);
  CHECK(js::job_due(s) == t0);
  CHECK(js::put_again(s, job) == PutOutcome::duplicate);
  Job other = job;
  other.input = {{"x", 2}};
  CHECK(js::put_again(s, other) == PutOutcome::conflict);

  // Claimed by a; not again while a holds it; renewed only by a.
  const rebound::Lease a{"a", t0 + 10s}, b{"b", t0 + 20s};
  CHECK_FALSE(js::claim_job(s, a, t0 - 1s));  // not due yet
  REQUIRE(js::claim_job(s, a, t0));
  CHECK_FALSE(js::claim_job(s, b, t0 + 5s));
  CHECK(js::job_due(s) == t0 + 10s);
  CHECK(js::renew(s, rebound::Lease{"b", t0 + 30s}, t0 + 5s) == js::Renewed::none);
  CHECK(js::renew(s, rebound::Lease{"a", t0 + 15s}, t0 + 5s) == js::Renewed::job);
  CHECK(js::mark_running(s, t0 + 6s));
  CHECK_FALSE(js::mark_running(s, t0 + 7s));  // running already
  CHECK(s.record.started_at == t0 + 6s);

  // A finish after the lease ran out is refused; b, which took it over, finishes it.
  rebound::JobOutcome ok;
  ok.status = JobStatus::succeeded;
  ok.result = "OK";
  CHECK_FALSE(js::finish(s, "a", ok, std::nullopt, t0 + 15s));
  REQUIRE(js::claim_job(s, b, t0 + 15s));
  const rebound::Lease deliver{"d", t0 + 40s};
  REQUIRE(js::finish(s, "b", ok, deliver, t0 + 16s));
  CHECK(s.record.status == JobStatus::succeeded);
  CHECK_FALSE(s.job_lease);
  CHECK_FALSE(js::job_due(s));
  CHECK(s.record.callback.state == CallbackState::pending);
  CHECK(js::callback_due(s) == t0 + 40s);  // the deliverer's lease
  CHECK(js::cancel(s, ok, t0 + 17s) == rebound::CancelOutcome::already_finished);
  CHECK_FALSE(js::is_finished(s.record));

  // An attempt by someone else is refused; the deliverer's is logged, its error cut.
  rebound::CallbackInfo failed = s.record.callback;
  failed.state = CallbackState::failed;
  failed.attempts = 1;
  rebound::CallbackAttempt attempt;
  attempt.error = std::string(1000, 'e');
  CHECK_FALSE(js::record_attempt(s, "a", failed, t0 + 18s, attempt));
  REQUIRE(js::record_attempt(s, "d", failed, t0 + 18s, attempt));
  CHECK(s.record.attempt_log.size() == 1);
  CHECK(s.record.attempt_log.back().error.size() == rebound::max_attempt_error_bytes);
  CHECK_FALSE(s.callback_lease);
  CHECK(js::is_finished(s.record));
  CHECK_FALSE(js::callback_due(s));

  // A given-up callback is redelivered, once.
  CHECK(js::redeliver(s, rebound::Lease{"r", t0 + 60s}, t0 + 19s) ==
        rebound::RedeliverOutcome::redelivered);
  CHECK(s.record.callback.delivery_attempts == 0);
  CHECK(s.record.callback.last_error.empty());
  CHECK(js::redeliver(s, rebound::Lease{"r2", t0 + 60s}, t0 + 19s) ==
        rebound::RedeliverOutcome::not_failed);

  // A job that failed keeps no result; its cancellation ends whoever held it.
  rebound::StoredJob c = js::created(job, rebound::Lease{"a", t0 + 10s});
  rebound::JobOutcome cancelled;
  cancelled.status = JobStatus::cancelled;
  cancelled.result = "ignored";
  CHECK(js::cancel(c, cancelled, t0 + 1s) == rebound::CancelOutcome::cancelled);
  CHECK(c.record.outcome.result.is_null());
  CHECK_FALSE(c.job_lease);
  CHECK(js::callback_due(c) == t0 + 1s);  // its callback says so at once
}

namespace {
// Gives up the callback of `tenant`'s job `id`, created at `ms` (update_callback, as a sender
// without leases would).
void dead_letter(rebound::MemoryJobStore& store, const std::string& tenant, const std::string& id,
                 long long ms) {
  Job job = make(id);
  job.tenant = tenant;
  job.created_at = std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
  REQUIRE(store.put(job) == PutOutcome::created);
  store.complete(rebound::key_of(job), {JobStatus::succeeded, 1, std::nullopt});
  store.update_callback(rebound::key_of(job), {CallbackState::failed, 3, "HTTP 500"});
}

// Every page of `prefix`'s dead letters, `per_page` at a time, as keys.
std::vector<std::string> pages_of(const rebound::JobStore& store, const std::string& prefix,
                                  std::size_t per_page, bool generic) {
  std::vector<std::string> out;
  std::optional<rebound::ListCursor> after;
  for (int guard = 0; guard < 1000; ++guard) {
    rebound::JobFilter filter;
    filter.callback_state = CallbackState::failed;
    filter.id_prefix = prefix;
    const auto page = generic ? store.list_jobs(filter, after, per_page)
                              : store.failed_callbacks_page(prefix, after, per_page);
    for (const auto& r : page.jobs) {
      CHECK(r.callback.state == CallbackState::failed);
      CHECK(r.job.input.is_null());  // a listing carries no input
      out.push_back(rebound::key_of(r.job));
    }
    if (!page.next) break;
    after = page.next;
  }
  return out;
}
}  // namespace

TEST_CASE("dead-letter pages read a tenant's own index - the same pages as a scan of every job") {
  rebound::MemoryJobStore store(1000);
  // Three tenants, interleaved, several at the same millisecond (ordered by key there).
  for (int i = 0; i < 25; ++i) {
    dead_letter(store, "acme", "a" + std::to_string(i), 1764000000000 + i / 3);
    dead_letter(store, "evil", "e" + std::to_string(i), 1764000000000 + i / 2);
  }
  for (int i = 0; i < 5; ++i)
    dead_letter(store, "", "plain" + std::to_string(i), 1764000000000 + i);
  store.put(make("not-dead"));  // not a dead letter: never listed
  for (const std::string prefix : {"acme/", "evil/", "acme/a1", "", "acme", "nobody/"}) {
    for (const std::size_t per_page : {1, 7, 100}) {
      CAPTURE(prefix);
      CAPTURE(per_page);
      CHECK(pages_of(store, prefix, per_page, false) == pages_of(store, prefix, per_page, true));
    }
  }
  CHECK(pages_of(store, "acme/", 10, false).size() == 25);
  CHECK(pages_of(store, "acme/a1", 10, false).size() == 11);  // a1, a10..a19
  CHECK(pages_of(store, "", 10, false).size() == 55);
  CHECK(pages_of(store, "nobody/", 10, false).empty());
  // A redelivered dead letter leaves the index; given up again, it is back.
  REQUIRE(store.redeliver(
              "acme/a3",
              rebound::Lease{"cb", std::chrono::system_clock::now() + std::chrono::minutes(1)},
              std::chrono::system_clock::now()) == rebound::RedeliverOutcome::redelivered);
  CHECK(pages_of(store, "acme/", 10, false).size() == 24);
  store.update_callback("acme/a3", {CallbackState::failed, 4, "HTTP 500"});
  CHECK(pages_of(store, "acme/", 10, false) == pages_of(store, "acme/", 10, true));
  CHECK(pages_of(store, "acme/", 10, false).size() == 25);
  // Given up through the lease protocol (finish_job, then record_attempt), as a JobQueue does.
  const auto now = std::chrono::system_clock::now();
  Job leased = make("leased");
  leased.tenant = "acme";
  leased.created_at =
      std::chrono::system_clock::time_point(std::chrono::milliseconds(1764000000100));
  REQUIRE(store.put(leased, rebound::Lease{"w", now + std::chrono::minutes(1)}) ==
          PutOutcome::created);
  REQUIRE(store.finish_job("acme/leased", "w", {JobStatus::succeeded, 1, std::nullopt},
                           rebound::Lease{"cb", now + std::chrono::minutes(1)}, now));
  rebound::CallbackInfo given_up;
  given_up.state = CallbackState::failed;
  given_up.attempts = 3;
  REQUIRE(store.record_attempt("acme/leased", "cb", given_up, now));
  const auto acme = pages_of(store, "acme/", 10, false);
  REQUIRE(acme.size() == 26);
  CHECK(acme.front() == "acme/leased");  // the newest
}

TEST_CASE("a dead letter forgotten beyond max_finished leaves the dead-letter pages") {
  rebound::MemoryJobStore store(10);
  for (int i = 0; i < 8; ++i)
    dead_letter(store, "acme", "a" + std::to_string(i), 1764000000000 + i);
  for (int i = 0; i < 8; ++i)
    dead_letter(store, "evil", "e" + std::to_string(i), 1764000001000 + i);
  // 16 finished, 10 kept: the six oldest (acme's) went.
  const auto acme = pages_of(store, "acme/", 5, false);
  CHECK(acme == std::vector<std::string>{"acme/a7", "acme/a6"});
  for (const auto& key : pages_of(store, "", 100, false))
    CHECK(store.get(key).has_value());
  CHECK(pages_of(store, "", 100, false).size() == 10);
}

TEST_CASE("waiting_versions is bounded a call - the next call goes on to the tenants after") {
  rebound::MemoryJobStore store;
  const auto t0 = std::chrono::system_clock::now();
  // Tenant a's 5,001 jobs fill one call's look; tenant b's one job is behind them.
  for (int i = 0; i <= 5000; ++i) {
    Job job = make("j-" + std::to_string(i));
    job.tenant = "a";
    job.created_at = t0;
    job.model = {"iris", "1"};
    REQUIRE(store.put(job) == PutOutcome::created);
  }
  Job behind = make("j");
  behind.tenant = "b";
  behind.created_at = t0;
  behind.model = {"iris", "2"};
  REQUIRE(store.put(behind) == PutOutcome::created);
  const std::vector<rebound::ModelRef> asked{{"iris", "2"}};
  CHECK(store.waiting_versions(asked, t0 + std::chrono::seconds(1)).empty());  // (cut short)
  CHECK(store.waiting_versions(asked, t0 + std::chrono::seconds(1)) == asked);
}

TEST_CASE("claims leave the versions skipped where they are - model configs are compare-and-set") {
  rebound::MemoryJobStore store;
  const auto t0 = std::chrono::system_clock::now();
  for (int i = 0; i < 12; ++i) {
    Job job = make("v-" + std::to_string(10 + i));
    job.created_at = t0 + std::chrono::milliseconds(i);
    job.model = {"iris", i % 3 == 0 ? "2" : "1"};
    REQUIRE(store.put(job) == PutOutcome::created);
  }
  const auto now = t0 + std::chrono::seconds(1);
  const rebound::Lease lease{"one", now + std::chrono::minutes(1)};
  const auto got = store.claim_jobs_except(20, lease, now, {{"iris", "2"}});
  CHECK(got.size() == 8);
  for (const auto& r : got)
    CHECK(r.job.model == rebound::ModelRef{"iris", "1"});
  const auto rest = store.claim_jobs(20, {"two", now + std::chrono::minutes(1)}, now);
  REQUIRE(rest.size() == 4);
  CHECK(rest.front().job.id == "v-10");  // in its place, first
  for (const auto& r : rest)
    CHECK(r.job.model == rebound::ModelRef{"iris", "2"});

  REQUIRE(store.model_configs());
  CHECK(store.put_model_config("iris", "a", 0) == std::optional<std::uint64_t>(1));
  CHECK_FALSE(store.put_model_config("iris", "b", 0));
  CHECK(store.put_model_config("iris", "b", 1) == std::optional<std::uint64_t>(2));
  REQUIRE(store.model_configs()->size() == 1);
  CHECK(store.model_configs()->front().config == "b");
}

TEST_CASE("JobStore's default prefix listing reads every dead letter for a limit of SIZE_MAX") {
  // A store that does not filter by prefix itself (ForwardingStore keeps JobStore's default):
  // the default reads ten times the limit and more; for SIZE_MAX that read wrapped to 990.
  auto memory = std::make_shared<rebound::MemoryJobStore>();
  for (int i = 0; i < 1000; ++i) {
    const std::string id = "acme/" + std::to_string(i);
    memory->put(make(id));
    memory->complete(id, {JobStatus::succeeded, 1, std::nullopt});
    memory->update_callback(id, {CallbackState::failed, 5, "HTTP 500"});
  }
  const rebound::test::ForwardingStore store(memory);
  CHECK(store.list_failed_callbacks_with_prefix("acme/", SIZE_MAX).size() == 1000);
  CHECK(store.list_failed_callbacks_with_prefix("acme/", 10).size() == 10);
}
