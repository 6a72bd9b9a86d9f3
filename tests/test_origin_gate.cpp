// OriginGate on a fake clock over a fake transport: limits, the breaker, pauses and deferrals,
// with no socket and no sleep.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rebound/delivery/origin_gate.hpp"
#include "rebound/error.hpp"
#include "support/fake_clock.hpp"
#include "support/fake_transport.hpp"

using namespace std::chrono_literals;
using rebound::CallbackRequest;
using rebound::CallbackResponse;
using rebound::CircuitState;
using rebound::OriginGate;
using rebound::OriginGateOptions;
using rebound::TransportError;
using rebound::test::FakeTransport;

namespace {

struct Fixture {
  std::shared_ptr<rebound::test::FakeClock> clock = std::make_shared<rebound::test::FakeClock>();
  // The inner transport holds every request until the test answers it.
  std::shared_ptr<FakeTransport::Shared> inner = std::make_shared<FakeTransport::Shared>();
  std::unique_ptr<OriginGate> gate;

  explicit Fixture(OriginGateOptions o = {}) {
    inner->hold_all();
    o.clock = rebound::test::steady_of(clock);
    gate = std::make_unique<OriginGate>(std::make_unique<FakeTransport>(inner), o);
  }

  // Sends to `url`; the answer lands in the returned slot.
  std::shared_ptr<std::optional<CallbackResponse>> send(const std::string& url,
                                                        std::chrono::milliseconds timeout = 10s,
                                                        const std::string& tenant = {}) {
    auto answer = std::make_shared<std::optional<CallbackResponse>>();
    CallbackRequest r;
    r.url = url;
    r.timeout = timeout;
    r.tenant = tenant;
    gate->send(std::move(r), [answer](CallbackResponse response) { *answer = response; });
    return answer;
  }

  std::size_t held() const { return inner->held_count(); }
  std::size_t total() const { return inner->count(); }

  // Answers the oldest request the inner transport holds with `status` (or `error`).
  std::string answer(int status, TransportError error = TransportError::none, bool local = false) {
    CallbackResponse r;
    r.error = error;
    r.status = status;
    r.local = local;
    auto request = inner->answer_oldest(r);
    REQUIRE(request.has_value());
    return request->url;
  }

  rebound::EndpointStatus endpoint(const std::string& origin) const {
    for (const auto& e : gate->endpoints())
      if (e.origin == origin) return e;
    return {origin};
  }

  void advance(std::chrono::milliseconds d) { clock->advance(d); }

  // One request of `tenant` to each of `n` origins: http://<host>0.example, <host>1, ...
  void send_each(const std::string& host, int n, const std::string& tenant) {
    for (int i = 0; i < n; ++i)
      send(url_of(host, i), 10s, tenant);
  }
  static std::string url_of(const std::string& host, int i) {
    return "http://" + host + std::to_string(i) + ".example/hook";
  }

  // Answers the oldest request of `tenant` the inner transport holds with `status`.
  void answer_of(const std::string& tenant, int status = 200) {
    REQUIRE(inner->answer_oldest_of(tenant, rebound::test::response(status)).has_value());
  }
};

const std::string a = "http://a.example:8080/hook";
const std::string a_origin = "http://a.example:8080";
const std::string b = "https://b.example/hook";
const std::string b_origin = "https://b.example:443";

bool deferred(const std::shared_ptr<std::optional<CallbackResponse>>& answer) {
  return *answer && (*answer)->error == TransportError::deferred;
}

// A transport of the user's own that throws from `send` while `throws` is above 0 (counting it
// down; -1: always), and else hands the request to a FakeTransport. (CurlTransport never throws.)
class Throwing final : public rebound::CallbackTransport {
 public:
  Throwing(std::shared_ptr<FakeTransport::Shared> shared, std::shared_ptr<std::atomic<int>> n)
      : inner_(std::move(shared)), throws_(std::move(n)) {}
  void send(CallbackRequest r, rebound::CallbackResponseHandler done) override {
    if (*throws_ < 0) throw std::runtime_error("no socket left");
    if (*throws_ > 0) {
      --*throws_;
      throw std::runtime_error("no socket left");
    }
    inner_.send(std::move(r), std::move(done));
  }

 private:
  FakeTransport inner_;
  std::shared_ptr<std::atomic<int>> throws_;
};

}  // namespace

TEST_CASE("gate: within the limits requests go through - a few wait - the rest are deferred") {
  OriginGateOptions o;
  o.max_per_origin = 2;
  o.max_waiting_per_origin = 1;
  Fixture f(o);
  auto r1 = f.send(a), r2 = f.send(a), r3 = f.send(a), r4 = f.send(a), r5 = f.send(a);
  CHECK(f.held() == 2);   // two in flight
  CHECK(!*r3);            // one waits in memory
  REQUIRE(deferred(r4));  // the rest go back to the caller at once, with a time to come back
  REQUIRE(deferred(r5));
  CHECK((*r4)->retry_in > 0ms);
  CHECK((*r5)->retry_in > (*r4)->retry_in);  // one after another, at the origin's pace
  CHECK((*r4)->message.find("at its limits") != std::string::npos);
  auto e = f.endpoint(a_origin);
  CHECK(e.in_flight == 2);
  CHECK(e.waiting == 1);
  CHECK(e.deferred == 2);
  // Another origin has its own share.
  auto other = f.send(b);
  CHECK(f.held() == 3);
  CHECK(!*other);
  // A freed place goes to the one waiting.
  f.answer(200);
  CHECK(*r1);
  CHECK(f.held() == 3);
  CHECK(f.endpoint(a_origin).waiting == 0);
}

