#!/usr/bin/env python3
"""Work left for anyone in a PostgreSQL fleet, with and without NOTIFY wake-ups (issue 41).

Two rebound-servers on one PostgreSQL (the cluster bench/postgres_peers.py makes), each with one
worker, a model that takes --model-seconds a job and --prefetch 1: a server whose worker is busy
and which holds one job more leaves the rest of what it accepts in the store, for any server to
claim. A burst of --burst jobs (poll only) goes to the first server alone, at a random moment of
the second (so the other server's poll of the store is at a random phase); measured: how long
until every job of the burst completed, and how many of them the second server ran. Without
`?notify=1` the idle server finds the burst at its next poll (every second); with it, when the
first server's commit that left jobs for anyone notifies it.

    apt-get install postgresql
    bench/fleet_wakeups.py --build-dir build-core            # about a minute
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from postgres_peers import Postgres, log  # noqa: E402
from redis_peers import scrape  # noqa: E402
from run import ROOT, Server, free_port, http_post  # noqa: E402

SUCCEEDED = 'rebound_jobs_completed_total{status="succeeded"}'


def completed(port: int) -> int:
    return int(scrape(port).get(SUCCEEDED, 0.0))


def trial(a, pg: Postgres, number: int, query: str) -> list[dict]:
    db = f"wakeups_{number}"
    pg.sql(f"CREATE DATABASE {db}")
    servers = []
    try:
        store = pg.url(db).replace("postgres://", "postgresql://") + "?schema=rebound" + \
            (f"&{query}" if query else "")
        for i in range(2):
            port = free_port()
            servers.append(Server(f"rebound-server {i + 1}", [
                a.server, "serve", "--host", "127.0.0.1", "--port", str(port),
                "--model", f"sleep:{a.model_seconds}", "--store", store, "--workers", "1",
                "--prefetch", "1", "--log-level", "warn"], port))
        time.sleep(1.0)  # past the servers' start
        first = servers[0]
        bursts = []
        for b in range(a.bursts):
            time.sleep(random.uniform(0.0, 1.0))
            before = [completed(s.port) for s in servers]
            t0 = time.monotonic()
            for j in range(a.burst):
                status = http_post(first.port, "/v1/inferences", {"id": f"b{b}-{j}"})
                if status != 202:
                    raise RuntimeError(f"submission answered {status}")
            deadline = t0 + 60
            while True:
                now = [completed(s.port) for s in servers]
                if sum(now) - sum(before) >= a.burst:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"burst {b}: {sum(now) - sum(before)} of {a.burst} done")
                time.sleep(0.01)
            bursts.append({"seconds": time.monotonic() - t0,
                           "on_second": now[1] - before[1]})
        return bursts
    finally:
        for s in servers:
            s.stop()
        pg.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build-dir", default=str(ROOT / "build"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bursts", type=int, default=5, help="bursts a trial (default 5)")
    p.add_argument("--burst", type=int, default=10, help="jobs a burst (default 10)")
    p.add_argument("--model-seconds", type=float, default=0.1)
    a = p.parse_args()
    a.server = str(Path(a.build_dir).resolve() / "examples" / "rebound-server")
    if not Path(a.server).exists():
        raise SystemExit(f"fleet_wakeups: no {a.server} (build it, or pass --build-dir)")
    pg = Postgres()
    results: dict[str, list[dict]] = {"": [], "notify=1": []}
    try:
        number = 0
        for r in range(a.rounds):
            for query in results:
                number += 1
                got = trial(a, pg, number, query)
                log(f"round {r + 1}, {query or 'polling'}: " +
                    ", ".join(f"{g['seconds']:.2f} s ({g['on_second']} on the second)" for g in got))
                results[query] += got
    finally:
        pg.stop()
    alone = a.burst * a.model_seconds
    print(f"{a.burst} jobs of {a.model_seconds} s a burst to one of two servers "
          f"({alone:.1f} s on one server alone, {alone / 2:.1f} s on both), "
          f"{a.rounds} rounds of {a.bursts} bursts:\n")
    print("| wake-ups | burst done, median (range) | jobs run by the idle server, median |")
    print("|---|---:|---:|")
    for query, bursts in results.items():
        seconds = [b["seconds"] for b in bursts]
        print(f"| {query or 'polling (1 s)'} | {statistics.median(seconds):.2f} s "
              f"({min(seconds):.2f}-{max(seconds):.2f}) | "
              f"{statistics.median(b['on_second'] for b in bursts):g} |")


if __name__ == "__main__":
    main()
