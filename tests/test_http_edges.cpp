// The server at its edges: what a hostile or careless client sends, on a real loopback socket.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rebound/detail/json.hpp"
#include "rebound/model.hpp"
#include "support/held_model.hpp"
#include "support/raw_client.hpp"
#include "support/server_harness.hpp"

using namespace std::chrono_literals;
using nlohmann::json;
using rebound::test::count_responses;
using rebound::test::HarnessOptions;
using rebound::test::RawConnection;
using rebound::test::ServerHarness;

namespace {

struct RawResponse {
  int status = 0;
  std::string head;
  std::string body;
  bool has_header(const std::string& line) const { return head.find(line) != std::string::npos; }
};

// The first response in `text`.
RawResponse first_response(const std::string& text) {
  RawResponse r;
  const auto end = text.find("\r\n\r\n");
  if (text.compare(0, 9, "HTTP/1.1 ") != 0 || end == std::string::npos) return r;
  r.status = std::stoi(text.substr(9, 3));
  r.head = text.substr(0, end + 2);
  const auto at = r.head.find("Content-Length: ");
  const std::size_t length = at == std::string::npos ? 0 : std::stoul(r.head.substr(at + 16));
  r.body = text.substr(end + 4, length);
  return r;
}

// Sends one raw request on a fresh connection and reads the answer (until the server closes or
// a whole response is there). The limit only bounds a hung server: a whole answer returns at
// once, and a loaded CI machine can take seconds over a megabyte of JSON.
RawResponse round_trip(int port, const std::string& request) {
  RawConnection c(port);
  REQUIRE(c.send(request, 30s));
  std::string text;
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < give_up) {
    text += c.read(100ms);
    const RawResponse r = first_response(text);
    if (r.status != 0 && text.size() >= r.head.size() + 2 + r.body.size() &&
        (r.head.find("Content-Length: ") == std::string::npos ||
         r.body.size() == std::stoul(r.head.substr(r.head.find("Content-Length: ") + 16))))
      return r;
    if (c.closed()) break;
  }
  return first_response(text);
}

// A valid error body of the API's shape with this code.
void check_error_body(const RawResponse& r, int status, const std::string& code) {
  CHECK(r.status == status);
  const json body = json::parse(r.body, nullptr, false);
  REQUIRE_MESSAGE(!body.is_discarded(), r.body);
  CHECK(body["error"]["code"] == code);
  CHECK(body["error"]["message"].is_string());
}

std::string nested_arrays(std::size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

std::string post(const std::string& path, const std::string& body,
                 const std::string& extra_headers = {}) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Builds deeper and deeper output: a custom model gone wrong.
class DeepOutputModel final : public rebound::Model {
 public:
  std::string name() const override { return "deep"; }
  rebound::Prediction predict(const json& input) override {
    // Built downwards, without copies: copying a deep tree recurses.
    json out = json::array();
    json* innermost = &out;
    for (int i = 1; i < input.get<int>(); ++i) {
      innermost->push_back(json::array());
      innermost = &innermost->back();
    }
    return rebound::Prediction::success(std::move(out));
  }
};

struct EchoServer : ServerHarness {
  explicit EchoServer(HarnessOptions o = HarnessOptions())
      : ServerHarness(rebound::make_builtin_model("echo"), o) {}
  bool alive() const {
    auto res = client().Get("/ping");
    return res && res->status == 200;
  }
};

}  // namespace

TEST_CASE("any bytes in a path or an id get a JSON error - and the server stays up") {
  EchoServer server;
  for (const std::string path :
       {"/%FF", "/%FF%FE%00x", "/v1/inferences/%FF", "/%00", "/v1/%ED%A0%80"}) {
    CAPTURE(path);
    const RawResponse r = round_trip(server.port, "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n");
    check_error_body(r, 404, "not_found");
  }
  const RawResponse r =
      round_trip(server.port, "POST /v1/inferences/%FF/redeliver HTTP/1.1\r\nHost: x\r\n\r\n");
  check_error_body(r, 404, "not_found");
  CHECK(server.alive());
}

TEST_CASE("JSON nested deeper than 128 levels is refused before anything recurses") {
  EchoServer server;
  auto submission = [](const std::string& id, const std::string& input) {
    return R"({"id":")" + id + R"(","input":)" + input + "}";
  };
  SUBCASE("submissions: 100,000 levels, and the boundary") {
    const RawResponse deep =
        round_trip(server.port, post("/v1/inferences", submission("deep", nested_arrays(100000))));
    check_error_body(deep, 400, "invalid_json");
    CHECK(json::parse(deep.body)["error"]["message"].get<std::string>().find("128") !=
          std::string::npos);
    // The body object is one level: an input of 127 is 128 in all, the most accepted.
    CHECK(round_trip(server.port, post("/v1/inferences", submission("edge", nested_arrays(127))))
              .status == 202);
    check_error_body(
        round_trip(server.port, post("/v1/inferences", submission("over", nested_arrays(128)))),
        400, "invalid_json");
    CHECK(server.poll("edge")["id"] == "edge");
    CHECK(server.poll("deep").is_object());  // 404 body: never stored
  }
  SUBCASE("brackets inside strings do not count") {
    const std::string input =
        "\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"";
    CHECK(round_trip(server.port, post("/v1/inferences", submission("strings", input))).status ==
          202);
  }
  SUBCASE("invocations") {
    check_error_body(round_trip(server.port, post("/invocations", nested_arrays(100000))), 400,
                     "invalid_json");
    const RawResponse edge = round_trip(server.port, post("/invocations", nested_arrays(128)));
    CHECK(edge.status == 200);
    CHECK(edge.body == nested_arrays(128));
  }
  CHECK(server.alive());
}

