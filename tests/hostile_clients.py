#!/usr/bin/env python3
"""The bare rebound-server binary against the requests that used to kill it or bloat it.

For each store (memory, sqlite): paths with any bytes, JSON nested 100,000 deep (submitted,
then polled; and at /invocations), a chunked body of 300 MiB, 400 MiB of header lines, a POST
without a body, wrong methods, a lower-case Bearer, pipelined requests. The process must answer
each with its 4xx, stay up, and keep its memory bounded.

Usage: hostile_clients.py REBOUND_SERVER
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from rawhttp import error_code, get, post, request  # noqa: E402

server_bin = sys.argv[1]
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message, flush=True)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


def stream(port, head, piece, total, timeout=5.0):
    """Sends `head`, then `piece` until `total` bytes went out or the server stopped reading.
    Returns (bytes of pieces sent, the answer's status, its body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head)
        sent = 0
        try:
            while sent < total:
                s.sendall(piece)
                sent += len(piece)
        except OSError:
            pass  # refused: the server closed its side
        data = b""
        try:
            s.settimeout(timeout)
            while b"}}" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1 ") else 0
    return sent, status, body


def run(store):
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([server_bin, "--model", "echo", "--store", store, "--host", "127.0.0.1",
                             "--port", "0", "--api-key", "s3cret", "--log-level", "warn"],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line = proc.stdout.readline()
        port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)", line).group(1))
        auth = "Authorization: bearer s3cret\r\n"

        def raw(method, path, extra=""):
            return request(port, f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}{extra}\r\n".encode())

        def submit(body):
            return request(port, (f"POST /v1/inferences HTTP/1.1\r\nHost: x\r\n{auth}"
                                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                                  ).encode() + body)

        for path in ["/%FF", "/v1/inferences/%FF", "/%C3%28%00", "/v1/inferences/%ED%A0%80"]:
            status, _, body = raw("GET", path)
            check(status == 404 and error_code(body) == "not_found", f"{store}: GET {path}: {status} {body!r}")
        status, _, body = raw("POST", "/v1/inferences/%FF/redeliver")
        check(status == 404 and error_code(body) == "not_found", f"{store}: redeliver %FF: {status} {body!r}")

        deep = b"[" * 100000 + b"]" * 100000
        status, _, body = submit(b'{"id":"deep","input":' + deep + b"}")
        check(status == 400 and error_code(body) == "invalid_json", f"{store}: deep submission: {status} {body!r}")
        edge = b"[" * 127 + b"]" * 127
        status, _, body = submit(b'{"id":"edge","input":' + edge + b"}")
        check(status == 202, f"{store}: 128 levels in all are accepted: {status} {body!r}")
        deadline = time.time() + 20  # (it runs at once; a sanitizer's build or a busy disk is slow)
        while True:
            status, _, body = raw("GET", "/v1/inferences/edge")
            if (status == 200 and b'"status":"succeeded"' in body) or time.time() > deadline:
                break
            time.sleep(0.05)
        check(status == 200 and b'"status":"succeeded"' in body, f"{store}: poll of the edge job: {status} {body[:200]!r}")
        status, _, body = raw("GET", "/v1/inferences/deep")
        check(status == 404, f"{store}: the deep job was never stored: {status}")
        status, _, body = request(port, (f"POST /invocations HTTP/1.1\r\nHost: x\r\n{auth}"
                                         f"Content-Length: {len(deep)}\r\n\r\n").encode() + deep)
        check(status == 400 and error_code(body) == "invalid_json", f"{store}: deep invocation: {status} {body!r}")

        before = rss_mib(proc.pid)
        sent, status, body = stream(
            port, f"POST /v1/inferences HTTP/1.1\r\nHost: x\r\n{auth}Transfer-Encoding: chunked\r\n\r\n".encode(),
            b"10000\r\n" + b" " * 0x10000 + b"\r\n", 300 << 20)
        check(status == 413 and error_code(body) == "payload_too_large", f"{store}: chunked 300 MiB: {status} {body!r}")
        check(sent < 32 << 20, f"{store}: the server read {sent >> 20} MiB of a refused body")
        sent, status, body = stream(port, b"GET /ping HTTP/1.1\r\nHost: x\r\n",
                                    b"X-Filler: " + b"a" * 1000 + b"\r\n", 400 << 20)
        check(status == 431 and error_code(body) == "header_too_large", f"{store}: endless headers: {status} {body!r}")
        check(sent < 32 << 20, f"{store}: the server read {sent >> 20} MiB of headers")
        grown = rss_mib(proc.pid) - before
        check(grown < 64, f"{store}: resident memory grew by {grown:.0f} MiB")

        start = time.monotonic()
        status, _, body = raw("POST", "/v1/inferences/nobody/redeliver")
        check(status == 404 and time.monotonic() - start < 1, f"{store}: body-less POST: {status} after "
              f"{time.monotonic() - start:.1f} s")
        status, head, body = raw("PUT", "/v1/inferences/edge")
        check(status == 405 and "Allow: GET, HEAD, DELETE" in head, f"{store}: PUT: {status} {head!r}")
        # A cancel of a finished job, and of an id no job can have: answered at once, also with a
        # body announced and never sent.
        start = time.monotonic()
        status, _, body = raw("DELETE", "/v1/inferences/edge", "Content-Length: 1000000\r\n")
        check(time.monotonic() - start < 1, f"{store}: DELETE with a body announced took "
              f"{time.monotonic() - start:.1f} s")
        check(status == 409 and error_code(body) == "already_finished", f"{store}: DELETE: {status} {body!r}")
        status, _, body = raw("DELETE", "/v1/inferences/%00%ff..%2f")
        check(status == 404 and error_code(body) == "not_found", f"{store}: DELETE bad id: {status} {body!r}")
        status, head, body = raw("GET", "/invocations")
        check(status == 405 and "Allow: POST" in head, f"{store}: GET /invocations: {status} {head!r}")
        status, _, body = get(port, "/metrics")
        check(status == 401, f"{store}: no key: {status}")

        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            one = f"GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode()
            s.sendall(one + one + b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            check(data.count(b"HTTP/1.1 200") == 3, f"{store}: pipelined: {data.count(b'HTTP/1.1 ')} answers")

        check(proc.poll() is None, f"{store}: the server exited ({proc.returncode})")
        status, _, _ = get(port, "/ping")
        check(status == 200, f"{store}: /ping at the end: {status}")
    finally:
        proc.terminate()
        proc.wait(30)
        if failures:
            log.seek(0)
            print(log.read().decode(errors="replace")[-3000:])


with tempfile.TemporaryDirectory() as tmp:
    run("memory")
    run(f"sqlite:{tmp}/jobs.db")
if failures:
    sys.exit(1)
print("hostile clients: ok")
