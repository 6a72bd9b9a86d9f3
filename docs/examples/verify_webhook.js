// Verify a rebound callback (Standard Webhooks 1.0) with Node's built-in crypto only.
const crypto = require("crypto");

function verifyWebhook(secret, headers, body, toleranceS = 300, now = Date.now() / 1000) {
  const id = headers["webhook-id"];
  const timestamp = headers["webhook-timestamp"];
  if (!/^\d+$/.test(timestamp) || Math.abs(now - Number(timestamp)) > toleranceS) return false;
  const key = Buffer.from(secret.replace(/^whsec_/, ""), "base64");
  const expected = crypto.createHmac("sha256", key).update(`${id}.${timestamp}.${body}`).digest();
  return headers["webhook-signature"].split(" ").some((sig) => {
    if (!sig.startsWith("v1,")) return false;
    const given = Buffer.from(sig.slice(3), "base64");
    return given.length === expected.length && crypto.timingSafeEqual(given, expected);
  });
}

module.exports = { verifyWebhook };

if (require.main === module) {  // the specification's test vector
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
  console.log("verify_webhook.js: ok");
}
