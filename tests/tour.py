#!/usr/bin/env python3
"""Runs the README's tour (examples/tour/main.cpp) as a user would: it starts, takes a job, runs
the model, answers polls, and stops cleanly on SIGTERM. Usage: tour.py REBOUND_TOUR_BINARY"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from rawhttp import free_port, get, post  # noqa: E402

binary = os.path.abspath(sys.argv[1])
with tempfile.TemporaryDirectory() as workdir:
    # The tour takes its port on the command line: a free port can be taken by another test
    # between free_port() and the tour's bind, so a few ports are tried.
    for attempt in range(5):
        port = free_port()
        proc = subprocess.Popen([binary, str(port)], cwd=workdir, stdout=subprocess.PIPE,
                                text=True)
        line = proc.stdout.readline()
        if line or proc.wait() != 1:
            break
    try:
        assert f"listening on 127.0.0.1:{port}" in line, f"unexpected first line: {line!r}"
        assert get(port, "/ping")[0] == 200, "/ping"
        status, _, body = post(port, "/v1/inferences",
                               json.dumps({"id": "t1", "input": "a good day"}).encode())
        assert status == 202, (status, body)
        deadline, state = time.monotonic() + 10, {}
        while time.monotonic() < deadline and state.get("status") != "succeeded":
            state = json.loads(get(port, "/v1/inferences/t1")[2] or b"{}")
            time.sleep(0.05)
        assert state.get("result") == {"label": "pos"}, state
        status, _, body = post(port, "/v1/inferences", json.dumps({"id": "t2", "input": 7}).encode())
        assert status == 202, (status, body)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and state.get("status") != "failed":
            state = json.loads(get(port, "/v1/inferences/t2")[2] or b"{}")
            time.sleep(0.05)
        assert state.get("error", {}).get("code") == "invalid_input", state
        assert os.path.exists(os.path.join(workdir, "tour.db")), "jobs are kept in tour.db"
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, f"exit {proc.returncode}"
        assert "stopped" in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
# A port already in use: a message and exit status 1, not an abort.
with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    with tempfile.TemporaryDirectory() as workdir:
        out = subprocess.run([binary, str(taken.getsockname()[1])], cwd=workdir,
                             capture_output=True, text=True, timeout=30)
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert out.stderr.startswith("rebound-tour: cannot listen"), out.stderr
print("the tour runs, serves, stops on SIGTERM, and says why it cannot start")
