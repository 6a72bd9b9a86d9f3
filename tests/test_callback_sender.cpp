// CallbackSender over a fake transport (verdicts, schedules, headers) and over the real
// CurlTransport against a real receiver on loopback (5xx, refused connections, timeouts, reuse).
#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <set>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "rebound/delivery/callback_sender.hpp"
#include "rebound/delivery/curl_transport.hpp"
#include "rebound/delivery/webhook_signature.hpp"
#include "rebound/version.hpp"
#include "support/fake_transport.hpp"
#include "support/io_thread.hpp"
#include "support/receiver.hpp"

using namespace std::chrono_literals;
using rebound::AttemptReport;
using rebound::AttemptVerdict;
using rebound::CallbackResponse;
using rebound::CallbackSender;
using rebound::DeliveryReport;
using rebound::TransportError;

using rebound::test::FakeTransport;
using rebound::test::IoThread;

namespace {

// A FakeTransport that answers `script` in order, then 200.
std::unique_ptr<FakeTransport> scripted(std::vector<CallbackResponse> script) {
  auto transport = std::make_unique<FakeTransport>();
  transport->shared()->script.assign(script.begin(), script.end());
  return transport;
}

CallbackResponse status(int code, std::string retry_after = {}) {
  return {TransportError::none, code, std::move(retry_after), {}};
}
CallbackResponse refused() {
  return {TransportError::connect_failed, 0, {}, "connection refused"};
}

// Records what the policy was asked and answers with fixed delays.
struct RecordingPolicy final : rebound::BackoffPolicy {
  explicit RecordingPolicy(std::vector<std::chrono::milliseconds> delays)
      : delays(std::move(delays)) {}
  std::optional<std::chrono::milliseconds> next_delay(
      const rebound::RetryContext& ctx) const override {
    std::lock_guard<std::mutex> lock(m);
    seen.push_back(ctx);
    if (ctx.attempts > static_cast<int>(delays.size())) return std::nullopt;
    return delays[ctx.attempts - 1];
  }
  std::vector<std::chrono::milliseconds> delays;
  mutable std::mutex m;
  mutable std::vector<rebound::RetryContext> seen;
};

struct Outcome {
  std::vector<AttemptReport> attempts;
  DeliveryReport report;
};

Outcome deliver(CallbackSender& sender, rebound::CallbackMessage message) {
  auto attempts = std::make_shared<std::vector<AttemptReport>>();
  std::promise<DeliveryReport> done;
  auto result = done.get_future();
  sender.deliver(
      std::move(message), [attempts](const AttemptReport& a) { attempts->push_back(a); },
      [&done](const DeliveryReport& r) { done.set_value(r); });
  REQUIRE(result.wait_for(30s) == std::future_status::ready);
  return {*attempts, result.get()};
}

rebound::CallbackMessage message(const std::string& url = "http://receiver.test/hook") {
  return {"job-1", url, R"({"id":"job-1","status":"succeeded","result":"OK"})", "msg_job-1", 0, {}};
}

rebound::CallbackSenderOptions fast_options(int tries = 5) {
  rebound::CallbackSenderOptions o;
  o.backoff = rebound::backoff::max_tries(rebound::backoff::exponential(5ms, 2.0, 50ms), tries);
  o.timeout = 2s;
  return o;
}

}  // namespace

TEST_CASE("a 2xx on the first attempt is delivered at once") {
  IoThread io;
  auto transport = scripted(std::vector<CallbackResponse>{status(204)});
  auto sent = transport->shared();
  CallbackSender sender(io.io.get_executor(), std::move(transport), fast_options());
  auto out = deliver(sender, message());
  CHECK(out.report.delivered);
  CHECK(out.report.attempts == 1);
  CHECK(sent->count() == 1);
  CHECK(sender.wait_idle(5s));
  CHECK(sender.in_flight() == 0);
}

