// The whole pipeline over HTTP: a real rebound::Server and a real receiver on loopback.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include "rebound/delivery/curl_transport.hpp"
#include "rebound/delivery/webhook_signature.hpp"
#include "rebound/http/server.hpp"
#include "rebound/store/memory_job_store.hpp"
#include "rebound/version.hpp"
#include "support/fake_clock.hpp"
#include "support/held_model.hpp"
#include "support/receiver.hpp"
#include "support/server_harness.hpp"
#include "support/submitting.hpp"
#include "support/temp_dir.hpp"
#ifdef REBOUND_TEST_REDIS
#include "rebound/store/make_store.hpp"
#include "support/redis_server.hpp"
#endif

using namespace std::chrono_literals;
using nlohmann::json;
using rebound::test::check_error;
using rebound::test::HarnessOptions;

namespace {

// Answers as the HeldModel does, but "throw" throws and "bad" is refused by the model.
rebound::Prediction echo_or_fail(const json& input) {
  if (input == "throw") throw std::runtime_error("weights missing");
  if (input == "bad") return rebound::Prediction::failure("invalid_input", "input must not be bad");
  return rebound::Prediction::success({{"echo", input}});
}

// The shared harness, around a HeldModel that tests open and close.
struct Harness : rebound::test::ServerHarness {
  explicit Harness(HarnessOptions o = HarnessOptions())
      : ServerHarness(std::make_unique<rebound::test::HeldModel>(echo_or_fail), o) {
    if (o.open_model) model->open();
  }
  ~Harness() { model->open(); }  // nothing may stay blocked while the server stops
  rebound::test::HeldModel* model = static_cast<rebound::test::HeldModel*>(model_ptr);
};

// An echo JobQueue with default options and an io_context nobody runs, for a Server of the test's
// own making (its defaults, its port, its run and stop).
struct BareService {
  ~BareService() {
    service.shutdown(std::chrono::seconds(5));
    pool.join();
  }
  boost::asio::thread_pool pool{1};
  boost::asio::io_context io;
  rebound::JobQueue service{pool.get_executor(), io.get_executor(),
                            std::make_unique<rebound::EchoModel>(),
                            std::make_unique<rebound::MemoryJobStore>(),
                            std::make_unique<rebound::CurlTransport>(io.get_executor())};
};

}  // namespace

TEST_CASE("the seed's request is answered Received and its result is called back") {
  Harness h;
  rebound::test::Receiver receiver;
  auto res = h.submit({{"id", "1234"}, {"callback_url", receiver.url("/v1/results")}});
  REQUIRE(res);
  CHECK(res->status == 202);
  CHECK(json::parse(res->body) ==
        json({{"message", "Received"}, {"id", "1234"}, {"status_url", "/v1/inferences/1234"}}));
  CHECK(res->get_header_value("Location") == "/v1/inferences/1234");

  REQUIRE(receiver.wait_for(1));
  const auto cb = receiver.received().at(0);
  CHECK(cb.path == "/v1/results");
  CHECK(json::parse(cb.body) == json({{"id", "1234"},
                                      {"status", "succeeded"},
                                      {"model", {{"name", "held"}, {"version", "1"}}},
                                      {"result", {{"echo", nullptr}}}}));
  CHECK(cb.header("Content-Type") == "application/json");
  CHECK(cb.header("User-Agent") == std::string("rebound/") + rebound::version);
  CHECK(cb.header("webhook-id") == "msg_1234");
  const long long ts = std::stoll(cb.header("webhook-timestamp"));
  CHECK(std::abs(ts - static_cast<long long>(std::time(nullptr))) < 60);
  CHECK(cb.header("webhook-signature").empty());  // no secret configured

  const json state = h.wait_callback_final("1234");
  CHECK(state["status"] == "succeeded");
  CHECK(state["result"] == json({{"echo", nullptr}}));
  CHECK(state["callback"]["state"] == "delivered");
  CHECK(state["callback"]["attempts"] == 1);
  CHECK(state["callback"]["url"] == receiver.url("/v1/results"));
  CHECK(state["created_at"].get<std::string>().size() == 24);
}

TEST_CASE("every answer that carries a job or a result says Cache-Control: no-store") {
  Harness h;
  auto no_store = [](const httplib::Result& res) {
    REQUIRE(res);
    return res->get_header_value("Cache-Control") == "no-store" &&
           res->get_header_value_count("Cache-Control") == 1;
  };
  CHECK(no_store(h.submit({{"id", "c1"}, {"input", 1}})));
  CHECK(no_store(h.client().Get("/v1/inferences/c1")));
  CHECK(no_store(h.client().Get("/v1/inferences/c1", {{"Prefer", "wait=1"}})));
  CHECK(no_store(h.client().Get("/v1/inferences/nothing")));  // errors too
  CHECK(no_store(
      h.client().Post("/v1/inferences:batch", R"({"jobs": [{"id": "c2"}]})", "application/json")));
  CHECK(no_store(h.client().Post("/invocations", "3", "application/json")));
  CHECK(no_store(h.client().Get("/v1/inferences?callback_state=failed")));
  CHECK_FALSE(no_store(h.client().Get("/ping")));
}

TEST_CASE("a job without a callback is kept for polling") {
  Harness h;
  auto res = h.submit({{"id", "poll-me"}, {"input", {1, 2, 3}}});
  REQUIRE(res);
  CHECK(res->status == 202);
  json state;
  REQUIRE(rebound::test::eventually(
      [&] { return (state = h.poll("poll-me"))["status"] == "succeeded"; }));
  CHECK(state["result"] == json({{"echo", {1, 2, 3}}}));
  CHECK(state["callback"] == json({{"url", nullptr}, {"state", "none"}, {"attempts", 0}}));
}

TEST_CASE("polling shows queued and running jobs before they finish") {
  Harness h({1, 100, 5, false});
  REQUIRE(h.submit({{"id", "first"}})->status == 202);
  REQUIRE(h.submit({{"id", "second"}})->status == 202);
  REQUIRE(rebound::test::eventually([&] { return h.model->started() == 1; }));
  CHECK(h.poll("first")["status"] == "running");
  CHECK(h.poll("second")["status"] == "queued");
  CHECK_FALSE(h.poll("second").contains("result"));
  h.model->open();
  REQUIRE(rebound::test::eventually([&] { return h.poll("second")["status"] == "succeeded"; }));
}

TEST_CASE("a failing model ends the job failed - and the callback says why") {
  Harness h;
  rebound::test::Receiver receiver;
  REQUIRE(h.submit({{"id", "bad"}, {"callback_url", receiver.url()}, {"input", "bad"}})->status ==
          202);
  REQUIRE(
      h.submit({{"id", "throws"}, {"callback_url", receiver.url()}, {"input", "throw"}})->status ==
      202);
  REQUIRE(receiver.wait_for(2));
  std::map<std::string, json> bodies;
  for (const auto& r : receiver.received()) {
    auto b = json::parse(r.body);
    bodies[b["id"]] = b;
  }
  CHECK(bodies["bad"] ==
        json({{"id", "bad"},
              {"status", "failed"},
              {"model", {{"name", "held"}, {"version", "1"}}},
              {"error", {{"code", "invalid_input"}, {"message", "input must not be bad"}}}}));
  CHECK(bodies["throws"]["status"] == "failed");
  CHECK(bodies["throws"]["error"]["code"] == "model_error");
  CHECK(bodies["throws"]["error"]["message"].get<std::string>().find("weights missing") !=
        std::string::npos);
  CHECK(h.poll("throws")["error"]["code"] == "model_error");
  // The worker survived: the next job still runs.
  REQUIRE(h.submit({{"id", "after"}, {"callback_url", receiver.url()}})->status == 202);
  CHECK(receiver.wait_for(3));
}

TEST_CASE(
    "a job that breaks a rule is refused over HTTP exactly as from C++ - field and sentence") {
  HarnessOptions o;
  o.allow_private_callbacks = false;  // rebound-server's default: the SSRF literal check refuses
  Harness h(o);
  struct Case {
    json body;  // the fields beside "input"
    rebound::Job job;
  };
  auto with = [](auto change) {
    rebound::Job j = rebound::make_job("ok", 1);
    change(j);
    return j;
  };
  const std::vector<Case> cases = {
      {{{"id", "acme/42"}}, rebound::make_job("acme/42", 1)},
      {{{"id", std::string(129, 'x')}}, rebound::make_job(std::string(129, 'x'), 1)},
      {{{"id", "ok"}, {"callback_url", "ftp://hooks.example.com/x"}},
       rebound::make_job("ok", 1, "ftp://hooks.example.com/x")},
      {{{"id", "ok"}, {"callback_url", "http://127.0.0.1:9/x"}},
       rebound::make_job("ok", 1, "http://127.0.0.1:9/x")},
      {{{"id", "ok"}, {"callback_url", "http://[::1]/x"}},
       rebound::make_job("ok", 1, "http://[::1]/x")},
      {{{"id", "ok"}, {"priority", 10}}, with([](rebound::Job& j) { j.priority = 10; })},
      {{{"id", "ok"}, {"priority", -1}}, with([](rebound::Job& j) { j.priority = -1; })},
      // 2^32 + 5 would be 5 if it were cut to an int: it is refused as out of range.
      {{{"id", "ok"}, {"priority", 4294967301LL}},
       with([](rebound::Job& j) { j.priority = 1000; })},
      {{{"id", "ok"}, {"max_queue_seconds", 8 * 86400}},
       with([](rebound::Job& j) { j.max_queue = std::chrono::hours(24 * 8); })},
      {{{"id", "ok"}, {"max_queue_seconds", 1e300}},
       with([](rebound::Job& j) { j.max_queue = std::chrono::hours(24 * 8); })},
      {{{"id", "ok"}, {"webhook_events", json::array()}},
       with([](rebound::Job& j) { j.webhook_events = 0; })},
      // Two faults: the one the rules look at first is told, both ways.
      {{{"id", "ok"}, {"callback_url", "http://127.0.0.1:9/x"}, {"max_queue_seconds", -1}},
       with([](rebound::Job& j) {
         j.callback_url = "http://127.0.0.1:9/x";
         j.max_queue = std::chrono::milliseconds(-1000);
       })},
      {{{"id", "ok"}, {"priority", 10}, {"webhook_events", {"bogus"}}}, with([](rebound::Job& j) {
         j.priority = 10;
         j.webhook_events = 4;
       })},
      {{{"id", "ok"}, {"priority", "high"}, {"max_queue_seconds", 1e9}}, with([](rebound::Job& j) {
         j.priority = 10;
         j.max_queue = std::chrono::hours(24 * 8);
       })},
  };
  for (const Case& c : cases) {
    json body = c.body;
    body["input"] = 1;
    CAPTURE(body.dump());
    auto res = h.client().Post("/v1/inferences", body.dump(), "application/json");
    REQUIRE(res);
    CHECK(res->status == 422);
    const json error = json::parse(res->body)["error"];
    rebound::Submitted why;
    CHECK(rebound::test::submitted(*h.service, c.job, &why) == "invalid_job");
    CHECK(error["code"] == why.reason.code);
    CHECK(error["field"] == why.field);
    CHECK(error["message"] == why.reason.message);
  }
  CHECK(h.service->telemetry().in_flight() == 0);
  // Events are a set of at most two names: a name given twice is that name.
  auto res = h.client().Post(
      "/v1/inferences", json({{"id", "twice"}, {"webhook_events", {"started", "started"}}}).dump(),
      "application/json");
  REQUIRE(res);
  CHECK(res->status == 202);
}

TEST_CASE("resubmitting the same request is idempotent - a different one is a 409") {
  Harness h;
  rebound::test::Receiver receiver;
  const json job = {{"id", "same"}, {"callback_url", receiver.url()}, {"input", {{"x", 1}}}};
  REQUIRE(h.submit(job)->status == 202);
  REQUIRE(receiver.wait_for(1));
  auto again = h.submit(job);
  REQUIRE(again);
  CHECK(again->status == 202);
  CHECK(json::parse(again->body)["message"] == "Received");

  json other = job;
  other["input"] = {{"x", 2}};
  check_error(h.submit(other), 409, "id_conflict", "id");
  other = job;
  other["callback_url"] = receiver.url("/elsewhere");
  check_error(h.submit(other), 409, "id_conflict", "id");

  // A later job is called back after the resubmission would have been; still one callback for it.
  REQUIRE(h.submit({{"id", "barrier"}, {"callback_url", receiver.url()}})->status == 202);
  REQUIRE(receiver.wait_for(2));
  h.wait_callback_final("barrier");
  REQUIRE(h.service->shutdown(10s));
  int same = 0;
  for (const auto& r : receiver.received())
    same += json::parse(r.body)["id"] == "same";
  CHECK(same == 1);
  CHECK(h.poll("same")["callback"]["attempts"] == 1);
}

