// The CallbackTransport contract, passed by every transport the library and its tests use: the
// shipped libcurl transport against a real receiver on loopback, the OriginGate in front of a
// transport, and the tests' FakeTransport. Every send is answered exactly once, with the status
// the receiver gave, also when many are in flight at once.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <boost/asio/post.hpp>

#include "rebound/delivery/curl_transport.hpp"
#include "rebound/delivery/origin_gate.hpp"
#include "support/fake_transport.hpp"
#include "support/io_thread.hpp"
#include "support/receiver.hpp"

using namespace std::chrono_literals;

namespace {

// Each fixture gives a transport whose receiver answers `statuses` in order (then 200), and the
// URL to send to.
struct CurlFixture {
  rebound::test::IoThread io;
  rebound::test::Receiver receiver;
  std::unique_ptr<rebound::CallbackTransport> transport;
  explicit CurlFixture(const std::vector<int>& statuses) {
    receiver.script_statuses(statuses);
    rebound::CurlTransportOptions o;
    o.guard = rebound::AddressGuard(true);  // loopback
    transport = std::make_unique<rebound::CurlTransport>(io.io.get_executor(), o);
  }
  std::string url() const { return receiver.url(); }
  bool settle() {
    auto ran = std::make_shared<std::promise<void>>();
    auto done = ran->get_future();
    boost::asio::post(io.io, [ran] { ran->set_value(); });
    return done.wait_for(10s) == std::future_status::ready;
  }
};

struct FakeFixture {
  std::shared_ptr<rebound::test::FakeTransport::Shared> shared =
      std::make_shared<rebound::test::FakeTransport::Shared>();
  std::unique_ptr<rebound::CallbackTransport> transport;
  explicit FakeFixture(const std::vector<int>& statuses) {
    shared->script_statuses(statuses);
    transport = std::make_unique<rebound::test::FakeTransport>(shared);
  }
  std::string url() const { return "http://receiver.test/hook"; }
  bool settle() { return true; }  // answers inline: nothing runs later
};

struct GateFixture {
  std::shared_ptr<rebound::test::FakeTransport::Shared> shared =
      std::make_shared<rebound::test::FakeTransport::Shared>();
  std::unique_ptr<rebound::CallbackTransport> transport;
  explicit GateFixture(const std::vector<int>& statuses) {
    shared->script_statuses(statuses);
    rebound::OriginGateOptions o;
    o.breaker_failures = 0;  // the contract, not the breaker: every request goes through
    transport = std::make_unique<rebound::OriginGate>(
        std::make_unique<rebound::test::FakeTransport>(shared), o);
  }
  std::string url() const { return "http://receiver.test/hook"; }
  bool settle() { return true; }  // answers inline: nothing runs later
};

rebound::CallbackRequest request(const std::string& url) {
  rebound::CallbackRequest r;
  r.url = url;
  r.headers = {{"Content-Type", "application/json"}};
  r.body = R"({"id":"x","status":"succeeded"})";
  r.timeout = 10s;
  return r;
}

// Sends `n` requests at once; each answer's status, in the order the handlers ran, and how many
// times each handler ran.
struct Sent {
  std::mutex m;
  std::vector<int> statuses;
  std::map<int, int> calls;  // request number -> handler calls
  std::promise<void> all;
  int left = 0;
};

std::shared_ptr<Sent> send_all(rebound::CallbackTransport& transport, const std::string& url,
                               int n) {
  auto sent = std::make_shared<Sent>();
  sent->left = n;
  for (int i = 0; i < n; ++i) {
    transport.send(request(url), [sent, i](rebound::CallbackResponse r) {
      std::lock_guard<std::mutex> lock(sent->m);
      CHECK(r.error == rebound::TransportError::none);
      sent->statuses.push_back(r.status);
      if (++sent->calls[i] == 1 && --sent->left == 0) sent->all.set_value();
    });
  }
  return sent;
}

}  // namespace

TEST_CASE_TEMPLATE("transport contract: one answer a send - with the receiver's status", F,
                   CurlFixture, GateFixture, FakeFixture) {
  F f({503, 200});
  auto first = send_all(*f.transport, f.url(), 1);
  REQUIRE(first->all.get_future().wait_for(20s) == std::future_status::ready);
  auto second = send_all(*f.transport, f.url(), 1);
  REQUIRE(second->all.get_future().wait_for(20s) == std::future_status::ready);
  std::lock_guard<std::mutex> a(first->m), b(second->m);
  CHECK(first->statuses == std::vector<int>{503});
  CHECK(second->statuses == std::vector<int>{200});
}

TEST_CASE_TEMPLATE("transport contract: fifty in flight at once - each answered exactly once", F,
                   CurlFixture, GateFixture, FakeFixture) {
  F f({});
  auto sent = send_all(*f.transport, f.url(), 50);
  REQUIRE(sent->all.get_future().wait_for(30s) == std::future_status::ready);
  f.transport.reset();  // nothing more comes, also not at destruction
  REQUIRE(f.settle());  // what the destruction set going (curl: on its io thread) has run
  std::lock_guard<std::mutex> lock(sent->m);
  CHECK(sent->statuses.size() == 50);
  CHECK(sent->calls.size() == 50);
  for (const auto& [request, calls] : sent->calls) {
    CAPTURE(request);
    CHECK(calls == 1);
  }
}
