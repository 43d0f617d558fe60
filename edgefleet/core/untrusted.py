"""Text that came from a device, made safe to show to an operator.

Everything a device reports (hostname, last error, event details, provider notes, its own group names) is
attacker-controlled once a device is compromised. Before a terminal or a web page shows it, `safe_text`:
- replaces control characters (C0, DEL, C1: ESC sequences, carriage returns that overwrite a line) and the
  Unicode bidirectional overrides and invisible formatting characters ("Trojan Source") with U+FFFD;
- caps the length (default `MAX_SHOWN` characters), marking the cut with an ellipsis.

Rich markup (`[bold]`, `[/x]`) is neutralised where rich is used: `edgefleet.cli.common.print_table` puts every
cell in a `rich.text.Text`, which is never parsed as markup, and `markup_safe` escapes text that must go
through a markup string. The dashboard draws with `textContent`, never `innerHTML`, and its JSON API passes
device strings through `safe_text` too. One helper, used everywhere a device string is shown.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

MAX_SHOWN = 200
REPLACEMENT = "\ufffd"
_ELLIPSIS = "…"
# C0 controls except none (tab and newline too: a table cell is one line), DEL, C1 controls.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Bidi embeddings/overrides/isolates, zero-width and other invisible format characters.
_INVISIBLE = re.compile(r"[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb]")


def safe_text(value: object, limit: int = MAX_SHOWN) -> str:
    """`value` as one printable line of at most `limit` characters (None becomes "")."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit * 4:  # do not normalise megabytes an attacker sent
        text = text[: limit * 4]
    text = unicodedata.normalize("NFC", text)
    text = _CONTROL.sub(REPLACEMENT, text)
    text = _INVISIBLE.sub(REPLACEMENT, text)
    text = "".join(REPLACEMENT if unicodedata.category(ch) in ("Cs", "Co", "Cn") else ch for ch in text)
    if len(text) > limit:
        text = text[: max(0, limit - 1)] + _ELLIPSIS
    return text


def markup_safe(value: object, limit: int = MAX_SHOWN) -> str:
    """`safe_text`, then escaped for a rich markup string (no `[` opens or closes a tag). Host side only."""
    from rich.markup import escape  # rich is a host dependency; devices never call this

    return escape(safe_text(value, limit))


def safe_json(value: Any, limit: int = MAX_SHOWN) -> Any:
    """A JSON-able value with every string in it (keys too) passed through `safe_text`, and every non-finite
    float (NaN, ±Infinity, which strict JSON has no word for) made null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return safe_text(value, limit)
    if isinstance(value, dict):
        return {safe_text(k, limit) if isinstance(k, str) else k: safe_json(v, limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [safe_json(v, limit) for v in value]
    return value


def strict_json(value: Any) -> Any:
    """A JSON-able value with every non-finite float made null (strings untouched): what `json.dumps(...,
    allow_nan=False)` then writes is strict JSON, parsed by every client (issue 32: `Infinity` in one device's
    report made the fleet's JSON unreadable)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


__all__ = ["MAX_SHOWN", "markup_safe", "safe_json", "safe_text", "strict_json"]