TEST_CASE("every bad request gets its status and error body") {
  Harness h;
  auto post = [&](const std::string& body) {
    return h.client().Post("/v1/inferences", body, "application/json");
  };
  check_error(post("not json"), 400, "invalid_json");
  check_error(post("[1,2,3]"), 400, "invalid_json");
  check_error(post(""), 400, "invalid_json");
  check_error(post("{}"), 422, "invalid_field", "id");
  check_error(post(R"({"id": 7})"), 422, "invalid_field", "id");
  check_error(post(R"({"id": "no spaces allowed"})"), 422, "invalid_field", "id");
  check_error(post(R"({"id": "a", "callback_url": "ftp://example.com/x"})"), 422, "invalid_field",
              "callback_url");
  check_error(post(R"({"id": "a", "callback_url": 5})"), 422, "invalid_field", "callback_url");
  check_error(post(std::string(6291456 + 10, ' ')), 413, "payload_too_large");
  check_error(h.client().Get("/v1/inferences/unknown"), 404, "not_found");
  check_error(h.client().Get("/v1/inferences/bad%20id"), 404, "not_found");
  check_error(h.client().Get("/no/such/route"), 404, "not_found");
  // None of them took the server down.
  CHECK(h.client().Get("/ping")->status == 200);
}

TEST_CASE("the server refuses internal callback addresses by default") {
  BareService bare;
  rebound::JobQueue& service = bare.service;
  rebound::Server server(service, {"127.0.0.1", 0});
  const int port = server.bind();
  std::thread t([&] { server.run(); });
  httplib::Client c("127.0.0.1", port);
  check_error(
      c.Post("/v1/inferences", R"({"id":"a","callback_url":"http://169.254.169.254/latest"})",
             "application/json"),
      422, "invalid_field", "callback_url");
  check_error(
      c.Post("/v1/inferences", R"({"id":"a","callback_url":"http://[::ffff:127.0.0.1]:80/"})",
             "application/json"),
      422, "invalid_field", "callback_url");
  server.stop();
  t.join();
}

TEST_CASE("callbacks are retried after 5xx and after connection refused - then delivered") {
  Harness h;
  SUBCASE("5xx") {
    rebound::test::Receiver receiver;
    receiver.script_statuses({500, 502});
    REQUIRE(h.submit({{"id", "retry-5xx"}, {"callback_url", receiver.url()}})->status == 202);
    const json state = h.wait_callback_final("retry-5xx");
    CHECK(state["callback"]["state"] == "delivered");
    CHECK(state["callback"]["attempts"] == 3);
    CHECK(receiver.count() == 3);
  }
  SUBCASE("connection refused") {
    // A budget that outlasts any slow machine (100 tries, 100 ms apart at most: about ten
    // seconds), so that the receiver coming up is always met by a retry.
    HarnessOptions o;
    o.max_tries = 100;
    Harness patient(o);
    const int port = rebound::test::unused_port();
    const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/hook";
    REQUIRE(patient.submit({{"id", "retry-refused"}, {"callback_url", url}})->status == 202);
    json state;
    REQUIRE(rebound::test::eventually([&] {
      state = patient.poll("retry-refused");
      return state["callback"]["attempts"] >= 1;
    }));
    CHECK(state["callback"]["state"] == "pending");
    CHECK(state["callback"]["last_error"].get<std::string>().find("onnection") !=
          std::string::npos);
    rebound::test::Receiver receiver(port);
    state = patient.wait_callback_final("retry-refused");
    CHECK(state["callback"]["state"] == "delivered");
    CHECK(receiver.count() == 1);
  }
}

TEST_CASE("a callback that keeps failing is given up after max tries and stays listed") {
  Harness h({4, 10000, 3, true});
  rebound::test::Receiver receiver;
  receiver.set_fallback([](const auto&, httplib::Response& res) { res.status = 500; });
  REQUIRE(h.submit({{"id", "doomed"}, {"callback_url", receiver.url()}})->status == 202);
  const json state = h.wait_callback_final("doomed");
  CHECK(state["status"] == "succeeded");
  CHECK(state["callback"]["state"] == "failed");
  CHECK(state["callback"]["attempts"] == 3);
  CHECK(state["callback"]["last_error"] == "HTTP 500");
  CHECK(receiver.count() == 3);
}

TEST_CASE("500 concurrent jobs are all called back") {
  // The shipped attempt timeout (10 s), not the harness's 2 s: under a sanitizer on a loaded
  // machine the receiver can take longer than 2 s to answer, and the retry that follows is a
  // second delivery (at least once), which this test does not count as a job called back twice.
  rebound::test::HarnessOptions options{4, 10000, 5, true};
  options.callback_timeout = std::chrono::seconds(10);
  Harness h(options);
  rebound::test::Receiver receiver;
  constexpr int jobs = 500, clients = 10;
  std::atomic<int> accepted{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto client = h.client();
      for (int i = c; i < jobs; i += clients) {
        auto res = client.Post("/v1/inferences",
                               json({{"id", "bulk-" + std::to_string(i)},
                                     {"callback_url", receiver.url()},
                                     {"input", i}})
                                   .dump(),
                               "application/json");
        if (res && res->status == 202) ++accepted;
      }
    });
  }
  for (auto& t : threads)
    t.join();
  CHECK(accepted == jobs);
  // Every job at least once, each with its own result.
  std::set<std::string> ids;
  std::size_t read = 0;
  const auto all_called_back = [&] {
    const auto received = receiver.received();
    for (; read < received.size(); ++read) {
      auto body = json::parse(received[read].body);
      CHECK(body["result"]["echo"] == std::stoi(body["id"].get<std::string>().substr(5)));
      ids.insert(body["id"]);
    }
    return ids.size() == jobs;
  };
  CHECK(rebound::test::eventually(all_called_back, 60s));
  CHECK(ids.size() == jobs);
}

TEST_CASE("a full queue answers 503 queue_full with Retry-After - and recovers") {
  Harness h({1, 3, 5, false});
  for (int i = 0; i < 3; ++i)
    REQUIRE(h.submit({{"id", "q" + std::to_string(i)}})->status == 202);
  auto full = h.submit({{"id", "q3"}});
  check_error(full, 503, "queue_full");
  CHECK(full->get_header_value("Retry-After") == "1");
  CHECK(h.submit({{"id", "q0"}})->status == 202);  // a resubmission is still recognised
  h.model->open();
  REQUIRE(rebound::test::eventually([&] { return h.service->telemetry().in_flight() == 0; }));
  CHECK(h.submit({{"id", "q3"}})->status == 202);
}

TEST_CASE("a batch answers each job as its own submission would - in one request") {
  Harness h({1, 3, 5, false});  // the model held; 3 jobs fit
  rebound::test::Receiver receiver;
  REQUIRE(h.submit({{"id", "old"}})->status == 202);
  const json batch = {
      {"jobs",
       {{{"id", "b1"}, {"callback_url", receiver.url("/hook")}, {"input", 1}},
        {{"id", "old"}},                                          // the same request again
        {{"id", "old"}, {"input", 2}},                            // another under its id
        {{"id", "bad id"}},                                       // invalid
        7,                                                        // not a submission
        {{"id", "b4"}, {"callback_url", "ftp://example.com/x"}},  // invalid, with its id
        {{"id", "b2"}, {"priority", 0}},                          // the last that fits
        {{"id", "b3"}}}}};                                        // no room
  auto res = h.client().Post("/v1/inferences:batch", batch.dump(), "application/json");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Retry-After") == "1");
  const json answer = json::parse(res->body);
  CHECK(answer["accepted"] == 3);
  CHECK(answer["refused"] == 5);
  const json& r = answer["results"];
  REQUIRE(r.size() == 8);
  CHECK(r[0] == json({{"status", 202},
                      {"message", "Received"},
                      {"id", "b1"},
                      {"status_url", "/v1/inferences/b1"}}));
  CHECK(r[1]["status"] == 202);
  CHECK(r[2]["status"] == 409);
  CHECK(r[2]["id"] == "old");
  CHECK(r[2]["error"]["code"] == "id_conflict");
  CHECK(r[3]["status"] == 422);
  CHECK(r[3]["error"]["field"] == "id");
  CHECK_FALSE(r[3].contains("id"));
  CHECK(r[4]["status"] == 400);  // as its own POST would be answered
  CHECK(r[4]["error"]["code"] == "invalid_json");
  CHECK(r[5]["status"] == 422);
  CHECK(r[5]["id"] == "b4");
  CHECK(r[5]["error"]["field"] == "callback_url");
  CHECK(r[6]["status"] == 202);
  CHECK(r[7]["status"] == 503);
  CHECK(r[7]["error"]["code"] == "queue_full");
  CHECK(h.poll("b2")["priority"] == 0);
  check_error(h.client().Get("/v1/inferences/b3"), 404, "not_found");
  // The accepted jobs run, and b1 is called back as a job submitted alone is.
  h.model->open();
  REQUIRE(receiver.wait_for(1));
  CHECK(json::parse(receiver.received().at(0).body) ==
        json({{"id", "b1"},
              {"status", "succeeded"},
              {"model", {{"name", "held"}, {"version", "1"}}},
              {"result", {{"echo", 1}}}}));
  CHECK(h.wait_callback_final("b1")["callback"]["state"] == "delivered");
  REQUIRE(rebound::test::eventually([&] { return h.poll("b2")["status"] == "succeeded"; }));
  CHECK(h.poll("old")["result"] == json({{"echo", nullptr}}));
}

TEST_CASE("a batch that is not one gets its error - a bounded count of jobs") {
  Harness h;
  auto post = [&](const std::string& body) {
    return h.client().Post("/v1/inferences:batch", body, "application/json");
  };
  check_error(post("not json"), 400, "invalid_json");
  check_error(post("[{\"id\": \"a\"}]"), 400, "invalid_json");
  check_error(post("{}"), 422, "invalid_field", "jobs");
  check_error(post(R"({"jobs": []})"), 422, "invalid_field", "jobs");
  check_error(post(R"({"jobs": {"id": "a"}})"), 422, "invalid_field", "jobs");
  json many = {{"jobs", json::array()}};
  for (int i = 0; i < 1001; ++i)
    many["jobs"].push_back({{"id", "m" + std::to_string(i)}});
  check_error(post(many.dump()), 422, "invalid_field", "jobs");
  CHECK(h.client().Get("/v1/inferences/m0")->status == 404);  // nothing of it was taken
  many["jobs"].erase(1000);
  auto res = post(many.dump());
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(json::parse(res->body)["accepted"] == 1000);
  CHECK_FALSE(res->has_header("Retry-After"));
  auto get = h.client().Get("/v1/inferences:batch");
  check_error(get, 405, "method_not_allowed");
  CHECK(get->get_header_value("Allow") == "POST");
  auto form =
      h.client().Post("/v1/inferences:batch", "jobs=1", "application/x-www-form-urlencoded");
  check_error(form, 415, "unsupported_media_type");
  REQUIRE(rebound::test::eventually([&] { return h.poll("m999")["status"] == "succeeded"; }));
}