TEST_CASE("gate: a transport that throws ends its request as a failed attempt - its place frees") {
  auto clock = std::make_shared<rebound::test::FakeClock>();
  auto inner = std::make_shared<FakeTransport::Shared>();
  inner->hold_all();
  auto throws = std::make_shared<std::atomic<int>>(0);
  OriginGateOptions o;
  o.max_per_origin = 1;
  o.max_waiting_per_origin = 2;
  o.clock = rebound::test::steady_of(clock);
  OriginGate gate(std::make_unique<Throwing>(inner, throws), o);
  std::vector<std::shared_ptr<std::optional<CallbackResponse>>> answers;
  auto send = [&] {
    auto answer = std::make_shared<std::optional<CallbackResponse>>();
    CallbackRequest r;
    r.url = a;
    r.timeout = 10s;
    gate.send(std::move(r), [answer](CallbackResponse response) { *answer = response; });
    answers.push_back(answer);
  };
  auto in_flight = [&] {
    for (const auto& e : gate.endpoints())
      if (e.origin == a_origin) return e.in_flight;
    return std::size_t{0};
  };
  // The first is sent and held; two wait in memory behind it. When it is answered, the next is
  // handed to the transport, which throws: that one ends, failed, and the one after it is sent.
  for (int i = 0; i < 3; ++i)
    send();
  REQUIRE(inner->held_count() == 1);
  *throws = 1;
  REQUIRE(inner->answer_oldest(rebound::test::response(200)));
  REQUIRE(*answers[0]);
  REQUIRE(*answers[1]);
  CHECK((*answers[1])->error == TransportError::io);
  CHECK((*answers[1])->message == "the attempt could not be sent: no socket left");
  CHECK(!*answers[2]);
  CHECK(inner->held_count() == 1);
  CHECK(in_flight() == 1);
  REQUIRE(inner->answer_oldest(rebound::test::response(200)));
  CHECK((*answers[2])->status == 200);
  CHECK(in_flight() == 0);
  // This side's failure: it says nothing of the receiver, and no breaker counts it.
  for (const auto& e : gate.endpoints()) {
    CHECK(e.consecutive_failures == 0);
    CHECK(e.failed == 0);
  }
  // A throw at the first send of an idle origin: its place is free again at once.
  *throws = 1;
  send();
  REQUIRE(*answers[3]);
  CHECK((*answers[3])->error == TransportError::io);
  CHECK(in_flight() == 0);
  send();
  CHECK(inner->held_count() == 1);
  CHECK(!*answers[4]);
  inner->release();
}

TEST_CASE("gate: a long backlog whose every send throws ends - one request after another") {
  // Each request that ends inside its send starts the next: run one after another, not nested
  // (nested, 50,000 of them overflowed the stack).
  auto inner = std::make_shared<FakeTransport::Shared>();
  inner->hold_all();
  auto throws = std::make_shared<std::atomic<int>>(0);
  auto clock = std::make_shared<rebound::test::FakeClock>();
  OriginGateOptions o;
  o.max_per_origin = 1;
  o.breaker_failures = 0;  // (no breaker: nothing else would stop the chain)
  o.clock = rebound::test::steady_of(clock);
  OriginGate gate(std::make_unique<Throwing>(inner, throws), o);
  constexpr int n = 50000;
  std::atomic<int> ended{0}, unsent{0};
  for (int i = 0; i < n; ++i) {
    CallbackRequest r;
    r.url = a;
    r.timeout = 10s;
    gate.send(std::move(r), [&](CallbackResponse response) {
      ++ended;
      if (response.error == TransportError::io) ++unsent;
    });
  }
  REQUIRE(inner->held_count() == 1);  // the first is sent and held; the rest wait behind it
  *throws = -1;
  REQUIRE(inner->answer_oldest(rebound::test::response(200)));
  CHECK(ended == n);
  CHECK(unsent == n - 1);
  for (const auto& e : gate.endpoints()) {
    CHECK(e.in_flight == 0);
    CHECK(e.waiting == 0);
    CHECK(e.consecutive_failures == 0);
  }
}

