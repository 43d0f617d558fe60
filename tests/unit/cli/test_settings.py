"""The host commands' settings: a flag beats its variable, which beats the context, which beats the default; and
every option's help says its default and its variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefleet.cli import context as context_file
from edgefleet.cli.common import SETTINGS, resolve
from edgefleet.cli.main import build_parser
from edgefleet.core.errors import UserInputError

CONFIG = """
current-context = "lab"

[contexts.lab]
broker = "mqtts://lab.example:8883"
ca = "pki/ca.crt"
cert = "pki/edgefleet-cli.crt"
key = "pki/edgefleet-cli.key"
control_cert = "pki/edgefleet-host.crt"
control_key = "pki/edgefleet-host.key"
store = "sqlite:control.sqlite"
home = "."

[contexts.other]
broker = "mqtt://other.example:1883"
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [*(s.env for s in SETTINGS.values()), "EDGEFLEET_HOME", "EDGEFLEET_CONTEXT"]:
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "deployment" / "config.toml"
    path.parent.mkdir()
    path.write_text(CONFIG)
    monkeypatch.setenv("EDGEFLEET_CONFIG", str(path))
    return path


def parse(*argv: str) -> object:
    args = build_parser().parse_args(list(argv))
    resolve(args)
    return args


def test_the_current_context_fills_what_no_flag_or_variable_gives_with_paths_relative_to_its_file(
    config: Path,
) -> None:
    args = parse("fleet", "status")
    base = config.parent.resolve()
    assert args.broker == "mqtts://lab.example:8883"
    assert args.tls_ca == base / "pki" / "ca.crt" and args.tls_key == base / "pki" / "edgefleet-cli.key"
    assert args.prefix == "edgefleet/v1", "what the context leaves out is the default"


def test_a_variable_beats_the_context_and_a_flag_beats_both(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEFLEET_BROKER", "mqtt://from-env:1883")
    assert parse("fleet", "status").broker == "mqtt://from-env:1883"
    assert parse("fleet", "status", "--broker", "mqtt://from-flag:1883").broker == "mqtt://from-flag:1883"


def test_context_flag_and_variable_pick_another_context(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse("--context", "other", "fleet", "status").broker == "mqtt://other.example:1883"
    monkeypatch.setenv("EDGEFLEET_CONTEXT", "other")
    args = parse("fleet", "status")
    assert args.broker == "mqtt://other.example:1883" and args.tls_ca is None


def test_control_serve_takes_the_contexts_own_control_certificate(config: Path) -> None:
    args = parse("control", "serve")
    assert args.tls_cert.name == "edgefleet-host.crt" and args.tls_key.name == "edgefleet-host.key"
    assert args.store == f"sqlite://{config.parent.resolve() / 'control.sqlite'}"


def test_the_agent_reads_no_context(config: Path) -> None:
    args = parse("agent", "--broker", "mqtt://b:1883", "--device-id", "d", "--state-dir", "s")
    assert args.tls_ca is None and args.tls_cert is None


def test_an_unknown_context_lists_the_ones_that_exist(config: Path) -> None:
    with pytest.raises(UserInputError, match=r"unknown context 'nope'; valid: lab, other"):
        parse("--context", "nope", "fleet", "status")


def test_a_malformed_context_file_is_one_error_naming_the_key(config: Path) -> None:
    config.write_text('[contexts.lab]\nbrokr = "x"\n')
    with pytest.raises(UserInputError, match=r"contexts\.lab\.brokr: Extra inputs"):
        context_file.load(config)
    config.write_text("current-context = \n")
    with pytest.raises(UserInputError, match="not valid TOML"):
        context_file.load(config)


def test_no_file_means_no_context_and_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEFLEET_CONFIG", str(tmp_path / "absent.toml"))
    for s in SETTINGS.values():
        monkeypatch.delenv(s.env, raising=False)
    monkeypatch.delenv("EDGEFLEET_CONTEXT", raising=False)
    args = parse("fleet", "status")
    assert args.broker == "mqtt://127.0.0.1:1883" and args.tls_ca is None and args.protocol == "auto"


def _options(parser: object, path: str = "edgefleet") -> list[tuple[str, str, str]]:
    import argparse

    found = []
    assert isinstance(parser, argparse.ArgumentParser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _options(sub, f"{path} {name}")
        elif action.option_strings and action.help not in (None, argparse.SUPPRESS):
            found.append((path, action.dest, parser.formatter_class(path)._get_help_string(action)))
    return found


def test_every_option_with_a_default_says_it_and_every_setting_names_its_variable() -> None:
    import argparse

    parser = build_parser()
    missing = []
    for path, flag, text in _options(parser):
        if flag in SETTINGS and "env EDGEFLEET_" not in text and path.split()[1] not in (
            "keys", "init", "context", "demo",
        ):  # fmt: skip
            missing.append(f"{path} {flag}: no variable in {text!r}")
    assert not missing, "\n".join(missing)
    start = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["rollout"]
    rollout_start = next(a for a in start._actions if isinstance(a, argparse._SubParsersAction)).choices["start"]
    helps = rollout_start.format_help()
    for flag, shown in (
        ("--observe", "(default 1m)"),
        ("--baseline", "(default 30s)"),
        ("--min-reports", "(default 2)"),
    ):
        assert shown in " ".join(helps.split()), f"{flag} shows no default"
