"""The pure parts of streaming generations: chunked transfer encoding, server-sent events, stop strings held back
across pieces, incremental detokenization, and the request parsers' refusals."""

from __future__ import annotations

import json

import pytest

from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.generation import openai_api, sse, triton_api
from edgefleet.agent.api.http.chunked import LAST_CHUNK, chunk
from edgefleet.agent.runtime.generative.detokenizer import IncrementalDecoder
from edgefleet.agent.runtime.generative.stop_strings import StopStrings


def dechunk(body: bytes) -> bytes:
    """A chunked body read back as an HTTP client does."""
    out, rest = b"", body
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n"
            return out
        out, rest = out + rest[:size], rest[size:]
        assert rest.startswith(b"\r\n")
        rest = rest[2:]


def test_chunks_frame_each_piece_with_its_hex_length() -> None:
    assert chunk(b"hello") == b"5\r\nhello\r\n"
    assert chunk(b"x" * 26) == b"1a\r\n" + b"x" * 26 + b"\r\n"
    assert chunk(b"") == b""  # an empty chunk would end the body
    pieces = [b"data: {}\n\n", "é\r\n".encode(), b"", b"z" * 4096]
    assert dechunk(b"".join(chunk(p) for p in pieces) + LAST_CHUNK) == b"".join(pieces)


def test_an_event_is_one_data_line_whatever_the_text_holds() -> None:
    text = 'line one\nline two\r\n\n"quoted" and data: inside'
    raw = sse.event({"text_output": text})
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n") and raw.count(b"\n") == 2
    assert json.loads(raw[len(b"data: ") : -2]) == {"text_output": text}
    assert sse.DONE == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("stops", "pieces", "emitted", "stopped"),
    [
        ((), ["a", "b"], "ab", False),
        (("\n\n",), ["def f():\n", "\n", "more"], "def f():", True),
        (("END",), ["xE", "N", "Dyz"], "x", True),
        (("END",), ["xE", "N", "o"], "xENo", False),  # held back, then handed out when it was not a stop
        (("b", "ab"), ["xab"], "x", True),  # the earliest stop wins, whatever the order given
        (("stop",), ["st"], "st", False),  # held text comes out at the end
    ],
)
def test_stop_strings_end_the_text_before_them(
    stops: tuple[str, ...], pieces: list[str], emitted: str, stopped: bool
) -> None:
    matcher = StopStrings(stops)
    out = "".join(matcher.feed(p) for p in pieces) + matcher.flush()
    assert (out, matcher.stopped) == (emitted, stopped)


def test_incremental_decoding_holds_a_character_until_its_bytes_are_complete() -> None:
    table = {1: b"a", 2: "é".encode()[:1], 3: "é".encode()[1:], 4: b" b"}

    def decode(ids: list[int]) -> str:
        return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")

    decoder = IncrementalDecoder(decode)
    assert [decoder.push(t) for t in (1, 2, 3, 4)] == ["a", "", "é", " b"]
    assert decoder.flush() == ""
    half = IncrementalDecoder(decode)
    assert half.push(2) == "" and half.flush() == "\ufffd"


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"model": "m", "prompt": "x", "n": 2}, "n"),
        ({"model": "m", "prompt": "x", "temperature": 3}, "temperature"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"model": "m", "prompt": "x", "echo": True}, "echo"),
        ({"model": "m", "prompt": "x", "logprobs": 3}, "logprobs"),
        ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
        ({"model": "m", "prompt": [1, -2]}, "prompt"),
        ({"prompt": "x"}, "model"),
    ],
)
def test_completion_requests_are_refused_naming_the_field(document: dict[str, object], field: str) -> None:
    with pytest.raises(RequestError) as caught:
        openai_api.parse_completion(json.dumps(document).encode())
    assert caught.value.status == 400 and caught.value.message.startswith(field)


def test_chat_messages_take_text_and_text_parts_only() -> None:
    call = openai_api.parse_chat(json.dumps({
        "model": "m", "max_completion_tokens": 5, "temperature": 0.5, "seed": 3,
        "messages": [{"role": "system", "content": "be short"},
                     {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
    }).encode())  # fmt: skip
    assert call.messages == (("system", "be short"), ("user", "hi there"))
    assert call.max_tokens == 5 and call.sampling is not None and call.sampling.seed == 3
    for bad in ([], [{"role": "wizard", "content": "x"}], [{"role": "user", "content": [{"type": "image_url"}]}]):
        with pytest.raises(RequestError, match="messages"):
            openai_api.parse_chat(json.dumps({"model": "m", "messages": bad}).encode())


def test_triton_parameters_sit_in_parameters_or_at_the_top_level() -> None:
    call = triton_api.parse(
        json.dumps(
            {"text_input": "x", "max_tokens": 7, "parameters": {"temperature": 0, "stop_words": ["\n"]}}
        ).encode(),
        "m",
    )
    assert (call.max_tokens, call.sampling, call.stop) == (7, None, ("\n",))  # temperature 0: greedy
    with pytest.raises(RequestError, match="text_input"):
        triton_api.parse(b'{"parameters": {}}', "m")
