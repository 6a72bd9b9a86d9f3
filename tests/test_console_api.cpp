// The operator console's JSON routes and page over HTTP, without a browser: who may read and act,
// what each route answers, and that every action is logged by the key's name
// (tests/console/console_test.mjs drives the same in Chromium).
#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "rebound/http/server.hpp"
#include "support/failing_store.hpp"
#include "support/fake_clock.hpp"
#include "support/held_model.hpp"
#include "support/log_lines.hpp"
#include "support/receiver.hpp"
#include "support/server_harness.hpp"
#include "support/submitting.hpp"

using namespace std::chrono_literals;
using nlohmann::json;
using rebound::test::check_error;
using rebound::test::eventually;
using rebound::test::HarnessOptions;
using rebound::test::LogLines;

namespace {

struct Harness : rebound::test::ServerHarness {
  explicit Harness(HarnessOptions o) : ServerHarness(std::make_unique<rebound::EchoModel>(), o) {}
};

// A client of the harness with one key.
struct As {
  const rebound::test::ServerHarness& h;
  std::string key;
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", h.port);
    c.set_read_timeout(10, 0);
    if (!key.empty()) c.set_bearer_token_auth(key.c_str());
    return c;
  }
  httplib::Result get(const std::string& path) const { return client().Get(path.c_str()); }
  httplib::Result post(const std::string& path, const json& body = json::object()) const {
    return client().Post(path.c_str(), body.dump(), "application/json");
  }
  json get_json(const std::string& path) const {
    auto res = get(path);
    REQUIRE(res);
    REQUIRE_MESSAGE(res->status == 200, res->body);
    CHECK(res->get_header_value("Cache-Control") == "no-store");
    return json::parse(res->body);
  }
};

HarnessOptions console_options(LogLines* lines = nullptr) {
  HarnessOptions o;
  o.api_keys = {"acme:k-acme", "globex:k-globex"};
  o.operator_keys = {"ops:k-ops"};
  o.viewer_keys = {"watch:k-watch"};
  o.max_tries = 1;
  o.signing_secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
  if (lines) o.logger = lines->logger();
  return o;
}

std::vector<std::string> ids_in(const json& listing) {
  std::vector<std::string> ids;
  for (const auto& e : listing["jobs"])
    ids.push_back(e["tenant"].get<std::string>() + "/" + e["id"].get<std::string>());
  return ids;
}

}  // namespace

TEST_CASE("console: off without an operator or a viewer key") {
  HarnessOptions o;
  o.api_keys = {"k"};
  Harness h(o);
  const As key{h, "k"};
  check_error(key.get("/console/"), 404, "not_found");
  check_error(key.get("/v1/console/session"), 404, "not_found");
}

TEST_CASE("console: the page is embedded - with a strict policy - and needs no key") {
  Harness h(console_options());
  const As anyone{h, ""};
  auto page = anyone.get("/console/");
  REQUIRE(page);
  CHECK(page->status == 200);
  CHECK(page->get_header_value("Content-Type") == "text/html; charset=utf-8");
  const std::string csp = page->get_header_value("Content-Security-Policy");
  CHECK(csp.find("default-src 'none'") != std::string::npos);
  CHECK(csp.find("script-src 'self'") != std::string::npos);
  CHECK(csp.find("frame-ancestors 'none'") != std::string::npos);
  CHECK(csp.find("unsafe") == std::string::npos);
  CHECK(page->get_header_value("X-Frame-Options") == "DENY");
  CHECK(page->get_header_value("X-Content-Type-Options") == "nosniff");
  CHECK(page->body.find("<script type=\"module\" src=\"/console/app.js\"") != std::string::npos);
  auto script = anyone.get("/console/app.js");
  REQUIRE(script);
  CHECK(script->status == 200);
  CHECK(script->get_header_value("Content-Type") == "text/javascript; charset=utf-8");
  auto bare = anyone.get("/console");
  REQUIRE(bare);
  CHECK(bare->status == 301);
  CHECK(bare->get_header_value("Location") == "/console/");
  check_error(anyone.get("/console/missing.js"), 404, "not_found");
  check_error(anyone.get("/console/../openapi.json"), 404, "not_found");
  // What the page shows needs a key.
  check_error(anyone.get("/v1/console/session"), 401, "unauthorized");
  check_error(As{h, "wrong"}.get("/v1/console/overview"), 401, "unauthorized");
}

