// Verify a rebound callback (Standard Webhooks 1.0) with Node's built-in crypto only:
// verifyWebhook with a shared secret (whsec_, v1 HMAC-SHA256), verifyWebhookEd25519 with a
// public key (whpk_, v1a Ed25519).
const crypto = require("crypto");

function fresh(timestamp, toleranceS, now) {
  return /^\d+$/.test(timestamp) && Math.abs(now - Number(timestamp)) <= toleranceS;
}

function verifyWebhook(secret, headers, body, toleranceS = 300, now = Date.now() / 1000) {
  const id = headers["webhook-id"];
  const timestamp = headers["webhook-timestamp"];
  if (!fresh(timestamp, toleranceS, now)) return false;
  const key = Buffer.from(secret.replace(/^whsec_/, ""), "base64");
  const expected = crypto.createHmac("sha256", key).update(`${id}.${timestamp}.${body}`).digest();
  return headers["webhook-signature"].split(" ").some((sig) => {
    if (!sig.startsWith("v1,")) return false;
    const given = Buffer.from(sig.slice(3), "base64");
    return given.length === expected.length && crypto.timingSafeEqual(given, expected);
  });
}

function verifyWebhookEd25519(publicKey, headers, body, toleranceS = 300, now = Date.now() / 1000) {
  const id = headers["webhook-id"];
  const timestamp = headers["webhook-timestamp"];
  if (!fresh(timestamp, toleranceS, now)) return false;
  const x = Buffer.from(publicKey.replace(/^whpk_/, ""), "base64").toString("base64url");
  const key = crypto.createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x }, format: "jwk" });
  const signed = Buffer.from(`${id}.${timestamp}.${body}`);
  return headers["webhook-signature"].split(" ").some((sig) => {
    if (!sig.startsWith("v1a,")) return false;
    return crypto.verify(null, signed, key, Buffer.from(sig.slice(4), "base64"));
  });
}

module.exports = { verifyWebhook, verifyWebhookEd25519 };

if (require.main === module) {  // the specification's test vector, and rebound's v1a vector
  const headers = {
    "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
    "webhook-timestamp": "1614265330",
    "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
  };
  const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
  const assert = require("assert");
  assert(verifyWebhook(secret, headers, '{"test": 2432232314}', 300, 1614265330));
  assert(!verifyWebhook(secret, headers, '{"test": 1}', 300, 1614265330));
  assert(!verifyWebhook(secret, headers, '{"test": 2432232314}', 300, 1614265330 + 301));

  const publicKey = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
  headers["webhook-signature"] =
    "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= " +
    "v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw==";
  assert(verifyWebhookEd25519(publicKey, headers, '{"test": 2432232314}', 300, 1614265330));
  assert(!verifyWebhookEd25519(publicKey, headers, '{"test": 1}', 300, 1614265330));
  assert(!verifyWebhookEd25519(publicKey, headers, '{"test": 2432232314}', 300, 1614265330 + 301));
  const other = "whpk_O2onvM62pC1io6jQKm8Nc2UyFXcd4kOmOsBIoYtZ2ik=";
  assert(!verifyWebhookEd25519(other, headers, '{"test": 2432232314}', 300, 1614265330));
  console.log("verify_webhook.js: ok");
}
