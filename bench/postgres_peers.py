#!/usr/bin/env python3
"""The Postgres job queues on one PostgreSQL (issue 41): jobs/s and Postgres CPU per job.

    bench/postgres_peers.py                 # 3 rounds of 10,000 jobs per trial
    bench/postgres_peers.py --jobs 2000 --rounds 1 --systems pg-boss --modes poll

The peers' side of the comparison issue 41 asks for: graphile-worker and pg-boss (npm, the newest
versions that run on Debian's Node 20: bench/pg_peers/package.json pins them; the first run
installs them into bench/pg_peers/node_modules). rebound's row comes with its PostgreSQL store.
Needs, from Debian: postgresql (15), nginx-light, nodejs, npm.

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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import BENCH, Lines, Receiver, cell, end_helper, fmt_int, free_port  # noqa: E402

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

    def __init__(self):
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
                            "-c", "max_connections=200"],
            stdout=subprocess.DEVNULL, stderr=open(self.dir / "server.log", "w"))
        deadline = time.monotonic() + 30
        while subprocess.run([pg_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                             stdout=subprocess.DEVNULL).returncode != 0:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("postgres did not start: " + (self.dir / "server.log").read_text()[-2000:])
            time.sleep(0.1)
        self.postmaster = self.postmaster_pid(data)

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

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


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
        before = pg.cpu_seconds()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = lines.next_json(a.trial_timeout + 30, "result")
        after = pg.cpu_seconds()
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
    p.add_argument("--systems", action="append", choices=["graphile-worker", "pg-boss"])
    p.add_argument("--modes", action="append", choices=["poll", "callback"])
    p.add_argument("--trial-timeout", type=int, default=300)
    p.add_argument("--json", help="write every trial's figures here")
    a = p.parse_args()
    systems = a.systems or ["graphile-worker", "pg-boss"]
    modes = a.modes or ["poll", "callback"]
    for tool in ["node", "npm"] + (["nginx"] if "callback" in modes else []):
        if not shutil.which(tool):
            raise SystemExit(f"postgres_peers: no {tool} on PATH")
    if not (PEERS / "node_modules" / "pg-boss").exists():
        log("installing the peers (npm install in bench/pg_peers)")
        subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=PEERS, check=True)
    pg = Postgres()
    results: list[dict] = []
    try:
        number = 0
        for r in range(a.rounds):
            for mode in modes:
                for system in systems:
                    number += 1
                    figures = trial(a, pg, number, mode, system)
                    figures["round"] = r + 1
                    log(f"round {r + 1} {mode:8} {system:16} {figures['jobs_per_s']:8.0f} jobs/s "
                        f"{figures['pg_cpu_us_per_job']:6.0f} µs Postgres CPU a job")
                    results.append(figures)
    finally:
        pg.stop()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
