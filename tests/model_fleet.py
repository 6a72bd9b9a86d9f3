#!/usr/bin/env python3
"""A new model version shipped to a running fleet: two rebound-servers on one real Redis, jobs
streaming into both. Through server A an operator loads version 2 (server B loads it too), sets a
10 % canary (B follows), promotes it through B (A follows) and unloads version 1 through A (B
drains and unloads it too). No job is refused, failed or lost, every callback names the version
that ran it, each server's jobs follow the route it had, a stale If-Match is refused on either
server, and a server started afterwards takes the fleet's models as they stand.

Usage: model_fleet.py <rebound-server> <redis-server> [<iris model dir>]   (about 20 s)
"""
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from testkit import (JobStream, check, children, fail, request, start_redis,  # noqa: E402
                     start_receiver, wait_for, write)

server_bin, redis_bin = sys.argv[1], sys.argv[2]
iris_dir = sys.argv[3] if len(sys.argv) > 3 else None
OPERATOR = {"Authorization": "Bearer op-secret"}
CLIENT = {"Authorization": "Bearer client-secret"}
INPUT = [5.9, 3.0, 5.1, 1.8]
# The servers read the fleet's models twice a second: a bound with room for a busy machine and the
# sanitizers' builds (the time taken is printed at the end).
FOLLOW_S = 15.0


def make_version(repo, name, version):
    target = os.path.join(repo, name, version)
    if iris_dir:
        shutil.copytree(iris_dir, target)
    else:
        write(os.path.join(target, "config.json"), '{"backend": "echo"}')


