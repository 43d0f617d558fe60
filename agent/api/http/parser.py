"""The strict HTTP/1.1 request-head parser of the local API: one request's head and its body's length, or a refusal.

Strict where leniency lets two parties frame a message differently (request smuggling, RFC 9112 §6.3, §11.2):
- every line ends with CRLF; a bare CR or LF anywhere in the head is a 400;
- obsolete line folding (a header line starting with a space or tab) is a 400;
- a header name is a token followed at once by ':'; a value holds no control character;
- `Content-Length` is one header of ASCII digits: repeated (even with the same value), a list, a sign or spaces
  inside are a 400; together with `Transfer-Encoding` a 400; `Transfer-Encoding` alone a 411 (chunked bodies are
  not accepted);
- headers that frame or route a request (Host, Content-Type, Content-Encoding, the OIP header length) are single;
  any other repeated header is joined with ", " (RFC 9110 §5.3).
The server closes the connection after every refusal, so bytes after a refused head are never read as a request.
`read_request` is a pure function of the bytes received: it never raises anything but `BadHead`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgefleet.agent.api.http.protocol import BadHead, Head

MAX_HEAD = 32 * 1024  # request line and headers together
MAX_HEADERS = 64
SINGLE = frozenset(
    ("content-length", "transfer-encoding", "host", "content-type", "content-encoding",
     "inference-header-content-length")
)  # fmt: skip
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_REQUEST_LINE = re.compile(rf"({_TOKEN}) (/[\x21-\x7e]*) (HTTP/[0-9]\.[0-9])")
_FIELD = re.compile(rf"^({_TOKEN}):[ \t]*([^\r]*)\r$", re.MULTILINE)  # one header line, from its start
_CTL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # control characters but HT, CR and LF
_DIGITS = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True)
class Parsed:
    head: Head
    length: int  # the body's declared length
    consumed: int  # bytes of the buffer the head took (with the blank line and any empty lines before it)


def read_request(buf: bytes | bytearray, max_body_bytes: int) -> Parsed | None:
    """The first request head in `buf`: Parsed, None while it is incomplete, or BadHead."""
    start = 0
    while buf[start : start + 2] == b"\r\n":  # RFC 9112 §2.2: empty lines before a request line are ignored
        start += 2
    end = buf.find(b"\r\n\r\n", start)
    if end < 0:
        if len(buf) - start > MAX_HEAD:
            raise BadHead(431, f"request head over {MAX_HEAD} bytes")
        return None
    if end - start > MAX_HEAD:
        raise BadHead(431, f"request head over {MAX_HEAD} bytes")
    head = parse_head(bytes(buf[start:end]))
    return Parsed(head, body_length(head, max_body_bytes), end + 4)


def parse_head(data: bytes) -> Head:
    """The request line and headers (without the blank line that ends them). Each rule is one scan of the whole
    head in C (count, find, a regular expression), not a loop over its lines: this runs on every request."""
    crlf = data.count(b"\r\n")
    if data.count(b"\r") != crlf or data.count(b"\n") != crlf:
        raise BadHead(400, "bare CR or LF in the request head (lines end with CRLF)")
    if b"\r\n\r\n" in data:
        raise BadHead(400, "malformed request head")
    if b"\r\n " in data or b"\r\n\t" in data:
        raise BadHead(400, "obsolete line folding is not accepted")
    if _CTL.search(data):
        raise BadHead(400, "control character in the request head")
    text = data.decode("latin-1")
    line_end = text.find("\r\n")
    request_line, block = (text, "") if line_end < 0 else (text[:line_end], text[line_end + 2 :] + "\r\n")
    match = _REQUEST_LINE.fullmatch(request_line)
    if match is None:
        raise BadHead(400, "malformed request line")
    method, target, version = match.groups()
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadHead(505, f"{version} is not supported; use HTTP/1.1")
    if crlf > MAX_HEADERS:
        raise BadHead(431, f"more than {MAX_HEADERS} headers")
    fields = _FIELD.findall(block)
    if len(fields) != crlf:  # a line that is not `token ":" value` matched nothing (the pattern starts a line)
        raise BadHead(400, "malformed header line")
    headers: dict[str, str] = {}
    for raw_name, raw_value in fields:
        name, value = raw_name.lower(), raw_value.rstrip(" \t")
        if name in headers:
            if name in SINGLE:
                raise BadHead(400, f"repeated {raw_name} header")
            value = f"{headers[name]}, {value}"
        headers[name] = value
    path, _, query = target.partition("?")
    return Head(method, path, query, version, headers)


def body_length(head: Head, max_body_bytes: int) -> int:
    if "transfer-encoding" in head.headers:
        if "content-length" in head.headers:
            raise BadHead(400, "Content-Length together with Transfer-Encoding")
        raise BadHead(411, "chunked bodies are not accepted; send Content-Length")
    text = head.headers.get("content-length")
    if text is None:
        if head.method in ("POST", "PUT", "PATCH"):
            raise BadHead(411, "Content-Length is required")
        return 0
    if not _DIGITS.fullmatch(text):
        raise BadHead(400, f"Content-Length {text[:32]!r} is not a number")
    length = int(text)
    if length > max_body_bytes:
        raise BadHead(413, f"request body of {length} bytes exceeds the limit of {max_body_bytes} bytes")
    return length


__all__ = ["MAX_HEAD", "MAX_HEADERS", "Parsed", "body_length", "parse_head", "read_request"]
