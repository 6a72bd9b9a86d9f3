// The job API of the hosted platforms over HTTP (issue 14): priority, time in queue, queue
// position, started and finished times, trace context, and Ed25519-signed callbacks. A real
// Server, real receivers on loopback, the memory store and SQLite on a real file.
#include <doctest/doctest.h>

#include <condition_variable>
#include <ctime>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/use_future.hpp>

#include "rebound/delivery/webhook_signature.hpp"
#include "rebound/store/memory_job_store.hpp"
#include "rebound/store/sqlite_job_store.hpp"
#include "support/failing_store.hpp"
#include "support/fake_clock.hpp"
#include "support/held_model.hpp"
#include "support/quiesce.hpp"
#include "support/raw_client.hpp"
#include "support/receiver.hpp"
#include "support/server_harness.hpp"
#include "support/temp_dir.hpp"
#ifdef REBOUND_TEST_REDIS
#include "rebound/store/redis_job_store.hpp"
#include "support/redis_server.hpp"
#endif

using namespace std::chrono_literals;
using nlohmann::json;
using rebound::test::check_error;
using rebound::test::HarnessOptions;

namespace {

struct Harness : rebound::test::ServerHarness {
  // Held until opened; answers with its input as it is.
  explicit Harness(HarnessOptions o)
      : ServerHarness(std::make_unique<rebound::test::HeldModel>(
                          [](const json& input) { return rebound::Prediction::success(input); }),
                      o) {}
  ~Harness() { model->open(); }
  rebound::test::HeldModel* model = static_cast<rebound::test::HeldModel*>(model_ptr);
};

struct MemoryStore {
  static constexpr const char* name = "memory";
  std::function<std::unique_ptr<rebound::JobStore>()> factory() {
    return [] { return std::make_unique<rebound::MemoryJobStore>(); };
  }
};

struct SqliteStore {
  static constexpr const char* name = "sqlite";
  rebound::test::TempDir dir;
  std::function<std::unique_ptr<rebound::JobStore>()> factory() {
    return [path = dir.file("jobs.db")] { return std::make_unique<rebound::SqliteJobStore>(path); };
  }
};

#ifdef REBOUND_TEST_REDIS
struct RedisStore {
  static constexpr const char* name = "redis";
  rebound::test::RedisServer server;
  std::function<std::unique_ptr<rebound::JobStore>()> factory() {
    return [uri = server.uri()] {
      return std::make_unique<rebound::RedisJobStore>(rebound::parse_redis_uri(uri));
    };
  }
};
#define STORES MemoryStore, SqliteStore, RedisStore
#else
#define STORES MemoryStore, SqliteStore
#endif

HarnessOptions one_worker(std::function<std::unique_ptr<rebound::JobStore>()> store) {
  HarnessOptions o;
  o.workers = 1;
  o.make_store = std::move(store);
  return o;
}

}  // namespace

TEST_CASE_TEMPLATE("job api: jobs run by priority - FIFO within one - with their queue position",
                   Store, STORES) {
  Store store;
  CAPTURE(Store::name);
  Harness h(one_worker(store.factory()));
  // The only worker is busy with "blocker"; the rest wait in the queue.
  REQUIRE(h.submit({{"id", "blocker"}, {"input", "blocker"}})->status == 202);
  REQUIRE(h.model->wait_started(1));
  REQUIRE(h.submit({{"id", "low"}, {"input", "low"}, {"priority", 9}})->status == 202);
  REQUIRE(h.submit({{"id", "normal-1"}, {"input", "normal-1"}})->status == 202);
  REQUIRE(h.submit({{"id", "urgent"}, {"input", "urgent"}, {"priority", 0}})->status == 202);
  REQUIRE(h.submit({{"id", "normal-2"}, {"input", "normal-2"}, {"priority", 5}})->status == 202);

  const json urgent = h.poll("urgent");
  CHECK(urgent["status"] == "queued");
  CHECK(urgent["priority"] == 0);
  CHECK(urgent["queue_position"] == 0);
  CHECK(h.poll("normal-1")["queue_position"] == 1);
  CHECK(h.poll("normal-2")["queue_position"] == 2);
  CHECK(h.poll("low")["queue_position"] == 3);
  CHECK(h.poll("low")["priority"] == 9);
  CHECK_FALSE(urgent.contains("started_at"));
  const json blocker = h.poll("blocker");
  CHECK(blocker["status"] == "running");
  CHECK_FALSE(blocker.contains("queue_position"));
  CHECK(blocker["started_at"].is_string());
  CHECK_FALSE(blocker.contains("finished_at"));

  h.model->open();
  json done;
  REQUIRE(
      rebound::test::eventually([&] { return (done = h.poll("low"))["status"] == "succeeded"; }));
  CHECK(h.model->order() ==
        std::vector<std::string>{"blocker", "urgent", "normal-1", "normal-2", "low"});
  // Times are RFC 3339 and in order: created, started, finished.
  const std::string created = done["created_at"], started = done["started_at"],
                    finished = done["finished_at"];
  CHECK(created.size() == 24);
  CHECK(created <= started);
  CHECK(started <= finished);
  CHECK_FALSE(done.contains("queue_position"));
}

