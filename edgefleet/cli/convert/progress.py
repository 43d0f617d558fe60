"""Progress bars for `edgefleet convert`: what the search is doing now, and how far each phase has come.

One line carries the converter's latest message (the candidate being built, retried or signed); below it, a bar
per phase that reports its progress (candidates built of those planned, timing rounds done). Drawn on stderr
and cleared at the end, so `--json` output stays clean. Where stderr is no terminal (a log file, CI), a bar would
print nothing until the end: each message is a line there instead, with the seconds since the start.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from edgefleet.converter import listening

LABELS = {"build": "candidates", "timing": "timing rounds"}


@contextmanager
def convert_progress() -> Iterator[Callable[[str], None]]:
    """Yields the `progress` callback for `convert`; phase bars follow the converter's `step` events."""
    console = Console(stderr=True)
    if not console.is_terminal:
        started = time.monotonic()

        def line(message: str) -> None:
            print(f"[{time.monotonic() - started:6.0f} s] {message}", file=sys.stderr, flush=True)

        yield line
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        status = bar.add_task("converting", total=None)
        tasks: dict[str, TaskID] = {}

        def on_step(name: str, done: int, total: int, what: str) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(LABELS.get(name, name), total=total or None)
            label = LABELS.get(name, name) + (f": {what}" if what else "")
            bar.update(tasks[name], completed=done, total=total or None, description=label)

        with listening(on_step):
            yield lambda message: bar.update(status, description=message)
