"""Store URLs and their secrets: a PostgreSQL password never needs to be in a URL, and is never shown when it is.

- `redacted(url)`: the URL with its password (`user:PASSWORD@`, or a `password=` parameter) replaced by `***`:
  what every log line, error, `context show`, `control status` and the `control serve` start line print.
- Where a password can come from instead, so it is never on a command line or in the context file: libpq's own
  `PGPASSWORD` and `PGPASSFILE` (the `.pgpass` format; psycopg reads both when the URL has no password), or
  `password_file=PATH` (a file holding the password alone, one line), a parameter of the store URL or the
  `password_file` key of a context (edgefleet/cli/context.py), read when the store opens (`password_from_file`).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from edgefleet.control.store.errors import StoreError

PASSWORD_FILE = "password_file"  # the store URL parameter (and context key) naming a file that holds the password
_SECRET_PARAMS = ("password",)


def redacted(url: str) -> str:
    """`url` with any password in it replaced by `***` (a URL without one is returned unchanged)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL we can take apart: show the scheme only
        return url.split(":", 1)[0] + ":***" if ":" in url else url
    netloc = parts.netloc
    if password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.split(':', 1)[0]}:***@{host}"
    query = parts.query
    if query and any(k.lower() in _SECRET_PARAMS for k, _ in parse_qsl(query, keep_blank_values=True)):
        query = urlencode(
            [(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in parse_qsl(query, keep_blank_values=True)],
            safe="*/",
        )
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def has_password(url: str) -> bool:
    """Whether the URL itself holds a password (in its user part or a `password=` parameter)."""
    try:
        parts = urlsplit(url)
        return parts.password is not None or any(k.lower() in _SECRET_PARAMS for k, _ in parse_qsl(parts.query))
    except ValueError:
        return False


def with_password_file(url: str, path: str) -> str:
    """A PostgreSQL `url` that reads its password from `path` when it opens (unless it names one already)."""
    if not url.lower().startswith(("postgresql:", "postgres:")) or has_password(url):
        return url
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != PASSWORD_FILE]
    query.append((PASSWORD_FILE, path))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query, safe="/"), parts.fragment))


def password_from_file(path: str, url: str) -> str:
    """The password held in `path` (its first line); a StoreError that names the file (never its content)."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise StoreError(f"store {redacted(url)}: cannot read its password file {path}: {err}") from err
    password = text.splitlines()[0].strip() if text.strip() else ""
    if not password:
        raise StoreError(f"store {redacted(url)}: its password file {path} is empty")
    return password


__all__ = ["PASSWORD_FILE", "has_password", "password_from_file", "redacted", "with_password_file"]
