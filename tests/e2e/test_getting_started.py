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
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.doc_pages import Page, page_blocks
from support.doc_pages import fresh_directory as page_directory
from support.paths import REPO

PAGE = REPO / "docs" / "getting-started.md"
PORTS = (8883, 8780, 8471, 8472)  # the page's broker, dashboard and agents' local API ports


def test_the_page_marks_its_steps_for_this_test() -> None:
    blocks = page_blocks(PAGE.read_text())
    assert sum(b.background for b in blocks) == 4, "broker, control plane, two agents"
    assert all(b.ready for b in blocks if b.background), "every background block says when it is ready"
    joined = "\n".join(b.body for b in blocks)
    for step in ("edgefleet init", "devices enroll", "edgefleet convert", "rollout start", "status", "--wait",
                 "--login-url", "rollout rollback"):  # fmt: skip
        assert step in joined, f"the page runs no {step!r}"
    assert "--allow-unjudged" not in PAGE.read_text(), "the first rollout passes on defaults, judged"


@pytest.fixture
def fresh_directory() -> Iterator[Path]:
    with page_directory(PORTS, REPO / "models") as directory:
        yield directory


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_getting_started_runs_as_written(fresh_directory: Path) -> None:
    page = Page(fresh_directory, PAGE)
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