TEST_CASE("batches take at most a quarter of the HTTP threads - the rest still answer") {
  // The model's validation holds until opened: a batch stays on its thread meanwhile.
  HarnessOptions o;
  o.http_threads = 4;  // one batch at a time
  auto model = std::make_unique<rebound::test::HeldValidationModel>();
  auto* gate = model.get();
  rebound::test::ServerHarness h(std::move(model), o);
  const std::string batch = json({{"jobs", {{{"id", "held"}, {"input", 1}}}}}).dump();
  std::future<httplib::Result> first;
  struct Opens {  // whatever fails below, the held batch is let go before `first` is waited for
    rebound::test::HeldValidationModel* gate;
    ~Opens() { gate->open(); }
  } opens{gate};
  first = std::async(std::launch::async, [&] {
    return h.client().Post("/v1/inferences:batch", batch, "application/json");
  });
  REQUIRE(gate->wait_started(1));
  auto second = h.client().Post("/v1/inferences:batch",
                                json({{"jobs", {{{"id", "other"}}}}}).dump(), "application/json");
  check_error(second, 503, "queue_full");
  CHECK(second->get_header_value("Retry-After") == "1");
  CHECK(h.client().Get("/ping")->status == 200);
  check_error(h.client().Get("/v1/inferences/held"), 404, "not_found");
  gate->open();
  auto answered = first.get();
  REQUIRE(answered);
  CHECK(answered->status == 200);
  CHECK(json::parse(answered->body)["accepted"] == 1);
  // The slot is back: the next batch is taken.
  auto third = h.client().Post("/v1/inferences:batch", json({{"jobs", {{{"id", "other"}}}}}).dump(),
                               "application/json");
  REQUIRE(third);
  CHECK(third->status == 200);
}

TEST_CASE("/ping and submissions follow the model's readiness") {
  Harness h;
  auto ping = h.client().Get("/ping");
  REQUIRE(ping);
  CHECK(ping->status == 200);
  CHECK(ping->body.empty());
  h.model->set_ready(false);
  CHECK(h.client().Get("/ping")->status == 503);
  check_error(h.submit({{"id", "early"}}), 503, "not_ready");
  h.model->set_ready(true);
  CHECK(h.client().Get("/ping")->status == 200);
}

TEST_CASE("/ping answers while every worker is busy") {
  Harness h({2, 100, 5, false});
  for (int i = 0; i < 5; ++i)
    REQUIRE(h.submit({{"id", "busy" + std::to_string(i)}})->status == 202);
  REQUIRE(rebound::test::eventually([&] { return h.model->started() == 2; }));
  auto ping = h.client().Get("/ping");
  REQUIRE(ping);
  CHECK(ping->status == 200);
}

TEST_CASE("after shutdown begins - submissions get 503 and accepted jobs still finish") {
  Harness h({1, 100, 5, false});
  rebound::test::Receiver receiver;
  REQUIRE(h.submit({{"id", "inflight"}, {"callback_url", receiver.url()}})->status == 202);
  std::thread opener([&] {
    std::this_thread::sleep_for(100ms);
    h.model->open();
  });
  CHECK(h.service->shutdown(20s));
  opener.join();
  CHECK(receiver.count() == 1);
  check_error(h.submit({{"id", "late"}}), 503, "shutting_down");
  CHECK(h.client().Get("/ping")->status == 503);
}

TEST_CASE("/openapi.json documents every route") {
  Harness h;
  auto res = h.client().Get("/openapi.json");
  REQUIRE(res);
  CHECK(res->status == 200);
  const json doc = json::parse(res->body);
  CHECK(doc["openapi"].get<std::string>().rfind("3.", 0) == 0);
  CHECK(doc["info"]["version"] == rebound::version);
  for (const char* path : {"/v1/inferences", "/v1/inferences/{id}", "/ping", "/openapi.json"}) {
    CAPTURE(path);
    CHECK(doc["paths"].contains(path));
  }
  for (const char* status : {"202", "400", "409", "413", "422", "503"}) {
    CHECK(doc["paths"]["/v1/inferences"]["post"]["responses"].contains(status));
  }
}

TEST_CASE("GET /v1/models: the queue's model as a repository of one - 404 for another name") {
  HarnessOptions o;
  o.model_digest = rebound::model_digest("echo");
  o.model_loaded_at = std::chrono::system_clock::time_point(std::chrono::seconds(1764000000));
  Harness h(o);
  const std::string name = h.service->model()->name();
  auto submitted = h.submit({{"id", "m-1"}});
  REQUIRE(submitted);
  CHECK(submitted->status == 202);
  // Final before the reads, so that the two below count the same queue.
  REQUIRE(rebound::test::eventually([&] { return h.poll("m-1")["status"] == "succeeded"; }));
  auto res = h.client().Get("/v1/models");
  REQUIRE(res);
  CHECK(res->status == 200);
  const json models = json::parse(res->body)["models"];
  REQUIRE(models.size() == 1);
  const json& m = models[0];
  CHECK(m["name"] == name);
  CHECK(m["default_version"] == "1");
  CHECK(m["split"] == json::array());
  CHECK(m["generation"] == 1);
  REQUIRE(m["versions"].size() == 1);
  const json& v = m["versions"][0];
  CHECK(v["version"] == "1");
  CHECK(v["state"] == "ready");
  CHECK(v["digest"] == o.model_digest);
  CHECK(v["loaded_at"] == "2025-11-24T16:00:00.000Z");
  CHECK(v["queued"].is_number_integer());
  CHECK(v["running"].is_number_integer());

  res = h.client().Get(("/v1/models/" + name).c_str());
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(json::parse(res->body) == m);
  res = h.client().Get("/v1/models/resnet");
  REQUIRE(res);
  check_error(res, 404, "model_not_found");

  // With several tenants the store's counts span them: a tenant's key reads the model without them,
  // an operator's with them (as GET /v1/stats).
  {
    HarnessOptions tenants;
    tenants.api_keys = {"acme:acme-key", "globex:globex-key"};
    tenants.operator_keys = {"ops:ops-key"};
    Harness t(tenants);
    auto as = [&](const std::string& key) {
      auto got = t.client().Get("/v1/models", {{"Authorization", "Bearer " + key}});
      REQUIRE(got);
      REQUIRE(got->status == 200);
      return json::parse(got->body)["models"][0]["versions"][0];
    };
    CHECK_FALSE(as("acme-key").contains("queued"));
    CHECK(as("ops-key")["queued"].is_number_integer());
    auto anonymous = t.client().Get("/v1/models");
    REQUIRE(anonymous);
    CHECK(anonymous->status == 401);
  }

  // A program that does not say its model's digest: the field is left out, not made up.
  Harness bare;
  res = bare.client().Get("/v1/models");
  REQUIRE(res);
  CHECK_FALSE(json::parse(res->body)["models"][0]["versions"][0].contains("digest"));
}

TEST_CASE("GET /v1/models: the queue's counts are those /metrics shows - counted once a second") {
  // Any API key may read the models: counting at each request would let any client make a shared
  // store count its whole backlog (half a second of PostgreSQL at a million jobs) at will.
  auto clock = std::make_shared<rebound::test::FakeClock>();
  HarnessOptions o;
  o.workers = 1;
  o.open_model = false;
  o.clock = rebound::test::clock_of(clock);
  Harness h(o);
  const auto version = [&] {
    const auto res = h.client().Get("/v1/models");
    REQUIRE(res);
    REQUIRE(res->status == 200);
    return json::parse(res->body)["models"][0]["versions"][0];
  };
  REQUIRE(h.submit({{"id", "busy"}, {"input", 1}})->status == 202);
  REQUIRE(h.model->wait_started(1));
  REQUIRE(h.submit({{"id", "one"}, {"input", 2}})->status == 202);
  json v = version();
  CHECK(v["queued"] == 1);
  CHECK(v["running"] == 1);
  REQUIRE(h.submit({{"id", "two"}, {"input", 3}})->status == 202);
  // The same second: the count the first read made, which /metrics shows too (GET /v1/stats
  // counts at each request).
  CHECK(version()["queued"] == 1);
  const auto metrics = h.client().Get("/metrics");
  REQUIRE(metrics);
  CHECK(metrics->body.find("\nrebound_queue_jobs{state=\"queued\"} 1\n") != std::string::npos);
  const auto stats = h.client().Get("/v1/stats");
  REQUIRE(stats);
  CHECK(json::parse(stats->body)["queued"] == 2);
  // A second on: counted again.
  clock->advance(1s);
  v = version();
  CHECK(v["queued"] == 2);
  CHECK(v["running"] == 1);
}

TEST_CASE("a job says which model and version ran it - in its status - its callback - its answer") {
  Harness h;
  rebound::test::Receiver receiver;
  const json held = {{"name", "held"}, {"version", "1"}};
  // Unnamed: the queue's model; named, by its name and version (text or a number).
  REQUIRE(h.submit({{"id", "any"}, {"callback_url", receiver.url()}})->status == 202);
  REQUIRE(h.submit({{"id", "named"}, {"model", "held"}, {"version", "1"}})->status == 202);
  REQUIRE(h.submit({{"id", "number"}, {"model", "held"}, {"version", 1}})->status == 202);
  REQUIRE(receiver.wait_for(1));
  CHECK(json::parse(receiver.received().at(0).body)["model"] == held);
  CHECK(h.wait_callback_final("any")["model"] == held);
  for (const char* id : {"named", "number"}) {
    CAPTURE(id);
    json state;
    REQUIRE(
        rebound::test::eventually([&] { return (state = h.poll(id))["status"] == "succeeded"; }));
    CHECK(state["model"] == held);
  }
  // A model or version it does not serve, and names that cannot be one.
  check_error(h.submit({{"id", "x1"}, {"model", "resnet"}}), 404, "model_not_found", "model");
  check_error(h.submit({{"id", "x2"}, {"version", "2"}}), 409, "version_unavailable", "version");
  check_error(h.submit({{"id", "x3"}, {"model", "../held"}}), 422, "invalid_field", "model");
  check_error(h.submit({{"id", "x4"}, {"model", "Held"}}), 422, "invalid_field", "model");
  check_error(h.submit({{"id", "x5"}, {"model", ""}}), 422, "invalid_field", "model");
  check_error(h.submit({{"id", "x6"}, {"model", 7}}), 422, "invalid_field", "model");
  check_error(h.submit({{"id", "x7"}, {"version", "01"}}), 422, "invalid_field", "version");
  check_error(h.submit({{"id", "x8"}, {"version", 1.5}}), 422, "invalid_field", "version");
  check_error(h.submit({{"id", "x9"}, {"version", 0}}), 422, "invalid_field", "version");
  check_error(h.submit({{"id", "x10"}, {"version", "%2e%2e"}}), 422, "invalid_field", "version");
  check_error(h.client().Get("/v1/inferences/x1"), 404, "not_found");  // nothing was stored
  // The same request naming the model it got is the same request.
  auto again = h.submit({{"id", "any"}, {"callback_url", receiver.url()}, {"model", "held"}});
  REQUIRE(again);
  CHECK(again->status == 202);
  // In a batch, each job on its own.
  auto batch = h.client().Post(
      "/v1/inferences:batch",
      json({{"jobs", {{{"id", "b-ok"}, {"model", "held"}}, {{"id", "b-no"}, {"model", "resnet"}}}}})
          .dump(),
      "application/json");
  REQUIRE(batch);
  const json results = json::parse(batch->body)["results"];
  CHECK(results[0]["status"] == 202);
  CHECK(results[1]["status"] == 404);
  CHECK(results[1]["error"]["code"] == "model_not_found");
  // Waiting for the answer (Prefer: wait) names it too.
  auto waited = h.client().Post("/v1/inferences", {{"Prefer", "wait=5"}},
                                json({{"id", "w"}}).dump(), "application/json");
  REQUIRE(waited);
  CHECK(waited->status == 200);
  CHECK(json::parse(waited->body)["model"] == held);
  // SageMaker's invocation: the target model named in a header; the answer says who answered.
  auto invoked = h.client().Post("/invocations", "3", "application/json");
  REQUIRE(invoked);
  CHECK(invoked->status == 200);
  CHECK(invoked->get_header_value("Rebound-Model") == "held/1");
  invoked = h.client().Post("/invocations", {{"X-Amzn-SageMaker-Target-Model", "held"}}, "3",
                            "application/json");
  REQUIRE(invoked);
  CHECK(invoked->status == 200);
  invoked = h.client().Post("/invocations", {{"X-Amzn-SageMaker-Target-Model", "resnet.tar.gz"}},
                            "3", "application/json");
  check_error(invoked, 404, "model_not_found");
  CHECK(invoked->get_header_value("Rebound-Model").empty());
  // Two targets name no one model.
  invoked = h.client().Post(
      "/invocations",
      {{"X-Amzn-SageMaker-Target-Model", "held"}, {"X-Amzn-SageMaker-Target-Model", "other"}}, "3",
      "application/json");
  check_error(invoked, 400, "invalid_header");
  // An empty target names no model (not the default one).
  invoked = h.client().Post("/invocations", {{"X-Amzn-SageMaker-Target-Model", ""}}, "3",
                            "application/json");
  check_error(invoked, 400, "invalid_header");
  // The custom attributes are echoed as sent: one value, never one of two.
  invoked = h.client().Post("/invocations", {{"X-Amzn-SageMaker-Custom-Attributes", "trace=1"}},
                            "3", "application/json");
  REQUIRE(invoked);
  CHECK(invoked->status == 200);
  CHECK(invoked->get_header_value("X-Amzn-SageMaker-Custom-Attributes") == "trace=1");
  invoked = h.client().Post("/invocations",
                            {{"X-Amzn-SageMaker-Custom-Attributes", "trace=1"},
                             {"X-Amzn-SageMaker-Custom-Attributes", "trace=2"}},
                            "3", "application/json");
  check_error(invoked, 400, "invalid_header");
  // A refusal of the queue's is no model's answer.
  h.model->set_ready(false);
  invoked = h.client().Post("/invocations", "3", "application/json");
  check_error(invoked, 503, "not_ready");
  CHECK(invoked->get_header_value("Rebound-Model").empty());
}

