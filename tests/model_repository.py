#!/usr/bin/env python3
"""rebound-server --model-repository: several models served at once from DIR/<name>/<version>/,
each job on the version chosen when it was accepted, and every answer saying which.

Usage: model_repository.py <rebound-server>   (about 10 s)
"""
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from testkit import check, children, fail, request, start_receiver, write  # noqa: E402

server_bin = sys.argv[1]


def start(*args):
    """A server on a free port with `args`; (process, port), or (process, None) with its output
    when it exited instead of listening."""
    proc = subprocess.Popen(
        [server_bin, "serve", "--host", "127.0.0.1", "--port", "0", "--allow-private-callbacks",
         "--store", "memory", "--log-level", "warn", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children.append(proc)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, int(m.group(1)), "".join(seen)
    proc.wait(timeout=30)
    return proc, None, "".join(seen)


callbacks, callback_url = start_receiver()

with tempfile.TemporaryDirectory() as tmp:
    repo = os.path.join(tmp, "models")
    write(f"{repo}/echo/1/config.json", '{"backend": "echo"}')
    write(f"{repo}/slow/1/config.json", '{"backend": "echo"}')
    write(f"{repo}/slow/2/config.json", '{"backend": "sleep", "seconds": 0}')

    # Several models and no default: the server will not guess.
    proc, port, out = start("--model-repository", repo)
    check(port is None and proc.returncode != 0, "several models without --default-model started")
    check("--default-model" in out, f"the refusal does not say what to give: {out}")
    # --model and --model-repository are one or the other.
    proc, port, out = start("--model-repository", repo, "--model", "echo")
    check(port is None and proc.returncode != 0, "--model with --model-repository started")

    proc, port, out = start("--model-repository", repo, "--default-model", "echo")
    check(port is not None, f"the server did not start: {out}")
    check("models echo/1, slow/1, slow/2" in out, f"the start line does not list the models: {out}")

    # A job for each model, and one for the default; each answered by its own version.
    status, body, _ = request(port, "POST", "/v1/inferences",
                              {"id": "s", "input": {"x": 1}, "model": "slow",
                               "callback_url": callback_url})
    check(status == 202, f"slow job: {status} {body}")
    status, body, _ = request(port, "POST", "/v1/inferences",
                              {"id": "e", "input": {"x": 2}, "callback_url": callback_url})
    check(status == 202, f"default job: {status} {body}")
    got = {}
    for _ in range(2):
        try:
            cb = callbacks.get(timeout=20)
        except queue.Empty:
            fail(f"callbacks missing; got {got}")
        got[cb["id"]] = cb
    check(got["s"]["model"] == {"name": "slow", "version": "2"} and got["s"]["result"] == "OK",
          f"the slow job's callback: {got['s']}")
    check(got["e"]["model"] == {"name": "echo", "version": "1"} and got["e"]["result"] == {"x": 2},
          f"the default job's callback: {got['e']}")
    status, body, _ = request(port, "GET", "/v1/inferences/s")
    check(status == 200 and body["model"] == {"name": "slow", "version": "2"}, f"status: {body}")

    # A job may pin an older version: it runs there (slow/1 echoes), and says so.
    status, body, _ = request(port, "POST", "/v1/inferences",
                              {"id": "pinned", "model": "slow", "version": 1, "input": [7],
                               "callback_url": callback_url})
    check(status == 202, f"a pinned job: {status} {body}")
    try:
        cb = callbacks.get(timeout=20)
    except queue.Empty:
        fail("the pinned job's callback is missing")
    check(cb["id"] == "pinned" and cb["model"] == {"name": "slow", "version": "1"} and
          cb["result"] == [7], f"the pinned job's callback: {cb}")
    # What it does not serve is refused before anything is stored.
    status, body, _ = request(port, "POST", "/v1/inferences",
                              {"id": "old", "model": "slow", "version": "3"})
    check(status == 409 and body["error"]["code"] == "version_unavailable",
          f"a version not there: {status} {body}")
    check("ready: '1', '2'" in body["error"]["message"],
          f"the refusal does not say what is served: {body}")
    status, body, _ = request(port, "POST", "/v1/inferences", {"id": "x", "model": "resnet"})
    check(status == 404 and body["error"]["code"] == "model_not_found", f"{status} {body}")
    status, body, _ = request(port, "GET", "/v1/inferences/old")
    check(status == 404, "a refused job was stored")

    # The listing: every model, the version it loaded, with its digest.
    status, body, _ = request(port, "GET", "/v1/models")
    check(status == 200, f"/v1/models: {status}")
    by_name = {m["name"]: m for m in body["models"]}
    check(sorted(by_name) == ["echo", "slow"], f"models listed: {sorted(by_name)}")
    slow = by_name["slow"]
    check(slow["default_version"] == "2" and
          [v["version"] for v in slow["versions"]] == ["1", "2"], f"slow: {slow}")
    check(all(v["state"] == "ready" for v in slow["versions"]), f"slow's states: {slow}")
    check(all(v["digest"].startswith("sha256:") for v in slow["versions"]), f"digests: {slow}")
    check(slow["versions"][1]["digest"] != slow["versions"][0]["digest"],
          "two versions with different files have one digest")
    check(slow["versions"][0]["digest"] == by_name["echo"]["versions"][0]["digest"],
          "two versions with the same files have different digests")
    # With several versions, each version's own jobs in this server (none left now).
    check(all(v["queued"] == 0 and v["running"] == 0 for v in slow["versions"]),
          f"per-version counts: {slow}")
    status, body, _ = request(port, "GET", "/v1/models/slow")
    check(status == 200 and body == slow, f"/v1/models/slow: {status} {body}")

    # /invocations: X-Amzn-SageMaker-Target-Model picks the model, Rebound-Model says who answered.
    status, body, resp = request(port, "POST", "/invocations", {"y": 1},
                                 {"X-Amzn-SageMaker-Target-Model": "slow"})
    check(status == 200 and body == "OK" and resp.getheader("Rebound-Model") == "slow/2",
          f"invocation of slow: {status} {body} {resp.getheader('Rebound-Model')}")
    status, body, resp = request(port, "POST", "/invocations", {"y": 2})
    check(status == 200 and body == {"y": 2} and resp.getheader("Rebound-Model") == "echo/1",
          f"invocation of the default: {status} {body} {resp.getheader('Rebound-Model')}")
    status, body, resp = request(port, "POST", "/invocations", {"y": 3},
                                 {"X-Amzn-SageMaker-Target-Model": "resnet"})
    check(status == 404 and body["error"]["code"] == "model_not_found", f"{status} {body}")
    proc.terminate()
    proc.wait(timeout=30)

    # Nothing outside the repository is read: a version that links out stops the start.
    elsewhere = os.path.join(tmp, "elsewhere")
    write(f"{elsewhere}/config.json", '{"backend": "echo"}')
    linked = os.path.join(tmp, "linked")
    os.makedirs(f"{linked}/iris")
    os.symlink(elsewhere, f"{linked}/iris/1")
    proc, port, out = start("--model-repository", linked)
    check(port is None and proc.returncode != 0 and "leads outside the repository" in out,
          f"a version linking out of the repository: {out}")
    # A directory that is no model name.
    bad = os.path.join(tmp, "bad")
    write(f"{bad}/Iris/1/config.json", '{"backend": "echo"}')
    proc, port, out = start("--model-repository", bad)
    check(port is None and proc.returncode != 0 and "'Iris' is not a model name" in out,
          f"a directory that is no model name: {out}")

print("model_repository: ok")
