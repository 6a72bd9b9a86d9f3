#!/usr/bin/env python3
"""Three rebound-servers on one PostgreSQL: one queue. Checks, with a real PostgreSQL 15:

- kill -9 of one server in the middle of a load loses no job any server answered 202: the others
  take its work when its lease runs out (two rounds, a different server each time);
- any server answers poll, idempotent resubmission (202 again, 409 for another request), the
  dead-letter listing and redelivery, for a job another server accepted;
- PostgreSQL crashed mid-load (pg_ctl stop -m immediate) and started again: submissions get 503
  while it is away, /ping says 503 store_unavailable within 2 s, every job answered 202 is called
  back, and /ping is 200 again;
- the same fleet through PgBouncer in transaction mode (another schema): a kill -9 round and the
  checks through other servers, nothing lost.

Standard library only; loopback only; every process it starts is ended by its id.

    postgres_fleet.py REBOUND_SERVER [PG_BINDIR] [PGBOUNCER]
"""
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet_support import (LEASE_S, Receiver, Server, fail, run_load,  # noqa: E402
                           wait_delivered)
from pg_support import PgBouncer, Postgres, find_bindir  # noqa: E402

server_bin = sys.argv[1]
bindir = sys.argv[2] if len(sys.argv) > 2 else find_bindir()
pgbouncer_bin = sys.argv[3] if len(sys.argv) > 3 else shutil.which("pgbouncer")


def kill_rounds(servers, receiver, results_url, store, label, rounds):
    for r in range(rounds):
        victim = r % len(servers)
        before = sum(s.taken_over() for i, s in enumerate(servers) if i != victim)
        accepted, refused = run_load(servers, results_url, f"{label}kill{r}", 0.7,
                                     during=lambda: servers[victim].kill())
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
        servers[victim] = Server(server_bin, f"{label}s{victim}-again{r}", store)


def across_servers(servers, receiver, results_url, failing_url, label):
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


with tempfile.TemporaryDirectory() as folder:
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    results_url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/results"
    failing_url = f"http://127.0.0.1:{receiver.server_address[1]}/fail"
    pg = Postgres(bindir, folder)
    pg.start()
    try:
        store = pg.uri("fleet")
        servers = [Server(server_bin, f"s{i}", store) for i in range(3)]
        kill_rounds(servers, receiver, results_url, store, "", 2)
        across_servers(servers, receiver, results_url, failing_url, "")

        # PostgreSQL crashed mid-load and started again.
        ping_while_away = []

        def restart_postgres():
            pg.stop("immediate")
            started = time.time()
            while time.time() - started < 5:
                status, body = servers[0].request("GET", "/ping")
                if status == 503:
                    ping_while_away.append((body["error"]["code"], time.time() - started))
                    break
                time.sleep(0.05)
            pg.start()

        accepted, refused = run_load(servers, results_url, "pg", 0.7, during=restart_postgres)
        lost = wait_delivered(receiver, accepted, LEASE_S * 5 + 40)
        print(f"postgres restarted: accepted {len(accepted)}, refused {len(refused)} "
              f"({sorted(set(refused))}), lost {len(lost)}; /ping while away: {ping_while_away}",
              flush=True)
        if lost:
            for s in servers:
                print(s.report(), end="")
            fail(f"lost {len(lost)} accepted jobs across the restart, e.g. {sorted(lost)[:5]}")
        if set(refused) - {503}:
            fail(f"refusals other than 503 while PostgreSQL was away: {sorted(set(refused))}")
        if len(ping_while_away) != 1 or ping_while_away[0][0] != "store_unavailable" or \
                ping_while_away[0][1] > 2:
            fail(f"/ping did not say 503 store_unavailable within 2 s: {ping_while_away}")
        deadline = time.time() + 10
        while time.time() < deadline and servers[0].request("GET", "/ping")[0] != 200:
            time.sleep(0.05)
        if servers[0].request("GET", "/ping")[0] != 200:
            fail("/ping did not recover after PostgreSQL came back")
        print("/ping: 503 store_unavailable while PostgreSQL was away, 200 after", flush=True)
        for s in servers:
            s.stop()

        # Through PgBouncer in transaction mode.
        if not pgbouncer_bin:
            fail("pgbouncer not found (scripts/install-deps.sh installs it)")
        bouncer = PgBouncer(pgbouncer_bin, pg, folder)
        try:
            mode = bouncer.pool_mode()
            if mode != "transaction":
                fail(f"pgbouncer's pool mode: {mode}")
            store = bouncer.uri("bounced")
            servers = [Server(server_bin, f"b{i}", store) for i in range(3)]
            kill_rounds(servers, receiver, results_url, store, "pgb-", 1)
            across_servers(servers, receiver, results_url, failing_url, "pgb-")
            for s in servers:
                s.stop()
        finally:
            bouncer.stop()
    finally:
        pg.stop()
    receiver.shutdown()

print("postgres fleet: ok")