TEST_CASE("console: an operator and a viewer sign in - a tenant's key does not") {
  Harness h(console_options());
  const json ops = As{h, "k-ops"}.get_json("/v1/console/session");
  CHECK(ops["role"] == "operator");
  CHECK(ops["name"] == "ops");
  CHECK(ops["tenants"] == json{"acme", "globex", "ops", "watch"});
  CHECK(ops["server_id"] == h.service->operations().server_id());
  const json watch = As{h, "k-watch"}.get_json("/v1/console/session");
  CHECK(watch["role"] == "viewer");
  CHECK(watch["name"] == "watch");
  check_error(As{h, "k-acme"}.get("/v1/console/session"), 403, "forbidden");
  check_error(As{h, "k-acme"}.get("/v1/console/jobs"), 403, "forbidden");
  // A viewer reads what spans tenants, and acts on nothing.
  const As viewer{h, "k-watch"};
  CHECK(viewer.get("/v1/callback-endpoints")->status == 200);
  CHECK(viewer.get("/v1/stats")->status == 200);
  CHECK(viewer.get("/metrics")->status == 200);
  check_error(viewer.post("/v1/callback-endpoints/pause", {{"origin", "http://127.0.0.1:9"}}), 403,
              "forbidden");
  check_error(viewer.post("/v1/console/jobs/x/cancel?tenant=acme"), 403, "forbidden");
  check_error(viewer.post("/v1/console/jobs/x/redeliver?tenant=acme"), 403, "forbidden");
  check_error(viewer.post("/v1/console/dead-letters/redeliver", {{"dry_run", true}}), 403,
              "forbidden");
  CHECK(h.service->operations().paused_origins().empty());
  // Both keys are tenants of the ordinary API as well: a viewer submits and polls its own jobs,
  // and acts on none, its own included.
  auto own = viewer.post("/v1/inferences", {{"id", "mine"}, {"input", 1}});
  REQUIRE(own);
  CHECK(own->status == 202);
  CHECK(viewer.get("/v1/inferences/mine")->status == 200);
  check_error(viewer.client().Delete("/v1/inferences/mine"), 403, "forbidden");
  check_error(viewer.post("/v1/inferences/mine/redeliver"), 403, "forbidden");
  check_error(viewer.get("/v1/webhook-secret"), 403, "forbidden");  // it would sign as rebound
  CHECK(As{h, "k-ops"}.get("/v1/webhook-secret")->status == 200);
  // Every answer of the console's routes is kept by no cache, refusals included.
  for (const auto& res :
       {As{h, ""}.get("/v1/console/jobs"), viewer.post("/v1/console/jobs"),
        As{h, "k-acme"}.get("/v1/console/servers"), viewer.get("/v1/console/nothing-here")}) {
    REQUIRE(res);
    CHECK(res->status >= 400);
    CHECK(res->get_header_value("Cache-Control") == "no-store");
    CHECK(res->get_header_value_count("Cache-Control") == 1);
  }
}

TEST_CASE("console: with an operator or a viewer key every key must be named") {
  rebound::JobQueue queue(std::make_unique<rebound::EchoModel>());
  auto refused = [&](std::vector<std::string> api, std::vector<std::string> operators,
                     std::vector<std::string> viewers) {
    rebound::ServerOptions so("127.0.0.1", 0);
    so.api_keys = std::move(api);
    so.operator_keys = std::move(operators);
    so.viewer_keys = std::move(viewers);
    CHECK_THROWS_AS(rebound::Server(queue, so), rebound::Error);
  };
  // A bare key's name is the key: the console would show it to viewers and log it.
  refused({}, {"opsSecretKey123"}, {});
  refused({}, {"ops:k1"}, {"watchSecret"});
  refused({"tenantSecret"}, {"ops:k1"}, {});
  rebound::ServerOptions fine("127.0.0.1", 0);
  fine.api_keys = {"acme:k-acme"};
  fine.operator_keys = {"ops:k-ops"};
  fine.viewer_keys = {"watch:k-watch"};
  CHECK_NOTHROW(rebound::Server(queue, fine));
}

