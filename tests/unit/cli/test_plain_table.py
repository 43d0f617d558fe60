"""Tables on a device: the base install has no rich (it comes with the `host` extra), and a command that prints a
table, `edgefleet profiles detect` on an ARM board among them, prints the same cells as tab-separated lines."""

from __future__ import annotations

import sys

import pytest

from edgefleet.cli.common import print_table


def test_without_rich_a_table_is_printed_as_tab_separated_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "rich.console", None)  # import fails, as where rich is not installed
    print_table("profiles on this machine", ["profile", "matches"], [("generic-arm64", "best"), ("rpi5\x1b[2J", None)])
    assert capsys.readouterr().out.splitlines() == [
        "profiles on this machine",
        "profile\tmatches",
        "generic-arm64\tbest",
        "rpi5\ufffd[2J\t-",  # a control character from a device is replaced here too
    ]
