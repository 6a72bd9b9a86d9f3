// Standard Webhooks signing and verification with OpenSSL's HMAC-SHA256.
#include "rebound/delivery/webhook_signature.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdlib>
#include <vector>

#include "rebound/error.hpp"

namespace rebound {
namespace {

constexpr std::string_view secret_prefix = "whsec_";

// Decodes standard base64; false on bad input.
bool decode_base64(std::string_view text, std::vector<unsigned char>& out) {
  if (text.empty() || text.size() % 4 != 0) return false;
  out.assign(text.size() / 4 * 3, 0);
  const int n = EVP_DecodeBlock(out.data(), reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0) return false;
  std::size_t len = static_cast<std::size_t>(n);
  // EVP_DecodeBlock counts padding as zero bytes; drop them.
  if (text.back() == '=') --len;
  if (text.size() >= 2 && text[text.size() - 2] == '=') --len;
  out.resize(len);
  return true;
}

std::string encode_base64(const unsigned char* data, std::size_t size) {
  std::string out(4 * ((size + 2) / 3), '\0');
  const int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), data, static_cast<int>(size));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

bool decode_secret(std::string_view secret, std::vector<unsigned char>& key) {
  if (secret.substr(0, secret_prefix.size()) != secret_prefix) return false;
  return decode_base64(secret.substr(secret_prefix.size()), key) && !key.empty();
}

std::string signature_for(const std::vector<unsigned char>& key, std::string_view webhook_id,
                          std::string_view timestamp, std::string_view body) {
  std::string content;
  content.reserve(webhook_id.size() + timestamp.size() + body.size() + 2);
  content.append(webhook_id).append(".").append(timestamp).append(".").append(body);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(content.data()), content.size(), mac, &mac_len);
  return "v1," + encode_base64(mac, mac_len);
}

}  // namespace

bool is_valid_webhook_secret(std::string_view secret) {
  std::vector<unsigned char> key;
  return decode_secret(secret, key);
}

std::string sign_webhook(std::string_view secret, std::string_view webhook_id,
                         std::int64_t timestamp, std::string_view body) {
  std::vector<unsigned char> key;
  if (!decode_secret(secret, key)) {
    throw Error("signing secret must look like whsec_<base64>");
  }
  return signature_for(key, webhook_id, std::to_string(timestamp), body);
}

bool verify_webhook(std::string_view secret, std::string_view webhook_id,
                    std::string_view timestamp_header, std::string_view body,
                    std::string_view signature_header, std::int64_t now,
                    std::int64_t tolerance_seconds) {
  std::vector<unsigned char> key;
  if (!decode_secret(secret, key)) return false;
  if (timestamp_header.empty() || timestamp_header.size() > 18) return false;
  std::int64_t timestamp = 0;
  for (char c : timestamp_header) {
    if (c < '0' || c > '9') return false;
    timestamp = timestamp * 10 + (c - '0');
  }
  if (timestamp < now - tolerance_seconds || timestamp > now + tolerance_seconds) return false;
  const std::string expected = signature_for(key, webhook_id, timestamp_header, body);
  std::size_t pos = 0;
  while (pos < signature_header.size()) {
    std::size_t end = signature_header.find(' ', pos);
    if (end == std::string_view::npos) end = signature_header.size();
    const std::string_view candidate = signature_header.substr(pos, end - pos);
    if (candidate.size() == expected.size() &&
        CRYPTO_memcmp(candidate.data(), expected.data(), expected.size()) == 0) {
      return true;
    }
    pos = end + 1;
  }
  return false;
}

}  // namespace rebound
