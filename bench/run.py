#!/usr/bin/env python3
"""rebound's benchmark: one command, one table, with the seed's FastAPI server measured in the same run.

    bench/run.py                    # what docs/benchmarks.md shows: 3 rounds, about 8 minutes
    bench/run.py --baseline 981b6cc --only e2e --skip-peer   # this build beside an older one

--baseline REV builds rebound-server at REV in a tree of its own (the server only: no torch, no
tests; cached under BUILD_DIR/baselines/<commit>, so the second run costs nothing) and measures it
beside this build, round after round, with the memory store.

Needs a build (scripts/build.sh) and, from Debian: wrk nginx-light python3-fastapi python3-uvicorn
python3-httpx python3-backoff python3-uvloop python3-httptools (see docs/benchmarks.md).

Three servers are measured side by side, round after round, so that the noise of a shared machine
falls on all of them alike: the seed's FastAPI server with a shared HTTP client (the peer,
../shared/peers/fastapi_seed/main_tuned.py), rebound-server with the memory store, and
rebound-server with the SQLite store. Each round measures, for each server:

  e2e          wrk submits {"id", "callback_url"} jobs over --connections connections for --duration
               seconds (bench/submit.lua); an nginx receiver answers and logs every callback
               (bench/receiver.nginx.conf); the round then waits (up to --drain-timeout s) until
               every accepted job has been called back. End-to-end jobs/s is callbacks received /
               (load time + drain time). Echo model (the peer sleeps 0 s). The servers run with
               their shipped defaults (queue capacity, workers, connections): what a user runs,
               so submissions beyond the queue's capacity are refused (503) and counted.
  queued       a server whose model never finishes is filled with jobs (bench/submit.lua, STOP_ON_REFUSAL=1): rebound to
               --queued jobs (its --queue-capacity, so the first 503 marks the end), the peer for
               --peer-fill-seconds (it takes jobs at a few thousand per second). Memory per queued
               job is the growth of its resident memory / jobs queued.
  invocations  POST /invocations with the echo model over one kept-alive connection for
               --invocations-seconds (bench/invocations_load.cpp). The peer has no /invocations.
  slow         wrk submits jobs whose callbacks go, in turn, to 8 receivers (origins) that each
               answer after 200 ms (bench/slow_receiver.cpp); callbacks answered per second over
               --receivers-seconds, while jobs keep coming.
  hung         the same, with 1 callback in 20 (5%) to a receiver that accepts and never answers;
               healthy callbacks answered per second.

The table on stdout gives the median of the rounds with the range in brackets; progress and each
round's figures go to stderr, and --json keeps every figure.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import queue
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PEER_PYTHON = "/usr/bin/python3"  # Debian's python, where python3-fastapi and friends live


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def http_post(port: int, path: str, body: dict) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_http(port: int, proc: subprocess.Popen, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before answering")
        try:
            http_get(port, "/ping", timeout=1.0)
            return
        except (urllib.error.URLError, ConnectionError, socket.timeout):
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer on port {port} within {seconds} s")


def proc_status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for process {pid}")


class Server:
    """A server process in its own fresh folder (so each SQLite run starts with a new store)."""

    def __init__(self, name: str, argv: list[str], port: int, env: dict | None = None):
        self.name, self.port = name, port
        self.dir = Path(tempfile.mkdtemp(prefix="rebound-bench-"))
        self.log = open(self.dir / "server.log", "w")
        self.proc = subprocess.Popen(argv, cwd=self.dir, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        try:
            wait_http(port, self.proc, name)
        except Exception:
            self.stop(signal.SIGKILL)
            raise

    def peak_rss_kib(self) -> int:
        return proc_status_kib(self.proc.pid, "VmHWM")

    def rss_kib(self) -> int:
        return proc_status_kib(self.proc.pid, "VmRSS")

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Fleet:
    """rebound-servers on one fresh redis-server (appendonly yes, appendfsync everysec), for the
    Redis store: what a Server offers, over all of them (memory adds up, Redis's included)."""

    def __init__(self, name: str, make_argv, count: int, env: dict | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="rebound-bench-redis-"))
        redis_port = free_port()
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no",
             "--logfile", str(self.dir / "redis.log")])
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", redis_port), timeout=1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.redis.kill()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)
        self.servers = []
        try:
            for i in range(count):
                port = free_port()
                self.servers.append(Server(f"{name}-{i}", make_argv(port, f"redis://127.0.0.1:{redis_port}"),
                                           port, env))
        except Exception:
            self.stop(signal.SIGKILL)
            raise
        self.port = self.servers[0].port
        self.ports = [srv.port for srv in self.servers]

    def peak_rss_kib(self) -> int:
        return sum(srv.peak_rss_kib() for srv in self.servers) + proc_status_kib(self.redis.pid, "VmHWM")

    def rss_kib(self) -> int:
        return sum(srv.rss_kib() for srv in self.servers) + proc_status_kib(self.redis.pid, "VmRSS")

    def stop(self, sig=signal.SIGTERM) -> None:
        for srv in self.servers:
            srv.stop(sig)
        self.redis.kill()
        self.redis.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Lines:
    """A helper process's stdout (`name` says which), line by line, each JSON line awaited with a
    timeout; other lines (a library's own) are passed to stderr."""

    def __init__(self, stream, name: str):
        self.name = name
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def next_json(self, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"no {what} from {self.name} within {timeout:g} s") from None
            if line is None:
                raise RuntimeError(f"{self.name} ended before its {what}")
            if line.startswith("{"):
                return json.loads(line)
            print(f"{self.name}: {line.rstrip()}", file=sys.stderr, flush=True)


