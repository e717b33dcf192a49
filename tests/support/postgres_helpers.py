"""A throwaway PostgreSQL cluster and an ``mlflow server`` on it, for the Postgres integration test.

    with PostgresCluster.start(bin_dir) as pg:           # initdb + pg_ctl start on 127.0.0.1:<free port>
        url = pg.create_database("mlflow")              # postgresql+psycopg://lifecycle:...@127.0.0.1:<port>/mlflow
        with MlflowServer.start(url, artifacts) as server:
            server.url                                   # http://127.0.0.1:<port>, healthy

The cluster is the test's own (no reliance on a system cluster or service): ``initdb`` into a temporary folder,
its own port and unix-socket folder, fsync off, stopped with ``pg_ctl stop -m fast`` and deleted afterwards.
``initdb`` refuses to run as root, so under root every server command runs as the unprivileged ``postgres`` user
(created by Debian's package) and the folder is handed to it. Clients connect over TCP with a password (the
same path production takes); the bootstrap superuser only over the unix socket (trust).

``postgres_bin`` finds Debian's binaries (``/usr/lib/postgresql/<major>/bin``), installing them with
``scripts/install-services.sh`` when absent; ``Unavailable`` says why that was impossible.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.process import free_port

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "scripts" / "install-services.sh"
USER = "lifecycle"  # the password role the product connects as
PASSWORD = "lifecycle-test-pw"


class Unavailable(Exception):
    """PostgreSQL cannot be run here (no binaries and no way to install them, or no unprivileged user)."""


def _major(path: Path) -> int:
    m = re.fullmatch(r"\d+", path.parent.name)
    return int(m.group()) if m else -1


def find_postgres_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<major>/bin`` that has ``initdb`` and ``pg_ctl``."""
    found = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb") if (p.parent / "pg_ctl").is_file()]
    return max(found, key=_major, default=None)


def postgres_bin() -> Path:
    """Debian's server binaries, installed with ``scripts/install-services.sh`` first when they are missing."""
    found = find_postgres_bin()
    if found is not None:
        return found
    proc = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=900)
    found = find_postgres_bin()
    if proc.returncode != 0 or found is None:
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise Unavailable(f"PostgreSQL server binaries are not installed and {INSTALL_SCRIPT.name} failed: {why}")
    return found


@dataclass
class PostgresCluster:
    """A running cluster of our own; ``url(db)`` is a SQLAlchemy URL for the password role."""

    bin_dir: Path
    root: Path  # holds data/, sockets/ and server.log
    port: int
    owner: str | None  # OS user the server runs as when we are root, else None (ourselves)

    @classmethod
    @contextlib.contextmanager
    def start(cls, bin_dir: Path) -> Iterator[PostgresCluster]:
        owner = None
        if os.geteuid() == 0:
            owner = "postgres"
            try:
                pw = pwd.getpwnam(owner)
            except KeyError:
                raise Unavailable("running as root and there is no 'postgres' user for initdb to run as") from None
        # not pytest's tmp_path: under root that lives in a 0700 folder the postgres user cannot enter
        root = Path(tempfile.mkdtemp(prefix="lifecycle-pg-"))
        if owner is not None:
            os.chown(root, pw.pw_uid, pw.pw_gid)
        cluster = cls(bin_dir, root, free_port(), owner)
        try:
            cluster._init()
            cluster._pg_ctl("start", "-w", "-t", "60", "-l", str(root / "server.log"), "-o", cluster._options())
            cluster._bootstrap()
            yield cluster
        finally:
            try:
                if (cluster.data / "postmaster.pid").exists():  # also after a start that timed out half-way
                    cluster._pg_ctl("stop", "-m", "fast", "-w", "-t", "60")
            finally:
                shutil.rmtree(root, ignore_errors=True)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def sockets(self) -> Path:
        return self.root / "sockets"

    def _run(self, *argv: str) -> None:
        cmd = [str(self.bin_dir / argv[0]), *argv[1:]]
        if self.owner is not None:
            cmd = ["runuser", "-u", self.owner, "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.root)
        if proc.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({proc.returncode}): {proc.stderr.strip()}\n{tail}")

    def _init(self) -> None:
        # local (socket) connections trust the bootstrap superuser; TCP needs a password, as in production
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth-local=trust", "--auth-host=scram-sha-256")
        self.sockets.mkdir()
        if self.owner is not None:
            pw = pwd.getpwnam(self.owner)
            os.chown(self.sockets, pw.pw_uid, pw.pw_gid)

    def _options(self) -> str:
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.sockets),
            # a throwaway cluster: durability buys nothing and costs seconds on a slow disk
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
        }
        return " ".join(f"-c {k}={v}" for k, v in settings.items())

    def _pg_ctl(self, *argv: str) -> None:
        self._run("pg_ctl", argv[0], "-D", str(self.data), *argv[1:])

    def admin(self, dbname: str = "postgres") -> Any:
        """A psycopg connection as the bootstrap superuser over the unix socket (autocommit)."""
        import psycopg

        return psycopg.connect(host=str(self.sockets), port=self.port, user="postgres", dbname=dbname, autocommit=True)

    def _bootstrap(self) -> None:
        with self.admin() as conn:
            conn.execute(f"CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'")

    def create_database(self, name: str) -> str:
        """A new database owned by the password role; returns its SQLAlchemy URL."""
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}" OWNER {USER}')
        return self.url(name)

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str) -> Any:
        """A psycopg connection as the password role over TCP (what the product's URLs use)."""
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=self.port, user=USER, password=PASSWORD, dbname=dbname, autocommit=True
        )


@dataclass
class MlflowServer:
    """``mlflow server`` on a database URI, artifacts proxied into a local folder, stopped with its process group."""

    url: str
    log: Path

    @classmethod
    @contextlib.contextmanager
    def start(cls, backend_store_uri: str, root: Path, timeout_s: float = 240) -> Iterator[MlflowServer]:
        root.mkdir(parents=True, exist_ok=True)
        port = free_port()
        exe = str(Path(sys.executable).parent / "mlflow")
        log_path = root / "server.log"
        argv = [exe, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
        argv += ["--backend-store-uri", backend_store_uri, "--artifacts-destination", str(root / "artifacts")]
        with log_path.open("w") as log:
            # no server jobs (GenAI scoring, trace archival: a job runner and seven huey consumers): the registry
            # uses none of them, and on a 2-core machine they slow everything else down
            env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
            proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=log, env=env)
            server = cls(f"http://127.0.0.1:{port}", log_path)
            try:
                server._wait_healthy(proc, timeout_s)
                yield server
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    def _wait_healthy(self, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited ({proc.returncode}):\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"mlflow server not healthy after {timeout_s:.0f} s:\n{self.log.read_text()[-3000:]}"
                )
            time.sleep(0.5)
