"""Limits of generation, as pure rules: the token budget, the gate (running, waiting, refused), and the telemetry
window's figures."""

from __future__ import annotations

import threading

import pytest

from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.generation import GenerationConfig, GenerationGate
from edgefleet.agent.runtime.generative import BudgetError
from edgefleet.agent.runtime.generative.budget import token_budget
from edgefleet.agent.telemetry import GenerationWindow


@pytest.mark.parametrize(
    ("prompt", "requested", "context", "expected"),
    [
        (10, None, 256, 64),  # the bundle's default
        (10, 20, 256, 20),
        (10, 5000, 4096, 1000),  # the agent's cap
        (10, 5000, 256, 246),  # the room the context leaves
        (250, 100, 256, 6),
        (255, None, 256, 1),
    ],
)
def test_the_budget_is_what_was_asked_within_the_cap_and_the_context(
    prompt: int, requested: int | None, context: int, expected: int
) -> None:
    assert token_budget(prompt, requested, default=64, cap=1000, context_length=context) == expected


@pytest.mark.parametrize(
    ("prompt", "requested", "message"),
    [(256, None, "256 tokens and the model's context holds 256"), (300, 5, "shorten the prompt"),
     (0, None, "empty"), (5, 0, "at least 1")],
)  # fmt: skip
def test_a_prompt_that_leaves_no_room_is_refused_with_its_size(
    prompt: int, requested: int | None, message: str
) -> None:
    with pytest.raises(BudgetError, match=message):
        token_budget(prompt, requested, default=64, cap=1000, context_length=256)


def test_the_gate_runs_some_queues_some_and_refuses_the_rest() -> None:
    gate = GenerationGate(GenerationConfig(concurrency=1, queue=1, queue_timeout_s=0.2))
    first = gate.enter()
    first.wait()
    second = gate.enter()  # admitted, waiting
    with pytest.raises(RequestError) as full:
        gate.enter()
    assert full.value.status == 503 and full.value.kind == "overloaded"
    with pytest.raises(RequestError) as late:
        second.wait()  # the slot is not freed within the queue timeout
    assert late.value.kind == "timeout"
    second.release()
    assert (gate.running, gate.waiting) == (1, 0)
    done = threading.Event()
    third = gate.enter()
    waiter = threading.Thread(target=lambda: (third.wait(), done.set()))
    waiter.start()
    first.hold()
    first.release()  # held by a stream: nothing yet
    assert not done.wait(0.05)
    first.release(final=True)
    waiter.join(2)
    assert done.is_set() and gate.running == 1
    third.release()
    third.release()  # once only
    assert (gate.running, gate.waiting) == (0, 0)


def test_the_window_reports_token_latencies_volume_and_what_was_cut() -> None:
    window = GenerationWindow()
    window.finished(10, 11, ttft_ms=5.0, decode_ms=20.0)  # 10 decode steps of 2 ms
    window.finished(4, 3, ttft_ms=7.0, decode_ms=8.0, cut=True)  # 2 of 4 ms
    window.finished(4, 1, ttft_ms=3.0, decode_ms=0.0)  # one token: no time per token
    window.finished(8, 9, ttft_ms=1.0, decode_ms=8.0, probe=True)
    window.refused()
    stats = window.snapshot()
    assert (stats.streams, stats.cut, stats.refused, stats.probe_streams) == (3, 1, 1, 1)
    assert (stats.prompt_tokens, stats.output_tokens) == (18, 15)  # probes are not a client's tokens
    assert stats.ttft is not None and stats.ttft.count == 4
    assert stats.tpot is not None and stats.tpot.count == 3 and stats.tpot.p50_ms == 2.0
    assert stats.tokens_per_s == pytest.approx(20 / 0.036, rel=1e-3)  # decode tokens / decode seconds
    empty = window.snapshot()
    assert (empty.streams, empty.ttft, empty.tokens_per_s) == (0, None, None)
