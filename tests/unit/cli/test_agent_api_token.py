"""The agent's local-API token on the command line (`edgefleet agent`): read from a file (first line), from
$EDGEFLEET_API_TOKEN or from --api-token, at least 16 characters, and never shown in the service's config repr."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from edgefleet.cli.agent_cmd import _api_token


def args(**values: object) -> argparse.Namespace:
    return argparse.Namespace(**{"api_token_file": None, "api_token": None, **values})


def test_the_token_comes_from_a_file_the_environment_or_the_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EDGEFLEET_API_TOKEN", raising=False)
    assert _api_token(args()) is None
    (tmp_path / "token").write_text("  from-the-file-0123456789 \nignored\n")
    assert _api_token(args(api_token_file=tmp_path / "token")) == "from-the-file-0123456789"
    monkeypatch.setenv("EDGEFLEET_API_TOKEN", "from-the-environment-0123")
    assert _api_token(args()) == "from-the-environment-0123"
    assert _api_token(args(api_token="from-the-option-0123456789")) == "from-the-option-0123456789"


def test_a_short_or_unreadable_token_stops_the_agent_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="at least 16"):
        _api_token(args(api_token="short"))
    with pytest.raises(SystemExit, match="cannot read a token"):
        _api_token(args(api_token_file=tmp_path / "missing"))
