"""Contexts: named sets of connection settings for the host commands, in one TOML file, the way kubectl keeps
clusters in a kubeconfig.

The file is `$EDGEFLEET_CONFIG`, else `$EDGEFLEET_HOME/config.toml` (`~/.edgefleet/config.toml`):

    current-context = "fleet"

    [contexts.fleet]
    broker = "mqtts://127.0.0.1:8883"
    ca = "/srv/edgefleet/pki/ca.crt"          # a relative path is relative to this file's folder
    cert = "/srv/edgefleet/pki/edgefleet-cli.crt"
    key = "/srv/edgefleet/pki/edgefleet-cli.key"
    control_cert = "/srv/edgefleet/pki/edgefleet-host.crt"   # `control serve` only: its own identity
    control_key = "/srv/edgefleet/pki/edgefleet-host.key"
    store = "sqlite:///srv/edgefleet/control.sqlite"
    home = "/srv/edgefleet"                   # EDGEFLEET_HOME: the keys (keys/), caches, the default store
    password_file = "/srv/edgefleet/pg.pass"  # a PostgreSQL store's password, read when it opens (never printed)

`EDGEFLEET_CONTEXT` (or `edgefleet --context NAME`) picks a context for one command; `edgefleet context use`
changes the file's current one. A flag beats its variable, which beats the context, which beats the built-in
default (see `edgefleet.cli.common.SETTINGS`).

The file may hold secrets (a store URL's password, though `password_file`, PGPASSFILE or PGPASSWORD keep it out), so
it is written 0600 in a folder made 0700, and every command that shows a store URL shows it redacted
(edgefleet/control/store/url.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgefleet.core.errors import UnknownNameError, UserInputError
from edgefleet.core.home import edgefleet_home

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 devices (tomli is a dependency there)
    import tomli as tomllib

CONFIG_ENV = "EDGEFLEET_CONFIG"
CONTEXT_ENV = "EDGEFLEET_CONTEXT"

# Context keys that hold a file or folder path (resolved against the file's folder when relative).
PATH_KEYS = ("ca", "cert", "key", "control_cert", "control_key", "home", "password_file")
FILE_MODE, FOLDER_MODE = 0o600, 0o700


class Context(BaseModel):
    """One named context. Every key is optional: what a context leaves out falls back to the default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    broker: str | None = Field(None, description="broker URL, mqtt://HOST:PORT or mqtts://HOST:PORT")
    prefix: str | None = Field(None, description="MQTT topic prefix")
    protocol: Literal["auto", "3.1.1", "5"] | None = Field(None, description="MQTT protocol")
    ca: str | None = Field(None, description="the broker's CA certificate (mqtts://)")
    cert: str | None = Field(None, description="the operator's client certificate")
    key: str | None = Field(None, description="the operator's client certificate's key")
    control_cert: str | None = Field(None, description="`control serve`'s own client certificate")
    control_key: str | None = Field(None, description="`control serve`'s certificate's key")
    store: str | None = Field(None, description="control-plane store URL (sqlite:PATH or postgresql://...)")
    home: str | None = Field(None, description="EDGEFLEET_HOME: the key directory keys/, caches, default store")
    password_file: str | None = Field(
        None, description="a file holding the PostgreSQL store's password (one line), read when the store opens"
    )


class ConfigFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    current_context: str | None = Field(None, alias="current-context")
    contexts: dict[str, Context] = Field(default_factory=dict)


@dataclass(frozen=True)
class Selected:
    """The context a command runs under: its name, where it came from, and its values with absolute paths."""

    name: str
    source: str  # "--context", "EDGEFLEET_CONTEXT" or "current-context"
    path: Path
    context: Context


def config_path() -> Path:
    value = os.environ.get(CONFIG_ENV)
    return Path(value).expanduser() if value else edgefleet_home() / "config.toml"


def load(path: Path | None = None) -> ConfigFile:
    """The context file; an empty one when it does not exist. A malformed file is one clear error."""
    path = path or config_path()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return ConfigFile()
    except (OSError, UnicodeDecodeError) as err:
        raise UserInputError(f"cannot read the context file {path}: {err}") from err
    except tomllib.TOMLDecodeError as err:
        raise UserInputError(f"the context file {path} is not valid TOML: {err}") from err
    try:
        return ConfigFile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserInputError(
            f"the context file {path}: {where}: {first['msg']} (keys a context takes: "
            f"{', '.join(Context.model_fields)})"
        ) from err


def save(config: ConfigFile, path: Path | None = None) -> Path:
    """Write the file atomically (a temporary file renamed over it), 0600, in a folder that is 0700: only its owner
    reads it. The folder is tightened when it is the edgefleet home or was just made (a folder named by
    $EDGEFLEET_CONFIG that already exists keeps its mode)."""
    path = path or config_path()
    data: dict[str, object] = {}
    if config.current_context:
        data["current-context"] = config.current_context
    data["contexts"] = {name: ctx.model_dump(exclude_none=True) for name, ctx in sorted(config.contexts.items())}
    folder = path.parent
    made = not folder.exists()
    folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    if made or folder.resolve() == edgefleet_home().resolve():
        os.chmod(folder, FOLDER_MODE)
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(render(data))
    os.chmod(tmp, FILE_MODE)  # whatever the umask
    os.replace(tmp, path)
    return path


def render(data: dict[str, object]) -> str:
    import tomli_w

    return tomli_w.dumps(data)


def select(name: str | None = None, path: Path | None = None) -> Selected | None:
    """The context to use: `name` (from --context), else $EDGEFLEET_CONTEXT, else the file's current-context;
    None when none is chosen. An unknown name lists the contexts that exist."""
    path = path or config_path()
    config = load(path)
    source = "--context"
    if not name:
        name, source = os.environ.get(CONTEXT_ENV) or None, CONTEXT_ENV
    if not name:
        name, source = config.current_context, "current-context"
    if not name:
        return None
    context = config.contexts.get(name)
    if context is None:
        if source == "current-context":
            raise UserInputError(
                f"the current context {name!r} of {path} does not exist; valid: "
                f"{', '.join(sorted(config.contexts)) or '(none)'} (edgefleet context use NAME)"
            )
        raise UnknownNameError("context", name, config.contexts)
    return Selected(name, source, path, absolute(context, path.parent))


def absolute(context: Context, base: Path) -> Context:
    """`context` with its relative paths (and a relative sqlite store) made absolute against `base`."""
    changes: dict[str, str] = {}
    for key in PATH_KEYS:
        value = getattr(context, key)
        if value:
            changes[key] = str((base / Path(value).expanduser()).resolve())
    if context.store:
        changes["store"] = absolute_store(context.store, base)
    return context.model_copy(update=changes)


def absolute_store(url: str, base: Path) -> str:
    """`sqlite:control.sqlite` (or a plain relative path) → `sqlite:///BASE/control.sqlite`; others unchanged."""
    if url.startswith("sqlite:"):
        rest = url.removeprefix("sqlite:")
        if rest.startswith("//"):
            return url  # sqlite:///absolute
        return f"sqlite://{(base / rest).resolve()}"
    if "://" not in url:
        return f"sqlite://{(base / url).resolve()}"
    return url


__all__ = [
    "CONFIG_ENV",
    "CONTEXT_ENV",
    "ConfigFile",
    "Context",
    "Selected",
    "absolute",
    "config_path",
    "load",
    "save",
    "select",
]