TEST_CASE("failed attempts are retried after the policy's delays until one succeeds") {
  IoThread io;
  auto transport = scripted(
      std::vector<CallbackResponse>{status(500), refused(), status(429, "1"), status(200)});
  auto sent = transport->shared();
  auto policy = std::make_shared<RecordingPolicy>(std::vector{20ms, 40ms, 10ms, 10ms});
  auto options = fast_options();
  options.backoff = policy;
  CallbackSender sender(io.io.get_executor(), std::move(transport), options);
  const auto start = std::chrono::steady_clock::now();
  auto out = deliver(sender, message());
  CHECK(std::chrono::steady_clock::now() - start >= 70ms);  // 20 + 40 + 10: timers really wait
  CHECK(out.report.delivered);
  CHECK(out.report.attempts == 4);
  REQUIRE(out.attempts.size() == 4);
  CHECK(out.attempts[0].error == "HTTP 500");
  CHECK(out.attempts[0].next_delay == 20ms);
  CHECK(out.attempts[1].error == "connection refused");
  CHECK(out.attempts[2].error == "HTTP 429");
  CHECK(out.attempts[3].verdict == AttemptVerdict::delivered);
  REQUIRE(policy->seen.size() == 3);
  CHECK(policy->seen[0].attempts == 1);
  CHECK(policy->seen[1].previous_delay == 20ms);
  CHECK(policy->seen[2].retry_after == std::optional<std::chrono::milliseconds>(1000ms));
  CHECK(sent->count() == 4);
}

TEST_CASE("delivery gives up after max tries and reports the last error") {
  IoThread io;
  CallbackSender sender(io.io.get_executor(),
                        scripted(std::vector<CallbackResponse>(10, status(503))), fast_options(3));
  auto out = deliver(sender, message());
  CHECK_FALSE(out.report.delivered);
  CHECK(out.report.attempts == 3);
  CHECK(out.report.last_error == "HTTP 503");
  CHECK(out.attempts.back().verdict == AttemptVerdict::give_up);
}

TEST_CASE("410 Gone and refused addresses stop at once - redirects are retried - not followed") {
  IoThread io;
  SUBCASE("410") {
    CallbackSender sender(io.io.get_executor(),
                          scripted(std::vector<CallbackResponse>{status(410)}), fast_options());
    auto out = deliver(sender, message());
    CHECK_FALSE(out.report.delivered);
    CHECK(out.report.attempts == 1);
  }
  SUBCASE("refused address") {
    CallbackSender sender(
        io.io.get_executor(),
        scripted(std::vector<CallbackResponse>{
            {TransportError::refused_address, 0, {}, "10.0.0.1 is a private address"}}),
        fast_options());
    auto out = deliver(sender, message());
    CHECK_FALSE(out.report.delivered);
    CHECK(out.report.attempts == 1);
    CHECK(out.report.last_error == "10.0.0.1 is a private address");
  }
  SUBCASE("302") {
    CallbackSender sender(
        io.io.get_executor(),
        scripted(std::vector<CallbackResponse>{status(302), status(301), status(200)}),
        fast_options());
    auto out = deliver(sender, message());
    CHECK(out.report.delivered);
    CHECK(out.report.attempts == 3);
  }
}

TEST_CASE("the classifier is a policy the user can replace") {
  IoThread io;
  auto options = fast_options();
  options.classifier = [](const CallbackResponse& r) {
    return r.status == 404 ? AttemptVerdict::give_up : rebound::default_classifier(r);
  };
  CallbackSender sender(io.io.get_executor(), scripted(std::vector<CallbackResponse>{status(404)}),
                        options);
  auto out = deliver(sender, message());
  CHECK_FALSE(out.report.delivered);
  CHECK(out.report.attempts == 1);
}