TEST_CASE_TEMPLATE("job api: a job not started within max_queue_seconds ends expired", Store,
                   STORES) {
  Store store;
  CAPTURE(Store::name);
  auto clock = std::make_shared<rebound::test::FakeClock>();
  HarnessOptions o = one_worker(store.factory());
  o.clock = rebound::test::clock_of(clock);
  Harness h(o);
  rebound::test::Receiver receiver;
  REQUIRE(h.submit({{"id", "blocker"}, {"input", "blocker"}})->status == 202);
  REQUIRE(h.model->wait_started(1));
  REQUIRE(h.submit({{"id", "impatient"},
                    {"input", "impatient"},
                    {"max_queue_seconds", 0.2},
                    {"callback_url", receiver.url()}})
              ->status == 202);
  REQUIRE(h.submit({{"id", "patient"}, {"input", "patient"}, {"max_queue_seconds", 60}})->status ==
          202);
  clock->advance(400ms);  // "impatient" waits past its 0.2 s behind "blocker"
  h.model->open();
  REQUIRE(receiver.wait_for(1));
  const json body = json::parse(receiver.received().at(0).body);
  CHECK(body["status"] == "expired");
  CHECK(body["error"]["code"] == "expired");
  const json state = h.wait_callback_final("impatient");
  CHECK(state["status"] == "expired");
  CHECK(state["finished_at"].is_string());
  CHECK_FALSE(state.contains("started_at"));  // it never ran
  json patient;
  REQUIRE(rebound::test::eventually(
      [&] { return (patient = h.poll("patient"))["status"] == "succeeded"; }));
  CHECK(h.model->order() == std::vector<std::string>{"blocker", "patient"});
}

TEST_CASE("job api: bad priority - max_queue_seconds and webhook_events get 422 with the field") {
  HarnessOptions o;
  Harness h(o);
  h.model->open();
  const std::pair<const char*, json> bad[] = {
      {"priority", 10},
      {"priority", -1},
      {"priority", 1.5},
      {"priority", "high"},
      {"priority", true},
      {"max_queue_seconds", 0},
      {"max_queue_seconds", -3},
      {"max_queue_seconds", "60"},
      {"max_queue_seconds", 1e9},
      {"webhook_events", json::array()},
      {"webhook_events", {"finished"}},
      {"webhook_events", "completed"},
      {"webhook_events", {"started", "completed", "started"}}};
  int n = 0;
  for (const auto& [field, value] : bad) {
    CAPTURE(value.dump());
    check_error(h.submit({{"id", "bad-" + std::to_string(n++)}, {field, value}}), 422,
                "invalid_field", field);
  }
  // null means the default; a resubmission with another priority is another request.
  REQUIRE(h.submit({{"id", "a"}, {"priority", nullptr}, {"max_queue_seconds", nullptr}})->status ==
          202);
  CHECK(h.submit({{"id", "a"}, {"priority", 5}})->status == 202);
  check_error(h.submit({{"id", "a"}, {"priority", 4}}), 409, "id_conflict", "id");
}

