// MemoryJobStore: idempotent put, the job lifecycle, bounded memory, unfinished listing.
#include <doctest/doctest.h>

#include "rebound/memory_job_store.hpp"

using rebound::CallbackState;
using rebound::Job;
using rebound::JobStatus;
using rebound::PutOutcome;

namespace {
Job make(const std::string& id, const std::string& url = "http://example.com/cb", int input = 1) {
  return Job{id, url, input, std::chrono::system_clock::now()};
}
}  // namespace

TEST_CASE("put creates once - the same request is a duplicate - a different one a conflict") {
  rebound::MemoryJobStore store;
  CHECK(store.put(make("a")) == PutOutcome::created);
  CHECK(store.put(make("a")) == PutOutcome::duplicate);
  CHECK(store.put(make("a", "http://example.com/cb", 2)) == PutOutcome::conflict);
  CHECK(store.put(make("a", "http://example.com/other")) == PutOutcome::conflict);
  CHECK(store.size() == 1);
  CHECK(store.get("a")->job.input == 1);
}

TEST_CASE("a job's record follows it from queued to delivered") {
  rebound::MemoryJobStore store;
  store.put(make("a"));
  CHECK(store.get("a")->status == JobStatus::queued);
  store.mark_running("a");
  CHECK(store.get("a")->status == JobStatus::running);
  store.complete("a", {JobStatus::succeeded, {{"label", "setosa"}}, std::nullopt});
  auto rec = store.get("a");
  CHECK(rec->status == JobStatus::succeeded);
  CHECK(rec->outcome.result["label"] == "setosa");
  store.update_callback("a", {CallbackState::pending, 2, "HTTP 503"});
  CHECK(store.get("a")->callback.attempts == 2);
  CHECK(store.get("a")->callback.last_error == "HTTP 503");
  store.update_callback("a", {CallbackState::delivered, 3, {}});
  CHECK(store.get("a")->callback.state == CallbackState::delivered);
  CHECK_FALSE(store.get("missing").has_value());
  store.complete("missing", {JobStatus::failed, nullptr, std::nullopt});  // ignored, no throw
}

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

TEST_CASE("list_unfinished returns queued - running and undelivered jobs - oldest first") {
  rebound::MemoryJobStore store;
  auto t0 = std::chrono::system_clock::now();
  auto job = [&](const char* id, int offset_ms) {
    return Job{id, "http://example.com/cb", 1, t0 + std::chrono::milliseconds(offset_ms)};
  };
  store.put(job("running", 2));
  store.put(job("queued", 1));
  store.put(job("undelivered", 3));
  store.put(job("done", 0));
  store.mark_running("running");
  store.complete("undelivered", {JobStatus::succeeded, 1, std::nullopt});
  store.update_callback("undelivered", {CallbackState::pending, 1, {}});
  store.complete("done", {JobStatus::succeeded, 1, std::nullopt});
  store.update_callback("done", {CallbackState::delivered, 1, {}});
  auto unfinished = store.list_unfinished(10);
  REQUIRE(unfinished.size() == 3);
  CHECK(unfinished[0].job.id == "queued");
  CHECK(unfinished[1].job.id == "running");
  CHECK(unfinished[2].job.id == "undelivered");
}
