"""The attack ledger: every attack test records what it tried and whether it succeeded.

Attack tests take the session fixture `attack_ledger`, call `record(name, succeeded, detail)` once per attack and
then assert that it did not succeed. At the end of the session the table of every attack tried is printed, with
the count of attacks that succeeded (the goal is 0), and written to `attack-report.json` when
`EDGEFLEET_ATTACK_REPORT` names a path.

Under pytest-xdist each worker has its own ledger; a test's attacks travel with its teardown report (as user
properties) to the process that prints the table, so the table holds every attack of the run on one worker or many.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Attack:
    name: str
    succeeded: bool
    detail: str
    test: str


@dataclass
class AttackLedger:
    attacks: list[Attack] = field(default_factory=list)
    current_test: str = ""

    def record(self, name: str, succeeded: bool, detail: str = "") -> bool:
        """Record one attack; returns `succeeded` so a test can `assert not ledger.record(...)`."""
        self.attacks.append(Attack(name, bool(succeeded), detail, self.current_test))
        return bool(succeeded)

    @property
    def succeeded(self) -> list[Attack]:
        return [a for a in self.attacks if a.succeeded]

    def table(self) -> str:
        if not self.attacks:
            return ""
        width = max(len(a.name) for a in self.attacks)
        lines = [f"{'attack':<{width}}  result     what it met", f"{'-' * width}  ---------  -----------"]
        for attack in self.attacks:
            verdict = "SUCCEEDED" if attack.succeeded else "failed"
            lines.append(f"{attack.name:<{width}}  {verdict:<9}  {attack.detail}")
        lines.append(f"attacks tried: {len(self.attacks)}, succeeded: {len(self.succeeded)}")
        return "\n".join(lines)


_LEDGER = AttackLedger()  # what this process's tests record
_REPORTED = AttackLedger()  # what the reports of the run carry: the table (on xdist's controller, every worker's)
_PROPERTY = "edgefleet-attack"
_SENT = [0]  # how many of _LEDGER's attacks have left with a report


@pytest.fixture(scope="session")
def attack_ledger() -> Iterator[AttackLedger]:
    yield _LEDGER


@pytest.fixture(autouse=True)
def _name_current_attack_test(request: pytest.FixtureRequest) -> Iterator[None]:
    _LEDGER.current_test = request.node.nodeid
    yield
    # every attack not sent yet, those a module fixture recorded before this test included
    for attack in _LEDGER.attacks[_SENT[0] :]:
        request.node.user_properties.append((_PROPERTY, asdict(attack)))
    _SENT[0] = len(_LEDGER.attacks)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _REPORTED.attacks.extend(Attack(**value) for name, value in report.user_properties if name == _PROPERTY)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _REPORTED.attacks:
        return
    terminalreporter.section("attack suite")
    terminalreporter.write_line(_REPORTED.table())
    report = os.environ.get("EDGEFLEET_ATTACK_REPORT")
    if report:
        Path(report).write_text(json.dumps([asdict(a) for a in _REPORTED.attacks], indent=2))
