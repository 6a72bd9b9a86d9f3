#!/usr/bin/env python3
"""The Postgres job queues on one PostgreSQL (issue 41): jobs/s and Postgres CPU per job.

    bench/postgres_peers.py                 # 3 rounds of 10,000 jobs per trial
    bench/postgres_peers.py --jobs 2000 --rounds 1 --systems pg-boss --modes poll
    bench/postgres_peers.py --systems rebound --batch 100 --rounds 1 --statements   # where its time goes

The peers' side of the comparison issue 41 asks for: graphile-worker and pg-boss (npm, the newest
versions that run on Debian's Node 20: bench/pg_peers/package.json pins them; the first run
installs them into bench/pg_peers/node_modules), and rebound: K rebound-servers (1 by default;
--servers 1 --servers 3 for both) on the database (--store postgresql://...?schema=rebound), the
echo model, --workers W each, the jobs submitted over HTTP by one wrk a server (bench/submit.lua,
each its share of the N jobs), the run ending when the servers' own counters (GET /metrics,
summed) show N jobs final (poll) or N callbacks delivered (callback). Needs, from Debian:
postgresql (15), nginx-light, nodejs, npm, wrk; and a build of rebound-server (--build-dir).

One PostgreSQL 15 cluster is made for the run (initdb in a temporary folder, a free port on
127.0.0.1; as the `postgres` user when this runs as root), with Debian's defaults but
max_connections 200 (synchronous_commit and fsync on: a job acknowledged is on disk). Each trial
gets a database of its own, dropped after it. Modes:

  poll      a handler that returns at once;
  callback  the handler POSTs {"id", "result"} to an nginx receiver (bench/receiver.nginx.conf)
            over kept-alive connections, and fails the job on a non-2xx answer.

jobs/s is N / (the time from the first insert to the database counting every job completed:
bench/pg_peers/bench.mjs polls a count every 20 ms). Postgres CPU per job is the growth of the
CPU time of the postmaster and every process under it (its backends, the checkpointer, the WAL
writer, autovacuum; those that ended are in the postmaster's children's time) over that window,
divided by N. Trials take turns within each round, so the noise of a shared machine falls on all
alike; the table gives the median of the rounds with the range in brackets. Every wait is
bounded, everything is on loopback, and only the processes started here are stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import (BENCH, ROOT, Lines, Receiver, Server, cell, end_helper, fmt_int,  # noqa: E402
                 free_port, parse_wrk)
from redis_peers import CALLBACKS_ENDED, COMPLETED, scrape, total  # noqa: E402

PEERS = BENCH / "pg_peers"
TICK = os.sysconf("SC_CLK_TCK")


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def pg_bin(name: str) -> str:
    for folder in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (folder / name).exists():
            return str(folder / name)
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"postgres_peers: no {name} (apt-get install postgresql)")
    return found


class Postgres:
    """A PostgreSQL cluster of its own: initdb, postgres on a free loopback port, stopped at the end."""

    def __init__(self, statements: bool = False):
        self.dir = Path(tempfile.mkdtemp(prefix="rebound-pg-"))
        self.port = free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres", "postgres")
        data = self.dir / "data"
        subprocess.run(self.as_user + [pg_bin("initdb"), "-D", str(data), "-U", "bench", "--auth=trust",
                                       "-E", "UTF8", "--locale=C"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.proc = subprocess.Popen(
            self.as_user + [pg_bin("postgres"), "-D", str(data), "-p", str(self.port),
                            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.dir}",
                            "-c", "max_connections=200"] +
            (["-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.track=top",
              "-c", "pg_stat_statements.track_planning=on"] if statements else []),
            stdout=subprocess.DEVNULL, stderr=open(self.dir / "server.log", "w"))
        deadline = time.monotonic() + 30
        while subprocess.run([pg_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                             stdout=subprocess.DEVNULL).returncode != 0:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("postgres did not start: " + (self.dir / "server.log").read_text()[-2000:])
            time.sleep(0.1)
        self.postmaster = self.postmaster_pid(data)
        if statements:
            self.sql("CREATE EXTENSION pg_stat_statements")

    def postmaster_pid(self, data: Path) -> int:
        # (runuser's child when run as root: the pid in postmaster.pid is the postmaster's.)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                return int((data / "postmaster.pid").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                time.sleep(0.05)
        raise RuntimeError("no postmaster.pid")

    def url(self, db: str) -> str:
        return f"postgres://bench@127.0.0.1:{self.port}/{db}"

    def sql(self, statement: str) -> None:
        subprocess.run([pg_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "bench", "-d", "postgres",
                        "-v", "ON_ERROR_STOP=1", "-q", "-c", statement], check=True)

    def query(self, statement: str) -> list[list[str]]:
        out = subprocess.run([pg_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "bench", "-d",
                              "postgres", "-v", "ON_ERROR_STOP=1", "-q", "-At", "-F", "\t", "-c", statement],
                             check=True, stdout=subprocess.PIPE, text=True).stdout
        return [line.split("\t") for line in out.splitlines() if line]

    def statements(self, db: str, jobs: int, top: int = 12) -> str:
        """The statements of database db since the last reset, most Postgres time first: time
        (execution and planning), calls and rows per job, and the start of each statement's text."""
        rows = self.query(
            "SELECT round(((total_exec_time + total_plan_time) * 1000 / %d)::numeric, 1), "
            "round((calls::float8 / %d)::numeric, 3), round((rows::float8 / %d)::numeric, 2), "
            "round((wal_records::float8 / %d)::numeric, 2), "
            "regexp_replace(left(query, 110), '\\s+', ' ', 'g') FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '%s' "
            "ORDER BY total_exec_time + total_plan_time DESC LIMIT %d" % (jobs, jobs, jobs, jobs, db,
                                                                          top))
        lines = ["  µs a job  calls a job  rows a job  WAL records a job  statement"]
        lines += [f"  {r[0]:>9}  {r[1]:>11}  {r[2]:>10}  {r[3]:>17}  {r[4]}" for r in rows]
        return "\n".join(lines)

    def cpu_seconds(self) -> float:
        """CPU time of the postmaster, its live children and those it reaped."""
        def stat(pid: int) -> list[str]:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()
        own = stat(self.postmaster)
        # Fields after the name: state is [0]; utime [11], stime [12], cutime [13], cstime [14].
        ticks = sum(int(own[i]) for i in (11, 12, 13, 14))
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = stat(int(entry))
            except OSError:
                continue
            if int(fields[1]) == self.postmaster:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / TICK

    def cpu_by_process(self) -> dict[str, float]:
        """CPU time by kind of PostgreSQL process (backends, WAL writer, checkpointer, autovacuum,
        ...), the postmaster's own, and that of the children it reaped (exited backends,
        autovacuum workers that ended)."""
        with open(f"/proc/{self.postmaster}/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
        out = {"postmaster": (int(own[11]) + int(own[12])) / TICK,
               "reaped children": (int(own[13]) + int(own[14])) / TICK}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) != self.postmaster:
                    continue
                with open(f"/proc/{entry}/cmdline") as f:
                    title = f.read().replace("\0", " ").strip()
            except OSError:
                continue
            # "postgres: walwriter", "postgres: bench bench_1 127.0.0.1(4711) idle": a backend.
            kind = title.removeprefix("postgres: ")
            if kind.startswith("bench "):
                kind = "backends"
            kind = kind.split("   ")[0]
            out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
        return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def cpu_table(before: dict[str, float], after: dict[str, float], jobs: int) -> str:
    """The CPU each kind of process spent between two cpu_by_process readings, in µs a job (a
    process that ended meanwhile is counted under "reaped children")."""
    rows = sorted(((after[k] - before.get(k, 0.0)) * 1e6 / jobs, k) for k in after)
    return "\n".join(f"  {us:9.1f}  {kind}" for us, kind in reversed(rows) if us > 0)