TEST_CASE("gate: a clock that throws ends no request half-way - the sends after it are made") {
  // A transport of the user's own that, inside one send, ends a request held earlier (which
  // frees a place: the request waiting for it is to be sent by the run under way) and then
  // throws, while the gate's clock throws once. Every request still ends once, its place freed,
  // and the waiting one is sent. (Before, the clock's throw left the gate half-way: the throwing
  // request's place stayed taken and it was never answered, the waiting one was never sent, and
  // the throw reached the caller of `send` although its request had been started.)
  auto inner = std::make_shared<FakeTransport::Shared>();
  inner->hold_all();
  auto clock_throws = std::make_shared<std::atomic<bool>>(false);
  OriginGateOptions o;
  o.max_per_origin = 1;
  o.clock = [clock_throws] {
    if (clock_throws->exchange(false)) throw std::runtime_error("the clock stopped");
    return std::chrono::steady_clock::now();
  };
  class EndsHeldThenThrows final : public rebound::CallbackTransport {
   public:
    EndsHeldThenThrows(std::shared_ptr<FakeTransport::Shared> shared,
                       std::shared_ptr<std::atomic<bool>> clock_throws)
        : shared_(shared), inner_(std::move(shared)), clock_throws_(std::move(clock_throws)) {}
    void send(CallbackRequest r, rebound::CallbackResponseHandler done) override {
      if (r.url != b) return inner_.send(std::move(r), std::move(done));
      shared_->answer_oldest(rebound::test::response(200));
      *clock_throws_ = true;
      throw std::runtime_error("no socket left");
    }

   private:
    std::shared_ptr<FakeTransport::Shared> shared_;
    FakeTransport inner_;
    std::shared_ptr<std::atomic<bool>> clock_throws_;
  };
  OriginGate gate(std::make_unique<EndsHeldThenThrows>(inner, clock_throws), o);
  std::vector<std::optional<CallbackResponse>> answers(3);
  for (std::size_t i = 0; i < 2; ++i) {
    CallbackRequest r;
    r.url = a;
    r.timeout = 10s;
    gate.send(std::move(r), [&answers, i](CallbackResponse response) { answers[i] = response; });
  }
  REQUIRE(inner->held_count() == 1);  // the first is sent and held; the second waits for its place
  CallbackRequest other;
  other.url = b;
  other.timeout = 10s;
  CHECK_NOTHROW(gate.send(std::move(other),
                          [&answers](CallbackResponse response) { answers[2] = response; }));
  REQUIRE(answers[0]);
  CHECK(answers[0]->status == 200);
  REQUIRE(answers[2]);
  CHECK(answers[2]->error == TransportError::io);
  CHECK(answers[2]->message == "the attempt could not be sent: no socket left");
  // The second was handed to the transport.
  REQUIRE(inner->held_count() == 1);
  REQUIRE(inner->answer_oldest(rebound::test::response(201)));
  REQUIRE(answers[1]);
  CHECK(answers[1]->status == 201);
  for (const auto& e : gate.endpoints())
    CHECK(e.in_flight == 0);
}

TEST_CASE("gate: a send made from inside an answer's handler waits until that handler returns") {
  // The inner transport answers on a thread of its own (as CurlTransport does). The handler of
  // that answer sends again, and sees that send's immediate answer (a deferral: the origin is
  // paused) only after it returns, not nested inside its own call.
  auto inner = std::make_shared<FakeTransport::Shared>();
  inner->hold_all();
  OriginGate gate(std::make_unique<FakeTransport>(inner));
  std::atomic<bool> in_handler{false}, nested{false}, deferred{false};
  CallbackRequest first;
  first.url = a;
  first.timeout = 10s;
  gate.send(std::move(first), [&](CallbackResponse) {
    in_handler = true;
    gate.pause(a_origin);
    CallbackRequest again;
    again.url = a;
    again.timeout = 10s;
    gate.send(std::move(again), [&](CallbackResponse r) {
      nested = in_handler.load();
      deferred = r.error == TransportError::deferred;
    });
    in_handler = false;
  });
  REQUIRE(inner->held_count() == 1);
  std::thread answering([&] { inner->answer_oldest(rebound::test::response(200)); });
  answering.join();
  CHECK(deferred);
  CHECK(!nested);
}

TEST_CASE("gate: the pace of deferrals follows how long the origin's attempts take") {
  OriginGateOptions o;
  o.max_per_origin = 1;
  o.max_waiting_per_origin = 1;
  Fixture f(o);
  f.send(a);
  f.send(a);      // waits
  f.advance(4s);  // the receiver takes 4 s to answer
  f.answer(200);  // the one waiting goes
  f.send(a);      // waits again
  auto d1 = f.send(a), d2 = f.send(a), d3 = f.send(a);
  REQUIRE(deferred(d1));
  REQUIRE(deferred(d2));
  REQUIRE(deferred(d3));
  CHECK((*d1)->retry_in == 4s);  // when the one in flight should be done
  CHECK((*d2)->retry_in == 8s);  // and one more place each 4 s after
  CHECK((*d3)->retry_in == 12s);
  // Never later than the attempt's own timeout for the first.
  o.max_waiting_per_origin = 0;
  Fixture g(o);
  g.send(a);
  auto capped = g.send(a, 300ms);
  REQUIRE(deferred(capped));
  CHECK((*capped)->retry_in == 300ms);
}

