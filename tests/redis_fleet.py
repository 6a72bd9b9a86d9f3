#!/usr/bin/env python3
"""Three rebound-servers on one Redis: one queue. Checks, with a real redis-server:

- kill -9 of one server in the middle of a load loses no job any server answered 202: the others
  take its work when its lease runs out (repeated ROUNDS times, a different server each time);
- any server answers poll, idempotent resubmission (202 again, 409 for another request), the
  dead-letter listing and redelivery, for a job another server accepted;
- any server cancels a job another server holds in its queue: it ends cancelled everywhere, is
  never run, and its callback says "cancelled", once; a job of priority 0 overtakes a backlog of
  priority 9 submitted before it to the same server;
- Redis killed mid-load (appendonly yes, appendfsync always) and started again: submissions get
  503 while it is away, and no job answered 202 is lost.

Standard library only; loopback only; every process it starts is ended by its id.

    redis_fleet.py REBOUND_SERVER REDIS_SERVER [ROUNDS=3]
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet_support import (LEASE_S, Receiver, Server as FleetServer, across_servers,  # noqa: E402
                           children, fail, free_port, kill_rounds, run_load, wait_delivered)

server_bin, redis_bin = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3


def Server(name, redis_port):
    return FleetServer(server_bin, name, f"redis://127.0.0.1:{redis_port}")


class Redis:
    def __init__(self, folder):
        self.port = free_port()
        self.folder = folder
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [redis_bin, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.folder,
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
             "--logfile", os.path.join(self.folder, "redis.log")])
        children.append(self.proc)
        # (Generous: its append-only file is synced at start, which a busy machine can slow.)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                # (Only ours counts: another test's server may have taken the port.)
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\nINFO server\r\n")
                    answer = s.recv(8192)
                    # (read on until the process id's line has come whole)
                    while (answer.startswith(b"+PONG") and
                           not re.search(rb"process_id:\d+\r", answer)):
                        chunk = s.recv(8192)
                        if not chunk:
                            break
                        answer += chunk
                    if f"process_id:{self.proc.pid}\r".encode() in answer:
                        return
            except OSError:
                pass
            time.sleep(0.02)
        with open(os.path.join(self.folder, "redis.log"), errors="replace") as log:
            fail("redis-server did not start; its log ends:\n" + log.read()[-2000:])

    def kill(self):
        self.proc.kill()
        self.proc.wait()



with tempfile.TemporaryDirectory() as folder:
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    results_url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/results"
    failing_url = f"http://127.0.0.1:{receiver.server_address[1]}/fail"
    redis = Redis(folder)
    redis.start()
    servers = [Server(f"s{i}", redis.port) for i in range(3)]

    # 1. kill -9 of one server mid-load, ROUNDS times.
    kill_rounds(servers, receiver, results_url, lambda name: Server(name, redis.port), "", rounds)

    # 2. Any server answers for a job another accepted.
    across_servers(servers, receiver, results_url, failing_url, "")
    a, b, c = servers

    # Cancel through another server, and priority: a backlog of priority 9 on server a (4 workers,
    # 10 ms a job: over a second of work), then an urgent job, then a victim at the very end.
    # The backlog goes in one batch, so that its second of work is ahead of the victim however
    # slowly single submissions are taken (under ThreadSanitizer 600 of them took longer than
    # the backlog's work).
    backlog = [f"backlog-{i}" for i in range(600)]
    status, body = a.request("POST", "/v1/inferences:batch",
                             {"jobs": [{"id": job_id, "callback_url": results_url, "priority": 9}
                                       for job_id in backlog]})
    if status != 200 or body.get("accepted") != len(backlog):
        fail(f"backlog submission: {status} {body}")
    status, body = a.request("POST", "/v1/inferences",
                             {"id": "urgent-1", "callback_url": results_url, "priority": 0})
    if status != 202:
        fail(f"urgent submission: {status} {body}")
    status, body = a.request("POST", "/v1/inferences",
                             {"id": "victim-1", "callback_url": results_url, "priority": 9})
    if status != 202:
        fail(f"victim submission: {status} {body}")
    status, body = b.request("GET", "/v1/inferences/victim-1")
    if status != 200 or body["status"] != "queued" or body.get("queue_position", 0) < 1:
        fail(f"the victim's position through another server: {status} {body}")
    status, body = b.request("DELETE", "/v1/inferences/victim-1")
    if status != 200 or body["status"] != "cancelled":
        fail(f"cancel through another server: {status} {body}")
    status, body = c.request("DELETE", "/v1/inferences/victim-1")
    if status != 409 or body["error"]["code"] != "already_finished":
        fail(f"a second cancel through a third server: {status} {body}")
    if wait_delivered(receiver, set(backlog) | {"urgent-1", "victim-1"}, 60):
        fail("the backlog, the urgent job or the victim was not called back")
    time.sleep(LEASE_S)  # anything that would still come (a run of the victim) comes by now
    with receiver.lock:
        victim_statuses = receiver.statuses.get("victim-1")
        order = list(receiver.ids)
    if victim_statuses != ["cancelled"]:
        fail(f"the cancelled job's callbacks: {victim_statuses}")
    status, body = c.request("GET", "/v1/inferences/victim-1")
    if status != 200 or body["status"] != "cancelled" or body["callback"]["state"] != "delivered":
        fail(f"the cancelled job through a third server: {status} {body}")
    if order.index("urgent-1") > order.index(backlog[-1]):
        fail("the urgent job did not overtake the backlog")
    print("cancel through another server, and priority over a backlog: ok")

    # 3. Redis killed mid-load and started again.
    ping_while_away = []

    def restart_redis():
        redis.kill()
        # /ping says so within a few seconds (a load balancer stops sending work)
        deadline = time.time() + 5
        while time.time() < deadline:
            status, body = servers[0].request("GET", "/ping")
            if status == 503:
                ping_while_away.append(body["error"]["code"])
                break
            time.sleep(0.05)
        redis.start()

    accepted, refused = run_load(servers, results_url, "redis", 0.7, during=restart_redis)
    lost = wait_delivered(receiver, accepted, LEASE_S * 5 + 40)
    print(f"redis restarted: accepted {len(accepted)}, refused {len(refused)} "
          f"({sorted(set(refused))}), lost {len(lost)}")
    if lost:
        for s in servers:
            print(s.report(), end="")
        fail(f"lost {len(lost)} accepted jobs across the Redis restart, e.g. {sorted(lost)[:5]}")
    if set(refused) - {503}:
        fail(f"refusals other than 503 while Redis was away: {sorted(set(refused))}")
    if ping_while_away != ["store_unavailable"]:
        fail(f"/ping while Redis was away: {ping_while_away}")
    deadline = time.time() + 10
    while time.time() < deadline and servers[0].request("GET", "/ping")[0] != 200:
        time.sleep(0.05)
    if servers[0].request("GET", "/ping")[0] != 200:
        fail("/ping did not recover after Redis came back")
    print("/ping: 503 store_unavailable while Redis was away, 200 after")

    for s in servers:
        s.stop()
    redis.kill()
    receiver.shutdown()

print("redis fleet: ok")
