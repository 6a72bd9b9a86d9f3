"""Verify a rebound callback (Standard Webhooks 1.0).

verify_webhook: a shared secret (whsec_, v1 HMAC-SHA256), Python's standard library only.
verify_webhook_ed25519: a public key (whpk_, v1a Ed25519), with the `cryptography` package.
"""
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


def verify_webhook_ed25519(public_key: str, headers: dict, body: bytes, tolerance_s: int = 300,
                           now=None) -> bool:
    """True when one of the v1a values verifies with the whpk_ key and the timestamp is fresh."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    msg_id = headers["webhook-id"]
    timestamp = headers["webhook-timestamp"]
    now = time.time() if now is None else now
    if not timestamp.isdigit() or abs(now - int(timestamp)) > tolerance_s:
        return False
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key.removeprefix("whpk_")))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    for sig in headers["webhook-signature"].split():
        if sig.startswith("v1a,"):
            try:
                key.verify(base64.b64decode(sig[4:]), signed)
                return True
            except (InvalidSignature, ValueError):
                pass
    return False


if __name__ == "__main__":  # the specification's test vector, and rebound's v1a vector
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    assert verify_webhook(secret, headers, b'{"test": 2432232314}', now=1614265330)
    assert not verify_webhook(secret, headers, b'{"test": 1}', now=1614265330)
    assert not verify_webhook(secret, headers, b'{"test": 2432232314}', now=1614265330 + 301)

    public_key = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="
    headers["webhook-signature"] = (
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= "
        "v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw=="
    )
    assert verify_webhook_ed25519(public_key, headers, b'{"test": 2432232314}', now=1614265330)
    assert not verify_webhook_ed25519(public_key, headers, b'{"test": 1}', now=1614265330)
    assert not verify_webhook_ed25519(public_key, headers, b'{"test": 2432232314}',
                                      now=1614265330 + 301)
    other = "whpk_O2onvM62pC1io6jQKm8Nc2UyFXcd4kOmOsBIoYtZ2ik="
    assert not verify_webhook_ed25519(other, headers, b'{"test": 2432232314}', now=1614265330)
    print("verify_webhook.py: ok")