TEST_CASE("what a body's tree will take is estimated from its text - not below what it takes") {
  using rebound::detail::json_footprint;
  using rebound::detail::scan_json_text;
  auto repeat = [](const std::string& item, int n) {
    std::string out = "[";
    for (int i = 0; i < n; ++i)
      out += (i ? "," : "") + item;
    return out + "]";
  };
  for (const std::string text :
       {repeat("0", 100000), repeat("0.123456789", 100000), repeat("[0]", 50000),
        repeat("[]", 50000), repeat("{}", 50000), repeat(R"({"x":1,"y":2})", 20000),
        repeat(R"("a short one")", 50000), repeat("\"" + std::string(100, 's') + "\"", 5000),
        repeat(R"({"a long key, past sixteen":[1,2,3]})", 10000),
        std::string("\"") + std::string(1000000, 'z') + "\""}) {
    CAPTURE(text.substr(0, 40));
    const std::size_t estimate =
        scan_json_text(text, rebound::detail::max_json_depth, SIZE_MAX).bytes;
    const std::size_t takes = json_footprint(json::parse(text));
    CAPTURE(estimate);
    CAPTURE(takes);
    CHECK(estimate >= takes * 8 / 10);  // at most a little below (allocator rounding aside)
    CHECK(estimate <= takes * 5 / 2);
  }
}

TEST_CASE("a body whose tree would be far larger than its text is refused 413 - unparsed") {
  EchoServer server;
  auto submission = [](const std::string& id, const std::string& input) {
    return R"({"id":")" + id + R"(","input":)" + input + "}";
  };
  auto items = [](const std::string& item, int n) {
    std::string out = "[";
    for (int i = 0; i < n; ++i)
      out += (i ? "," : "") + item;
    return out + "]";
  };
  // 150,000 empty arrays: 450 KB of text, about 17 MB of tree.
  for (const std::string input : {items("[]", 150000), items("{}", 150000)}) {
    const RawResponse r = round_trip(server.port, post("/v1/inferences", submission("amp", input)));
    check_error_body(r, 413, "payload_too_large");
    CHECK(json::parse(r.body)["error"]["message"].get<std::string>().find("32 times") !=
          std::string::npos);
    check_error_body(round_trip(server.port, post("/invocations", input)), 413,
                     "payload_too_large");
  }
  // The same count of zeros, records or short rows: ordinary inputs, accepted.
  CHECK(round_trip(server.port, post("/v1/inferences", submission("zeros", items("0", 150000))))
            .status == 202);
  CHECK(round_trip(server.port,
                   post("/v1/inferences", submission("records", items(R"({"x":1,"y":2})", 50000))))
            .status == 202);
  CHECK(round_trip(server.port, post("/v1/inferences", submission("rows", items("[0]", 150000))))
            .status == 202);
  // Small bodies are never refused for their shape.
  CHECK(round_trip(server.port, post("/v1/inferences", submission("small", items("[]", 1000))))
            .status == 202);
  CHECK(server.poll("amp").is_object());  // 404 body: never stored
  CHECK(server.alive());
}

TEST_CASE("bodies parsed at once share max_parsing_bytes - one beyond it gets 503 queue_full") {
  // The model's validation waits for the test: the first body's tree stays reserved meanwhile.
  HarnessOptions o;
  o.max_parsing_bytes = 4u << 20;
  ServerHarness server(std::make_unique<rebound::test::HeldValidationModel>(), o);
  auto* model = static_cast<rebound::test::HeldValidationModel*>(server.model_ptr);
  std::string many = "[";
  for (int i = 0; i < 100000; ++i)
    many += i ? ",0" : "0";
  many += "]";  // 200 KB whose tree takes about 3.2 MB
  std::thread first([&] {
    const RawResponse r =
        round_trip(server.port, post("/v1/inferences", R"({"id":"first","input":)" + many + "}"));
    CHECK(r.status == 202);
  });
  REQUIRE(model->wait_started(1));
  const RawResponse second =
      round_trip(server.port, post("/v1/inferences", R"({"id":"second","input":)" + many + "}"));
  check_error_body(second, 503, "queue_full");
  CHECK(second.has_header("Retry-After: "));
  // The queue has room: the message says what is full.
  CHECK(json::parse(second.body)["error"]["message"] ==
        "Too many large requests are being read at once; retry later.");
  // Once the first is through, the next one goes in.
  model->open();
  first.join();
  CHECK(round_trip(server.port, post("/v1/inferences", R"({"id":"third","input":)" + many + "}"))
            .status == 202);
}

TEST_CASE("a model's output nested too deep fails its job instead of the server") {
  ServerHarness server(std::make_unique<DeepOutputModel>(), HarnessOptions());
  REQUIRE(server.submit({{"id", "deep"}, {"input", 100000}})->status == 202);
  REQUIRE(server.submit({{"id", "fine"}, {"input", 100}})->status == 202);
  REQUIRE(rebound::test::eventually([&] {
    return server.poll("deep")["status"] == "failed" &&
           server.poll("fine")["status"] == "succeeded";
  }));
  CHECK(server.poll("deep")["error"]["code"] == "model_error");
  auto res = server.client().Post("/invocations", "100000", "application/json");
  REQUIRE(res);
  CHECK(res->status == 500);
}