TEST_CASE("model_digest: a directory's files with their names and sizes - a built-in's spec") {
  rebound::test::TempDir dir;
  const auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir.file(name), std::ios::binary) << bytes;
  };
  write("model.pt", "abc");
  write("config.json", "{}");
  // Paths in order, each "path NUL size NUL bytes" (python3: hashlib.sha256 of the same).
  const std::string digest = rebound::model_digest(dir.path.string());
  CHECK(digest == "sha256:813e2619cc20f9df87b3354f86237bd89557a043b2471b59b2dec05ea6c694f1");
  CHECK(rebound::model_digest(dir.path.string()) == digest);  // the same files, the same digest
  write("model.pt", "ab");  // a byte moved from one file to the next
  write("config.json", "c{}");
  CHECK(rebound::model_digest(dir.path.string()) != digest);
  write("model.pt", "abc");
  write("config.json", "{}");
  std::filesystem::rename(dir.file("config.json"), dir.file("settings.json"));
  CHECK(rebound::model_digest(dir.path.string()) != digest);  // a file renamed
  // A file alone is its bytes; a built-in is its spec's text.
  write("weights", "weights");
  CHECK(rebound::model_digest(dir.file("weights")) ==
        "sha256:9a129038d9a00aed0cf6a7ea059ca50a813449061ab87848cf1a13eafdf33b2c");
  CHECK(rebound::model_digest("echo") ==
        "sha256:092c79e8f80e559e404bcf660c48f3522b67aba9ff1484b0367e1a4ddef7431d");
  CHECK(rebound::model_digest("sleep:0.5") != rebound::model_digest("sleep:1"));

  // Files in subdirectories, ordered by the bytes of their relative paths ("tokenizer.json"
  // before "tokenizer/vocab.txt"); a link that leads nowhere and a linked directory left out.
  rebound::test::TempDir tree;
  std::filesystem::create_directory(tree.path / "tokenizer");
  std::ofstream(tree.file("model.pt"), std::ios::binary) << "abc";
  std::ofstream(tree.file("tokenizer.json"), std::ios::binary) << "{}";
  std::ofstream(tree.file("tokenizer/vocab.txt"), std::ios::binary) << "a b";
  std::filesystem::create_symlink(tree.path / "missing", tree.path / "dangling");
  std::filesystem::create_directory_symlink(tree.path, tree.path / "tokenizer" / "loop");
  CHECK(rebound::model_digest(tree.path.string()) ==
        "sha256:f0912e0d7ce714ba007a0b8e33e1256bf9a70e266be35942d340dbca77d2a64e");
  CHECK_THROWS_AS(rebound::model_digest(tree.file("nothing-here")), rebound::Error);
}

TEST_CASE("at the shutdown deadline waiting jobs are set aside and the running one goes on") {
  Harness h({1, 100, 5, false});
  for (int i = 0; i < 3; ++i)
    REQUIRE(h.submit({{"id", "late" + std::to_string(i)}})->status == 202);
  REQUIRE(rebound::test::eventually([&] { return h.model->started() == 1; }));
  CHECK_FALSE(h.service->shutdown(100ms));
  CHECK(h.service->telemetry().queue_depth() == 0);
  CHECK(h.service->telemetry().in_flight() == 1);  // only the running job still holds a slot
  CHECK(h.poll("late0")["status"] == "running");
  CHECK(h.poll("late1")["status"] == "queued");  // kept as it was: a durable store resumes it
  h.model->open();
  REQUIRE(rebound::test::eventually([&] { return h.service->telemetry().in_flight() == 0; }));
  CHECK(h.poll("late0")["status"] == "succeeded");
  CHECK(h.poll("late2")["status"] == "queued");
}

TEST_CASE("a second server cannot bind a port that is in use") {
  Harness h;
  BareService bare;
  rebound::JobQueue& service = bare.service;
  rebound::Server second(service, {"127.0.0.1", h.port});
  CHECK_THROWS_AS(second.bind(), rebound::Error);
}

TEST_CASE("a stop before run or just as run starts still makes run return") {
  BareService bare;
  rebound::JobQueue& service = bare.service;
  // A run that never returns would hang the test binary: each run gets 10 s, then a last stop().
  auto run_returns = [](rebound::Server& server, bool stop_first,
                        std::chrono::microseconds delay = 0us) {
    if (stop_first) server.stop();
    auto done = std::async(std::launch::async, [&] { server.run(); });
    if (!stop_first) {
      std::this_thread::sleep_for(delay);
      server.stop();  // races with run() reaching httplib's accept loop
    }
    const bool returned = done.wait_for(10s) == std::future_status::ready;
    if (!returned) server.stop();
    return returned;
  };
  {
    rebound::Server server(service, {"127.0.0.1", 0});
    const int port = server.bind();
    CHECK(run_returns(server, true));
    // Stopped before it served: its port refuses connections instead of queueing them.
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(2, 0);
    client.set_read_timeout(2, 0);
    const auto res = client.Get("/ping");
    REQUIRE_FALSE(res);
    CHECK(res.error() == httplib::Error::Connection);
  }
  for (int i = 0; i < 60; ++i) {
    CAPTURE(i);
    rebound::Server server(service, {"127.0.0.1", 0});
    server.bind();
    // From "before the thread starts" to "well inside the accept loop", in 20 µs steps.
    REQUIRE(run_returns(server, false, std::chrono::microseconds(20 * (i % 30))));
  }
}

TEST_CASE("a given-up callback is listed and can be redelivered with a fresh budget") {
  Harness h({4, 10000, 2, true});
  rebound::test::Receiver receiver;
  receiver.script_statuses({500, 500});  // both attempts of the first delivery fail
  REQUIRE(h.submit({{"id", "dead"}, {"callback_url", receiver.url()}, {"input", 42}})->status ==
          202);
  REQUIRE(h.submit({{"id", "fine"}})->status == 202);
  json state = h.wait_callback_final("dead");
  REQUIRE(state["callback"]["state"] == "failed");
  CHECK(state["callback"]["attempts"] == 2);

  auto list = h.client().Get("/v1/inferences?callback_state=failed");
  REQUIRE(list);
  CHECK(list->status == 200);
  const json jobs = json::parse(list->body)["jobs"];
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0]["id"] == "dead");
  CHECK(jobs[0]["callback"]["last_error"] == "HTTP 500");

  auto again = h.client().Post("/v1/inferences/dead/redeliver", "", "application/json");
  REQUIRE(again);
  CHECK(again->status == 202);
  state = h.wait_callback_final("dead");
  CHECK(state["callback"]["state"] == "delivered");
  CHECK(state["callback"]["attempts"] == 3);  // counts add up over deliveries
  REQUIRE(receiver.count() == 3);
  const auto last = receiver.received().back();
  CHECK(last.header("webhook-id") == "msg_dead");  // the same message, so receivers deduplicate
  CHECK(json::parse(last.body) == json({{"id", "dead"},
                                        {"status", "succeeded"},
                                        {"model", {{"name", "held"}, {"version", "1"}}},
                                        {"result", {{"echo", 42}}}}));
  CHECK(json::parse(h.client().Get("/v1/inferences?callback_state=failed")->body)["jobs"].empty());
}

TEST_CASE("redeliver answers 404 for unknown jobs and 409 unless the callback failed") {
  Harness h;
  rebound::test::Receiver receiver;
  check_error(h.client().Post("/v1/inferences/nobody/redeliver", "", "application/json"), 404,
              "not_found");
  REQUIRE(h.submit({{"id", "ok"}, {"callback_url", receiver.url()}})->status == 202);
  REQUIRE(h.submit({{"id", "no-callback"}})->status == 202);
  h.wait_callback_final("ok");
  check_error(h.client().Post("/v1/inferences/ok/redeliver", "", "application/json"), 409,
              "callback_not_failed");
  check_error(h.client().Post("/v1/inferences/no-callback/redeliver", "", "application/json"), 409,
              "callback_not_failed");
  CHECK(receiver.count() == 1);
}

TEST_CASE("the failed-callback listing validates its query") {
  Harness h;
  check_error(h.client().Get("/v1/inferences"), 422, "invalid_field", "callback_state");
  check_error(h.client().Get("/v1/inferences?callback_state=pending"), 422, "invalid_field",
              "callback_state");
  check_error(h.client().Get("/v1/inferences?callback_state=failed&limit=0"), 422, "invalid_field",
              "limit");
  check_error(h.client().Get("/v1/inferences?callback_state=failed&limit=abc"), 422,
              "invalid_field", "limit");
  CHECK(h.client().Get("/v1/inferences?callback_state=failed&limit=1000")->status == 200);
  // A parameter given twice: the route would read one value, a proxy before it maybe the other.
  check_error(h.client().Get("/v1/inferences?callback_state=failed&limit=5&limit=500"), 422,
              "invalid_field", "limit");
  check_error(h.client().Get("/v1/inferences?limit=5&callback_state=failed&callback%5Fstate=x"),
              422, "invalid_field", "callback_state");
  // (Any route: one that reads no parameter refuses the ambiguity too.)
  check_error(h.client().Get("/v1/stats?a=1&a=2"), 422, "invalid_field", "a");
}

