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
from fleet_support import (LEASE_S, Receiver, Server, across_servers, fail,  # noqa: E402
                           kill_rounds, run_load, wait_delivered)
from pg_support import PgBouncer, Postgres, find_bindir  # noqa: E402

server_bin = sys.argv[1]
bindir = sys.argv[2] if len(sys.argv) > 2 else find_bindir()
pgbouncer_bin = sys.argv[3] if len(sys.argv) > 3 else shutil.which("pgbouncer")
# A server holds what its 4 workers run (a shared store's prefetch is 0): jobs of 50 ms keep them
# busy under the load, so that the one killed holds work for the others to take over however
# loaded the machine (with 10 ms jobs a loaded machine could kill it idle: the round then tested
# nothing).
HOLD = dict(extra=(), model="sleep:0.05")


with tempfile.TemporaryDirectory() as folder:
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    results_url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/results"
    failing_url = f"http://127.0.0.1:{receiver.server_address[1]}/fail"
    pg = Postgres(bindir, folder)
    pg.start()
    try:
        store = pg.uri("fleet")
        servers = [Server(server_bin, f"s{i}", store, **HOLD) for i in range(3)]
        kill_rounds(servers, receiver, results_url,
                    lambda name: Server(server_bin, name, store, **HOLD), "", 2)
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
            servers = [Server(server_bin, f"b{i}", store, **HOLD) for i in range(3)]
            kill_rounds(servers, receiver, results_url,
                        lambda name: Server(server_bin, name, store, **HOLD), "pgb-", 1)
            across_servers(servers, receiver, results_url, failing_url, "pgb-")
            for s in servers:
                s.stop()
        finally:
            bouncer.stop()
    finally:
        pg.stop()
    receiver.shutdown()

print("postgres fleet: ok")
