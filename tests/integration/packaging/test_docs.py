"""The README is a front door and the pages behind it hold up: it stays short, every link and every file a page
names exists (a claim backed by a test names a test that is there), and the measured tables and the README's
headline figures are what bench/report.py makes of the benchmarks' JSON."""

from __future__ import annotations

import re
import subprocess
import sys

from support.paths import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "deploy" / "README.md"]
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_PATH = re.compile(
    r"(?<![\w./-])((?:tests|edgefleet|agent|converter|bench|scripts|deploy|models|device_profiles|docs)/[\w./-]*?"
    r"\.(?:py|md|yaml|sh|conf|json|toml|service))(?![\w])"
)


def test_the_readme_is_a_front_door_under_300_lines() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < 300, len(lines)


def test_every_page_the_readme_promises_exists() -> None:
    for name in ("getting-started", "converter", "agent", "trust", "transfer", "control-plane", "scale-out",
                 "local-api", "troubleshooting", "results"):  # fmt: skip
        assert (REPO / "docs" / f"{name}.md").is_file(), name


def test_every_link_and_every_named_file_exists() -> None:
    missing = []
    for page in PAGES:
        text = page.read_text()
        for target in _LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(REPO)}: link {target}")
        for path in _PATH.findall(text):
            if path.startswith("bench/results/"):  # where a bench writes; present once it has run
                continue
            if not (REPO / path).exists():
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert not missing, "\n".join(sorted(set(missing)))


def test_the_measured_tables_and_headlines_are_generated_from_the_benchmarks_json() -> None:
    result = subprocess.run([sys.executable, "bench/report.py", "--check"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