TEST_CASE("the failed-callback listing pages with a cursor - without results - within its bytes") {
  // 600 dead letters, each with a 100 KB result and a 2,048-character URL: all of them in one
  // answer would be 60 MB of results, and 1.3 MB without them.
  auto store = std::make_unique<rebound::MemoryJobStore>();
  const auto t0 = std::chrono::system_clock::time_point(1764000000000ms);
  const std::string url = "http://127.0.0.1:9/cb?" + std::string(2026, 'q');
  for (int i = 0; i < 600; ++i) {
    char id[16];
    std::snprintf(id, sizeof id, "dead-%03d", i);
    store->put(rebound::Job{id, url, {{"n", i}}, t0 + std::chrono::milliseconds(i)});
    store->complete(
        id, {rebound::JobStatus::succeeded, {{"big", std::string(100000, 'r')}}, std::nullopt});
    store->update_callback(id, {rebound::CallbackState::failed, 5, "HTTP 500"});
  }
  HarnessOptions o;
  o.make_store = [&store] { return std::move(store); };
  Harness h(o);

  auto get = [&](const std::string& query) {
    auto res = h.client().Get(("/v1/inferences?callback_state=failed" + query).c_str());
    REQUIRE(res);
    REQUIRE(res->status == 200);
    CHECK(res->body.size() < (1u << 20) + 4096);
    return json::parse(res->body);
  };
  // Newest first, whole pages of 100 with a cursor to the next.
  json page = get("&limit=100");
  REQUIRE(page["jobs"].size() == 100);
  CHECK(page["jobs"][0]["id"] == "dead-599");
  CHECK(page["jobs"][99]["id"] == "dead-500");
  CHECK(page["jobs"][0]["status"] == "succeeded");
  CHECK(page["jobs"][0]["callback"]["state"] == "failed");
  CHECK_FALSE(page["jobs"][0].contains("result"));  // a poll away
  CHECK(h.poll("dead-599")["result"]["big"].get<std::string>().size() == 100000);
  REQUIRE(page["next_cursor"].is_string());
  page = get("&limit=100&cursor=" + page["next_cursor"].get<std::string>());
  CHECK(page["jobs"][0]["id"] == "dead-499");

  // limit=1000 would be 1.3 MB: the answer stops within 1 MiB, and its cursor goes on.
  std::vector<std::string> ids;
  std::string cursor;
  int answers = 0;
  for (; answers < 10; ++answers) {
    page = get("&limit=1000" + (cursor.empty() ? std::string() : "&cursor=" + cursor));
    for (const auto& job : page["jobs"])
      ids.push_back(job["id"]);
    if (page["next_cursor"].is_null()) break;
    cursor = page["next_cursor"];
  }
  CHECK(answers == 1);  // two answers: one cut at the byte cap, then the rest
  REQUIRE(ids.size() == 600);
  for (int i = 0; i < 600; ++i) {
    char id[16];
    std::snprintf(id, sizeof id, "dead-%03d", 599 - i);
    CHECK(ids[static_cast<std::size_t>(i)] == id);
  }

  for (const char* bad :
       {"abc", "123", "_64", "12x_64", "1_", "1_6", "1_zz", "1_6G", "1_a%2Fb", "99999999999999_64",
        "99999999999999999_64", "9999999999999_64"}) {  // 13 digits past what the clock can hold
    CAPTURE(bad);
    check_error(
        h.client().Get((std::string("/v1/inferences?callback_state=failed&cursor=") + bad).c_str()),
        400, "invalid_cursor", "cursor");
  }
}

TEST_CASE("with API keys every route but /ping and /openapi.json needs a bearer token") {
  HarnessOptions o;
  o.api_keys = {"app:old-key", "app:new-key"};  // one name: one tenant, two keys (a rotation)
  Harness h(o);
  auto unauthorized = h.submit({{"id", "a"}});
  check_error(unauthorized, 401, "unauthorized");
  CHECK(unauthorized->get_header_value("WWW-Authenticate") == "Bearer");
  check_error(h.client().Get("/v1/inferences/a"), 401, "unauthorized");
  check_error(h.client().Post("/v1/inferences/a/redeliver", "", "application/json"), 401,
              "unauthorized");
  CHECK(h.client().Get("/ping")->status == 200);
  CHECK(h.client().Get("/openapi.json")->status == 200);

  h.bearer = "wrong-key";
  check_error(h.submit({{"id", "a"}}), 401, "unauthorized");
  h.bearer = "new-key";
  CHECK(h.submit({{"id", "a"}})->status == 202);
  // Without a key an existing job and a missing one answer alike.
  h.bearer.clear();
  for (const char* path : {"/v1/inferences/a", "/v1/inferences/missing"}) {
    check_error(h.client().Get(path), 401, "unauthorized");
    check_error(h.client().Delete(path), 401, "unauthorized");
  }
  h.bearer = "new-key";
  h.bearer = "old-key";  // both keys work during a rotation
  CHECK(h.client().Get("/v1/inferences/a")->status == 200);
}

TEST_CASE("a burst of simultaneous connections is served without resets") {
  // cpp-httplib listens with a backlog of 5; rebound raises it. Before, about half of a burst of
  // 64 new connections failed with read errors.
  Harness h;
  constexpr int clients = 128;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto res = h.submit({{"id", "burst-" + std::to_string(c)}});
      ok += res && res->status == 202;
    });
  }
  for (auto& t : threads)
    t.join();
  CHECK(ok == clients);
}

namespace {
// "name{labels} value" lines of a Prometheus text exposition, by "name{labels}".
std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}
}  // namespace

TEST_CASE("/metrics counts jobs - callbacks - invocations - batches and shows the queue") {
  Harness h;
  rebound::test::Receiver receiver;
  receiver.script_statuses({500});  // the first callback attempt fails once
  for (int i = 0; i < 3; ++i) {
    REQUIRE(h.submit({{"id", "m" + std::to_string(i)}, {"callback_url", receiver.url()}})->status ==
            202);
  }
  for (int i = 0; i < 3; ++i)
    h.wait_callback_final("m" + std::to_string(i));
  REQUIRE(h.client().Post("/invocations", "[1]", "application/json")->status == 200);
  h.model->set_ready(false);
  REQUIRE(h.submit({{"id", "refused"}})->status == 503);
  h.model->set_ready(true);

  // A job's status says "delivered" once the store has the attempt; its slot is given back when
  // that write's answer comes, a moment later, so the gauge is read until it settles.
  std::map<std::string, double> m;
  CHECK(rebound::test::eventually([&] {
    auto res = h.client().Get("/metrics");
    if (!res) return false;
    m = parse_metrics(res->body);
    return m.count("rebound_jobs_in_flight") && m.at("rebound_jobs_in_flight") == 0;
  }));
  auto res = h.client().Get("/metrics");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0) == 0);
  CHECK(m["rebound_jobs_accepted_total"] == 3);
  CHECK(m["rebound_jobs_completed_total{status=\"succeeded\"}"] == 3);
  CHECK(m["rebound_jobs_completed_total{status=\"failed\"}"] == 0);
  CHECK(m["rebound_callbacks_delivered_total"] == 3);
  CHECK(m["rebound_callbacks_given_up_total"] == 0);
  CHECK(m["rebound_callback_attempts_total{outcome=\"retry\"}"] == 1);
  CHECK(m["rebound_callback_attempts_total{outcome=\"delivered\"}"] == 3);
  CHECK(m["rebound_invocations_total{outcome=\"succeeded\"}"] == 1);
  CHECK(m["rebound_submissions_refused_total{reason=\"not_ready\"}"] == 1);
  CHECK(m["rebound_queue_depth"] == 0);
  CHECK(m["rebound_batch_size_count"] == 4);
  CHECK(m["rebound_batch_size_bucket{le=\"+Inf\"}"] == 4);
  CHECK(m["rebound_queue_wait_seconds_count"] == 4);
  CHECK(m["rebound_inference_seconds_count"] == 4);
  CHECK(m["rebound_inference_seconds_bucket{le=\"0.0001\"}"] <=
        m["rebound_inference_seconds_bucket{le=\"30\"}"]);  // cumulative buckets
}

TEST_CASE("/metrics shows the queue depth while work waits") {
  Harness h({1, 100, 5, false});
  for (int i = 0; i < 4; ++i)
    REQUIRE(h.submit({{"id", "w" + std::to_string(i)}})->status == 202);
  REQUIRE(rebound::test::eventually([&] { return h.model->started() == 1; }));
  auto m = parse_metrics(h.client().Get("/metrics")->body);
  CHECK(m["rebound_queue_depth"] == 3);
  CHECK(m["rebound_jobs_in_flight"] == 4);
}

TEST_CASE("a job that waited past its time-to-live ends expired and is not run") {
  auto clock = std::make_shared<rebound::test::FakeClock>();
  HarnessOptions o;
  o.workers = 1;
  o.open_model = false;
  o.job_ttl = 150ms;
  o.clock = rebound::test::clock_of(clock);
  Harness h(o);
  rebound::test::Receiver receiver;
  REQUIRE(h.submit({{"id", "first"}, {"callback_url", receiver.url()}})->status == 202);
  REQUIRE(rebound::test::eventually([&] { return h.model->started() == 1; }));
  REQUIRE(h.submit({{"id", "late"}, {"callback_url", receiver.url()}})->status == 202);
  clock->advance(300ms);  // "late" waits behind "first" past its TTL
  h.model->open();
  REQUIRE(receiver.wait_for(2));
  std::map<std::string, json> bodies;
  for (const auto& r : receiver.received()) {
    auto b = json::parse(r.body);
    bodies[b["id"]] = b;
  }
  CHECK(bodies["first"]["status"] == "succeeded");  // it started in time
  CHECK(bodies["late"]["status"] == "expired");
  CHECK(bodies["late"]["error"]["code"] == "expired");
  CHECK_FALSE(bodies["late"].contains("result"));
  CHECK(h.model->started() == 1);  // the model saw only "first"
  const json state = h.poll("late");
  CHECK(state["status"] == "expired");
  CHECK(state["error"]["code"] == "expired");
  auto m = parse_metrics(h.client().Get("/metrics")->body);
  CHECK(m["rebound_jobs_completed_total{status=\"expired\"}"] == 1);
}

TEST_CASE("job events are logged as JSON lines with the job id") {
  std::mutex m;
  std::vector<json> lines;
  HarnessOptions o;
  o.max_tries = 2;
  o.logger =
      rebound::Logger(rebound::LogLevel::debug, [&](rebound::LogLevel, const std::string& line) {
        std::lock_guard<std::mutex> lock(m);
        lines.push_back(json::parse(line));
      });
  {
    Harness h(o);
    rebound::test::Receiver receiver;
    receiver.set_fallback([](const auto&, httplib::Response& res) { res.status = 503; });
    REQUIRE(
        h.submit({{"id", "logged"}, {"callback_url", receiver.url()}, {"input", "bad"}})->status ==
        202);
    h.wait_callback_final("logged");
  }
  std::lock_guard<std::mutex> lock(m);
  std::map<std::string, json> by_event;
  for (const auto& l : lines) {
    CHECK(l["ts"].is_string());
    CHECK(l["level"].is_string());
    if (l.contains("job_id")) by_event[l["event"]] = l;
  }
  REQUIRE(by_event.count("job_accepted"));
  CHECK(by_event["job_accepted"]["job_id"] == "logged");
  REQUIRE(by_event.count("job_completed"));
  CHECK(by_event["job_completed"]["status"] == "failed");
  CHECK(by_event["job_completed"]["error_code"] == "invalid_input");
  CHECK(by_event["job_completed"]["level"] == "warn");
  REQUIRE(by_event.count("callback_attempt_failed"));
  CHECK(by_event["callback_attempt_failed"]["error"] == "HTTP 503");
  CHECK(by_event["callback_attempt_failed"]["attempt"] == 1);
  REQUIRE(by_event.count("callback_given_up"));
  CHECK(by_event["callback_given_up"]["attempts"] == 2);
}

TEST_CASE("the log level filters lines and a throwing sink is harmless") {
  int written = 0;
  rebound::Logger warn_only(rebound::LogLevel::warn,
                            [&](rebound::LogLevel, const std::string&) { ++written; });
  warn_only.job(rebound::LogLevel::info, "job_completed", "a");
  warn_only.job(rebound::LogLevel::warn, "job_expired", "a");
  warn_only.log(rebound::LogLevel::error, "store_error");
  CHECK(written == 2);
  rebound::Logger throwing(rebound::LogLevel::debug, [](rebound::LogLevel, const std::string&) {
    throw std::runtime_error("disk full");
  });
  throwing.job(rebound::LogLevel::info, "job_completed", "a");  // must not throw
  CHECK(rebound::parse_log_level("warn") == rebound::LogLevel::warn);
  CHECK_FALSE(rebound::parse_log_level("verbose"));
  CHECK_FALSE(rebound::Logger().enabled(rebound::LogLevel::error));
}

TEST_CASE(
    "a model call past the inference timeout fails its jobs on time - the late result is dropped") {
  HarnessOptions o;
  o.workers = 2;  // the invocation below runs beside the stuck job, and overruns too
  o.open_model = false;
  o.inference_timeout = 150ms;
  Harness h(o);
  rebound::test::Receiver receiver;
  REQUIRE(h.submit({{"id", "slow"}, {"callback_url", receiver.url()}})->status == 202);
  REQUIRE(receiver.wait_for(1));  // answered while the model is still blocked
  // (The watchdog is armed before the model is called: a worker that slept past it may start it
  // after the callback went.)
  REQUIRE(h.model->wait_started(1));
  CHECK(h.model->started() == 1);
  auto body = json::parse(receiver.received().at(0).body);
  CHECK(body["status"] == "failed");
  CHECK(body["error"]["code"] == "inference_timeout");
  check_error(h.client().Post("/invocations", "[1]", "application/json"), 504, "inference_timeout");
  h.model->open();  // the late results arrive and are discarded
  REQUIRE(rebound::test::eventually([&] { return h.service->telemetry().in_flight() == 0; }));
  CHECK(h.poll("slow")["status"] == "failed");
  CHECK(h.poll("slow")["error"]["code"] == "inference_timeout");
  CHECK(receiver.count() == 1);
  auto m = parse_metrics(h.client().Get("/metrics")->body);
  CHECK(m["rebound_jobs_completed_total{status=\"failed\"}"] == 1);
  CHECK(m["rebound_jobs_completed_total{status=\"succeeded\"}"] == 0);
}