TEST_CASE("job api: traceparent goes from the submission to every callback attempt") {
  std::mutex lines_mutex;
  std::vector<json> lines;
  HarnessOptions o;
  o.max_tries = 3;
  o.logger =
      rebound::Logger(rebound::LogLevel::debug, [&](rebound::LogLevel, const std::string& line) {
        std::lock_guard<std::mutex> lock(lines_mutex);
        lines.push_back(json::parse(line));
      });
  Harness h(o);
  h.model->open();
  rebound::test::Receiver receiver;
  receiver.script_statuses({503});  // a second attempt: a new span of the same trace
  const std::string trace = "4bf92f3577b34da6a3ce929d0e0e4736";
  const std::string parent = "00-" + trace + "-00f067aa0ba902b7-01";
  auto c = h.client();
  const json job = {{"id", "traced"}, {"callback_url", receiver.url()}};
  auto res = c.Post("/v1/inferences", {{"traceparent", parent}}, job.dump(), "application/json");
  REQUIRE(res);
  REQUIRE(res->status == 202);
  REQUIRE(receiver.wait_for(2));
  std::set<std::string> spans;
  for (const auto& cb : receiver.received()) {
    const std::string header = cb.header("traceparent");
    CAPTURE(header);
    REQUIRE(header.size() == 55);
    CHECK(header.substr(0, 36) == "00-" + trace + "-");
    CHECK(header.substr(52) == "-01");
    CHECK(header.substr(36, 16) != "00f067aa0ba902b7");  // a new parent id: this request's span
    spans.insert(header.substr(36, 16));
  }
  CHECK(spans.size() == 2);
  // The log lines of the job name its trace; an attempt's, its own span too.
  const std::string first_span = receiver.received().at(0).header("traceparent").substr(36, 16);
  REQUIRE(rebound::test::eventually([&] {
    std::lock_guard<std::mutex> lock(lines_mutex);
    for (const auto& line : lines)
      if (line["event"] == "callback_delivered") return true;
    return false;
  }));
  {
    std::lock_guard<std::mutex> lock(lines_mutex);
    std::map<std::string, json> by_event;
    for (const auto& line : lines)
      if (line.value("job_id", "") == "traced") by_event[line["event"]] = line;
    CHECK(by_event["job_completed"]["trace_id"] == trace);
    CHECK(by_event["callback_attempt_failed"]["trace_id"] == trace);
    CHECK(by_event["callback_attempt_failed"]["span_id"] == first_span);
    CHECK(by_event["callback_delivered"]["trace_id"] == trace);
  }

  // An invalid header is ignored: the callback carries none.
  rebound::test::Receiver plain;
  const json other = {{"id", "untraced"}, {"callback_url", plain.url()}};
  for (const char* wrong : {"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "garbage"}) {
    CAPTURE(wrong);
    REQUIRE(c.Post("/v1/inferences", {{"traceparent", wrong}}, other.dump(), "application/json")
                ->status == 202);
  }
  REQUIRE(plain.wait_for(1));
  CHECK(plain.received().at(0).header("traceparent").empty());
}

TEST_CASE("job api: Ed25519-signed callbacks verify with the key GET /v1/webhook-keys publishes") {
  const std::string signing_key = rebound::generate_webhook_signing_key();
  HarnessOptions o;
  o.signing_secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", signing_key};
  o.api_keys = {"s3cret"};
  Harness h(o);
  h.model->open();
  // Public: no API key needed.
  auto keys = h.client().Get("/v1/webhook-keys");
  REQUIRE(keys);
  REQUIRE(keys->status == 200);
  const json published = json::parse(keys->body);
  REQUIRE(published == json({{"keys", {rebound::webhook_public_key(signing_key)}}}));

  h.bearer = "s3cret";
  rebound::test::Receiver receiver;
  REQUIRE(h.submit({{"id", "signed"}, {"callback_url", receiver.url()}})->status == 202);
  REQUIRE(receiver.wait_for(1));
  const auto cb = receiver.received().at(0);
  const std::string signature = cb.header("webhook-signature");
  CHECK(signature.rfind("v1,", 0) == 0);
  CHECK(signature.find(" v1a,") != std::string::npos);
  const auto now = static_cast<std::int64_t>(std::time(nullptr));
  CHECK(rebound::verify_webhook(published["keys"][0].get<std::string>(), cb.header("webhook-id"),
                                cb.header("webhook-timestamp"), cb.body, signature, now));
  CHECK(rebound::verify_webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", cb.header("webhook-id"),
                                cb.header("webhook-timestamp"), cb.body, signature, now));
  // A receiver holding another server's public key refuses it.
  const std::string stranger = rebound::webhook_public_key(rebound::generate_webhook_signing_key());
  CHECK_FALSE(rebound::verify_webhook(stranger, cb.header("webhook-id"),
                                      cb.header("webhook-timestamp"), cb.body, signature, now));

  // Without signing keys, the list is empty.
  Harness plain{HarnessOptions()};
  CHECK(json::parse(plain.client().Get("/v1/webhook-keys")->body) ==
        json({{"keys", json::array()}}));
}