def start_server(name, repo, redis_port):
    proc = subprocess.Popen(
        [server_bin, "serve", "--host", "127.0.0.1", "--port", "0", "--allow-private-callbacks",
         "--store", f"redis://127.0.0.1:{redis_port}", "--server-id", name, "--lease", "2",
         "--log-level", "info", "--model-repository", repo, "--api-key", "client:client-secret",
         "--operator-key", "ops:op-secret", "--queue-capacity", "20000", "--tenant-share", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children.append(proc)
    log = []
    for line in proc.stdout:
        log.append(line)
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [log.append(x) for x in proc.stdout],
                             daemon=True).start()
            return proc, int(m.group(1)), log
    fail(f"server {name} did not start: {''.join(log)}")


def model_of(port, name="iris"):
    status, body, resp = request(port, "GET", f"/v1/models/{name}", headers=OPERATOR)
    check(status == 200, f"GET /v1/models/{name}: {status} {body}")
    return body, resp


def state_of(port, version):
    body, _ = model_of(port)
    for v in body["versions"]:
        if v["version"] == version:
            return v["state"]
    return None


def on_error(kind, value, tb):
    sys.__excepthook__(kind, value, tb)
    fail(f"{kind.__name__}: {value}")  # ends the servers and Redis too


sys.excepthook = on_error
callbacks, callback_url = start_receiver()

with tempfile.TemporaryDirectory() as tmp:
    repo = os.path.join(tmp, "models")
    make_version(repo, "iris", "1")
    _, redis_port = start_redis(redis_bin, tmp)
    a_proc, a, a_log = start_server("a", repo, redis_port)
    b_proc, b, b_log = start_server("b", repo, redis_port)

    # Jobs stream into both servers, naming no version: each server's route chooses.
    jobs = JobStream(INPUT, callback_url, CLIENT)
    jobs.start(a, "a")
    jobs.start(b, "b")

    def wait_more(n):
        target = jobs.counts()[0] + n
        wait_for(f"{n} more jobs", lambda: jobs.counts()[0] >= target, 60)
        return jobs.counts()[0]

    wait_more(200)
    # Version 2 shipped (the repository is what both servers read) and loaded through A: B loads
    # it too.
    make_version(repo, "iris", "2")
    status, body, _ = request(a, "PUT", "/v1/models/iris/versions/2", headers=OPERATOR)
    check(status == 202, f"PUT version 2 on A: {status} {body}")
    wait_for("version 2 ready on A", lambda: state_of(a, "2") == "ready", 60)
    wait_for("version 2 ready on B", lambda: state_of(b, "2") == "ready", 60)

    # The canary, set on A: B follows, with the same generation.
    model, resp = model_of(a)
    generation = model["generation"]
    status, body, resp = request(a, "PUT", "/v1/models/iris/route",
                                 {"default_version": "1",
                                  "split": [{"version": "2", "percent": 10}]},
                                 {**OPERATOR, "If-Match": f'"{generation}"'})
    check(status == 200 and body["generation"] == generation + 1, f"the canary: {status} {body}")
    set_at = time.time()
    wait_for("B following the canary",
             lambda: model_of(b)[0]["split"] == [{"version": "2", "percent": 10}],
             FOLLOW_S)
    followed_in = time.time() - set_at
    check(model_of(b)[0]["generation"] == generation + 1, f"B's generation: {model_of(b)[0]}")
    # An operator on either server working from the old generation is told.
    for port in (a, b):
        status, body, _ = request(port, "PUT", "/v1/models/iris/route", {"default_version": "2"},
                                  {**OPERATOR, "If-Match": f'"{generation}"'})
        check(status == 412 and body["error"]["code"] == "route_changed",
              f"a stale If-Match on {port}: {status} {body}")
    canary_from = wait_more(0)
    canary_to = wait_more(1500)

    # Promoted through B: A follows. Version 1 unloaded through A: B drains it too.
    status, body, _ = request(b, "PUT", "/v1/models/iris/route", {"default_version": "2"},
                              {**OPERATOR, "If-Match": f'"{generation + 1}"'})
    check(status == 200 and body["default_version"] == "2", f"the promotion on B: {status} {body}")
    wait_for("A following the promotion",
             lambda: model_of(a)[0]["default_version"] == "2" and
             model_of(a)[0]["split"] == [], FOLLOW_S)
    promoted_at = wait_more(0)
    status, body, _ = request(a, "DELETE", "/v1/models/iris/versions/1?queued=finish",
                              headers=OPERATOR)
    check(status == 202, f"the unload on A: {status} {body}")
    wait_for("version 1 unloaded on A", lambda: state_of(a, "1") == "unloaded", 60)
    wait_for("version 1 unloaded on B", lambda: state_of(b, "1") == "unloaded", 60)
    wait_more(500)
    jobs.stop()
    accepted = jobs.accepted
    check(not jobs.refused, f"jobs refused during the swap: {jobs.refused[:3]}")
    total = len(accepted)
    check(total >= 2000, f"only {total} jobs streamed")

    # Every job ran once, on a version its callback names.
    seen = {}
    until = time.time() + 120
    while len(seen) < total and time.time() < until:
        try:
            cb = callbacks.get(timeout=max(0.1, until - time.time()))
        except queue.Empty:
            break
        seen[cb["id"]] = cb
    missing = [i for i in accepted if i not in seen]
    check(not missing, f"{len(missing)} callbacks missing, e.g. {missing[:3]}")
    bad = [cb for cb in seen.values() if cb.get("status") != "succeeded"]
    check(not bad, f"{len(bad)} jobs did not succeed, e.g. {bad[:2]}")
    version = {}
    for i in accepted:
        m = seen[i]["model"]
        check(m["name"] == "iris" and m["version"] in ("1", "2"), f"{seen[i]}")
        version[i] = m["version"]
    by_order = sorted(accepted, key=accepted.get)
    for server in ("a", "b"):
        canary = [version[i] for i in by_order[canary_from:canary_to] if i.startswith(server)]
        share = canary.count("2") / max(1, len(canary))
        check(0.04 <= share <= 0.16,
              f"server {server}'s 10 % canary took {share:.1%} of {len(canary)} jobs")
    late = [version[i] for i in by_order[promoted_at + 100:]]
    check(late and all(v == "2" for v in late), "jobs after the promotion went to version 1")
    for i in by_order[::101]:
        server = a if i.startswith("a") else b
        status, body, _ = request(server, "GET", f"/v1/inferences/{i}", headers=CLIENT)
        check(body["model"]["version"] == version[i], f"{i}: status {body}, callback {seen[i]}")

    # A server started now serves what the fleet serves: version 2, on the fleet's route, although
    # its repository still holds version 1.
    c_proc, c, c_log = start_server("c", repo, redis_port)
    wait_for("C taking the fleet's models",
             lambda: state_of(c, "2") == "ready" and state_of(c, "1") == "unloaded" and
             model_of(c)[0]["default_version"] == "2", 10)
    status, body, _ = request(c, "POST", "/v1/inferences", {"id": "on-c", "input": INPUT}, CLIENT)
    check(status == 202, f"a job on C: {status} {body}")
    status, body, _ = request(c, "GET", "/v1/inferences/on-c", headers=CLIENT)
    check(body["model"]["version"] == "2", f"the job on C: {body}")
    check(state_of(a, "1") == "unloaded", "C's start loaded version 1 again on A")

    followed = [json.loads(x) for x in b_log if '"model_route_set"' in x]
    check(any(x.get("from") == "fleet" for x in followed), f"B logged no route it followed: {followed}")
    # Each stops within its drain (25 s: callbacks in flight, say a retry after a slow receiver)
    # and what an attempt in flight may take beyond it (10 s).
    for proc in (a_proc, b_proc, c_proc):
        proc.terminate()
    for name, proc, plog in (("a", a_proc, a_log), ("b", b_proc, b_log), ("c", c_proc, c_log)):
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            fail(f"server {name} did not stop within 60 s of SIGTERM; its log ends:\n" +
                 "".join(plog[-40:]))
    for proc in children:  # Redis
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
print(f"ok: model_fleet (B followed the canary in {followed_in:.2f} s)")