TEST_CASE("at log level warn a failed job is still logged - a succeeded one is not") {
  std::mutex m;
  std::vector<json> lines;
  HarnessOptions o;
  o.logger =
      rebound::Logger(rebound::LogLevel::warn, [&](rebound::LogLevel, const std::string& line) {
        std::lock_guard<std::mutex> lock(m);
        lines.push_back(json::parse(line));
      });
  {
    Harness h(o);
    REQUIRE(h.submit({{"id", "fails"}, {"input", "bad"}})->status == 202);
    REQUIRE(h.submit({{"id", "works"}, {"input", 1}})->status == 202);
    REQUIRE(rebound::test::eventually([&] { return h.service->telemetry().in_flight() == 0; }));
  }
  std::lock_guard<std::mutex> lock(m);
  std::set<std::string> completed;
  for (const auto& l : lines) {
    CHECK(l["level"] != "info");
    if (l["event"] == "job_completed") completed.insert(l["job_id"]);
  }
  CHECK(completed == std::set<std::string>{"fails"});
}

TEST_CASE("GET /v1/callback-endpoints and /metrics show a receiver whose circuit opened") {
  Harness s;
  rebound::test::Receiver receiver;
  receiver.set_fallback([](const auto&, httplib::Response& res) { res.status = 500; });
  REQUIRE(s.submit({{"id", "sick"}, {"callback_url", receiver.url()}, {"input", 1}})->status ==
          202);
  CHECK(s.wait_callback_final("sick")["callback"]["state"] == "failed");
  auto res = s.client().Get("/v1/callback-endpoints");
  REQUIRE(res);
  CHECK(res->status == 200);
  const json body = json::parse(res->body);
  REQUIRE(body["endpoints"].size() == 1);
  const json& e = body["endpoints"][0];
  CHECK(e["origin"] == "http://127.0.0.1:" + std::to_string(receiver.port()));
  CHECK(e["state"] == "open");  // five failures in a row, the default threshold
  CHECK(e["consecutive_failures"] == 5);
  CHECK(e["in_flight"] == 0);
  CHECK(e["waiting"] == 0);
  auto metrics = s.client().Get("/metrics");
  REQUIRE(metrics);
  CHECK(metrics->body.find("rebound_callback_endpoints{state=\"open\"} 1") != std::string::npos);
  CHECK(metrics->body.find("rebound_callback_endpoints{state=\"closed\"} 0") != std::string::npos);
}

TEST_CASE("GET /v1/callback-endpoints lists at most 1024 origins - the paused ones first") {
  HarnessOptions o;
  o.max_tries = 1;
  Harness s(o);
  for (int i = 0; i < 200; ++i) {
    const std::string origin = "http://paused-" + std::to_string(i) + ".example";
    REQUIRE(s.client()
                .Post("/v1/callback-endpoints/pause", json{{"origin", origin}}.dump(),
                      "application/json")
                ->status == 200);
  }
  // 1,030 origins sent to once each: port 9 (discard) of as many loopback addresses, where
  // nothing listens (each attempt fails at once; never another test's server on an ephemeral
  // port).
  constexpr int sent = 1030;
  for (int i = 0; i < sent; ++i) {
    const std::string url =
        "http://127.0." + std::to_string(1 + i / 250) + "." + std::to_string(1 + i % 250) + ":9/cb";
    REQUIRE(s.submit({{"id", "e" + std::to_string(i)}, {"callback_url", url}})->status == 202);
  }
  REQUIRE(rebound::test::eventually(
      [&] {
        return s.service->telemetry().in_flight() == 0 &&
               s.service->telemetry().metrics().callbacks_given_up.load() == sent;
      },
      60s));
  const json answer = json::parse(s.client().Get("/v1/callback-endpoints")->body);
  CHECK(answer["endpoints"].size() == 1024);
  CHECK(answer["total"].get<int>() >= 1200);  // 200 paused and the 1,024 most recent tallies
  int paused = 0;
  for (const json& e : answer["endpoints"])
    paused += e["paused"].get<bool>();
  CHECK(paused == 200);
}

TEST_CASE("POST /v1/callback-endpoints/pause holds an origin's callbacks - resume sends them") {
  HarnessOptions o;
  o.origins.paused_retry = 200ms;
  Harness s(o);
  rebound::test::Receiver receiver;
  const std::string origin = "http://127.0.0.1:" + std::to_string(receiver.port());
  auto paused =
      s.client().Post("/v1/callback-endpoints/pause",
                      json{{"origin", receiver.url("/some/path")}}.dump(), "application/json");
  REQUIRE(paused);
  CHECK(paused->status == 200);
  CHECK(json::parse(paused->body) == json{{"origin", origin}, {"paused", true}});
  REQUIRE(s.submit({{"id", "held"}, {"callback_url", receiver.url()}, {"input", 1}})->status ==
          202);
  // The job runs; its callback waits in the store, coming due every 200 ms and deferred again.
  REQUIRE(rebound::test::eventually([&] {
    auto e = json::parse(s.client().Get("/v1/callback-endpoints")->body)["endpoints"];
    return e.size() == 1 && e[0]["deferred"].get<int>() >= 2;
  }));
  const json e = json::parse(s.client().Get("/v1/callback-endpoints")->body)["endpoints"][0];
  CHECK(e["origin"] == origin);
  CHECK(e["paused"] == true);
  CHECK(receiver.count() == 0);
  const json held = json::parse(s.client().Get("/v1/inferences/held")->body);
  CHECK(held["status"] == "succeeded");
  CHECK(held["callback"]["state"] == "pending");
  CHECK(held["callback"]["attempts"] == 0);

  auto resumed = s.client().Post("/v1/callback-endpoints/resume", R"({"origin":")" + origin + "\"}",
                                 "application/json");
  REQUIRE(resumed);
  CHECK(resumed->status == 200);
  CHECK(json::parse(resumed->body)["paused"] == false);
  CHECK(s.wait_callback_final("held")["callback"]["state"] == "delivered");
  CHECK(receiver.count() == 1);

  for (const std::string bad : {R"({"origin":"ftp://x"})", R"({"origin":7})", "[]", "{}"}) {
    auto r = s.client().Post("/v1/callback-endpoints/pause", bad, "application/json");
    REQUIRE(r);
    CHECK(r->status == 422);
    CHECK(json::parse(r->body)["error"]["code"] == "invalid_origin");
  }
  auto not_json = s.client().Post("/v1/callback-endpoints/pause", "not json", "application/json");
  REQUIRE(not_json);
  CHECK(not_json->status == 400);
  CHECK(json::parse(not_json->body)["error"]["code"] == "invalid_json");
  auto get = s.client().Get("/v1/callback-endpoints/pause");
  REQUIRE(get);
  CHECK(get->status == 405);
}

namespace {

// A client of a multi-tenant harness: its own key.
struct As {
  const Harness& h;
  std::string key;
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", h.port);
    c.set_read_timeout(10, 0);
    c.set_bearer_token_auth(key.c_str());
    return c;
  }
  httplib::Result submit(const json& body) const {
    return client().Post("/v1/inferences", body.dump(), "application/json");
  }
  httplib::Result get(const std::string& path) const { return client().Get(path.c_str()); }
};

HarnessOptions two_tenants() {
  HarnessOptions o;
  o.api_keys = {"acme:k-acme", "globex:k-globex"};
  o.max_tries = 1;
  return o;
}

}  // namespace

TEST_CASE("tenants: listing cursors are sealed - opaque - and refused to another tenant") {
  Harness h(two_tenants());
  const As acme{h, "k-acme"}, globex{h, "k-globex"};
  rebound::test::Receiver down;
  down.set_fallback([](const auto&, httplib::Response& res) { res.status = 500; });
  for (int i = 0; i < 3; ++i) {
    REQUIRE(acme.submit({{"id", "a" + std::to_string(i)}, {"callback_url", down.url()}})->status ==
            202);
    REQUIRE(
        globex.submit({{"id", "g" + std::to_string(i)}, {"callback_url", down.url()}})->status ==
        202);
  }
  // (A give-up is counted before the store records it: the slots tell when all are recorded.)
  REQUIRE(rebound::test::eventually([&] {
    return h.service->telemetry().metrics().callbacks_given_up.load() == 6 &&
           h.service->telemetry().in_flight() == 0;
  }));
  auto list = [](const As& who, const std::string& cursor) {
    return who.get("/v1/inferences?callback_state=failed&limit=1" +
                   (cursor.empty() ? std::string() : "&cursor=" + cursor));
  };
  // globex pages through its own three, one at a time, and never sees acme's.
  std::vector<std::string> seen, cursors;
  std::string cursor;
  for (int page = 0; page < 5; ++page) {
    const json answer = json::parse(list(globex, cursor)->body);
    for (const json& job : answer["jobs"])
      seen.push_back(job["id"]);
    if (answer["next_cursor"].is_null()) break;
    cursor = answer["next_cursor"];
    cursors.push_back(cursor);
  }
  CHECK(seen == std::vector<std::string>{"g2", "g1", "g0"});
  REQUIRE_FALSE(cursors.empty());
  // Opaque: the cursor does not spell the id it stands for (in hex, as it used to).
  CHECK(cursors[0].find("676c6f626578") == std::string::npos);  // "globex"
  // Another tenant's cursor, an altered one and a made-up one are refused.
  check_error(list(acme, cursors[0]), 400, "invalid_cursor", "cursor");
  std::string altered = cursors[0];
  altered[altered.size() / 2] = altered[altered.size() / 2] == 'A' ? 'B' : 'A';
  check_error(list(globex, altered), 400, "invalid_cursor", "cursor");
  check_error(list(globex, "1700000000000_676c6f6265782f6732"), 400, "invalid_cursor", "cursor");
  // The cursor as given still goes on.
  CHECK(json::parse(list(globex, cursors[0])->body)["jobs"][0]["id"] == "g1");
}

TEST_CASE("tenants: a batch's jobs are its tenant's - as one submission's are") {
  Harness h(two_tenants());
  const As acme{h, "k-acme"}, globex{h, "k-globex"};
  REQUIRE(acme.submit({{"id", "shared"}, {"input", 1}})->status == 202);
  const json batch = {{"jobs", {{{"id", "shared"}, {"input", 2}}, {{"id", "g-only"}}}}};
  auto res = globex.client().Post("/v1/inferences:batch", batch.dump(), "application/json");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  CHECK(json::parse(res->body)["accepted"] == 2);  // its own "shared": no conflict
  REQUIRE(rebound::test::eventually([&] {
    return json::parse(globex.get("/v1/inferences/shared")->body)["status"] == "succeeded";
  }));
  CHECK(json::parse(globex.get("/v1/inferences/shared")->body)["result"] == json{{"echo", 2}});
  CHECK(json::parse(acme.get("/v1/inferences/shared")->body)["result"] == json{{"echo", 1}});
  check_error(acme.get("/v1/inferences/g-only"), 404, "not_found");
  // Unauthenticated: refused before anything is read.
  auto anonymous = h.client().Post("/v1/inferences:batch", batch.dump(), "application/json");
  check_error(anonymous, 401, "unauthorized");
}