TEST_CASE("gate: a fast origin keeps its backlog in memory - a slow one is held to the bound") {
  OriginGateOptions o;
  o.max_per_origin = 2;
  o.max_waiting_per_origin = 3;
  o.quick_backlog = 1s;
  SUBCASE("answers in 10 ms: 200 waiting would go in 1 s - all wait, none is deferred") {
    Fixture f(o);
    f.send(a);
    f.send(a);  // (one stays in flight: an idle origin is forgotten, its latency too)
    f.advance(10ms);
    f.answer(200);  // measured: 10 ms an attempt, so 2 in flight send 200 a second
    std::vector<std::shared_ptr<std::optional<CallbackResponse>>> answers;
    for (int i = 0; i < 202; ++i)
      answers.push_back(f.send(a));
    CHECK(f.held() == 2);
    CHECK(f.endpoint(a_origin).waiting == 200);  // far over the count bound, within the time
    CHECK(f.endpoint(a_origin).deferred == 1);
    CHECK(std::none_of(answers.begin(), answers.end() - 1, deferred));
    REQUIRE(deferred(answers.back()));  // a 201st waiting would pass the second
  }
  SUBCASE("answers in 2 s: the bound of 3 holds, the rest go to the store") {
    Fixture f(o);
    f.send(a);
    f.send(a);
    f.advance(2s);
    f.answer(200);
    f.send(a);
    auto w1 = f.send(a), w2 = f.send(a), w3 = f.send(a), d = f.send(a);
    CHECK(f.endpoint(a_origin).waiting == 3);
    CHECK(!*w1);
    CHECK(!*w3);
    REQUIRE(deferred(d));
  }
  SUBCASE("a new origin is not known to be fast: the bound holds") {
    Fixture f(o);
    for (int i = 0; i < 5; ++i)
      f.send(a);
    auto d = f.send(a);
    REQUIRE(deferred(d));
  }
}

TEST_CASE("gate: failures open the circuit - nothing is sent - deferred to the probe") {
  OriginGateOptions o;
  o.breaker_failures = 3;
  o.breaker_cooldown = 30s;
  Fixture f(o);
  f.send(a);
  f.answer(503);
  f.send(a);
  f.answer(0, TransportError::timeout);
  CHECK(f.endpoint(a_origin).state == CircuitState::closed);
  f.send(a);
  f.answer(0, TransportError::connect_failed);  // the third in a row: open
  auto e = f.endpoint(a_origin);
  CHECK(e.state == CircuitState::open);
  CHECK(e.consecutive_failures == 3);
  f.advance(10s);
  auto later = f.send(a);
  REQUIRE(deferred(later));
  CHECK((*later)->retry_in == 20s);  // due when the cool-down ends
  CHECK((*later)->message.find("circuit is open") != std::string::npos);
  CHECK(f.total() == 3);  // nothing more reached the receiver
  CHECK(f.endpoint(a_origin).deferred == 1);
  // Other origins are not touched.
  f.send(b);
  CHECK(f.held() == 1);
  f.answer(200);
}

TEST_CASE("gate: what waits in memory when the circuit opens goes back to its caller") {
  OriginGateOptions o;
  o.breaker_failures = 1;
  o.breaker_cooldown = 30s;
  o.max_per_origin = 1;
  Fixture f(o);
  f.send(a);
  auto waiting = f.send(a);
  CHECK(!*waiting);
  f.answer(500);
  REQUIRE(deferred(waiting));
  CHECK((*waiting)->retry_in == 30s);
  CHECK(f.held() == 0);
  CHECK(f.endpoint(a_origin).waiting == 0);
}

TEST_CASE("gate: after the cool-down one probe goes - its success closes the circuit") {
  OriginGateOptions o;
  o.breaker_failures = 1;
  o.breaker_cooldown = 5s;
  Fixture f(o);
  f.send(a);
  f.answer(500);
  CHECK(f.endpoint(a_origin).state == CircuitState::open);
  f.advance(5s);
  CHECK(f.endpoint(a_origin).state == CircuitState::half_open);
  auto probe = f.send(a);
  CHECK(f.held() == 1);
  auto behind = f.send(a);  // the probe is out: no second request
  REQUIRE(deferred(behind));
  CHECK((*behind)->message.find("probe") != std::string::npos);
  CHECK(f.held() == 1);
  f.answer(200);
  REQUIRE(*probe);
  CHECK((*probe)->status == 200);
  auto e = f.endpoint(a_origin);
  CHECK(e.state == CircuitState::closed);
  CHECK(e.deferred == 0);
  // Closed again: requests go.
  f.send(a);
  f.send(a);
  CHECK(f.held() == 2);
}

TEST_CASE("gate: a failed probe opens the circuit for another cool-down") {
  OriginGateOptions o;
  o.breaker_failures = 2;
  o.breaker_cooldown = 5s;
  Fixture f(o);
  f.send(a);
  f.send(a);
  f.answer(502);
  f.answer(502);
  f.advance(5s);
  f.send(a);  // the probe
  f.advance(1s);
  f.answer(503);
  CHECK(f.endpoint(a_origin).state == CircuitState::open);
  auto next = f.send(a);
  REQUIRE(deferred(next));
  CHECK((*next)->retry_in == 5s);
}