def end_helper(proc: subprocess.Popen, errors, failed: bool) -> None:
    """Ends a helper process that waits for its stdin to close (a peer benchmark's bench.mjs):
    closes it, waits up to 30 s (then kills it), and on a failure prints the end of what it
    wrote to `errors` (a temporary file)."""
    if failed:
        errors.seek(0)
        tail = errors.read()[-2000:]
        if tail:
            print(tail, file=sys.stderr, flush=True)
    try:
        proc.stdin.close()  # tells the helper to close its connections and exit
    except OSError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    errors.close()


class Receiver:
    """nginx answering 200 to every callback and logging one line per callback."""

    def __init__(self):
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rebound-receiver-"))
        (self.dir / "body").mkdir()
        conf = (BENCH / "receiver.nginx.conf").read_text()
        conf = conf.replace("RUNDIR", str(self.dir)).replace("RPORT", str(self.port))
        (self.dir / "nginx.conf").write_text(conf)
        self.proc = subprocess.Popen(["nginx", "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(self.port, self.proc, "nginx receiver")
        self._offset, self._count = 0, 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/results"

    def delivered(self) -> int:
        """Callbacks answered 200 so far (read incrementally from nginx's access log)."""
        path = self.dir / "callbacks.log"
        if not path.exists():
            return 0
        with open(path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._count += chunk[:end].count(b"POST /v1/results 200")
        self._offset += end
        return self._count

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def wrk_ms(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", text)
    if not m:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(m.group(1)) * UNITS[m.group(2)]


def parse_wrk(out: str) -> dict:
    m = re.search(r"(\d+) requests in ([0-9.]+)(us|ms|s|m)", out)
    if not m:
        raise RuntimeError("unexpected wrk output:\n" + out)
    requests, seconds = int(m.group(1)), float(m.group(2)) * UNITS[m.group(3)] / 1000.0
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.M))
    return {
        "requests": requests,
        "seconds": seconds,
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": sum(int(x) for x in errors.groups()) if errors else 0,
        "p50_ms": wrk_ms(latency["50"]) if "50" in latency else None,
        "p99_ms": wrk_ms(latency["99"]) if "99" in latency else None,
    }


def wrk_env(callback_url: str, fill: bool, callback_urls: list[str] | None = None) -> dict:
    """bench/submit.lua's settings: where callbacks go, and whether to stop at the first refusal."""
    return {**os.environ, "CALLBACK_URL": callback_url, "STOP_ON_REFUSAL": "1" if fill else "0",
            "CALLBACK_URLS": " ".join(callback_urls or [])}


def wrk(port: int, connections: int, seconds: float, callback_url: str, fill: bool = False) -> dict:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{round(seconds)}s", "--latency", "-s", str(BENCH / "submit.lua"),
         f"http://127.0.0.1:{port}"],
        env=wrk_env(callback_url, fill), capture_output=True, text=True,
        timeout=seconds + 60).stdout
    return parse_wrk(out)


