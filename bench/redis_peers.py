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

  rebound-K  K rebound-servers (1, 2, 3) on the one Redis (--store redis://...), the echo model
             (or --model), --workers W each. The jobs are submitted over HTTP: one wrk per server
             (bench/submit.lua with SUBMIT_JOBS), each with its share of the N jobs and of
             --connections, and stopping once its share is accepted (202). The run ends when the
             servers' own counters (GET /metrics, summed) show N jobs final (poll) or N callbacks
             delivered (callback) and none of the work in flight, the stores' writes included.
  rebound-1-batch
             one rebound-server, its jobs submitted --batch at a time (POST /v1/inferences:batch,
             SUBMIT_BATCH in bench/submit.lua), as BullMQ's producer adds its jobs in bulk,
             over --batch-connections connections (a server takes a quarter of its
             --store-threads batches at once and answers 503 to more: 4 with the default 16).
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

--costs shows where that Redis CPU goes. Each trial's redis-server, as soon as it answers and before
the system under test starts, is set to log every command (CONFIG SET slowlog-log-slower-than 0,
slowlog-max-len 2000000, then CONFIG RESETSTAT and SLOWLOG RESET). The entries logged within the
measured window (the slowlog ids at its two ends; this script's own connection, named
redis-peers-costs, left out) are grouped by command, and an EVALSHA by the script it runs: rebound's
by name (put, claim, finish, batch, ...: the SHA1 of every script text as put together from the .lua
files of src/store/redis, both with and without Redis 7's "#!lua flags=allow-oom" line), BullMQ's as "bullmq <SHA1's first 8 hex> <its name>" (the names from the installed
BullMQ), and any other as "script <8 hex>". Redis 7 logs the commands a script runs too (client
"?:0", just before the script's own entry): they are counted with their script, not on their own. A
table per trial, after the main one, gives for each group the calls and the execution time (the
slowlog's durations, µs; a script's includes the commands it runs, shown beside it) per job, their
sum, and Redis CPU per job less that sum: what Redis spends outside the commands, on reading
requests and writing replies, in its event loop, and on the slowlog itself. (The slowlog's durations
are wall-clock time: where redis-server shares busy cores, a command it is preempted in looks
longer, and that difference shrinks, even below 0.) --json keeps the same per trial ("costs", with
each script's commands by name), and INFO commandstats' growth over the window per job (there a
script's commands count on their own as well as in the script's time). Logging every command costs
Redis some CPU and memory of its own, so the jobs/s, Redis CPU and memory of a --costs run are not
the main table's figures: compare a --costs run with another --costs run.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import (BENCH, ROOT, Lines, Receiver, Server, cell, end_helper, fmt_int,  # noqa: E402
                 free_port, http_get, log, machine, parse_wrk)

BULLMQ = BENCH / "bullmq"

REDIS_CONFIGS = {
    "none": ("no persistence", ["--save", "", "--appendonly", "no"]),
    "aof": ("AOF everysec", ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"]),
}
MODES = {"poll": "poll only", "callback": "with callback"}
SYSTEMS = {"rebound-1": "rebound, 1 server", "rebound-2": "rebound, 2 servers",
           "rebound-3": "rebound, 3 servers", "rebound-1-batch": "rebound, 1 server, batches",
           "bullmq": "BullMQ"}


class RespError(Exception):
    """An error reply from redis-server."""


class Resp:
    """One connection to redis-server speaking RESP2: commands in, replies out, arrays nested to any
    depth (a status or bulk string as text, an integer as int, a nil as None, an error inside an
    array as a RespError value, an error at the top raised). Every call has a deadline, however
    large its reply (SLOWLOG GET -1 may run to tens of MB)."""

    def __init__(self, port: int, timeout: float = 5.0, name: str | None = None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.timeout = timeout
        self.buf = bytearray()
        self.pos = 0
        if name:
            self.call("CLIENT", "SETNAME", name)

    def __enter__(self) -> "Resp":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def call(self, *args: str, timeout: float | None = None):
        encoded = [a.encode() if isinstance(a, str) else bytes(a) for a in args]
        self.sock.sendall(b"*%d\r\n" % len(encoded) + b"".join(
            b"$%d\r\n%s\r\n" % (len(a), a) for a in encoded))
        self.deadline = time.monotonic() + (timeout or self.timeout)
        reply = self._value()
        del self.buf[:self.pos]  # one reply per call: nothing is left over
        self.pos = 0
        if isinstance(reply, RespError):
            raise reply
        return reply

    def _fill(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("redis-server did not answer in time")
        self.sock.settimeout(left)
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("redis-server closed the connection")
        self.buf += chunk

    def _line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n", self.pos)
            if end >= 0:
                line = bytes(self.buf[self.pos:end])
                self.pos = end + 2
                return line
            self._fill()

    def _value(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode("utf-8", "replace")
        if kind == b":":
            return int(rest)
        if kind == b"-":
            return RespError(f"redis-server: {rest.decode('utf-8', 'replace')}")
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            while len(self.buf) - self.pos < size + 2:
                self._fill()
            value = bytes(self.buf[self.pos:self.pos + size]).decode("utf-8", "replace")
            self.pos += size + 2
            return value
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self._value() for _ in range(size)]
        raise RuntimeError(f"unexpected answer from redis-server: {line[:80]!r}")


def redis_call(port: int, *args: str, timeout: float = 5.0) -> str:
    """One command on a connection of its own; the answer of a status, integer or bulk string reply,
    as text."""
    with Resp(port, timeout) as c:
        return str(c.call(*args))


class RedisServer:
    """A fresh redis-server on a free loopback port, in a temporary folder of its own."""

    def __init__(self, config: str, costs: bool = False):
        self.conn: Resp | None = None  # with --costs: one connection, named, for every call here
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
        if costs:
            # Every command into the slowlog, with room for all of a trial's, and counters from 0;
            # before the system under test starts, so that none of its commands is missed.
            self.conn = Resp(self.port, name=COSTS_CLIENT)
            for command in (("CONFIG", "SET", "slowlog-log-slower-than", "0"),
                            ("CONFIG", "SET", "slowlog-max-len", "2000000"),
                            ("CONFIG", "RESETSTAT"), ("SLOWLOG", "RESET")):
                self.conn.call(*command)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def call(self, *args: str, timeout: float = 5.0):
        if self.conn is None:
            return redis_call(self.port, *args, timeout=timeout)
        return self.conn.call(*args, timeout=timeout)

    def info(self, section: str) -> dict[str, str]:
        fields = {}
        for line in self.call("INFO", section).splitlines():
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

    def costs_mark(self) -> dict:
        """With --costs, at either end of the measured window: the newest slowlog entry's id and the
        command counters (INFO commandstats)."""
        newest = self.call("SLOWLOG", "GET", "1")
        stats = {}
        for key, value in self.info("commandstats").items():
            fields = dict(f.split("=", 1) for f in value.split(",") if "=" in f)
            stats[key.removeprefix("cmdstat_")] = (int(fields["calls"]), int(fields["usec"]))
        return {"slowlog_id": newest[0][0] if newest else -1, "commandstats": stats}

    def costs(self, start: dict, end: dict, jobs: int, names: dict[str, str], unknown: str) -> dict:
        """What the system ran on Redis between the two marks, per job: from the slowlog, its commands
        and scripts (EVALSHA, by script) with their calls and execution time; from INFO
        commandstats, every command's calls and time, those run inside scripts included."""
        entries = self.call("SLOWLOG", "GET", "-1", timeout=300)  # newest first
        # group -> [calls, µs, {command run inside it: [calls, µs]}]
        groups: dict[str, list] = {}
        inside: list[tuple[str, int]] = []  # a script's commands, logged just before the script
        seen = 0
        for entry in reversed(entries):  # oldest first
            entry_id, duration, args = entry[0], entry[2], entry[3]
            client_addr = entry[4] if len(entry) > 4 else ""
            client_name = entry[5] if len(entry) > 5 else ""
            if entry_id <= start["slowlog_id"] or entry_id > end["slowlog_id"]:
                continue
            seen += 1
            if client_addr == SCRIPT_CLIENT:  # run by a script: its time is in the script's
                inside.append((command_group(args, names, unknown), duration))
                continue
            if client_name == COSTS_CLIENT:
                inside.clear()
                continue
            group = groups.setdefault(command_group(args, names, unknown), [0, 0, {}])
            group[0] += 1
            group[1] += duration
            for cmd, usec in inside:
                counts = group[2].setdefault(cmd, [0, 0])
                counts[0] += 1
                counts[1] += usec
            inside.clear()
        # The oldest entry of the window still there (the log keeps --costs' 2,000,000 at most).
        lost = bool(entries) and entries[-1][0] > start["slowlog_id"] + 1
        commandstats = {}
        for cmd, (calls, usec) in end["commandstats"].items():
            calls0, usec0 = start["commandstats"].get(cmd, (0, 0))
            if calls > calls0:
                commandstats[cmd] = {"calls_per_job": (calls - calls0) / jobs,
                                     "us_per_job": (usec - usec0) / jobs}
        ordered = sorted(groups.items(), key=lambda g: (-g[1][1], -g[1][0], g[0]))

        def group(calls: int, usec: int, inner: dict) -> dict:
            figures = {"calls": calls, "usec": usec, "calls_per_job": calls / jobs, "us_per_job": usec / jobs}
            if inner:
                figures["inner_calls_per_job"] = sum(c for c, _ in inner.values()) / jobs
                figures["inner_us_per_job"] = sum(u for _, u in inner.values()) / jobs
                figures["inner"] = {cmd: {"calls_per_job": c / jobs, "us_per_job": u / jobs} for cmd, (c, u)
                                    in sorted(inner.items(), key=lambda i: (-i[1][1], -i[1][0], i[0]))}
            return figures

        return {
            "groups": {k: group(*g) for k, g in ordered},
            "calls_per_job": sum(g[0] for g in groups.values()) / jobs,
            "exec_us_per_job": sum(g[1] for g in groups.values()) / jobs,
            "slowlog_entries": seen, "slowlog_lost": lost,
            "commandstats": dict(sorted(commandstats.items(), key=lambda c: -c[1]["us_per_job"])),
        }

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


COSTS_CLIENT = "redis-peers-costs"  # the name of --costs' own connection, left out of the slowlog's sums
SCRIPT_CLIENT = "?:0"  # the slowlog's client for the commands a script runs (Redis 7 logs those too)

# Commands whose first argument names what they do: grouped as "CONFIG SET", "CLIENT SETNAME", ...
CONTAINER_COMMANDS = {"ACL", "CLIENT", "CLUSTER", "COMMAND", "CONFIG", "FUNCTION", "LATENCY", "MEMORY",
                      "MODULE", "OBJECT", "PUBSUB", "SCRIPT", "SLOWLOG", "XGROUP", "XINFO"}


def command_group(args: list, names: dict[str, str], unknown: str) -> str:
    """A slowlog entry's group: a script run by EVALSHA by its name (its SHA1 looked up in `names`),
    else "<unknown> <the SHA1's first 8 hex digits>"; any other command by its name."""
    cmd = str(args[0]).upper() if args else "?"
    if cmd in ("EVALSHA", "EVALSHA_RO") and len(args) > 1:
        sha = str(args[1]).lower()
        return names.get(sha) or f"{unknown} {sha[:8]}"
    if cmd in CONTAINER_COMMANDS and len(args) > 1:
        return f"{cmd} {str(args[1]).upper()}"
    return cmd


REBOUND_SCRIPTS = ROOT / "src" / "store" / "redis"
ALLOW_OOM = "#!lua flags=allow-oom\n"


def rebound_script_names(folder: Path = REBOUND_SCRIPTS) -> dict[str, str]:
    """SHA1 -> script name ("put", "mark_running", "batch", ...) for every script of the Redis store,
    its text put together as script_text (src/store/redis/scripts.hpp) does from the .lua files:
    prelude.lua, then "local O = 0" and the script; a batch ("batch_put": puts; "batch": the rest)
    is each script it runs as a function of OPS, keyed by its number in kScriptNames, then
    dispatch.lua. Both with and without Redis 7's "#!lua flags=allow-oom" line (a put has none)."""
    try:
        lua = {f.stem: f.read_text() for f in folder.glob("*.lua")}
        order = re.search(r"kScriptNames = \{(.*?)\};", (folder / "scripts.hpp").read_text(), re.S)
        numbers = {name: i for i, name in enumerate(re.findall(r'"(\w+)"', order.group(1)))}
    except (OSError, AttributeError) as e:
        log(f"--costs: cannot read the scripts in {folder} ({e}); rebound's are named by SHA1 only")
        return {}
    prelude = lua.get("prelude", "")
    texts = {name: prelude + "local O = 0\n" + lua[name] for name in numbers if name in lua}
    # (batched_scripts in scripts.hpp)
    for label, ops in (("batch_put", ["put"]),
                       ("batch", ["mark_running", "finish", "record_attempt", "renew"])):
        text = prelude + "local OPS = {}\n"
        for op in ops:
            text += f"OPS['{numbers[op]}'] = function(ARGV, O)\n" + lua[op] + "\nend\n"
        texts[label] = text + lua.get("dispatch", "")
    names = {}
    for label, text in texts.items():
        for flags in ("", ALLOW_OOM):
            names.setdefault(hashlib.sha1((flags + text).encode()).hexdigest(), label)
    return names


def bullmq_script_names() -> dict[str, str]:
    """SHA1 -> "bullmq <8 hex> <name>" for the scripts of the installed BullMQ (ioredis runs each by the
    SHA1 of its text); empty, and its scripts named by SHA1 only, where that cannot be read."""
    program = ("const s = require('bullmq/dist/cjs/scripts'); const c = require('crypto');"
               "for (const k in s) console.log(c.createHash('sha1').update(s[k].content).digest('hex'), s[k].name);")
    try:
        out = subprocess.run(["node", "-e", program], cwd=BULLMQ, capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        log(f"--costs: cannot list BullMQ's scripts ({e}); they are named by SHA1 only")
        return {}
    return {sha: f"bullmq {sha[:8]} {name}" for sha, name in
            (line.split(" ", 1) for line in out.splitlines() if " " in line)}


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


def run_rebound(a, redis: RedisServer, count: int, receiver: Receiver | None,
                batch: int = 0) -> dict:
    servers, wrks = [], []
    try:
        for i in range(count):
            port = free_port()
            servers.append(Server(f"rebound-server {i + 1} of {count}", [
                a.server, "serve", "--host", "127.0.0.1", "--port", str(port), "--model", a.model,
                "--store", redis.url, "--workers", str(a.workers),
                "--queue-capacity", str(max(1_000_000, a.jobs)), "--allow-private-callbacks",
                "--log-level", "warn"], port))
        time.sleep(a.settle)  # past the servers' start: their first claims and reports
        shares = [a.jobs // count + (i < a.jobs % count) for i in range(count)]
        connections = max(1, (a.batch_connections if batch else a.connections) // count)
        before = redis.usage()
        start = redis.costs_mark() if a.costs else None
        t0 = time.monotonic()
        for srv, share in zip(servers, shares):
            wrks.append(subprocess.Popen(
                ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(a.trial_timeout))}s", "-s",
                 str(BENCH / "submit.lua"), f"http://127.0.0.1:{srv.port}"],
                env={**os.environ, "SUBMIT_JOBS": str(share),
                     "CALLBACK_URL": receiver.url if receiver else "", "CALLBACK_URLS": "",
                     **({"SUBMIT_BATCH": str(batch)} if batch else {})},
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
        end = redis.costs_mark() if a.costs else None
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
        if a.costs:
            result["costs"] = with_overhead(redis.costs(start, end, a.jobs, a.rebound_names, "script"),
                                            result)
        return result
    finally:
        for w in wrks:
            if w.poll() is None:
                w.kill()
                w.wait()
        for srv in servers:
            srv.stop()


def run_bullmq(a, redis: RedisServer, receiver: Receiver | None) -> dict:
    argv = ["node", str(BULLMQ / "bench.mjs"), "--redis-port", str(redis.port), "--jobs", str(a.jobs),
            "--concurrency", str(a.bullmq_concurrency), "--chunk", str(a.bullmq_chunk),
            "--timeout", str(a.trial_timeout)]
    if receiver is not None:
        argv += ["--callback-url", receiver.url]
    errors = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(argv, cwd=BULLMQ, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=errors, text=True)
    failed = False
    try:
        lines = Lines(proc.stdout, "bench/bullmq/bench.mjs")
        ready = lines.next_json(60, "ready line")
        before = redis.usage()
        start = redis.costs_mark() if a.costs else None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = lines.next_json(a.trial_timeout + 30, "result")
        after = redis.usage()
        end = redis.costs_mark() if a.costs else None
        if result["timed_out"] or result["completed"] + result["failed"] < a.jobs:
            raise RuntimeError(f"BullMQ: {result['completed']} of {a.jobs} jobs completed, "
                               f"{result['failed']} failed, in {result['seconds']:.1f} s")
        figures = {
            "jobs": a.jobs, "seconds": result["seconds"], "jobs_per_s": a.jobs / result["seconds"],
            **usage_per_job(before, after, a.jobs),
            "failed": result["failed"], "first_error": result["first_error"],
            "submit_seconds": result["submit_seconds"], "bullmq": ready["bullmq"], "node": ready["node"],
        }
        if a.costs:
            figures["costs"] = with_overhead(redis.costs(start, end, a.jobs, a.bullmq_names, "bullmq"),
                                             figures)
        return figures
    except Exception:
        failed = True
        raise
    finally:
        end_helper(proc, errors, failed)


def with_overhead(costs: dict, figures: dict) -> dict:
    """Redis's CPU per job less the commands' execution: its I/O and event loop (and the slowlog)."""
    costs["redis_cpu_us_per_job"] = figures["redis_cpu_us_per_job"]
    costs["overhead_us_per_job"] = figures["redis_cpu_us_per_job"] - costs["exec_us_per_job"]
    return costs


def trial(a, config: str, mode: str, system: str) -> dict:
    redis = RedisServer(config, costs=a.costs)
    receiver = Receiver() if mode == "callback" else None
    try:
        if system == "bullmq":
            result = run_bullmq(a, redis, receiver)
        else:
            if system == "rebound-1-batch":
                result = run_rebound(a, redis, 1, receiver, a.batch)
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


def costs_tables(results: list[dict]) -> str:
    """--costs: per trial, what Redis ran per job, by command and by script (from the slowlog)."""
    us = lambda x: f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}"
    out = []
    for r in results:
        costs = r.get("costs")
        if not costs:
            continue
        out += ["", f"Redis per job, round {r['round']}, {REDIS_CONFIGS[r['redis']][0]}, {MODES[r['mode']]}, "
                f"{SYSTEMS[r['system']]} (--costs: every command in the slowlog; "
                f"{costs['slowlog_entries']:,} entries" + (", some LOST: the log was full" if costs["slowlog_lost"]
                                                           else "") + ")", "",
                "| command or script | calls/job | execution µs/job | commands it ran/job | their µs/job |",
                "|---|---:|---:|---:|---:|"]
        for name, g in costs["groups"].items():
            inner = (f"{g['inner_calls_per_job']:.3g} | {us(g['inner_us_per_job'])}" if "inner" in g
                     else " | ")
            out.append(f"| {name} | {g['calls_per_job']:.3g} | {us(g['us_per_job'])} | {inner} |")
        out.append(f"| all commands | {costs['calls_per_job']:.3g} | {us(costs['exec_us_per_job'])} | | |")
        out.append(f"| Redis CPU (INFO cpu) | | {us(costs['redis_cpu_us_per_job'])} | | |")
        out.append(f"| CPU less execution: I/O, event loop | | {us(costs['overhead_us_per_job'])} | | |")
    return "\n".join(out)


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
                   help="only this system (repeatable; default all five)")
    p.add_argument("--connections", type=int, default=32,
                   help="wrk connections in all, shared among rebound's servers (default 32)")
    p.add_argument("--workers", type=int, default=2, help="rebound-server --workers (default 2, its own)")
    p.add_argument("--model", default="echo",
                   help="rebound-server --model (default echo; sleep:<seconds> for jobs that take the "
                   "time of a model without its CPU: what a fleet of servers adds when the model, not "
                   "the machine, is the limit). rebound's systems only: BullMQ's job is a no-op")
    p.add_argument("--bullmq-concurrency", type=int, default=64, help="the BullMQ Worker's concurrency "
                   "(default 64, as many as rebound's callbacks in flight to one receiver)")
    p.add_argument("--bullmq-chunk", type=int, default=1000, help="jobs per Queue.addBulk (default 1,000)")
    p.add_argument("--batch", type=int, default=100,
                   help="jobs per request of rebound-1-batch (default 100; at most 1,000)")
    p.add_argument("--batch-connections", type=int, default=4,
                   help="wrk connections of rebound-1-batch (default 4: a server takes a quarter of "
                   "its --store-threads (16) in batches at once, and refuses more with 503, which "
                   "stops a wrk connection)")
    p.add_argument("--settle", type=float, default=0.5, help="seconds between the start and the load")
    p.add_argument("--trial-timeout", type=float, default=300, help="longest trial, in seconds (default 300)")
    p.add_argument("--build-dir", default=os.environ.get("BUILD_DIR", str(ROOT / "build")))
    p.add_argument("--json", help="write every trial's figures to this file")
    p.add_argument("--costs", action="store_true",
                   help="log every Redis command (slowlog) and report, per trial, each command's and "
                   "script's calls and execution time per job (see above)")
    a = p.parse_args()
    a.redis = a.redis or list(REDIS_CONFIGS)
    a.modes = a.modes or list(MODES)
    a.systems = a.systems or list(SYSTEMS)
    a.server = str(Path(a.build_dir).resolve() / "examples" / "rebound-server")
    if a.jobs < 1 or a.rounds < 1:
        sys.exit("bench/redis_peers.py: --jobs and --rounds must be at least 1")
    if a.model != "echo" and "bullmq" in a.systems:
        sys.exit("bench/redis_peers.py: --model is for rebound's systems (BullMQ's job is a no-op): "
                 "name them with --systems")
    check_prerequisites(a)
    a.rebound_names = rebound_script_names() if a.costs else {}
    a.bullmq_names = bullmq_script_names() if a.costs and "bullmq" in a.systems else {}

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
                    costs = figures.get("costs")
                    log(f"round {r}/{a.rounds} {config:4} {mode:8} {system:9} " + " ".join(
                        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()
                        if k != "costs") + (f" exec_us_per_job={costs['exec_us_per_job']:.4g} "
                                            f"overhead_us_per_job={costs['overhead_us_per_job']:.4g}"
                                            if costs else ""))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))

    versions = next(((r["bullmq"], r["node"]) for r in results if "bullmq" in r), None)
    print(f"rebound and BullMQ on one Redis, {time.strftime('%Y-%m-%d')}: {a.jobs:,} jobs per trial, "
          f"median of {a.rounds} rounds (range in brackets), a fresh redis-server per trial; "
          f"rebound-server --workers {a.workers}, {a.model} model, wrk with {a.connections} connections in all"
          + (f" (batches of {a.batch})" if "rebound-1-batch" in a.systems else "") + "; "
          + (f"BullMQ {versions[0]} on Node {versions[1]}, one Worker, concurrency {a.bullmq_concurrency}; "
             if versions else "")
          + f"{time.monotonic() - started:.0f} s in all")
    print(machine() + "; redis-server and Node too")
    print()
    print(table(a, results))
    if a.costs:
        print(costs_tables(results))
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
