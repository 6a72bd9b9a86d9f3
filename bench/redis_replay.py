#!/usr/bin/env python3
"""What a job costs Redis in instructions: one trial's commands, recorded and replayed under callgrind.

    bench/redis_replay.py --build-dir build-core
    bench/redis_replay.py --build-dir /tmp/before/build --build-dir build-core --jobs 5000

Redis CPU per job (bench/redis_peers.py) is time on a shared machine, and moves by 10 to 30 % from
one trial to the next. This counts instructions instead, which do not move: for each build, one
trial of bench/redis_peers.py's `rebound-1-batch` system (one rebound-server, its jobs submitted in
batches, --mode poll or callback, on a fresh redis-server without persistence) runs with a MONITOR
connection that records every command the server sends. The record is then replayed, in order,
into a fresh redis-server run under `valgrind --tool=callgrind` (--hz 1, so that its timers add
little), once without persistence and once with AOF everysec, with the same scripts: the figure is
redis-server's instructions over the replay, less those of a replay of nothing (its start and
stop), divided by the jobs. The replay sends the commands on one connection, eight at a time,
and reads every reply: it stops at an error anywhere in a reply (a dispatch call answers each of
its calls apart), and checks that every job ended (`{rebound}:unfinished` is empty at the end).

Two builds side by side (repeat --build-dir): records of different trials differ (how the writes
fall into batches depends on timing: a job's mark_running costs two commands when it is not folded
into its finish), so each build also replays the first build's record with its own scripts, which
is the same work to the command ("first build's trial" columns); the last column says whether
that replay left every sorted set (members and scores) as the first build's own did. For that, each later build's
rebound-server is started once against an empty redis-server to record the scripts it loads (in
the same order; builds whose scripts take other arguments cannot be compared this way). The
figures count only instructions of redis-server's own process (not the kernel's part of its AOF
writes), and valgrind's start is the same in every run.

--bullmq also records one trial of bench/redis_peers.py's `bullmq` system (the same jobs, added in
bulk, completed by one Worker; with --mode callback its processor POSTs each result first) and
replays it the same way: its Worker's blocking pop of the queue's marker (BZPOPMIN) is sent as a
ZPOPMIN, the replay answers NOSCRIPT where the trial did (ioredis then sends the script's text), and
it checks that every job ended completed. Time (bench/redis_peers.py) counts what instructions do
not: the kernel's work for every command and round trip, of which BullMQ, a script call or two a
job, has more than rebound's batches.

Needs valgrind, and what bench/redis_peers.py needs for one rebound trial (redis-server, wrk,
nginx-light for --mode callback). About a minute a build.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import redis_peers  # noqa: E402

ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", '"': b'"', "\\": b"\\"}
SKIPPED = {b"MONITOR", b"INFO", b"CLIENT", b"CONFIG", b"SLOWLOG", b"HELLO", b"PING", b"AUTH", b"SELECT",
           b"QUIT"}


def unquote(text: str) -> bytes:
    """One argument as MONITOR quotes it (sdscatrepr) back to its bytes."""
    out, i = bytearray(), 0
    while i < len(text):
        if text[i] == "\\":
            if text[i + 1] == "x":
                out.append(int(text[i + 2:i + 4], 16))
                i += 4
            else:
                out += ESCAPES[text[i + 1]]
                i += 2
        else:
            out.append(ord(text[i]))
            i += 1
    return bytes(out)


def commands_of(record: bytes) -> list[list[bytes]]:
    """The commands clients sent, in order (those scripts ran, and the connection's own, left out)."""
    out = []
    for line in record.decode("latin-1").split("\r\n"):
        m = re.match(r'\+[\d.]+ \[\d+ ([^\]]+)\] (.*)$', line)
        if not m or m.group(1) == "lua":
            continue
        args = [unquote(a) for a in re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2))]
        if args and args[0].upper() not in SKIPPED:
            out.append(args)
    return out


class Monitor:
    """A MONITOR connection to a redis-server, reading everything it is sent on a thread of its own."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"MONITOR\r\n")
        self.data = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while chunk := self.sock.recv(1 << 20):
            self.data.extend(chunk)

    def stop(self) -> list[list[bytes]]:
        """The commands seen, once the last replies have come in (half a second)."""
        time.sleep(0.5)
        self.sock.shutdown(socket.SHUT_RDWR)
        self.reader.join(5)
        self.sock.close()
        return commands_of(bytes(self.data))


def record_trial(build_dir: Path, jobs: int, mode: str,
                 system: str = "rebound-1-batch") -> tuple[list[list[bytes]], dict]:
    """One trial of bench/redis_peers.py's `system`, every command sent to Redis recorded; and the
    trial's figures."""
    a = argparse.Namespace(jobs=jobs, rounds=1, connections=32, workers=2, model="echo",
                           bullmq_concurrency=64, bullmq_chunk=1000, batch=100, batch_connections=8,
                           settle=1.0, trial_timeout=120, costs=False, build_dir=str(build_dir),
                           server=str(build_dir / "examples" / "rebound-server"))
    monitor: dict = {}
    start, stop = redis_peers.RedisServer.__init__, redis_peers.RedisServer.stop

    def started(self, config, costs=False):
        start(self, config, costs)
        monitor["on"] = Monitor(self.port)

    def stopped(self):
        monitor["commands"] = monitor["on"].stop()
        stop(self)

    redis_peers.RedisServer.__init__, redis_peers.RedisServer.stop = started, stopped
    try:
        result = redis_peers.trial(a, "none", mode, system)
    finally:
        redis_peers.RedisServer.__init__, redis_peers.RedisServer.stop = start, stop
    if "error" in result:
        raise RuntimeError(f"the trial failed: {result['error']}")
    return monitor["commands"], result