def metric(port: int, name: str) -> float:
    _, text = http_get(port, "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


class Systems:
    """The servers to compare, as command lines for each measurement."""

    def __init__(self, args, baselines: dict[str, Path]):
        self.args = args
        self.server = str(Path(args.build_dir).resolve() / "examples" / "rebound-server")
        self.peer_dir = str(Path(args.peer_dir).resolve())
        self.rebound = {
            "memory": {"title": "rebound, memory store", "store": "memory"},
            "sqlite": {"title": "rebound, SQLite store", "store": "sqlite:jobs.db"},
        }
        for rev, binary in baselines.items():
            self.rebound[f"baseline-{rev}"] = {"title": f"rebound {rev}, memory store", "store": "memory",
                                               "binary": str(binary)}
        for i, spec in enumerate(args.also or [], start=1):
            also = json.loads(spec)
            # The servers run in a folder of their own: a relative path is taken from ours (a bare
            # name is left to PATH).
            if "binary" in also and os.sep in also["binary"]:
                also["binary"] = os.path.abspath(also["binary"])
            self.rebound[f"also{i}"] = also
        self.names = ([] if args.skip_peer else ["peer"]) + list(self.rebound)

    def title(self, name: str) -> str:
        return "FastAPI seed (shared client)" if name == "peer" else self.rebound[name]["title"]

    def start(self, name: str, model: str, queue_capacity: int | None = None,
              workers: int | None = None) -> Server:
        """Starts `name` with `model`; a capacity or worker count left out is the server's default."""
        port = free_port()
        if name == "peer":
            sleep = "0" if model == "echo" else "100000"
            argv = [PEER_PYTHON, "-m", "uvicorn", "--app-dir", self.peer_dir, "main_tuned:app",
                    "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
            return Server(name, argv, port, env={"PEER_SLEEP_S": sleep})
        spec = self.rebound[name]

        def argv(port: int, store: str) -> list[str]:
            sizes = ([] if workers is None else ["--workers", str(workers)]) + \
                    ([] if queue_capacity is None else ["--queue-capacity", str(queue_capacity)])
            return [spec.get("binary", self.server), "serve", "--host", "127.0.0.1", "--port", str(port),
                    "--model", model, "--store", store, *sizes, "--allow-private-callbacks",
                    "--log-level", "warn", *spec.get("args", [])]

        if spec.get("store") == "redis":
            return Fleet(name, argv, spec.get("servers", 1), env=spec.get("env"))
        return Server(name, argv(port, spec.get("store", "memory")), port, env=spec.get("env"))


def measure_e2e(systems: Systems, name: str) -> dict:
    a = systems.args
    receiver = Receiver()
    server = systems.start(name, "echo")
    try:
        time.sleep(0.5)
        ports = getattr(server, "ports", [server.port])
        if len(ports) == 1:
            w = wrk(server.port, a.connections, a.duration, receiver.url)
        else:
            # Servers sharing one Redis, each loaded by its own wrk with its share of the
            # connections: requests add up, latencies are the worst server's.
            with concurrent.futures.ThreadPoolExecutor(len(ports)) as pool:
                runs = list(pool.map(lambda p: wrk(p, a.connections // len(ports), a.duration,
                                                   receiver.url), ports))
            w = {k: sum(r[k] for r in runs) for k in ("requests", "non2xx", "socket_errors")}
            w["seconds"] = max(r["seconds"] for r in runs)
            w["p50_ms"] = max(r["p50_ms"] for r in runs)
            w["p99_ms"] = max(r["p99_ms"] for r in runs)
        t0 = time.monotonic()
        answered = w["requests"] - w["non2xx"]  # 2xx answers wrk saw

        def accepted() -> int:
            # rebound counts its 202s: exact, including requests in flight when wrk stopped, whose
            # answers wrk never counted. The peer keeps no count; wrk's is the best there is.
            if name == "peer":
                return answered
            return sum(int(metric(p, "rebound_jobs_accepted_total")) for p in ports)

        target, delivered = accepted(), receiver.delivered()
        while delivered < target and time.monotonic() - t0 < a.drain_timeout:
            time.sleep(0.02)
            target, delivered = accepted(), receiver.delivered()
        drain = time.monotonic() - t0
        return {
            "e2e_jobs_per_s": delivered / (w["seconds"] + drain),
            "accepted_per_s": answered / w["seconds"],
            "accept_p50_ms": w["p50_ms"],
            "accept_p99_ms": w["p99_ms"],
            "accepted": target,
            "refused": w["non2xx"],
            "socket_errors": w["socket_errors"],
            "delivered": delivered,
            "lost": max(0, target - delivered),
            "drain_s": drain,
            "peak_rss_kib": server.peak_rss_kib(),
        }
    finally:
        server.stop()
        receiver.stop()


def measure_queued(systems: Systems, name: str) -> dict:
    a = systems.args
    # A model that never finishes within the run: every accepted job stays queued.
    server = systems.start(name, "sleep:86400", queue_capacity=a.queued, workers=1)
    try:
        http_post(server.port, "/v1/inferences", {"id": "warm-up", "callback_url": "http://127.0.0.1:9/x"})
        time.sleep(0.5)
        before = server.rss_kib()
        if name == "peer":
            w = wrk(server.port, a.connections, a.peer_fill_seconds, "http://127.0.0.1:9/x", fill=True)
            queued = w["requests"] - w["non2xx"] + 1
        else:
            filler = subprocess.Popen(
                ["wrk", "-t1", f"-c{a.connections}", "-d600s", "-s", str(BENCH / "submit.lua"),
                 f"http://127.0.0.1:{server.port}"],
                env=wrk_env("http://127.0.0.1:9/x", fill=True),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and filler.poll() is None:
                time.sleep(0.5)
                if metric(server.port, 'rebound_submissions_refused_total{reason="queue_full"}') > 0:
                    break
            filler.terminate()
            filler.wait()
            queued = int(metric(server.port, "rebound_jobs_accepted_total"))
        time.sleep(1.0)
        after = server.rss_kib()
        return {
            "queued": queued,
            "rss_before_kib": before,
            "rss_after_kib": after,
            "bytes_per_queued_job": (after - before) * 1024 / queued,
        }
    finally:
        server.stop(signal.SIGKILL)  # a million jobs to abandon: no graceful shutdown to wait for


def measure_invocations(systems: Systems, name: str) -> dict:
    a = systems.args
    load = str(Path(a.build_dir).resolve() / "bench" / "rebound-invocations-load")
    server = systems.start(name, "echo")
    try:
        body = '{"x": [1, 2, 3]}'
        subprocess.run([load, "127.0.0.1", str(server.port), "1", "1", body], check=True,
                       stdout=subprocess.DEVNULL)  # warm-up
        out = subprocess.run([load, "127.0.0.1", str(server.port), "1", str(a.invocations_seconds), body],
                             check=True, capture_output=True, text=True).stdout
        fields = dict(kv.split("=") for kv in out.split())
        return {"p50_us": float(fields["p50_us"]), "p99_us": float(fields["p99_us"]),
                "requests_per_s": float(fields["rps"])}
    finally:
        server.stop()


class SlowReceivers:
    """bench/slow_receiver: 8 origins answering after 200 ms, and optionally one that hangs."""

    ORIGINS = 8

    def __init__(self, build_dir: str, hung: bool):
        self.ports = [free_port() for _ in range(self.ORIGINS)]
        self.hung_port = free_port() if hung else None
        self.admin = free_port()
        argv = [str(Path(build_dir).resolve() / "bench" / "rebound-slow-receiver"),
                "--ports", ",".join(map(str, self.ports)), "--admin-port", str(self.admin),
                "--delay-ms", "200"]
        if hung:
            argv += ["--hung-port", str(self.hung_port)]
        self.proc = subprocess.Popen(argv)
        wait_http(self.admin, self.proc, "slow receivers")

    def urls(self) -> list[str]:
        """Callback URLs in turn: the 8 origins, and with a hung one, 1 job in 20 (5%) to it."""
        healthy = [f"http://127.0.0.1:{p}/v1/results" for p in self.ports]
        if self.hung_port is None:
            return healthy
        turn = [healthy[i % len(healthy)] for i in range(19)]
        return turn + [f"http://127.0.0.1:{self.hung_port}/v1/results"]

    def answered(self) -> int:
        return int(http_get(self.admin, "/")[1].split()[0])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def measure_receivers(systems: Systems, name: str, hung: bool) -> dict:
    """Callbacks delivered per second to receivers that take 200 ms, while jobs keep coming."""
    a = systems.args
    receivers = SlowReceivers(a.build_dir, hung)
    server = systems.start(name, "echo", queue_capacity=1_000_000)
    try:
        load = subprocess.Popen(
            ["wrk", "-t1", f"-c{a.connections}", f"-d{round(a.receivers_seconds + 2)}s", "-s",
             str(BENCH / "submit.lua"), f"http://127.0.0.1:{server.port}"],
            env=wrk_env(receivers.urls()[0], False, receivers.urls()),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)  # past the start: connections open, the pipeline full
        t0, n0 = time.monotonic(), receivers.answered()
        time.sleep(a.receivers_seconds)
        t1, n1 = time.monotonic(), receivers.answered()
        load.terminate()
        load.wait()
        return {"delivered_per_s": (n1 - n0) / (t1 - t0), "peak_rss_kib": server.peak_rss_kib()}
    finally:
        server.stop(signal.SIGKILL)  # deliveries still waiting: no graceful drain to sit through
        receivers.stop()


MEASUREMENTS = {"e2e": measure_e2e, "queued": measure_queued, "invocations": measure_invocations,
                "slow": lambda s, n: measure_receivers(s, n, hung=False),
                "hung": lambda s, n: measure_receivers(s, n, hung=True)}


def build_baseline(rev: str, build_dir: str) -> Path:
    """rebound-server as of `rev`, built in a tree of its own (server only: no torch, no tests, no
    benchmarks), cached by commit under BUILD_DIR/baselines, so that it is built once."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            capture_output=True, text=True)
    if commit.returncode != 0:
        sys.exit(f"bench/run.py: --baseline {rev}: not a commit of this repository")
    commit = commit.stdout.strip()
    home = Path(build_dir).resolve() / "baselines" / commit
    binary = home / "build" / "examples" / "rebound-server"
    if binary.exists():
        return binary
    log(f"building rebound-server at {rev} ({commit[:12]}) in {home} (once; a few minutes)")
    source = home / "src"
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(source)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        sys.exit(f"bench/run.py: git archive {commit} failed")
    launcher = ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"] if shutil.which("ccache") else []
    subprocess.run(["cmake", "-S", str(source), "-B", str(home / "build"), "-G", "Ninja",
                    "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DREBOUND_WITH_TORCH=OFF",
                    "-DREBOUND_BUILD_TESTS=OFF", "-DREBOUND_BUILD_BENCH=OFF", *launcher],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(home / "build"), "--target", "rebound-server"], check=True,
                   stdout=subprocess.DEVNULL)
    return binary


def check_prerequisites(args) -> None:
    missing = [tool for tool in ("wrk", "nginx") if shutil.which(tool) is None]
    for path in (Path(args.build_dir) / "examples" / "rebound-server",
                 Path(args.build_dir) / "bench" / "rebound-invocations-load",
                 Path(args.build_dir) / "bench" / "rebound-slow-receiver"):
        if not path.exists():
            missing.append(f"{path} (run scripts/build.sh)")
    if not args.skip_peer:
        probe = subprocess.run([PEER_PYTHON, "-c", "import fastapi, uvicorn, httpx, backoff"],
                               capture_output=True)
        if probe.returncode != 0:
            missing.append("the peer's Python packages (python3-fastapi python3-uvicorn python3-httpx "
                           "python3-backoff python3-uvloop python3-httptools)")
        if not (Path(args.peer_dir) / "main_tuned.py").exists():
            missing.append(f"{args.peer_dir}/main_tuned.py (--peer-dir)")
    if missing:
        sys.exit("bench/run.py: missing: " + "; ".join(missing))


def fmt_int(x: float) -> str:
    return f"{x:,.0f}"


def cell(values: list[float], fmt, spread: bool = True) -> str:
    if not values:
        return "-"
    mid = fmt(statistics.median(values))
    if spread and len(values) > 1 and fmt(min(values)) != fmt(max(values)):
        return f"{mid} ({fmt(min(values))}-{fmt(max(values))})"
    return mid


def table(results: dict, systems: Systems) -> str:
    def values(name, kind, key):
        return [r[key] for r in results[name][kind]]

    names = systems.names
    head = "| | target | " + " | ".join(systems.title(n) for n in names) + " |"
    lines = [head, "|---|---|" + "---:|" * len(names)]

    def row(label, target, kind, key, fmt, per=None, spread=True):
        cells = []
        for n in names:
            if kind not in results[n] or not results[n][kind]:
                cells.append("-")
            else:
                cells.append(per(n) if per else cell(values(n, kind, key), fmt, spread))
        lines.append(f"| {label} | {target} | " + " | ".join(cells) + " |")

    ms = lambda x: f"{x:.2f} ms"
    us = lambda x: f"{x:.0f} µs"
    mib = lambda x: f"{x / 1024:,.0f} MiB"
    if "e2e" in results[names[0]]:
        row("end-to-end jobs/s (submit to callback received)", "≥ 20,000 memory, ≥ 10,000 SQLite",
            "e2e", "e2e_jobs_per_s", fmt_int)
        row("jobs accepted (202) per second under load", "", "e2e", "accepted_per_s", fmt_int)
        row("accept latency p50", "", "e2e", "accept_p50_ms", ms)
        row("accept latency p99", "≤ 5 ms", "e2e", "accept_p99_ms", ms)
        row("jobs lost (accepted, never called back; all rounds)", "0", "e2e", "lost", None,
            per=lambda n: f"{sum(values(n, 'e2e', 'lost')):,} of {sum(values(n, 'e2e', 'accepted')):,}")
        row("peak resident memory, end-to-end run", "", "e2e", "peak_rss_kib", mib)
    if "queued" in results[names[0]] or "queued" in results[names[-1]]:
        row("memory per queued job", "≤ 1 KB beyond a fixed base", "queued", "bytes_per_queued_job",
            lambda x: f"{x:,.0f} B")
        row("jobs queued for that figure", "1,000,000", "queued", "queued", fmt_int, spread=False)
        row("resident memory: base, then queue full", "", "queued", None, None,
            per=lambda n: f"{mib(statistics.median(values(n, 'queued', 'rss_before_kib')))}, then "
                          f"{mib(statistics.median(values(n, 'queued', 'rss_after_kib')))}")
    if "slow" in results[names[0]]:
        row("callbacks delivered/s, receivers answering in 200 ms on 8 origins",
            "≥ 2,000 and ≥ 10x the peer", "slow", "delivered_per_s", fmt_int)
    if "hung" in results[names[0]]:
        row("healthy callbacks delivered/s, 5% of callbacks to a hung receiver",
            "≥ half the row above", "hung", "delivered_per_s", fmt_int)
    if "invocations" in results[names[-1]]:
        row("/invocations latency p50, 1 connection", "≤ 200 µs", "invocations", "p50_us", us)
        row("/invocations latency p99, 1 connection", "", "invocations", "p99_us", us)
        row("/invocations requests/s, 1 connection", "", "invocations", "requests_per_s", fmt_int)
    return "\n".join(lines)


def links_torch(binary: Path):
    """Whether `binary` loads libtorch: about 140 MiB of resident memory at start (its code pages
    and its own allocations), before any job. None when ldd cannot say."""
    try:
        linked = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    except OSError:
        return None
    return "libtorch" in linked.stdout if linked.returncode == 0 else None


def targets(results: dict, rss_comparable: bool = True) -> list[tuple[str, bool]]:
    """The issue's targets for rebound's two stores, judged on the medians. Peak RSS is judged
    against a baseline only when `rss_comparable` (both builds with libtorch, or both without)."""
    def median(name, kind, key):
        runs = results.get(name, {}).get(kind) or []
        return statistics.median(r[key] for r in runs) if runs else None

    checks = []
    for name, title, floor in (("memory", "memory store", 20_000), ("sqlite", "SQLite store", 10_000)):
        def check(what, value, ok):
            if value is not None:
                checks.append((f"{title}: {what} ({value:,.4g})", ok(value)))
        check("end-to-end jobs/s >= " + f"{floor:,}", median(name, "e2e", "e2e_jobs_per_s"),
              lambda v: v >= floor)
        check("accept p99 <= 5 ms", median(name, "e2e", "accept_p99_ms"), lambda v: v <= 5.0)
        lost = results.get(name, {}).get("e2e")
        if lost:
            check("jobs lost = 0", sum(r["lost"] for r in lost), lambda v: v == 0)
        check("bytes per queued job <= 1024", median(name, "queued", "bytes_per_queued_job"),
              lambda v: v <= 1024)
        check("/invocations p50 <= 200 us", median(name, "invocations", "p50_us"), lambda v: v <= 200)
        e2e = median(name, "e2e", "e2e_jobs_per_s")
        peer_e2e = median("peer", "e2e", "e2e_jobs_per_s")
        if e2e is not None and peer_e2e:
            check("end-to-end jobs/s >= 30x the seed's FastAPI server", e2e / peer_e2e, lambda v: v >= 30)
        memory_e2e = median("memory", "e2e", "e2e_jobs_per_s")
        if name == "sqlite" and e2e is not None and memory_e2e:
            check("end-to-end jobs/s >= 0.8x the memory store's", e2e / memory_e2e, lambda v: v >= 0.8)
        for base in (n for n in results if n.startswith("baseline-")):
            rev = base[len("baseline-"):]
            base_e2e, base_rss = median(base, "e2e", "e2e_jobs_per_s"), median(base, "e2e", "peak_rss_kib")
            if name == "memory" and e2e is not None and base_e2e:
                check(f"end-to-end jobs/s >= 2x rebound {rev}'s", e2e / base_e2e, lambda v: v >= 2)
            rss = median(name, "e2e", "peak_rss_kib")
            if name == "memory" and rss is not None and base_rss and rss_comparable:
                check(f"peak RSS <= 1.2x rebound {rev}'s", rss / base_rss, lambda v: v <= 1.2)
        slow, hung = median(name, "slow", "delivered_per_s"), median(name, "hung", "delivered_per_s")
        peer = median("peer", "slow", "delivered_per_s")
        check("deliveries/s to 200 ms receivers >= 2,000", slow, lambda v: v >= 2000)
        if slow is not None and peer:
            check("deliveries/s to 200 ms receivers >= 10x the peer's", slow / peer, lambda v: v >= 10)
        if slow and hung is not None:
            check("healthy deliveries/s with 5% hung >= half of those without", hung / slow,
                  lambda v: v >= 0.5)
    return checks


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    total = 0
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) // (1024 * 1024)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    if subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                      capture_output=True, text=True).stdout.strip():
        commit += " with uncommitted changes"
    return (f"{os.cpu_count()} cores ({cpu}), {total} GiB, {platform.system()} {platform.release()}; "
            f"rebound {commit}; server, wrk and nginx share the cores")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="rounds; each figure is their median (default 3)")
    p.add_argument("--duration", type=float, default=5, help="seconds of load per e2e run (default 5)")
    p.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    p.add_argument("--drain-timeout", type=float, default=120, help="longest wait for callbacks (s)")
    p.add_argument("--queued", type=int, default=1_000_000, help="jobs to queue in rebound (default 1e6)")
    p.add_argument("--peer-fill-seconds", type=float, default=10, help="seconds to fill the peer (default 10)")
    p.add_argument("--invocations-seconds", type=float, default=5, help="seconds per /invocations run")
    p.add_argument("--receivers-seconds", type=float, default=10,
                   help="seconds measured per slow/hung receivers run (default 10)")
    p.add_argument("--only", choices=sorted(MEASUREMENTS), action="append",
                   help="run only this measurement (repeatable)")
    p.add_argument("--skip-peer", action="store_true", help="measure rebound only")
    p.add_argument("--build-dir", default=os.environ.get("BUILD_DIR", str(ROOT / "build")))
    p.add_argument("--peer-dir", default=str(ROOT.parent / "shared" / "peers" / "fastapi_seed"))
    p.add_argument("--json", help="write every round's figures to this file")
    p.add_argument("--baseline", action="append", metavar="REV", default=[],
                   help="also measure rebound-server as of commit REV (memory store), built once in a "
                        "tree of its own, side by side in the same rounds (repeatable), e.g. 981b6cc")
    p.add_argument("--also", action="append", metavar="JSON",
                   help='another rebound-server to compare, e.g. \'{"title": "memory, 4 callback '
                        'connections", "store": "memory", "args": ["--callback-connections", "4"], '
                        '"env": {...}, "binary": "/path/to/another/rebound-server"}\' (repeatable; a relative "binary" path '
                        'is taken from the current folder). '
                        '"store": "redis" starts a fresh redis-server for it; with "servers": N, the '
                        'end-to-end run loads N rebound-servers on that one Redis')
    args = p.parse_args()
    check_prerequisites(args)
    baselines = {rev: build_baseline(rev, args.build_dir) for rev in args.baseline}
    # Peak RSS means something beside a baseline only when both load libtorch or neither does: it
    # is resident from the start (about 140 MiB) and says nothing of the queue.
    server = Path(args.build_dir) / "examples" / "rebound-server"
    torch_here = links_torch(server)
    rss_comparable = all(torch_here is not None and links_torch(b) == torch_here
                         for b in baselines.values())

    systems = Systems(args, baselines)
    kinds = args.only or list(MEASUREMENTS)
    results = {n: {k: [] for k in kinds} for n in systems.names}
    started = time.monotonic()
    for r in range(1, args.rounds + 1):
        for kind in kinds:
            for name in systems.names:
                if kind == "invocations" and name == "peer":
                    continue  # the seed has no /invocations
                figures = MEASUREMENTS[kind](systems, name)
                results[name][kind].append(figures)
                log(f"round {r}/{args.rounds} {kind:11} {name:6} "
                    + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in figures.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))

    print(f"rebound benchmark, {time.strftime('%Y-%m-%d')}: median of {args.rounds} rounds "
          f"(range in brackets); echo model; {args.connections} connections, {args.duration:g} s of load "
          f"per end-to-end run; {time.monotonic() - started:.0f} s in all")
    print(machine())
    print()
    print(table(results, systems))
    if not rss_comparable:
        print()
        print(f"Peak RSS is not compared with the baselines: {server} and they do not both load "
              "libtorch, or ldd could not say (the baselines are built without it: pass --build-dir "
              "of a -DREBOUND_WITH_TORCH=OFF build to compare memory).")
    verdicts = targets(results, rss_comparable)
    if verdicts:
        print()
        met = sum(ok for _, ok in verdicts)
        print(f"Targets met: {met} of {len(verdicts)}" + ("" if met == len(verdicts) else " - NOT MET: " +
              "; ".join(what for what, ok in verdicts if not ok)))


if __name__ == "__main__":
    main()