TEST_CASE("console: dead letters are found - inspected and redelivered - each action logged") {
  LogLines lines;
  Harness h(console_options(&lines));
  rebound::test::Receiver receiver;
  receiver.set_fallback([](const auto&, httplib::Response& res) { res.status = 500; });
  const As acme{h, "k-acme"}, globex{h, "k-globex"}, ops{h, "k-ops"};
  for (const auto& [who, id] : {std::pair{&acme, "dl-1"}, {&acme, "dl-2"}, {&globex, "dl-3"}}) {
    REQUIRE(
        who->post("/v1/inferences", {{"id", id}, {"input", 1}, {"callback_url", receiver.url()}})
            ->status == 202);
  }
  REQUIRE(acme.post("/v1/inferences", {{"id", "ok-1"}, {"input", 2}})->status == 202);
  REQUIRE(eventually(
      [&] { return ops.get_json("/v1/console/jobs?callback_state=failed")["jobs"].size() == 3; }));
  // Filters: by tenant, by id prefix across tenants, by status; entries say whose.
  json failed = ops.get_json("/v1/console/jobs?callback_state=failed");
  CHECK(ids_in(failed) == std::vector<std::string>{"globex/dl-3", "acme/dl-2", "acme/dl-1"});
  CHECK(failed["jobs"][0]["callback"]["last_error"] == "HTTP 500");
  CHECK(ids_in(ops.get_json("/v1/console/jobs?callback_state=failed&tenant=acme")) ==
        std::vector<std::string>{"acme/dl-2", "acme/dl-1"});
  CHECK(ids_in(ops.get_json("/v1/console/jobs?id_prefix=dl-3")) ==
        std::vector<std::string>{"globex/dl-3"});
  CHECK(ids_in(ops.get_json("/v1/console/jobs?tenant=acme&id_prefix=ok")) ==
        std::vector<std::string>{"acme/ok-1"});
  // Pages of one add up to the listing.
  std::vector<std::string> paged;
  std::string cursor;
  for (int i = 0; i < 10; ++i) {
    const json page = ops.get_json("/v1/console/jobs?callback_state=failed&limit=1" +
                                   (cursor.empty() ? "" : "&cursor=" + cursor));
    for (const auto& id : ids_in(page))
      paged.push_back(id);
    if (page["next_cursor"].is_null()) break;
    cursor = page["next_cursor"];
  }
  CHECK(paged == ids_in(failed));
  check_error(ops.get("/v1/console/jobs?status=lost"), 422, "invalid_field", "status");
  check_error(ops.get("/v1/console/jobs?priority=10"), 422, "invalid_field", "priority");
  check_error(ops.get("/v1/console/jobs?tenant=nobody"), 422, "invalid_field", "tenant");
  check_error(ops.get("/v1/console/jobs?cursor=zz"), 422, "invalid_field", "cursor");
  check_error(ops.get("/v1/console/jobs?id_prefix=a%2Fb"), 422, "invalid_field", "id_prefix");

  // One job, whole: the request, and the attempt with its signature scheme.
  json detail = ops.get_json("/v1/console/jobs/dl-1?tenant=acme");
  CHECK(detail["tenant"] == "acme");
  CHECK(detail["input"] == 1);
  CHECK(detail["result"] == 1);  // the echo model's
  CHECK(detail["webhook_events"] == json{"completed"});
  CHECK(detail["inference_seconds"].is_number());
  REQUIRE(detail["attempt_log"].size() == 1);
  CHECK(detail["attempt_log"][0]["status"] == 500);
  CHECK(detail["attempt_log"][0]["error"] == "HTTP 500");
  CHECK(detail["attempt_log"][0]["signatures"] == json{"v1"});
  CHECK(detail["attempt_log"][0]["latency_ms"].is_number());
  check_error(ops.get("/v1/console/jobs/dl-1?tenant=globex"), 404, "not_found");
  check_error(ops.get("/v1/console/jobs/dl-1"), 404, "not_found");
  check_error(ops.get("/v1/console/jobs/dl-1?tenant=nobody"), 404, "not_found");
  // A job of no tenant (stored before the tenants were named) is opened without one.
  REQUIRE(rebound::test::submitted(*h.service, rebound::make_job("legacy", 7)) == "accepted");
  REQUIRE(eventually(
      [&] { return h.service->find("legacy")->status == rebound::JobStatus::succeeded; }));
  CHECK(ops.get_json("/v1/console/jobs/legacy")["tenant"] == "");

  // Bulk redelivery says what it is to do: a body without dry_run changes nothing.
  check_error(ops.post("/v1/console/dead-letters/redeliver", json::object()), 422, "invalid_field");
  check_error(ops.client().Post("/v1/console/dead-letters/redeliver", "", "application/json"), 400,
              "invalid_json");
  check_error(ops.post("/v1/console/dead-letters/redeliver", {{"dry_run", "yes"}}), 422,
              "invalid_field");
  check_error(ops.post("/v1/console/dead-letters/redeliver", {{"dry_run", true}, {"tenant", 3}}),
              422, "invalid_field");

  // How many a bulk redelivery would take, then one by hand, then the rest.
  json counted = json::parse(
      ops.post("/v1/console/dead-letters/redeliver", {{"tenant", "acme"}, {"dry_run", true}})
          ->body);
  CHECK(counted == json{{"matched", 2}, {"redelivered", 0}, {"more", false}});
  CHECK(receiver.count() == 3);
  receiver.set_fallback([](const auto&, httplib::Response& res) { res.status = 200; });
  auto one = ops.post("/v1/console/jobs/dl-3/redeliver?tenant=globex");
  REQUIRE(one);
  CHECK(one->status == 202);
  check_error(ops.post("/v1/console/jobs/ok-1/redeliver?tenant=acme"), 409, "callback_not_failed");
  json all = json::parse(
      ops.post("/v1/console/dead-letters/redeliver", {{"tenant", "acme"}, {"dry_run", false}})
          ->body);
  CHECK(all == json{{"matched", 2}, {"redelivered", 2}, {"more", false}});
  REQUIRE(receiver.wait_for(6));
  REQUIRE(eventually([&] {
    for (const auto& [tenant, id] :
         {std::pair{"acme", "dl-1"}, {"acme", "dl-2"}, {"globex", "dl-3"}}) {
      const json job = ops.get_json(std::string("/v1/console/jobs/") + id + "?tenant=" + tenant);
      if (job["callback"]["state"] != "delivered") return false;
    }
    return true;
  }));
  CHECK(ops.get_json("/v1/console/jobs?callback_state=failed")["jobs"].empty());
  detail = ops.get_json("/v1/console/jobs/dl-1?tenant=acme");
  REQUIRE(detail["attempt_log"].size() == 2);
  CHECK(detail["attempt_log"][1]["status"] == 200);
  CHECK_FALSE(detail["attempt_log"][1].contains("error"));

  // The receiver's origin, with its success rate.
  const json endpoints = ops.get_json("/v1/callback-endpoints")["endpoints"];
  std::size_t delivered = 0, failed_attempts = 0;
  for (const auto& e : endpoints) {
    delivered += e["delivered"].get<std::size_t>();
    failed_attempts += e["failed"].get<std::size_t>();
  }
  CHECK(delivered == 3);
  CHECK(failed_attempts == 3);

  // Every action in the log, by the key's name and never the key.
  const auto actions = lines.of("operator_action");
  REQUIRE(actions.size() == 2);
  CHECK(actions[0]["action"] == "redeliver");
  CHECK(actions[0]["key"] == "ops");
  CHECK(actions[0]["tenant"] == "globex");
  CHECK(actions[0]["id"] == "dl-3");
  CHECK(actions[0]["status"] == 202);
  CHECK(actions[1]["status"] == 409);
  const auto bulk = lines.of("console_redeliver_all");
  REQUIRE(bulk.size() == 1);  // the count alone is not an action
  CHECK(bulk[0]["key"] == "ops");
  CHECK(bulk[0]["redelivered"] == 2);
  CHECK_FALSE(lines.mention("k-ops"));
}