TEST_CASE(
    "every attempt carries the callback headers - webhook-id stays - the signature verifies") {
  IoThread io;
  auto transport = scripted(std::vector<CallbackResponse>{status(500), status(200)});
  auto sent = transport->shared();
  auto options = fast_options();
  options.signing_secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                             "whsec_bmV3LXNlY3JldC1rZXk="};
  std::atomic<long> clock{1700000000};
  options.now = [&] { return std::chrono::system_clock::from_time_t(clock++); };
  CallbackSender sender(io.io.get_executor(), std::move(transport), options);
  auto msg = message();
  auto out = deliver(sender, msg);
  REQUIRE(out.report.delivered);
  REQUIRE(sent->count() == 2);
  std::set<std::string> timestamps;
  for (const auto& req : sent->requests()) {
    std::map<std::string, std::string> h(req.headers.begin(), req.headers.end());
    CHECK(h["Content-Type"] == "application/json");
    CHECK(h["User-Agent"] == std::string("rebound/") + rebound::version);
    CHECK(h["webhook-id"] == "msg_job-1");
    timestamps.insert(h["webhook-timestamp"]);
    CHECK(req.body == msg.body);
    // Two secrets, two signatures: a receiver holding either one verifies (key rotation).
    CHECK(std::count(h["webhook-signature"].begin(), h["webhook-signature"].end(), ' ') == 1);
    for (const auto& secret : options.signing_secrets) {
      CHECK(rebound::verify_webhook(secret, h["webhook-id"], h["webhook-timestamp"], req.body,
                                    h["webhook-signature"], std::stoll(h["webhook-timestamp"])));
    }
    CHECK_FALSE(rebound::verify_webhook("whsec_b3RoZXI=", h["webhook-id"], h["webhook-timestamp"],
                                        req.body, h["webhook-signature"],
                                        std::stoll(h["webhook-timestamp"])));
  }
  CHECK(timestamps.size() == 2);  // set per attempt
}

TEST_CASE("observers and handlers that throw do not stop a delivery") {
  IoThread io;
  CallbackSender sender(io.io.get_executor(),
                        scripted(std::vector<CallbackResponse>{status(500), status(200)}),
                        fast_options());
  std::promise<int> done;
  sender.deliver(
      message(), [](const AttemptReport&) { throw std::runtime_error("observer"); },
      [&](const DeliveryReport& r) {
        done.set_value(r.attempts);
        throw std::runtime_error("handler");
      });
  auto f = done.get_future();
  REQUIRE(f.wait_for(10s) == std::future_status::ready);
  CHECK(f.get() == 2);
  CHECK(sender.wait_idle(5s));
}

TEST_CASE("a transport that throws costs one attempt - the delivery goes on and ends") {
  // (A transport of the user's own, or an allocation that failed while the request was built.)
  class Throwing final : public rebound::CallbackTransport {
   public:
    void send(rebound::CallbackRequest, rebound::CallbackResponseHandler on_done) override {
      if (++sends == 1) throw std::runtime_error("no socket left");
      on_done(status(200));
    }
    std::atomic<int> sends{0};
  };
  IoThread io;
  auto owned = std::make_unique<Throwing>();
  auto& transport = *owned;
  CallbackSender sender(io.io.get_executor(), std::move(owned), fast_options());
  auto out = deliver(sender, message());
  CHECK(out.report.delivered);
  CHECK(out.report.attempts == 2);
  REQUIRE(out.attempts.size() == 2);
  CHECK(out.attempts[0].error == "the attempt could not be sent: no socket left");
  CHECK(out.attempts[0].response.local);  // this side's failure, as the gate reports it
  CHECK(transport.sends == 2);
  // Its count is given back: a shutdown that waits for deliveries does not wait in vain.
  CHECK(sender.wait_idle(5s));
  CHECK(sender.in_flight() == 0);
  // A single attempt (the queue's way) is reported as failed, not lost.
  transport.sends = 0;
  std::promise<AttemptReport> reported;
  sender.attempt(message(), {}, [&](const AttemptReport& a) { reported.set_value(a); });
  auto report = reported.get_future();
  REQUIRE(report.wait_for(10s) == std::future_status::ready);
  CHECK(report.get().verdict == AttemptVerdict::retry);
  CHECK(sender.wait_idle(5s));
}

