#!/usr/bin/env python3
"""rebound and BullMQ on one Redis (issue 24): jobs/s and Redis CPU per job, one command.

    bench/redis_peers.py           # what docs/benchmarks.md shows: 3 rounds of 10,000 jobs per trial
    bench/redis_peers.py --jobs 2000 --rounds 1 --redis none --systems rebound-1 --systems bullmq

Needs a build (scripts/build.sh) and, from Debian: redis-server wrk nginx-light nodejs npm. The
first run installs BullMQ into bench/bullmq/node_modules (npm ci, the version package-lock.json
pins).

Every trial runs N jobs (--jobs) through one system on a fresh redis-server (a free port on
127.0.0.1, its own temporary folder), with one of two Redis configurations:

  none      no persistence: --save '' --appendonly no
  aof       --save '' --appendonly yes --appendfsync everysec

and in one of two modes:

  poll      rebound: jobs without a callback_url (the client would poll GET /v1/inferences/{id});
            BullMQ: a processor that returns at once.
  callback  rebound: each job's callback_url is an nginx receiver (bench/receiver.nginx.conf);
            BullMQ: the processor POSTs {"id", "result"} to the same receiver over kept-alive
            connections and fails the job on a non-2xx answer.

The systems:

  rebound-K  K rebound-servers (1, 2, 3) on the one Redis (--store redis://...), the echo model,
             --workers W each. The jobs are submitted over HTTP: one wrk per server
             (bench/submit.lua with SUBMIT_JOBS), each with its share of the N jobs and of
             --connections, and stopping once its share is accepted (202). The run ends when the
             servers' own counters (GET /metrics, summed) show N jobs final (poll) or N callbacks
             delivered (callback) and none of the work in flight, the stores' writes included.
  bullmq     one Node process (bench/bullmq/bench.mjs): Queue.addBulk in chunks of --bullmq-chunk,
             and one Worker with --bullmq-concurrency jobs at once. The run ends when the Worker
             has seen N jobs completed (its "completed" events: the job is moved to completed in
             Redis). Completed jobs are kept, BullMQ's default; rebound keeps finished jobs too.

jobs/s is N / (the time from the first submission to the end above). Redis CPU per job is the
growth of used_cpu_sys + used_cpu_user (INFO cpu, the whole redis-server process, AOF fsyncs
included) over that window, divided by N; the main thread's share (used_cpu_*_main_thread) and
Redis's memory and AOF growth per job are kept in --json. Trials take turns within each round,
so the noise of a shared machine falls on all systems alike; the table gives the median of the
rounds with the range in brackets. Every wait is bounded (--trial-timeout), everything is on
loopback, and only the processes started here are stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import (BENCH, ROOT, Receiver, Server, cell, fmt_int, free_port, http_get,  # noqa: E402
                 log, machine, parse_wrk)

BULLMQ = BENCH / "bullmq"

REDIS_CONFIGS = {
    "none": ("no persistence", ["--save", "", "--appendonly", "no"]),
    "aof": ("AOF everysec", ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"]),
}
MODES = {"poll": "poll only", "callback": "with callback"}
SYSTEMS = {"rebound-1": "rebound, 1 server", "rebound-2": "rebound, 2 servers",
           "rebound-3": "rebound, 3 servers", "bullmq": "BullMQ"}


def redis_call(port: int, *args: str, timeout: float = 5.0) -> str:
    """One command over RESP; the answer of a status or bulk string reply, as text."""
    request = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.sendall(request.encode())
        data = b""
        while b"\r\n" not in data:
            chunk = c.recv(65536)
            if not chunk:
                raise RuntimeError("redis-server closed the connection")
            data += chunk
        head, _, rest = data.partition(b"\r\n")
        if head.startswith((b"+", b":")):
            return head[1:].decode()
        if head.startswith(b"-"):
            raise RuntimeError(f"redis-server: {head[1:].decode()}")
        if not head.startswith(b"$"):
            raise RuntimeError(f"unexpected answer from redis-server: {head[:80]!r}")
        size = int(head[1:])
        while len(rest) < size + 2:
            chunk = c.recv(65536)
            if not chunk:
                raise RuntimeError("redis-server closed the connection")
            rest += chunk
        return rest[:size].decode()


class RedisServer:
    """A fresh redis-server on a free loopback port, in a temporary folder of its own."""

    def __init__(self, config: str):
        self.dir = Path(tempfile.mkdtemp(prefix="rebound-peers-redis-"))
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--daemonize", "no", "--logfile", str(self.dir / "redis.log"), *REDIS_CONFIGS[config][1]],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis_call(self.port, "PING", timeout=1) == "PONG":
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def info(self, section: str) -> dict[str, str]:
        fields = {}
        for line in redis_call(self.port, "INFO", section).splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key] = value.strip()
        return fields

    def usage(self) -> dict:
        """CPU seconds (the process, and its main thread where Redis tells) and bytes used."""
        cpu, mem, aof = self.info("cpu"), self.info("memory"), self.info("persistence")
        main = None
        if "used_cpu_sys_main_thread" in cpu:
            main = float(cpu["used_cpu_sys_main_thread"]) + float(cpu["used_cpu_user_main_thread"])
        return {"cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), "main_cpu_s": main,
                "used_memory": int(mem["used_memory"]),
                "aof_bytes": int(aof.get("aof_current_size", 0)) if aof.get("aof_enabled") == "1" else 0}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def usage_per_job(before: dict, after: dict, jobs: int) -> dict:
    main = None
    if before["main_cpu_s"] is not None and after["main_cpu_s"] is not None:
        main = (after["main_cpu_s"] - before["main_cpu_s"]) * 1e6 / jobs
    return {"redis_cpu_us_per_job": (after["cpu_s"] - before["cpu_s"]) * 1e6 / jobs,
            "redis_main_cpu_us_per_job": main,
            "redis_bytes_per_job": (after["used_memory"] - before["used_memory"]) / jobs,
            "aof_bytes_per_job": (after["aof_bytes"] - before["aof_bytes"]) / jobs}


def scrape(port: int) -> dict[str, float]:
    """GET /metrics as {name with labels: value}. (It also runs the store's small stats script
    on Redis, which lands in rebound's Redis CPU; the polling below keeps those few.)"""
    status, text = http_get(port, "/metrics")
    if status != 200:
        raise RuntimeError(f"GET /metrics on port {port} answered {status}")
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def total(figures: list[dict[str, float]], *names: str) -> int:
    return int(sum(f.get(n, 0.0) for f in figures for n in names))


COMPLETED = tuple(f'rebound_jobs_completed_total{{status="{s}"}}'
                  for s in ("succeeded", "failed", "expired", "cancelled"))
CALLBACKS_ENDED = ("rebound_callbacks_delivered_total", "rebound_callbacks_given_up_total")


def run_rebound(a, redis: RedisServer, count: int, receiver: Receiver | None) -> dict:
    servers, wrks = [], []
    try:
        for i in range(count):
            port = free_port()
            servers.append(Server(f"rebound-server {i + 1} of {count}", [
                a.server, "serve", "--host", "127.0.0.1", "--port", str(port), "--model", "echo",
                "--store", redis.url, "--workers", str(a.workers),
                "--queue-capacity", str(max(1_000_000, a.jobs)), "--allow-private-callbacks",
                "--log-level", "warn"], port))
        time.sleep(a.settle)  # past the servers' start: their first claims and reports
        shares = [a.jobs // count + (i < a.jobs % count) for i in range(count)]
        connections = max(1, a.connections // count)
        before = redis.usage()
        t0 = time.monotonic()
        for srv, share in zip(servers, shares):
            wrks.append(subprocess.Popen(
                ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(a.trial_timeout))}s", "-s",
                 str(BENCH / "submit.lua"), f"http://127.0.0.1:{srv.port}"],
                env={**os.environ, "SUBMIT_JOBS": str(share),
                     "CALLBACK_URL": receiver.url if receiver else "", "CALLBACK_URLS": ""},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        ended = COMPLETED if receiver is None else CALLBACKS_ENDED
        deadline, scrapes = t0 + a.trial_timeout, 0
        while True:
            figures = [scrape(srv.port) for srv in servers]
            now = time.monotonic()
            scrapes += len(servers)
            accepted = total(figures, "rebound_jobs_accepted_total")
            done = total(figures, *ended)
            in_flight = total(figures, "rebound_jobs_in_flight")
            if accepted >= a.jobs and done >= a.jobs and in_flight == 0:
                break
            if now > deadline:
                raise RuntimeError(f"{count} rebound-server(s): {accepted} of {a.jobs} jobs accepted, "
                                   f"{done} finished, {in_flight} in flight after {a.trial_timeout:g} s")
            # A quarter of the time the rest should take, between 5 and 100 ms: few scrapes (each
            # touches Redis), yet the end is seen within a few ms.
            rate = done / (now - t0)
            remaining = (a.jobs - done) / rate if rate > 0 else 0.4
            time.sleep(min(0.1, max(0.005, remaining / 4)))
        seconds = now - t0
        after = redis.usage()
        runs = []
        for w in wrks:
            w.send_signal(signal.SIGINT)  # wrk sleeps out -d after its thread stopped; this ends it
            runs.append(parse_wrk(w.communicate(timeout=30)[0]))
        result = {
            "jobs": a.jobs, "seconds": seconds, "jobs_per_s": a.jobs / seconds,
            **usage_per_job(before, after, a.jobs),
            "accepted": accepted, "refused": sum(r["non2xx"] for r in runs),
            "socket_errors": sum(r["socket_errors"] for r in runs),
            "failed": total(figures, *COMPLETED[1:]), "metrics_scrapes": scrapes,
        }
        if receiver is not None:
            result["callbacks_given_up"] = total(figures, "rebound_callbacks_given_up_total")
        return result
    finally:
        for w in wrks:
            if w.poll() is None:
                w.kill()
                w.wait()
        for srv in servers:
            srv.stop()


class Lines:
    """A process's stdout, line by line, with a timeout on each line."""

    def __init__(self, stream):
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def next_json(self, timeout: float, what: str) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"no {what} from bench/bullmq/bench.mjs within {timeout:g} s") from None
        if line is None:
            raise RuntimeError(f"bench/bullmq/bench.mjs ended before its {what}")
        return json.loads(line)


def run_bullmq(a, redis: RedisServer, receiver: Receiver | None) -> dict:
    argv = ["node", str(BULLMQ / "bench.mjs"), "--redis-port", str(redis.port), "--jobs", str(a.jobs),
            "--concurrency", str(a.bullmq_concurrency), "--chunk", str(a.bullmq_chunk),
            "--timeout", str(a.trial_timeout)]
    if receiver is not None:
        argv += ["--callback-url", receiver.url]
    errors = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(argv, cwd=BULLMQ, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=errors, text=True)
    try:
        lines = Lines(proc.stdout)
        ready = lines.next_json(60, "ready line")
        before = redis.usage()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = lines.next_json(a.trial_timeout + 30, "result")
        after = redis.usage()
        if result["timed_out"] or result["completed"] + result["failed"] < a.jobs:
            raise RuntimeError(f"BullMQ: {result['completed']} of {a.jobs} jobs completed, "
                               f"{result['failed']} failed, in {result['seconds']:.1f} s")
        return {
            "jobs": a.jobs, "seconds": result["seconds"], "jobs_per_s": a.jobs / result["seconds"],
            **usage_per_job(before, after, a.jobs),
            "failed": result["failed"], "first_error": result["first_error"],
            "submit_seconds": result["submit_seconds"], "bullmq": ready["bullmq"], "node": ready["node"],
        }
    except Exception:
        errors.seek(0)
        tail = errors.read()[-2000:]
        if tail:
            log(tail)
        raise
    finally:
        try:
            proc.stdin.close()  # tells bench.mjs to close its connections and exit
        except OSError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        errors.close()


def trial(a, config: str, mode: str, system: str) -> dict:
    redis = RedisServer(config)
    receiver = Receiver() if mode == "callback" else None
    try:
        if system == "bullmq":
            result = run_bullmq(a, redis, receiver)
        else:
            result = run_rebound(a, redis, int(system.rsplit("-", 1)[1]), receiver)
        if receiver is not None:
            # Cross-check: every callback reached the receiver (its log is flushed every 100 ms).
            deadline = time.monotonic() + 5
            while receiver.delivered() < a.jobs and time.monotonic() < deadline:
                time.sleep(0.05)
            result["received"] = receiver.delivered()
        return result
    finally:
        if receiver is not None:
            receiver.stop()
        redis.stop()


def table(a, results: list[dict]) -> str:
    lines = ["| Redis | mode | system | jobs/s | Redis CPU µs/job | of which main thread |",
             "|---|---|---|---:|---:|---:|"]
    us = lambda x: f"{x:,.0f}" if x >= 10 else f"{x:.1f}"
    for config in a.redis:
        for mode in a.modes:
            for system in a.systems:
                runs = [r for r in results if (r["redis"], r["mode"], r["system"]) == (config, mode, system)]
                ok = [r for r in runs if "error" not in r]
                failed = len(runs) - len(ok)
                note = f" ({failed} of {len(runs)} trials failed)" if failed else ""
                main = [r["redis_main_cpu_us_per_job"] for r in ok if r["redis_main_cpu_us_per_job"] is not None]
                lines.append(
                    f"| {REDIS_CONFIGS[config][0]} | {MODES[mode]} | {SYSTEMS[system]}{note} | "
                    f"{cell([r['jobs_per_s'] for r in ok], fmt_int)} | "
                    f"{cell([r['redis_cpu_us_per_job'] for r in ok], us)} | {cell(main, us)} |")
    return "\n".join(lines)


def check_prerequisites(a) -> None:
    tools = ["redis-server"]
    if any(s != "bullmq" for s in a.systems):
        tools.append("wrk")
    if "callback" in a.modes:
        tools.append("nginx")
    installed = (BULLMQ / "node_modules" / "bullmq").exists()
    if "bullmq" in a.systems:
        tools += ["node"] if installed else ["node", "npm"]
    missing = [t for t in tools if shutil.which(t) is None]
    if any(s != "bullmq" for s in a.systems) and not Path(a.server).exists():
        missing.append(f"{a.server} (run scripts/build.sh)")
    if missing:
        sys.exit("bench/redis_peers.py: missing: " + "; ".join(missing))
    if "bullmq" in a.systems and not installed:
        log("installing BullMQ (npm ci in bench/bullmq)")
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=BULLMQ, check=True, timeout=600)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=10_000, help="jobs per trial (default 10,000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; each figure is their median (default 3)")
    p.add_argument("--redis", choices=list(REDIS_CONFIGS), action="append",
                   help="only this Redis configuration (repeatable; default none and aof)")
    p.add_argument("--modes", choices=list(MODES), action="append",
                   help="only this mode (repeatable; default poll and callback)")
    p.add_argument("--systems", choices=list(SYSTEMS), action="append",
                   help="only this system (repeatable; default all four)")
    p.add_argument("--connections", type=int, default=32,
                   help="wrk connections in all, shared among rebound's servers (default 32)")
    p.add_argument("--workers", type=int, default=2, help="rebound-server --workers (default 2, its own)")
    p.add_argument("--bullmq-concurrency", type=int, default=64, help="the BullMQ Worker's concurrency "
                   "(default 64, as many as rebound's callbacks in flight to one receiver)")
    p.add_argument("--bullmq-chunk", type=int, default=1000, help="jobs per Queue.addBulk (default 1,000)")
    p.add_argument("--settle", type=float, default=0.5, help="seconds between the start and the load")
    p.add_argument("--trial-timeout", type=float, default=300, help="longest trial, in seconds (default 300)")
    p.add_argument("--build-dir", default=os.environ.get("BUILD_DIR", str(ROOT / "build")))
    p.add_argument("--json", help="write every trial's figures to this file")
    a = p.parse_args()
    a.redis = a.redis or list(REDIS_CONFIGS)
    a.modes = a.modes or list(MODES)
    a.systems = a.systems or list(SYSTEMS)
    a.server = str(Path(a.build_dir).resolve() / "examples" / "rebound-server")
    if a.jobs < 1 or a.rounds < 1:
        sys.exit("bench/redis_peers.py: --jobs and --rounds must be at least 1")
    check_prerequisites(a)

    results = []
    started = time.monotonic()
    for r in range(1, a.rounds + 1):
        for config in a.redis:
            for mode in a.modes:
                for system in a.systems:
                    key = {"round": r, "redis": config, "mode": mode, "system": system}
                    try:
                        figures = trial(a, config, mode, system)
                    except Exception as e:  # one failed trial is reported, the others still run
                        figures = {"error": str(e)}
                    results.append({**key, **figures})
                    log(f"round {r}/{a.rounds} {config:4} {mode:8} {system:9} " + " ".join(
                        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))

    versions = next(((r["bullmq"], r["node"]) for r in results if "bullmq" in r), None)
    print(f"rebound and BullMQ on one Redis, {time.strftime('%Y-%m-%d')}: {a.jobs:,} jobs per trial, "
          f"median of {a.rounds} rounds (range in brackets), a fresh redis-server per trial; "
          f"rebound-server --workers {a.workers}, echo model, wrk with {a.connections} connections in all; "
          + (f"BullMQ {versions[0]} on Node {versions[1]}, one Worker, concurrency {a.bullmq_concurrency}; "
             if versions else "")
          + f"{time.monotonic() - started:.0f} s in all")
    print(machine() + "; redis-server and Node too")
    print()
    print(table(a, results))
    errors = [r for r in results if "error" in r]
    if errors:
        print()
        for r in errors:
            print(f"- failed: round {r['round']}, {r['redis']}, {r['mode']}, {r['system']}: {r['error']}")
    short = [r for r in results if r.get("failed") or r.get("callbacks_given_up")
             or ("received" in r and r["received"] != r["jobs"])]
    for r in short:
        print(f"- round {r['round']}, {r['redis']}, {r['mode']}, {r['system']}: {r.get('failed', 0)} jobs "
              f"failed, {r.get('received', '-')} callbacks received of {r['jobs']}")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
