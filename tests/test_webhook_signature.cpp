// Standard Webhooks signatures: the specification's test vector, verification and rotation.
#include <doctest/doctest.h>

#include "rebound/delivery/webhook_signature.hpp"
#include "rebound/error.hpp"

namespace {
constexpr const char* secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
constexpr const char* msg_id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
constexpr const char* body = R"({"test": 2432232314})";
constexpr const char* expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
}  // namespace

TEST_CASE("signing reproduces the Standard Webhooks test vector") {
  CHECK(rebound::sign_webhook(secret, msg_id, 1614265330, body) == expected);
}

TEST_CASE("verification accepts the right signature within the tolerance only") {
  CHECK(rebound::verify_webhook(secret, msg_id, "1614265330", body, expected, 1614265330));
  CHECK(rebound::verify_webhook(secret, msg_id, "1614265330", body, expected, 1614265330 + 299));
  CHECK_FALSE(
      rebound::verify_webhook(secret, msg_id, "1614265330", body, expected, 1614265330 + 301));
  CHECK_FALSE(
      rebound::verify_webhook(secret, msg_id, "1614265330", body, expected, 1614265330 - 301));
  CHECK_FALSE(rebound::verify_webhook(secret, msg_id, "1614265330", R"({"test": 1})", expected,
                                      1614265330));
  CHECK_FALSE(
      rebound::verify_webhook(secret, "msg_other", "1614265330", body, expected, 1614265330));
  CHECK_FALSE(rebound::verify_webhook(secret, msg_id, "16142653x0", body, expected, 1614265330));
  CHECK_FALSE(
      rebound::verify_webhook("whsec_b3RoZXI=", msg_id, "1614265330", body, expected, 1614265330));
}

TEST_CASE("any one of several space-separated signatures verifies (key rotation)") {
  const std::string header = std::string("v1,Zm9vYmFy ") + expected;
  CHECK(rebound::verify_webhook(secret, msg_id, "1614265330", body, header, 1614265330));
}

TEST_CASE("secrets must be whsec_ followed by base64") {
  CHECK(rebound::is_valid_webhook_secret(secret));
  CHECK_FALSE(rebound::is_valid_webhook_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
  CHECK_FALSE(rebound::is_valid_webhook_secret("whsec_"));
  CHECK_FALSE(rebound::is_valid_webhook_secret("whsec_not base64!"));
  CHECK_THROWS_AS(rebound::sign_webhook("nope", msg_id, 1, body), rebound::Error);
}
