"""Options and output helpers shared by the commands."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from edgefleet.core.home import edgefleet_home as edgefleet_home  # re-exported for the commands
from edgefleet.core.home import keys_dir
from edgefleet.core.mqtt import Connection, TlsFiles
from edgefleet.core.topics import DEFAULT_PREFIX, Topics


def default_key() -> Path:
    """The converter's bundle-role key (see `edgefleet keys init`)."""
    return keys_dir() / "bundle.key"


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")


def add_broker(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker",
        default=os.environ.get("EDGEFLEET_BROKER", "mqtt://127.0.0.1:1883"),
        help="broker URL, mqtt://host:port (env EDGEFLEET_BROKER)",
    )
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="MQTT topic prefix")
    parser.add_argument(
        "--protocol",
        choices=["auto", "3.1.1", "5"],
        default="auto",
        help="MQTT protocol; auto uses 5 when the broker has it",
    )
    add_tls(parser)


def add_tls(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--ca", type=Path, default=env("EDGEFLEET_TLS_CA"), help="broker CA certificate (mqtts://)")
    parser.add_argument("--cert", type=Path, default=env("EDGEFLEET_TLS_CERT"), help="client certificate")
    parser.add_argument("--key", type=Path, default=env("EDGEFLEET_TLS_KEY"), help="client certificate's key")


def tls_files(args: argparse.Namespace) -> TlsFiles | None:
    if args.ca is None:
        return None
    return TlsFiles(str(args.ca), str(args.cert) if args.cert else None, str(args.key) if args.key else None)


def connect(args: argparse.Namespace, role: str) -> tuple[Connection, Topics]:
    conn = Connection(args.broker, f"edgefleet-{role}-{os.getpid()}", protocol=args.protocol, tls=tls_files(args))
    conn.start(wait=10.0)
    return conn, Topics(args.prefix)


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
    json.dump(to_jsonable(value), sys.stdout, indent=2)
    sys.stdout.write("\n")


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    import shutil

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from edgefleet.core.untrusted import safe_text

    table = Table(title=Text(safe_text(title)))
    for column in columns:
        table.add_column(column)
    for row in rows:  # cells may hold device strings: Text is never parsed as markup, safe_text strips controls
        table.add_row(*(Text("-" if cell is None else safe_text(cell)) for cell in row))
    # Piped output gets a wide table rather than rich's 80-column default with truncated cells.
    Console(width=shutil.get_terminal_size((220, 24)).columns).print(table)


def fmt(value: float | None, digits: int = 3) -> str | None:
    return None if value is None else f"{value:.{digits}f}"
