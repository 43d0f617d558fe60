"""docs/getting-started.md, executed: its `{run}` blocks, as written, in a fresh directory, with the secure
configuration `edgefleet init` writes (mutual TLS, dynamic security, a real Mosquitto started as root that
switches to its own user), the control plane and two agent processes; then what the page promises is checked:
the dashboard screenshot shows the logged-in page, and the rollback puts both devices back on version 1. The page
runs once a session (support/doc_pages.py: getting_started_fleet): test_language_models_page.py goes on from the
fleet it leaves, as a reader of docs/language-models.md does.

A block marked `{run}` runs in bash (`set -euo pipefail`) and must exit 0; `{run=background ready=…}` starts a
long-running process (its own terminal on the page) and waits until its output matches the `ready` pattern, or
`ready=port:N` until something listens on N. Blocks without the mark are read, never run (the install step: this
test runs in the checkout's own environment). The directory holds a link `models` to the clone's models/ folder,
which the page's commands name from the clone's root.
"""

from __future__ import annotations

import subprocess

import pytest

from support.doc_pages import GETTING_STARTED as PAGE
from support.doc_pages import GettingStartedFleet, page_blocks


def test_the_page_marks_its_steps_for_this_test() -> None:
    blocks = page_blocks(PAGE.read_text())
    assert sum(b.background for b in blocks) == 4, "broker, control plane, two agents"
    assert all(b.ready for b in blocks if b.background), "every background block says when it is ready"
    joined = "\n".join(b.body for b in blocks)
    for step in ("edgefleet init", "devices enroll", "edgefleet convert", "rollout start", "status", "--wait",
                 "--login-url", "rollout rollback"):  # fmt: skip
        assert step in joined, f"the page runs no {step!r}"
    assert "--allow-unjudged" not in PAGE.read_text(), "the first rollout passes on defaults, judged"


# serial: the page's rollouts are judged on latency, each device against its own baseline window; beside other
# workers the baseline and the observation saw different loads, and wave 1 failed "within the noise" (3-worker run).
@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_getting_started_runs_as_written(getting_started_fleet: GettingStartedFleet) -> None:
    """The page's blocks ran (support/doc_pages.py: getting_started_fleet, once a session); what it promises holds."""
    fleet = getting_started_fleet
    print("\n".join(fleet.timings))
    try:
        _dashboard_shows_the_logged_in_page(fleet)
        expected = {"dev-1": fleet.version_1, "dev-2": fleet.version_1}
        assert fleet.after_rollback == expected, f"after the rollback the devices ran {fleet.after_rollback}"
    except AssertionError as err:
        raise AssertionError(f"{err}\n{fleet.page.tails()}") from None


def _dashboard_shows_the_logged_in_page(fleet: GettingStartedFleet) -> None:
    page = fleet.page
    screenshot = page.directory / "dashboard.png"
    assert screenshot.is_file() and screenshot.stat().st_size > 20_000, "the page's screenshot"
    link = page.edgefleet("control", "token", "--name", "check", "--ttl", "5m", "--login-url").stdout.strip()
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--virtual-time-budget=5000", "--dump-dom", link],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    assert "signed in as" in dom and "dev-1" in dom and "dev-2" in dom, dom[:2000]