TEST_CASE_TEMPLATE(
    "job api: DELETE cancels a queued job - it never runs - and its callback says so", Store,
    STORES) {
  Store store;
  CAPTURE(Store::name);
  auto clock = std::make_shared<rebound::test::FakeClock>();
  HarnessOptions o = one_worker(store.factory());
  o.clock = rebound::test::clock_of(clock);
  Harness h(o);
  rebound::test::Receiver receiver;
  REQUIRE(h.submit({{"id", "blocker"}, {"input", "blocker"}})->status == 202);
  REQUIRE(h.model->wait_started(1));
  REQUIRE(
      h.submit({{"id", "victim"}, {"input", "victim"}, {"callback_url", receiver.url()}})->status ==
      202);
  auto res = h.client().Delete("/v1/inferences/victim");
  REQUIRE(res);
  CHECK(res->status == 200);
  const json body = json::parse(res->body);
  CHECK(body["id"] == "victim");
  CHECK(body["status"] == "cancelled");
  CHECK(body["error"]["code"] == "cancelled");
  CHECK(body["finished_at"].is_string());
  // Its callback: once, "cancelled", before the worker is even free.
  REQUIRE(receiver.wait_for(1));
  const json cb = json::parse(receiver.received().at(0).body);
  CHECK(cb["id"] == "victim");
  CHECK(cb["status"] == "cancelled");
  CHECK(h.wait_callback_final("victim")["callback"]["state"] == "delivered");
  // Twice: it is final now.
  check_error(h.client().Delete("/v1/inferences/victim"), 409, "already_finished");
  check_error(h.client().Delete("/v1/inferences/nobody"), 404, "not_found");
  check_error(h.client().Delete("/v1/inferences/bad%20id"), 404, "not_found");

  h.model->open();
  REQUIRE(rebound::test::eventually([&] { return h.poll("blocker")["status"] == "succeeded"; }));
  check_error(h.client().Delete("/v1/inferences/blocker"), 409, "already_finished");
  REQUIRE(rebound::test::quiesce(*h.service));  // the worker took "victim" and dropped it
  CHECK(h.model->order() == std::vector<std::string>{"blocker"});
  CHECK(h.poll("victim")["status"] == "cancelled");
  CHECK(receiver.received().size() == 1);
  const std::string metrics = h.client().Get("/metrics")->body;
  CHECK(metrics.find("rebound_jobs_completed_total{status=\"cancelled\"} 1") != std::string::npos);
  CHECK(h.service->telemetry().in_flight() == 0);  // the dropped job gave its slot back
}

TEST_CASE_TEMPLATE("job api: DELETE tells a running model through its cancellation flag", Store,
                   STORES) {
  Store store;
  CAPTURE(Store::name);
  Harness h(one_worker(store.factory()));
  rebound::test::Receiver receiver;
  REQUIRE(h.submit({{"id", "long"}, {"input", "cooperative"}, {"callback_url", receiver.url()}})
              ->status == 202);
  REQUIRE(h.model->wait_started(1));
  REQUIRE(rebound::test::eventually([&] { return h.poll("long")["status"] == "running"; }));
  auto res = h.client().Delete("/v1/inferences/long");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  CHECK(json::parse(res->body)["status"] == "cancelled");
  // The model saw the flag and returned early; its answer was thrown away.
  REQUIRE(rebound::test::eventually([&] { return h.model->stopped_early() == 1; }));
  REQUIRE(receiver.wait_for(1));
  CHECK(json::parse(receiver.received().at(0).body)["status"] == "cancelled");
  const json state = h.wait_callback_final("long");
  CHECK(state["status"] == "cancelled");
  CHECK(state["error"]["code"] == "cancelled");
  CHECK(state["started_at"].is_string());
  REQUIRE(rebound::test::quiesce(*h.service));
  CHECK(receiver.received().size() == 1);  // never a second, "failed" or "succeeded", callback
  CHECK(h.client().Get("/metrics")->body.find("rebound_results_discarded_total 1") !=
        std::string::npos);
  // The worker is free for the next job.
  h.model->open();
  REQUIRE(h.submit({{"id", "next"}, {"input", "next"}})->status == 202);
  REQUIRE(rebound::test::eventually([&] { return h.poll("next")["status"] == "succeeded"; }));
}

