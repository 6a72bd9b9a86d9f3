#!/usr/bin/env python3
"""Redis memory per rebound job: queued, and finished and kept for polling (docs/operations.md).

    bench/redis_memory.py                  # 50,000 jobs in each of the two measurements
    bench/redis_memory.py --jobs 10000 --json /tmp/redis-memory.json

Needs a build (scripts/build.sh) and, from Debian: redis-server (7.x) and wrk.

Two measurements, each on a fresh redis-server (a free port on 127.0.0.1, its own temporary folder,
no persistence: --save '' --appendonly no) with one rebound-server on it:

  queued    rebound-server serve --host 127.0.0.1 --port P --store redis://127.0.0.1:RP
                --model sleep:3600 --workers 1 --queue-capacity 1000000 --log-level warn
            The one worker takes the first job and sleeps for an hour on it, so every other job stays
            queued in Redis (with Redis, --prefetch is 0: none is held in the server instead).
  finished  the same with --model echo: each job runs at once and, having no callback, is final and
            kept for polling (GET /v1/inferences/{id}) for the retention, 24 h by default, before
            Redis expires it.

In each, after the server has started (its scripts loaded, its connections open), INFO memory's
used_memory (the bytes Redis's allocator has handed out: the data, its indexes and Redis's own
overhead) and DBSIZE are read; N jobs (--jobs) are submitted over HTTP by wrk with bench/submit.lua
(SUBMIT_JOBS=N, one thread, and an empty CALLBACK_URL: poll-only jobs). Each body is
{"id": "<random number>-<counter>"}: an id of up to 16 characters and no input (stored as "null",
and the echo model's result is "null" too), so the figures are rebound's own cost per job, to
which a real job adds its input's and result's bytes. The wait ends when the server's GET /metrics
shows N jobs accepted (rebound_jobs_accepted_total; queued), or N final
(rebound_jobs_completed_total summed over its statuses) with none in flight (rebound_jobs_in_flight
0; finished); then, after a second for Redis to settle, used_memory and DBSIZE are read again.
Bytes per job = used_memory's growth / N; keys per job = DBSIZE's growth / N. For one job in the
state measured (queued, or succeeded), MEMORY USAGE {rebound}:job:<id> (SAMPLES 0: exact) and HLEN
show the job's hash's share; the rest is the keys every job is a member of (sorted sets by due
time, creation, ...), listed with their MEMORY USAGE per job, and the entries of Redis's main
dictionary (and, for finished jobs, of its expiry dictionary). Those dictionaries grow by doubling,
so the figure per job moves a little with N (most at N just past a power of two).

Every wait is bounded (--timeout), everything is on loopback, and only the processes started here
are stopped (the sleeping server with SIGKILL: its worker sleeps an hour and abandons nothing of
worth). The table goes to stdout, progress to stderr, and --json keeps every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import BENCH, ROOT, Server, free_port, log, machine, parse_wrk  # noqa: E402
from redis_peers import COMPLETED, RedisServer, Resp, scrape, total  # noqa: E402

KEY_PREFIX = "{rebound}"  # RedisJobStoreOptions::key_prefix's default; a job is {rebound}:job:<id>

CASES = {
    "queued": {"title": "queued", "model": "sleep:3600"},
    "finished": {"title": "finished, kept for polling", "model": "echo"},
}


def server_argv(a, port: int | str, store: str, model: str) -> list[str]:
    return [a.server, "serve", "--host", "127.0.0.1", "--port", str(port), "--store", store,
            "--model", model, "--workers", "1", "--queue-capacity", str(max(1_000_000, a.jobs)),
            "--log-level", "warn"]


def snapshot(redis: RedisServer) -> dict:
    mem = redis.info("memory")
    return {"used_memory": int(mem["used_memory"]),
            "used_memory_dataset": int(mem.get("used_memory_dataset", 0)),
            "dbsize": int(redis.call("DBSIZE"))}


def scan_keys(conn: Resp, deadline: float) -> tuple[list[str], list[str]]:
    """A few jobs' keys (the first met) and every key that is not a job's."""
    job_prefix = f"{KEY_PREFIX}:job:"
    samples, others, cursor = [], [], "0"
    while True:
        if time.monotonic() > deadline:
            raise RuntimeError("SCAN of Redis's keys did not end in time")
        reply = conn.call("SCAN", cursor, "COUNT", "10000")
        cursor, keys = reply[0], reply[1]
        for key in keys:
            if key.startswith(job_prefix):
                if len(samples) < 20:
                    samples.append(key)
            else:
                others.append(key)
        if cursor == "0":
            return samples, sorted(others)


def measure(a, case: str) -> dict:
    spec = CASES[case]
    redis = RedisServer("none")
    server, load = None, None
    try:
        port = free_port()
        server = Server(f"rebound-server ({case})", server_argv(a, port, redis.url, spec["model"]), port)
        time.sleep(1.0)  # past the start: scripts loaded, first claims and reports made
        redis_version = redis.info("server").get("redis_version", "?")
        before = snapshot(redis)
        t0 = time.monotonic()
        load = subprocess.Popen(
            ["wrk", "-t1", f"-c{a.connections}", f"-d{max(1, round(a.timeout))}s", "-s",
             str(BENCH / "submit.lua"), f"http://127.0.0.1:{port}"],
            env={**os.environ, "SUBMIT_JOBS": str(a.jobs), "CALLBACK_URL": "", "CALLBACK_URLS": ""},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = t0 + a.timeout
        while True:
            figures = [scrape(port)]
            accepted = total(figures, "rebound_jobs_accepted_total")
            final = total(figures, *COMPLETED)
            in_flight = total(figures, "rebound_jobs_in_flight")
            if accepted >= a.jobs and (case == "queued" or (final >= a.jobs and in_flight == 0)):
                break
            if load.poll() is not None and accepted < a.jobs:
                raise RuntimeError(f"{case}: wrk ended with {accepted} of {a.jobs} jobs accepted "
                                   f"(refusals?):\n{load.communicate(timeout=10)[0][-1500:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{case}: {accepted} of {a.jobs} jobs accepted, {final} final, "
                                   f"{in_flight} in flight after {a.timeout:g} s")
            time.sleep(0.2)
        seconds = time.monotonic() - t0
        load.send_signal(signal.SIGINT)  # wrk sleeps out -d after its thread stopped; this ends it
        run = parse_wrk(load.communicate(timeout=30)[0])
        time.sleep(1.0)  # Redis's cron trims idle clients' buffers; the one claim settles
        after = snapshot(redis)
        final_figures = scrape(port)

        with Resp(redis.port, timeout=60) as conn:  # replies as lists: SCAN, HGETALL
            samples, others = scan_keys(conn, time.monotonic() + a.timeout)
            # A job in the state measured (not the one the sleeping worker runs), else the first.
            wanted = "queued" if case == "queued" else "succeeded"
            sample = next((k for k in samples if conn.call("HGET", k, "status") == wanted),
                          samples[0] if samples else None)
            if sample is None:
                raise RuntimeError(f"{case}: no {KEY_PREFIX}:job:<id> key in Redis")
            hash_bytes = int(conn.call("MEMORY", "USAGE", sample, "SAMPLES", "0"))
            fields = conn.call("HGETALL", sample)
            sample_hash = dict(zip(fields[0::2], fields[1::2]))
            ttl_ms = int(conn.call("PTTL", sample))
            other_keys = {}
            for key in others:
                kind = conn.call("TYPE", key)
                usage = conn.call("MEMORY", "USAGE", key, "SAMPLES", "0")
                size = {"zset": "ZCARD", "set": "SCARD", "hash": "HLEN", "list": "LLEN"}.get(kind)
                other_keys[key] = {"type": kind, "bytes": int(usage or 0),
                                   "members": int(conn.call(size, key)) if size else None}
        growth = after["used_memory"] - before["used_memory"]
        return {
            "case": case, "model": spec["model"], "jobs": a.jobs, "seconds": seconds,
            "redis_version": redis_version, "before": before, "after": after,
            "bytes_per_job": growth / a.jobs,
            "dataset_bytes_per_job": (after["used_memory_dataset"] - before["used_memory_dataset"]) / a.jobs,
            "keys_per_job": (after["dbsize"] - before["dbsize"]) / a.jobs,
            "accepted": total([final_figures], "rebound_jobs_accepted_total"),
            "final": total([final_figures], *COMPLETED),
            "failed": total([final_figures], *COMPLETED[1:]),
            "refused": run["non2xx"], "socket_errors": run["socket_errors"],
            "sample_key": sample, "sample_hash_bytes": hash_bytes, "sample_hash_fields": len(sample_hash),
            "sample_hash": sample_hash, "sample_pttl_ms": ttl_ms,
            "other_keys": other_keys,
            "other_keys_bytes_per_job": sum(k["bytes"] for k in other_keys.values()) / a.jobs,
        }
    finally:
        if load is not None and load.poll() is None:
            load.kill()
            load.wait()
        if server is not None:
            server.stop(signal.SIGKILL if case == "queued" else signal.SIGTERM)
        redis.stop()


def table(results: list[dict]) -> str:
    lines = ["| job | Redis bytes per job | keys per job | one job's hash: bytes (MEMORY USAGE), fields |"
             " other keys: bytes per job |",
             "|---|---:|---:|---:|---:|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {CASES[r['case']]['title']} | failed | | | |")
            continue
        lines.append(f"| {CASES[r['case']]['title']} | {r['bytes_per_job']:,.0f} | {r['keys_per_job']:.2f} | "
                     f"{r['sample_hash_bytes']:,}, {r['sample_hash_fields']} | "
                     f"{r['other_keys_bytes_per_job']:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=50_000, help="jobs per measurement (default 50,000)")
    p.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    p.add_argument("--timeout", type=float, default=300,
                   help="longest wait for the jobs of one measurement, in seconds (default 300)")
    p.add_argument("--build-dir", default=os.environ.get("BUILD_DIR", str(ROOT / "build")))
    p.add_argument("--json", help="write every figure to this file")
    a = p.parse_args()
    a.server = str(Path(a.build_dir).resolve() / "examples" / "rebound-server")
    if a.jobs < 1:
        sys.exit("bench/redis_memory.py: --jobs must be at least 1")
    missing = [t for t in ("redis-server", "wrk") if shutil.which(t) is None]
    if not Path(a.server).exists():
        missing.append(f"{a.server} (run scripts/build.sh)")
    if missing:
        sys.exit("bench/redis_memory.py: missing: " + "; ".join(missing))

    results = []
    for case in CASES:
        try:
            figures = measure(a, case)
        except Exception as e:  # one failed measurement is reported, the other still runs
            figures = {"case": case, "error": str(e)}
        results.append(figures)
        log(f"{case}: " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in figures.items()
                                   if not isinstance(v, dict) and k != "case"))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))

    version = next((r["redis_version"] for r in results if "redis_version" in r), "?")
    print(f"Redis memory per rebound job, {time.strftime('%Y-%m-%d')}: {a.jobs:,} poll-only jobs per row "
          f"(bench/submit.lua bodies: an id of up to 16 characters, no input), a fresh redis-server {version} "
          f"without persistence per row; used_memory growth / jobs; default retention (24 h)")
    print(machine().replace("wrk and nginx", "wrk and redis-server"))
    print("command: " + shlex.join([str(Path(sys.argv[0])), *sys.argv[1:]]))
    print("server:  " + shlex.join(server_argv(a, "P", "redis://127.0.0.1:RP", "MODEL")).replace(
        a.server, "rebound-server") + "  (MODEL sleep:3600 queued, echo finished)")
    print()
    print(table(results))
    for r in results:
        if "other_keys" in r:
            print(f"- {r['case']}: other keys: " + "; ".join(
                f"{k} ({v['type']}, {v['members']:,} members): {v['bytes'] / r['jobs']:,.0f} B/job"
                if v["members"] is not None else f"{k} ({v['type']}): {v['bytes']:,} B"
                for k, v in r["other_keys"].items())
                + f"; sample hash fields: {', '.join(r['sample_hash'])}; PTTL {r['sample_pttl_ms']} ms")
        if r.get("failed") or r.get("refused") or r.get("socket_errors"):
            print(f"- {r['case']}: {r.get('failed', 0)} jobs failed, {r.get('refused', 0)} refusals, "
                  f"{r.get('socket_errors', 0)} socket errors")
    errors = [r for r in results if "error" in r]
    for r in errors:
        print(f"- failed: {r['case']}: {r['error']}")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
