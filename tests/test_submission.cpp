// Submission validation, callback URL parsing and the SSRF address classification.
#include <doctest/doctest.h>

#include "common/submission.hpp"

using rebound::AddressClass;
using rebound::AddressGuard;
using rebound::detail::parse_submission;

namespace {
const AddressGuard strict{};
const AddressGuard permissive{true};

void check_invalid(const std::string& body, int status, const std::string& code,
                   const std::string& field, const AddressGuard& guard = strict) {
  CAPTURE(body);
  auto r = parse_submission(body, guard);
  REQUIRE_FALSE(r.job.has_value());
  REQUIRE(r.error.has_value());
  CHECK(r.error->status == status);
  CHECK(r.error->code == code);
  CHECK(r.error->field == field);
  CHECK_FALSE(r.error->message.empty());
}
}  // namespace

TEST_CASE("the seed's request - id and callback_url only - is accepted as is") {
  auto r =
      parse_submission(R"({"id": "1234", "callback_url": "http://example.com/callback"})", strict);
  REQUIRE(r.job.has_value());
  CHECK(r.job->id == "1234");
  CHECK(r.job->callback_url == "http://example.com/callback");
  CHECK(r.job->input.is_null());
}

TEST_CASE(
    "a name twice in one object counts with its last value - a number past a double is refused") {
  auto r = parse_submission(R"({"id":"first","input":1,"id":"last","input":2})", strict);
  REQUIRE(r.job.has_value());
  CHECK(r.job->id == "last");
  CHECK(r.job->input == 2);
  check_invalid(R"({"id":"a","input":1e400})", 400, "invalid_json", "");
}

TEST_CASE("input of any JSON type is kept - unknown fields and a null callback are ignored") {
  auto r = parse_submission(
      R"({"id":"a.b_c:d-1","input":[[1,2],[3,4]],"extra":true,"callback_url":null})", strict);
  REQUIRE(r.job.has_value());
  CHECK(r.job->input == nlohmann::json::parse("[[1,2],[3,4]]"));
  CHECK(r.job->callback_url.empty());
}

TEST_CASE("a body that is not a JSON object is a 400 invalid_json") {
  check_invalid("", 400, "invalid_json", "");
  check_invalid("{\"id\":", 400, "invalid_json", "");
  check_invalid("[1,2]", 400, "invalid_json", "");
  check_invalid("\"id\"", 400, "invalid_json", "");
}

TEST_CASE("a missing or bad id is a 422 naming the field") {
  check_invalid("{}", 422, "invalid_field", "id");
  check_invalid(R"({"id":null})", 422, "invalid_field", "id");
  check_invalid(R"({"id":1234})", 422, "invalid_field", "id");
  check_invalid(R"({"id":""})", 422, "invalid_field", "id");
  check_invalid(R"({"id":"has space"})", 422, "invalid_field", "id");
  check_invalid(R"({"id":"slash/"})", 422, "invalid_field", "id");
  check_invalid(R"({"id":"caf\u00e9"})", 422, "invalid_field", "id");
  // No status URL can name these: /v1/inferences/. and /v1/inferences/.. are other paths.
  check_invalid(R"({"id":"."})", 422, "invalid_field", "id");
  check_invalid(R"({"id":".."})", 422, "invalid_field", "id");
  CHECK(parse_submission(R"({"id":"..."})", strict).job.has_value());
  check_invalid(R"({"id":")" + std::string(129, 'a') + R"("})", 422, "invalid_field", "id");
  CHECK(parse_submission(R"({"id":")" + std::string(128, 'a') + R"("})", strict).job.has_value());
}

TEST_CASE("a bad callback_url is a 422 naming the field") {
  for (const char* url :
       {"\"\"", "42", "\"example.com/cb\"", "\"ftp://example.com/x\"", "\"http://\"",
        "\"http://user:pw@example.com/\"", "\"http://example.com:0/\"",
        "\"http://example.com:70000/\"", "\"http://example.com:80a/\"", "\"http://exa mple.com/\"",
        "\"http://example.com/#frag\"", "\"http://[::1/\"", "\"javascript:alert(1)\""}) {
    check_invalid(std::string(R"({"id":"a","callback_url":)") + url + "}", 422, "invalid_field",
                  "callback_url");
  }
}

TEST_CASE("callback URLs to internal addresses are refused unless private callbacks are allowed") {
  for (const char* host :
       {"127.0.0.1", "127.1.2.3", "10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254",
        "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "[::1]", "[::]", "[fe80::1]",
        "[fd00::1]", "[::ffff:127.0.0.1]", "[::ffff:169.254.169.254]", "[64:ff9b::10.0.0.1]",
        "localhost", "api.localhost",
        // As resolvers and libcurl read them too: a trailing dot, and the other IPv4 forms.
        "localhost.", "api.localhost.", "127.0.0.1.", "0", "2130706433", "0x7f000001", "127.1",
        "017700000001", "0177.0.0.1", "10.1", "0xa9fea9fe",
        // 6to4 around a loopback or private IPv4 address.
        "[2002:7f00:1::]", "[2002:a00:1::1]", "[2002:a9fe:a9fe::]",
        // IPv4-translated, local-use NAT64 and Teredo around internal IPv4 addresses.
        "[::ffff:0:127.0.0.1]", "[::ffff:0:a9fe:a9fe]", "[64:ff9b:1::a00:1]",
        "[2001:0:4136:e378:8000:63bf:80ff:fffe]", "[2001:0:a00:1::1]"}) {
    const std::string body =
        std::string(R"({"id":"a","callback_url":"http://)") + host + R"(:8080/cb"})";
    check_invalid(body, 422, "invalid_field", "callback_url");
    CAPTURE(host);
    CHECK(parse_submission(body, permissive).job.has_value());
  }
  CHECK(parse_submission(R"({"id":"a","callback_url":"https://93.184.216.34/cb"})", strict).job);
  // The message names the kind of address, in English.
  const auto unspecified =
      parse_submission(R"({"id":"a","callback_url":"http://0.0.0.0:8080/cb"})", strict);
  REQUIRE(unspecified.error.has_value());
  CHECK(unspecified.error->message.find("an unspecified address") != std::string::npos);
  // Names that only look like numbers, and a public address in another form, pass.
  for (const char* host : {"1e3.example", "deadbeef", "0x.example", "1572395042", "example.com."}) {
    CAPTURE(host);
    CHECK(parse_submission(std::string(R"({"id":"a","callback_url":"https://)") + host + "/cb\"}",
                           strict)
              .job);
  }
  CHECK(parse_submission(R"({"id":"a","callback_url":"https://[2606:4700::1]/cb"})", strict).job);
  // 6to4 around a public IPv4 address is as public.
  CHECK(parse_submission(R"({"id":"a","callback_url":"https://[2002:5db8:d822::1]/cb"})", strict)
            .job);
}

TEST_CASE("callback URLs are taken apart for the transport") {
  auto u = rebound::detail::parse_callback_url("HTTPS://Example.COM/a/b?x=1");
  REQUIRE(u.url);
  CHECK(u.url->scheme == "https");
  CHECK(u.url->host == "example.com");
  CHECK(u.url->port == 443);
  CHECK(u.url->target == "/a/b?x=1");
  CHECK(u.url->origin() == "https://example.com:443");
  u = rebound::detail::parse_callback_url("http://[2001:db8::1]:9000");
  REQUIRE(u.url);
  CHECK(u.url->host == "2001:db8::1");
  CHECK(u.url->port == 9000);
  CHECK(u.url->target == "/");
  CHECK(u.url->origin() == "http://[2001:db8::1]:9000");
  u = rebound::detail::parse_callback_url("http://example.com?q=1");
  REQUIRE(u.url);
  CHECK(u.url->target == "/?q=1");
  CHECK(u.url->port == 80);
}

TEST_CASE(
    "callback URLs with host names DNS cannot hold are refused at once - not after five failed "
    "attempts") {
  using rebound::detail::parse_callback_url;
  const std::string label63(63, 'a'), label64(64, 'a');
  CHECK(parse_callback_url("https://" + label63 + ".example.com/cb").url);
  auto u = parse_callback_url("https://" + label64 + ".example.com/cb");
  CHECK_FALSE(u.url);
  CHECK(u.error.find("longer than 63") != std::string::npos);
  CHECK_FALSE(parse_callback_url("https://example." + label64 + "/cb").url);
  // 253 characters written out (four labels of 63 and the dots) pass; one more does not.
  const std::string name253 = label63 + "." + label63 + "." + label63 + "." + std::string(61, 'b');
  REQUIRE(name253.size() == 253);
  CHECK(parse_callback_url("https://" + name253 + "/cb").url);
  CHECK(parse_callback_url("https://" + name253 + "./cb").url);  // the root's dot is not counted
  u = parse_callback_url("https://" + name253 + "b/cb");
  CHECK_FALSE(u.url);
  CHECK(u.error.find("longer than 253") != std::string::npos);
  // At submission: 422 with the reason, as for any other bad callback URL.
  const auto s = parse_submission(
      R"({"id":"a","callback_url":"https://)" + label64 + R"(.example.com/cb"})", strict);
  CHECK_FALSE(s.job);
  REQUIRE(s.error.has_value());
  CHECK(s.error->status == 422);
  CHECK(s.error->code == "invalid_field");
  CHECK(s.error->field == "callback_url");
  CHECK(s.error->message.find("longer than 63") != std::string::npos);
  // An IPv6 literal is no name: its length is not a label's. Without brackets, a colon in the
  // host is no IPv6 address (and no way around the checks on names).
  CHECK(parse_callback_url("https://[2606:4700:4700:0000:0000:0000:0000:1111]/cb").url);
  CHECK_FALSE(parse_callback_url("http://" + label64 + ":1:80/cb").url);
  CHECK_FALSE(parse_callback_url("http://2606:4700::1111/cb").url);
}

TEST_CASE("a callback URL's bytes past ASCII are sent percent-encoded - as a browser sends them") {
  using rebound::detail::as_sent;
  CHECK(as_sent("https://example.com/caf\xc3\xa9?q=\xe2\x82\xac&r=%20") ==
        "https://example.com/caf%C3%A9?q=%E2%82%AC&r=%20");
  CHECK(as_sent("http://example.com/plain?x=1") == "http://example.com/plain?x=1");
  CHECK(rebound::detail::parse_callback_url("https://example.com/caf\xc3\xa9").url);
  // The 2,048 characters bound the request line as sent, at submission; a job stored before
  // keeps its URL (the transport still parses it).
  const std::string base = "https://example.com/?q=";  // 23 characters
  std::string umlauts;
  for (int i = 0; i < 600; ++i)
    umlauts += "\xc3\xbc";
  CHECK(rebound::detail::parse_callback_url(base + umlauts).url);
  const auto submitted = [&](const std::string& url) {
    return parse_submission(R"({"id":"a","callback_url":")" + url + "\"}", strict);
  };
  auto refused = submitted(base + umlauts);
  REQUIRE(refused.error.has_value());
  CHECK(refused.error->field == "callback_url");
  CHECK(refused.error->message.find("percent-encoded") != std::string::npos);
  // 2,048 as sent pass (23 + 337 * 6 + 3), 2,049 do not.
  std::string at_limit = base;
  for (int i = 0; i < 337; ++i)
    at_limit += "\xc3\xbc";
  at_limit += "aaa";
  REQUIRE(rebound::detail::sent_length(at_limit) == 2048);
  CHECK(submitted(at_limit).job);
  CHECK_FALSE(submitted(at_limit + "a").job);
}

TEST_CASE("addresses are classified in IPv4 - IPv6 and IPv4-mapped forms") {
  auto c = [](const char* s) { return rebound::classify_ip_literal(s); };
  CHECK(c("8.8.8.8") == AddressClass::global);
  CHECK(c("127.0.0.1") == AddressClass::loopback);
  CHECK(c("172.31.255.255") == AddressClass::private_use);
  CHECK(c("172.32.0.1") == AddressClass::global);
  CHECK(c("100.127.255.255") == AddressClass::shared_cgnat);
  CHECK(c("100.128.0.1") == AddressClass::global);
  CHECK(c("169.254.169.254") == AddressClass::link_local);
  CHECK(c("::1") == AddressClass::loopback);
  CHECK(c("::ffff:10.1.2.3") == AddressClass::private_use);
  CHECK(c("::ffff:8.8.8.8") == AddressClass::global);
  CHECK(c("ff02::1") == AddressClass::multicast);
  CHECK(c("fe80::1%eth0") == AddressClass::link_local);
  CHECK(c("2606:4700::1111") == AddressClass::global);
  CHECK(c("2002:7f00:1::") == AddressClass::loopback);       // 6to4 of 127.0.0.1
  CHECK(c("2002:c0a8:101::") == AddressClass::private_use);  // of 192.168.1.1
  CHECK(c("2002:5db8:d822::1") == AddressClass::global);     // of 93.184.216.34
  CHECK(c("::ffff:0:127.0.0.1") == AddressClass::loopback);  // IPv4-translated
  CHECK(c("::ffff:0:808:808") == AddressClass::global);
  CHECK(c("64:ff9b:1::808:808") == AddressClass::private_use);  // local-use NAT64
  // Teredo: the client 127.0.0.1 stored inverted (80ff:fffe), behind a global server.
  CHECK(c("2001:0:4136:e378:8000:63bf:80ff:fffe") == AddressClass::loopback);
  CHECK(c("2001:0:4136:e378:8000:63bf:f7f7:f7f7") == AddressClass::global);  // 8.8.8.8
  CHECK(c("2001:0:a00:1::1") == AddressClass::private_use);                  // its server 10.0.0.1
  CHECK_FALSE(c("example.com").has_value());
}

TEST_CASE("resolving a name that points inside the network is refused") {
  auto r = strict.resolve("localhost");
  CHECK(r.address.empty());
  CHECK(r.refused);
  CHECK(r.error.find("loopback") != std::string::npos);
  auto ok = permissive.resolve("localhost");
  CHECK_FALSE(ok.address.empty());
  auto missing = strict.resolve("no-such-host.invalid");
  CHECK(missing.address.empty());
  CHECK_FALSE(missing.refused);
}

TEST_CASE("the allowlist admits named hosts - domains - addresses and ranges inside the network") {
  const AddressGuard guard(false, {"hooks.internal", "*.corp.example", "10.1.2.3", "192.168.0.0/16",
                                   "fd00::/8", "LocalHost"});
  CHECK_FALSE(guard.check_host("hooks.internal"));
  CHECK_FALSE(guard.check_host("api.corp.example"));
  CHECK_FALSE(guard.check_host("10.1.2.3"));
  CHECK_FALSE(guard.check_host("192.168.77.1"));
  CHECK_FALSE(guard.check_host("fd12::1"));
  CHECK_FALSE(guard.check_host("localhost"));  // entries are case-insensitive
  CHECK(guard.check_host("10.1.2.4"));
  CHECK(guard.check_host("127.0.0.1"));
  CHECK(guard.check_host("fe80::1"));
  CHECK(guard.check_host("corp.example") == std::nullopt);  // a public name: resolved later
  CHECK_FALSE(guard.host_listed("corp.example"));           // *.corp.example is subdomains only
  CHECK(guard.resolve("localhost").refused == false);
  CHECK_FALSE(guard.resolve("localhost").address.empty());

  const AddressGuard range_only(false, {"127.0.0.0/8"});
  CHECK_FALSE(range_only.resolve("localhost").address.empty());  // resolved into a listed range

  for (const char* bad : {"10.0.0.0/33", "::/129", "10.0.0.0/x", "*", "a*b", "host/8", ""}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(AddressGuard(false, {bad}), rebound::Error);
  }
}

TEST_CASE("a status and a callback state read back from the text to_string spells - nothing else") {
  for (auto s :
       {rebound::JobStatus::queued, rebound::JobStatus::running, rebound::JobStatus::succeeded,
        rebound::JobStatus::failed, rebound::JobStatus::expired, rebound::JobStatus::cancelled}) {
    CHECK(rebound::from_string<rebound::JobStatus>(rebound::to_string(s)) == s);
  }
  for (auto s : {rebound::CallbackState::none, rebound::CallbackState::pending,
                 rebound::CallbackState::delivered, rebound::CallbackState::failed}) {
    CHECK(rebound::from_string<rebound::CallbackState>(rebound::to_string(s)) == s);
  }
  CHECK_FALSE(rebound::from_string<rebound::JobStatus>("Queued").has_value());
  CHECK_FALSE(rebound::from_string<rebound::JobStatus>("").has_value());
  CHECK_FALSE(rebound::from_string<rebound::JobStatus>("none").has_value());  // a callback state
  CHECK_FALSE(rebound::from_string<rebound::CallbackState>("queued").has_value());
}
