"""`edgefleet convert`'s language-model options: their help shows the defaults, and they reach the request."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

import pytest

from edgefleet.cli.convert import command
from edgefleet.converter import ConvertRequest, ProfileResult
from edgefleet.converter.generative import (
    DEFAULT_MAX_PERPLEXITY_RATIO,
    DEFAULT_MIN_NEXT_TOKEN_AGREEMENT,
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgefleet")
    command.register(parser.add_subparsers())
    return parser


def test_help_shows_the_converters_defaults() -> None:
    shown = (command.DEFAULT_MAX_PERPLEXITY_RATIO, command.DEFAULT_MIN_NEXT_TOKEN_AGREEMENT,
             command.DEFAULT_PROMPT_TOKENS, command.DEFAULT_OUTPUT_TOKENS)  # fmt: skip
    assert shown == (DEFAULT_MAX_PERPLEXITY_RATIO, DEFAULT_MIN_NEXT_TOKEN_AGREEMENT, DEFAULT_PROMPT_TOKENS,
                     DEFAULT_OUTPUT_TOKENS)  # fmt: skip
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        _parser().parse_args(["convert", "--help"])
    text = " ".join(out.getvalue().split())
    for default in (DEFAULT_MAX_PERPLEXITY_RATIO, DEFAULT_MIN_NEXT_TOKEN_AGREEMENT, DEFAULT_PROMPT_TOKENS,
                    DEFAULT_OUTPUT_TOKENS):  # fmt: skip
        assert f"(default {default})" in text
    assert "(default 60 s, 900 s for a language model; 0: no limit)" in text


def test_the_options_reach_the_request(
    monkeypatch: pytest.MonkeyPatch, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    seen: list[ConvertRequest] = []

    def fake_convert(request: ConvertRequest, **_: object) -> list[ProfileResult]:
        seen.append(request)
        return [ProfileResult("generic-x86-64", "x.bundle", "id", "ort-fp32", 1.0, 1.0, "next-token-agreement", 0.1, 1)]

    monkeypatch.setattr("edgefleet.converter.convert", fake_convert)
    argv = [
        "convert", "models/tinylm/model", "--profile", "generic-x86-64", "--calib", "c.txt", "--eval", "e.txt",
        "--out", str(tmp_path), "--key", str(keys[0]), "--max-perplexity-ratio", "1.001",
        "--min-next-token-agreement", "0.9", "--prompt-tokens", "16", "--output-tokens", "8", "--json",
    ]  # fmt: skip
    args = _parser().parse_args(argv)
    with contextlib.redirect_stdout(io.StringIO()):
        assert args.func(args) == 0
    (request,) = seen
    assert (request.max_perplexity_ratio, request.min_next_token_agreement) == (1.001, 0.9)
    assert (request.prompt_tokens, request.output_tokens) == (16, 8)
    assert request.time_budget_s == 900.0  # a language model's default budget
    with contextlib.redirect_stdout(io.StringIO()):
        assert args.func(_parser().parse_args([*argv, "--time-budget", "0"])) == 0
    assert seen[-1].time_budget_s is None  # 0: no limit
