"""Options and output helpers shared by the commands."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel

from edgefleet.cli import context as context_file
from edgefleet.core.errors import UserInputError
from edgefleet.core.home import edgefleet_home as edgefleet_home  # re-exported for the commands
from edgefleet.core.home import keys_dir
from edgefleet.core.mqtt.connection import Connection, TlsFiles
from edgefleet.core.topics import DEFAULT_PREFIX, Topics

PROTOCOLS = ("auto", "3.1.1", "5")


def default_key() -> Path:
    """The converter's bundle-role key (see `edgefleet keys init`)."""
    return keys_dir() / "bundle.key"


# --- settings: a flag beats its environment variable, which beats the context, which beats the default
@dataclass(frozen=True)
class Setting:
    dest: str
    flag: str
    env: str
    context_key: str
    default: Callable[[], str | None]
    default_text: str
    what: str
    is_path: bool = False
    choices: tuple[str, ...] = ()
    metavar: str | None = None

    def help(self) -> str:
        return f"{self.what} (default {self.default_text}; env {self.env}; context key {self.context_key})"


def _store_default() -> str:
    return f"sqlite://{edgefleet_home() / 'control.sqlite'}"


SETTINGS: dict[str, Setting] = {
    s.dest: s
    for s in (
        Setting("broker", "--broker", "EDGEFLEET_BROKER", "broker", lambda: "mqtt://127.0.0.1:1883",
                "mqtt://127.0.0.1:1883", "broker URL, mqtt://HOST:PORT or mqtts://HOST:PORT for TLS", metavar="URL"),
        Setting("prefix", "--prefix", "EDGEFLEET_PREFIX", "prefix", lambda: DEFAULT_PREFIX, DEFAULT_PREFIX,
                "MQTT topic prefix"),
        Setting("protocol", "--protocol", "EDGEFLEET_PROTOCOL", "protocol", lambda: "auto", "auto",
                "MQTT protocol: auto uses 5 when the broker has it", choices=PROTOCOLS),
        Setting("tls_ca", "--ca", "EDGEFLEET_TLS_CA", "ca", lambda: None, "none",
                "the broker's CA certificate (mqtts://)", is_path=True, metavar="FILE"),
        Setting("tls_cert", "--cert", "EDGEFLEET_TLS_CERT", "cert", lambda: None, "none",
                "client certificate (its CN is the MQTT user name)", is_path=True, metavar="FILE"),
        Setting("tls_key", "--key", "EDGEFLEET_TLS_KEY", "key", lambda: None, "none",
                "the client certificate's private key", is_path=True, metavar="FILE"),
        Setting("store", "--store", "EDGEFLEET_STORE", "store", _store_default,
                "sqlite://$EDGEFLEET_HOME/control.sqlite",
                "control-plane store URL, sqlite:///PATH or postgresql://USER@HOST/DB", metavar="URL"),
    )
}  # fmt: skip


def add_setting(parser: argparse.ArgumentParser | argparse._ArgumentGroup, dest: str, flag: str | None = None,
                what: str | None = None) -> None:  # fmt: skip
    """A flag for one of SETTINGS, left None at parse time; `resolve` fills it (flag, env, context, default).
    `flag` renames it where its usual name is taken (convert's --key is the bundle key)."""
    s = SETTINGS[dest]
    text = s.help() if what is None else f"{what} (default {s.default_text}; env {s.env}; context key {s.context_key})"
    kwargs: dict[str, Any] = {"dest": dest, "default": None, "help": text}
    if s.is_path:
        kwargs["type"] = Path
    if s.choices:
        kwargs["choices"] = list(s.choices)
    if s.metavar:
        kwargs["metavar"] = s.metavar
    parser.add_argument(flag or s.flag, **kwargs)
    parser.set_defaults(_settings=[*(parser.get_default("_settings") or []), dest])


def add_broker(parser: argparse.ArgumentParser, *, identity: str = "operator") -> None:
    """--broker, --prefix, --protocol and the TLS files. `identity`: "control" for `control serve`, which takes
    the context's control_cert/control_key (its own certificate: the broker makes the CN the client id)."""
    for dest in ("broker", "prefix", "protocol"):
        add_setting(parser, dest)
    add_tls(parser)
    parser.set_defaults(_identity=identity)


def add_tls(parser: argparse.ArgumentParser, *, context: bool = True) -> None:
    """--ca, --cert, --key. `context=False` (the device agent): flags and variables only, never a context."""
    for dest in ("tls_ca", "tls_cert", "tls_key"):
        add_setting(parser, dest)
    if not context:
        parser.set_defaults(_use_context=False)


def add_store(parser: argparse.ArgumentParser) -> None:
    add_setting(parser, "store")


def selected_context(args: argparse.Namespace | None = None) -> context_file.Selected | None:
    if args is not None and not getattr(args, "_use_context", True):
        return None
    return context_file.select(getattr(args, "context", None) if args is not None else None)


