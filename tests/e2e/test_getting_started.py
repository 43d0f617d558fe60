"""docs/getting-started.md, executed: its `{run}` blocks, as written, in a fresh directory, with the secure
configuration `edgefleet init` writes (mutual TLS, dynamic security, a real Mosquitto started as root that
switches to its own user), the control plane and two agent processes; then what the page promises is checked:
the dashboard screenshot shows the logged-in page, and the rollback puts both devices back on version 1.

A block marked `{run}` runs in bash (`set -euo pipefail`) and must exit 0; `{run=background ready=…}` starts a
long-running process (its own terminal on the page) and waits until its output matches the `ready` pattern, or
`ready=port:N` until something listens on N. Blocks without the mark are read, never run (the install step: this
test runs in the checkout's own environment). The directory holds a link `models` to the clone's models/ folder,
which the page's commands name from the clone's root.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.paths import REPO

PAGE = REPO / "docs" / "getting-started.md"
PORTS = (8883, 8780, 8471, 8472)  # the page's broker, dashboard and agents' local API ports
_FENCE = re.compile(r"^```(?P<lang>\w+)[ \t]*(?:\{(?P<attrs>[^}]*)\})?[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    line: int
    body: str
    background: bool
    ready: str | None


def page_blocks(text: str) -> list[Block]:
    """The page's `{run}` blocks in order."""
    blocks = []
    for match in _FENCE.finditer(text):
        attrs = shlex.split(match["attrs"] or "")
        if not any(a == "run" or a.startswith("run=") for a in attrs):
            continue
        options = dict(a.split("=", 1) for a in attrs if "=" in a)
        blocks.append(
            Block(
                line=text.count("\n", 0, match.start()) + 1,
                body=match["body"],
                background=options.get("run") == "background",
                ready=options.get("ready"),
            )
        )
    return blocks


def test_the_page_marks_its_steps_for_this_test() -> None:
    blocks = page_blocks(PAGE.read_text())
    assert sum(b.background for b in blocks) == 4, "broker, control plane, two agents"
    assert all(b.ready for b in blocks if b.background), "every background block says when it is ready"
    joined = "\n".join(b.body for b in blocks)
    for step in ("edgefleet init", "devices enroll", "edgefleet convert", "rollout start", "status", "--wait",
                 "--login-url", "rollout rollback"):  # fmt: skip
        assert step in joined, f"the page runs no {step!r}"
    assert "--allow-unjudged" not in PAGE.read_text(), "the first rollout passes on defaults, judged"


class Page:
    """Runs the blocks: foreground ones to completion, background ones kept running until `close`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.logs = directory / ".page-logs"
        self.logs.mkdir()
        home = directory / ".home"
        home.mkdir()
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # this checkout's edgefleet
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFLEET_")} | {
            "HOME": str(home), "PATH": path, "PYTHONUNBUFFERED": "1",
        }  # fmt: skip
        self.background: list[tuple[Block, subprocess.Popen[bytes], Path]] = []

    def run(self, block: Block) -> None:
        if block.background:
            self._start(block)
            return
        result = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + block.body], cwd=self.directory, env=self.env,
            capture_output=True, text=True, timeout=1500,
        )  # fmt: skip
        assert result.returncode == 0, (
            f"docs/getting-started.md line {block.line} failed ({result.returncode}):\n{block.body}\n"
            f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}\n{self.tails()}"
        )

    def _start(self, block: Block) -> None:
        log = self.logs / f"line-{block.line}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["bash", "-c", block.body], cwd=self.directory, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.background.append((block, process, log))
        assert block.ready is not None
        deadline = time.monotonic() + 120
        while not self._is_ready(block.ready, log):
            assert process.poll() is None, f"line {block.line} exited {process.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"line {block.line} not ready ({block.ready}):\n{log.read_text()}"
            time.sleep(0.2)

    @staticmethod
    def _is_ready(ready: str, log: Path) -> bool:
        if ready.startswith("port:"):
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", int(ready.removeprefix("port:")))) == 0
        return re.search(ready, log.read_text(errors="replace")) is not None

    def edgefleet(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["edgefleet", *args], cwd=self.directory, env=self.env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    def tails(self) -> str:
        return "\n".join(
            f"--- line {b.line} ({'running' if p.poll() is None else f'exited {p.returncode}'})\n"
            f"{log.read_text(errors='replace')[-2500:]}"
            for b, p, log in self.background
        )

    def close(self) -> None:
        for _, process, _ in reversed(self.background):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)  # the block's own process group (start_new_session)
        for _, process, _ in self.background:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)


@pytest.fixture
def fresh_directory() -> Iterator[Path]:
    busy = []
    for port in PORTS:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    if busy:
        pytest.fail(f"the page uses fixed ports and {busy} are taken on this machine: stop what listens there")
    with tempfile.TemporaryDirectory(prefix="edgefleet-getting-started-") as name:
        os.chmod(name, 0o755)  # the broker, started as root, runs as "mosquitto": it must pass this folder
        directory = Path(name)
        (directory / "models").symlink_to(REPO / "models")
        yield directory


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_getting_started_runs_as_written(fresh_directory: Path) -> None:
    page = Page(fresh_directory)
    try:
        started = time.monotonic()
        for block in page_blocks(PAGE.read_text()):
            begin = time.monotonic()
            page.run(block)
            print(f"line {block.line}: {time.monotonic() - begin:.1f} s (at {begin - started:.1f} s)")
        _dashboard_shows_the_logged_in_page(page)
        _both_devices_return_to_version_1(page)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{page.tails()}") from None
    finally:
        page.close()


def _dashboard_shows_the_logged_in_page(page: Page) -> None:
    screenshot = page.directory / "dashboard.png"
    assert screenshot.is_file() and screenshot.stat().st_size > 20_000, "the page's screenshot"
    link = page.edgefleet("control", "token", "--name", "check", "--ttl", "5m", "--login-url").stdout.strip()
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--virtual-time-budget=5000", "--dump-dom", link],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    assert "signed in as" in dom and "dev-1" in dom and "dev-2" in dom, dom[:2000]


def _both_devices_return_to_version_1(page: Page) -> None:
    shown = json.loads(page.edgefleet("bundle", "show", "bundles/digits_cnn-1-generic-x86-64.bundle", "--json").stdout)
    first = shown["manifest"]["bundle_id"]
    deadline = time.monotonic() + 180
    while True:
        fleet = json.loads(page.edgefleet("fleet", "status", "--wait", "1", "--json").stdout)
        bundles = {d["device_id"]: d["bundle"] for d in fleet["devices"]}
        if bundles == {"dev-1": first, "dev-2": first}:
            return
        assert time.monotonic() < deadline, f"after the rollback the devices run {bundles}, not {first}"
        time.sleep(2)