TEST_CASE("gate: answers that say nothing of the receiver neither open nor close the circuit") {
  OriginGateOptions o;
  o.breaker_failures = 2;
  Fixture f(o);
  f.send(a);
  f.send(a);
  f.send(a);
  f.send(a);
  f.answer(503);
  f.answer(0, TransportError::cancelled);
  f.answer(0, TransportError::refused_address);
  f.answer(0, TransportError::io, /*local=*/true);  // this side's own trouble (no descriptors)
  CHECK(f.endpoint(a_origin).consecutive_failures == 1);
  CHECK(f.endpoint(a_origin).state == CircuitState::closed);
  // A 404 is an answer: the receiver is up.
  f.send(a);
  f.answer(404);
  // Healthy and idle: forgotten by the breaker, listed only with its counts.
  REQUIRE(f.gate->endpoints().size() == 1);
  CHECK(f.endpoint(a_origin).state == CircuitState::closed);
  CHECK(f.endpoint(a_origin).consecutive_failures == 0);
  CHECK(f.endpoint(a_origin).in_flight == 0);
  CHECK(f.endpoint(a_origin).failed == 2);  // the 503 and the 404: what said nothing is not counted
}

TEST_CASE("gate: a paused origin gets nothing until resumed") {
  OriginGateOptions o;
  o.max_per_origin = 1;
  o.paused_retry = 60s;
  Fixture f(o);
  f.send(a);
  auto waiting = f.send(a);
  CHECK(f.gate->pause("http://a.example:8080") == a_origin);
  REQUIRE(deferred(waiting));  // what waited goes back at once
  CHECK((*waiting)->retry_in == 60s);
  auto later = f.send(a);
  REQUIRE(deferred(later));
  CHECK((*later)->message.find("paused") != std::string::npos);
  CHECK(f.gate->paused() == std::vector<std::string>{a_origin});
  CHECK(f.endpoint(a_origin).paused);
  f.answer(200);                       // what was in flight ends as it will
  CHECK(f.endpoint(a_origin).paused);  // and a paused origin is not forgotten
  CHECK(f.gate->resume(a));
  CHECK(!f.gate->resume(a));  // not paused any more
  f.send(a);
  CHECK(f.held() == 1);
  CHECK(f.gate->paused().empty());
  CHECK_THROWS_AS(f.gate->pause("ftp://x"), rebound::Error);
}

TEST_CASE("gate: origins waiting only for the total limit take turns") {
  OriginGateOptions o;
  o.max_total = 3;
  Fixture f(o);
  for (int i = 0; i < 5; ++i)
    f.send(a);  // three in flight, two waiting
  f.send(b);    // waiting, listed after a
  CHECK(f.held() == 3);
  // Each freed place goes to the next origin listed, one request each: a busy origin goes to the
  // back, so b's one request goes before a's last.
  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i)
    order.push_back(f.answer(200));
  CHECK(order == std::vector<std::string>{a, a, a, a, b, a});
}

TEST_CASE("gate: tenants waiting only for the total limit take turns - not their origins") {
  OriginGateOptions o;
  o.max_total = 2;
  Fixture f(o);
  std::vector<std::string> evil;
  for (int i = 0; i < 4; ++i)
    evil.push_back(Fixture::url_of("e", i));
  for (const auto& url : evil) {
    f.send(url, 10s, "evil");  // e0 twice in flight; e1, e2 and e3 wait, listed in that order
    f.send(url, 10s, "evil");
  }
  for (int i = 0; i < 3; ++i)
    f.send(a, 10s, "acme");  // waits behind evil's three origins
  REQUIRE(f.held() == 2);
  // Each freed place goes to the next tenant: evil's many origins count as one turn. (acme's
  // first: evil holds more than its share, one of the two places, until e0's second answer.)
  std::vector<std::string> order;
  for (int i = 0; i < 8; ++i)
    order.push_back(f.answer(200));
  CHECK(order == std::vector<std::string>{evil[0], evil[0], a, evil[1], a, evil[2], a, evil[3]});
}

TEST_CASE("gate: a tenant alone has every place - beside another its share") {
  OriginGateOptions o;
  o.max_total = 4;
  Fixture f(o);
  f.send_each("e", 6, "evil");  // slow receivers that will answer: no circuit opens
  CHECK(f.held() == 4);         // alone: the whole pool
  f.send(a, 10s, "acme");       // no place free: waits
  CHECK(f.held() == 4);
  // The next place freed goes to acme, not to evil's waiting ones: evil is over its half.
  f.answer_of("evil");
  CHECK(f.inner->held_tenants() == std::vector<std::string>{"evil", "evil", "evil", "acme"});
  // acme's receiver answers: it keeps a reservation of one place, which evil does not take...
  f.answer_of("acme");
  CHECK(f.held() == 3);
  // ...so acme's next callback goes out at once, though evil still has callbacks waiting.
  auto next = f.send(a, 10s, "acme");
  CHECK(f.held() == 4);
  CHECK(f.inner->held_tenants().back() == "acme");
  CHECK(!deferred(next));
  // evil gets places back only below its share (two of four while acme is busy).
  f.answer_of("evil");
  CHECK(f.held() == 3);
  f.answer_of("evil");
  CHECK(f.held() == 3);  // evil had 1 in flight, below its 2: its waiting one went
  CHECK(f.inner->count_to("//e4.") == 1);
}