TEST_CASE("console: the overview shows the queue count /metrics shows - counted once a second") {
  // Every open tab refreshes the overview every 5 s: it shares /metrics's count (a backlog of a
  // million jobs takes PostgreSQL half a second to count) instead of counting at each request.
  auto clock = std::make_shared<rebound::test::FakeClock>();
  HarnessOptions o = console_options();
  o.workers = 1;
  o.clock = rebound::test::clock_of(clock);
  rebound::test::ServerHarness h(std::make_unique<rebound::test::HeldModel>(), o);
  auto* model = static_cast<rebound::test::HeldModel*>(h.model_ptr);
  struct OpenAtExit {
    rebound::test::HeldModel* model;
    ~OpenAtExit() { model->open(); }  // nothing may stay held while the server stops
  } open_at_exit{model};
  const As acme{h, "k-acme"}, ops{h, "k-ops"};
  REQUIRE(acme.post("/v1/inferences", {{"id", "busy"}, {"input", 1}})->status == 202);
  REQUIRE(model->wait_started(1));
  REQUIRE(acme.post("/v1/inferences", {{"id", "one"}, {"input", 2}})->status == 202);
  const auto metrics_queued = [&] {
    const auto res = ops.get("/metrics");
    REQUIRE(res);
    REQUIRE(res->status == 200);
    const std::string name = "\nrebound_queue_jobs{state=\"queued\"} ";
    const auto at = res->body.find(name);
    REQUIRE(at != std::string::npos);
    return res->body.substr(at + name.size(), res->body.find('\n', at + 1) - at - name.size());
  };
  CHECK(metrics_queued() == "1");
  REQUIRE(acme.post("/v1/inferences", {{"id", "two"}, {"input", 3}})->status == 202);
  // The same second: the count the scrape made (GET /v1/stats counts at each request).
  CHECK(ops.get_json("/v1/console/overview")["queue"]["queued"] == 1);
  CHECK(ops.get_json("/v1/stats")["queued"] == 2);
  // A second on: the overview counts again, and the scrape shows that count.
  clock->advance(1s);
  REQUIRE(acme.post("/v1/inferences", {{"id", "three"}, {"input", 4}})->status == 202);
  CHECK(ops.get_json("/v1/console/overview")["queue"]["queued"] == 3);
  REQUIRE(acme.post("/v1/inferences", {{"id", "four"}, {"input", 5}})->status == 202);
  CHECK(metrics_queued() == "3");
}

