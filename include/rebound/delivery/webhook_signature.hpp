// Standard Webhooks 1.0 signatures: signing callbacks, and verifying them on the receiving side.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace rebound {

/// The `webhook-signature` value for one message: "v1," + base64(HMAC-SHA256(key,
/// "<webhook_id>.<timestamp>.<body>")), where key is the base64-decoded secret after "whsec_".
/// Throws rebound::Error when `secret` is not a valid "whsec_<base64>" secret.
///
/// Example (the specification's test vector):
///   sign_webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
///                1614265330, R"({"test": 2432232314})")
///   == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
/// Thread-safe.
std::string sign_webhook(std::string_view secret, std::string_view webhook_id,
                         std::int64_t timestamp, std::string_view body);

/// True when `secret` has the form "whsec_<base64>" with a non-empty key.
bool is_valid_webhook_secret(std::string_view secret);

/// Checks a received webhook: the timestamp is within `tolerance_seconds` of `now` and one of the
/// space-separated signatures in `signature_header` (e.g. "v1,abc= v1,def=") matches.
/// Comparison is constant-time. Thread-safe.
bool verify_webhook(std::string_view secret, std::string_view webhook_id,
                    std::string_view timestamp_header, std::string_view body,
                    std::string_view signature_header, std::int64_t now,
                    std::int64_t tolerance_seconds = 300);

}  // namespace rebound
