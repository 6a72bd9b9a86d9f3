// CursorSeal: a listing's cursors as opaque, authenticated text (AES-256-GCM, with the listing
// and the caller's tenant as associated data, the plaintext padded to one length), so that a
// client can neither read what a cursor names (a store may stop its scan at another tenant's
// entry), nor tell its length, nor forge one, nor use one handed to another tenant: as long as
// the client does not know `secret`. (rebound::Server derives it from the webhook signing keys;
// with one tenant, every API key may read its shared secret, and so could seal a cursor of its
// own. That grants nothing: the store is asked for the caller's tenant's entries whatever the
// cursor says. The seal is what keeps tenants apart only where there are several.)
#pragma once

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rebound::detail {

class CursorSeal {
 public:
  /// `secret`: high-entropy key material every server of a fleet shares and no client knows
  /// (rebound::Server passes its webhook signing keys), from which the key is derived, so that a
  /// cursor one server hands out opens on another. Empty: a random key of this process (cursors
  /// open only where they were given). `padded`: the length every plaintext is padded to.
  CursorSeal(std::string_view secret, std::size_t padded) : padded_(padded) {
    if (secret.empty()) {
      if (RAND_bytes(key_.data(), static_cast<int>(key_.size())) != 1)
        throw std::runtime_error("CursorSeal: no random key");
      return;
    }
    std::string material = "rebound list cursor v1\n" + std::string(secret);
    SHA256(reinterpret_cast<const unsigned char*>(material.data()), material.size(), key_.data());
    OPENSSL_cleanse(material.data(), material.size());
  }
  ~CursorSeal() { OPENSSL_cleanse(key_.data(), key_.size()); }
  CursorSeal(const CursorSeal&) = delete;
  CursorSeal& operator=(const CursorSeal&) = delete;

  /// `text` (no NUL in it) sealed for `context` (the listing and the caller's tenant): base64url
  /// (no padding) of a random nonce, the ciphertext and the tag. Empty when the cipher fails
  /// (the caller treats it as an error).
  std::string seal(std::string_view text, std::string_view context) const {
    // Padded with NULs to one length: the cursor tells nothing by its length.
    std::string plain(text);
    if (plain.size() < padded_) plain.resize(padded_, '\0');
    std::vector<unsigned char> out(nonce_size + plain.size() + tag_size);
    if (RAND_bytes(out.data(), nonce_size) != 1) return {};
    Ctx ctx(EVP_CIPHER_CTX_new());
    int n = 0;
    if (!ctx ||
        EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key_.data(), out.data()) != 1 ||
        EVP_EncryptUpdate(ctx.get(), nullptr, &n, bytes(context), size(context)) != 1 ||
        EVP_EncryptUpdate(ctx.get(), out.data() + nonce_size, &n, bytes(plain), size(plain)) != 1 ||
        EVP_EncryptFinal_ex(ctx.get(), out.data() + nonce_size + n, &n) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, tag_size,
                            out.data() + nonce_size + plain.size()) != 1) {
      return {};
    }
    return encode(out);
  }

  /// What `seal` sealed for `context`; nullopt for anything else (malformed, forged, altered, or
  /// sealed for another context or with another key).
  std::optional<std::string> open(std::string_view sealed, std::string_view context) const {
    if (sealed.size() > max_sealed) return std::nullopt;
    const auto raw = decode(sealed);
    if (!raw || raw->size() < nonce_size + tag_size) return std::nullopt;
    const std::size_t length = raw->size() - nonce_size - tag_size;
    std::string plain(length, '\0');
    Ctx ctx(EVP_CIPHER_CTX_new());
    int n = 0;
    std::array<unsigned char, tag_size> tag{};
    std::copy(raw->end() - tag_size, raw->end(), tag.begin());
    if (!ctx ||
        EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key_.data(), raw->data()) != 1 ||
        EVP_DecryptUpdate(ctx.get(), nullptr, &n, bytes(context), size(context)) != 1 ||
        EVP_DecryptUpdate(ctx.get(), reinterpret_cast<unsigned char*>(plain.data()), &n,
                          raw->data() + nonce_size, static_cast<int>(length)) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, tag_size, tag.data()) != 1 ||
        EVP_DecryptFinal_ex(ctx.get(), reinterpret_cast<unsigned char*>(plain.data()) + n, &n) !=
            1) {
      return std::nullopt;
    }
    if (const auto pad = plain.find('\0'); pad != std::string::npos) plain.resize(pad);
    return plain;
  }

 private:
  static constexpr std::size_t nonce_size = 12, tag_size = 16;
  // Far above any cursor this seal makes (a few hundred characters): refused before decoding.
  static constexpr std::size_t max_sealed = 8192;
  struct Free {
    void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
  };
  using Ctx = std::unique_ptr<EVP_CIPHER_CTX, Free>;
  static const unsigned char* bytes(std::string_view s) {
    return reinterpret_cast<const unsigned char*>(s.data());
  }
  static int size(std::string_view s) { return static_cast<int>(s.size()); }

  static constexpr char alphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  static std::string encode(const std::vector<unsigned char>& in) {
    std::string out;
    out.reserve((in.size() * 4 + 2) / 3);
    std::size_t i = 0;
    for (; i + 2 < in.size(); i += 3) {
      const unsigned v = (in[i] << 16) | (in[i + 1] << 8) | in[i + 2];
      for (int shift : {18, 12, 6, 0})
        out += alphabet[(v >> shift) & 63];
    }
    if (i < in.size()) {
      const unsigned v = (in[i] << 16) | (i + 1 < in.size() ? in[i + 1] << 8 : 0);
      out += alphabet[(v >> 18) & 63];
      out += alphabet[(v >> 12) & 63];
      if (i + 1 < in.size()) out += alphabet[(v >> 6) & 63];
    }
    return out;
  }
  static std::optional<std::vector<unsigned char>> decode(std::string_view in) {
    if (in.size() % 4 == 1) return std::nullopt;
    std::vector<unsigned char> out;
    out.reserve(in.size() * 3 / 4);
    unsigned v = 0;
    int bits = 0;
    for (const char c : in) {
      int d;
      if (c >= 'A' && c <= 'Z')
        d = c - 'A';
      else if (c >= 'a' && c <= 'z')
        d = c - 'a' + 26;
      else if (c >= '0' && c <= '9')
        d = c - '0' + 52;
      else if (c == '-')
        d = 62;
      else if (c == '_')
        d = 63;
      else
        return std::nullopt;
      v = (v << 6) | static_cast<unsigned>(d);
      bits += 6;
      if (bits >= 8) {
        bits -= 8;
        out.push_back(static_cast<unsigned char>((v >> bits) & 0xff));
      }
    }
    if (bits > 0 && (v & ((1u << bits) - 1)) != 0) return std::nullopt;  // one spelling only
    return out;
  }

  std::size_t padded_;
  std::array<unsigned char, 32> key_{};
};

}  // namespace rebound::detail