def apply_home(selected: context_file.Selected | None) -> None:
    """A context's `home` becomes EDGEFLEET_HOME (keys, caches, the default store) unless the variable is set."""
    if selected is not None and selected.context.home and not os.environ.get("EDGEFLEET_HOME"):
        os.environ["EDGEFLEET_HOME"] = selected.context.home


def resolve(args: argparse.Namespace) -> None:
    """Fill every setting the command has and the user did not give: its variable, the context, the default.
    Idempotent (values already set stay), so helpers call it too."""
    pending = [SETTINGS[d] for d in getattr(args, "_settings", []) if getattr(args, d, None) is None]
    if not pending:
        return
    selected = selected_context(args)
    apply_home(selected)
    for s in pending:
        value, _ = lookup(s, selected, getattr(args, "_identity", "operator"))
        if s.dest == "store" and value and selected is not None and selected.context.password_file:
            from edgefleet.control.store.url import with_password_file

            value = with_password_file(value, selected.context.password_file)
        if s.choices and value is not None and value not in s.choices:
            raise UserInputError(f"{s.env}={value!r} is not one of {', '.join(s.choices)}")
        setattr(args, s.dest, Path(value) if (s.is_path and value is not None) else value)


def lookup(s: Setting, selected: context_file.Selected | None, identity: str = "operator") -> tuple[str | None, str]:
    """A setting's value without its flag, and where it came from."""
    value = os.environ.get(s.env) or None
    if value is not None:
        return value, f"env {s.env}"
    if selected is not None:
        keys = [s.context_key]
        if identity == "control" and s.context_key in ("cert", "key"):
            keys.insert(0, f"control_{s.context_key}")
        for key in keys:
            value = getattr(selected.context, key)
            if value is not None:
                return value, f"context {selected.name} ({key})"
    return s.default(), "default"


def tls_files(args: argparse.Namespace) -> TlsFiles | None:
    resolve(args)
    if args.tls_ca is None:
        if args.broker.startswith("mqtts://"):
            raise UserInputError(
                f"{args.broker} is a TLS broker but no CA certificate is set: give --ca (or EDGEFLEET_TLS_CA, or "
                "a context's ca: `edgefleet context set`)"
            )
        return None
    for what, path in (("--ca", args.tls_ca), ("--cert", args.tls_cert), ("--key", args.tls_key)):
        if path is not None and not Path(path).is_file():
            raise UserInputError(f"{what} {path}: no such file")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UserInputError("--cert and --key go together (a client certificate and its key)")
    return TlsFiles(str(args.tls_ca), str(args.tls_cert) if args.tls_cert else None,
                    str(args.tls_key) if args.tls_key else None)  # fmt: skip


def connect(args: argparse.Namespace, role: str) -> tuple[Connection, Topics]:
    resolve(args)
    conn = Connection(args.broker, f"edgefleet-{role}-{os.getpid()}", protocol=args.protocol, tls=tls_files(args))
    conn.start(wait=10.0)
    return conn, Topics(args.prefix)


# --- durations and help
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> float:
    """ "90", "90s", "5m", "6h", "30d" → seconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use e.g. 30s, 5m, 6h or 30d")
    return float(match[1]) * _UNITS[match[2]]


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    return f"{seconds:g}s"


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already says it (or there is none to say)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or not action.option_strings
            or default in (None, False, True, [], "", argparse.SUPPRESS)
            or isinstance(action, argparse._VersionAction | argparse._HelpAction)
        ):
            return text
        shown = format_duration(default) if action.type is duration and isinstance(default, float) else default
        return f"{text} (default {str(shown).replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """edgefleet's parser: defaults in every help, and a usage error as one line (`edgefleet: error: …`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"edgefleet: error: {message} (see `{self.prog} --help`)\n")


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")


def to_jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: to_jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def print_json(value: Any) -> None:
    """Strict JSON: a non-finite number (none should reach here: ingest refuses them) is printed as null."""
    from edgefleet.core.untrusted import strict_json

    json.dump(strict_json(to_jsonable(value)), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    import shutil

    from edgefleet.core.untrusted import safe_text

    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:  # a device install (rich comes with the `host` extra): the same cells, tab-separated
        print(safe_text(title))
        for line in (columns, *rows):
            print("\t".join("-" if cell is None else safe_text(cell) for cell in line))
        return
    table = Table(title=Text(safe_text(title)))
    for column in columns:
        table.add_column(column)
    for row in rows:  # cells may hold device strings: Text is never parsed as markup, safe_text strips controls
        table.add_row(*(Text("-" if cell is None else safe_text(cell)) for cell in row))
    # Piped output gets a wide table rather than rich's 80-column default with truncated cells.
    Console(width=shutil.get_terminal_size((220, 24)).columns).print(table)


def fmt(value: float | None, digits: int = 3) -> str | None:
    return None if value is None else f"{value:.{digits}f}"
