"""Issue 32's attack 7 and the login-link row, as a local user who reads files, `ps` and logs: a PostgreSQL
store's password must not be readable in the context file, nor printed by `context show`, `context list`, the
`control serve` start line or an error, nor need to be on any command line; and a login link passed to a browser
on its command line must not hold a live token. Each counted in the attack ledger."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from edgefleet.control.dashboard import auth
from edgefleet.control.dashboard.server import DashboardServer
from edgefleet.control.store import open_store

from support.attacks.ledger import AttackLedger
from support.paths import REPO
from support.servers.brokers import MosquittoBroker
from support.servers.pg_server import PostgresServer

PASSWORD = "hunter2-secret-pw"
LAUNCH = "import sys; from edgefleet.cli import main\nsys.exit(main.main(sys.argv[1:]))"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEFLEET_", "PG"))}
    return {**clean, "EDGEFLEET_HOME": str(home), "PYTHONPATH": str(REPO)}


# A prefix of this test's own: `control serve` stopped by SIGTERM keeps its persistent session in the ingestion
# share group (a restarted instance picks up where it left off), and on the session's broker a left-over member of the
# default prefix's group would take its round-robin share of every later test's reports.
PREFIX = "attack-secrets/v1"


def edgefleet(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", LAUNCH, *args], capture_output=True, text=True, timeout=120,
                          env=env)  # fmt: skip


@pytest.fixture
def serve(env: dict[str, str], tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _started(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The `control serve` start line (its first line on stdout)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "control plane" in line:
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"control serve did not start: {proc.poll()}")


def test_a_postgres_password_stays_out_of_files_listings_start_lines_and_argv(
    env: dict[str, str], postgres: PostgresServer, mosquitto: MosquittoBroker,
    serve: list[subprocess.Popen[str]], attack_ledger: AttackLedger, tmp_path: Path,
) -> None:  # fmt: skip
    # The session's PostgreSQL trusts every password, so the URL with one opens as a real deployment's would.
    url = postgres.create_database("secrets")
    with_password = url.replace("postgres@", f"postgres:{PASSWORD}@")
    assert edgefleet(env, "context", "set", "prod", "--store", with_password, "--use").returncode == 0
    config = Path(env["EDGEFLEET_HOME"]) / "config.toml"
    file_mode, folder_mode = stat.S_IMODE(config.stat().st_mode), stat.S_IMODE(config.parent.stat().st_mode)
    shown = edgefleet(env, "context", "show").stdout + edgefleet(env, "context", "show", "--json").stdout
    listed = edgefleet(env, "context", "list").stdout + edgefleet(env, "context", "list", "--json").stdout
    bad = edgefleet(env, "control", "status", "--store", with_password.replace(url.rsplit("/", 1)[1], "nowhere"))
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "control", "serve", "--broker", mosquitto.url,
                             "--http", "off", "--instance", "secrets", "--prefix", PREFIX], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    serve.append(proc)
    start_line = _started(proc)
    leaked = [where for where, text in (("context show", shown), ("context list", listed), ("control status error",
              bad.stdout + bad.stderr), ("control serve start line", start_line)) if PASSWORD in text]  # fmt: skip
    assert not attack_ledger.record(
        "a PostgreSQL store URL with its password: read the context file, `context show`, errors, the start line",
        file_mode & 0o077 != 0 or folder_mode & 0o077 != 0 or bool(leaked),
        f"config.toml {file_mode:o}, its folder {folder_mode:o}; the password printed by: {leaked or 'none'}",
    )

    # The password can live outside the context and off every command line: a password_file key (or PGPASSFILE).
    secret = tmp_path / "pg.pass"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    assert edgefleet(env, "context", "set", "prod", "--store", url, "--password-file", str(secret)).returncode == 0
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "control", "serve", "--broker", mosquitto.url,
                             "--http", "off", "--instance", "secrets2", "--prefix", PREFIX], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    serve.append(proc)
    start_line = _started(proc)
    argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
    in_file = PASSWORD in config.read_text()
    assert not attack_ledger.record(
        "a PostgreSQL password on a command line (`ps` of `control serve`)",
        PASSWORD in argv or in_file or PASSWORD in start_line,
        f"argv holds it: {PASSWORD in argv}; the context file holds it: {in_file}; the store opened from "
        f"password_file: {'store postgresql://' in start_line}",
    )


def test_a_login_link_on_a_browsers_command_line_holds_no_live_token(
    env: dict[str, str], tmp_path: Path, attack_ledger: AttackLedger
) -> None:
    store_url = f"sqlite://{tmp_path}/control.sqlite"
    made = edgefleet(env, "control", "token", "--name", "shot", "--login-url", "--store", store_url)
    assert made.returncode == 0, made.stderr
    link = made.stdout.strip()
    code = parse_qs(urlsplit(link).query)["code"][0]
    store = open_store(store_url)
    server = DashboardServer(store, "127.0.0.1", 0).start()
    try:
        import http.client

        def get(path: str) -> tuple[int, str]:
            conn = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1].rstrip("/")), timeout=10)
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            return response.status, response.getheader("location") or ""

        first = get(f"/login?code={code}")  # the browser that was given the link
        second = get(f"/login?code={code}")  # anyone who read it from `ps` afterwards
        as_token = auth.caller(store, f"Bearer {code}", None) if code.startswith(auth.TOKEN_PREFIX) else None
    finally:
        server.stop()
        store.close()
    assert first == (303, "/"), first
    assert not attack_ledger.record(
        "a login link read from a browser's argv (`control token --login-url`)",
        auth.TOKEN_PREFIX in link or second != (303, "/login?failed=1") or as_token is not None,
        f"the link holds a one-time code, not the token: {auth.TOKEN_PREFIX not in link}; its first use logged in, "
        f"a second use answered {second[0]} {second[1]}",
    )
    assert json.loads(edgefleet(env, "control", "token", "--list", "--json", "--store", store_url).stdout)["tokens"]