TEST_CASE("a transport that answers and then throws - or answers twice - is heard once") {
  class Twice final : public rebound::CallbackTransport {
   public:
    void send(rebound::CallbackRequest, rebound::CallbackResponseHandler on_done) override {
      ++sends;
      on_done(status(500));
      on_done(status(500));
      if (sends == 1) throw std::runtime_error("after the answer");
    }
    std::atomic<int> sends{0};
  };
  IoThread io;
  auto owned = std::make_unique<Twice>();
  auto& transport = *owned;
  CallbackSender sender(io.io.get_executor(), std::move(owned), fast_options(3));
  auto out = deliver(sender, message());
  CHECK(!out.report.delivered);
  CHECK(out.report.attempts == 3);  // one attempt a send, whatever the transport did besides
  CHECK(transport.sends == 3);
  REQUIRE(out.attempts.size() == 3);
  CHECK(out.attempts[0].error == "HTTP 500");
  CHECK(sender.wait_idle(5s));
  CHECK(sender.in_flight() == 0);
}

TEST_CASE("an answer a transport gives for an earlier attempt does not count for the next") {
  // A transport of the user's own that keeps a copy of each handler and, during the next send,
  // calls the earlier attempt's copy again (with a 200) before it answers the attempt under way.
  class Stale final : public rebound::CallbackTransport {
   public:
    void send(rebound::CallbackRequest, rebound::CallbackResponseHandler on_done) override {
      ++sends;
      if (kept) kept(status(200));  // late, for the attempt before
      kept = on_done;
      on_done(status(503));
    }
    std::atomic<int> sends{0};
    rebound::CallbackResponseHandler kept;
  };
  IoThread io;
  auto owned = std::make_unique<Stale>();
  auto& transport = *owned;
  CallbackSender sender(io.io.get_executor(), std::move(owned), fast_options(3));
  struct Free {  // (the kept handler holds the delivery, which holds the transport)
    Stale& transport;
    ~Free() { transport.kept = nullptr; }
  } free_cycle{transport};
  auto out = deliver(sender, message());
  // Each attempt is decided by its own answer: three 503s, no delivery. (When any answer counted
  // for the attempt under way, the stale 200 ended the delivery as delivered at the second.)
  CHECK(!out.report.delivered);
  CHECK(out.report.attempts == 3);
  CHECK(transport.sends == 3);
  REQUIRE(out.attempts.size() == 3);
  for (const auto& a : out.attempts)
    CHECK(a.error == "HTTP 503");
  CHECK(sender.wait_idle(5s));
  CHECK(sender.in_flight() == 0);
}

TEST_CASE("a clock that throws costs attempts - not the delivery") {
  IoThread io;
  auto options = fast_options(2);
  options.now = []() -> std::chrono::system_clock::time_point {
    throw std::runtime_error("no time");
  };
  CallbackSender sender(io.io.get_executor(),
                        scripted(std::vector<CallbackResponse>{status(200), status(200)}), options);
  auto out = deliver(sender, message());
  CHECK(!out.report.delivered);
  CHECK(out.report.attempts == 2);
  REQUIRE(out.attempts.size() == 2);
  CHECK(out.attempts[1].error == "the attempt could not be sent: no time");
  // Each unsent attempt is timed by the system clock: not the epoch, not an earlier attempt's.
  const auto before = std::chrono::system_clock::now() - 60s;
  for (const auto& a : out.attempts) {
    CHECK(a.started_at > before);
    CHECK(a.finished_at >= a.started_at);
  }
  CHECK(out.attempts[1].started_at >= out.attempts[0].finished_at);
  CHECK(sender.wait_idle(5s));
  CHECK(sender.in_flight() == 0);
}

TEST_CASE("a classifier that throws leaves the default's verdict") {
  IoThread io;
  auto options = fast_options();
  options.classifier = [](const CallbackResponse&) -> AttemptVerdict {
    throw std::runtime_error("classifier");
  };
  CallbackSender sender(io.io.get_executor(),
                        scripted(std::vector<CallbackResponse>{status(503), status(204)}), options);
  auto out = deliver(sender, message());
  CHECK(out.report.delivered);
  CHECK(out.report.attempts == 2);
  CHECK(sender.wait_idle(5s));
}