TEST_CASE("a chunked body over the limit gets 413 and is not read to its end") {
  HarnessOptions options;
  options.max_body_bytes = 1 << 20;
  EchoServer server(options);
  RawConnection c(server.port);
  REQUIRE(
      c.send("POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Transfer-Encoding: chunked\r\n\r\n"));
  // Up to 300 MiB in 64 KiB chunks, until the server answers or stops reading.
  const std::string chunk = "10000\r\n" + std::string(0x10000, ' ') + "\r\n";
  std::size_t sent = 0;
  std::string answer;
  while (sent < (300u << 20) && c.send(chunk, 2000ms)) {
    sent += 0x10000;
    answer += c.read(0ms);
    if (!answer.empty()) break;
  }
  answer += c.read(2000ms);
  const RawResponse r = first_response(answer);
  check_error_body(r, 413, "payload_too_large");
  CHECK(r.has_header("Connection: close"));
  CHECK(sent < (32u << 20));  // a few MiB of socket buffers at most, not the 300 MiB offered
  CHECK(server.alive());
}

TEST_CASE("a declared body over the limit gets 413 at once - unread") {
  HarnessOptions options;
  options.max_body_bytes = 1 << 20;
  EchoServer server(options);
  for (const std::string path : {"/v1/inferences", "/invocations"}) {
    CAPTURE(path);
    RawConnection c(server.port);
    REQUIRE(c.send("POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 300000000\r\n\r\n"));
    const RawResponse r = first_response(c.read(10000ms, "}}"));
    check_error_body(r, 413, "payload_too_large");
  }
  SUBCASE("also to a client that waits for 100 Continue") {
    RawConnection c(server.port);
    REQUIRE(
        c.send("POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Length: 300000000\r\n"
               "Expect: 100-continue\r\n\r\n"));
    check_error_body(first_response(c.read(10000ms, "}}")), 413, "payload_too_large");
  }
}

TEST_CASE("bodies that cannot be read get a clear 4xx") {
  EchoServer server;
  check_error_body(round_trip(server.port,
                              "POST /v1/inferences HTTP/1.1\r\nHost: x\r\n"
                              "Content-Length: 12abc\r\n\r\n{}"),
                   400, "bad_request");
  check_error_body(round_trip(server.port,
                              "POST /v1/inferences HTTP/1.1\r\nHost: x\r\n"
                              "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"),
                   415, "unsupported_encoding");
  check_error_body(round_trip(server.port,
                              "POST /v1/inferences HTTP/1.1\r\nHost: x\r\n"
                              "Transfer-Encoding: chunked\r\n\r\nzz\r\n"),
                   400, "bad_request");
  check_error_body(round_trip(server.port,
                              "POST /v1/inferences HTTP/1.1\r\nHost: x\r\n"
                              "Content-Type: application/x-www-form-urlencoded\r\n"
                              "Content-Length: 2\r\n\r\n{}"),
                   415, "unsupported_media_type");
  {
    // curl -d with a JSON body over 8 KiB (cpp-httplib's form limit): still 415, naming the type.
    const std::string json_body = "{\"id\":\"f\",\"input\":\"" + std::string(9000, 'a') + "\"}";
    const RawResponse a = round_trip(server.port,
                                     "POST /v1/inferences HTTP/1.1\r\nHost: x\r\n"
                                     "Content-Type: application/x-www-form-urlencoded\r\n"
                                     "Content-Length: " +
                                         std::to_string(json_body.size()) + "\r\n\r\n" + json_body);
    check_error_body(a, 415, "unsupported_media_type");
    CHECK(a.body.find("application/json") != std::string::npos);
  }
  check_error_body(round_trip(server.port,
                              "POST /invocations HTTP/1.1\r\nHost: x\r\n"
                              "Content-Type: multipart/form-data; boundary=b\r\n"
                              "Content-Length: 2\r\n\r\n{}"),
                   415, "unsupported_media_type");
  CHECK(server.alive());
}

TEST_CASE("a chunked body within the limit is read whole") {
  EchoServer server;
  const RawResponse r =
      round_trip(server.port,
                 "POST /invocations HTTP/1.1\r\nHost: x\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n3\r\n[1,\r\n3\r\n2,3\r\n1\r\n]\r\n0\r\n\r\n");
  CHECK(r.status == 200);
  CHECK(r.body == "[1,2,3]");
}

TEST_CASE("request headers are bounded - too many bytes of them get 431") {
  HarnessOptions options;
  options.max_header_bytes = 16 * 1024;
  EchoServer server(options);
  std::string request = "GET /ping HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 2000; ++i)
    request += "X-Filler-" + std::to_string(i) + ": 0123456789\r\n";
  RawConnection c(server.port);
  c.send(request + "\r\n", 2000ms);  // the server may stop reading, and close, before the end
  const RawResponse r = first_response(c.read(10000ms, "}}"));
  check_error_body(r, 431, "header_too_large");
  CHECK(server.alive());
}