TEST_CASE("tenants: two keys cannot see each other's jobs - the same id is used by both") {
  Harness h(two_tenants());
  const As acme{h, "k-acme"}, globex{h, "k-globex"};
  rebound::test::Receiver receiver;
  REQUIRE(acme.submit({{"id", "1234"}, {"input", 1}, {"callback_url", receiver.url("/acme")}})
              ->status == 202);
  // The same id from another tenant is another job: no 409.
  auto other = globex.submit({{"id", "1234"}, {"input", 2}});
  REQUIRE(other);
  CHECK(other->status == 202);
  CHECK(other->get_header_value("Location") == "/v1/inferences/1234");
  REQUIRE(rebound::test::eventually([&] {
    return json::parse(acme.get("/v1/inferences/1234")->body)["status"] == "succeeded" &&
           json::parse(globex.get("/v1/inferences/1234")->body)["status"] == "succeeded";
  }));
  const json mine = json::parse(acme.get("/v1/inferences/1234")->body);
  CHECK(mine["id"] == "1234");  // the tenant's own id, without its name
  CHECK(mine["result"] == json{{"echo", 1}});
  CHECK(json::parse(globex.get("/v1/inferences/1234")->body)["result"] == json{{"echo", 2}});
  // The callback carries the tenant's id; its webhook-id names the tenant, so two tenants' jobs
  // of one id never share it.
  REQUIRE(rebound::test::eventually([&] { return receiver.count() == 1; }));
  const auto callback = receiver.received().front();
  CHECK(json::parse(callback.body)["id"] == "1234");
  CHECK(callback.header("webhook-id") == "msg_acme.1234");

  // Another tenant's job is answered as an unknown id on every route.
  REQUIRE(acme.submit({{"id", "only-acme"}, {"input", 3}})->status == 202);
  REQUIRE(rebound::test::eventually([&] {
    return json::parse(acme.get("/v1/inferences/only-acme")->body)["status"] == "succeeded";
  }));
  check_error(globex.get("/v1/inferences/only-acme"), 404, "not_found");
  auto waited = globex.client().Get("/v1/inferences/only-acme", {{"Prefer", "wait=1"}});
  check_error(waited, 404, "not_found");
  check_error(globex.client().Delete("/v1/inferences/only-acme"), 404, "not_found");
  check_error(globex.client().Post("/v1/inferences/only-acme/redeliver", "", "application/json"),
              404, "not_found");
  // Nor can a tenant reach into another by naming its key in the path.
  check_error(globex.get("/v1/inferences/acme%2Fonly-acme"), 404, "not_found");

  // Dead letters are listed to their own tenant only.
  rebound::test::Receiver down;
  down.set_fallback([](const auto&, httplib::Response& res) { res.status = 500; });
  REQUIRE(acme.submit({{"id", "dead"}, {"input", 4}, {"callback_url", down.url()}})->status == 202);
  REQUIRE(rebound::test::eventually([&] {
    return json::parse(acme.get("/v1/inferences/dead")->body)["callback"]["state"] == "failed";
  }));
  const json acme_dead = json::parse(acme.get("/v1/inferences?callback_state=failed")->body);
  REQUIRE(acme_dead["jobs"].size() == 1);
  CHECK(acme_dead["jobs"][0]["id"] == "dead");
  CHECK(json::parse(globex.get("/v1/inferences?callback_state=failed")->body)["jobs"].empty());
  check_error(globex.client().Post("/v1/inferences/dead/redeliver", "", "application/json"), 404,
              "not_found");
  CHECK(acme.client().Post("/v1/inferences/dead/redeliver", "", "application/json")->status == 202);
}

TEST_CASE("tenants: a callback made for one tenant does not verify with another's secret") {
  HarnessOptions o = two_tenants();
  const std::string server_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
  const std::string server_key = rebound::generate_webhook_signing_key();
  o.signing_secrets = {server_secret, server_key};
  Harness h(o);
  const As acme{h, "k-acme"}, globex{h, "k-globex"};
  auto secret_of = [](const As& who) {
    auto res = who.get("/v1/webhook-secret");
    REQUIRE(res);
    REQUIRE(res->status == 200);
    return json::parse(res->body)["secret"].get<std::string>();
  };
  const std::string acme_secret = secret_of(acme), globex_secret = secret_of(globex);
  CHECK(rebound::is_valid_webhook_secret(acme_secret));
  CHECK(acme_secret != globex_secret);
  CHECK(acme_secret != server_secret);
  CHECK(secret_of(acme) == acme_secret);  // the same every time
  // Public keys per tenant: for the caller's key, or by name for a receiver without one.
  const json acme_keys = json::parse(acme.get("/v1/webhook-keys")->body)["keys"];
  REQUIRE(acme_keys.size() == 1);
  CHECK(json::parse(h.client().Get("/v1/webhook-keys?tenant=acme")->body)["keys"] == acme_keys);
  CHECK(json::parse(globex.get("/v1/webhook-keys")->body)["keys"] != acme_keys);
  CHECK(acme_keys[0] != rebound::webhook_public_key(server_key));
  check_error(h.client().Get("/v1/webhook-keys"), 422, "invalid_field", "tenant");
  // No oracle on names: a name the server does not have is answered as one it has (the keys it
  // would have), and only a malformed name is refused, whatever the server's tenants.
  auto unknown = h.client().Get("/v1/webhook-keys?tenant=nobody-here");
  REQUIRE(unknown);
  CHECK(unknown->status == 200);
  CHECK(json::parse(unknown->body)["keys"].size() == acme_keys.size());
  CHECK(json::parse(unknown->body)["keys"] != acme_keys);
  check_error(h.client().Get("/v1/webhook-keys?tenant=no%20such"), 422, "invalid_field", "tenant");

  // globex submits the id acme will use next, pointed at acme's receiver: the receiver gets it,
  // but it does not verify with acme's secret or keys, and acme's own job is still its own.
  rebound::test::Receiver acme_receiver;
  REQUIRE(globex
              .submit({{"id", "order-7"},
                       {"input", "forged"},
                       {"callback_url", acme_receiver.url("/hook")}})
              ->status == 202);
  REQUIRE(
      acme.submit(
              {{"id", "order-7"}, {"input", "real"}, {"callback_url", acme_receiver.url("/hook")}})
          ->status == 202);
  REQUIRE(rebound::test::eventually([&] { return acme_receiver.count() == 2; }));
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  int verified = 0, refused = 0;
  for (const auto& r : acme_receiver.received()) {
    const bool with_secret =
        rebound::verify_webhook(acme_secret, r.header("webhook-id"), r.header("webhook-timestamp"),
                                r.body, r.header("webhook-signature"), now);
    const bool with_key = rebound::verify_webhook(
        acme_keys[0].get<std::string>(), r.header("webhook-id"), r.header("webhook-timestamp"),
        r.body, r.header("webhook-signature"), now);
    CHECK(with_secret == with_key);
    const std::string input = json::parse(r.body)["result"]["echo"];
    if (with_secret) {
      ++verified;
      CHECK(input == "real");
    } else {
      ++refused;
      CHECK(input == "forged");
      // It is globex's, and verifies as such.
      CHECK(rebound::verify_webhook(globex_secret, r.header("webhook-id"),
                                    r.header("webhook-timestamp"), r.body,
                                    r.header("webhook-signature"), now));
    }
  }
  CHECK(verified == 1);
  CHECK(refused == 1);
}

TEST_CASE("tenants: what spans tenants needs an operator key") {
  HarnessOptions o = two_tenants();
  o.operator_keys = {"ops:k-ops"};
  Harness h(o);
  const As acme{h, "k-acme"}, ops{h, "k-ops"};
  check_error(acme.get("/v1/callback-endpoints"), 403, "forbidden");
  check_error(acme.get("/metrics"), 403, "forbidden");
  check_error(acme.client().Post("/v1/callback-endpoints/pause", R"({"origin":"http://x"})",
                                 "application/json"),
              403, "forbidden");
  CHECK(ops.get("/v1/callback-endpoints")->status == 200);
  CHECK(ops.get("/metrics")->status == 200);
  // An operator's key is a tenant too: its jobs are its own.
  REQUIRE(ops.submit({{"id", "x"}, {"input", 1}})->status == 202);
  check_error(acme.get("/v1/inferences/x"), 404, "not_found");
}