TEST_CASE("bad sender options are refused") {
  IoThread io;
  auto make = [&](rebound::CallbackSenderOptions o) {
    CallbackSender s(io.io.get_executor(), scripted(std::vector<CallbackResponse>{}), std::move(o));
  };
  auto o = fast_options();
  o.signing_secrets = {"not-a-secret"};
  CHECK_THROWS_AS(make(o), rebound::Error);
  o = fast_options();
  o.backoff = nullptr;
  CHECK_THROWS_AS(make(o), rebound::Error);
  o = fast_options();
  o.timeout = 0ms;
  CHECK_THROWS_AS(make(o), rebound::Error);
  CHECK_THROWS_AS(CallbackSender(io.io.get_executor(), nullptr), rebound::Error);
}

// ---- The real transport against a real receiver on loopback ----

namespace {
// CurlTransport behind an OriginGate (as a JobQueue sends), without a breaker: these tests are
// about the sender's own retries.
std::unique_ptr<rebound::CallbackTransport> loopback_transport(boost::asio::io_context& io,
                                                               std::size_t per_origin = 4) {
  rebound::CurlTransportOptions o;
  o.guard = rebound::AddressGuard(true);
  rebound::OriginGateOptions limits;
  limits.max_per_origin = per_origin;
  limits.breaker_failures = 0;
  return std::make_unique<rebound::OriginGate>(
      std::make_unique<rebound::CurlTransport>(io.get_executor(), o), limits);
}
}  // namespace

TEST_CASE("over HTTP: 5xx answers are retried - then the callback is delivered") {
  IoThread io;
  rebound::test::Receiver receiver;
  receiver.script_statuses({500, 503});
  CallbackSender sender(io.io.get_executor(), loopback_transport(io.io), fast_options());
  auto out = deliver(sender, message(receiver.url("/results")));
  CHECK(out.report.delivered);
  CHECK(out.report.attempts == 3);
  auto got = receiver.received();
  REQUIRE(got.size() == 3);
  for (const auto& r : got) {
    CHECK(r.path == "/results");
    CHECK(r.body == message().body);
    CHECK(r.header("webhook-id") == "msg_job-1");
    CHECK(r.header("Content-Type") == "application/json");
  }
}

TEST_CASE("over HTTP: a refused connection is retried until the receiver comes up") {
  IoThread io;
  const int port = rebound::test::unused_port();
  auto options = fast_options(50);
  options.backoff = rebound::backoff::max_tries(rebound::backoff::exponential(20ms, 1.0), 200);
  CallbackSender sender(io.io.get_executor(), loopback_transport(io.io), options);
  auto attempts = std::make_shared<std::atomic<int>>(0);
  std::promise<DeliveryReport> done;
  sender.deliver(
      message("http://127.0.0.1:" + std::to_string(port) + "/hook"),
      [attempts](const AttemptReport& a) {
        if (a.response.error == TransportError::connect_failed) ++*attempts;
      },
      [&](const DeliveryReport& r) { done.set_value(r); });
  REQUIRE(rebound::test::eventually([&] { return *attempts >= 2; }));
  rebound::test::Receiver receiver(port);
  auto f = done.get_future();
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  auto report = f.get();
  CHECK(report.delivered);
  CHECK(report.attempts >= 3);
  CHECK(receiver.count() == 1);
}

TEST_CASE("over HTTP: an answer slower than the timeout is a failed attempt") {
  IoThread io;
  rebound::test::Receiver receiver;
  receiver.script([](const auto&, httplib::Response&) { std::this_thread::sleep_for(1500ms); });
  auto options = fast_options();
  options.timeout = 300ms;
  CallbackSender sender(io.io.get_executor(), loopback_transport(io.io), options);
  auto out = deliver(sender, message(receiver.url()));
  CHECK(out.report.delivered);
  // The slow answer was a failed attempt; a later one (answered at once) delivered. Under a
  // sanitizer a second attempt may time out too: at least two, then.
  REQUIRE(out.attempts.size() >= 2);
  CHECK(out.attempts[0].response.error == TransportError::timeout);
}

TEST_CASE("over HTTP: redirects are not followed") {
  IoThread io;
  rebound::test::Receiver target;
  rebound::test::Receiver receiver;
  receiver.set_fallback([&](const auto&, httplib::Response& res) {
    res.status = 307;
    res.set_header("Location", target.url());
  });
  CallbackSender sender(io.io.get_executor(), loopback_transport(io.io), fast_options(2));
  auto out = deliver(sender, message(receiver.url()));
  CHECK_FALSE(out.report.delivered);
  CHECK(out.report.last_error == "HTTP 307");
  CHECK(receiver.count() == 2);
  CHECK(target.count() == 0);
}

