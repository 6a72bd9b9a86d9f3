#!/usr/bin/env python3
"""examples/sagemaker/serve against hostile clients, with the real rebound-server and nginx.

/ping answers 200 within 2 s while 1,000 connections sit idle or trickle their headers, and while
100 /invocations wait on a sleep:4 model with 2 workers; nginx holds bodies and headers to their
limits with the API's JSON errors; rebound's own answers pass through; two serves run side by
side; SIGTERM stops both and exits 0 within 30 s, leaving nothing behind.

Usage: front_door.py SERVE REBOUND_SERVER
"""
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from rawhttp import error_code, free_port, get, ping_within, post, request  # noqa: E402

serve, server_bin = sys.argv[1], sys.argv[2]
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message, flush=True)


class Serve:
    def __init__(self, *args):
        self.port = free_port()
        env = dict(os.environ, SAGEMAKER_BIND_TO_PORT=str(self.port), REBOUND_SERVER=server_bin,
                   REBOUND_SERVE_HOST="127.0.0.1")
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([serve, *args], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            if get(self.port, "/ping", 0.5)[0] == 200:
                return
            time.sleep(0.1)
        self.stop()
        raise SystemExit("serve did not start:\n" + self.output())

    def output(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def children(self):
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def stop(self):
        """SIGTERM; returns (exit status, seconds taken)."""
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(40)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait()
        return status, time.monotonic() - start


soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))

# --- 1,000 connections idle or trickling their headers.
s = Serve("--model", "echo", "--store", "memory")
try:
    held = []
    for i in range(1000):
        c = socket.create_connection(("127.0.0.1", s.port))
        if i % 2:
            c.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n")  # and never the end of the headers
        held.append(c)
    stop_trickling = threading.Event()

    def trickle():
        n = 0
        while not stop_trickling.wait(0.5):
            for c in held[1::2]:
                try:
                    c.sendall(b"X-%d: y\r\n" % n)
                except OSError:
                    pass
            n += 1

    trickler = threading.Thread(target=trickle)
    trickler.start()
    time.sleep(1)
    pings = [ping_within(s.port) for _ in range(5)]
    check(all(pings), f"/ping within 2 s beside 1,000 idle and trickling connections: {pings}")
    status, _, body = post(s.port, "/invocations", b"[1,2]")
    check(status == 200 and body == b"[1,2]", f"/invocations beside them: {status} {body!r}")
    stop_trickling.set()
    trickler.join()
    for c in held:
        c.close()

    # --- What the front door refuses, in the API's error shape.
    status, _, body = get(s.port, "/%FF")
    check(status == 404 and error_code(body) == "not_found", f"/%FF: {status} {body!r}")
    status, _, body = post(s.port, "/v1/inferences", b"[" * 200 + b"]" * 200)
    check(status == 400 and error_code(body) == "invalid_json", f"deep JSON: {status} {body!r}")
    status, _, body = request(
        s.port, b"POST /invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
        (b"100000\r\n" + b" " * 0x100000 + b"\r\n") * 7 + b"0\r\n\r\n", timeout=5)
    check(status == 413 and error_code(body) == "payload_too_large", f"chunked 7 MiB: {status} {body!r}")
    status, _, body = request(s.port, b"GET /ping HTTP/1.1\r\nHost: x\r\n" +
                              b"".join(b"X-%d: %s\r\n" % (i, b"a" * 100) for i in range(1000)) + b"\r\n")
    check(status == 431 and error_code(body) == "header_too_large", f"1,000 headers: {status} {body!r}")
    status, head, body = request(s.port, b"DELETE /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    check(status == 405 and "Allow: GET, HEAD" in head, f"DELETE /ping: {status} {head!r}")
    start = time.monotonic()
    status, _, body = request(s.port, b"POST /v1/inferences/x/redeliver HTTP/1.1\r\nHost: x\r\n\r\n")
    check(status == 404 and time.monotonic() - start < 1, f"body-less POST: {status} {body!r}")
    for raw in [b"GARBAGE\r\n\r\n", b"GET /a%00 HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /../x HTTP/1.1\r\nHost: x\r\n\r\n"]:
        status, _, body = request(s.port, raw)
        check(status == 400 and error_code(body) == "bad_request", f"{raw!r}: {status} {body!r}")
    status, _, body = request(s.port, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    check(status in (414, 431) and error_code(body) in ("uri_too_long", "header_too_large"),
          f"20 KB request line: {status} {body!r}")
    ranges = b"bytes=0-" + b",0-" * 2700
    status, head, body = request(s.port, b"POST /invocations HTTP/1.1\r\nHost: x\r\nRange: " + ranges +
                                 b"\r\nContent-Length: 5\r\n\r\n[1,2]")
    check(status == 200 and body == b"[1,2]", f"a Range header is not passed on: {status} {body[:80]!r}")
    status, _, body = post(s.port, "/v1/inferences", b'{"id":"a"}', content_type="application/x-www-form-urlencoded")
    check(status == 415, f"form-encoded submission: {status} {body!r}")

    # --- Two serves side by side: private runtime files.
    other = Serve("--model", "echo", "--store", "memory")
    check(ping_within(other.port) and ping_within(s.port), "two serves side by side")
    status, seconds = other.stop()
    check(status == 0, f"second serve's exit status {status}")
    check(ping_within(s.port), "the first serve goes on when the second stops")
finally:
    children = s.children()
    status, seconds = s.stop()
    check(status == 0 and seconds < 30, f"SIGTERM: exit {status} after {seconds:.1f} s")
    left = [p for p in children if os.path.exists(f"/proc/{p}")]
    check(not left, f"processes left after serve stopped: {left}")
    if failures:
        print(s.output())

# --- 100 slow /invocations on 2 workers.
s = Serve("--model", "sleep:4", "--workers", "2", "--store", "memory")
try:
    answers = []
    lock = threading.Lock()

    def invoke():
        result = post(s.port, "/invocations", b"{}", timeout=90)
        with lock:
            answers.append(result[0])

    threads = [threading.Thread(target=invoke) for _ in range(100)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    pings = []
    for _ in range(6):
        pings.append(ping_within(s.port))
        time.sleep(0.5)
    check(all(pings), f"/ping within 2 s while 100 /invocations wait on 2 busy workers: {pings}")
    status, seconds = s.stop()  # in-flight invocations are answered (200 or 503), none hangs
    check(status == 0 and seconds < 30, f"SIGTERM under load: exit {status} after {seconds:.1f} s")
    for t in threads:
        t.join(60)
    check(len(answers) == 100 and answers.count(200) >= 2,
          f"every invocation answered, the first ones 200: {sorted(set(answers))} "
          f"{answers.count(200)} x 200 of {len(answers)}")
finally:
    if s.proc.poll() is None:
        s.stop()
    if failures:
        print(s.output())

if failures:
    sys.exit(1)
print("front door: ok")
