// HTTPS callbacks: certificate verification against a certificate authority the test creates.
#include <doctest/doctest.h>

#include <future>
#include <set>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "rebound/delivery/callback_sender.hpp"
#include "rebound/delivery/curl_transport.hpp"
#include "support/receiver.hpp"
#include "support/tls.hpp"

using namespace std::chrono_literals;

namespace {

// A TLS receiver on 127.0.0.1 that records the bodies it is sent.
class TlsReceiver {
 public:
  explicit TlsReceiver(const rebound::test::TestPki& pki)
      : server_(pki.server_cert().c_str(), pki.server_key().c_str()) {
    REQUIRE(server_.is_valid());
    server_.Post("/hook", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mutex_);
      bodies_.push_back(req.body);
      ports_.insert(req.remote_port);
      res.set_content("{}", "application/json");
    });
    server_.set_keep_alive_max_count(100);  // (httplib's default closes after 5 requests)
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~TlsReceiver() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  std::vector<std::string> bodies() {
    std::lock_guard<std::mutex> lock(mutex_);
    return bodies_;
  }
  /// The client ports requests came from: one per connection.
  std::size_t connections() {
    std::lock_guard<std::mutex> lock(mutex_);
    return ports_.size();
  }

 private:
  httplib::SSLServer server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<std::string> bodies_;
  std::set<int> ports_;
};

struct Result {
  rebound::DeliveryReport report;
  std::vector<rebound::AttemptReport> attempts;
};

Result deliver_to(const std::string& url, const std::string& ca_file) {
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  std::thread t([&] { io.run(); });
  rebound::CurlTransportOptions to;
  to.guard = rebound::AddressGuard(true);
  to.ca_cert_file = ca_file;
  rebound::CallbackSenderOptions so;
  so.backoff = rebound::backoff::max_tries(rebound::backoff::constant(10ms), 2);
  so.timeout = 5s;
  Result result;
  {
    rebound::CallbackSender sender(
        io.get_executor(), std::make_unique<rebound::CurlTransport>(io.get_executor(), to), so);
    std::promise<rebound::DeliveryReport> done;
    auto attempts = std::make_shared<std::vector<rebound::AttemptReport>>();
    sender.deliver(
        {"tls-1", url, R"({"id":"tls-1","status":"succeeded","result":1})", "msg_tls-1", 0},
        [attempts](const rebound::AttemptReport& a) { attempts->push_back(a); },
        [&](const rebound::DeliveryReport& r) { done.set_value(r); });
    auto f = done.get_future();
    REQUIRE(f.wait_for(30s) == std::future_status::ready);
    result.report = f.get();
    result.attempts = *attempts;
  }
  work.reset();
  t.join();
  return result;
}

}  // namespace

TEST_CASE(
    "https callbacks are delivered to a receiver whose certificate the configured CA signed") {
  rebound::test::TestPki pki;
  TlsReceiver receiver(pki);
  auto r =
      deliver_to("https://127.0.0.1:" + std::to_string(receiver.port()) + "/hook", pki.ca_cert());
  CHECK(r.report.delivered);
  CHECK(r.report.attempts == 1);
  REQUIRE(receiver.bodies().size() == 1);
  CHECK(receiver.bodies()[0] == R"({"id":"tls-1","status":"succeeded","result":1})");
}

TEST_CASE("https callbacks to a certificate no trusted CA signed fail as TLS errors") {
  rebound::test::TestPki pki;
  rebound::test::TestPki other;  // a different CA
  TlsReceiver receiver(pki);
  auto r =
      deliver_to("https://127.0.0.1:" + std::to_string(receiver.port()) + "/hook", other.ca_cert());
  CHECK_FALSE(r.report.delivered);
  CHECK(r.report.attempts == 2);
  REQUIRE_FALSE(r.attempts.empty());
  CHECK(r.attempts[0].response.error == rebound::TransportError::tls);
  CHECK(receiver.bodies().empty());
}

TEST_CASE("https callbacks check the host name against the certificate") {
  rebound::test::TestPki pki("IP:127.0.0.1");  // valid for the address, not for "localhost"
  TlsReceiver receiver(pki);
  auto r =
      deliver_to("https://localhost:" + std::to_string(receiver.port()) + "/hook", pki.ca_cert());
  CHECK_FALSE(r.report.delivered);
  CHECK(r.attempts[0].response.error == rebound::TransportError::tls);
  CHECK(receiver.bodies().empty());
}

TEST_CASE(
    "https callbacks to one receiver reuse one connection - TLS 1.3's tickets do not end it") {
  // A TLS 1.3 server sends its session tickets after the handshake: records the client reads
  // with the first answer. Were any left unread on the idle connection, the look before reuse
  // would close it and each callback would pay a new handshake.
  rebound::test::TestPki pki;
  TlsReceiver receiver(pki);
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  std::thread t([&] { io.run(); });
  {
    rebound::CurlTransportOptions to;
    to.guard = rebound::AddressGuard(true);
    to.ca_cert_file = pki.ca_cert();
    rebound::CurlTransport transport(io.get_executor(), to);
    for (int i = 0; i < 8; ++i) {
      rebound::CallbackRequest request;
      request.url = "https://127.0.0.1:" + std::to_string(receiver.port()) + "/hook";
      request.body = "{\"n\":" + std::to_string(i) + "}";
      request.timeout = 5s;
      std::promise<rebound::CallbackResponse> answered;
      transport.send(std::move(request),
                     [&](rebound::CallbackResponse r) { answered.set_value(std::move(r)); });
      auto f = answered.get_future();
      REQUIRE(f.wait_for(10s) == std::future_status::ready);
      CHECK(f.get().status == 200);
      std::this_thread::sleep_for(20ms);  // the tickets and anything else have time to arrive
    }
  }
  work.reset();
  t.join();
  CHECK(receiver.bodies().size() == 8);
  CHECK(receiver.connections() == 1);
}