TEST_CASE("over HTTP: the SSRF guard refuses loopback unless private callbacks are allowed") {
  IoThread io;
  rebound::test::Receiver receiver;
  CallbackSender sender(io.io.get_executor(),
                        std::make_unique<rebound::CurlTransport>(io.io.get_executor()),
                        fast_options());
  auto out = deliver(sender, message(receiver.url()));
  CHECK_FALSE(out.report.delivered);
  CHECK(out.report.attempts == 1);
  CHECK(out.attempts[0].response.error == TransportError::refused_address);
  auto by_name =
      deliver(sender, message("http://localhost:" + std::to_string(receiver.port()) + "/x"));
  CHECK_FALSE(by_name.report.delivered);
  CHECK(by_name.attempts[0].response.error == TransportError::refused_address);
  CHECK(receiver.count() == 0);
}

TEST_CASE("over HTTP: connections to a receiver are kept alive and reused") {
  IoThread io;
  rebound::test::Receiver receiver;
  CallbackSender sender(io.io.get_executor(), loopback_transport(io.io, 2), fast_options());
  std::atomic<int> delivered{0};
  for (int i = 0; i < 100; ++i) {
    auto msg = message(receiver.url());
    msg.job_id = "job-" + std::to_string(i);
    sender.deliver(msg, nullptr, [&](const DeliveryReport& r) { delivered += r.delivered; });
  }
  REQUIRE(sender.wait_idle(20s));
  CHECK(delivered == 100);
  std::set<int> connections;
  for (const auto& r : receiver.received())
    connections.insert(r.remote_port);
  CHECK(connections.size() <= 2);  // 100 requests over at most 2 sender connections
}

TEST_CASE("over HTTP: a kept-alive connection the receiver closed does not cost an attempt") {
  IoThread io;
  rebound::test::Receiver receiver;  // closes idle connections after 1 s
  CallbackSender sender(io.io.get_executor(), loopback_transport(io.io, 1), fast_options());
  auto first = deliver(sender, message(receiver.url()));
  CHECK(first.report.attempts == 1);
  std::this_thread::sleep_for(1500ms);  // the receiver drops the idle connection meanwhile
  auto second = deliver(sender, message(receiver.url()));
  CHECK(second.report.delivered);
  CHECK(second.report.attempts == 1);
  CHECK(receiver.count() == 2);
}

TEST_CASE("over HTTP: the receiver's Retry-After lengthens the wait up to the cap") {
  IoThread io;
  rebound::test::Receiver receiver;
  receiver.script([](const auto&, httplib::Response& res) {
    res.status = 503;
    res.set_header("Retry-After", "1");
  });
  auto options = fast_options();
  options.backoff = rebound::backoff::max_tries(
      rebound::backoff::respect_retry_after(rebound::backoff::constant(10ms), 5s), 3);
  CallbackSender sender(io.io.get_executor(), loopback_transport(io.io), options);
  auto out = deliver(sender, message(receiver.url()));
  CHECK(out.report.delivered);
  REQUIRE(out.attempts.size() == 2);
  CHECK(out.attempts[0].next_delay == 1000ms);
  auto got = receiver.received();
  REQUIRE(got.size() == 2);
  CHECK(got[1].at - got[0].at >= 1000ms);
}

TEST_CASE("the policy sees the time elapsed since the first attempt") {
  IoThread io;
  std::mutex m;
  std::vector<std::chrono::milliseconds> elapsed;
  auto options = fast_options();
  options.backoff = rebound::backoff::max_elapsed(
      rebound::backoff::from_function([&](const rebound::RetryContext& ctx) {
        std::lock_guard<std::mutex> lock(m);
        elapsed.push_back(ctx.elapsed);
        return std::optional<std::chrono::milliseconds>(300ms);
      }),
      500ms);  // (the first decision has 200 ms to spare: sanitizers are slow)
  CallbackSender sender(io.io.get_executor(),
                        scripted(std::vector<CallbackResponse>(10, status(500))), options);
  auto out = deliver(sender, message());
  CHECK_FALSE(out.report.delivered);
  CHECK(out.report.attempts == 2);  // the third would start past 500 ms
  REQUIRE(elapsed.size() == 2);
  CHECK(elapsed[1] >= 300ms);
}

