"""Dynamic batching on real ONNX Runtime sessions: concurrent requests are joined into one run up to the preferred
batch size within the queue delay, and each gets back exactly the answer it would have got alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgefleet.agent.schedule import Batcher, BatchingConfig

from support.models.batching import Feeds, batch_mean, digits_any_batch, digits_samples, session_run

SLOW_JOIN = BatchingConfig(max_queue_delay_ms=5000, preferred_batch_size=4)  # waits for 4 rows (never 5 s here)


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Feeds], Feeds]:
    return session_run(digits_any_batch(tmp_path_factory.mktemp("batching") / "digits.onnx"))


def _concurrently(batcher: Batcher, requests: list[Feeds]) -> list[Feeds]:
    answers: list[Feeds | BaseException | None] = [None] * len(requests)

    def ask(index: int) -> None:
        try:
            answers[index] = batcher.run(requests[index])
        except BaseException as err:  # handed to the test thread
            answers[index] = err

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return [answer for answer in answers if isinstance(answer, dict)]


def test_concurrent_requests_run_as_one_batch_and_each_gets_its_unbatched_answer_bit_for_bit(
    digits: Callable[[Feeds], Feeds],
) -> None:
    x = digits_samples(4)
    alone = [digits({"input": sample})["logits"] for sample in x]
    batcher = Batcher(digits, SLOW_JOIN, name="digits")
    try:
        answers = _concurrently(batcher, [{"input": sample} for sample in x])
    finally:
        batcher.close()
    for answer, expected in zip(answers, alone, strict=True):
        assert answer["logits"].shape == (1, 10)
        np.testing.assert_array_equal(answer["logits"], expected)
    total = batcher.timer.total()
    assert (total.batches, total.batched_requests) == (1, 4), "four requests, one run"
    assert total.queue_ms.count == 4 and total.compute_ms.count == 1


def test_requests_of_several_rows_are_split_back_by_their_own_rows(digits: Callable[[Feeds], Feeds]) -> None:
    x = digits_samples(6, seed=1)[:, 0]  # six [1, 8, 8] digits: requests of 1, 2 and 3 rows
    requests = [{"input": x[:1]}, {"input": x[1:3]}, {"input": x[3:6]}]
    expected = [np.concatenate([digits({"input": row[None]})["logits"] for row in r["input"]]) for r in requests]
    batcher = Batcher(digits, BatchingConfig(max_queue_delay_ms=5000, preferred_batch_size=6), name="digits")
    try:
        answers = _concurrently(batcher, requests)
    finally:
        batcher.close()
    for answer, want in zip(answers, expected, strict=True):
        np.testing.assert_array_equal(answer["logits"], want)
    assert batcher.timer.total().batches == 1


@pytest.mark.parametrize("instances", [1, 2])
def test_a_batch_never_exceeds_the_preferred_size_and_the_delay_bounds_the_wait(
    digits: Callable[[Feeds], Feeds], instances: int
) -> None:
    x = digits_samples(5, seed=2)
    config = BatchingConfig(max_queue_delay_ms=300, preferred_batch_size=2, instances=instances)
    batcher = Batcher(digits, config, name="digits")
    try:
        answers = _concurrently(batcher, [{"input": sample} for sample in x])
    finally:
        batcher.close()
    assert len(answers) == 5
    total = batcher.timer.total()
    assert total.batched_requests == 5 and total.batches >= 3, "at most 2 rows a batch: five requests need 3 runs"
    assert total.queue_ms.p99_ms is not None and total.queue_ms.p99_ms < 300 * 3 + 2000


def test_a_model_whose_output_is_not_per_row_is_answered_alone_and_batching_switches_off(tmp_path: Path) -> None:
    run = session_run(batch_mean(tmp_path / "mean.onnx"))
    rows = [np.full((1, 4), float(i), np.float32) for i in range(3)]
    batcher = Batcher(run, BatchingConfig(max_queue_delay_ms=5000, preferred_batch_size=3), name="mean")
    try:
        answers = _concurrently(batcher, [{"x": r} for r in rows])
        again = batcher.run({"x": rows[0]})
    finally:
        batcher.close()
    for answer, r in zip(answers, rows, strict=True):
        np.testing.assert_array_equal(answer["y"], r), "each request's own answer, not the batch's mean"
    np.testing.assert_array_equal(again["y"], rows[0])
    assert batcher.reason is not None and "not one row per input row" in batcher.reason


def test_a_failing_run_fails_every_request_of_its_batch_and_the_batcher_keeps_serving(
    digits: Callable[[Feeds], Feeds],
) -> None:
    calls = {"n": 0}

    def fails_once(feeds: Feeds) -> Feeds:  # a runtime fault on demand (a real session cannot be made to fail so)
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("device lost")
        return digits(feeds)

    batcher = Batcher(fails_once, BatchingConfig(max_queue_delay_ms=5000, preferred_batch_size=2), name="digits")
    x = digits_samples(2, seed=3)
    try:
        with pytest.raises(RuntimeError, match="device lost"):
            _concurrently(batcher, [{"input": sample} for sample in x])
        answers = _concurrently(batcher, [{"input": sample} for sample in x])
        for answer, sample in zip(answers, x, strict=True):
            np.testing.assert_array_equal(answer["logits"], digits({"input": sample})["logits"])
    finally:
        batcher.close()


def test_a_batcher_has_no_thread_of_its_own_and_after_close_answers_alone(digits: Callable[[Feeds], Feeds]) -> None:
    before = threading.active_count()
    batcher = Batcher(digits, BatchingConfig(instances=2), name="digits")
    assert threading.active_count() == before, "nothing runs (or spins) while no request is waiting"
    batcher.close()
    x = digits_samples(1)[0]
    np.testing.assert_array_equal(batcher.run({"input": x})["logits"], digits({"input": x})["logits"])


@pytest.mark.parametrize(("instances", "delay_ms"), [(1, 0.0), (2, 0.0), (3, 0.5)])
def test_many_clients_get_every_answer_right_and_the_batcher_ends_idle(
    digits: Callable[[Feeds], Feeds], instances: int, delay_ms: float
) -> None:
    x = digits_samples(64, seed=7)[:, 0]
    expected = np.concatenate([digits({"input": row[None]})["logits"] for row in x])

    def held(feeds: Feeds) -> Feeds:
        """The real session, held 1 ms a call like a model larger than digits (its few microseconds let two
        instances and no queue delay answer every request alone on a busy machine: nothing then batches)."""
        time.sleep(0.001)
        return digits(feeds)

    batcher = Batcher(held, BatchingConfig(max_queue_delay_ms=delay_ms, preferred_batch_size=5, instances=instances))
    wrong: list[int] = []

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(60):
            start = int(rng.integers(0, 60))
            rows = int(rng.integers(1, 4))
            answer = batcher.run({"input": x[start : start + rows]})["logits"]
            if not np.array_equal(answer, expected[start : start + rows]):
                wrong.append(start)

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a request was never answered"
    assert wrong == []
    total = batcher.timer.total()
    assert total.batched_requests == 8 * 60 and total.batches < total.batched_requests
    assert (batcher._leading, len(batcher._queue)) == (0, 0), "no lead and no request left behind"
