"""Server-sent events (the HTML standard's text/event-stream) as the generate_stream and OpenAI streaming answers
use them: one `data:` line of JSON per event and a blank line after it. JSON escapes line breaks inside strings, so
one event is always one line. Pure."""

from __future__ import annotations

import json
from typing import Any

CONTENT_TYPE = "text/event-stream; charset=utf-8"
DONE = b"data: [DONE]\n\n"  # OpenAI's end of a stream


def event(document: Any) -> bytes:
    return b"data: " + json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


__all__ = ["CONTENT_TYPE", "DONE", "event"]