namespace {
CallbackResponse deferral(std::chrono::milliseconds retry_in) {
  CallbackResponse r;
  r.error = TransportError::deferred;
  r.retry_in = retry_in;
  r.message = "the receiver's circuit is open (http://receiver.test:80)";
  return r;
}
}  // namespace

TEST_CASE("a deferred request is sent again when the transport asks - no attempt spent") {
  IoThread io;
  auto transport = scripted(
      std::vector<CallbackResponse>{deferral(20ms), deferral(20ms), status(503), status(200)});
  auto sent = transport->shared();
  auto policy = std::make_shared<RecordingPolicy>(std::vector<std::chrono::milliseconds>{5ms});
  auto o = fast_options();
  o.backoff = policy;
  CallbackSender sender(io.io.get_executor(), std::move(transport), o);
  const auto start = std::chrono::steady_clock::now();
  auto out = deliver(sender, message());
  CHECK(std::chrono::steady_clock::now() - start >= 40ms);  // it waited as asked, twice
  CHECK(out.report.delivered);
  CHECK(out.report.attempts == 2);  // the 503 and the 200: deferrals are not attempts
  REQUIRE(out.attempts.size() == 2);
  CHECK(out.attempts[0].attempt == 1);
  CHECK(out.attempts[0].verdict == AttemptVerdict::retry);
  CHECK(sent->count() == 4);
  std::lock_guard<std::mutex> lock(policy->m);
  REQUIRE(policy->seen.size() == 1);  // the policy heard of the failed attempt only
  CHECK(policy->seen[0].attempts == 1);
}

TEST_CASE("attempt: a deferral is reported as deferred - with the transport's delay") {
  IoThread io;
  auto transport = scripted(std::vector<CallbackResponse>{deferral(1500ms)});
  CallbackSender sender(io.io.get_executor(), std::move(transport), fast_options());
  std::promise<AttemptReport> reported;
  auto m = message();
  m.previous_attempts = 3;
  sender.attempt(m, {3, 400ms, 2000ms},
                 [&reported](const AttemptReport& r) { reported.set_value(r); });
  auto f = reported.get_future();
  REQUIRE(f.wait_for(10s) == std::future_status::ready);
  const AttemptReport r = f.get();
  CHECK(r.verdict == AttemptVerdict::deferred);
  CHECK(r.next_delay == 1500ms);
  CHECK(r.attempt == 3);  // the attempts so far: none spent
  CHECK(r.error.find("circuit is open") != std::string::npos);
}

TEST_CASE("deliver gives up a message deferred longer than max_deferral") {
  IoThread io;
  std::vector<CallbackResponse> script(20, deferral(20ms));
  auto transport = scripted(script);
  auto o = fast_options();
  o.max_deferral = 50ms;
  CallbackSender sender(io.io.get_executor(), std::move(transport), o);
  auto out = deliver(sender, message());
  CHECK_FALSE(out.report.delivered);
  CHECK(out.report.attempts == 0);
  CHECK(out.report.last_error.find("max_deferral") != std::string::npos);
}

TEST_CASE("a classifier that answers deferred for a request that was sent gets a retry") {
  IoThread io;
  auto transport = scripted(std::vector<CallbackResponse>{status(202)});
  auto o = fast_options(2);
  o.classifier = [](const CallbackResponse& r) {
    return r.status == 202 ? AttemptVerdict::deferred : AttemptVerdict::delivered;
  };
  CallbackSender sender(io.io.get_executor(), std::move(transport), o);
  auto out = deliver(sender, message());
  REQUIRE(out.attempts.size() == 2);
  CHECK(out.attempts[0].verdict == AttemptVerdict::retry);
  CHECK(out.report.delivered);
}
