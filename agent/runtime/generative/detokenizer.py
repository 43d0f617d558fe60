"""Text pieces from a growing list of token ids, for runtimes that hand out token ids one by one.

Decoding each token alone breaks multi-byte characters and byte-level BPE's leading spaces, so each step decodes a
short window of recent tokens and hands out what is new beyond the window's already-emitted prefix; text that ends
in an incomplete UTF-8 sequence (U+FFFD) is held until the next token completes it (the incremental detokenization
of Hugging Face's text-generation servers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


class IncrementalDecoder:
    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self.tokens: list[int] = []
        self._prefix = 0  # start of the window
        self._read = 0  # tokens whose text was handed out

    def push(self, token: int) -> str:
        """The new text once `token` is appended ("" while a character is incomplete)."""
        self.tokens.append(token)
        return self.take()

    def add(self, token: int) -> None:
        """Append `token` without decoding yet (`take` decodes every token added since, in one call)."""
        self.tokens.append(token)

    def take(self) -> str:
        """The new text of the tokens added since the last text handed out."""
        if self._read >= len(self.tokens):
            return ""
        prefix_text = self._decode(self.tokens[self._prefix : self._read])
        new_text = self._decode(self.tokens[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.tokens)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back when the generation ends."""
        if self._read >= len(self.tokens):
            return ""
        prefix_text = self._decode(self.tokens[self._prefix : self._read])
        new_text = self._decode(self.tokens[self._prefix :])
        self._prefix = self._read = len(self.tokens)
        return new_text[len(prefix_text) :]


__all__ = ["IncrementalDecoder"]
