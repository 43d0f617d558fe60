"""Streamed text leaves the device in joined pieces (agent/api/generation/pacing.py): the first at once, then at
most one send per interval, nothing lost, nothing held longer than the interval plus one token's time."""

from __future__ import annotations

from edgefleet.agent.api.generation.pacing import Coalescer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_first_piece_goes_at_once_and_fast_tokens_are_joined_per_interval() -> None:
    clock, sent = Clock(), []
    pieces = Coalescer(0.002, lambda text: sent.append(text) is None, clock)
    for i in range(20):  # a token every 0.1 ms
        pieces.text(str(i % 10))
        clock.now += 0.0001
    pieces.flush()
    assert sent[0] == "0", "the time to first token is not delayed"
    assert "".join(sent) == "01234567890123456789", "nothing lost, nothing reordered"
    assert len(sent) <= 3, sent


def test_a_model_slower_than_the_interval_sends_every_piece_as_it_comes() -> None:
    clock, sent = Clock(), []
    pieces = Coalescer(0.002, lambda text: sent.append(text) is None, clock)
    for word in ("a", "b", "c"):
        pieces.text(word)
        clock.now += 0.05  # 50 ms a token
    assert sent == ["a", "b", "c"] and not pieces.take()


def test_a_receiver_that_went_away_stops_the_stream_and_take_hands_over_what_waits() -> None:
    clock = Clock()
    pieces = Coalescer(0.002, lambda _text: False, clock)
    assert pieces.text("x") is False and pieces.alive is False
    pieces.text("y")
    assert pieces.take() == "y" and pieces.take() == ""
