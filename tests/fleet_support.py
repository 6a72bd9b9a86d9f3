"""What the fleet tests (redis_fleet.py, redis_cluster.py, postgres_fleet.py) share: a callback receiver, a
rebound-server process, a load of submissions that records which were answered 202, and the wait
for their callbacks. Standard library only; loopback only; every process started is ended by its
id (`children`)."""
import http.client
import http.server
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque

LEASE_S = 2.0
children = []


def fail(message):
    print("FAIL:", message, flush=True)
    for p in children:
        if p.poll() is None:
            p.kill()
    sys.exit(1)


def free_port():
    """A free loopback port below the kernel's ephemeral range (32768 on), and above the ports of
    the Redis Cluster nodes and their buses (10000-24999): the fleet tests stop Redis and
    PostgreSQL and start them again on the same port, and a port in the ephemeral range can
    meanwhile be taken by any outgoing connection's source port."""
    rng = random.Random(os.getpid() * 1000003 + time.monotonic_ns())
    for _ in range(1000):
        port = rng.randrange(25000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port in 25000-32767")


class Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self):
        self.lock = threading.Lock()
        self.ids = []
        self.statuses = {}  # id -> the statuses of its callbacks, in order
        self.failing = True  # what /fail answers: 500 until a test lets it through
        super().__init__(("127.0.0.1", 0), ReceiverHandler)

    def handle_error(self, request, client_address):
        pass  # connections cut by kill -9: expected here

    def delivered(self):
        with self.lock:
            return set(self.ids)


class ReceiverHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        status = 200
        if self.path == "/fail" and self.server.failing:
            status = 500
        else:
            try:
                doc = json.loads(body)
                job_id = doc["id"]
                with self.server.lock:
                    self.server.ids.append(job_id)
                    self.server.statuses.setdefault(job_id, []).append(doc.get("status"))
            except ValueError:
                status = 400
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class Server:
    """A rebound-server on `store` (a shared store's URI), its port read from its log; `extra`:
    more of its options."""

    def __init__(self, server_bin, name, store, extra=(), model="sleep:0.01"):
        self.name = name
        self.killed = False  # by the test: its exit is expected
        self.proc = subprocess.Popen(
            [server_bin, "serve", "--host", "127.0.0.1", "--port", "0", "--model", model,
             "--workers", "4", "--store", store, "--lease", str(LEASE_S),
             "--server-id", name, "--allow-private-callbacks", "--backoff-base", "0.05",
             "--backoff-cap", "0.5", "--max-tries", "3", "--log-level", "warn", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        children.append(self.proc)
        self.tail = deque(maxlen=40)  # its last lines, printed when a round fails
        for line in self.proc.stdout:
            self.tail.append(line)
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                threading.Thread(target=lambda: [self.tail.append(x) for x in self.proc.stdout],
                                 daemon=True).start()
                return
        fail(f"server {name} did not start")

    def report(self):
        """How it ended (if it did) and its last lines: what a failed round prints of it."""
        code = self.proc.poll()
        state = ("running" if code is None else f"exited with {code}" if code >= 0 else
                 f"ended by {signal.Signals(-code).name}")
        return f"  {self.name}: {state}; its last lines:\n" + "".join(
            "    " + line for line in list(self.tail))

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, None if body is None else json.dumps(body), headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, (json.loads(data) if data else None)

    def kill(self):
        self.killed = True
        self.proc.kill()
        self.proc.wait()

    def taken_over(self):
        """Jobs this server claimed from the store (rebound_jobs_resumed_total)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        m = re.search(r"^rebound_jobs_resumed_total (\d+)", text, re.M)
        return int(m.group(1)) if m else 0

    def stop(self):
        self.killed = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def load(server, callback_url, prefix, accepted, refused, stop):
    n = 0
    conn = None
    while not stop.is_set():
        n += 1
        job_id = f"{prefix}-{n}"
        body = json.dumps({"id": job_id, "callback_url": callback_url, "input": n})
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            conn.request("POST", "/v1/inferences", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            if resp.status == 202:
                accepted.append(job_id)
            else:
                refused.append(resp.status)
                time.sleep(0.01)
        except (OSError, http.client.HTTPException):
            conn = None  # the server is gone: a job without a 202 was never promised
            time.sleep(0.01)


def run_load(servers, callback_url, prefix, seconds, during=None):
    """Loads every server from two threads each; `during` runs after `seconds`, then the load goes
    on for another `seconds`. Returns the ids answered 202 (with those `during` returns, if it
    returns a list) and the statuses of refusals."""
    stop = threading.Event()
    accepted, refused = [], []
    threads = [threading.Thread(target=load, args=(s, callback_url, f"{prefix}-{s.name}-{t}",
                                                   accepted, refused, stop))
               for s in servers for t in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(seconds)
        if during:
            more = during()
            if isinstance(more, list):
                accepted.extend(more)
            time.sleep(seconds)
    finally:  # (a fail() in `during` must not leave the load's threads holding the process open)
        stop.set()
        for t in threads:
            t.join()
    ended = [s for s in servers if not s.killed and s.proc.poll() is not None]
    if ended:
        time.sleep(0.5)  # the reader thread takes its last lines
        for s in ended:
            print(s.report(), end="", flush=True)
        fail(f"{', '.join(s.name for s in ended)} ended on its own during the load")
    return set(accepted), refused


def wait_delivered(receiver, ids, limit_s):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if not ids - receiver.delivered():
            return set()
        time.sleep(0.1)
    return ids - receiver.delivered()


def burst_then_kill(server, callback_url, prefix, jobs=256):
    """Submits `jobs` jobs to `server` in one batch, then kills it (-9) as soon as they are
    answered: it dies holding most of them (queued or running: 256 jobs of 10 ms on 4 workers take
    640 ms), whatever the load's pace had left it, so that the others must take its work over.
    Returns the ids answered 202."""
    batch = [{"id": f"{prefix}-{i}", "callback_url": callback_url, "input": i}
             for i in range(jobs)]
    try:
        status, body = server.request("POST", "/v1/inferences:batch", {"jobs": batch})
    except (OSError, http.client.HTTPException, ValueError) as e:
        status, body = None, e
    server.kill()
    if status != 200:
        fail(f"{server.name}: the batch before the kill was answered {status}: {body}")
    taken = [r["id"] for r in body["results"] if r.get("status") == 202]
    if len(taken) < jobs:
        print(f"{server.name}: {jobs - len(taken)} of the batch before the kill refused: "
              f"{sorted({r.get('status') for r in body['results']} - {202})}", flush=True)
    return taken


def kill_rounds(servers, receiver, results_url, make_server, label, rounds):
    """kill -9 of one server mid-load, `rounds` times (another each time), each replaced by
    `make_server(name)`: every job any server answered 202 must be called back, and the others
    must have taken over some of the killed one's work. `label` starts the jobs' ids."""
    for r in range(rounds):
        victim = r % len(servers)
        before = sum(s.taken_over() for i, s in enumerate(servers) if i != victim)
        accepted, refused = run_load(
            servers, results_url, f"{label}kill{r}", 0.7,
            during=lambda: burst_then_kill(servers[victim], results_url, f"{label}kill{r}-burst"))
        lost = wait_delivered(receiver, accepted, LEASE_S * 5 + 60)
        taken = sum(s.taken_over() for i, s in enumerate(servers) if i != victim) - before
        print(f"{label}round {r + 1}: killed {servers[victim].name}; accepted {len(accepted)}, "
              f"taken over by the others {taken}, lost {len(lost)}", flush=True)
        if not accepted:
            for s in servers:
                print(s.report(), end="")
            fail(f"no job was accepted (refused: {sorted(set(refused))})")
        if taken == 0:
            fail("the killed server held no work the others took over: the round tested nothing")
        if lost:
            for s in servers:
                print(s.report(), end="")
            fail(f"{label}round {r + 1}: lost {len(lost)} accepted jobs, e.g. {sorted(lost)[:5]}")
        servers[victim] = make_server(f"{label}s{victim}-again{r}")


def across_servers(servers, receiver, results_url, failing_url, label):
    """Through three servers of one store: a job one accepts is polled through another and
    resubmitted (202) or contradicted (409) through a third; a callback given up is listed
    through another and redelivered through a third."""
    a, b, c = servers
    job = f"{label}shared-1"
    status, body = a.request("POST", "/v1/inferences",
                             {"id": job, "callback_url": results_url, "input": {"x": 1}})
    if status != 202:
        fail(f"submission: {status} {body}")
    if wait_delivered(receiver, {job}, 20):
        fail(f"{job} was not called back")
    status, body = b.request("GET", f"/v1/inferences/{job}")
    if status != 200 or body["status"] != "succeeded" or body["result"] != "OK":
        fail(f"poll through another server: {status} {body}")
    status, body = c.request("POST", "/v1/inferences",
                             {"id": job, "callback_url": results_url, "input": {"x": 1}})
    if status != 202:
        fail(f"resubmission through a third server: {status} {body}")
    status, body = c.request("POST", "/v1/inferences",
                             {"id": job, "callback_url": results_url, "input": {"x": 2}})
    if status != 409:
        fail(f"another request under a taken id through a third server: {status} {body}")
    dead = f"{label}dead-1"
    receiver.failing = True
    status, body = a.request("POST", "/v1/inferences",
                             {"id": dead, "callback_url": failing_url, "input": 1})
    if status != 202:
        fail(f"submission: {status} {body}")
    deadline = time.time() + 30
    listed = []
    while time.time() < deadline:
        status, body = b.request("GET", "/v1/inferences?callback_state=failed")
        listed = [j["id"] for j in body.get("jobs", [])] if status == 200 else []
        if dead in listed:
            break
        time.sleep(0.1)
    if dead not in listed:
        fail(f"the given-up callback is not listed through another server: {status} {body}")
    receiver.failing = False
    status, body = c.request("POST", f"/v1/inferences/{dead}/redeliver")
    if status != 202:
        fail(f"redelivery through a third server: {status} {body}")
    if wait_delivered(receiver, {dead}, 20):
        fail("the redelivered callback did not arrive")
    print(f"{label}poll, resubmission, conflict, dead letter and redelivery through other "
          "servers: ok", flush=True)
