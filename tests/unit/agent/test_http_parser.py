"""The local API's request-head parser is strict where leniency lets two parties frame one message differently."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgefleet.agent.api.http.parser import MAX_HEAD, read_request
from edgefleet.agent.api.http.protocol import BadHead

LIMIT = 8 * 2**20


def parsed(raw: bytes):  # type: ignore[no-untyped-def]
    return read_request(raw, LIMIT)


def refusal(raw: bytes) -> BadHead:
    with pytest.raises(BadHead) as caught:
        read_request(raw, LIMIT)
    return caught.value


def test_a_plain_request_is_read_with_its_length_and_the_bytes_it_took() -> None:
    raw = b"\r\nPOST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello"
    result = parsed(raw)
    assert result is not None
    assert (result.head.method, result.head.path, result.head.query) == ("POST", "/v2/models/m/infer", "x=1")
    assert result.length == 5 and raw[result.consumed :] == b"hello"
    assert result.head.headers["x-a"] == "1, 2"  # an ordinary repeated header is joined (RFC 9110 §5.3)


def test_an_incomplete_head_waits_for_more() -> None:
    assert parsed(b"GET / HTTP/1.1\r\nHost: a\r\n") is None


@pytest.mark.parametrize(
    ("raw", "status", "reason"),
    [
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", 400, "repeated Content-Length"),
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 0\r\n\r\n", 400, "repeated content-length"),
        (b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", 400, "is not a number"),
        (b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", 400, "is not a number"),
        (b"POST / HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", 400, "is not a number"),  # a latin-1 digit
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "together with"),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", 400, "together with"),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411, "chunked bodies are not accepted"),
        (b"POST / HTTP/1.1\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n", 400, "obsolete line folding"),
        (b"POST / HTTP/1.1\r\nX-A: a\r\n\tContent-Length: 9\r\n\r\n", 400, "obsolete line folding"),
        (b"POST / HTTP/1.1\r\nX: a\nContent-Length: 5\r\n\r\n", 400, "bare CR or LF"),
        (b"POST / HTTP/1.1\r\nX: a\rContent-Length: 5\r\n\r\n", 400, "bare CR or LF"),
        (b"POST / HTTP/1.1\r\nContent-Length : 5\r\n\r\n", 400, "malformed header line"),
        (b"POST / HTTP/1.1\r\n Content-Length: 5\r\n\r\n", 400, "obsolete line folding"),
        (b"POST / HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400, "control character"),
        (b"POST / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "repeated Host"),
        (b"POST /a b HTTP/1.1\r\n\r\n", 400, "malformed request line"),
        (b"P(ST / HTTP/1.1\r\n\r\n", 400, "malformed request line"),
        (b"GET / HTTP/2.0\r\n\r\n", 505, "not supported"),
        (b"POST / HTTP/1.1\r\n\r\n", 411, "Content-Length is required"),
        (b"POST / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n", 413, "exceeds the limit"),
    ],
)
def test_heads_that_could_be_framed_two_ways_are_refused(raw: bytes, status: int, reason: str) -> None:
    err = refusal(raw)
    assert err.status == status and reason in err.message


def test_a_head_over_the_limit_is_refused_before_it_ends() -> None:
    assert refusal(b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD + 1)).status == 431


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_never_raise_out_of_the_parser(data: bytes) -> None:
    try:
        result = read_request(data, LIMIT)
    except BadHead as err:
        assert 400 <= err.status < 600 and err.message
        return
    if result is not None:
        assert 0 < result.consumed <= len(data) and data[: result.consumed].endswith(b"\r\n\r\n")


# Header lines an attacker mixes to frame a request two ways: every framing header in every spelling.
_LINES = st.sampled_from([
    b"Host: a", b"Content-Length: 4", b"Content-Length: 0", b"content-length: 4", b"Content-Length:4 ",
    b"Content-Length : 4", b" Content-Length: 4", b"\tContent-Length: 4", b"Content-Length: 4, 4",
    b"Content-Length: 04", b"Transfer-Encoding: chunked", b"transfer-encoding: identity",
    b"Transfer-Encoding : chunked",
    b"X-A: b\nContent-Length: 4", b"X-A: b\rContent-Length: 4", b"X-A: b", b"Accept: */*", b" folded",
    b"Content-Type: application/json", b"X-Pad: \x7f", b"Connection: keep-alive",
])  # fmt: skip


def _lenient_lengths(head: bytes) -> set[int | str]:
    """How lenient parsers could frame the head: first or last Content-Length, splitting on LF or CRLF, ignoring
    spaces around names, or chunked. A strict parser must accept only heads on which they all agree."""
    views: set[int | str] = set()
    for lines in (head.split(b"\r\n"), re.split(rb"\r\n|\n|\r", head)):
        lengths, chunked = [], False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                lengths.append(value.strip())
            elif name == b"transfer-encoding":
                chunked = True
        if chunked:
            views.add("chunked")
        for value in (lengths[:1] + lengths[-1:]) or [b"0"]:
            views.add(int(value) if value.isdigit() else f"bad {value!r}")
    return views


@settings(max_examples=3000, deadline=None)
@given(st.lists(_LINES, max_size=8), st.sampled_from([b"GET", b"POST"]))
def test_an_accepted_head_frames_one_way_whoever_reads_it(lines: list[bytes], method: bytes) -> None:
    """Never two requests from one: whenever the strict parser accepts a head, every lenient reading of it finds
    the same body length, so bytes it takes as the body are the body to everyone and never a request of their own."""
    head = b"\r\n".join([method + b" / HTTP/1.1", *lines])
    raw = head + b"\r\n\r\n" + b"GET /smuggled HTTP/1.1\r\n\r\n"
    try:
        result = read_request(raw, LIMIT)
    except BadHead:
        return
    assert result is not None
    assert _lenient_lengths(head) == {result.length}
