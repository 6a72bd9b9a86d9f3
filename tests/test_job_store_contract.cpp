// The JobStore contract, one suite run against every store: the memory store, SQLite on a real
// file, and the failing fake while it works. A new store (Redis) adds its factory to the list.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>

#include "rebound/memory_job_store.hpp"
#include "rebound/sqlite_job_store.hpp"
#include "support/failing_store.hpp"
#include "support/temp_dir.hpp"

using rebound::CallbackState;
using rebound::Job;
using rebound::JobStatus;
using rebound::JobStore;
using rebound::PutOutcome;

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

using time_point = std::chrono::system_clock::time_point;

// Stores keep times to the millisecond.
time_point at_ms(long long ms) {
  return time_point(std::chrono::milliseconds(ms));
}

Job make(const std::string& id, long long created_ms = 1764000000000,
         const std::string& url = "http://example.com/cb",
         nlohmann::json input = {{"x", 1}, {"text", "naïve ✓"}}) {
  return Job{id, url, std::move(input), at_ms(created_ms)};
}

const rebound::JobOutcome succeeded{JobStatus::succeeded, {{"label", "setosa"}}, std::nullopt};

}  // namespace

#define STORES MemoryStore, SqliteStore, FailingStoreWhileItWorks

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

TEST_CASE_TEMPLATE("store contract: a record follows its job from queued to delivered", Factory,
                   STORES) {
  Factory factory;
  auto store = factory.make();
  CAPTURE(Factory::name);
  store->put(make("a"));
  store->mark_running("a");
  CHECK(store->get("a")->status == JobStatus::running);
  store->complete("a", succeeded);
  auto record = store->get("a");
  CHECK(record->status == JobStatus::succeeded);
  CHECK(record->outcome.result == nlohmann::json{{"label", "setosa"}});
  CHECK_FALSE(record->outcome.error.has_value());
  store->mark_running("a");  // a final job never moves back
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
  store->mark_running("missing");
  store->complete("missing", succeeded);
  store->update_callback("missing", {CallbackState::delivered, 1, {}});
  CHECK_FALSE(store->get("missing").has_value());
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
  store->mark_running("running");
  store->complete("undelivered", succeeded);
  store->update_callback("undelivered", {CallbackState::pending, 1, "HTTP 500"});
  store->complete("delivered", succeeded);
  store->update_callback("delivered", {CallbackState::delivered, 1, {}});
  store->complete("poll-only", succeeded);
  store->complete("given-up", succeeded);
  store->update_callback("given-up", {CallbackState::failed, 5, "HTTP 500"});

  std::vector<std::string> ids;
  for (const auto& r : store->list_unfinished(100))
    ids.push_back(r.job.id);
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
    ids.push_back(r.job.id);
  CHECK(ids == std::vector<std::string>{"job-3", "job-1", "job-0"});
  CHECK(store->list_failed_callbacks(1).front().job.id == "job-3");
  CHECK(store->list_failed_callbacks(1).front().callback.last_error == "HTTP 500");
  // Redelivery moves a job out of the list.
  store->update_callback("job-3", {CallbackState::pending, 5, {}});
  CHECK(store->list_failed_callbacks(100).size() == 2);
}