TEST_CASE("job api: webhook_events - started sends a running callback - completed is the default") {
  HarnessOptions o;
  Harness h(o);
  rebound::test::Receiver both, started_only, completed_only;
  REQUIRE(h.submit({{"id", "both"},
                    {"input", "both"},
                    {"callback_url", both.url()},
                    {"webhook_events", {"started", "completed"}}})
              ->status == 202);
  REQUIRE(h.model->wait_started(1));
  // While it runs: the started callback, and nothing else.
  REQUIRE(both.wait_for(1));
  auto first = both.received().at(0);
  CHECK(json::parse(first.body) == json({{"id", "both"},
                                         {"status", "running"},
                                         {"model", {{"name", "held"}, {"version", "1"}}}}));
  // Its own webhook-id, which no job's final callback can have ('~' is in no id).
  CHECK(first.header("webhook-id") == "msg_both~started");
  h.model->open();
  REQUIRE(both.wait_for(2));
  auto second = both.received().at(1);
  CHECK(json::parse(second.body)["status"] == "succeeded");
  CHECK(second.header("webhook-id") == "msg_both");

  REQUIRE(h.submit({{"id", "started-only"},
                    {"input", "s"},
                    {"callback_url", started_only.url()},
                    {"webhook_events", {"started"}}})
              ->status == 202);
  REQUIRE(
      h.submit({{"id", "completed-only"}, {"input", "c"}, {"callback_url", completed_only.url()}})
          ->status == 202);
  REQUIRE(started_only.wait_for(1));
  REQUIRE(completed_only.wait_for(1));
  json state;
  REQUIRE(rebound::test::eventually(
      [&] { return (state = h.poll("started-only"))["status"] == "succeeded"; }));
  CHECK(state["callback"]["state"] == "none");  // nobody hears its end
  REQUIRE(rebound::test::quiesce(*h.service));
  CHECK(started_only.received().size() == 1);
  CHECK(json::parse(started_only.received().at(0).body)["status"] == "running");
  CHECK(completed_only.received().size() == 1);
  CHECK(json::parse(completed_only.received().at(0).body)["status"] == "succeeded");
}

TEST_CASE("job api: Prefer wait answers 200 with the final status when it comes in time") {
  HarnessOptions o;
  Harness h(o);
  auto c = h.client();
  // Final within the wait: 200 and the status body, result inline.
  std::thread opener([&] {
    h.model->wait_started(1);
    std::this_thread::sleep_for(200ms);
    h.model->open();
  });
  const json job = {{"id", "quick"}, {"input", "quick"}};
  auto res = c.Post("/v1/inferences", {{"Prefer", "respond-async, wait=10"}}, job.dump(),
                    "application/json");
  opener.join();
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Preference-Applied") == "wait=10");
  const json body = json::parse(res->body);
  CHECK(body["status"] == "succeeded");
  CHECK(body["result"] == "quick");

  // A poll with a wait, for a job already final: at once.
  res = c.Get("/v1/inferences/quick", {{"Prefer", "wait=5"}});
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(json::parse(res->body)["status"] == "succeeded");

  // A wait of any length is the longest (60 s), however many digits it has.
  for (const std::string wait : {"61", "999999999", "99999999999999999999"}) {
    CAPTURE(wait);
    res = c.Get("/v1/inferences/quick", {{"Prefer", "wait=" + wait}});
    REQUIRE(res);
    CHECK(res->status == 200);
    CHECK(res->get_header_value("Preference-Applied") == "wait=60");
  }
  // Leading zeros are no length: 0 is 0.
  res = c.Get("/v1/inferences/quick", {{"Prefer", "wait=0000000000"}});
  REQUIRE(res);
  CHECK(res->get_header_value("Preference-Applied") == "wait=0");

  // Unknown: 404 at once.
  check_error(c.Get("/v1/inferences/nobody", {{"Prefer", "wait=5"}}), 404, "not_found");
  // A wait that is not a number is no preference: 202 at once.
  res = c.Post("/v1/inferences", {{"Prefer", "wait=soon"}}, json({{"id", "plain"}}).dump(),
               "application/json");
  REQUIRE(res);
  CHECK(res->status == 202);
  CHECK_FALSE(res->has_header("Preference-Applied"));
}