TEST_CASE("gate: a tenant's reservation ends with its window - then the other has every place") {
  OriginGateOptions o;
  o.max_total = 4;
  o.tenant_share_window = 1s;
  Fixture f(o);
  f.send(a, 10s, "acme");
  f.answer_of("acme");  // acme idle, reserving one
  f.send_each("e", 6, "evil");
  CHECK(f.held() == 3);  // all but acme's reserved place
  f.advance(1001ms);
  f.answer_of("evil");
  CHECK(f.held() == 4);  // the reservation is over: evil fills the pool again
  CHECK(f.inner->held_tenants() == std::vector<std::string>(4, "evil"));
}

TEST_CASE("gate: a share that grows is filled at once - in the order the requests came") {
  OriginGateOptions o;
  o.max_total = 8;
  Fixture f(o);
  auto url = [](int i) { return "http://e.example/hook?n=" + std::to_string(i); };
  f.send(a, 10s, "acme");
  for (int i = 0; i < 10; ++i)
    f.send(url(i), 10s, "evil");  // one origin: half the total while acme is busy, 6 wait
  CHECK(f.held() == 5);
  // acme is answered: it reserves one place, and evil's share grows from 4 to 7 at once.
  f.answer_of("acme");
  CHECK(f.held() == 7);
  f.send(url(10), 10s, "evil");  // waits behind the three still waiting
  CHECK(f.held() == 7);
  std::vector<std::string> sent;
  for (const auto& r : f.inner->requests())
    if (r.tenant == "evil") sent.push_back(r.url);
  CHECK(sent == std::vector<std::string>{url(0), url(1), url(2), url(3), url(4), url(5), url(6)});
  // A place freed goes to the oldest waiting.
  f.answer_of("evil");
  CHECK(f.inner->requests().back().url == url(7));
}

TEST_CASE("gate: a tenant that had every place reserves at most half of them") {
  OriginGateOptions o;
  o.max_total = 8;
  Fixture f(o);
  f.send_each("b", 8, "burst");
  CHECK(f.held() == 8);
  for (int i = 0; i < 8; ++i)
    f.answer_of("burst");
  // Within burst's window: another tenant still gets the half burst does not reserve.
  f.send_each("s", 6, "steady");
  CHECK(f.held() == 4);
}

TEST_CASE("gate: one tenant - the shares change nothing") {
  OriginGateOptions o;
  o.max_total = 3;
  Fixture f(o);
  f.send_each("o", 3, "acme");
  CHECK(f.held() == 3);
  f.answer(200);
  f.send(a, 10s, "acme");
  CHECK(f.held() == 3);
}

TEST_CASE("gate: a probe waiting only for the total limit goes out when a place frees") {
  OriginGateOptions o;
  o.max_total = 1;
  o.breaker_failures = 1;
  o.breaker_cooldown = 2s;
  Fixture f(o);
  f.send(a);
  f.answer(503);  // opens
  f.send(b);      // takes the one place
  f.advance(2s);
  auto probe = f.send(a);  // half-open, but no place in total: deferred, not held
  CHECK(f.held() == 1);
  REQUIRE(deferred(probe));
  CHECK(f.answer(200) == b);
  auto again = f.send(a);
  CHECK(f.held() == 1);
  f.answer(200);
  REQUIRE(*again);
  CHECK((*again)->status == 200);
  CHECK(f.endpoint(a_origin).state == CircuitState::closed);
}

TEST_CASE(
    "gate: hung origins cannot take the last eighth of the total - origins that answer still get "
    "places") {
  OriginGateOptions o;
  o.max_total = 256;  // 32 places kept for origins that answer, 2 at most each
  o.max_per_origin = 64;
  Fixture f(o);
  const auto to = [](const std::string& url) {
    return [url](const CallbackRequest& r) { return r.url == url; };
  };
  // A healthy origin, heard from once (and kept: it is busy with a second callback).
  f.send(b);
  f.send(b);
  REQUIRE(f.inner->answer_oldest_if(rebound::test::response(200), to(b)));
  // Four hung origins: they never answer. The first request of each may take any place, the
  // rest only the first 224.
  for (int i = 0; i < 64; ++i) {
    for (int h = 1; h <= 4; ++h)
      f.send(Fixture::url_of("h", h));
  }
  CHECK(f.held() == 224);  // b's one and 223 of the hung origins'
  CHECK(f.inner->count_to("//h") == 223);
  // The healthy origin gets a second place in the kept ones, not a third; a new origin gets one
  // for its first request. (count_to counts the requests sent to an origin so far.)
  f.send(b);
  auto b_third = f.send(b);
  const std::string n = Fixture::url_of("n", 1);
  f.send(n);
  auto n_second = f.send(n);
  CHECK(f.held() == 226);
  CHECK(f.inner->count_to("//b.example") == 3);
  CHECK(f.inner->count_to("//n1.example") == 1);
  CHECK(!*b_third);   // waits: an origin that answers has at most 2 of the kept places
  CHECK(!*n_second);  // waits: n has not answered yet
  // n answers: its next callback takes the place freed, not the hung origins' that waited first.
  REQUIRE(f.inner->answer_oldest_if(rebound::test::response(200), to(n)));
  CHECK(f.held() == 226);
  CHECK(f.inner->count_to("//n1.example") == 2);
  CHECK(f.inner->count_to("//h") == 223);
  // A hung origin's attempt times out (a failure): the place it frees stays for those that answer.
  CallbackResponse timed_out;
  timed_out.error = TransportError::timeout;
  REQUIRE(f.inner->answer_oldest_if(
      timed_out, [](const CallbackRequest& r) { return r.url.find("//h") != std::string::npos; }));
  CHECK(f.held() == 225);
  CHECK(f.inner->count_to("//h") == 223);
  f.send(Fixture::url_of("m", 1));
  CHECK(f.held() == 226);
}

