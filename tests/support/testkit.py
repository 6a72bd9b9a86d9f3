"""What the Python tests of rebound-server share: failing with a message (and killing the servers
they started), checks, files written into a temporary tree, requests, a callback receiver, a
Redis of the test's own, and a stream of jobs."""
import http.client
import http.server
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time

children = []  # the processes a test started: killed when it fails


def fail(message):
    print("FAIL:", message, flush=True)
    for child in children:
        if child.poll() is None:
            child.kill()
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def request(port, method, path, body=None, headers=None, raw=None, timeout=30):
    """One request to 127.0.0.1:port: `body` sent as JSON (or `raw` as it is). Returns (status,
    the answer parsed as JSON, or its bytes when it is not JSON, or None when empty; response)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = dict(headers or {})
    data = raw if raw is not None else (None if body is None else json.dumps(body))
    if data is not None:
        h.setdefault("Content-Type", "application/json")
    conn.request(method, path, data, h)
    resp = conn.getresponse()
    out = resp.read()
    conn.close()
    try:
        parsed = json.loads(out) if out else None
    except ValueError:
        parsed = out
    return resp.status, parsed, resp


def start_receiver():
    """A callback receiver on loopback that answers 200 and keeps each body: (queue of the parsed
    bodies, its URL)."""
    bodies = queue.Queue()

    class Receiver(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            bodies.put(json.loads(body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return bodies, f"http://127.0.0.1:{server.server_address[1]}/hook"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, predicate, within):
    """Polls `predicate` until it holds; fails with `what` after `within` seconds."""
    until = time.time() + within
    while time.time() < until:
        if predicate():
            return
        time.sleep(0.05)
    fail(f"{what}: not within {within} s")


def start_redis(redis_bin, folder):
    """A redis-server of the test's own on a free loopback port, persisting nothing, its log in
    `folder`; killed when the test fails. Returns (process, port) once it answers PING."""
    port = free_port()
    proc = subprocess.Popen(
        [redis_bin, "--port", str(port), "--bind", "127.0.0.1", "--dir", folder, "--save", "",
         "--appendonly", "no", "--daemonize", "no", "--logfile", os.path.join(folder, "redis.log")])
    children.append(proc)
    until = time.time() + 10
    while time.time() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            pass
        time.sleep(0.02)
    fail("redis-server did not start")


class JobStream:
    """Jobs submitted one after another (POST /v1/inferences, one keep-alive connection a server)
    to each server started on, until stop(): `accepted` maps each id accepted to its place in the
    order accepted over every server, `refused` lists (id, status, body); read both under `lock`."""

    def __init__(self, job_input, callback_url, headers, limit=20000):
        self.accepted = {}
        self.refused = []
        self.lock = threading.Lock()
        self._input, self._callback_url, self._headers = job_input, callback_url, headers
        self._limit = limit
        self._stop = threading.Event()
        self._threads = []

    def start(self, port, prefix):
        """Streams to 127.0.0.1:port, ids `<prefix>-0`, `<prefix>-1`, ..."""
        t = threading.Thread(target=self._run, args=(port, prefix), daemon=True)
        t.start()
        self._threads.append(t)

    def counts(self):
        """(accepted, refused) so far."""
        with self.lock:
            return len(self.accepted), len(self.refused)

    def stop(self):
        """Ends every stream after its request in flight; fails when one does not end."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)
            check(not t.is_alive(), "a stream of jobs never ended")

    def _run(self, port, prefix):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        i = 0
        while not self._stop.is_set() and i < self._limit:
            job_id = f"{prefix}-{i}"
            i += 1
            conn.request("POST", "/v1/inferences",
                         json.dumps({"id": job_id, "input": self._input,
                                     "callback_url": self._callback_url}),
                         {**self._headers, "Content-Type": "application/json"})
            resp = conn.getresponse()
            body = json.loads(resp.read())
            with self.lock:
                if resp.status == 202:
                    self.accepted[job_id] = len(self.accepted)
                else:
                    self.refused.append((job_id, resp.status, body))
        conn.close()