TEST_CASE("the head's limit is the request line and the headers together - to the byte") {
  EchoServer server{HarnessOptions()};  // the default: 64 KiB
  // Headers of 100-byte lines up to `size` bytes of head in all (line and fields, the blank
  // line included).
  const auto head_of = [](std::size_t size) {
    std::string head = "GET /ping HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; head.size() + 2 < size; ++i) {
      // 100 bytes, or the rest (100 to 199 of them) in the last line.
      const std::size_t rest = size - 2 - head.size();
      std::string line = "X-" + std::to_string(i) + ": ";
      line.append((rest < 200 ? rest : 100) - line.size() - 2, 'a');
      head += line + "\r\n";
    }
    return head + "\r\n";
  };
  const std::string fits = head_of(64 * 1024);
  REQUIRE(fits.size() == 64 * 1024);
  CHECK(round_trip(server.port, fits).status == 200);
  // A little over (the buffer that holds it has room for more: the limit is counted).
  for (const std::size_t size : {64 * 1024 + 100, 80 * 1024}) {
    CAPTURE(size);
    const std::string over = head_of(size);
    REQUIRE(over.size() == size);
    RawConnection c(server.port);
    c.send(over, 2000ms);
    check_error_body(first_response(c.read(10000ms, "}}")), 431, "header_too_large");
  }
}

TEST_CASE("one header line longer than 8 KiB gets 431 - as the docs say") {
  EchoServer server{HarnessOptions()};
  RawConnection c(server.port);
  c.send("GET /ping HTTP/1.1\r\nHost: x\r\nX-Long: " + std::string(9 * 1024, 'a') + "\r\n\r\n",
         2000ms);
  check_error_body(first_response(c.read(10000ms, "}}")), 431, "header_too_large");
  // A long header within the limit is still read.
  RawConnection ok(server.port);
  ok.send("GET /ping HTTP/1.1\r\nHost: x\r\nX-Long: " + std::string(7 * 1024, 'a') +
              "\r\nConnection: close\r\n\r\n",
          2000ms);
  CHECK(ok.read(3000ms).rfind("HTTP/1.1 200", 0) == 0);
  CHECK(server.alive());
}

