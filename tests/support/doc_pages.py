"""Documentation pages, executed: the fenced blocks a page marks `{run}` run as written, in order, in one directory.

A block marked `{run}` runs in bash (`set -euo pipefail`; a `python` block in this checkout's Python) and must exit
0; `{run=background ready=…}` starts a long-running process (its own terminal on the page) and waits until its
output matches the `ready` pattern, or `ready=port:N` until something listens on N. Blocks without the mark are
read, never run (install steps: the tests run in the checkout's own environment).

docs/getting-started.md runs once per session (`getting_started_fleet`): tests/e2e/test_getting_started.py checks
what it promises, and tests/e2e/test_language_models_page.py runs docs/language-models.md on the fleet it leaves,
as the page says a reader does, instead of building a second fleet the same way (5 minutes).
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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.paths import REPO

_FENCE = re.compile(r"^```(?P<lang>\w+)[ \t]*(?:\{(?P<attrs>[^}]*)\})?[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    line: int
    body: str
    lang: str
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
                lang=match["lang"],
                background=options.get("run") == "background",
                ready=options.get("ready"),
            )
        )
    return blocks


class Page:
    """Runs the blocks: foreground ones to completion, background ones kept running until `close`."""

    def __init__(self, directory: Path, page: Path) -> None:
        self.directory, self.page = directory, page
        self.logs = directory / ".page-logs"
        self.logs.mkdir()
        home = directory / ".home"
        home.mkdir()
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # this checkout's edgefleet
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFLEET_")} | {
            "HOME": str(home), "PATH": path, "PYTHONUNBUFFERED": "1",
        }  # fmt: skip
        self.background: list[tuple[Block, subprocess.Popen[bytes], Path]] = []

    def run(self, block: Block) -> str:
        """Run one block; returns what a foreground block printed."""
        if block.background:
            self._start(block)
            return ""
        command = (
            [sys.executable, "-c", block.body]
            if block.lang == "python"
            else ["bash", "-c", "set -euo pipefail\n" + block.body]
        )
        result = subprocess.run(
            command, cwd=self.directory, env=self.env, capture_output=True, text=True, timeout=1500
        )  # fmt: skip
        assert result.returncode == 0, (
            f"docs/{self.page.name} line {block.line} failed ({result.returncode}):\n{block.body}\n"
            f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}\n{self.tails()}"
        )
        return result.stdout

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
            f"--- {self.page.name} line {b.line} ({'running' if p.poll() is None else f'exited {p.returncode}'})\n"
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


@contextmanager
def fresh_directory(ports: tuple[int, ...], models: Path) -> Iterator[Path]:
    """An empty directory with a link `models` to the clone's models/ folder (the pages name it from the clone's
    root); fails at once when a port the pages use is taken."""
    busy = []
    for port in ports:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(port)
    if busy:
        raise AssertionError(f"the page uses fixed ports and {busy} are taken on this machine: stop what listens there")
    with tempfile.TemporaryDirectory(prefix="edgefleet-page-") as name:
        os.chmod(name, 0o755)  # the broker, started as root, runs as "mosquitto": it must pass this folder
        directory = Path(name)
        (directory / "models").symlink_to(models)
        yield directory


GETTING_STARTED = REPO / "docs" / "getting-started.md"
PORTS = (8883, 8780, 8471, 8472)  # getting-started's broker, dashboard and agents' local API ports


@dataclass(frozen=True)
class GettingStartedFleet:
    """docs/getting-started.md, run as written: the page (its directory, its running broker, control plane and two
    agents), how long each block took, and where the devices were after the page's rollback."""

    page: Page
    timings: list[str]
    version_1: str  # the bundle id of digits_cnn-1 for generic-x86-64, as `bundle show` reads it
    after_rollback: dict[str, str]  # device -> bundle, once both served version 1 (or when 180 s had passed)


@pytest.fixture(scope="session")
def getting_started_fleet() -> Iterator[GettingStartedFleet]:
    """Runs docs/getting-started.md once; its background processes run until the session ends. Its tests share the
    xdist group fixed-ports (support/parallel_runs.py), so they run on one worker and find the fleet there."""
    with fresh_directory(PORTS, REPO / "models") as directory:
        page = Page(directory, GETTING_STARTED)
        try:
            timings, started = [], time.monotonic()
            for block in page_blocks(GETTING_STARTED.read_text()):
                begin = time.monotonic()
                page.run(block)
                timings.append(f"line {block.line}: {time.monotonic() - begin:.1f} s (at {begin - started:.1f} s)")
            version_1, after = _after_the_rollback(page)
            fleet = GettingStartedFleet(page, timings, version_1, after)
        except AssertionError as err:
            tails = page.tails()
            page.close()
            raise AssertionError(f"{err}\n{tails}") from None
        except BaseException:
            page.close()
            raise
        try:
            yield fleet
        finally:
            page.close()


def _after_the_rollback(page: Page) -> tuple[str, dict[str, str]]:
    """Version 1's bundle id, and what `fleet status` shows once both devices run it (or after 180 s)."""
    shown = json.loads(page.edgefleet("bundle", "show", "bundles/digits_cnn-1-generic-x86-64.bundle", "--json").stdout)
    first = shown["manifest"]["bundle_id"]
    deadline = time.monotonic() + 180
    while True:
        fleet = json.loads(page.edgefleet("fleet", "status", "--wait", "1", "--json").stdout)
        bundles = {d["device_id"]: d["bundle"] for d in fleet["devices"]}
        if bundles == {"dev-1": first, "dev-2": first} or time.monotonic() > deadline:
            return first, bundles
        time.sleep(2)
