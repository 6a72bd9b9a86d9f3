// Test certificates made on the fly: a certificate authority and a server certificate it signs.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace rebound::test {

/// Files of a throwaway PKI in a fresh temporary folder, removed on destruction.
class TestPki {
 public:
  /// `server_san` is the server certificate's subjectAltName, e.g. "IP:127.0.0.1".
  explicit TestPki(const std::string& server_san = "IP:127.0.0.1") {
    char tmpl[] = "/tmp/rebound-pki-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    EVP_PKEY* ca_key = EVP_EC_gen("P-256");
    X509* ca = make_cert(ca_key, ca_key, nullptr, "rebound test CA", true, "");
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* cert = make_cert(key, ca_key, ca, "rebound test receiver", false, server_san);
    write_cert(ca_cert(), ca);
    write_cert(server_cert(), cert);
    write_key(server_key(), key);
    X509_free(cert);
    X509_free(ca);
    EVP_PKEY_free(key);
    EVP_PKEY_free(ca_key);
  }
  ~TestPki() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string ca_cert() const { return dir_ + "/ca.pem"; }
  std::string server_cert() const { return dir_ + "/server.pem"; }
  std::string server_key() const { return dir_ + "/server-key.pem"; }

 private:
  static void add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer ? issuer : cert, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    if (!ext) throw std::runtime_error("bad extension " + value);
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  }

  static X509* make_cert(EVP_PKEY* key, EVP_PKEY* signer, X509* issuer, const char* cn, bool ca,
                         const std::string& san) {
    static long serial = 1;
    X509* x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, key);
    X509_NAME* name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn),
                               -1, -1, 0);
    X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name);
    add_ext(x, issuer, NID_basic_constraints, ca ? "critical,CA:TRUE" : "CA:FALSE");
    add_ext(x, issuer, NID_key_usage,
            ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature,keyEncipherment");
    add_ext(x, issuer, NID_subject_key_identifier, "hash");
    if (!ca) {
      add_ext(x, issuer, NID_authority_key_identifier, "keyid");
      add_ext(x, issuer, NID_ext_key_usage, "serverAuth");
      add_ext(x, issuer, NID_subject_alt_name, san);
    }
    X509_sign(x, signer, EVP_sha256());
    return x;
  }

  static void write_cert(const std::string& path, X509* cert) {
    FILE* f = std::fopen(path.c_str(), "w");
    PEM_write_X509(f, cert);
    std::fclose(f);
  }
  static void write_key(const std::string& path, EVP_PKEY* key) {
    FILE* f = std::fopen(path.c_str(), "w");
    PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
  }

  std::string dir_;
};

}  // namespace rebound::test