TEST_CASE("job api: Prefer wait gives up after N seconds with the usual answer") {
  HarnessOptions o;
  o.workers = 1;
  Harness h(o);
  auto c = h.client();
  const auto started = std::chrono::steady_clock::now();
  auto res = c.Post("/v1/inferences", {{"Prefer", "wait=1"}}, json({{"id", "slow"}}).dump(),
                    "application/json");
  REQUIRE(res);
  CHECK(res->status == 202);
  CHECK(res->get_header_value("Preference-Applied") == "wait=1");
  CHECK(std::chrono::steady_clock::now() - started >= 900ms);
  // A poll that waits: the job finishes during it.
  std::thread opener([&] {
    std::this_thread::sleep_for(300ms);
    h.model->open();
  });
  res = c.Get("/v1/inferences/slow", {{"Prefer", "wait=10"}});
  opener.join();
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(json::parse(res->body)["status"] == "succeeded");
}

TEST_CASE("job api: a job starved by higher priorities still expires on time") {
  Harness h(one_worker({}));
  rebound::test::Receiver receiver;
  REQUIRE(h.submit({{"id", "blocker"}, {"input", "blocker"}})->status == 202);
  REQUIRE(h.model->wait_started(1));
  REQUIRE(h.submit({{"id", "starved"},
                    {"input", "starved"},
                    {"priority", 9},
                    {"max_queue_seconds", 0.3},
                    {"callback_url", receiver.url()}})
              ->status == 202);
  // The only worker stays busy: the queue's sweep, not a worker, ends it.
  REQUIRE(receiver.wait_for(1, 10s));  // (0.3 s and a sweep: on time, with room for sanitizers)
  CHECK(json::parse(receiver.received().at(0).body)["status"] == "expired");
  CHECK(h.poll("starved")["status"] == "expired");
  CHECK(h.poll("blocker")["status"] == "running");
  CHECK(h.model->order() == std::vector<std::string>{"blocker"});
}

TEST_CASE(
    "job api: a cancelled queued job gives its queue slot back without waiting for a worker") {
  HarnessOptions o = one_worker({});
  o.capacity = 2;
  Harness h(o);
  REQUIRE(h.submit({{"id", "blocker"}, {"input", "blocker"}})->status == 202);
  REQUIRE(h.model->wait_started(1));
  REQUIRE(h.submit({{"id", "victim"}, {"input", "victim"}})->status == 202);
  check_error(h.submit({{"id", "refused"}}), 503, "queue_full");
  REQUIRE(h.client().Delete("/v1/inferences/victim")->status == 200);
  REQUIRE(rebound::test::eventually([&] { return h.service->telemetry().in_flight() == 1; }));
  CHECK(h.submit({{"id", "after"}, {"input", "after"}})->status == 202);
  h.model->open();
  REQUIRE(rebound::test::eventually([&] { return h.poll("after")["status"] == "succeeded"; }));
  CHECK(h.model->order() == std::vector<std::string>{"blocker", "after"});
}

TEST_CASE("job api: a Prefer wait holds no thread - one HTTP thread still answers while it waits") {
  HarnessOptions o;
  o.http_threads = 1;
  Harness h(o);  // the model stays closed: the job never finishes
  const auto started = std::chrono::steady_clock::now();
  auto waiting = std::async(std::launch::async, [&] {
    // (5 s: time for the checks below within the wait, under a sanitizer's slowdown too.)
    return h.client().Post("/v1/inferences", {{"Prefer", "wait=5"}}, json({{"id", "j"}}).dump(),
                           "application/json");
  });
  REQUIRE(rebound::test::eventually([&] { return h.service->telemetry().in_flight() == 1; }));
  // (Accepted is not yet started: the worker marks it running as the model takes it.)
  REQUIRE(h.model->wait_started(1));
  // The only HTTP thread is free: /ping and a poll answer at once while the submission waits.
  CHECK(h.client().Get("/ping")->status == 200);
  CHECK(h.poll("j")["status"] == "running");  // held by the closed model
  CHECK(waiting.wait_for(0s) == std::future_status::timeout);
  auto res = waiting.get();
  REQUIRE(res);
  CHECK(res->status == 202);  // not final within its 5 s: the usual answer, after the wait
  CHECK(res->get_header_value("Preference-Applied") == "wait=5");
  CHECK(std::chrono::steady_clock::now() - started >= 5s);
}

