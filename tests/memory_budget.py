#!/usr/bin/env python3
"""One client sends 150 bodies of 2 MB that parse to 17 MB each (an array of 999,000 zeros) to a
server with a slow model: the server stays within its budgets, answers throughout, and is not
killed for memory. Run for the memory store, SQLite and (given a redis-server) Redis.

- With its default budgets, the server's peak resident memory stays under 1.5 GB. Where this
  machine lets a test make a memory cgroup (v1 or v2), the server runs in one limited to
  1.5 GiB, so that going past it is an OOM kill, not a number.
- Past --max-work-mib a submission gets 503 queue_full with Retry-After; /ping answers 200
  within 2 s between the submissions.
- A body whose tree would be far larger than its text (`[[],[],...]`) gets 413 payload_too_large,
  unparsed.
Standard library only; loopback only.

    memory_budget.py REBOUND_SERVER [REDIS_SERVER]
"""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

server_bin = sys.argv[1]
redis_bin = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None
JOBS = 150
LIMIT_BYTES = 1_500_000_000
failures = []


def fail(message):
    print("FAIL:", message)
    failures.append(message)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cgroup:
    """A memory cgroup limited to `limit` bytes, or nothing where this machine does not allow it."""

    def __init__(self, limit):
        self.path = None
        self.procs = None
        name = f"rebound-memory-budget-{os.getpid()}"
        try:
            own = open("/proc/self/cgroup").read().splitlines()
        except OSError:
            return
        for line in own:
            _, controllers, where = line.split(":", 2)
            if controllers == "memory":  # v1
                base = "/sys/fs/cgroup/memory" + where
                limit_file = "memory.limit_in_bytes"
            elif controllers == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):  # v2
                base = "/sys/fs/cgroup" + where
                limit_file = "memory.max"
            else:
                continue
            path = os.path.join(base, name)
            try:
                os.mkdir(path)
                with open(os.path.join(path, limit_file), "w") as f:
                    f.write(str(limit))
                self.path, self.procs = path, os.path.join(path, "cgroup.procs")
                return
            except OSError as e:
                print(f"no memory cgroup at {path}: {e}")
                try:
                    os.rmdir(path)
                except OSError:
                    pass

    def enter(self):
        """In the child, before exec: joins the cgroup."""
        if self.procs:
            with open(self.procs, "w") as f:
                f.write(str(os.getpid()))

    def oom_kills(self):
        if not self.path:
            return 0
        for name in ("memory.oom_control", "memory.events"):
            try:
                text = open(os.path.join(self.path, name)).read()
            except OSError:
                continue
            m = re.search(r"oom_kill (\d+)", text)
            if m:
                return int(m.group(1))
        return 0

    def remove(self):
        if self.path:
            for _ in range(50):
                try:
                    os.rmdir(self.path)
                    return
                except OSError:
                    time.sleep(0.1)


def peak_rss(pid):
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024


def ping(port):
    started = time.time()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request("GET", "/ping")
        status = c.getresponse().status
        c.close()
        return status, time.time() - started
    except (OSError, http.client.HTTPException) as e:
        return repr(e), time.time() - started


def run(store_name, store, cgroup):
    proc = subprocess.Popen(
        [server_bin, "serve", "--host", "127.0.0.1", "--port", "0", "--model", "sleep:60",
         "--workers", "1", "--store", store],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=cgroup.enter)
    port = None
    for line in proc.stdout:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        fail(f"{store_name}: the server did not start")
        return
    body = "[" + ",".join(["0"] * 999000) + "]"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    codes = {}
    slowest_ping = 0.0
    try:
        for i in range(JOBS):
            conn.request("POST", "/v1/inferences", '{"id":"big-%d","input":%s}' % (i, body),
                         {"Content-Type": "application/json"})
            res = conn.getresponse()
            answer = res.read()
            codes[res.status] = codes.get(res.status, 0) + 1
            if res.status == 503:
                error = json.loads(answer)["error"]["code"]
                if error != "queue_full" or not res.getheader("Retry-After"):
                    fail(f"{store_name}: a refusal was {error}, Retry-After "
                         f"{res.getheader('Retry-After')!r}")
            elif res.status != 202:
                fail(f"{store_name}: job {i} got {res.status} {answer[:200]!r}")
            if i % 10 == 0:
                status, took = ping(port)
                slowest_ping = max(slowest_ping, took)
                if status != 200:
                    fail(f"{store_name}: /ping answered {status} after {i} jobs")
        # Amplifying: 450 KB of `[],` would be a 17 MB tree (within the count of values).
        amplifying = '{"id":"amp","input":[' + ",".join(["[]"] * 150000) + "]}"
        conn.request("POST", "/v1/inferences", amplifying, {"Content-Type": "application/json"})
        res = conn.getresponse()
        answer = res.read()
        if res.status != 413 or json.loads(answer)["error"]["code"] != "payload_too_large":
            fail(f"{store_name}: an amplifying body got {res.status} {answer[:200]!r}")
    except (OSError, http.client.HTTPException) as e:
        fail(f"{store_name}: the server stopped answering: {e!r} (exit {proc.poll()})")
    peak = peak_rss(proc.pid) if proc.poll() is None else None
    alive = proc.poll() is None
    proc.kill()
    proc.wait()
    print(f"{store_name}: {codes}, peak resident {peak and peak // 2**20} MiB, slowest /ping "
          f"{slowest_ping:.2f} s, OOM kills {cgroup.oom_kills()}")
    if not alive:
        fail(f"{store_name}: the server died (exit {proc.returncode})")
    if peak is not None and peak >= LIMIT_BYTES:
        fail(f"{store_name}: peak resident memory {peak} bytes, over {LIMIT_BYTES}")
    if codes.get(202, 0) == 0 or codes.get(503, 0) == 0:
        fail(f"{store_name}: expected some jobs accepted and some refused, got {codes}")
    if slowest_ping > 2.0:
        fail(f"{store_name}: /ping took {slowest_ping:.2f} s")


def main():
    cgroup = Cgroup(1536 * 2**20)
    print("memory cgroup:", cgroup.path or "none (peak resident memory is checked instead)")
    redis = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run("memory", "memory", cgroup)
            run("sqlite", "sqlite:" + os.path.join(tmp, "jobs.db"), cgroup)
            if redis_bin:
                redis_port = free_port()
                redis = subprocess.Popen(
                    [redis_bin, "--port", str(redis_port), "--bind", "127.0.0.1", "--dir", tmp,
                     "--save", "", "--appendonly", "no", "--daemonize", "no"],
                    stdout=subprocess.DEVNULL)
                deadline = time.time() + 10
                while time.time() < deadline:
                    try:
                        socket.create_connection(("127.0.0.1", redis_port), timeout=1).close()
                        break
                    except OSError:
                        time.sleep(0.05)
                run("redis", f"redis://127.0.0.1:{redis_port}", cgroup)
    finally:
        if redis:
            redis.kill()
            redis.wait()
        cgroup.remove()
    print("memory budget:", "ok" if not failures else f"{len(failures)} failures")
    sys.exit(1 if failures else 0)


main()