TEST_CASE("one tenant: the configured secret as it is - none is handed out without keys") {
  HarnessOptions o;
  o.api_keys = {"only-key"};
  o.signing_secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
  {
    Harness h(o);
    h.bearer = "only-key";
    auto res = h.client().Get("/v1/webhook-secret");
    REQUIRE(res);
    CHECK(res->status == 200);
    CHECK(json::parse(res->body)["secret"] == "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    REQUIRE(h.submit({{"id", "plain"}, {"input", 1}})->status == 202);
    CHECK(h.poll("plain")["id"] == "plain");
  }
  o.api_keys.clear();
  Harness open(o);
  check_error(open.client().Get("/v1/webhook-secret"), 403, "forbidden");
  o.signing_secrets.clear();
  o.api_keys = {"k"};
  Harness unsigned_(o);
  unsigned_.bearer = "k";
  check_error(unsigned_.client().Get("/v1/webhook-secret"), 404, "no_signing_secret");
}

TEST_CASE("tenants: names that cannot be used refuse to start") {
  rebound::JobQueue queue(std::make_unique<rebound::EchoModel>());
  auto refused = [&](std::vector<std::string> keys, std::vector<std::string> operators = {}) {
    rebound::ServerOptions so("127.0.0.1", 0);
    so.api_keys = std::move(keys);
    so.operator_keys = std::move(operators);
    CHECK_THROWS_AS(rebound::Server(queue, so), rebound::Error);
  };
  refused({"a:k1", "bad name:k2"});
  refused({"a:k1", "b+/=="});  // a bare key that cannot be a name, beside another tenant
  refused({"a:k1", "b:"});     // a named key that is empty
  refused({"a:same", "b:same"});
  refused({"a:k1"}, {" "});
  rebound::ServerOptions fine("127.0.0.1", 0);
  fine.api_keys = {"b+/=="};  // alone it is the one tenant, whatever it holds
  CHECK_NOTHROW(rebound::Server(queue, fine));
}

TEST_CASE(
    "tenants: one tenant at its share gets 429 tenant_quota - the others are still accepted") {
  HarnessOptions o = two_tenants();
  o.capacity = 10;
  o.tenant_share = 0.4;  // four slots each
  o.workers = 1;
  Harness h(o);
  const As acme{h, "k-acme"}, globex{h, "k-globex"};
  // A dead letter of acme's, for the redelivery below.
  rebound::test::Receiver down;
  down.set_fallback([](const auto&, httplib::Response& res) { res.status = 500; });
  REQUIRE(acme.submit({{"id", "dead"}, {"input", 0}, {"callback_url", down.url()}})->status == 202);
  REQUIRE(rebound::test::eventually([&] {
    return json::parse(acme.get("/v1/inferences/dead")->body)["callback"]["state"] == "failed";
  }));
  // (The give-up is stored before its slot is freed: wait for the slot.)
  REQUIRE(rebound::test::eventually([&] { return h.service->telemetry().in_flight() == 0; }));
  h.model->close();  // from here nothing finishes: the slots stay taken
  for (int i = 0; i < 4; ++i)
    REQUIRE(acme.submit({{"id", "a" + std::to_string(i)}, {"input", i}})->status == 202);
  auto refused = acme.submit({{"id", "a4"}, {"input", 4}});
  check_error(refused, 429, "tenant_quota");
  CHECK(refused->get_header_value("Retry-After") == "1");
  // A resubmission of an accepted job is still the same job.
  CHECK(acme.submit({{"id", "a0"}, {"input", 0}})->status == 202);
  // The other tenant still has its share.
  for (int i = 0; i < 4; ++i)
    CHECK(globex.submit({{"id", "g" + std::to_string(i)}, {"input", i}})->status == 202);
  check_error(globex.submit({{"id", "g4"}, {"input", 4}}), 429, "tenant_quota");
  CHECK(h.service->telemetry().metrics().submissions_refused_tenant_quota == 2);
  // A redelivery is work the tenant asks for as well: held to its share.
  check_error(acme.client().Post("/v1/inferences/dead/redeliver", "", "application/json"), 429,
              "tenant_quota");
  // As its jobs finish, the tenant may submit again.
  h.model->open();
  REQUIRE(rebound::test::eventually([&] { return h.service->telemetry().in_flight() == 0; }));
  CHECK(acme.submit({{"id", "a4"}, {"input", 4}})->status == 202);
}

TEST_CASE("tenants: a flood at priority 0 does not starve another tenant's default-priority job") {
  HarnessOptions o = two_tenants();
  o.workers = 1;
  o.open_model = false;
  Harness h(o);
  const As acme{h, "k-acme"}, globex{h, "k-globex"};
  REQUIRE(globex.submit({{"id", "g-first"}, {"input", "g-first"}, {"priority", 0}})->status == 202);
  REQUIRE(h.model->wait_started(1));  // the one worker holds it
  for (int i = 0; i < 50; ++i) {
    const std::string id = "g" + std::to_string(i);
    REQUIRE(globex.submit({{"id", id}, {"input", id}, {"priority", 0}})->status == 202);
  }
  REQUIRE(acme.submit({{"id", "a-late"}, {"input", "a-late"}})->status == 202);  // priority 5
  REQUIRE(globex.submit({{"id", "g-urgent"}, {"input", "g-urgent"}, {"priority", 0}})->status ==
          202);
  h.model->open();
  REQUIRE(rebound::test::eventually([&] { return h.service->telemetry().in_flight() == 0; }));
  const auto order = h.model->order();
  REQUIRE(order.size() == 53);
  // The tenants take turns: acme's job runs right after globex's next one, not after all 51.
  const auto at = std::find(order.begin(), order.end(), "a-late") - order.begin();
  CHECK(at <= 2);
  CHECK(order.back() == "g-urgent");  // a priority orders globex's own jobs, FIFO within it
}

TEST_CASE("tenants: a tenant's weight is the jobs it takes in a row at its turn") {
  HarnessOptions o = two_tenants();
  o.workers = 1;
  o.open_model = false;
  o.tenants["acme"].weight = 3;
  Harness h(o);
  const As acme{h, "k-acme"}, globex{h, "k-globex"};
  REQUIRE(globex.submit({{"id", "first"}, {"input", "first"}})->status == 202);
  REQUIRE(h.model->wait_started(1));
  for (int i = 0; i < 6; ++i) {
    const std::string a = "a" + std::to_string(i), g = "g" + std::to_string(i);
    REQUIRE(globex.submit({{"id", g}, {"input", g}})->status == 202);
    REQUIRE(acme.submit({{"id", a}, {"input", a}})->status == 202);
  }
  h.model->open();
  REQUIRE(rebound::test::eventually([&] { return h.service->telemetry().in_flight() == 0; }));
  CHECK(h.model->order() == std::vector<std::string>{"first", "g0", "a0", "a1", "a2", "g1", "a3",
                                                     "a4", "a5", "g2", "g3", "g4", "g5"});
}

TEST_CASE("tenants: receivers that are slow but answer hold at most their tenant's share") {
  HarnessOptions o = two_tenants();
  o.origins.max_total = 8;
  o.origins.tenant_share_window = std::chrono::minutes(1);  // acme stays known throughout
  o.callback_timeout = std::chrono::seconds(60);            // globex's wait for the test
  Harness h(o);
  const As acme{h, "k-acme"}, globex{h, "k-globex"};
  rebound::test::Receiver fast;
  // globex's receiver holds every callback until the test lets it answer 200: slow, never
  // failing, so no circuit opens.
  rebound::test::Receiver slow;
  std::mutex m;
  std::condition_variable cv;
  bool let_go = false;
  std::size_t holding = 0, most = 0;
  slow.set_fallback([&](const auto&, httplib::Response&) {
    std::unique_lock<std::mutex> lock(m);
    most = std::max(most, ++holding);
    cv.notify_all();
    cv.wait(lock, [&] { return let_go; });
    --holding;
  });
  auto release = [&] {
    std::lock_guard<std::mutex> lock(m);
    let_go = true;
    cv.notify_all();
  };
  auto held = [&] {
    std::lock_guard<std::mutex> lock(m);
    return holding;
  };
  REQUIRE(acme.submit({{"id", "a-first"}, {"input", 0}, {"callback_url", fast.url()}})->status ==
          202);
  // Delivered as the queue knows it (the receiver records a request before its answer is sent).
  REQUIRE(rebound::test::eventually([&] {
    return json::parse(acme.get("/v1/inferences/a-first")->body)["callback"]["state"] ==
           "delivered";
  }));
  for (int i = 0; i < 20; ++i) {
    const std::string id = "g" + std::to_string(i);
    if (globex.submit({{"id", id}, {"input", i}, {"callback_url", slow.url()}})->status != 202) {
      release();
      FAIL("globex's submission was refused");
    }
  }
  // globex has every place but the one acme reserves (it had one in flight).
  const bool filled = rebound::test::eventually([&] { return held() == 7; });
  // acme's callbacks go out while globex's are all held: one at a time, each answered.
  bool delivered = filled;
  for (int i = 0; delivered && i < 5; ++i) {
    const std::string id = "a" + std::to_string(i);
    delivered =
        acme.submit({{"id", id}, {"input", i}, {"callback_url", fast.url()}})->status == 202 &&
        fast.wait_for(static_cast<std::size_t>(i) + 2, std::chrono::seconds(10));
  }
  const std::size_t held_then = held();
  release();
  CHECK(filled);
  CHECK(delivered);
  CHECK(held_then == 7);  // none of globex's went out in the places acme's freed
  REQUIRE(slow.wait_for(20));
  CHECK(most == 7);
  REQUIRE(rebound::test::eventually([&] { return h.service->telemetry().in_flight() == 0; }));
}

TEST_CASE(
    "tenants: a tenant past its rate gets 429 tenant_rate - per job in batches - the others "
    "do not") {
  auto clock = std::make_shared<rebound::test::FakeClock>();
  HarnessOptions o = two_tenants();
  o.clock = rebound::test::clock_of(clock);
  o.tenants["globex"].rate = 5;
  o.tenants["globex"].burst = 10;
  Harness h(o);
  const As acme{h, "k-acme"}, globex{h, "k-globex"};
  json jobs = json::array();
  for (int i = 0; i < 30; ++i)
    jobs.push_back({{"id", "g" + std::to_string(i)}});
  auto res =
      globex.client().Post("/v1/inferences:batch", json{{"jobs", jobs}}.dump(), "application/json");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  const json answer = json::parse(res->body);
  CHECK(answer["accepted"] == 10);  // the burst
  CHECK(answer["refused"] == 20);
  CHECK(answer["results"][10]["status"] == 429);
  CHECK(answer["results"][10]["error"]["code"] == "tenant_rate");
  CHECK(res->get_header_value("Retry-After") == "1");
  auto one = globex.submit({{"id", "single"}});
  check_error(one, 429, "tenant_rate");
  CHECK(one->get_header_value("Retry-After") == "1");
  // The other tenant is not held to globex's rate (nor to any: none is set for it).
  for (int i = 0; i < 40; ++i)
    CHECK(acme.submit({{"id", "a" + std::to_string(i)}})->status == 202);
  // A second of the queue's clock brings globex five more.
  clock->advance(std::chrono::seconds(1));
  for (int i = 0; i < 5; ++i)
    CHECK(globex.submit({{"id", "later" + std::to_string(i)}})->status == 202);
  check_error(globex.submit({{"id", "later5"}}), 429, "tenant_rate");
  CHECK(h.service->telemetry().metrics().submissions_refused_tenant_rate == 22);
  // A clock stepped back gives nothing for the step, and refills from the new time on.
  clock->advance(-std::chrono::seconds(30));
  check_error(globex.submit({{"id", "stepped"}}), 429, "tenant_rate");
  clock->advance(std::chrono::seconds(1));
  CHECK(globex.submit({{"id", "stepped"}})->status == 202);
  // Its invocations are its jobs too: held to the same rate.
  for (int i = 0; i < 4; ++i)
    CHECK(globex.client().Post("/invocations", "1", "application/json")->status == 200);
  check_error(globex.client().Post("/invocations", "1", "application/json"), 429, "tenant_rate");
  CHECK(acme.client().Post("/invocations", "1", "application/json")->status == 200);
}

#ifdef REBOUND_TEST_REDIS
TEST_CASE("tenants: two servers on one Redis agree whose job is whose") {
  rebound::test::RedisServer redis;
  HarnessOptions o = two_tenants();
  o.make_store = [&] { return rebound::make_store(redis.uri()); };
  Harness one(o), two(o);
  const As acme_one{one, "k-acme"}, acme_two{two, "k-acme"}, globex_two{two, "k-globex"};
  REQUIRE(acme_one.submit({{"id", "shared"}, {"input", 1}})->status == 202);
  REQUIRE(globex_two.submit({{"id", "shared"}, {"input", 2}})->status == 202);
  REQUIRE(rebound::test::eventually([&] {
    const json a = json::parse(acme_two.get("/v1/inferences/shared")->body);
    const json g = json::parse(globex_two.get("/v1/inferences/shared")->body);
    return a["status"] == "succeeded" && g["status"] == "succeeded";
  }));
  // Each tenant finds its own job on the other server, and only its own.
  CHECK(json::parse(acme_two.get("/v1/inferences/shared")->body)["result"] == json{{"echo", 1}});
  CHECK(json::parse(globex_two.get("/v1/inferences/shared")->body)["result"] == json{{"echo", 2}});
  REQUIRE(acme_one.submit({{"id", "acme-only"}, {"input", 3}})->status == 202);
  REQUIRE(rebound::test::eventually(
      [&] { return acme_two.get("/v1/inferences/acme-only")->status == 200; }));
  check_error(globex_two.get("/v1/inferences/acme-only"), 404, "not_found");
}

TEST_CASE("GET /v1/stats: two servers on one Redis report the same queue") {
  rebound::test::RedisServer redis;
  HarnessOptions o;
  o.open_model = false;  // jobs stay queued or running
  o.workers = 1;
  o.make_store = [&] { return rebound::make_store(redis.uri()); };
  Harness one(o), two(o);
  for (int i = 0; i < 4; ++i)
    REQUIRE(one.submit({{"id", "a" + std::to_string(i)}, {"priority", i % 2 ? 3 : 6}})->status ==
            202);
  REQUIRE(two.submit({{"id", "b"}, {"priority", 3}})->status == 202);
  auto stats = [](const Harness& h) {
    auto res = h.client().Get("/v1/stats");
    REQUIRE(res);
    REQUIRE(res->status == 200);
    CHECK(res->get_header_value("Cache-Control") == "no-store");
    return json::parse(res->body);
  };
  // One job runs on each server (one worker each, held); three wait.
  REQUIRE(rebound::test::eventually([&] { return stats(one)["running"] == 2; }));
  const json a = stats(one), b = stats(two);
  for (const char* field : {"queued", "running", "queued_by_priority", "callbacks_waiting"})
    CHECK(a[field] == b[field]);
  CHECK(a["queued"] == 3);
  CHECK(a["queued"].get<int>() ==
        a["queued_by_priority"].value("3", 0) + a["queued_by_priority"].value("6", 0));
  CHECK(a["oldest_queued_seconds"].get<double>() >= 0.0);
  CHECK(a["server"]["in_flight"].is_number());
  // The same numbers in /metrics, for an autoscaler.
  const std::string metrics = two.client().Get("/metrics")->body;
  CHECK(metrics.find("rebound_queue_jobs{state=\"queued\"} 3\n") != std::string::npos);
  CHECK(metrics.find("rebound_queue_jobs{state=\"running\"} 2\n") != std::string::npos);
  CHECK(metrics.find("rebound_queue_oldest_queued_seconds ") != std::string::npos);
  one.model->open();
  two.model->open();
  REQUIRE(rebound::test::eventually([&] {
    const json now = stats(two);
    return now["queued"] == 0 && now["running"] == 0;
  }));
  CHECK(stats(one)["queued_by_priority"] == json::object());
}
#endif

TEST_CASE("GET /v1/stats: several tenants need an operator key") {
  HarnessOptions o = two_tenants();
  o.operator_keys = {"ops:k-ops"};
  Harness h(o);
  const As acme{h, "k-acme"}, ops{h, "k-ops"};
  REQUIRE(acme.submit({{"id", "x"}})->status == 202);
  check_error(acme.get("/v1/stats"), 403, "forbidden");
  auto res = ops.get("/v1/stats");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(json::parse(res->body).contains("callbacks_waiting"));
}