def replayable(commands: list[list[bytes]]) -> list[list[bytes]]:
    """BullMQ's record made replayable on one connection: its Worker's blocking pop of the queue's
    marker (BZPOPMIN, which waits only when the marker is empty) is sent as ZPOPMIN, the same pop
    without the wait. Any other blocking command is refused."""
    out = []
    for c in commands:
        name = c[0].upper()
        if name == b"BZPOPMIN" and len(c) == 3:
            out.append([b"ZPOPMIN", c[1]])
        elif name in (b"BLPOP", b"BRPOP", b"BRPOPLPUSH", b"BLMOVE", b"BZPOPMAX", b"BZMPOP", b"BLMPOP",
                      b"XREAD", b"XREADGROUP", b"WAIT"):
            raise RuntimeError(f"BullMQ's record has {name.decode()}: not replayable here")
        else:
            out.append(c)
    return out


def record_scripts(build_dir: Path) -> list[bytes]:
    """The scripts a build's rebound-server loads at its start, in order."""
    redis = redis_peers.RedisServer("none")
    try:
        monitor = Monitor(redis.port)
        port = redis_peers.free_port()
        server = redis_peers.Server("rebound-server (its scripts)", [
            str(build_dir / "examples" / "rebound-server"), "serve", "--host", "127.0.0.1", "--port",
            str(port), "--model", "echo", "--store", redis.url, "--log-level", "warn"], port)
        server.stop()
        commands = monitor.stop()
    finally:
        redis.stop()
    return [c[2] for c in commands if c[0].upper() == b"SCRIPT"]


def with_scripts(commands: list[list[bytes]], scripts: list[bytes]) -> list[list[bytes]]:
    """`commands` with the scripts they load (in order) replaced by `scripts`."""
    loads = [c for c in commands if c[0].upper() == b"SCRIPT"]
    if len(loads) != len(scripts):
        raise RuntimeError(f"the builds load {len(loads)} and {len(scripts)} scripts: not comparable")
    sha = lambda text: hashlib.sha1(text).hexdigest().encode()
    renamed = {}
    for load, text in zip(loads, scripts):
        renamed[sha(load[2])] = sha(text)
        load[2] = text
    for c in commands:
        if c[0].upper() == b"EVALSHA":
            c[1] = renamed.get(c[1].lower(), c[1])
    return commands


class Connection:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=600)
        self.file = self.sock.makefile("rb")

    def send(self, commands: list[list[bytes]]) -> None:
        out = []
        for args in commands:
            out.append(b"*%d\r\n" % len(args))
            for arg in args:
                out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
        self.sock.sendall(b"".join(out))

    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind in (b"+", b":"):
            return rest
        if kind == b"-":
            return RuntimeError(rest.decode())
        if kind == b"$":
            return None if int(rest) < 0 else self.file.read(int(rest) + 2)[:-2]
        if kind == b"*":
            return [self.read() for _ in range(max(0, int(rest)))]
        raise RuntimeError(f"unexpected reply {line!r}")

    def call(self, *args: bytes):
        self.send([list(args)])
        return self.read()


# (ioredis sends a script by its SHA1 first, and its text when Redis answers NOSCRIPT: the same
# happens in the replay.)
EXPECTED_ERRORS = ("NOSCRIPT",)

SETS = (b"{rebound}:jobs:due", b"{rebound}:queued", b"{rebound}:unfinished", b"{rebound}:jobs",
        b"{rebound}:callbacks:due", b"{rebound}:callbacks:failed")


