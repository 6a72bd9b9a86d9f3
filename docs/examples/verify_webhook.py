"""Verify a rebound callback (Standard Webhooks 1.0) with Python's standard library only."""
import base64
import hashlib
import hmac
import time


def verify_webhook(secret: str, headers: dict, body: bytes, tolerance_s: int = 300, now=None) -> bool:
    """True when one of the webhook-signature values matches and the timestamp is fresh."""
    msg_id = headers["webhook-id"]
    timestamp = headers["webhook-timestamp"]
    now = time.time() if now is None else now
    if not timestamp.isdigit() or abs(now - int(timestamp)) > tolerance_s:
        return False
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(
        hmac.compare_digest(sig[3:], expected)
        for sig in headers["webhook-signature"].split()
        if sig.startswith("v1,")
    )


if __name__ == "__main__":  # the specification's test vector
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    assert verify_webhook(secret, headers, b'{"test": 2432232314}', now=1614265330)
    assert not verify_webhook(secret, headers, b'{"test": 1}', now=1614265330)
    assert not verify_webhook(secret, headers, b'{"test": 2432232314}', now=1614265330 + 301)
    print("verify_webhook.py: ok")
