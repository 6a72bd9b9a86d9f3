// Standard Webhooks signing and verification with OpenSSL: HMAC-SHA256 (v1) and Ed25519 (v1a).
#include "rebound/delivery/webhook_signature.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstdlib>
#include <vector>

#include "rebound/error.hpp"

namespace rebound {
namespace {

constexpr std::string_view secret_prefix = "whsec_";
constexpr std::string_view signing_key_prefix = "whsk_";
constexpr std::string_view public_key_prefix = "whpk_";
constexpr std::size_t ed25519_key_size = 32;
constexpr std::size_t ed25519_signature_size = 64;

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// Decodes standard base64; false on bad input.
bool decode_base64(std::string_view text, std::vector<unsigned char>& out) {
  if (text.empty() || text.size() % 4 != 0 || text.size() > (1u << 20)) return false;
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
  if (!starts_with(secret, secret_prefix)) return false;
  return decode_base64(secret.substr(secret_prefix.size()), key) && !key.empty();
}

std::string signed_content(std::string_view webhook_id, std::string_view timestamp,
                           std::string_view body) {
  std::string content;
  content.reserve(webhook_id.size() + timestamp.size() + body.size() + 2);
  content.append(webhook_id).append(".").append(timestamp).append(".").append(body);
  return content;
}

std::string hmac_signature(const std::vector<unsigned char>& key, const std::string& content) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(content.data()), content.size(), mac, &mac_len);
  return "v1," + encode_base64(mac, mac_len);
}

struct PkeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyDeleter>;
struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxDeleter>;

std::array<unsigned char, ed25519_key_size> raw_public_key(EVP_PKEY* key) {
  std::array<unsigned char, ed25519_key_size> out{};
  std::size_t size = out.size();
  if (EVP_PKEY_get_raw_public_key(key, out.data(), &size) != 1 || size != out.size()) {
    throw Error("Ed25519: cannot read the public key");
  }
  return out;
}

// The Ed25519 key of a "whsk_..." signing key; null when it is not one.
Pkey parse_signing_key(std::string_view text) {
  if (!starts_with(text, signing_key_prefix)) return nullptr;
  std::vector<unsigned char> bytes;
  if (!decode_base64(text.substr(signing_key_prefix.size()), bytes)) return nullptr;
  if (bytes.size() != ed25519_key_size && bytes.size() != 2 * ed25519_key_size) return nullptr;
  Pkey key(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, bytes.data(), ed25519_key_size));
  OPENSSL_cleanse(bytes.data(), ed25519_key_size);
  if (!key) return nullptr;
  if (bytes.size() == 2 * ed25519_key_size) {
    const auto derived = raw_public_key(key.get());
    if (CRYPTO_memcmp(derived.data(), bytes.data() + ed25519_key_size, ed25519_key_size) != 0) {
      return nullptr;  // the stored public half does not belong to this private key
    }
  }
  return key;
}

// The Ed25519 key of a "whpk_..." public key; null when it is not one.
Pkey parse_public_key(std::string_view text) {
  if (!starts_with(text, public_key_prefix)) return nullptr;
  std::vector<unsigned char> bytes;
  if (!decode_base64(text.substr(public_key_prefix.size()), bytes) ||
      bytes.size() != ed25519_key_size) {
    return nullptr;
  }
  return Pkey(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, bytes.data(), bytes.size()));
}

std::string ed25519_signature(EVP_PKEY* key, const std::string& content) {
  MdCtx ctx(EVP_MD_CTX_new());
  unsigned char signature[ed25519_signature_size];
  std::size_t size = sizeof signature;
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key) != 1 ||
      EVP_DigestSign(ctx.get(), signature, &size,
                     reinterpret_cast<const unsigned char*>(content.data()), content.size()) != 1) {
    throw Error("Ed25519: signing failed");
  }
  return "v1a," + encode_base64(signature, size);
}

bool ed25519_verifies(EVP_PKEY* key, const std::string& content, std::string_view signature64) {
  std::vector<unsigned char> signature;
  if (!decode_base64(signature64, signature) || signature.size() != ed25519_signature_size) {
    return false;
  }
  MdCtx ctx(EVP_MD_CTX_new());
  return ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key) == 1 &&
         EVP_DigestVerify(ctx.get(), signature.data(), signature.size(),
                          reinterpret_cast<const unsigned char*>(content.data()),
                          content.size()) == 1;
}

std::string public_key_text(EVP_PKEY* key) {
  const auto raw = raw_public_key(key);
  return std::string(public_key_prefix) + encode_base64(raw.data(), raw.size());
}

}  // namespace

// One parsed key: an HMAC secret or an Ed25519 signing key.
struct WebhookSigner::Key {
  std::vector<unsigned char> secret;  // v1
  Pkey ed25519;                       // v1a

  ~Key() { OPENSSL_cleanse(secret.data(), secret.size()); }

  std::string sign(const std::string& content) const {
    return ed25519 ? ed25519_signature(ed25519.get(), content) : hmac_signature(secret, content);
  }
};

bool is_valid_webhook_secret(std::string_view secret) {
  std::vector<unsigned char> key;
  return decode_secret(secret, key);
}

bool is_valid_webhook_signing_key(std::string_view key) {
  return parse_signing_key(key) != nullptr;
}