TEST_CASE("a header line past the whole head's limit gets 431 - not 414 - however it arrives") {
  // The parser takes the request line out of its buffer before the head runs over: a header of
  // 70 KB (past the 64 KiB head), sent in pieces, is still a header too large, not a long URI; a
  // request line past it is still a long URI.
  EchoServer server{HarnessOptions()};
  {
    RawConnection c(server.port);
    c.send("GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: ", 2000ms);
    for (int i = 0; i < 7; ++i)
      c.send(std::string(10 * 1000, 'a'), 2000ms);
    c.send("\r\n\r\n", 2000ms);
    check_error_body(first_response(c.read(10000ms, "}}")), 431, "header_too_large");
  }
  {
    RawConnection c(server.port);
    c.send("GET /" + std::string(70 * 1000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n", 2000ms);
    check_error_body(first_response(c.read(10000ms, "}}")), 414, "uri_too_long");
  }
  CHECK(server.alive());
}

TEST_CASE("control bytes in a header value get 400 invalid_header") {
  EchoServer server{HarnessOptions()};
  for (const std::string value :
       {std::string("a\0b", 3), std::string("a\x01b"), std::string("a\x7f"), std::string("a\rb")}) {
    RawConnection c(server.port);
    c.send("GET /ping HTTP/1.1\r\nHost: x\r\nX-Note: " + value + "\r\n\r\n", 2000ms);
    const std::string answer = c.read(10000ms, "}}");
    CAPTURE(answer);
    // Beast's parser refuses a bare CR itself (400 bad_request): refused either way.
    CHECK(answer.rfind("HTTP/1.1 400", 0) == 0);
  }
  {
    RawConnection c(server.port);
    c.send("GET /ping HTTP/1.1\r\nHost: x\r\nX-Note: a\x01b\r\n\r\n", 2000ms);
    check_error_body(first_response(c.read(10000ms, "}}")), 400, "invalid_header");
  }
  // Percent-encoded bytes in a header are text as sent: not refused.
  {
    RawConnection c(server.port);
    c.send("GET /ping HTTP/1.1\r\nHost: x\r\nReferer: /a?q=%00%0A\r\nConnection: close\r\n\r\n",
           2000ms);
    CHECK(c.read(3000ms).rfind("HTTP/1.1 200", 0) == 0);
  }
  // A tab is allowed.
  RawConnection ok(server.port);
  ok.send("GET /ping HTTP/1.1\r\nHost: x\r\nX-Note: a\tb\r\nConnection: close\r\n\r\n", 2000ms);
  CHECK(ok.read(3000ms).rfind("HTTP/1.1 200", 0) == 0);
  CHECK(server.alive());
}

TEST_CASE("an HTTP/1.1 request without a Host or with two gets 400 invalid_host") {
  EchoServer server;
  check_error_body(round_trip(server.port, "GET /ping HTTP/1.1\r\n\r\n"), 400, "invalid_host");
  check_error_body(round_trip(server.port, "GET /ping HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400,
                   "invalid_host");
  // The body of a refused request is never read as a request of its own.
  {
    const std::string inner = "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n";
    RawConnection c(server.port);
    REQUIRE(c.send("POST /invocations HTTP/1.1\r\nContent-Length: " + std::to_string(inner.size()) +
                   "\r\n\r\n" + inner));
    std::string all = c.read(2000ms);
    while (!c.closed())
      all += c.read(2000ms);
    CHECK(count_responses(all) == 1);
    check_error_body(first_response(all), 400, "invalid_host");
  }
  // HTTP/1.0 needs none; one Host is the rule.
  {
    RawConnection c(server.port);
    REQUIRE(c.send("GET /ping HTTP/1.0\r\n\r\n"));
    CHECK(c.read(2000ms).rfind("HTTP/1.0 200", 0) == 0);
  }
  CHECK(round_trip(server.port, "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n").status == 200);
  CHECK(server.alive());
}

TEST_CASE("a known path with the wrong method gets 405 with Allow") {
  EchoServer server;
  struct Case {
    std::string method, path, allow;
  };
  for (const Case& k : std::vector<Case>{{"GET", "/invocations", "POST"},
                                         {"DELETE", "/ping", "GET, HEAD"},
                                         {"PUT", "/v1/inferences", "GET, HEAD, POST"},
                                         {"POST", "/v1/inferences/abc", "GET, HEAD, DELETE"},
                                         {"GET", "/v1/inferences/abc/redeliver", "POST"},
                                         {"PATCH", "/metrics", "GET, HEAD"}}) {
    CAPTURE(k.method);
    CAPTURE(k.path);
    const RawResponse r = round_trip(
        server.port, k.method + " " + k.path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    check_error_body(r, 405, "method_not_allowed");
    CHECK(r.has_header("Allow: " + k.allow + "\r\n"));
  }
  const RawResponse options_answer =
      round_trip(server.port, "OPTIONS /v1/inferences HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(options_answer.status == 204);
  CHECK(options_answer.has_header("Allow: GET, HEAD, POST\r\n"));
  // HEAD is GET without the body.
  const RawResponse head = round_trip(server.port, "HEAD /ping HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(head.status == 200);
}

TEST_CASE("a POST without a body is answered at once") {
  EchoServer server;
  RawConnection c(server.port);
  const auto sent = std::chrono::steady_clock::now();
  REQUIRE(c.send("POST /v1/inferences/nobody/redeliver HTTP/1.1\r\nHost: x\r\n\r\n"));
  // cpp-httplib alone waited 5 s for a body that never comes; an answer needs far less than 4 s.
  const RawResponse r = first_response(c.read(10000ms, "}}"));
  CHECK(std::chrono::steady_clock::now() - sent < 4s);
  check_error_body(r, 404, "not_found");
  REQUIRE(c.send("POST /v1/inferences HTTP/1.1\r\nHost: x\r\n\r\n"));
  check_error_body(first_response(c.read(10000ms, "}}")), 400, "invalid_json");
}

TEST_CASE("the Bearer scheme is matched case-insensitively") {
  HarnessOptions options;
  options.api_keys = {"s3cret"};
  EchoServer server(options);
  for (const std::string header : {"Bearer s3cret", "bearer s3cret", "BEARER  s3cret"}) {
    CAPTURE(header);
    const RawResponse r = round_trip(
        server.port, "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: " + header + "\r\n\r\n");
    CHECK(r.status == 200);
  }
  for (const std::string header : {"Bearer s3cre", "Basic s3cret", "Bearers3cret", "Bearer"}) {
    CAPTURE(header);
    check_error_body(round_trip(server.port, "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: " +
                                                 header + "\r\n\r\n"),
                     401, "unauthorized");
  }
}

TEST_CASE("pipelined requests are all answered in order") {
  EchoServer server;
  RawConnection c(server.port);
  const std::string ping = "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n";
  REQUIRE(c.send(ping + post("/invocations", "[1]") + ping + post("/invocations", "[2]") +
                 "GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  std::string all;
  while (!c.closed() && count_responses(all) < 5)
    all += c.read(3000ms);
  CHECK(count_responses(all) == 5);
  CHECK(all.find("[1]") < all.find("[2]"));
  CHECK(all.find("[2]") < all.find("404 Not Found"));
}

TEST_CASE("kept-alive idle clients do not starve a new one") {
  HarnessOptions options;
  options.http_threads = 4;
  EchoServer server(options);
  // Four polite keep-alive clients, each served once and then idle: every thread is theirs.
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(std::make_unique<RawConnection>(server.port));
    REQUIRE(idle.back()->send("GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"));
    REQUIRE(first_response(idle.back()->read(10000ms, "\r\n\r\n")).status == 200);
  }
  // Four more that never send a byte.
  for (int i = 0; i < 4; ++i)
    idle.push_back(std::make_unique<RawConnection>(server.port));
  // A fifth client is answered well before the 5 s keep-alive timeout frees a thread.
  RawConnection c(server.port);
  const auto sent = std::chrono::steady_clock::now();
  REQUIRE(c.send("GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"));
  CHECK(first_response(c.read(10000ms, "\r\n\r\n")).status == 200);
  CHECK(std::chrono::steady_clock::now() - sent < 4s);
}

TEST_CASE("a GET with a body ends its connection instead of reading the body as a request") {
  EchoServer server;
  RawConnection c(server.port);
  REQUIRE(
      c.send("GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n"
             "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string all = c.read(2000ms);
  while (!c.closed())
    all += c.read(2000ms);
  CHECK(count_responses(all) == 1);
  CHECK(first_response(all).status == 200);
  CHECK(first_response(all).has_header("Connection: close"));
}

TEST_CASE("serve_connection_bytes serves requests without a socket") {
  EchoServer server;
  const std::string out = server.server->serve_connection_bytes(
      "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n" + post("/invocations", "{\"a\":1}") +
      "GET /%FF HTTP/1.1\r\n\r\n");
  CHECK(count_responses(out) == 3);
  CHECK(out.find("{\"a\":1}") != std::string::npos);
  // Garbage is answered or dropped, never a crash.
  server.server->serve_connection_bytes(std::string("\0\xff\r\n\r\nPOST / HTTP/9\r\n", 20));
  CHECK(server.alive());
}

TEST_CASE("serve_connection_bytes before run - the server still serves connections once it runs") {
  // Bytes served while nobody ran the server used to leave its io_context stopped (out of work
  // once that connection ended): run() then returned at once, and nothing was accepted again.
  HarnessOptions o;
  o.serving = false;
  EchoServer server(o);
  const std::string out =
      server.server->serve_connection_bytes("GET /ping HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(count_responses(out) == 1);
  CHECK(first_response(out).status == 200);
  server.serve();
  CHECK(server.alive());
}

TEST_CASE("a Range header is ignored - one request cannot multiply its answer") {
  EchoServer server;
  std::string ranges = "bytes=0-";
  for (int i = 0; i < 2700; ++i)
    ranges += ",0-";
  const std::string body = "\"" + std::string(200000, 'a') + "\"";
  const RawResponse r =
      round_trip(server.port, post("/invocations", body, "Range: " + ranges + "\r\n"));
  CHECK(r.status == 200);
  CHECK(r.body == body);
  CHECK_FALSE(r.has_header("multipart/byteranges"));
}

TEST_CASE("JSON that would cost far more memory than its size is refused") {
  EchoServer server;
  std::string objects = "[";
  for (int i = 0; i < 300000; ++i)
    objects += i ? ",{}" : "{}";
  objects += "]";
  const RawResponse r = round_trip(server.port, post("/invocations", objects));
  check_error_body(r, 400, "invalid_json");
  CHECK(json::parse(r.body)["error"]["message"].get<std::string>().find("too many values") !=
        std::string::npos);
  // A long array of numbers, as models take, is fine.
  std::string numbers = "[";
  for (int i = 0; i < 900000; ++i)
    numbers += i ? ",1" : "1";
  numbers += "]";
  CHECK(round_trip(server.port, post("/invocations", numbers)).status == 200);
}

TEST_CASE("ambiguous framing ends the connection after one request") {
  EchoServer server;
  const std::string smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
  for (const std::string head :
       {std::string("POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"),
        std::string("POST /invocations HTTP/1.1\r\nHost: x\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n2\r\n{}X\r\n"),
        std::string("GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                    "Content-Length: 28\r\n\r\n")}) {
    CAPTURE(head);
    RawConnection c(server.port);
    REQUIRE(c.send(head + smuggled));
    std::string all;
    while (!c.closed())
      all += c.read(3000ms);
    CHECK(count_responses(all) == 1);
    CHECK(all.find("smuggled") == std::string::npos);
  }
}

TEST_CASE("a client that does not read its answer gives its thread up at the response deadline") {
  HarnessOptions options;
  options.http_threads = 1;
  options.response_timeout = 1000ms;
  options.max_body_bytes = 16 << 20;
  EchoServer server(options);
  RawConnection reader_that_never_reads(server.port);
  // 12 MiB back, more than the socket buffers between the two hold: the server's one thread
  // blocks writing until the response deadline (1 s), not the 5 s write timeout.
  REQUIRE(reader_that_never_reads.send(
      post("/invocations", "\"" + std::string(12 << 20, 'a') + "\""), 10000ms));
  // Once the answer has begun (a few KiB read of 12 MiB), the deadline runs.
  REQUIRE(reader_that_never_reads.read(30000ms, "HTTP/1.1 200").find("HTTP/1.1 200") !=
          std::string::npos);
  const auto begun = std::chrono::steady_clock::now();
  RawConnection next(server.port);
  REQUIRE(next.send("GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"));
  CHECK(first_response(next.read(10000ms, "\r\n\r\n")).status == 200);
  CHECK(std::chrono::steady_clock::now() - begun < 4s);  // the 1 s deadline, not the 5 s timeout
}

TEST_CASE("a body that does not arrive in time gets 408 - the connection is kept for the answer") {
  HarnessOptions o;
  o.body_timeout = 300ms;
  EchoServer server(o);
  RawConnection c(server.port);
  REQUIRE(
      c.send("POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: 100\r\n\r\n{"));
  check_error_body(first_response(c.read(10000ms, "}}")), 408, "request_timeout");
  CHECK(server.alive());
}

TEST_CASE("a request line over 8 KiB gets 414 - whatever room the rest of the head leaves") {
  EchoServer server;
  const RawResponse r = round_trip(
      server.port, "GET /ping?" + std::string(9000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n");
  check_error_body(r, 414, "uri_too_long");
}

TEST_CASE("bodies being received share max_receiving_bytes - one beyond gets 503 server_busy") {
  HarnessOptions o;
  o.max_receiving_bytes = 1000;
  EchoServer server(o);
  const std::string head =
      "POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: 800\r\n\r\n";
  RawConnection slow(server.port);  // declares 800 bytes and sends a few: they are counted
  REQUIRE(slow.send(head + "{\"id\""));
  std::this_thread::sleep_for(1s);  // (time for the server to count them, sanitizers too)
  const RawResponse refused = round_trip(server.port, head + std::string(800, ' '));
  check_error_body(refused, 503, "server_busy");
  CHECK(refused.has_header("Retry-After: 1"));
  // The first body ends (a JSON of 800 bytes): its bytes are given back.
  const std::string rest = ": \"busy\"}";
  REQUIRE(slow.send(rest + std::string(800 - 5 - rest.size(), ' ')));
  CHECK(first_response(slow.read(10000ms, "}")).status == 202);
  const std::string body = "{\"id\": \"after\"}";
  const RawResponse after = round_trip(server.port,
                                       "POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                       "application/json\r\nContent-Length: " +
                                           std::to_string(body.size()) + "\r\n\r\n" + body);
  CHECK(after.status == 202);
}

TEST_CASE("a body its key may not send is refused at its head - unread and holding no budget") {
  HarnessOptions o;
  o.api_keys = {"s3cret"};
  o.max_receiving_bytes = 1000;
  EchoServer server(o);
  const std::string head =
      "POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: 800\r\n";
  // Keyless and wrong-keyed uploads that never finish: each hears 401 without sending its body
  // (also one that waits for 100 Continue), and none holds a byte of the budget.
  std::vector<std::unique_ptr<RawConnection>> crowd;
  for (const std::string extra :
       {"", "Authorization: Bearer wrong\r\n", "Expect: 100-continue\r\n"}) {
    CAPTURE(extra);
    crowd.push_back(std::make_unique<RawConnection>(server.port));
    REQUIRE(crowd.back()->send(head + extra + "\r\n{\"id\""));
    const RawResponse refused = first_response(crowd.back()->read(10000ms, "}}"));
    check_error_body(refused, 401, "unauthorized");
    CHECK(refused.has_header("WWW-Authenticate: Bearer"));
    CHECK(refused.has_header("Connection: close"));
  }
  // Nor through an open route that takes no body: no route would read it (405, Allow).
  crowd.push_back(std::make_unique<RawConnection>(server.port));
  REQUIRE(
      crowd.back()->send("POST /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 800\r\n\r\n{\"id\""));
  const RawResponse not_allowed = first_response(crowd.back()->read(10000ms, "}}"));
  check_error_body(not_allowed, 405, "method_not_allowed");
  CHECK(not_allowed.has_header("Allow: GET, HEAD"));
  // Nor a keyed one whose query is ambiguous (a parameter given twice): 422 before the body.
  crowd.push_back(std::make_unique<RawConnection>(server.port));
  REQUIRE(crowd.back()->send(
      "POST /v1/inferences?wait=1&wait=2 HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: 800\r\nAuthorization: Bearer s3cret\r\n\r\n{\"id\""));
  const RawResponse ambiguous = first_response(crowd.back()->read(10000ms, "}}"));
  check_error_body(ambiguous, 422, "invalid_field");
  CHECK(json::parse(ambiguous.body, nullptr, false)["error"]["field"] == "wait");
  // The budget is whole for a keyed upload, sent slowly.
  std::string body = "{\"id\": \"keyed\"}";
  body += std::string(800 - body.size(), ' ');
  RawConnection keyed(server.port);
  REQUIRE(keyed.send(head + "Authorization: Bearer s3cret\r\n\r\n" + body.substr(0, 10)));
  std::this_thread::sleep_for(200ms);
  REQUIRE(keyed.send(body.substr(10)));
  CHECK(first_response(keyed.read(10000ms, "}")).status == 202);
  // Two Authorization headers are one too many, whichever of them holds the key.
  check_error_body(round_trip(server.port,
                              "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                              "s3cret\r\nAuthorization: Bearer wrong\r\n\r\n"),
                   400, "invalid_header");
}

TEST_CASE("a chunked body's trailer cannot bring a key or a second key or a second Host") {
  HarnessOptions o;
  o.api_keys = {"s3cret"};
  EchoServer server(o);
  const std::string chunked_body = "f\r\n{\"id\": \"trail\"}\r\n0\r\n";
  const std::string head =
      "POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n";
  // The key in the trailer alone: refused at the head, as keyless.
  check_error_body(round_trip(server.port, head + "\r\n" + chunked_body +
                                               "Authorization: Bearer s3cret\r\n\r\n"),
                   401, "unauthorized");
  // Keyed in the head: what the trailer adds (another key, another Host) is not read.
  const RawResponse accepted =
      round_trip(server.port, head + "Authorization: Bearer s3cret\r\n\r\n" + chunked_body +
                                  "Authorization: Bearer wrong\r\nHost: y\r\n\r\n");
  CHECK_MESSAGE(accepted.status == 202, accepted.body);
}

TEST_CASE("a chunked body's trailer past the buffer gets 431 - a chunk line past it 400") {
  EchoServer server{HarnessOptions()};  // a head of 64 KiB at most: the trailer's fields are more
  const std::string head =
      "POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  {
    RawConnection c(server.port);
    c.send(head + "f\r\n{\"id\": \"trail\"}\r\n0\r\n", 2000ms);
    for (int i = 0; i < 10; ++i)
      c.send("X-Trail-" + std::to_string(i) + ": " + std::string(10 * 1000, 'a') + "\r\n", 2000ms);
    c.send("\r\n", 2000ms);
    check_error_body(first_response(c.read(10000ms, "}}")), 431, "header_too_large");
  }
  // A chunk's extensions past the buffer, the last chunk's too: the body could not be read (no
  // header is too large).
  for (const std::string chunk : {"f;ext=", "0;ext=", "f\r\n{\"id\": \"trail\"}\r\n0;ext="}) {
    CAPTURE(chunk);
    RawConnection c(server.port);
    c.send(head + chunk + std::string(100 * 1000, 'a') + "\r\n", 2000ms);
    check_error_body(first_response(c.read(10000ms, "}}")), 400, "bad_request");
  }
  CHECK(server.alive());
}

TEST_CASE("a request in absolute form is routed by its path - HTTP/1.0 keep-alive is kept") {
  EchoServer server;
  CHECK(round_trip(server.port, "GET http://example.com/ping HTTP/1.1\r\nHost: x\r\n\r\n").status ==
        200);
  RawConnection c(server.port);
  REQUIRE(c.send("GET /ping HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  const std::string first = c.read(10000ms, "\r\n\r\n");
  CHECK(first.rfind("HTTP/1.0 200", 0) == 0);
  CHECK(first.find("Connection: keep-alive") != std::string::npos);
  REQUIRE(c.send("GET /ping HTTP/1.0\r\n\r\n"));  // the same connection serves another
  CHECK(c.read(10000ms, "\r\n\r\n").rfind("HTTP/1.0 200", 0) == 0);
}

TEST_CASE("an escaped slash is part of its segment - /v1%2Fstats is no route") {
  // The segments a path has are the ones a proxy in front sees: an escaped '/' joins no two.
  EchoServer server{HarnessOptions()};
  for (const std::string path : {"/v1%2Fstats", "/v1%2fstats", "/v1/inferences%2Fx%2Fredeliver"}) {
    CAPTURE(path);
    const std::string method = path.find("redeliver") != std::string::npos ? "POST" : "GET";
    const RawResponse r = round_trip(
        server.port, method + " " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    check_error_body(r, 404, "not_found");
    CHECK(r.body.find("No route for") != std::string::npos);  // (not the redeliver's "No job")
  }
  // Other escapes are the characters they stand for (as RFC 3986 normalizes them).
  CHECK(round_trip(server.port, "GET /v1/st%61ts HTTP/1.1\r\nHost: x\r\n\r\n").status == 200);
  // An absolute form without a path is the path "/".
  const RawResponse bare =
      round_trip(server.port, "GET http://example.com?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
  check_error_body(bare, 404, "not_found");
  CHECK(bare.body.find("GET /.") != std::string::npos);
}

TEST_CASE("two Content-Type or Content-Encoding fields are refused - as a hop joining them reads") {
  EchoServer server{HarnessOptions()};
  // Content-Encoding is a list: two fields are "identity, gzip" to a hop that joins them.
  check_error_body(round_trip(server.port,
                              "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Encoding: "
                              "identity\r\nContent-Encoding: gzip\r\nContent-Type: "
                              "application/json\r\nContent-Length: 1\r\n\r\n3"),
                   415, "unsupported_encoding");
  // Content-Type is one value: two are refused, in either order.
  for (const std::string types :
       {"Content-Type: application/json\r\nContent-Type: application/x-www-form-urlencoded\r\n",
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Type: application/json\r\n"}) {
    check_error_body(round_trip(server.port, "POST /v1/inferences HTTP/1.1\r\nHost: x\r\n" + types +
                                                 "Content-Length: 13\r\n\r\n{\"id\": \"two\"}"),
                     400, "invalid_header");
  }
}

TEST_CASE("SageMaker's headers are judged at the head - no 100 Continue for an ambiguous one") {
  EchoServer server{HarnessOptions()};
  const std::string head =
      "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: 7\r\nExpect: 100-continue\r\n";
  for (const std::string fields :
       {"X-Amzn-SageMaker-Custom-Attributes: a\r\nX-Amzn-SageMaker-Custom-Attributes: b\r\n",
        "X-Amzn-SageMaker-Target-Model: a\r\nX-Amzn-SageMaker-Target-Model: b\r\n",
        "X-Amzn-SageMaker-Target-Model: \r\n"}) {
    CAPTURE(fields);
    RawConnection c(server.port);
    REQUIRE(c.send(head + fields + "\r\n"));
    // Answered before any body is sent: the upload is not invited, then thrown away.
    const std::string text = c.read(10000ms, "}}");
    CHECK(text.rfind("HTTP/1.1 400", 0) == 0);
    check_error_body(first_response(text), 400, "invalid_header");
  }
}

TEST_CASE("what the front refuses itself answers a HEAD without a body") {
  EchoServer server{HarnessOptions()};
  RawConnection c(server.port);
  REQUIRE(c.send("HEAD /ping HTTP/1.1\r\n\r\n"));  // no Host: 400 invalid_host
  const std::string text = c.read(10000ms);        // the connection closes after a refusal
  CHECK(text.rfind("HTTP/1.1 400", 0) == 0);
  const std::size_t end = text.find("\r\n\r\n");
  REQUIRE(end != std::string::npos);
  CHECK(text.find("Content-Length: ") < end);  // the length a GET's body would have had
  CHECK(text.size() == end + 4);               // and none of the body
}

TEST_CASE(
    "framing nits - a listed Content-Length ends the connection - 1.0 hears no 100 Continue") {
  EchoServer server{HarnessOptions()};
  {
    // "13,13" is one length to Beast and may be two to another hop: the last request there.
    const RawResponse r = round_trip(server.port,
                                     "POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                     "application/json\r\nContent-Length: 13,13\r\n\r\n{\"id\": "
                                     "\"cl2\"}");
    CHECK(r.status == 202);
    CHECK(r.has_header("Connection: close\r\n"));
  }
  {
    // An HTTP/1.0 client's expectation is ignored: the answer is the first thing it reads.
    RawConnection c(server.port);
    REQUIRE(
        c.send("POST /invocations HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: 3\r\nExpect: 100-continue\r\n\r\n"));
    CHECK(c.read(300ms).empty());
    REQUIRE(c.send("[1]"));
    CHECK(c.read(10000ms, "]").rfind("HTTP/1.0 200", 0) == 0);
  }
  // A 204 says no length.
  const RawResponse options =
      round_trip(server.port, "OPTIONS /v1/inferences HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(options.status == 204);
  CHECK_FALSE(options.has_header("Content-Length"));
}
