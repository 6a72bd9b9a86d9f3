#!/usr/bin/env python3
"""One client's bad receivers must not touch another client.

For each store (memory, sqlite, and redis when a redis-server is given): client A submits 12,000
jobs whose callback goes to a receiver that answers 503 to everything and 12,000 to one that
accepts connections and never answers, through a server whose --queue-capacity is 2,000. Their
circuits open; their callbacks must wait in the store, not in capacity slots. Then client B
submits 300 jobs to a healthy receiver: every one must be accepted at once (no 503) and called
back within seconds, while the server's memory stays bounded.

Usage: noisy_neighbours.py REBOUND_SERVER [REDIS_SERVER]
"""
import http.client
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

server_bin = sys.argv[1]
redis_bin = sys.argv[2] if len(sys.argv) > 2 else None
failures = []
children = []

JOBS_PER_BAD_RECEIVER = 12000
GOOD_JOBS = 300
CAPACITY = 2000


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message, flush=True)
    return condition


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


class Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, status):
        self.status = status
        self.lock = threading.Lock()
        self.count = 0
        self.ids = set()
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.server.lock:
            self.server.count += 1
            if self.server.status == 200:
                self.server.ids.add(json.loads(body)["id"])
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class Hung:
    """Accepts connections and never answers; holds every socket until closed."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.held = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def url(self):
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def close(self):
        self.sock.close()
        for c in self.held:
            c.close()


def start_redis(folder):
    port = free_port()
    proc = subprocess.Popen([redis_bin, "--port", str(port), "--bind", "127.0.0.1", "--dir", folder,
                             "--save", "", "--appendonly", "no", "--daemonize", "no",
                             "--logfile", os.path.join(folder, "redis.log")])
    children.append(proc)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


class Client:
    """One keep-alive connection."""

    def __init__(self, port):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method, path, body=None):
        for attempt in range(2):
            try:
                data = json.dumps(body) if body is not None else None
                self.conn.request(method, path, body=data,
                                  headers={"Content-Type": "application/json"} if data else {})
                res = self.conn.getresponse()
                return res.status, res.read()
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt:
                    raise
        return 0, b""


def flood(port, prefix, url, count, deadline, refused):
    """Submits `count` jobs, retrying a 503 until `deadline`; returns how many were accepted."""
    client = Client(port)
    accepted = 0
    for i in range(count):
        while True:
            status, _ = client.call("POST", "/v1/inferences",
                                    {"id": f"{prefix}-{i}", "callback_url": url, "input": i})
            if status == 202:
                accepted += 1
                break
            refused[0] += 1
            if time.time() > deadline:
                return accepted
            time.sleep(0.05)
    return accepted


def run(store, label):
    print(f"== {label}", flush=True)
    failing = Receiver(503)
    good = Receiver(200)
    hung = Hung()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [server_bin, "--model", "echo", "--store", store, "--host", "127.0.0.1", "--port", "0",
         "--workers", "2", "--queue-capacity", str(CAPACITY), "--callback-timeout", "2",
         "--allow-private-callbacks", "--log-level", "warn"],
        stdout=subprocess.PIPE, stderr=log, text=True)
    children.append(proc)
    try:
        line = proc.stdout.readline()
        port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)", line).group(1))

        # Client A: 12,000 callbacks to each bad receiver, from four connections.
        deadline = time.time() + 90
        refused = [0]
        results = []
        threads = []
        for n, url in enumerate([failing.url(), hung.url(), failing.url(), hung.url()]):
            t = threading.Thread(target=lambda n=n, url=url: results.append(
                flood(port, f"a{n}", url, JOBS_PER_BAD_RECEIVER // 2, deadline, refused)))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        check(sum(results) == 2 * JOBS_PER_BAD_RECEIVER,
              f"{label}: client A got {sum(results)} of {2 * JOBS_PER_BAD_RECEIVER} accepted "
              f"({refused[0]} refusals)")
        print(f"{label}: client A accepted {sum(results)} ({refused[0]} transient refusals)",
              flush=True)

        # Client B: 300 jobs to a healthy receiver, each accepted at once, each called back soon.
        client = Client(port)
        start = time.time()
        statuses = []
        for i in range(GOOD_JOBS):
            status, body = client.call("POST", "/v1/inferences",
                                       {"id": f"b-{i}", "callback_url": good.url(), "input": i})
            statuses.append(status)
        check(statuses.count(202) == GOOD_JOBS,
              f"{label}: client B was refused: {sorted(set(statuses))}")
        while time.time() - start < 15 and len(good.ids) < GOOD_JOBS:
            time.sleep(0.05)
        took = time.time() - start
        check(len(good.ids) == GOOD_JOBS,
              f"{label}: client B's receiver got {len(good.ids)} of {GOOD_JOBS} in {took:.1f} s")
        print(f"{label}: client B: {len(good.ids)} callbacks in {took:.2f} s", flush=True)

        # The bad receivers' callbacks wait in the store: no capacity held, memory bounded.
        status, body = client.call("GET", "/v1/callback-endpoints")
        endpoints = {e["origin"]: e for e in json.loads(body)["endpoints"]}
        failing_origin = failing.url()[:-len("/hook")]
        hung_origin = hung.url()[:-len("/hook")]
        for origin in (failing_origin, hung_origin):
            e = endpoints.get(origin)
            if check(e is not None, f"{label}: {origin} not listed: {endpoints}"):
                check(e["state"] in ("open", "half_open"), f"{label}: {origin} is {e['state']}")
                check(e["deferred"] > 1000, f"{label}: {origin} deferred only {e['deferred']}")
                check(e["in_flight"] <= 64 and e["waiting"] <= 64, f"{label}: {origin}: {e}")
        check(failing.count < 200, f"{label}: the 503 receiver got {failing.count} requests")
        status, body = client.call("GET", "/metrics")
        in_flight = int(re.search(rb"\nrebound_jobs_in_flight (\d+)", body).group(1))
        check(in_flight < CAPACITY // 4, f"{label}: {in_flight} slots held")
        rss = rss_mib(proc.pid)
        check(rss < 400, f"{label}: the server holds {rss:.0f} MiB")
        print(f"{label}: endpoints {json.dumps(list(endpoints.values()))}; slots held {in_flight}; "
              f"RSS {rss:.0f} MiB", flush=True)
        status, _ = client.call("GET", "/ping")
        check(status == 200, f"{label}: /ping {status}")
    finally:
        proc.kill()
        proc.wait()
        failing.shutdown()
        good.shutdown()
        hung.close()
        log.seek(0)
        tail = log.read()[-2000:].decode(errors="replace")
        if failures:
            print(tail)


try:
    run("memory", "memory")
    with tempfile.TemporaryDirectory() as tmp:
        run(f"sqlite:{tmp}/jobs.db", "sqlite")
    if redis_bin:
        with tempfile.TemporaryDirectory() as tmp:
            redis, redis_port = start_redis(tmp)
            run(f"redis://127.0.0.1:{redis_port}", "redis")
            redis.kill()
            redis.wait()
finally:
    for c in children:
        if c.poll() is None:
            c.kill()
            c.wait()

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("noisy neighbours changed nothing for the healthy client")