std::string webhook_public_key(std::string_view signing_key) {
  Pkey key = parse_signing_key(signing_key);
  if (!key) throw Error("a signing key must look like whsk_<base64 of 32 bytes>");
  return public_key_text(key.get());
}

std::vector<std::string> derive_webhook_keys(const std::vector<std::string>& keys,
                                             std::string_view tenant) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) {
    const bool secret = starts_with(key, secret_prefix);
    std::vector<unsigned char> bytes;
    if (secret ? !decode_secret(key, bytes)
               : !(starts_with(key, signing_key_prefix) &&
                   decode_base64(std::string_view(key).substr(signing_key_prefix.size()), bytes) &&
                   (bytes.size() == ed25519_key_size || bytes.size() == 2 * ed25519_key_size))) {
      throw Error("derive_webhook_keys: a key is neither whsec_ nor whsk_");
    }
    if (!secret) bytes.resize(ed25519_key_size);  // the seed
    // HMAC-SHA256 keyed with the server's key over a label and the tenant's name: without the
    // server's key, one tenant's key tells nothing of another's.
    const std::string label =
        std::string(secret ? "rebound tenant secret " : "rebound tenant signing key ") +
        std::string(tenant);
    unsigned char derived[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    HMAC(EVP_sha256(), bytes.data(), static_cast<int>(bytes.size()),
         reinterpret_cast<const unsigned char*>(label.data()), label.size(), derived, &size);
    OPENSSL_cleanse(bytes.data(), bytes.size());
    out.push_back(std::string(secret ? secret_prefix : signing_key_prefix) +
                  encode_base64(derived, size));
    OPENSSL_cleanse(derived, sizeof derived);
  }
  return out;
}

std::string generate_webhook_signing_key() {
  unsigned char seed[ed25519_key_size];
  if (RAND_bytes(seed, sizeof seed) != 1) throw Error("Ed25519: no random bytes");
  std::string out = std::string(signing_key_prefix) + encode_base64(seed, sizeof seed);
  OPENSSL_cleanse(seed, sizeof seed);
  return out;
}

std::string sign_webhook(std::string_view key, std::string_view webhook_id, std::int64_t timestamp,
                         std::string_view body) {
  return WebhookSigner({std::string(key)}).sign(webhook_id, timestamp, body);
}

bool verify_webhook(std::string_view key, std::string_view webhook_id,
                    std::string_view timestamp_header, std::string_view body,
                    std::string_view signature_header, std::int64_t now,
                    std::int64_t tolerance_seconds) {
  std::vector<unsigned char> secret;
  Pkey public_key;
  if (starts_with(key, public_key_prefix)) {
    public_key = parse_public_key(key);
    if (!public_key) return false;
  } else if (!decode_secret(key, secret)) {
    return false;
  }
  if (timestamp_header.empty() || timestamp_header.size() > 18) return false;
  std::int64_t timestamp = 0;
  for (char c : timestamp_header) {
    if (c < '0' || c > '9') return false;
    timestamp = timestamp * 10 + (c - '0');
  }
  if (timestamp < now - tolerance_seconds || timestamp > now + tolerance_seconds) return false;
  const std::string content = signed_content(webhook_id, timestamp_header, body);
  const std::string expected = public_key ? std::string() : hmac_signature(secret, content);
  std::size_t pos = 0;
  while (pos < signature_header.size()) {
    std::size_t end = signature_header.find(' ', pos);
    if (end == std::string_view::npos) end = signature_header.size();
    const std::string_view candidate = signature_header.substr(pos, end - pos);
    pos = end + 1;
    if (public_key) {
      if (starts_with(candidate, "v1a,") &&
          ed25519_verifies(public_key.get(), content, candidate.substr(4))) {
        return true;
      }
    } else if (candidate.size() == expected.size() &&
               CRYPTO_memcmp(candidate.data(), expected.data(), expected.size()) == 0) {
      return true;
    }
  }
  return false;
}

WebhookSigner::WebhookSigner(const std::vector<std::string>& keys) {
  auto parsed = std::make_shared<std::vector<std::shared_ptr<const Key>>>();
  auto published = std::make_shared<std::vector<std::string>>();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto key = std::make_shared<Key>();
    if (starts_with(keys[i], signing_key_prefix)) {
      key->ed25519 = parse_signing_key(keys[i]);
      if (!key->ed25519) {
        throw Error("signing key " + std::to_string(i + 1) +
                    " must look like whsk_<base64 of 32 bytes>");
      }
      published->push_back(public_key_text(key->ed25519.get()));
    } else if (!decode_secret(keys[i], key->secret)) {
      throw Error("signing key " + std::to_string(i + 1) +
                  " must look like whsec_<base64> (HMAC) or whsk_<base64> (Ed25519)");
    }
    parsed->push_back(std::move(key));
  }
  keys_ = std::move(parsed);
  public_keys_ = std::move(published);
}

std::string WebhookSigner::sign(std::string_view webhook_id, std::int64_t timestamp,
                                std::string_view body) const {
  if (keys_->empty()) return {};
  const std::string content = signed_content(webhook_id, std::to_string(timestamp), body);
  std::string header;
  for (const auto& key : *keys_) {
    if (!header.empty()) header += ' ';
    header += key->sign(content);
  }
  return header;
}

const std::vector<std::string>& WebhookSigner::public_keys() const {
  return *public_keys_;
}

bool WebhookSigner::empty() const {
  return keys_->empty();
}

}  // namespace rebound
