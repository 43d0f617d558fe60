"""HTTP/1.1 chunked transfer encoding (RFC 9112, section 7.1) of a streamed answer: each piece is its length in hex,
CRLF, the bytes, CRLF; a zero-length chunk and an empty trailer section end the body. Pure."""

from __future__ import annotations

LAST_CHUNK = b"0\r\n\r\n"


def chunk(data: bytes) -> bytes:
    """One chunk holding `data` (an empty piece would end the body: it is sent as nothing)."""
    if not data:
        return b""
    return b"%x\r\n%b\r\n" % (len(data), data)


__all__ = ["LAST_CHUNK", "chunk"]
