// Standard Webhooks 1.0 signatures: signing callbacks, and verifying them on the receiving side.
//
// Two schemes, told apart by the key's prefix:
// - symmetric (`v1`): HMAC-SHA256 with a shared secret `whsec_<base64 key>`;
// - asymmetric (`v1a`): Ed25519 with a signing key `whsk_<base64>` kept by the sender and a
//   public key `whpk_<base64 32 bytes>` given to receivers, who then hold nothing that can sign.
//   A `whsk_` key is the 32-byte Ed25519 private key (seed), or 64 bytes (seed, then public key)
//   as libsodium keeps it.
// Both sign "<webhook_id>.<timestamp>.<body>" and send "v1,<base64>" / "v1a,<base64>" values,
// space-separated when several keys sign (rotation).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rebound {

/// The `webhook-signature` value for one message with one key:
/// - `whsec_...`: "v1," + base64(HMAC-SHA256(key, "<webhook_id>.<timestamp>.<body>")), where key
///   is the base64-decoded secret after "whsec_";
/// - `whsk_...`: "v1a," + base64(Ed25519 signature of the same content).
/// Throws rebound::Error when `key` is neither.
///
/// Example (the specification's test vector):
///   sign_webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
///                1614265330, R"({"test": 2432232314})")
///   == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
/// Thread-safe.
std::string sign_webhook(std::string_view key, std::string_view webhook_id, std::int64_t timestamp,
                         std::string_view body);

/// True when `secret` has the form "whsec_<base64>" with a non-empty key.
bool is_valid_webhook_secret(std::string_view secret);

/// True when `key` is an Ed25519 signing key "whsk_<base64 of 32 or 64 bytes>" (with 64, the last
/// 32 must be the public key of the first 32).
bool is_valid_webhook_signing_key(std::string_view key);

/// The public key "whpk_<base64>" that verifies what `signing_key` ("whsk_...") signs. Throws
/// rebound::Error when it is not a valid signing key.
std::string webhook_public_key(std::string_view signing_key);

/// The keys of one tenant, derived from the server's `keys` ("whsec_..." and "whsk_...", in the
/// same order and of the same kinds): HMAC-SHA256 of the tenant's name keyed with each key. A
/// tenant given its own secret learns nothing of the server's or of another tenant's. Throws
/// rebound::Error for a key of neither kind.
std::vector<std::string> derive_webhook_keys(const std::vector<std::string>& keys,
                                             std::string_view tenant);

/// A new random Ed25519 signing key, "whsk_<base64 of 32 bytes>" (OpenSSL's RAND_bytes).
std::string generate_webhook_signing_key();

/// Checks a received webhook: the timestamp is within `tolerance_seconds` of `now` and one of the
/// space-separated signatures in `signature_header` (e.g. "v1,abc= v1a,def=") verifies with `key`:
/// a shared secret `whsec_...` checks the `v1` values, a public key `whpk_...` the `v1a` ones.
/// Comparison is constant-time. Thread-safe. False for a key of neither form.
bool verify_webhook(std::string_view key, std::string_view webhook_id,
                    std::string_view timestamp_header, std::string_view body,
                    std::string_view signature_header, std::int64_t now,
                    std::int64_t tolerance_seconds = 300);

/// Signs with several keys at once (rotation, or both schemes), parsed once: what a sender keeps.
/// Thread-safe; cheap to copy (the parsed keys are shared).
class WebhookSigner {
 public:
  /// Each key is `whsec_...` or `whsk_...`; throws rebound::Error naming the first bad one
  /// (without printing it). No keys: `sign` answers an empty string.
  explicit WebhookSigner(const std::vector<std::string>& keys = {});

  /// The `webhook-signature` header value: one signature per key, in the order given,
  /// space-separated. Empty when there are no keys.
  std::string sign(std::string_view webhook_id, std::int64_t timestamp,
                   std::string_view body) const;

  /// The `whpk_...` public keys of the `whsk_...` signing keys, in order (what
  /// `GET /v1/webhook-keys` publishes).
  const std::vector<std::string>& public_keys() const;

  bool empty() const;

  struct Key;

 private:
  std::shared_ptr<const std::vector<std::shared_ptr<const Key>>> keys_;
  std::shared_ptr<const std::vector<std::string>> public_keys_;
};

}  // namespace rebound
