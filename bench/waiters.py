#!/usr/bin/env python3
"""Thousands of clients waiting at once: what they cost rebound-server, and how /ping fares.

    bench/waiters.py [--clients 5000] [--rounds 3] [--build-dir build]

Each round starts rebound-server with its shipped defaults (memory store; a model that takes a
minute, so the one job stays running), opens --clients connections that each poll the job with
`Prefer: wait=30`, and, once all of them wait (rebound_http_waiting), measures the server's
resident memory added and 100 /ping round trips on new connections; then cancels the job and
times until every client has its answer. Prints the median of the rounds, with the range.
Loopback only; about 15 s a round. Needs ulimit -n above --clients + 1,000.
"""
import argparse
import asyncio
import json
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from rawhttp import exchange, free_port, get  # noqa: E402


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


async def one_round(port, pid, clients):
    body = json.dumps({"id": "held"}).encode()
    await exchange(port, b"POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    before = rss_kib(pid)
    poll = b"GET /v1/inferences/held HTTP/1.1\r\nHost: x\r\nPrefer: wait=30\r\n\r\n"
    waits = [asyncio.create_task(exchange(port, poll, 60)) for _ in range(clients)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        _, metrics, _ = await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        m = re.search(rb"^rebound_http_waiting (\d+)", metrics, re.M)
        if m and int(m.group(1)) >= clients:
            break
        await asyncio.sleep(0.1)
    else:
        raise SystemExit("the clients did not all get to wait")
    added = rss_kib(pid) - before
    pings = []
    for _ in range(100):
        status, _, seconds = await exchange(port, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200
        pings.append(seconds * 1000)
    pings.sort()
    cancelled = time.monotonic()
    await exchange(port, b"DELETE /v1/inferences/held HTTP/1.1\r\nHost: x\r\n\r\n")
    answers = await asyncio.gather(*waits)
    assert all(a[0] == 200 for a in answers), "a waiter was not answered 200"
    return {"rss_added_mib": added / 1024, "bytes_per_waiter": added * 1024 / clients,
            "ping_p50_ms": pings[49], "ping_p99_ms": pings[98],
            "all_answered_s": time.monotonic() - cancelled}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--build-dir", default=str(Path(__file__).resolve().parent.parent / "build"))
    a = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = str(Path(a.build_dir) / "examples" / "rebound-server")
    results = []
    for r in range(a.rounds):
        port = free_port()
        proc = subprocess.Popen([server, "serve", "--host", "127.0.0.1", "--port", str(port),
                                 "--store", "memory", "--model", "sleep:60", "--workers", "1",
                                 "--log-level", "warn"], cwd=tempfile.mkdtemp(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    if get(port, "/ping", timeout=0.5)[0] == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.05)
            results.append(asyncio.run(one_round(port, proc.pid, a.clients)))
            print(f"round {r + 1}: " + " ".join(f"{k}={v:.3g}" for k, v in results[-1].items()),
                  file=sys.stderr, flush=True)
        finally:
            proc.kill()
            proc.wait()

    def cell(key, fmt):
        values = [x[key] for x in results]
        return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"

    print(f"{a.clients:,} clients waiting (Prefer: wait=30) at once, median of {a.rounds} rounds:")
    print(f"| resident memory added | {cell('rss_added_mib', lambda v: f'{v:.1f} MiB')} |")
    print(f"| per waiter | {cell('bytes_per_waiter', lambda v: f'{v:,.0f} B')} |")
    print(f"| /ping p50 during | {cell('ping_p50_ms', lambda v: f'{v:.2f} ms')} |")
    print(f"| /ping p99 during | {cell('ping_p99_ms', lambda v: f'{v:.2f} ms')} |")
    print(f"| all answered after the cancel | {cell('all_answered_s', lambda v: f'{v:.2f} s')} |")


main()
