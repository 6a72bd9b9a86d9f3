// Standard Webhooks signatures: the specification's test vector, verification and rotation.
#include <doctest/doctest.h>

#include <string>
#include <vector>

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

// Ed25519 (Standard Webhooks v1a). The signing key is RFC 8032's first test key; its public key
// is that RFC's, and the signature was computed independently (Python's `cryptography`) over the
// specification's message above. docs/examples/verify_webhook.{py,js} check the same vector.
namespace {
constexpr const char* signing_key = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=";
constexpr const char* public_key = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
constexpr const char* expected_v1a =
    "v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw==";
constexpr const char* other_public_key = "whpk_O2onvM62pC1io6jQKm8Nc2UyFXcd4kOmOsBIoYtZ2ik=";
}  // namespace

TEST_CASE("Ed25519: the signing key's public key and signature match RFC 8032 and the vector") {
  CHECK(rebound::webhook_public_key(signing_key) == public_key);
  CHECK(rebound::sign_webhook(signing_key, msg_id, 1614265330, body) == expected_v1a);
  // libsodium's 64-byte form (seed, then public key) is the same key.
  const char* libsodium_form =
      "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2DXWpgBgrEKt9VL/"
      "tPJZAc6DuFy89qmIyWvAhpo9wdRGg==";
  CHECK(rebound::sign_webhook(libsodium_form, msg_id, 1614265330, body) == expected_v1a);
}

TEST_CASE("Ed25519: verification with the public key accepts the signature and nothing else") {
  CHECK(rebound::verify_webhook(public_key, msg_id, "1614265330", body, expected_v1a, 1614265330));
  // among other values, as during a rotation or with both schemes
  const std::string both = std::string(expected) + " " + expected_v1a;
  CHECK(rebound::verify_webhook(public_key, msg_id, "1614265330", body, both, 1614265330));
  CHECK(rebound::verify_webhook(secret, msg_id, "1614265330", body, both, 1614265330));
  CHECK_FALSE(rebound::verify_webhook(public_key, msg_id, "1614265330", R"({"test": 1})",
                                      expected_v1a, 1614265330));
  CHECK_FALSE(rebound::verify_webhook(public_key, "msg_other", "1614265330", body, expected_v1a,
                                      1614265330));
  CHECK_FALSE(rebound::verify_webhook(public_key, msg_id, "1614265330", body, expected_v1a,
                                      1614265330 + 301));
  CHECK_FALSE(rebound::verify_webhook(other_public_key, msg_id, "1614265330", body, expected_v1a,
                                      1614265330));
  // a v1a value never passes as v1, nor the reverse
  CHECK_FALSE(
      rebound::verify_webhook(public_key, msg_id, "1614265330", body, expected, 1614265330));
  CHECK_FALSE(
      rebound::verify_webhook(secret, msg_id, "1614265330", body, expected_v1a, 1614265330));
  // a signing key is not a verification key, and garbage never verifies
  CHECK_FALSE(
      rebound::verify_webhook(signing_key, msg_id, "1614265330", body, expected_v1a, 1614265330));
  CHECK_FALSE(rebound::verify_webhook(public_key, msg_id, "1614265330", body, "v1a,", 1614265330));
  CHECK_FALSE(
      rebound::verify_webhook(public_key, msg_id, "1614265330", body, "v1a,!!!!", 1614265330));
  CHECK_FALSE(
      rebound::verify_webhook("whpk_AAAA", msg_id, "1614265330", body, expected_v1a, 1614265330));
}

TEST_CASE("Ed25519: keys are checked and generated keys sign and verify") {
  CHECK(rebound::is_valid_webhook_signing_key(signing_key));
  CHECK_FALSE(rebound::is_valid_webhook_signing_key("whsk_"));
  CHECK_FALSE(rebound::is_valid_webhook_signing_key("whsk_AAAA"));  // 3 bytes
  CHECK_FALSE(rebound::is_valid_webhook_signing_key(public_key));
  CHECK_FALSE(rebound::is_valid_webhook_signing_key(secret));
  // 64 bytes whose second half is not the first half's public key
  CHECK_FALSE(rebound::is_valid_webhook_signing_key(
      "whsk_nWGxne/"
      "9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=="));
  CHECK_THROWS_AS(rebound::webhook_public_key("whsk_AAAA"), rebound::Error);
  CHECK_THROWS_AS(rebound::sign_webhook("whsk_AAAA", msg_id, 1, body), rebound::Error);

  const std::string fresh = rebound::generate_webhook_signing_key();
  CHECK(fresh != rebound::generate_webhook_signing_key());
  REQUIRE(rebound::is_valid_webhook_signing_key(fresh));
  const std::string signature = rebound::sign_webhook(fresh, msg_id, 1614265330, body);
  CHECK(rebound::verify_webhook(rebound::webhook_public_key(fresh), msg_id, "1614265330", body,
                                signature, 1614265330));
  CHECK_FALSE(
      rebound::verify_webhook(public_key, msg_id, "1614265330", body, signature, 1614265330));
}

TEST_CASE("WebhookSigner signs with every key in order and publishes the Ed25519 public keys") {
  const rebound::WebhookSigner signer({secret, signing_key});
  CHECK(signer.sign(msg_id, 1614265330, body) == std::string(expected) + " " + expected_v1a);
  CHECK(signer.public_keys() == std::vector<std::string>{public_key});
  CHECK(rebound::WebhookSigner().sign(msg_id, 1, body).empty());
  CHECK(rebound::WebhookSigner().empty());
  try {
    rebound::WebhookSigner({secret, "whsk_c2VjcmV0"});
    FAIL("a bad key must be refused");
  } catch (const rebound::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("signing key 2") != std::string::npos);
    CHECK(what.find("c2VjcmV0") == std::string::npos);  // the key itself is never printed
  }
}

TEST_CASE("tenant keys are derived: the same each time - one per tenant - of the same kinds") {
  const std::string secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
  const std::string key = rebound::generate_webhook_signing_key();
  const auto acme = rebound::derive_webhook_keys({secret, key}, "acme");
  const auto again = rebound::derive_webhook_keys({secret, key}, "acme");
  const auto globex = rebound::derive_webhook_keys({secret, key}, "globex");
  REQUIRE(acme.size() == 2);
  CHECK(acme == again);
  CHECK(acme[0] != globex[0]);
  CHECK(acme[1] != globex[1]);
  CHECK(acme[0] != secret);
  CHECK(rebound::is_valid_webhook_secret(acme[0]));
  CHECK(rebound::is_valid_webhook_signing_key(acme[1]));
  // What one tenant's keys sign, another's do not verify.
  const std::string sig = rebound::sign_webhook(acme[0], "msg_1", 1700000000, "{}");
  CHECK(rebound::verify_webhook(acme[0], "msg_1", "1700000000", "{}", sig, 1700000000));
  CHECK_FALSE(rebound::verify_webhook(globex[0], "msg_1", "1700000000", "{}", sig, 1700000000));
  CHECK_FALSE(rebound::verify_webhook(secret, "msg_1", "1700000000", "{}", sig, 1700000000));
  CHECK_THROWS_AS(rebound::derive_webhook_keys({"nope"}, "acme"), rebound::Error);
}
