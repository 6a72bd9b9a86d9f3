#!/usr/bin/env python3
"""Healthy callbacks answered per half second, over one run of bench/run.py's receiver scenarios.

    bench/receivers_timeline.py                       # memory store, with the hung receiver
    bench/receivers_timeline.py --no-hung             # the same without it (bench/run.py's "slow")
    bench/receivers_timeline.py --binary /tmp/before/rebound-server --store sqlite:jobs.db
    bench/receivers_timeline.py --server-args "--callback-timeout 6"   # the circuit opens at 6 s

bench/run.py gives one figure per run (callbacks answered per second over 10 s); this shows how
they are spread in time, so that a moment when deliveries stall (a circuit opening, a renewal
pass) stands out from a steady loss. The scenario is bench/run.py's: wrk submits echo jobs over 32
connections for --seconds + 3 s, their callbacks going in turn to 8 receivers (origins) that each
answer after 200 ms (bench/slow_receiver.cpp), and with the hung receiver 1 job in 20 to one that
accepts and never answers. Prints one line: "seconds since the load started:callbacks a second"
for each half second. Needs a build (scripts/build.sh), wrk; everything on loopback; only the
processes started here are stopped.
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import time
from pathlib import Path

import run as bench  # bench/run.py: the servers, receivers and wrk settings it measures with


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=str(bench.ROOT / "build"))
    p.add_argument("--binary", help="the rebound-server to run (default: the build's)")
    p.add_argument("--store", default="memory", help="--store of the server (default memory)")
    p.add_argument("--no-hung", action="store_true", help="no hung receiver")
    p.add_argument("--seconds", type=float, default=22, help="seconds shown (default 22)")
    p.add_argument("--server-args", default="",
                   help="more rebound-server options, one string (\"--callback-timeout 6\")")
    a = p.parse_args()
    binary = str(Path(a.binary or Path(a.build_dir) / "examples" / "rebound-server").resolve())
    receivers = bench.SlowReceivers(a.build_dir, not a.no_hung)
    server = None
    load = None
    try:
        port = bench.free_port()
        server = bench.Server("rebound", [
            binary, "serve", "--host", "127.0.0.1", "--port", str(port), "--model", "echo",
            "--store", a.store, "--workers", "2", "--queue-capacity", "1000000",
            "--allow-private-callbacks", "--log-level", "warn", *a.server_args.split()], port)
        urls = receivers.urls()
        load = subprocess.Popen(
            ["wrk", "-t1", "-c32", f"-d{round(a.seconds + 3)}s", "-s", str(bench.BENCH / "submit.lua"),
             f"http://127.0.0.1:{port}"],
            env=bench.wrk_env(urls[0], False, urls), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        t0 = last_t = time.monotonic()
        last_n = receivers.answered()
        points = []
        while last_t - t0 < a.seconds:
            time.sleep(0.5)
            t, n = time.monotonic(), receivers.answered()
            points.append(f"{t - t0:.1f}:{round((n - last_n) / (t - last_t))}")
            last_t, last_n = t, n
        print(" ".join(points))
    finally:
        if load is not None:
            load.terminate()
            load.wait()
        if server is not None:
            server.stop(signal.SIGKILL)
        receivers.stop()


if __name__ == "__main__":
    main()
