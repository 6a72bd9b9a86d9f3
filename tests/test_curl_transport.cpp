// CurlTransport against receivers as they are in the world: slow, hung, trickling, huge, failing,
// all real sockets on loopback.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/socket.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "rebound/delivery/curl_transport.hpp"
#include "rebound/delivery/origin_gate.hpp"
#include "support/io_thread.hpp"
#include "support/raw_receiver.hpp"
#include "support/receiver.hpp"

using namespace std::chrono_literals;
using rebound::CallbackRequest;
using rebound::CallbackResponse;
using rebound::CurlTransport;
using rebound::CurlTransportOptions;
using rebound::TransportError;
using rebound::test::RawReceiver;
using Clock = std::chrono::steady_clock;

using rebound::test::IoThread;

namespace {

CurlTransportOptions loopback(CurlTransportOptions o = {}) {
  o.guard = rebound::AddressGuard(true);
  return o;
}

CallbackRequest request(const std::string& url, std::chrono::milliseconds timeout = 5s) {
  CallbackRequest r;
  r.url = url;
  r.headers = {{"Content-Type", "application/json"}};
  r.body = R"({"id":"x","status":"succeeded"})";
  r.timeout = timeout;
  return r;
}

// One send's answer, and when it came.
struct Answer {
  CallbackResponse response;
  Clock::time_point at;
};

std::shared_future<Answer> send(rebound::CallbackTransport& transport, CallbackRequest r) {
  auto promise = std::make_shared<std::promise<Answer>>();
  std::shared_future<Answer> future = promise->get_future().share();
  transport.send(std::move(r), [promise](CallbackResponse response) {
    promise->set_value({std::move(response), Clock::now()});
  });
  return future;
}

Answer wait(const std::shared_future<Answer>& f) {
  REQUIRE(f.wait_for(30s) == std::future_status::ready);
  return f.get();
}

// Behaviours of raw receivers.
void hang(int fd, const std::atomic<bool>& stopping) {
  RawReceiver::hold(fd, stopping);
}

void trickle(int fd, const std::atomic<bool>& stopping) {
  if (!RawReceiver::read_request(fd, stopping)) return;
  RawReceiver::send_all(fd, "HTTP/1.1 200 OK\r\n");
  while (!stopping && RawReceiver::send_all(fd, "X"))
    std::this_thread::sleep_for(200ms);
}

// Answers with header lines that never end (up to 1 GiB), counting the bytes it sent.
auto endless_headers(std::atomic<std::size_t>& sent) {
  return [&sent](int fd, const std::atomic<bool>& stopping) {
    if (!RawReceiver::read_request(fd, stopping)) return;
    RawReceiver::send_all(fd, "HTTP/1.1 200 OK\r\n");
    const std::string line = "X-Filler: " + std::string(1000, 'a') + "\r\n";
    while (!stopping && sent < (1u << 30) && RawReceiver::send_all(fd, line))
      sent += line.size();
  };
}

void answer_after(int fd, const std::atomic<bool>& stopping, std::chrono::milliseconds delay) {
  while (RawReceiver::read_request(fd, stopping)) {
    std::this_thread::sleep_for(delay);
    if (!RawReceiver::send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")) return;
  }
}

// CurlTransport behind an OriginGate, as a JobQueue uses it: the per-origin limits are the gate's.
std::unique_ptr<rebound::OriginGate> gated(IoThread& io, rebound::OriginGateOptions limits,
                                           CurlTransportOptions o = loopback()) {
  return std::make_unique<rebound::OriginGate>(
      std::make_unique<CurlTransport>(io.io.get_executor(), o), limits);
}

std::string origin_of(const RawReceiver& r) {
  return "http://127.0.0.1:" + std::to_string(r.port());
}

}  // namespace

TEST_CASE("curl: a hung endpoint and a trickling one do not delay another origin") {
  IoThread io;
  RawReceiver hung(hang);
  RawReceiver slow(trickle);
  rebound::test::Receiver healthy;
  rebound::OriginGateOptions limits;
  limits.max_per_origin = 4;
  auto gate = gated(io, limits);
  auto& transport = *gate;
  std::vector<std::shared_future<Answer>> stuck;
  for (int i = 0; i < 8; ++i) {
    // (5 s: the 50 healthy requests fit well within it under a sanitizer's slowdown too.)
    stuck.push_back(send(transport, request(hung.url(), 5s)));
    stuck.push_back(send(transport, request(slow.url(), 5s)));
  }
  const auto start = Clock::now();
  std::vector<std::shared_future<Answer>> good;
  for (int i = 0; i < 50; ++i)
    good.push_back(send(transport, request(healthy.url())));
  Clock::time_point last_good{};
  for (auto& f : good) {
    const Answer a = wait(f);
    CHECK(a.response.error == TransportError::none);
    CHECK(a.response.status == 200);
    last_good = std::max(last_good, a.at);
  }
  // The healthy origin was served while the others still held their requests: none of those
  // had ended yet (they end by their 5 s timeout).
  for (auto& f : stuck)
    CHECK(f.wait_for(0s) == std::future_status::timeout);
  CHECK(last_good - start < 5s);
  // Each sick origin held at most its per-origin share of connections.
  CHECK(hung.most_at_once() <= 4);
  CHECK(slow.most_at_once() <= 4);
  for (auto& f : stuck)
    CHECK(wait(f).response.error == TransportError::timeout);
}

TEST_CASE("curl: the attempt timeout covers the whole attempt - a trickling answer ends on time") {
  IoThread io;
  RawReceiver slow(trickle);
  CurlTransport transport(io.io.get_executor(), loopback());
  const auto start = Clock::now();
  const Answer a = wait(send(transport, request(slow.url(), 1s)));
  CHECK(a.response.error == TransportError::timeout);
  CHECK(a.at - start >= 900ms);
  CHECK(a.at - start < 5s);  // a per-read timeout would never end: a byte comes every 200 ms
  // The message says how far it got (libcurl's own said "0 bytes received": it counts the body).
  CHECK_MESSAGE(a.response.message.find("within 1000 ms: the answer's head incomplete after") !=
                    std::string::npos,
                a.response.message);
}

TEST_CASE("curl: an attempt that runs out of time says how far it got") {
  IoThread io;
  RawReceiver hung(hang);  // takes the connection, reads what comes, never answers
  RawReceiver deaf([](int, const std::atomic<bool>& stopping) {  // reads nothing
    while (!stopping)
      std::this_thread::sleep_for(20ms);
  });
  RawReceiver interim([](int fd, const std::atomic<bool>& stopping) {
    if (!RawReceiver::read_request(fd, stopping)) return;
    RawReceiver::send_all(fd, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n");
    RawReceiver::hold(fd, stopping);
  });
  CurlTransport transport(io.io.get_executor(), loopback());
  const auto says = [](const Answer& a, const std::string& how) {
    CHECK(a.response.error == TransportError::timeout);
    CHECK_MESSAGE(a.response.message.find(how + " (http://127.0.0.1:") != std::string::npos,
                  a.response.message);
  };
  says(wait(send(transport, request(hung.url(), 300ms))), " ms: the request sent, no answer");
  CallbackRequest large = request(deaf.url(), 500ms);
  large.body.assign(32 << 20, 'x');  // more than the sockets' buffers take
  says(wait(send(transport, std::move(large))), " of the body's 33554432 bytes taken");
  says(wait(send(transport, request(interim.url(), 300ms))),
       " ms: an interim 103 answer, then no other");
  // (A connection never made is "no connection ready": no address blackholes SYNs on loopback.)
}

TEST_CASE("curl: a huge answer is read up to the cap - and a 2xx with it is a delivery") {
  IoThread io;
  std::atomic<std::size_t> sent{0};
  RawReceiver huge([&](int fd, const std::atomic<bool>& stopping) {
    if (!RawReceiver::read_request(fd, stopping)) return;
    RawReceiver::send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n");
    const std::string block(64 * 1024, 'z');
    while (!stopping && sent < (1u << 30) && RawReceiver::send_all(fd, block))
      sent += block.size();
  });
  CurlTransport transport(io.io.get_executor(), loopback());
  const Answer a = wait(send(transport, request(huge.url())));
  CHECK(a.response.error == TransportError::none);
  CHECK(a.response.status == 200);
  // 64 KiB read, plus what the kernel's socket buffers held: far from the gigabyte offered. The
  // receiver stops sending once the transport has closed the connection.
  REQUIRE(rebound::test::eventually([&] { return huge.ended() == 1; }));
  CHECK(sent < (32u << 20));
}

TEST_CASE("curl: endless response headers fail the attempt - bounded") {
  IoThread io;
  std::atomic<std::size_t> sent{0};
  RawReceiver endless(endless_headers(sent));
  CurlTransport transport(io.io.get_executor(), loopback());
  const Answer a = wait(send(transport, request(endless.url())));
  CHECK(a.response.error == TransportError::io);
  CHECK(a.response.message.find("headers") != std::string::npos);
  REQUIRE(rebound::test::eventually([&] { return endless.ended() == 1; }));  // closed on it
  CHECK(sent < (32u << 20));
}

TEST_CASE("curl: a response header line that never ends fails the attempt - named as such") {
  IoThread io;
  RawReceiver endless([](int fd, const std::atomic<bool>& stopping) {
    if (!RawReceiver::read_request(fd, stopping)) return;
    RawReceiver::send_all(fd, "HTTP/1.1 200 OK\r\nX-Long: ");
    const std::string chunk(4096, 'a');
    for (int i = 0; i < 64 && !stopping; ++i)  // 256 KiB, past libcurl's 100 KiB a line
      if (!RawReceiver::send_all(fd, chunk)) return;
    RawReceiver::hold(fd, stopping);
  });
  CurlTransport transport(io.io.get_executor(), loopback());
  const Answer a = wait(send(transport, request(endless.url())));
  CHECK(a.response.error == TransportError::io);
  CHECK_MESSAGE(a.response.message.find("header line too long") != std::string::npos,
                a.response.message);
}

TEST_CASE("curl: only a blank line ends the answer's head - a short line does not") {
  IoThread io;
  // ":\n" is a line of two bytes, as a blank line is: the bound and Retry-After still hold after.
  std::atomic<std::size_t> sent{0};
  RawReceiver endless([&sent](int fd, const std::atomic<bool>& stopping) {
    if (!RawReceiver::read_request(fd, stopping)) return;
    RawReceiver::send_all(fd, "HTTP/1.1 200 OK\r\n:\n");
    const std::string line = "X-Filler: " + std::string(1000, 'a') + "\r\n";
    while (!stopping && sent < (1u << 30) && RawReceiver::send_all(fd, line))
      sent += line.size();
  });
  RawReceiver later([](int fd, const std::atomic<bool>& stopping) {
    if (!RawReceiver::read_request(fd, stopping)) return;
    RawReceiver::send_all(fd,
                          "HTTP/1.1 503 Busy\r\n:\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n");
  });
  CurlTransport transport(io.io.get_executor(), loopback());
  const Answer a = wait(send(transport, request(endless.url())));
  CHECK(a.response.error == TransportError::io);
  CHECK(a.response.message.find("headers") != std::string::npos);
  CHECK(sent < (32u << 20));
  const Answer b = wait(send(transport, request(later.url())));
  CHECK(b.response.status == 503);
  CHECK(b.response.retry_after == "7");
}

TEST_CASE("curl: Retry-After fields that disagree name no delay - the same one repeated does") {
  IoThread io;
  // A receiver (or a proxy before it) that sends the field twice: the last was taken, even
  // garbage after a real delay, and a delay after garbage. Retry-After is one value (RFC 9110).
  const auto answering = [](std::string fields) {
    return [fields](int fd, const std::atomic<bool>& stopping) {
      if (!RawReceiver::read_request(fd, stopping)) return;
      RawReceiver::send_all(fd, "HTTP/1.1 503 Busy\r\n" + fields + "Content-Length: 0\r\n\r\n");
    };
  };
  RawReceiver then_garbage(answering("Retry-After: 120\r\nretry-after: soon\r\n"));
  RawReceiver two_delays(answering("Retry-After: 5\r\nX-Other: 1\r\nRetry-After: 600\r\n"));
  RawReceiver repeated(answering("Retry-After: 7\r\nRetry-After:  7 \r\n"));
  CurlTransport transport(io.io.get_executor(), loopback());
  const Answer a = wait(send(transport, request(then_garbage.url())));
  CHECK(a.response.status == 503);
  CHECK(a.response.retry_after.empty());
  const Answer b = wait(send(transport, request(two_delays.url())));
  CHECK(b.response.status == 503);
  CHECK(b.response.retry_after.empty());
  const Answer c = wait(send(transport, request(repeated.url())));
  CHECK(c.response.status == 503);
  CHECK(c.response.retry_after == "7");
}

TEST_CASE("curl: a callback URL's path and query past ASCII go out percent-encoded - not raw") {
  IoThread io;
  std::mutex mutex;
  std::string request_line;
  RawReceiver receiver([&](int fd, const std::atomic<bool>& stopping) {
    std::string head;
    char buffer[4096];
    while (!stopping && head.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) return;
      head.append(buffer, static_cast<std::size_t>(n));
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      request_line = head.substr(0, head.find("\r\n"));
    }
    RawReceiver::send_all(fd, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
  });
  CurlTransport transport(io.io.get_executor(), loopback());
  const Answer a =
      wait(send(transport, request(receiver.url("/caf\xc3\xa9?city=M\xc3\xbcnchen&x=%41"))));
  CHECK(a.response.status == 204);
  std::lock_guard<std::mutex> lock(mutex);
  CHECK(request_line == "POST /caf%C3%A9?city=M%C3%BCnchen&x=%41 HTTP/1.1");
}

TEST_CASE("curl: an answer libcurl cannot read is a failed attempt - not a bad URL") {
  IoThread io;
  CurlTransport transport(io.io.get_executor(), loopback());
  for (const std::string answer :
       {"HTTP/1.2 200 OK\r\nContent-Length: 0\r\n\r\n", "garbage without a status line\r\n\r\n",
        "HTTP/1.1 000 Zero\r\nContent-Length: 0\r\n\r\n"}) {
    CAPTURE(answer);
    RawReceiver bad([answer](int fd, const std::atomic<bool>& stopping) {
      if (!RawReceiver::read_request(fd, stopping)) return;
      RawReceiver::send_all(fd, answer);
    });
    const Answer a = wait(send(transport, request(bad.url())));
    CHECK(a.response.status == 0);
    // io is retried on the policy's schedule and counts toward the origin's breaker;
    // invalid_url would end the job's delivery at its first try.
    CHECK(a.response.error == TransportError::io);
    CHECK(a.response.message.find(std::to_string(bad.port())) != std::string::npos);
  }
}

namespace {
// Ends a connection with a reset (SO_LINGER 0): what a client sees when its request reaches a
// connection the receiver had just closed as idle.
void reset(int fd) {
  linger hard{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
  ::shutdown(fd, SHUT_RDWR);
}
}  // namespace

TEST_CASE("curl: a kept-alive connection the receiver dropped is retried once on a fresh one") {
  // libcurl does this itself (a reused connection that fails before any byte of an answer):
  // kept here because a receiver that closes idle connections must not cost failed attempts.
  IoThread io;
  // The first connection answers one request and resets at the next; later ones answer.
  std::atomic<int> requests{0}, connection{0};
  RawReceiver dropping([&requests, &connection](int fd, const std::atomic<bool>& stopping) {
    const bool first = connection++ == 0;
    while (RawReceiver::read_request(fd, stopping)) {
      ++requests;
      if (first && requests == 2) return reset(fd);
      if (!RawReceiver::send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")) return;
    }
  });
  CurlTransport transport(io.io.get_executor(), loopback());
  CHECK(wait(send(transport, request(dropping.url()))).response.status == 200);
  const Answer again = wait(send(transport, request(dropping.url())));
  CHECK(again.response.status == 200);
  CHECK(again.response.error == TransportError::none);
  CHECK(requests == 3);
  CHECK(dropping.connections() == 2);
  // A new connection that fails is the receiver's failure, answered as such: not sent again.
  std::atomic<int> tries{0};
  RawReceiver resetting([&tries](int fd, const std::atomic<bool>& stopping) {
    if (RawReceiver::read_request(fd, stopping)) ++tries;
    reset(fd);
  });
  CHECK(wait(send(transport, request(resetting.url()))).response.error == TransportError::io);
  CHECK(tries == 1);
}

TEST_CASE("curl: bytes a receiver sends on an idle connection are no later request's answer") {
  // The first connection answers its request 200, then, idle, sends a 410 nobody asked for, and
  // answers 500 to anything after: reused, the next request would read the 410 as its answer (and
  // the one after that the 500 meant for the one before). Later connections answer 200.
  IoThread io;
  std::atomic<int> connection{0};
  RawReceiver unsolicited([&connection](int fd, const std::atomic<bool>& stopping) {
    const bool first = connection++ == 0;
    if (!first) {
      while (RawReceiver::read_request(fd, stopping)) {
        if (!RawReceiver::send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")) return;
      }
      return;
    }
    if (!RawReceiver::read_request(fd, stopping)) return;
    RawReceiver::send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    std::this_thread::sleep_for(100ms);
    RawReceiver::send_all(fd, "HTTP/1.1 410 Gone\r\nContent-Length: 0\r\n\r\n");
    while (RawReceiver::read_request(fd, stopping)) {
      if (!RawReceiver::send_all(fd, "HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n")) return;
    }
  });
  CurlTransport transport(io.io.get_executor(), loopback());
  CHECK(wait(send(transport, request(unsolicited.url()))).response.status == 200);
  // (The receiver misbehaves within 100 ms; the transport has long seen it when the next goes.)
  std::this_thread::sleep_for(500ms);
  for (int i = 0; i < 2; ++i) {
    CAPTURE(i);
    const Answer next = wait(send(transport, request(unsolicited.url())));
    CHECK(next.response.error == TransportError::none);
    CHECK(next.response.status == 200);
  }
  CHECK(unsolicited.connections() == 2);
}

TEST_CASE("curl: the per-origin and total limits hold at the receiver") {
  IoThread io;
  auto slow = [](int fd, const std::atomic<bool>& stopping) { answer_after(fd, stopping, 100ms); };
  SUBCASE("per origin") {
    RawReceiver receiver(slow);
    rebound::OriginGateOptions limits;
    limits.max_per_origin = 3;
    auto gate = gated(io, limits);
    auto& transport = *gate;
    std::vector<std::shared_future<Answer>> all;
    for (int i = 0; i < 30; ++i)
      all.push_back(send(transport, request(receiver.url())));
    for (auto& f : all)
      CHECK(wait(f).response.status == 200);
    CHECK(receiver.most_at_once() <= 3);
    CHECK(receiver.most_at_once() >= 2);  // and the limit is used, not one at a time
    CHECK(receiver.connections() <= 3);   // connections are kept alive and reused
  }
  SUBCASE("in total") {
    RawReceiver a(slow), b(slow);
    rebound::OriginGateOptions limits;
    limits.max_per_origin = 10;
    limits.max_total = 4;
    limits.max_waiting = 4;
    auto gate = gated(io, limits);
    auto& transport = *gate;
    std::vector<std::shared_future<Answer>> all;
    for (int i = 0; i < 4; ++i) {  // four in flight, four waiting (max_waiting)
      all.push_back(send(transport, request(a.url())));
      all.push_back(send(transport, request(b.url())));
    }
    auto deferred = send(transport, request(a.url()));  // beyond: back to the caller at once
    CHECK(wait(deferred).response.error == TransportError::deferred);
    for (auto& f : all)
      CHECK(wait(f).response.status == 200);
    CHECK(a.most_at_once() + b.most_at_once() <= 4 + 2);  // each count may lag a close by a hair
    CHECK(a.most_at_once() >= 1);
    CHECK(b.most_at_once() >= 1);
  }
}

TEST_CASE("curl: the SSRF guard checks every address connected to - after DNS") {
  IoThread io;
  auto ok = [](int fd, const std::atomic<bool>& stopping) { answer_after(fd, stopping, 0ms); };
  // The same port on two loopback addresses: 127.0.0.1 stands for a private address, 127.0.0.2
  // is the one address the allowlist lets through.
  std::unique_ptr<RawReceiver> allowed, forbidden;
  for (int tries = 0; tries < 20 && !forbidden; ++tries) {
    allowed = std::make_unique<RawReceiver>(ok, "127.0.0.2");
    try {
      forbidden = std::make_unique<RawReceiver>(ok, "127.0.0.1", allowed->port());
    } catch (const std::exception&) {
    }
  }
  REQUIRE(forbidden);
  const std::string port = std::to_string(allowed->port());
  CurlTransportOptions o;
  o.guard = rebound::AddressGuard(false, {"127.0.0.2"});
  o.resolve = {"twofaced.test:" + port + ":127.0.0.1,127.0.0.2",
               "inside.test:" + port + ":127.0.0.1"};
  CurlTransport transport(io.io.get_executor(), o);
  SUBCASE("a name with a refused and a permitted address reaches only the permitted one") {
    const Answer a = wait(send(transport, request("http://twofaced.test:" + port + "/hook")));
    CHECK(a.response.error == TransportError::none);
    CHECK(a.response.status == 200);
    CHECK(allowed->connections() == 1);
    CHECK(forbidden->connections() == 0);
  }
  SUBCASE("a name with only refused addresses is refused - and never connected to") {
    const Answer a = wait(send(transport, request("http://inside.test:" + port + "/hook")));
    CHECK(a.response.error == TransportError::refused_address);
    CHECK(forbidden->connections() == 0);
  }
  SUBCASE("a name with a refused address and a permitted one that is down fails to connect") {
    // Not refused_address, which would give the delivery up for good: the receiver may come back.
    CurlTransportOptions down = o;
    const std::string other = std::to_string(rebound::test::RawReceiver(ok, "127.0.0.2").port());
    down.resolve = {"half.test:" + other + ":127.0.0.1,127.0.0.2"};
    CurlTransport t2(io.io.get_executor(), down);
    const Answer a = wait(send(t2, request("http://half.test:" + other + "/hook")));
    CHECK(a.response.error == TransportError::connect_failed);
  }
  SUBCASE("a literal private address is refused") {
    const Answer a = wait(send(transport, request(forbidden->url())));
    CHECK(a.response.error == TransportError::refused_address);
    CHECK(forbidden->connections() == 0);
  }
}

TEST_CASE("curl: callbacks go through the egress proxy when one is set") {
  IoThread io;
  std::mutex m;
  std::string first_line;
  RawReceiver proxy([&](int fd, const std::atomic<bool>& stopping) {
    char buffer[4096];
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) > 0) {
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n > 0) {
        std::lock_guard<std::mutex> lock(m);
        first_line = std::string(buffer, static_cast<std::size_t>(n)).substr(0, 60);
      }
    }
    RawReceiver::send_all(fd, "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n");
    RawReceiver::hold(fd, stopping);
  });
  CurlTransportOptions o;  // the default guard: the proxy, not rebound, decides where to go
  o.proxy = "http://127.0.0.1:" + std::to_string(proxy.port());
  // NO_PROXY in the environment must not let a callback around the proxy (and its policy).
  ::setenv("NO_PROXY", "*", 1);
  CurlTransport transport(io.io.get_executor(), o);
  const Answer a = wait(send(transport, request("http://receiver.example/hook")));
  ::unsetenv("NO_PROXY");
  CHECK(a.response.status == 204);
  std::lock_guard<std::mutex> lock(m);
  CHECK(first_line.rfind("POST http://receiver.example/hook HTTP/1.1", 0) == 0);
}

TEST_CASE("curl: redirects are answers - never followed") {
  IoThread io;
  rebound::test::Receiver receiver;
  receiver.set_fallback([](const auto&, httplib::Response& res) {
    res.status = 302;
    res.set_header("Location", "http://169.254.169.254/latest/meta-data/");
  });
  CurlTransport transport(io.io.get_executor(), loopback());
  const Answer a = wait(send(transport, request(receiver.url())));
  CHECK(a.response.error == TransportError::none);
  CHECK(a.response.status == 302);
  CHECK(receiver.count() == 1);
}

TEST_CASE("curl: one attempt leaves nothing behind for the next - handles are reused") {
  IoThread io;
  rebound::test::Receiver receiver;
  receiver.script([](const auto&, httplib::Response& res) {
    res.set_content(std::string(1 << 20, 'z'), "text/plain");  // cut at the 64 KiB body cap
  });
  receiver.script([](const auto&, httplib::Response& res) {
    res.status = 503;
    res.set_header("Retry-After", "7");
  });
  std::atomic<std::size_t> sent{0};
  RawReceiver endless(endless_headers(sent));
  RawReceiver slow(trickle);
  CurlTransport transport(io.io.get_executor(), loopback());
  // One at a time, so that each attempt takes the handle the one before gave back.
  auto numbered = [&](const std::string& url, int n, std::chrono::milliseconds timeout = 5s) {
    CallbackRequest r = request(url, timeout);
    r.headers.emplace_back("X-Attempt", std::to_string(n));
    r.body = "{\"attempt\":" + std::to_string(n) + "}";
    return wait(send(transport, std::move(r)));
  };
  Answer a = numbered(endless.url(), 1);
  CHECK(a.response.error == TransportError::io);  // cut by the header cap
  CHECK(a.response.message.find("headers") != std::string::npos);
  a = numbered(slow.url(), 2, 500ms);
  CHECK(a.response.error == TransportError::timeout);
  CHECK(a.response.message.find("headers") == std::string::npos);  // its own error, not #1's
  a = numbered(receiver.url(), 3);
  CHECK(a.response.error == TransportError::none);  // a 2xx stands, the body cut at the cap
  CHECK(a.response.status == 200);
  a = numbered(receiver.url(), 4);  // the same origin after a cut connection
  CHECK(a.response.error == TransportError::none);
  CHECK(a.response.status == 503);
  CHECK(a.response.retry_after == "7");
  a = numbered(receiver.url(), 5);
  CHECK(a.response.error == TransportError::none);
  CHECK(a.response.status == 200);
  REQUIRE(receiver.count() == 3);
  const auto last = receiver.received().back();
  CHECK(last.body == R"({"attempt":5})");
  CHECK(last.header("X-Attempt") == "5");
  CHECK(last.headers.count("X-Attempt") == 1);
}

TEST_CASE("curl: destroying the transport ends every request once - cancelled") {
  IoThread io;
  RawReceiver hung(hang);
  std::atomic<int> calls{0};
  std::atomic<int> cancelled{0};
  {
    rebound::OriginGateOptions limits;
    limits.max_per_origin = 2;
    auto transport = gated(io, limits);  // the gate's waiting ones, then curl's in flight
    for (int i = 0; i < 5; ++i) {        // 2 in flight, 3 waiting
      transport->send(request(hung.url(), 30s), [&](CallbackResponse r) {
        ++calls;
        cancelled += r.error == TransportError::cancelled;
      });
    }
    REQUIRE(rebound::test::eventually([&] { return hung.connections() == 2; }));
  }
  // Once the io context has run out of work, no late second call can come.
  REQUIRE(io.run_out());
  CHECK(calls == 5);
  CHECK(cancelled == 5);
}

TEST_CASE("curl: a bad URL is answered without a request") {
  IoThread io;
  CurlTransport transport(io.io.get_executor(), loopback());
  CHECK(wait(send(transport, request("ftp://example.com/x"))).response.error ==
        TransportError::invalid_url);
}
