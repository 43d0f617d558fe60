"""docs/language-models.md, executed: its `{run}` blocks, as written, on the fleet docs/getting-started.md sets up
(whose blocks run first, in the same directory: the broker, the control plane and the agents dev-1 and dev-2, which
end up serving the digits CNN). The page converts tinylm, rolls it out to group lab on the default guardrails and
streams from dev-1's local API with the openai client (support/doc_pages.py runs the blocks)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.doc_pages import Page, page_blocks
from support.doc_pages import fresh_directory as page_directory
from support.paths import REPO

PAGE = REPO / "docs" / "language-models.md"
GETTING_STARTED = REPO / "docs" / "getting-started.md"
PORTS = (8883, 8780, 8471, 8472)


def test_the_page_runs_its_steps_against_the_agents_getting_started_starts() -> None:
    blocks = page_blocks(PAGE.read_text())
    joined = "\n".join(b.body for b in blocks)
    for step in ("edgefleet convert", "rollout start", "--wait", "fleet status", "OpenAI("):
        assert step in joined, f"the page runs no {step!r}"
    ports = re.findall(r"127\.0\.0\.1:(\d+)", joined)
    started = re.findall(r"--http-port (\d+)", GETTING_STARTED.read_text())
    assert ports and set(ports) <= set(started), f"the page calls ports {ports}; getting-started's agents: {started}"


@pytest.fixture
def fresh_directory() -> Iterator[Path]:
    with page_directory(PORTS, REPO / "models") as directory:
        yield directory


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_language_models_runs_as_written_on_the_getting_started_fleet(fresh_directory: Path) -> None:
    page = Page(fresh_directory, GETTING_STARTED)
    try:
        for block in page_blocks(GETTING_STARTED.read_text()):
            page.run(block)
        page.page = PAGE
        printed = ""
        for block in page_blocks(PAGE.read_text()):
            begin = time.monotonic()
            printed = page.run(block)
            print(f"language-models.md line {block.line}: {time.monotonic() - begin:.1f} s")
        assert printed.strip(), "the openai client streamed no text from dev-1"
    except AssertionError as err:
        raise AssertionError(f"{err}\n{page.tails()}") from None
    finally:
        page.close()
