"""Stop strings (OpenAI's `stop`, Triton's `stop_words`): the text streamed to the client ends before the first one.

Text pieces arrive one by one and a stop string may span several, so the end of the text that could still become
a stop string is held back until the next piece decides. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStrings:
    def __init__(self, stops: Sequence[str] = ()) -> None:
        self.stops = tuple(s for s in stops if s)
        self.stopped = False
        self._held = ""

    def feed(self, piece: str) -> str:
        """The text that can be handed out now ("" once a stop string was met)."""
        if self.stopped:
            return ""
        if not self.stops:
            return piece
        text = self._held + piece
        found = [at for stop in self.stops if (at := text.find(stop)) >= 0]
        if found:
            self.stopped, self._held = True, ""
            return text[: min(found)]
        keep = max((self._overlap(text, stop) for stop in self.stops), default=0)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What was held back, when the generation ended without meeting a stop string."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    @staticmethod
    def _overlap(text: str, stop: str) -> int:
        """Length of the longest end of `text` that begins `stop` (and is shorter than it)."""
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                return size
        return 0


__all__ = ["StopStrings"]