TEST_CASE(
    "gate: a circuit's probe may take a kept place - a receiver back up is not held out by hung "
    "ones") {
  OriginGateOptions o;
  o.max_total = 16;  // 2 places kept
  o.breaker_failures = 1;
  o.breaker_cooldown = 2s;
  Fixture f(o);
  const std::string p = Fixture::url_of("p", 1);
  f.send(p);
  f.answer(503);  // p's circuit opens
  for (int i = 0; i < 16; ++i)
    f.send(Fixture::url_of("h", 1));  // hung: 14 in flight, the rest wait
  CHECK(f.held() == 14);
  f.advance(2s);
  auto probe = f.send(p);
  CHECK(!*probe);  // sent, not deferred
  CHECK(f.held() == 15);
  REQUIRE(f.inner->answer_oldest_if(rebound::test::response(200),
                                    [&](const CallbackRequest& r) { return r.url == p; }));
  REQUIRE(*probe);
  CHECK((*probe)->status == 200);
  CHECK(f.endpoint("http://p1.example:80").state == CircuitState::closed);
}

TEST_CASE("gate: destroying it answers what waits - cancelled - once each") {
  OriginGateOptions o;
  o.max_per_origin = 1;
  Fixture f(o);
  auto in_flight = f.send(a);
  auto waiting = f.send(a);
  f.gate.reset();
  REQUIRE(*waiting);
  CHECK((*waiting)->error == TransportError::cancelled);
  CHECK(!*in_flight);  // the inner transport's to answer (it was destroyed holding it)
}

TEST_CASE("gate: an idle origin is forgotten - an open one once its cool-down passed") {
  OriginGateOptions o;
  o.breaker_failures = 1;
  o.breaker_cooldown = 1s;
  Fixture f(o);
  f.send(a);
  f.answer(200);
  // Idle: nothing of it is kept but its counts (for the console's success rate).
  auto listed = f.gate->endpoints();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].state == CircuitState::closed);
  CHECK(listed[0].in_flight == 0);
  CHECK(listed[0].delivered == 1);
  CHECK(listed[0].failed == 0);
  f.send(a);
  f.answer(500);
  listed = f.gate->endpoints();
  REQUIRE(listed.size() == 1);  // open: kept, with its failures
  CHECK(listed[0].state == CircuitState::open);
  CHECK(listed[0].consecutive_failures == 1);
  CHECK(listed[0].delivered == 1);
  CHECK(listed[0].failed == 1);
}

TEST_CASE("gate: the counts of at most 1024 origins are kept - the least recent go first") {
  Fixture f;
  for (int i = 0; i < 1030; ++i) {
    f.send("http://host-" + std::to_string(i) + ".test/hook");
    f.answer(200);
  }
  const auto listed = f.gate->endpoints();
  CHECK(listed.size() == 1024);
  CHECK(std::none_of(listed.begin(), listed.end(), [](const rebound::EndpointStatus& e) {
    return e.origin == "http://host-0.test:80";
  }));
  CHECK(std::any_of(listed.begin(), listed.end(), [](const rebound::EndpointStatus& e) {
    return e.origin == "http://host-1029.test:80";
  }));
}

TEST_CASE("gate: an origin still in use keeps its counts while 1024 others come and go") {
  Fixture f;
  // a: one failed attempt, then one that hangs (its origin stays in use, answering least often).
  f.send(a, 10s, "slow");
  f.answer_of("slow", 500);
  f.send(a, 10s, "slow");
  for (int i = 0; i < 1030; ++i) {
    f.send("http://host-" + std::to_string(i) + ".test/hook", 10s, "busy");
    f.answer_of("busy");
  }
  CHECK(f.endpoint(a_origin).failed == 1);
  CHECK(f.endpoint(a_origin).in_flight == 1);
  CHECK(f.gate->endpoints().size() == 1024);
}

