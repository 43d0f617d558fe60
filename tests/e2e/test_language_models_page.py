"""docs/language-models.md, executed: its `{run}` blocks, as written, on the fleet docs/getting-started.md sets up
(whose blocks run first, once a session, in the same directory: support/doc_pages.py, getting_started_fleet; the
broker, the control plane and the agents dev-1 and dev-2, which end up serving the digits CNN). The page converts
tinylm, rolls it out to group lab on the default guardrails and streams from dev-1's local API with the openai
client (support/doc_pages.py runs the blocks)."""

from __future__ import annotations

import re
import time

import pytest

from support.doc_pages import GETTING_STARTED, GettingStartedFleet, page_blocks
from support.paths import REPO

PAGE = REPO / "docs" / "language-models.md"


def test_the_page_runs_its_steps_against_the_agents_getting_started_starts() -> None:
    blocks = page_blocks(PAGE.read_text())
    joined = "\n".join(b.body for b in blocks)
    for step in ("edgefleet convert", "rollout start", "--wait", "fleet status", "OpenAI("):
        assert step in joined, f"the page runs no {step!r}"
    ports = re.findall(r"127\.0\.0\.1:(\d+)", joined)
    started = re.findall(r"--http-port (\d+)", GETTING_STARTED.read_text())
    assert ports and set(ports) <= set(started), f"the page calls ports {ports}; getting-started's agents: {started}"


# serial: the page's rollouts are judged on latency, each device against its own baseline window; beside other
# workers the baseline and the observation saw different loads, and wave 1 failed "within the noise" (3-worker run).
@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_language_models_runs_as_written_on_the_getting_started_fleet(
    getting_started_fleet: GettingStartedFleet,
) -> None:
    page = getting_started_fleet.page
    page.page = PAGE
    try:
        printed = ""
        for block in page_blocks(PAGE.read_text()):
            begin = time.monotonic()
            printed = page.run(block)
            print(f"language-models.md line {block.line}: {time.monotonic() - begin:.1f} s")
        assert printed.strip(), "the openai client streamed no text from dev-1"
    except AssertionError as err:
        raise AssertionError(f"{err}\n{page.tails()}") from None