def process_cpu_seconds(pid: int) -> float:
    """User and system CPU time of one process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def trial(a, pg: Postgres, number: int, mode: str, system: str) -> dict:
    db = f"bench_{number}"
    pg.sql(f"CREATE DATABASE {db}")
    receiver = Receiver() if mode == "callback" else None
    argv = ["node", str(PEERS / "bench.mjs"), "--system", system, "--connection", pg.url(db),
            "--jobs", str(a.jobs), "--timeout", str(a.trial_timeout)]
    if receiver is not None:
        argv += ["--callback-url", receiver.url]
    errors = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(argv, cwd=PEERS, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                            text=True)
    failed = False
    try:
        lines = Lines(proc.stdout, "bench/pg_peers/bench.mjs")
        ready = lines.next_json(120, "ready line")
        if a.statements:
            pg.query("SELECT pg_stat_statements_reset()")
            kinds_before = pg.cpu_by_process()
        before = pg.cpu_seconds()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = lines.next_json(a.trial_timeout + 30, "result")
        after = pg.cpu_seconds()
        if a.statements:
            log(f"{system}, {mode}: the statements of the trial\n" + pg.statements(db, a.jobs))
            log(f"{system}, {mode}: Postgres CPU a job by process\n" +
                cpu_table(kinds_before, pg.cpu_by_process(), a.jobs))
        if result["timed_out"]:
            raise RuntimeError(f"{system}: {result['completed']} of {a.jobs} jobs completed in "
                               f"{result['seconds']:.1f} s ({result['first_error']})")
        figures = {"system": system, "mode": mode, "jobs": a.jobs, "seconds": result["seconds"],
                   "jobs_per_s": a.jobs / result["seconds"],
                   "pg_cpu_us_per_job": (after - before) * 1e6 / a.jobs,
                   "submit_seconds": result["submit_seconds"], "first_error": result["first_error"],
                   **{k: v for k, v in ready.items() if k != "ready"}}
        if receiver is not None:
            deadline = time.monotonic() + 5
            while receiver.delivered() < a.jobs and time.monotonic() < deadline:
                time.sleep(0.05)
            figures["received"] = receiver.delivered()
        return figures
    except Exception:
        failed = True
        raise
    finally:
        end_helper(proc, errors, failed)
        if receiver is not None:
            receiver.stop()
        pg.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def rebound_trial(a, pg: Postgres, number: int, mode: str, count: int, query: str = "",
                  batch: int = 0, build: tuple[str, str] = ("", "")) -> dict:
    db = f"bench_{number}"
    pg.sql(f"CREATE DATABASE {db}")
    receiver = Receiver() if mode == "callback" else None
    servers, wrks = [], []
    label, server = build
    name = f"rebound-{count}" + (f", batches of {batch}" if batch else "") + \
        (f" ({query})" if query else "") + (f" [{label}]" if label else "")
    try:
        store = pg.url(db).replace("postgres://", "postgresql://") + "?schema=rebound" + \
            (f"&{query}" if query else "")
        for i in range(count):
            port = free_port()
            servers.append(Server(f"rebound-server {i + 1} of {count}", [
                server, "serve", "--host", "127.0.0.1", "--port", str(port), "--model", a.model,
                "--store", store, "--workers", str(a.workers),
                "--queue-capacity", str(max(1_000_000, a.jobs)), "--allow-private-callbacks",
                "--log-level", "warn"] + (["--prefetch", str(a.prefetch)] if a.prefetch is not None
                                         else []), port))
        time.sleep(1.0)  # past the servers' start: their first claims and reports
        shares = [a.jobs // count + (i < a.jobs % count) for i in range(count)]
        connections = max(1, (a.batch_connections if batch else 32) // count)
        if a.statements:
            pg.query("SELECT pg_stat_statements_reset()")
            kinds_before = pg.cpu_by_process()
        before = pg.cpu_seconds()
        servers_before = sum(process_cpu_seconds(srv.proc.pid) for srv in servers)
        t0 = time.monotonic()
        for srv, share in zip(servers, shares):
            wrks.append(subprocess.Popen(
                ["wrk", "-t1", f"-c{connections}", f"-d{a.trial_timeout}s", "-s",
                 str(BENCH / "submit.lua"), f"http://127.0.0.1:{srv.port}"],
                env={**os.environ, "SUBMIT_JOBS": str(share),
                     "CALLBACK_URL": receiver.url if receiver else "", "CALLBACK_URLS": "",
                     **({"SUBMIT_BATCH": str(batch)} if batch else {})},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        ended = COMPLETED if receiver is None else CALLBACKS_ENDED
        deadline = t0 + a.trial_timeout
        while True:
            figures = [scrape(srv.port) for srv in servers]
            now = time.monotonic()
            accepted = total(figures, "rebound_jobs_accepted_total")
            done = total(figures, *ended)
            in_flight = total(figures, "rebound_jobs_in_flight")
            if accepted >= a.jobs and done >= a.jobs and in_flight == 0:
                break
            if now > deadline:
                raise RuntimeError(f"{name}: {accepted} of {a.jobs} accepted, {done} "
                                   f"finished, {in_flight} in flight after {a.trial_timeout} s")
            # Every 50 ms (the server counts the backlog in PostgreSQL for its queue gauges at
            # most once a second: Postgres CPU the peers' runs do not spend).
            time.sleep(0.05)
        seconds = now - t0
        after = pg.cpu_seconds()
        servers_cpu = sum(process_cpu_seconds(srv.proc.pid) for srv in servers) - servers_before
        if a.statements:
            log(f"{name}, {mode}: the statements of the trial\n" + pg.statements(db, a.jobs))
            log(f"{name}, {mode}: Postgres CPU a job by process\n" +
                cpu_table(kinds_before, pg.cpu_by_process(), a.jobs))
        runs = []
        for w in wrks:
            w.send_signal(signal.SIGINT)  # wrk sleeps out -d after its thread stopped
            runs.append(parse_wrk(w.communicate(timeout=30)[0]))
        return {"system": name, "mode": mode, "jobs": a.jobs, "seconds": seconds,
                "jobs_per_s": a.jobs / seconds, "pg_cpu_us_per_job": (after - before) * 1e6 / a.jobs,
                "server_cpu_us_per_job": servers_cpu * 1e6 / a.jobs, "accepted": accepted, "refused": sum(r["non2xx"] for r in runs),
                # (the writers' transactions since the servers started, from their last scrape)
                "transactions": total(figures, "rebound_store_transactions_total"),
                "retried": total(figures, "rebound_store_transactions_retried_total"),
                "failed": total(figures, *COMPLETED[1:])}
    finally:
        for w in wrks:
            if w.poll() is None:
                w.kill()
                w.wait()
        for srv in servers:
            srv.stop()
        if receiver is not None:
            receiver.stop()
        pg.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def table(results: list[dict]) -> str:
    rows = ["| mode | system | jobs/s | Postgres CPU µs a job |", "|---|---|---:|---:|"]
    keys = sorted({(r["mode"], r["system"]) for r in results})
    for mode, system in keys:
        mine = [r for r in results if r["mode"] == mode and r["system"] == system]
        rows.append(f"| {mode} | {system} | {cell([r['jobs_per_s'] for r in mine], fmt_int)} | "
                    f"{cell([r['pg_cpu_us_per_job'] for r in mine], fmt_int)} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--systems", action="append", choices=["graphile-worker", "pg-boss", "rebound"])
    p.add_argument("--servers", type=int, action="append", choices=[1, 2, 3],
                   help="rebound-servers on the database (default 1; repeat for several trials)")
    p.add_argument("--store-query", action="append",
                   help="rebound trials with this added to the store URI's query, e.g. prepared=1 "
                        "(repeatable; an empty one is the plain URI); default: the plain URI")
    p.add_argument("--model", default="echo",
                   help="rebound-server --model (default echo; e.g. sleep:0.02 for a fleet "
                        "bound by its model)")
    p.add_argument("--workers", type=int, default=2, help="rebound-server --workers (default 2)")
    p.add_argument("--prefetch", type=int,
                   help="rebound-server --prefetch (default: the server's, 0 on PostgreSQL: each "
                        "server keeps what it accepts; with one, jobs beyond it are left in the "
                        "store for any server)")
    p.add_argument("--batch", type=int, action="append",
                   help="rebound trials whose jobs are submitted this many a request (POST "
                        "/v1/inferences:batch, at most 1,000), as the peers insert theirs 1,000 a "
                        "call; repeatable, 0 is one job a request (default: 0)")
    p.add_argument("--batch-connections", type=int, default=4,
                   help="wrk connections of the batch trials (default 4: a server takes a quarter "
                        "of its --store-threads batches at once and answers 503 to more)")
    p.add_argument("--build-dir", action="append",
                   help="where rebound-server was built (default build/); repeatable: each build's "
                        "trials take turns with the others' in every round, named by its folder")
    p.add_argument("--modes", action="append", choices=["poll", "callback"])
    p.add_argument("--trial-timeout", type=int, default=300)
    p.add_argument("--json", help="write every trial's figures here")
    p.add_argument("--statements", action="store_true",
                   help="load pg_stat_statements and print each trial's statements, most Postgres "
                        "time a job first (top-level statements: a peer's PL/pgSQL function is one "
                        "line; PostgreSQL 13 or later; its bookkeeping costs CPU: compare figures "
                        "of runs without it)")
    a = p.parse_args()
    systems = a.systems or ["graphile-worker", "pg-boss", "rebound"]
    dirs = a.build_dir or [str(ROOT / "build")]
    builds = [(Path(d).name if len(dirs) > 1 else "",
               str(Path(d).resolve() / "examples" / "rebound-server")) for d in dirs]
    for _, server in builds:
        if "rebound" in systems and not Path(server).exists():
            raise SystemExit(f"postgres_peers: no {server} (build it, or pass --build-dir)")
    modes = a.modes or ["poll", "callback"]
    for tool in ["node", "npm"] + (["nginx"] if "callback" in modes else []) + \
            (["wrk"] if "rebound" in systems else []):
        if not shutil.which(tool):
            raise SystemExit(f"postgres_peers: no {tool} on PATH")
    if not (PEERS / "node_modules" / "pg-boss").exists():
        log("installing the peers (npm install in bench/pg_peers)")
        subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=PEERS, check=True)
    pg = Postgres(a.statements)
    results: list[dict] = []
    try:
        number = 0
        for r in range(a.rounds):
            for mode in modes:
                trials = [(s, 0, "", 0, None) for s in systems if s != "rebound"]
                if "rebound" in systems:
                    trials += [("rebound", k, q, b, build) for k in (a.servers or [1])
                               for q in (a.store_query or [""]) for b in (a.batch or [0])
                               for build in builds]
                for system, count, query, batch, build in trials:
                    number += 1
                    figures = (rebound_trial(a, pg, number, mode, count, query, batch, build)
                               if system == "rebound" else trial(a, pg, number, mode, system))
                    figures["round"] = r + 1
                    log(f"round {r + 1} {mode:8} {figures['system']:16} {figures['jobs_per_s']:8.0f} "
                        f"jobs/s {figures['pg_cpu_us_per_job']:6.0f} µs Postgres CPU a job" +
                        (f", the servers {figures['server_cpu_us_per_job']:.0f} µs, "
                         f"{figures['transactions']:.0f} transactions ({figures['retried']:.0f} made again)"
                         if "server_cpu_us_per_job" in figures else ""))
                    results.append(figures)
    finally:
        pg.stop()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