TEST_CASE("gate: forty origins in use keep their counts while 1100 others come and go") {
  Fixture f;
  // Each: one failed attempt, then one that hangs. They answered before all the others, so by
  // the order of answers alone they would go first.
  for (int i = 0; i < 40; ++i) {
    const std::string url = Fixture::url_of("slow", i);
    f.send(url, 10s, "slow");
    REQUIRE(f.inner->answer_oldest_if(rebound::test::response(500),
                                      [&](const CallbackRequest& r) { return r.url == url; }));
    f.send(url, 10s, "slow");
  }
  for (int i = 0; i < 1100; ++i) {
    f.send("http://host-" + std::to_string(i) + ".test/hook", 10s, "busy");
    f.answer_of("busy");
  }
  const auto listed = f.gate->endpoints();
  CHECK(listed.size() == 1024);
  for (int i = 0; i < 40; ++i) {
    CAPTURE(i);
    CHECK(f.endpoint("http://slow" + std::to_string(i) + ".example:80").failed == 1);
  }
  // The forgotten go in the order they were forgotten: the first busy ones.
  CHECK(std::none_of(listed.begin(), listed.end(), [](const rebound::EndpointStatus& e) {
    return e.origin == "http://host-75.test:80";
  }));
  CHECK(std::any_of(listed.begin(), listed.end(), [](const rebound::EndpointStatus& e) {
    return e.origin == "http://host-116.test:80";
  }));
}

TEST_CASE("gate: bad options and a bad URL") {
  CHECK_THROWS_AS(OriginGate(nullptr), rebound::Error);
  OriginGateOptions o;
  o.max_per_origin = 0;
  CHECK_THROWS_AS(OriginGate(std::make_unique<FakeTransport>(), o), rebound::Error);
  Fixture f;
  f.send("ftp://x/y");  // passed on as it is: the transport says what is wrong
  CHECK(f.held() == 1);
  CHECK(OriginGate::origin_of("https://H.example/x") == "https://h.example:443");
  CHECK(OriginGate::origin_of("not a url").empty());
}

TEST_CASE("gate: each tenant has its own circuit at an origin - a pause holds them all") {
  OriginGateOptions o;
  o.breaker_failures = 1;
  o.breaker_cooldown = 30s;
  Fixture f(o);
  f.send(a, 10s, "mallory");
  f.answer(503);  // mallory's callbacks to a's origin fail: its circuit there opens
  REQUIRE(deferred(f.send(a, 10s, "mallory")));
  // alice's callbacks to the same origin still go.
  auto alice = f.send(a, 10s, "alice");
  CHECK(!*alice);
  CHECK(f.held() == 1);
  f.answer(200);
  const auto listed = f.gate->endpoints();
  REQUIRE(listed.size() ==
          2);  // sorted by (origin, tenant): alice's idle entry, mallory's open one
  CHECK(listed[0].tenant == "alice");
  CHECK(listed[0].state == CircuitState::closed);
  CHECK(listed[0].delivered == 1);
  CHECK(listed[1].tenant == "mallory");
  CHECK(listed[1].state == CircuitState::open);
  // A pause is the origin's, whoever sends.
  f.gate->pause(a);
  CHECK(deferred(f.send(a, 10s, "alice")));
  CHECK(f.gate->endpoints().size() == 2);
}

TEST_CASE("gate: what an open circuit defers comes back spread out - not all at once") {
  OriginGateOptions o;
  o.breaker_failures = 1;
  o.breaker_cooldown = 30s;
  o.max_per_origin = 4;
  Fixture f(o);
  f.send(a);
  f.advance(2s);
  f.answer(503);  // opens; the receiver took 2 s
  std::vector<std::chrono::milliseconds> due;
  for (int i = 0; i < 5; ++i) {
    auto d = f.send(a);
    REQUIRE(deferred(d));
    due.push_back((*d)->retry_in);
  }
  CHECK(due[0] == 30s);
  for (std::size_t i = 1; i < due.size(); ++i)
    CHECK(due[i] - due[i - 1] == 500ms);  // 2 s a request, 4 at once
}

TEST_CASE("gate: defer_now answers for an open circuit or a pause - nothing for a healthy origin") {
  OriginGateOptions o;
  o.breaker_failures = 1;
  o.breaker_cooldown = 30s;
  Fixture f(o);
  CHECK(!f.gate->defer_now(a, "", 10s));  // unknown, so healthy: send it
  f.send(a);
  f.answer(503);  // opens
  auto held = f.gate->defer_now(a, "", 10s);
  REQUIRE(held);
  CHECK(held->error == TransportError::deferred);
  CHECK(held->retry_in == 30s);
  CHECK(f.endpoint(a_origin).deferred == 1);
  CHECK(!f.gate->defer_now(a, "other-tenant", 10s));  // another tenant's circuit is closed
  CHECK(!f.gate->defer_now(b, "", 10s));
  f.gate->pause(b);
  auto paused = f.gate->defer_now(b, "", 10s);
  REQUIRE(paused);
  CHECK(paused->message.find("paused") != std::string::npos);
  CHECK(f.total() == 1);  // nothing was sent for any of it
}
