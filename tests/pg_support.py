"""A real PostgreSQL (initdb and pg_ctl in a temporary folder, on a loopback port) and a real
PgBouncer in front of it, for the PostgreSQL store's tests (postgres_fleet.py, postgres_bloat.py).
PostgreSQL and PgBouncer refuse to run as root: run as root (CI), they run as the `postgres` user
that Debian's postgresql package makes. Standard library only; each process is ended through its
own pid file (pg_ctl stop) or by its id."""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time

# (A port below the ephemeral range: the tests stop PostgreSQL and start it again on the same
# port.)
from fleet_support import free_port as _free_port


def _as_postgres(command):
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--"] + command


def _give_to_postgres(path):
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(path, pw.pw_uid, pw.pw_gid)


class Postgres:
    """A PostgreSQL cluster of its own in `folder`: `settings` are extra `-c name=value`."""

    def __init__(self, bindir, folder, settings=()):
        self.bindir = bindir
        self.folder = os.path.join(folder, "pg")
        if os.geteuid() == 0:
            os.chmod(folder, 0o711)  # (a temporary folder is root's alone: postgres passes through)
        os.makedirs(self.folder)
        _give_to_postgres(self.folder)
        self.data = os.path.join(self.folder, "data")
        self.port = _free_port()
        self.settings = list(settings)
        subprocess.run(_as_postgres([os.path.join(bindir, "initdb"), "-D", self.data, "-A", "trust",
                                     "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C"]),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def uri(self, schema="rebound"):
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?schema={schema}"

    def start(self):
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
                   "-c max_connections=300 " + " ".join(f"-c {s}" for s in self.settings))
        subprocess.run(_as_postgres([os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-w",
                                     "-t", "60", "-l", os.path.join(self.folder, "log"), "-o",
                                     options, "start"]),
                       check=True, stdout=subprocess.DEVNULL)

    def stop(self, mode="fast"):
        """`immediate` is a crash: no checkpoint, recovery from the WAL at the next start."""
        subprocess.run(_as_postgres([os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-w",
                                     "-m", mode, "stop"]),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def psql(self, sql, port=None):
        """Runs `sql`; answers what it printed (tuples only, unaligned)."""
        out = subprocess.run([os.path.join(self.bindir, "psql"), "-X", "-q", "-t", "-A", "-h",
                              "127.0.0.1", "-p", str(port or self.port), "-U", "postgres", "-d",
                              "postgres", "-c", sql], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"psql: {out.stderr.strip()}")
        return out.stdout.strip()

    def session(self):
        """An interactive psql session (its stdin open): a transaction a test holds open."""
        return subprocess.Popen([os.path.join(self.bindir, "psql"), "-X", "-q", "-h", "127.0.0.1",
                                 "-p", str(self.port), "-U", "postgres", "-d", "postgres"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)


class PgBouncer:
    """PgBouncer in transaction mode in front of `pg`: every transaction may run on another server
    connection, so a client that relied on session state would break behind it."""

    def __init__(self, binary, pg, folder, pool_size=20):
        self.folder = os.path.join(folder, "pgbouncer")
        os.makedirs(self.folder)
        _give_to_postgres(self.folder)
        self.port = _free_port()
        self.pg = pg
        with open(os.path.join(self.folder, "users.txt"), "w") as f:
            f.write('"postgres" ""\n')
        with open(os.path.join(self.folder, "pgbouncer.ini"), "w") as f:
            f.write(f"""[databases]
postgres = host=127.0.0.1 port={pg.port} dbname=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.folder}/users.txt
pool_mode = transaction
admin_users = postgres
default_pool_size = {pool_size}
max_client_conn = 1000
logfile = {self.folder}/pgbouncer.log
pidfile = {self.folder}/pgbouncer.pid
""")
        for name in os.listdir(self.folder):
            _give_to_postgres(os.path.join(self.folder, name))
        self.proc = subprocess.Popen(_as_postgres([binary, os.path.join(self.folder,
                                                                        "pgbouncer.ini")]),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("pgbouncer did not start")

    def uri(self, schema="rebound"):
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?schema={schema}"

    def pool_mode(self):
        """What its admin console says the pool mode is."""
        out = subprocess.run([os.path.join(self.pg.bindir, "psql"), "-X", "-t", "-A", "-h",
                              "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d",
                              "pgbouncer", "-c", "SHOW CONFIG"],
                             capture_output=True, text=True, timeout=30)
        for line in out.stdout.splitlines():
            if line.startswith("pool_mode|"):
                return line.split("|")[1]
        return out.stdout + out.stderr

    def stop(self):
        if self.proc.poll() is None:
            # pgbouncer's own pid (under runuser, the process started is runuser).
            try:
                with open(os.path.join(self.folder, "pgbouncer.pid")) as f:
                    os.kill(int(f.read().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def find_bindir():
    """Where Debian's PostgreSQL binaries are (/usr/lib/postgresql/<major>/bin)."""
    for major in sorted(os.listdir("/usr/lib/postgresql"), reverse=True):
        path = f"/usr/lib/postgresql/{major}/bin"
        if os.path.exists(os.path.join(path, "pg_ctl")):
            return path
    return os.path.dirname(shutil.which("pg_ctl"))
