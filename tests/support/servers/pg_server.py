"""Test helper: a real PostgreSQL server (Debian's `postgresql` package) in a temporary directory on a free port.

`initdb` refuses to run as root, so as root the server runs as the `postgres` system user (created by the
package) through `runuser`. Tests that need it fail, never skip, when the binaries are missing: CI installs them.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from support.servers.brokers import HOST, free_port

_SEARCH = ("/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin", "/opt/homebrew/bin")


def pg_bindir() -> Path:
    """The directory holding initdb and pg_ctl; a RuntimeError when PostgreSQL is not installed."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    for pattern in _SEARCH:
        for directory in sorted(glob.glob(pattern), reverse=True):  # the newest version first
            if Path(directory, "initdb").is_file():
                return Path(directory)
    raise RuntimeError("PostgreSQL is not installed (no initdb): apt-get install -y postgresql")


class PostgresServer:
    """`initdb` + `pg_ctl start` on 127.0.0.1:<free port>, trust authentication; fsync off unless `durable` (tests
    need no durability across power loss; a benchmark does, to be honest about write latency)."""

    def __init__(self, port: int = 0, durable: bool = False) -> None:
        self.durable = durable
        self.bindir = pg_bindir()
        self.port = port or free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="edgefleet-pg-")
        self.root = Path(self._tmp.name)
        self.datadir = self.root / "data"
        self.logfile = self.root / "server.log"
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError as err:
                raise RuntimeError("running as root needs the `postgres` system user (the package makes it)") from err
            self.user = "postgres"
            shutil.chown(self.root, "postgres")
            os.chmod(self.root, 0o755)

    def _run(self, *args: str, timeout: float = 120.0) -> str:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result.stdout

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@{HOST}:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@{HOST}:{self.port}/{database}"

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except (FileNotFoundError, PermissionError):
            return ""

    def start(self) -> PostgresServer:
        if not (self.datadir / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.datadir), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-p {self.port} -h {HOST} -k {self.root} -c max_connections=200"
        if not self.durable:
            options += " -c fsync=off"
        self._run("pg_ctl", "-D", str(self.datadir), "-l", str(self.logfile), "-o", options, "-w", "-t", "60", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        if (self.datadir / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self) -> None:
        """Stop (every connection is cut) and start again on the same port."""
        self.stop()
        self.start()

    def create_database(self, prefix: str = "t") -> str:
        """A fresh empty database; its URL."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def wait_ready(self, timeout: float = 60.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.admin_url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def close(self) -> None:
        try:
            self.stop("immediate")
        finally:
            self._tmp.cleanup()

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
