#!/usr/bin/env python3
"""Two rebound-servers share one queue on a real Redis Cluster of three masters and three
replicas (on loopback), both given a node that does not serve the queue's slot. Checks, under a
load of submissions, that no job answered 202 is lost when:

1. one server is killed (kill -9): the other takes its work when its lease runs out;
2. the slot's master hands over to its replica (CLUSTER FAILOVER, planned): the servers follow the
   MOVED answers to the new master;
3. with ?replicas=1 (every write acknowledged once a replica has it), the slot's replica falls a
   second behind (its link cut, the process stopped) and its master is killed (kill -9) with one of the servers: the replica is
   promoted, and the servers find it in the slot map; until the killed
   node is back (as the new master's replica) no write can be acknowledged, and submissions are
   answered 503.

Jobs delivered more than once (at-least-once: a job whose acknowledgement was lost with a server or
a master runs again) are counted and printed.

Standard library only; loopback only; every process it starts is ended by its id.

    redis_cluster.py REBOUND_SERVER REDIS_SERVER REDIS_CLI
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fleet_support import (LEASE_S, Receiver, Server, burst_then_kill, children,  # noqa: E402
                           fail, run_load, wait_delivered)

server_bin, redis_bin, cli_bin = sys.argv[1], sys.argv[2], sys.argv[3]
PREFIX = "{q}"


def free_pair(taken):
    """A port whose cluster bus port (+10000) is free too, both below the ephemeral range and
    below 25000 (the plain servers' ports from 25000, fleet_support.free_port, which are stopped
    and started again: a bus must not take one meanwhile)."""
    candidates = list(range(11000, 15000, 7))
    at = os.getpid() % len(candidates)
    for start in candidates[at:] + candidates[:at]:
        if start in taken:
            continue
        try:
            for port in (start, start + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return start
        except OSError:
            continue
    fail("no free port pair for a cluster node")


def cli(port, *args, check=True):
    out = subprocess.run([cli_bin, "-h", "127.0.0.1", "-p", str(port), *args],
                         capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        fail(f"redis-cli -p {port} {' '.join(args)}: {out.stderr}")
    return out.stdout


class Node:
    def __init__(self, folder, taken):
        self.port = free_pair(taken)
        taken.add(self.port)
        self.folder = os.path.join(folder, str(self.port))
        os.makedirs(self.folder)
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [redis_bin, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.folder,
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--logfile", os.path.join(self.folder, "redis.log")])
        children.append(self.proc)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                fail(f"cluster node {self.port} exited at start: {self.log_end()}")
            # (Only ours counts: another test's server may have taken the port.)
            if (cli(self.port, "PING", check=False).strip() == "PONG" and
                    f"process_id:{self.proc.pid}" in cli(self.port, "INFO", "server", check=False)):
                return
            time.sleep(0.05)
        fail(f"cluster node {self.port} did not start: {self.log_end()}")

    def log_end(self):
        with open(os.path.join(self.folder, "redis.log"), errors="replace") as log:
            return log.read()[-2000:]

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def role(self):
        for line in cli(self.port, "INFO", "replication", check=False).splitlines():
            if line.startswith("role:"):
                return line.split(":", 1)[1].strip()
        return None


def cluster_nodes(port):
    """CLUSTER NODES as (port, flags, master port or None, slot ranges) for each node."""
    lines = [line.split() for line in cli(port, "CLUSTER", "NODES").splitlines() if line.strip()]
    port_of = {f[0]: int(f[1].split("@")[0].rsplit(":", 1)[1]) for f in lines}
    out = []
    for f in lines:
        ranges = []
        for r in f[8:]:
            if r.startswith("["):
                continue  # a slot being migrated
            first, _, last = r.partition("-")
            ranges.append((int(first), int(last or first)))
        out.append((port_of[f[0]], f[2], port_of.get(f[3]), ranges))
    return out


def owner(asked_port, slot):
    """The port of the master that serves `slot`, and of its replica, as `asked_port` sees it."""
    nodes = cluster_nodes(asked_port)
    master = next(p for p, flags, _, ranges in nodes
                  if "master" in flags and "fail" not in flags
                  and any(a <= slot <= b for a, b in ranges))
    replica = next((p for p, flags, of, _ in nodes
                    if "slave" in flags and "fail" not in flags and of == master), None)
    return master, replica


def wait_healthy(nodes, limit_s=30):
    """Until every live node says the cluster is ok and every replica's link to its master is up."""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        healthy = True
        for n in nodes:
            if n.proc.poll() is not None:
                continue
            if "cluster_state:ok" not in cli(n.port, "CLUSTER", "INFO", check=False):
                healthy = False
            elif n.role() == "slave" and "master_link_status:up" not in cli(
                    n.port, "INFO", "replication", check=False):
                healthy = False
        if healthy:
            return
        time.sleep(0.1)
    fail("the cluster did not become healthy")