def replay(commands: list[list[bytes]], aof: bool,
           count: bytes = b"{rebound}:unfinished") -> tuple[int, bytes, str]:
    """Instructions redis-server ran for `commands`, under callgrind; the size of the sorted set
    `count` at the end (rebound's unfinished jobs, BullMQ's completed ones); and a digest of
    rebound's sorted sets at the end (members and scores)."""
    folder = Path(tempfile.mkdtemp(prefix="rebound-replay-"))
    port = redis_peers.free_port()
    out = folder / "callgrind.out"
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "redis-server", "--port",
         str(port), "--bind", "127.0.0.1", "--dir", str(folder), "--save", "", "--hz", "1",
         "--appendonly", "yes" if aof else "no", "--appendfsync", "everysec",
         "--auto-aof-rewrite-percentage", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = Connection(port)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server under valgrind did not start")
                time.sleep(0.1)
        pending: list[list[bytes]] = []

        errors = []

        def collect(reply) -> None:
            if isinstance(reply, RuntimeError):
                if not str(reply).startswith(EXPECTED_ERRORS):
                    errors.append(str(reply))
            elif isinstance(reply, list):
                for element in reply:
                    collect(element)

        def flush():
            conn.send(pending)
            for _ in pending:
                collect(conn.read())
            pending.clear()
        for args in commands:
            pending.append(args)
            if len(pending) == 8:
                flush()
        flush()
        if errors:
            raise RuntimeError(f"{len(errors)} commands failed in the replay, the first: {errors[0]}")
        unfinished = conn.call(b"ZCARD", count)
        digest = hashlib.sha1()
        for key in SETS:
            for item in conn.call(b"ZRANGE", key, b"0", b"-1", b"WITHSCORES") or []:
                digest.update(item + b"\0")
            digest.update(b"\1")
        conn.send([[b"SHUTDOWN", b"NOSAVE"]])  # (no answer: the connection closes)
    except BaseException:
        server.kill()
        raise
    finally:
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    total = 0
    for line in out.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            total = int(line.split()[1])
    for f in folder.rglob("*"):
        if f.is_file():
            f.unlink()
    for d in sorted(folder.rglob("*"), reverse=True):
        d.rmdir()
    folder.rmdir()
    return total, unfinished, digest.hexdigest()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", action="append", required=True,
                   help="a build with examples/rebound-server (repeatable: builds side by side)")
    p.add_argument("--jobs", type=int, default=5000, help="jobs in the recorded trial (default 5,000)")
    p.add_argument("--mode", choices=("poll", "callback"), default="callback")
    p.add_argument("--bullmq", action="store_true",
                   help="also record and replay one trial of BullMQ (bench/redis_peers.py's bullmq "
                   "system: the same jobs, added in bulk and completed by one Worker)")
    a = p.parse_args()
    idle = {aof: replay([], aof)[0] for aof in (False, True)}

    def per_job(commands: list[list[bytes]], build: str) -> tuple[list[float], str]:
        figures, digests = [], set()
        for aof in (False, True):
            total, unfinished, digest = replay(commands, aof)
            if unfinished not in (b"0", 0):
                raise RuntimeError(f"{build}: the replay left {unfinished!r} jobs unfinished")
            figures.append((total - idle[aof]) / a.jobs / 1000)
            digests.add(digest)
        return figures, digests.pop() if len(digests) == 1 else "differs with AOF"

    rows, first = [], None
    for build in a.build_dir:
        build_dir = Path(build).resolve()
        commands, _ = record_trial(build_dir, a.jobs, a.mode)
        scripts = sum(1 for c in commands if c[0].upper() == b"EVALSHA")
        own, sets = per_job(commands, build)
        if first is None:
            first, same, first_sets, match = commands, own, sets, "(the reference)"
        else:
            same, sets = per_job(with_scripts([list(c) for c in first], record_scripts(build_dir)), build)
            match = "yes" if sets == first_sets else "NO"
        rows.append(f"| {build} | {scripts / a.jobs:.3f} | {own[0]:,.0f} | {own[1]:,.0f} | "
                    f"{same[0]:,.0f} | {same[1]:,.0f} | {match} |")
        print(rows[-1], file=sys.stderr)
    if a.bullmq:
        commands, result = record_trial(Path(a.build_dir[0]).resolve(), a.jobs, a.mode, "bullmq")
        commands = replayable(commands)
        scripts = sum(1 for c in commands if c[0].upper() in (b"EVALSHA", b"EVAL"))
        figures = []
        for aof in (False, True):
            total, completed, _ = replay(commands, aof, b"bull:bench:completed")
            if int(completed) != a.jobs:
                raise RuntimeError(f"BullMQ: the replay left {completed!r} of {a.jobs} jobs completed")
            figures.append((total - idle[aof]) / a.jobs / 1000)
        rows.append(f"| BullMQ {result['bullmq']} | {scripts / a.jobs:.3f} | {figures[0]:,.0f} | "
                    f"{figures[1]:,.0f} | | | |")
        print(rows[-1], file=sys.stderr)
    print(f"redis-server instructions a job, thousands ({a.jobs:,} jobs, {a.mode}, batches of 100, "
          f"replayed under callgrind)\n")
    print("| build | script calls a job | its own trial, no persistence | its own trial, AOF everysec "
          "| the first build's trial, no persistence | the first build's trial, AOF everysec "
          "| its sorted sets after the first build's trial as the first build's |")
    print("|---|---:|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