TEST_CASE("job api: a submission waiting for its store holds no thread - 202 once it is stored") {
  auto gate = std::make_shared<rebound::test::FailingStore::Switch>();
  gate->puts.close();
  HarnessOptions o;
  o.http_threads = 1;
  o.make_store = [gate] { return std::make_unique<rebound::test::FailingStore>(gate); };
  Harness h(o);
  h.model->open();
  auto submitted = std::async(std::launch::async, [&] { return h.submit({{"id", "j"}}); });
  REQUIRE(rebound::test::eventually([&] { return gate->puts.waiting() == 1; }));
  // The only HTTP thread is free while the store has the job: /ping and a poll answer at once.
  CHECK(h.client().Get("/ping")->status == 200);
  CHECK(h.client().Get("/v1/inferences/j")->status == 404);  // not stored yet
  CHECK(submitted.wait_for(0s) == std::future_status::timeout);
  gate->puts.open();
  auto res = submitted.get();
  REQUIRE(res);
  CHECK(res->status == 202);
  CHECK(res->get_header_value("Location") == "/v1/inferences/j");
  REQUIRE(rebound::test::eventually([&] { return h.poll("j")["status"] == "succeeded"; }));
}

TEST_CASE("job api: a poll that waits for its store runs on a store-call thread - /ping answers") {
  auto gate = std::make_shared<rebound::test::FailingStore::Switch>();
  HarnessOptions o;
  o.http_threads = 1;
  o.store_call_threads = 2;
  o.make_store = [gate] { return std::make_unique<rebound::test::FailingStore>(gate); };
  Harness h(o);
  h.model->open();
  REQUIRE(h.submit({{"id", "j"}})->status == 202);
  gate->reads.close();
  auto polled = std::async(std::launch::async, [&] { return h.client().Get("/v1/inferences/j"); });
  REQUIRE(rebound::test::eventually([&] { return gate->reads.waiting() >= 1; }));
  // The front's only thread is free while the poll waits: /ping and a submission answer.
  CHECK(h.client().Get("/ping")->status == 200);
  CHECK(h.submit({{"id", "k"}})->status == 202);
  CHECK(polled.wait_for(0s) == std::future_status::timeout);
  gate->reads.open();
  auto res = polled.get();
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(json::parse(res->body)["id"] == "j");
}

TEST_CASE("job api: a poll's wait that ran out reads the store on a store-call thread - /ping") {
  auto gate = std::make_shared<rebound::test::FailingStore::Switch>();
  HarnessOptions o;
  o.http_threads = 1;
  o.store_call_threads = 2;
  o.make_store = [gate] { return std::make_unique<rebound::test::FailingStore>(gate); };
  Harness h(o);  // the model stays closed: the job runs on
  REQUIRE(h.submit({{"id", "j"}})->status == 202);
  REQUIRE(h.model->wait_started(1));
  // Every read waits from here (a Redis far away): the wait's first look (on the queue's pump),
  // then, its second over, the answer's read of the job as it is.
  const auto reads_closed = gate->reads.closed_while_in_scope();
  auto polled = std::async(std::launch::async, [&] {
    return h.client().Get("/v1/inferences/j", {{"Prefer", "wait=1"}});
  });
  REQUIRE(rebound::test::eventually([&] { return gate->reads.waiting() >= 2; }));
  // The front's only thread is free while the answer waits for its read.
  auto ping = std::async(std::launch::async, [&] { return h.client().Get("/ping"); });
  REQUIRE(ping.wait_for(5s) == std::future_status::ready);
  auto pong = ping.get();
  REQUIRE(pong);
  CHECK(pong->status == 200);
  CHECK(polled.wait_for(0s) == std::future_status::timeout);
  gate->reads.open();
  auto res = polled.get();
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Preference-Applied") == "wait=1");
  CHECK(json::parse(res->body)["status"] == "running");
  h.model->open();
}

