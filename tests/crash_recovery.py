#!/usr/bin/env python3
"""kill -9 rebound-server in the middle of a load, restart it on the same SQLite store, and check
that every job it answered 202 is called back. Standard library only; loopback only.

    crash_recovery.py REBOUND_SERVER [ROUNDS=3] [LOAD_SECONDS=1.0] [delete-wal]

With `delete-wal`, the store's write-ahead log is deleted halfway through the load, before the
kill: the server must notice it (one log line), rebuild it, and still lose nothing.
"""
import http.client
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

server_bin = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
load_seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
delete_wal = len(sys.argv) > 4 and sys.argv[4] == "delete-wal"


class Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self):
        self.lock = threading.Lock()
        self.ids = []
        super().__init__(("127.0.0.1", 0), ReceiverHandler)

    def handle_error(self, request, client_address):
        pass  # connections that kill -9 cut in the middle of a request: expected here


class ReceiverHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        try:
            job_id = json.loads(body)["id"]
        except ValueError:
            self.send_response(400)  # cut short by the kill: the sender will try again
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with self.server.lock:
            self.server.ids.append(job_id)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def start_server(store, port=0, lines=None):
    """Starts a server and waits (at most 60 s) for its "listening" line. A server that neither
    listens nor exits by then is stuck: its threads' stacks are printed (gdb, when installed), so
    that a rare hang leaves its evidence, and the test fails."""
    proc = subprocess.Popen(
        [server_bin, "serve", "--host", "127.0.0.1", "--port", str(port), "--model", "sleep:0.0005",
         "--workers", "2", "--store", "sqlite:" + store, "--allow-private-callbacks",
         "--backoff-base", "0.05", "--max-tries", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sink = lines if lines is not None else []
    listening = threading.Event()
    found = []

    def read():
        for line in proc.stdout:
            sink.append(line)
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
            if m and not found:
                found.append(int(m.group(1)))
                listening.set()
        listening.set()  # the server ended

    threading.Thread(target=read, daemon=True).start()
    if listening.wait(60) and found:
        return proc, found[0]
    if proc.poll() is None:
        print(f"server {proc.pid} did not listen within 60 s; its threads:", flush=True)
        try:
            print(subprocess.run(["gdb", "-p", str(proc.pid), "-batch", "-ex", "thread apply all bt 20"],
                                 capture_output=True, text=True, timeout=60).stdout, flush=True)
        except (OSError, subprocess.SubprocessError) as e:
            print(f"  (no stacks: {e})", flush=True)
        proc.kill()
    print("server output:", "".join(sink)[-2000:], flush=True)
    raise SystemExit("server did not start")


def load(port, callback_url, prefix, accepted, stop):
    n = 0
    conn = None
    while not stop.is_set():
        n += 1
        job_id = f"{prefix}-{n}"
        body = json.dumps({"id": job_id, "callback_url": callback_url, "input": n})
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("POST", "/v1/inferences", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            if resp.status == 202:
                accepted.append(job_id)
        except (OSError, http.client.HTTPException):
            conn = None  # the server is gone: a job without a 202 was never promised
            time.sleep(0.01)


failures = 0
for r in range(1, rounds + 1):
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    callback_url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/results"
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "jobs.db")
        log_lines = []
        proc, port = start_server(store, lines=log_lines)
        stop = threading.Event()
        accepted_lists = [[] for _ in range(4)]
        threads = [threading.Thread(target=load, args=(port, callback_url, f"r{r}c{c}", accepted_lists[c], stop))
                   for c in range(4)]
        for t in threads:
            t.start()
        if delete_wal:
            # A third in: the rest leaves the queue's health check (every 250 ms, at the latest
            # with its poll every second) time to have logged it before the kill.
            time.sleep(load_seconds / 3)
            os.remove(store + "-wal")
            time.sleep(load_seconds * 2 / 3)
        else:
            time.sleep(load_seconds)
        os.kill(proc.pid, signal.SIGKILL)  # mid-load: no shutdown, no flush
        proc.wait()
        stop.set()
        for t in threads:
            t.join()
        accepted = {i for lst in accepted_lists for i in lst}
        with receiver.lock:
            before_restart = len(set(receiver.ids))

        proc, _ = start_server(store)
        deadline = time.time() + 60
        while time.time() < deadline:
            with receiver.lock:
                missing = accepted - set(receiver.ids)
            if not missing:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        with receiver.lock:
            delivered = set(receiver.ids)
            duplicates = len(receiver.ids) - len(delivered)
        lost = accepted - delivered
        print(f"round {r}: accepted {len(accepted)}, called back before the kill {before_restart}, "
              f"after the restart {len(delivered) - before_restart}, lost {len(lost)}, "
              f"duplicates {duplicates}", flush=True)
        failed = bool(lost or not accepted)
        if failed:
            print("  lost:", sorted(lost)[:10])
        if delete_wal:
            noticed = [line for line in log_lines
                       if '"store_failed"' in line and "write-ahead log" in line]
            print(f"  the deleted log: {len(noticed)} store_failed line(s)")
            if len(noticed) != 1:
                failed = True
                print("  expected one store_failed line about the write-ahead log, got:",
                      [line.strip() for line in log_lines if "store_" in line][:5])
        failures += failed
    receiver.shutdown()

print("crash recovery:", "ok" if failures == 0 else f"{failures} of {rounds} rounds failed")
sys.exit(1 if failures else 0)
