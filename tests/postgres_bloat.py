#!/usr/bin/env python3
"""A long transaction elsewhere on the database does not make the queue's table grow without end.

A session holds a snapshot open (REPEATABLE READ) for SNAPSHOT_S seconds (default 60) while a
rebound-server on the same PostgreSQL takes a steady load with callbacks: vacuum can remove no
row version the snapshot might see, so the table grows meanwhile. Checked:

- the queue keeps working while the snapshot is open, and every job answered 202 is called back
  once it ends (the backlog drains);
- after it ends, vacuum (autovacuum, as shipped but for a short naptime) and the store's pruning
  (finished jobs deleted past --retention in small batches) bring the table's rows back to what
  the retention keeps, and a second load a third as long leaves the table no larger: the space is
  reused, not added to (without vacuum it would grow by a third of what the first load added).

Standard library only; loopback only; every process it starts is ended by its id.

    postgres_bloat.py REBOUND_SERVER [PG_BINDIR] [SNAPSHOT_S]
"""
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet_support import Receiver, Server, fail, run_load, wait_delivered  # noqa: E402
from pg_support import Postgres, find_bindir  # noqa: E402

server_bin = sys.argv[1]
bindir = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else find_bindir()
snapshot_s = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
RETENTION_S = 2

with tempfile.TemporaryDirectory() as folder:
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    results_url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/results"
    pg = Postgres(bindir, folder, ["autovacuum_naptime=1s"])
    pg.start()
    try:
        store = pg.uri("bloat")
        server = Server(server_bin, "b", store, ["--retention", str(RETENTION_S)])

        def table():
            rows, dead, size = pg.psql(
                "SELECT n_live_tup, n_dead_tup, pg_relation_size(relid) FROM pg_stat_user_tables "
                "WHERE schemaname = 'bloat' AND relname = 'jobs'").split("|")
            return int(rows), int(dead), int(size)

        def settle(limit_s):
            """Waits until pruning and vacuum have had their way: the rows are what the
            retention keeps and few dead ones are left. Answers the table's numbers."""
            deadline = time.time() + limit_s
            numbers = table()
            while time.time() < deadline:
                pg.psql("SELECT pg_stat_clear_snapshot()")
                numbers = table()
                if numbers[0] < 2000 and numbers[1] < 2000:
                    break
                time.sleep(0.5)
            return numbers

        # Warm: the table at its working size.
        accepted, _ = run_load([server], results_url, "warm", 5)
        if wait_delivered(receiver, accepted, 60):
            fail("the warm-up's jobs were not all called back")
        warm = settle(60)
        print(f"after a 5 s load: {len(accepted)} jobs; rows, dead rows, bytes: {warm}", flush=True)

        # A snapshot held open under load.
        session = pg.session()
        session.stdin.write("BEGIN ISOLATION LEVEL REPEATABLE READ;\n"
                            "SELECT count(*) FROM bloat.jobs;\n")
        session.stdin.flush()
        time.sleep(0.5)
        started = time.time()
        held, refused = run_load([server], results_url, "held", snapshot_s)
        during = table()
        session.stdin.write("COMMIT;\n\\q\n")
        session.stdin.flush()
        session.wait(timeout=30)
        print(f"{snapshot_s:.0f} s of load under an open snapshot: {len(held)} jobs "
              f"({len(refused)} refused); rows, dead rows, bytes: {during}", flush=True)
        if not held:
            fail("no job was accepted while the snapshot was open")
        lost = wait_delivered(receiver, held, 120)
        if lost:
            print(server.report(), end="")
            fail(f"{len(lost)} jobs accepted under the snapshot were not called back, "
                 f"e.g. {sorted(lost)[:5]}")
        print(f"the backlog drained {time.time() - started - snapshot_s:.1f} s after the snapshot "
              "ended", flush=True)
        after = settle(120)
        print(f"after vacuum and pruning: rows, dead rows, bytes: {after}", flush=True)
        if after[0] >= 2000 or after[1] >= 2000:
            fail(f"the rows did not return to what the retention keeps: {after}")

        # A second load, a third as long (CI's time): the space freed is reused.
        again, _ = run_load([server], results_url, "again", snapshot_s / 3)
        if wait_delivered(receiver, again, 120):
            fail("the second load's jobs were not all called back")
        final = settle(120)
        print(f"after a second {snapshot_s / 3:.0f} s load of {len(again)} jobs: rows, dead rows, "
              f"bytes: {final}", flush=True)
        if final[2] > during[2] + (during[2] - warm[2]) / 6 + 1_000_000:
            fail(f"the table grew again ({during[2]} -> {final[2]} bytes): its space was not "
                 "reused")
        server.stop()
    finally:
        pg.stop()
    receiver.shutdown()

print("postgres bloat: ok")