TEST_CASE("job api: a Server that goes while a submission waits for its store - nothing breaks") {
  auto gate = std::make_shared<rebound::test::FailingStore::Switch>();
  gate->puts.close();
  HarnessOptions o;
  o.make_store = [gate] { return std::make_unique<rebound::test::FailingStore>(gate); };
  Harness h(o);
  h.model->open();
  auto submitted = std::async(std::launch::async, [&] { return h.submit({{"id", "late"}}); });
  REQUIRE(rebound::test::eventually([&] { return gate->puts.waiting() == 1; }));
  h.server->stop();
  h.server_thread.join();
  h.server.reset();
  // The store answers with the Server gone: the queue takes the job, nobody is answered.
  gate->puts.open();
  REQUIRE(rebound::test::eventually([&] { return h.service->find("late").has_value(); }));
  CHECK(h.service->async_wait("late", boost::asio::use_future).get().status ==
        rebound::JobStatus::succeeded);
  auto res = submitted.get();
  CHECK((!res || res->status == 500));  // the connection ended unanswered, or the front's 500
}

TEST_CASE(
    "job api: a stopping Server answers its waits - the queue ends their registrations later") {
  Harness h({});  // the model stays closed: the job never finishes while the Server stands
  REQUIRE(h.submit({{"id", "j"}})->status == 202);
  auto short_wait = std::async(std::launch::async, [&] {
    // (Long enough for both waits to be seen waiting under a sanitizer's slowdown.)
    return h.client().Get("/v1/inferences/j", {{"Prefer", "wait=3"}});
  });
  auto long_wait = std::async(std::launch::async, [&] {
    return h.client().Get("/v1/inferences/j", {{"Prefer", "wait=30"}});
  });
  REQUIRE(rebound::test::eventually([&] {
    auto metrics = h.client().Get("/metrics");
    return metrics && metrics->body.find("rebound_http_waiting 2") != std::string::npos;
  }));
  h.server->stop();
  h.server_thread.join();
  h.server.reset();  // the waits' registrations in the queue outlive it
  // A stopping Server answers its waits at once, with the job as it is then.
  for (auto* wait : {&short_wait, &long_wait}) {
    auto res = wait->get();
    REQUIRE(res);
    CHECK(res->status == 200);
    CHECK(json::parse(res->body)["status"] == "running");
  }
  std::this_thread::sleep_for(3500ms);  // past the short wait's time, with no Server
  h.model->open();                      // the job ends: the queue completes both registrations
  REQUIRE(rebound::test::eventually([&] { return h.service->telemetry().in_flight() == 0; }));
}

TEST_CASE("job api: a client gone while its request waits gives its connection and place back") {
  HarnessOptions o;
  o.max_waiters = 5;
  Harness h(o);  // the model stays closed: the job never finishes
  REQUIRE(h.submit({{"id", "j"}})->status == 202);
  auto gauge = [&](const std::string& name) {
    auto metrics = h.client().Get("/metrics");
    REQUIRE(metrics);
    const auto at = metrics->body.find("\n" + name + " ");
    REQUIRE(at != std::string::npos);
    return std::stoul(metrics->body.substr(at + name.size() + 2));
  };
  // Twenty clients ask to wait and hang up at once: more than max_waiters.
  for (int i = 0; i < 20; ++i) {
    rebound::test::RawConnection c(h.port);
    REQUIRE(c.send("GET /v1/inferences/j HTTP/1.1\r\nHost: x\r\nPrefer: wait=30\r\n\r\n"));
  }
  CHECK(rebound::test::eventually([&] {
    return gauge("rebound_http_waiting") == 0 && gauge("rebound_http_connections") <= 1;
  }));
  // A client that stays is served as if they had never come.
  auto res = h.client().Get("/v1/inferences/j", {{"Prefer", "wait=1"}});
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Preference-Applied") == "wait=1");
}

TEST_CASE("job api: a store that fails during a Prefer wait leaves the accepted job answered 202") {
  auto control = std::make_shared<rebound::test::FailingStore::Switch>();
  HarnessOptions o;
  o.make_store = [control] { return std::make_unique<rebound::test::FailingStore>(control); };
  Harness h(o);              // the model stays closed: the job never finishes
  std::thread breaker([&] {  // the store fails once the job is stored, while the request waits
    rebound::test::eventually([&] { return h.service->find("accepted").has_value(); });
    control->fail();
  });
  auto res = h.client().Post("/v1/inferences", {{"Prefer", "wait=3"}},
                             json({{"id", "accepted"}}).dump(), "application/json");
  breaker.join();
  REQUIRE(res);
  CHECK(res->status == 202);  // stored before the store failed: accepted, not store_unavailable
  CHECK(json::parse(res->body)["id"] == "accepted");
  control->heal();
}
