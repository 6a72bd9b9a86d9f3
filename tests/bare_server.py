#!/usr/bin/env python3
"""The bare rebound-server (no nginx in front) against the clients that used to stall it.

1. Slow clients: 1,000 slowloris connections (a header byte now and then), 1,000 idle kept-alive
   connections and 200 /invocations whose model takes its time are open at once; /ping and a
   submission from a new connection must answer within 2 s all along (SageMaker's contract).
   The HTTP front has 4 threads here: a connection costs no thread, so none of them is held.
2. Waits at scale: 5,000 clients poll one queued job with Prefer: wait=30 at once. /ping, a
   submission and another poll answer meanwhile; none of the 5,000 is answered before the job
   ends, and when it is cancelled every one of them gets 200 with its final status. The server's
   memory grows by a bounded amount for them. One more waiter beyond --max-waiters gets 503
   too_many_waiters.

Usage: bare_server.py REBOUND_SERVER    (about 40 s; needs ~8,000 open files: ulimit -n)
"""
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from rawhttp import exchange, free_port, get  # noqa: E402

server_bin = sys.argv[1]
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message, flush=True)
    else:
        print("ok:", message, flush=True)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


def start(args):
    port = free_port()
    work = tempfile.mkdtemp(prefix="rebound-bare-")
    proc = subprocess.Popen([server_bin, "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--store", "memory", "--log-level", "warn", *args],
                            cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if get(port, "/ping", timeout=1.0)[0] == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("rebound-server did not start")


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def timed(port, raw, timeout=2.0):
    """Sends one request on a new connection; (status, seconds) or (0, seconds) past `timeout`."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        writer.write(raw)
        line = await asyncio.wait_for(reader.readline(), timeout - (time.monotonic() - started))
        writer.close()
        return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else 0, time.monotonic() - started
    except (asyncio.TimeoutError, OSError):
        return 0, time.monotonic() - started


async def fetch(port, raw, timeout=5.0):
    """The body of the answer to one request (as text), or "" when none came in time."""
    try:
        _, body, _ = await exchange(port, raw, timeout)
        return body.decode()
    except (asyncio.TimeoutError, OSError, AttributeError):
        return ""


def submission(job_id, extra=b""):
    body = json.dumps({"id": job_id, "input": {"x": 1}}).encode()
    return (b"POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


PING = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"


async def slow_clients(port):
    held = []
    stop_trickling = asyncio.Event()

    async def slowloris():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        held.append(writer)
        writer.write(b"POST /v1/inferences HTTP/1.1\r\nHost: x\r\n")
        while not stop_trickling.is_set():
            await asyncio.sleep(1.0)
            writer.write(b"X")  # never a whole header line within the header timeout

    async def idle():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        held.append(writer)
        writer.write(PING)
        await reader.readuntil(b"\r\n\r\n")  # answered, then kept alive and silent

    async def slow_invocation():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        held.append(writer)
        body = b'{"slow": true}'
        writer.write(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                     str(len(body)).encode() + b"\r\n\r\n" + body)

    tricklers = [asyncio.create_task(slowloris()) for _ in range(1000)]
    await asyncio.gather(*(idle() for _ in range(1000)))
    await asyncio.gather(*(slow_invocation() for _ in range(200)))
    await asyncio.sleep(0.5)
    worst_ping, worst_submit, missed = 0.0, 0.0, 0
    for i in range(8):  # about 4 s, inside the idle connections' 5 s keep-alive
        status, took = await timed(port, PING)
        worst_ping = max(worst_ping, took)
        missed += status != 200
        status, took = await timed(port, submission(f"during-{i}"))
        worst_submit = max(worst_submit, took)
        missed += status != 202
        await asyncio.sleep(0.4)
    check(missed == 0, f"/ping and submissions answered under 2,200 slow connections ({missed} missed)")
    check(worst_ping < 2.0, f"/ping within 2 s under the slow clients (worst {worst_ping:.3f} s)")
    check(worst_submit < 2.0, f"a submission within 2 s under the slow clients (worst {worst_submit:.3f} s)")
    stop_trickling.set()
    for t in tricklers:
        t.cancel()
    for w in held:
        w.close()


async def waiters(port, pid, count):
    status, _ = await timed(port, submission("held"))
    check(status == 202, "the job the waiters wait for is accepted")
    before = rss_mib(pid)
    poll = b"GET /v1/inferences/held HTTP/1.1\r\nHost: x\r\nPrefer: wait=30\r\n\r\n"
    answers = {}

    async def wait_one(i):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(poll)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
            body = await reader.readexactly(length)
            answers[i] = (int(head.split()[1]), json.loads(body), time.monotonic())
        finally:
            writer.close()

    tasks = [asyncio.create_task(wait_one(i)) for i in range(count)]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # every one of them connected and waiting
        metrics = await fetch(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        m = re.search(r"^rebound_http_waiting (\d+)", metrics, re.M)
        if m and int(m.group(1)) >= count:
            break
        await asyncio.sleep(0.2)
    check(m is not None and int(m.group(1)) >= count,
          f"{count} requests wait at once (rebound_http_waiting {m.group(1) if m else None})")
    added = rss_mib(pid) - before
    check(added < 150, f"{count} waiters cost bounded memory ({added:.1f} MiB added)")
    status, took = await timed(port, PING)
    check(status == 200 and took < 2.0, f"/ping answers while they wait ({took:.3f} s)")
    status, took = await timed(port, submission("beside-the-waiters"))
    check(status == 202 and took < 2.0, f"a submission answers while they wait ({took:.3f} s)")
    status, _ = await timed(port, poll)
    check(status == 503, f"one more waiter beyond --max-waiters gets 503 too_many_waiters ({status})")
    check(not answers, f"no waiter is answered before the job ends ({len(answers)} were)")
    cancelled_at = time.monotonic()
    status, _ = await timed(port, b"DELETE /v1/inferences/held HTTP/1.1\r\nHost: x\r\n\r\n")
    check(status == 200, "the job is cancelled")
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
    final = [a for a in answers.values() if a[0] == 200 and a[1].get("status") == "cancelled"]
    check(len(final) == count, f"every waiter gets 200 with the final status ({len(final)} of {count})")
    if final:
        slowest = max(a[2] for a in final) - cancelled_at
        print(f"all {len(final)} answered within {slowest:.2f} s of the cancel", flush=True)


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < 8000:
        raise SystemExit(f"bare_server.py: needs 8,000 open files, the hard limit is {hard}")

    # 1. Slow clients. sleep:5 with 2 workers: the 200 invocations stay in flight for the whole run.
    proc, port = start(["--model", "sleep:5", "--workers", "2", "--http-threads", "4"])
    try:
        asyncio.run(slow_clients(port))
        check(proc.poll() is None, "the server is still up after the slow clients")
    finally:
        stop(proc)

    # 2. Waits at scale: a model that takes a minute holds the one job in flight.
    count = 5000
    proc, port = start(["--model", "sleep:60", "--workers", "1", "--http-threads", "4",
                        "--max-waiters", str(count)])
    try:
        asyncio.run(waiters(port, proc.pid, count))
        check(proc.poll() is None, "the server is still up after the waiters")
    finally:
        stop(proc)

    print(f"{sum(1 for _ in failures)} failures")
    sys.exit(1 if failures else 0)


main()