TEST_CASE("console: a failing store leaves the queue out of the overview - the rest is shown") {
  auto control = std::make_shared<rebound::test::FailingStore::Switch>();
  HarnessOptions o = console_options();
  o.make_store = [control] { return std::make_unique<rebound::test::FailingStore>(control); };
  Harness h(o);
  const As acme{h, "k-acme"}, ops{h, "k-ops"};
  REQUIRE(acme.post("/v1/inferences", {{"id", "one"}, {"input", 1}})->status == 202);
  control->fail();
  json overview = ops.get_json("/v1/console/overview");
  CHECK(overview["queue"].is_null());
  CHECK(overview["server"]["accepted"] == 1);
  CHECK(overview["rates"].is_array());
  control->heal();
  overview = ops.get_json("/v1/console/overview");
  REQUIRE(overview["queue"].is_object());
  CHECK(overview["queue"]["queued"].is_number());
}

TEST_CASE("console: an operator cancels a queued job - the overview and servers say what is") {
  LogLines lines;
  HarnessOptions o = console_options(&lines);
  o.workers = 1;
  rebound::test::ServerHarness h(std::make_unique<rebound::test::HeldModel>(), o);
  auto* model = static_cast<rebound::test::HeldModel*>(h.model_ptr);
  struct OpenAtExit {
    rebound::test::HeldModel* model;
    ~OpenAtExit() { model->open(); }  // nothing may stay held while the server stops
  } open_at_exit{model};
  const As acme{h, "k-acme"}, ops{h, "k-ops"};
  REQUIRE(acme.post("/v1/inferences", {{"id", "busy"}, {"input", 1}})->status == 202);
  REQUIRE(model->wait_started(1));
  REQUIRE(acme.post("/v1/inferences", {{"id", "behind"}, {"input", 2}})->status == 202);
  json queued = ops.get_json("/v1/console/jobs?status=queued");
  CHECK(ids_in(queued) == std::vector<std::string>{"acme/behind"});
  json overview = ops.get_json("/v1/console/overview");
  CHECK(overview["queue"]["queued"] == 1);
  CHECK(overview["queue"]["running"] == 1);
  CHECK(overview["queue"]["queued_by_priority"] == json{{"5", 1}});
  CHECK(overview["queue"]["callbacks_failed"] == 0);
  CHECK(overview["server"]["accepted"] == 2);
  CHECK(overview["rates"].is_array());

  auto cancelled = ops.post("/v1/console/jobs/behind/cancel?tenant=acme");
  REQUIRE(cancelled);
  CHECK(cancelled->status == 200);
  CHECK(json::parse(cancelled->body)["status"] == "cancelled");
  CHECK(json::parse(acme.get("/v1/inferences/behind")->body)["status"] == "cancelled");
  check_error(ops.post("/v1/console/jobs/behind/cancel?tenant=acme"), 409, "already_finished");
  check_error(ops.post("/v1/console/jobs/nothing/cancel?tenant=acme"), 404, "not_found");
  model->open();

  const json servers = ops.get_json("/v1/console/servers")["servers"];
  REQUIRE(servers.size() == 1);
  CHECK(servers[0]["id"] == h.service->operations().server_id());
  CHECK(servers[0]["this"] == true);
  const auto actions = lines.of("operator_action");
  REQUIRE(actions.size() == 3);
  CHECK(actions[0]["action"] == "cancel");
  CHECK(actions[0]["key"] == "ops");
  CHECK(actions[0]["status"] == 200);
}
