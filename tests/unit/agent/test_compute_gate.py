"""The compute gate's policy: real-time work starts at once, interactive work yields between steps while real-time
work waits or runs, batch work runs only in what is left; every step is counted per slot (queue, compute, yields)."""

from __future__ import annotations

import threading
import time

import pytest

from edgefleet.agent.schedule.gate import ComputeGate, Load, SlotClass, may_start


def _load(running: dict[str, int] | None = None, waiting: dict[str, int] | None = None) -> Load:
    load = Load()
    load.running.update(running or {})
    load.waiting.update(waiting or {})
    return load


@pytest.mark.parametrize(
    ("slot_class", "running", "waiting", "lanes", "starts"),
    [
        ("real-time", {"interactive": 1, "batch": 1}, {}, 1, True),  # never behind lower classes
        ("real-time", {"real-time": 3}, {}, 1, True),
        ("interactive", {}, {}, 1, True),
        ("interactive", {"real-time": 1}, {}, 4, False),  # yields while real-time runs
        ("interactive", {}, {"real-time": 1}, 4, False),  # ... or waits
        ("interactive", {"interactive": 1}, {}, 1, False),  # one lane, taken
        ("interactive", {"interactive": 1}, {}, 2, True),
        ("interactive", {"batch": 1}, {}, 1, False),  # a running batch step finishes first (one step)
        ("batch", {}, {}, 1, True),  # what is left
        ("batch", {}, {"interactive": 1}, 2, False),  # interactive work waits: not left
        ("batch", {"interactive": 1}, {}, 2, True),
        ("batch", {"interactive": 2}, {}, 2, False),
        ("batch", {"real-time": 1}, {}, 8, False),
    ],
)
def test_who_may_start(
    slot_class: SlotClass, running: dict[str, int], waiting: dict[str, int], lanes: int, starts: bool
) -> None:
    assert may_start(slot_class, _load(running, waiting), lanes) is starts


def test_an_unknown_class_or_no_lane_is_refused_with_the_names() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ComputeGate(lanes=0)
    with pytest.raises(ValueError, match="real-time, interactive, batch"), ComputeGate().step("x", "urgent"):  # type: ignore[arg-type]
        pass


def _wait_for(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_interactive_steps_wait_while_real_time_runs_and_count_a_yield_and_the_queue_time() -> None:
    gate = ComputeGate(lanes=1)
    order: list[str] = []
    release_rt = threading.Event()

    def real_time() -> None:
        with gate.step("detector", "real-time"):
            order.append("rt start")
            release_rt.wait(10)
            order.append("rt end")

    def token() -> None:
        with gate.step("assistant", "interactive"):
            order.append("token")

    rt = threading.Thread(target=real_time)
    rt.start()
    _wait_for(lambda: gate.snapshot().running["real-time"] == 1)
    tok = threading.Thread(target=token)
    tok.start()
    _wait_for(lambda: gate.snapshot().waiting["interactive"] == 1)
    time.sleep(0.05)
    assert order == ["rt start"], "the token waited for the real-time step"
    release_rt.set()
    rt.join(10)
    tok.join(10)
    assert order == ["rt start", "rt end", "token"]
    timing = gate.timing()
    assert timing["assistant"].yields == 1 and timing["detector"].yields == 0
    assert timing["assistant"].queue_ms.p50_ms is not None and timing["assistant"].queue_ms.p50_ms >= 40
    assert timing["detector"].compute_ms.count == 1 and timing["assistant"].batches == 1


def test_real_time_never_waits_behind_a_running_lower_class_step() -> None:
    gate = ComputeGate(lanes=1)
    inside, release = threading.Event(), threading.Event()

    def long_batch_step() -> None:
        with gate.step("indexer", "batch"):
            inside.set()
            release.wait(10)

    worker = threading.Thread(target=long_batch_step)
    worker.start()
    assert inside.wait(10)
    start = time.perf_counter()
    with gate.step("detector", "real-time"):
        waited = time.perf_counter() - start
    release.set()
    worker.join(10)
    assert waited < 1.0, "it started beside the running step, not after it"
    assert gate.timing()["detector"].yields == 0


def test_batch_work_runs_only_when_interactive_work_leaves_the_lane() -> None:
    gate = ComputeGate(lanes=1)
    order: list[str] = []
    hold = threading.Event()

    def interactive(name: str, wait: bool) -> None:
        with gate.step("assistant", "interactive"):
            order.append(name)
            if wait:
                hold.wait(10)

    def batch() -> None:
        with gate.step("indexer", "batch"):
            order.append("batch")

    first = threading.Thread(target=interactive, args=("token 1", True))
    first.start()
    _wait_for(lambda: gate.snapshot().running["interactive"] == 1)
    threads = [threading.Thread(target=batch)]
    threads[0].start()
    _wait_for(lambda: gate.snapshot().waiting["batch"] == 1)
    threads.append(threading.Thread(target=interactive, args=("token 2", False)))
    threads[1].start()
    _wait_for(lambda: gate.snapshot().waiting["interactive"] == 1)
    hold.set()
    for thread in [first, *threads]:
        thread.join(10)
    assert order == ["token 1", "token 2", "batch"], "the waiting interactive step went before the batch step"