def delivered_twice(receiver, ids):
    with receiver.lock:
        return sum(1 for i in ids if len(receiver.statuses.get(i, [])) > 1)


def round_of(name, servers, receiver, url, during, seconds=1.0):
    accepted, refused = run_load(servers, url, name.split(",")[0].replace(" ", "-"), seconds,
                                 during=during)
    lost = wait_delivered(receiver, accepted, LEASE_S * 5 + 60)
    print(f"{name}: accepted {len(accepted)}, refused {len(refused)} "
          f"({sorted(set(refused))}), lost {len(lost)}, "
          f"delivered more than once {delivered_twice(receiver, accepted)}", flush=True)
    if not accepted:
        fail(f"{name}: no job was accepted")
    if lost:
        for job_id in sorted(lost)[:3]:  # what the servers say of them
            for s in servers:
                try:
                    print(f"  {s.name}: GET {job_id}: {s.request('GET', '/v1/inferences/' + job_id)}"
                          f"; /ping: {s.request('GET', '/ping')}")
                except OSError as e:
                    print(f"  {s.name}: {e}")
        for s in servers:
            print(s.report(), end="")
        fail(f"{name}: lost {len(lost)} accepted jobs, e.g. {sorted(lost)[:5]}")
    if set(refused) - {503}:
        fail(f"{name}: refusals other than 503: {sorted(set(refused))}")
    return accepted


with tempfile.TemporaryDirectory() as folder:
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/results"

    taken = set()
    nodes = [Node(folder, taken) for _ in range(6)]
    for n in nodes:
        n.start()
    by_port = {n.port: n for n in nodes}
    cli(nodes[0].port, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
        "--cluster-replicas", "1", "--cluster-yes")
    wait_healthy(nodes)
    slot = int(cli(nodes[0].port, "CLUSTER", "KEYSLOT", PREFIX + ":jobs").strip())
    master, replica = owner(nodes[0].port, slot)
    if replica is None:
        fail("the slot's master has no replica")
    # The servers are given another master: they must find the slot's node themselves.
    seed = next(p for p, flags, _, ranges in cluster_nodes(master)
                if "master" in flags and p != master)
    store = f"redis://127.0.0.1:{seed}?prefix={PREFIX}"
    print(f"slot {slot}: master {master}, replica {replica}; servers given {seed}", flush=True)

    servers = [Server(server_bin, "a", store), Server(server_bin, "b", store)]

    # 1. One server killed mid-load: the other takes over its leases.
    before = servers[1].taken_over()
    round_of("server killed", servers, receiver, url,
             during=lambda: burst_then_kill(servers[0], url, "killed-burst"))
    if servers[1].taken_over() == before:
        fail("the killed server held no work the other took over: the round tested nothing")
    servers[0] = Server(server_bin, "a2", store)

    # 2. A planned failover: the replica takes the slot over, the old master becomes its replica.
    def planned_failover():
        cli(replica, "CLUSTER", "FAILOVER")
        deadline = time.time() + 20
        while by_port[replica].role() != "master":
            if time.time() > deadline:
                fail("CLUSTER FAILOVER did not promote the replica")
            time.sleep(0.05)

    round_of("planned failover", servers, receiver, url, during=planned_failover)
    if owner(seed, slot)[0] != replica:
        fail("after the failover the slot is not served by the old replica")
    wait_healthy(nodes)

    # 3. ?replicas=1, and a crash of the slot's master: its replica (the old master) is promoted.
    for s in servers:
        s.stop()
    master, replica = owner(seed, slot)
    if replica is None:
        fail("the slot's new master has no replica")
    acked = store + "&replicas=1"
    servers = [Server(server_bin, "c", acked), Server(server_bin, "d", acked)]

    def master_crash():
        # The replica falls behind first (its link cut, and stopped for a second): a write its
        # master acknowledged alone in that second dies with the master. With replicas=1 none is
        # acknowledged (their WAIT runs out: 503), so none that was can be lost.
        by_port[replica].proc.send_signal(signal.SIGSTOP)
        cli(master, "CLIENT", "KILL", "TYPE", "replica")  # (what it had sent, the replica reads)
        time.sleep(1.0)
        by_port[master].kill()
        servers[0].kill()  # and a server with it: what it held, it held only in that master
        by_port[replica].proc.send_signal(signal.SIGCONT)
        deadline = time.time() + 30
        while by_port[replica].role() != "master":
            if time.time() > deadline:
                fail("the replica was not promoted after its master's crash")
            time.sleep(0.05)
        # The promoted master has no replica: no write can be acknowledged (the servers answer
        # 503) until the crashed node is back, as its replica.
        by_port[master].start()

    round_of("master killed, replicas=1", servers, receiver, url, during=master_crash, seconds=1.5)
    if owner(seed, slot)[0] != replica:
        fail("after the crash the slot is not served by the promoted replica")

    for s in servers:
        s.stop()
    for n in nodes:
        if n.proc.poll() is None:
            n.kill()
    receiver.shutdown()

print("redis cluster: ok")
