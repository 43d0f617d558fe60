"""Dynamic batching (as Triton's dynamic batcher): concurrent requests for a model with a batch dimension are joined
into one run, and each request gets back its own rows of the answer.

- `batch_support(manifest)` says whether a model can be batched and why not: every input and every output must
  have the same symbolic first dimension (e.g. `batch`). A model whose batch dimension is fixed (the digits CNN:
  `[1, 1, 8, 8]`) is served unbatched, and the reason says so.
- `Batcher` holds a queue; up to `instances` batches form and run at once, each run by one of the requesting threads
  (no thread of its own: nothing runs, let alone spins, when idle). A batch is the oldest request and every queued
  request whose inputs have the same dtypes and the same shapes past the first axis, up to `preferred_batch_size`
  rows. When fewer rows are queued, its leader waits for more up to `max_queue_delay_ms` after the oldest request
  arrived (0: it runs what is there at once: under load the queue fills while the previous batch runs). The joined
  inputs run once; the outputs are split back by rows.
- Each request is checked by the caller before it joins the queue (bad input is refused on its own and never fails
  a batch). If a joined run fails, every request of that batch gets the error. If a model's outputs turn out not to
  have one row per input row, the batch is answered request by request and batching is switched off for the model,
  with the reason (`Batcher.reason`).
- Every run is counted in a `SlotTimer` (agent/schedule/timing.py): queue time per request, compute time per run,
  runs and the requests they answered.

Answers are identical to the unbatched ones where the runtime's kernels compute each row independently of the
others (tests/integration/agent/test_batching.py checks it bit for bit on real ONNX Runtime models).
"""

from __future__ import annotations

import _thread
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edgefleet.agent.schedule.timing import SlotTimer
from edgefleet.core.bundle.manifest import Manifest, TensorSpec
from edgefleet.core.errors import DataError

log = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]

EXTRA_BATCHES = 4  # batches a leader runs for others after its own answer, while requests are queued


class BatchingConfig(BaseModel):
    """How a slot batches (Triton's `dynamic_batching` settings)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_queue_delay_ms: float = Field(
        default=0.0, ge=0, le=10_000, description="how long the oldest queued request may wait for others to join it"
    )
    preferred_batch_size: int = Field(
        default=8, ge=2, le=4096, description="rows a batch is formed up to; a batch this size runs at once"
    )
    instances: int = Field(default=1, ge=1, le=64, description="batches running at once (worker threads)")


@dataclass(frozen=True)
class BatchSupport:
    """Whether a model can be batched; `reason` says why not (or which dimension is the batch)."""

    batchable: bool
    reason: str


def batch_support(manifest: Manifest) -> BatchSupport:
    """A model is batchable when every input and output has the same symbolic first dimension."""
    if manifest.generation is not None:
        return BatchSupport(False, "a generative model: its requests are token streams, not batched runs")
    specs: list[tuple[str, TensorSpec]] = [("input", s) for s in manifest.inputs]
    specs += [("output", s) for s in manifest.outputs]
    if not manifest.inputs:
        return BatchSupport(False, "the model declares no inputs")
    first: str | None = None
    for kind, spec in specs:
        if not spec.shape:
            return BatchSupport(False, f"{kind} {spec.name!r} is a scalar: no batch dimension")
        dim = spec.shape[0]
        if isinstance(dim, int) and dim >= 0:
            return BatchSupport(False, f"batch dimension fixed at {dim}: {kind} {spec.name!r} is {spec.shape}")
        if not isinstance(dim, str):
            return BatchSupport(False, f"{kind} {spec.name!r}'s first dimension is unnamed ({spec.shape}): "
                                "it cannot be told to be the batch")  # fmt: skip
        if first is None:
            first = dim
        elif dim != first:
            return BatchSupport(False, f"first dimensions differ ({first!r} and {kind} {spec.name!r}'s {dim!r})")
    return BatchSupport(True, f"batched along the first dimension {first!r}")


class _Pending:
    """One request in the queue. Its thread waits on `wake` (held until signalled) for its answer, or for the turn
    to lead batches; `taken`, `answered`, `promoted` and `signalled` change under the batcher's lock only."""

    __slots__ = ("answered", "error", "feeds", "key", "leading", "outputs", "promoted", "queued_at", "rows",
                 "signalled", "taken", "wake")  # fmt: skip

    def __init__(self, feeds: Feeds) -> None:
        rows = {value.shape[0] if value.ndim else -1 for value in feeds.values()}
        if len(rows) != 1 or -1 in rows:
            raise DataError(f"the inputs disagree on the batch dimension (first dimensions {sorted(rows)})")
        self.feeds, self.rows = feeds, rows.pop()
        self.key = tuple((name, value.dtype.str, value.shape[1:]) for name, value in sorted(feeds.items()))
        self.outputs: Feeds | None = None
        self.error: BaseException | None = None
        self.taken = self.answered = self.promoted = self.signalled = self.leading = False
        self.queued_at = time.perf_counter()
        self.wake = _thread.allocate_lock()
        self.wake.acquire()

    def signal(self) -> None:
        """Under the batcher's lock: wake the request's thread (at most one wake-up pending)."""
        if not self.signalled:
            self.signalled = True
            self.wake.release()


class Batcher:
    """Joins concurrent requests to one model into batched runs of `run` (the model's run without checks: the
    caller checks each request before `run` here). `gate`, when given, is entered around every run (the scheduler's
    compute gate, agent/schedule/gate.py).

    No thread of its own: the callers run the batches. A request that finds fewer than `instances` batches in
    progress leads: it forms a batch from the queue (oldest first), runs it, hands each request its rows, and goes on
    until its own request is answered; then it passes the lead to a request still queued. The others wait, each on
    its own lock, for their answer (or for the lead). A lone request is run by its own thread at once: batching costs
    it no thread switch. A leader whose answer is ready runs up to EXTRA_BATCHES more while requests are queued, so
    that under load the next batch does not wait for a woken thread. `close()` stops batching: later requests run
    alone."""

    def __init__(
        self,
        run: Callable[[Feeds], Feeds],
        config: BatchingConfig,
        *,
        name: str = "model",
        timer: SlotTimer | None = None,
        gate: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self._run, self.config, self.name = run, config, name
        self.timer = timer or SlotTimer()
        self._gate = gate
        self._queue: deque[_Pending] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._leading = 0  # leaders forming or running a batch (at most config.instances)
        self._collecting = 0  # leaders waiting for more requests (max_queue_delay_ms)
        self._closed = False
        self.reason: str | None = None  # set when batching was switched off for this model, and why

    def run(self, feeds: Feeds) -> Feeds:
        """The model's answer to `feeds` (checked input), from a batch with whatever else is queued."""
        pending = _Pending(feeds)
        if self._closed or self.reason is not None:
            return self._alone(pending)
        with self._cond:
            self._queue.append(pending)
            lead = self._leading < self.config.instances
            if lead:
                self._leading += 1
                pending.leading = True
            elif self._collecting:
                self._cond.notify()
        while not lead:
            pending.wake.acquire()
            with self._cond:
                pending.signalled = False
                lead, pending.promoted = pending.promoted, False
                if not lead and pending.answered:
                    break
        if lead:
            self._lead(pending)
        if pending.error is not None:
            raise pending.error
        assert pending.outputs is not None
        return pending.outputs

    def close(self) -> None:
        """Stop batching; requests already queued are still answered by their leaders."""
        with self._cond:
            self._closed = True

    # --- leading
    def _lead(self, own: _Pending) -> None:
        """Form and run batches until `own` is answered, then up to EXTRA_BATCHES more while requests are queued (the
        batches follow each other without a thread switch); then pass the lead on. If another leader took `own`,
        wait for its answer."""
        extra = 0
        while True:
            with self._cond:
                if own.taken and (not own.answered or not self._queue or extra >= EXTRA_BATCHES or self._closed):
                    self._pass_lead()
                    answered = own.answered
                    break
                self._wait_for_more(own)
                if not self._queue or (own.taken and not own.answered):
                    continue  # another leader took what was queued: decide again
                batch = self._take()
            if own.answered:
                extra += 1
            self._execute(batch, own)
        while not answered:
            own.wake.acquire()
            with self._cond:
                own.signalled = False
                answered = own.answered

    def _pass_lead(self) -> None:
        """Under the lock: the oldest request still queued leads next (its thread is woken), or one leader fewer."""
        for pending in self._queue:
            if not pending.leading:  # a follower (a leader's own request may still be queued too)
                pending.leading = pending.promoted = True
                pending.signal()
                return
        self._leading -= 1

    def _wait_for_more(self, own: _Pending) -> None:
        """Under the lock: wait until the preferred rows are queued or the oldest request's delay is over."""
        delay = self.config.max_queue_delay_ms / 1000
        if delay <= 0:
            return
        self._collecting += 1
        try:
            while (
                (own.answered or not own.taken)
                and self._queue
                and self._rows_ready() < self.config.preferred_batch_size
            ):
                left = self._queue[0].queued_at + delay - time.perf_counter()
                if left <= 0:
                    return
                self._cond.wait(left)
        finally:
            self._collecting -= 1

    def _rows_ready(self) -> int:
        key = self._queue[0].key
        return sum(p.rows for p in self._queue if p.key == key)

    def _take(self) -> list[_Pending]:
        """Under the lock: the oldest request and the queued ones that can join it, up to the preferred rows."""
        first = self._queue.popleft()
        batch, rows, limit = [first], first.rows, self.config.preferred_batch_size
        kept: list[_Pending] = []
        while self._queue and rows < limit:
            pending = self._queue.popleft()
            if pending.key == first.key and rows + pending.rows <= limit:
                batch.append(pending)
                rows += pending.rows
            else:
                kept.append(pending)
        self._queue.extendleft(reversed(kept))
        for pending in batch:
            pending.taken = True
        return batch

    def _execute(self, batch: list[_Pending], own: _Pending) -> None:
        start = time.perf_counter()
        try:
            if self._gate is not None:
                with self._gate():
                    self._answer(batch)
            else:
                self._answer(batch)
        except Exception as err:  # every request of the batch gets the run's error; batching goes on
            for pending in batch:
                if pending.outputs is None:
                    pending.error = err
        end = time.perf_counter()
        with self._cond:
            for pending in batch:
                pending.answered = True
                if pending is not own:
                    pending.signal()
        for pending in batch:
            self.timer.queued((start - pending.queued_at) * 1000)
        self.timer.ran((end - start) * 1000, len(batch))

    def _answer(self, batch: list[_Pending]) -> None:
        if len(batch) == 1:
            batch[0].outputs = self._run(batch[0].feeds)
            return
        names = batch[0].feeds.keys()
        joined = {name: np.concatenate([p.feeds[name] for p in batch]) for name in names}
        outputs = self._run(joined)
        total = sum(p.rows for p in batch)
        uneven = [n for n, v in outputs.items() if not v.ndim or v.shape[0] != total]
        if uneven:
            self.reason = (f"output {uneven[0]!r} of a batch of {total} rows has shape {outputs[uneven[0]].shape}: "
                           "not one row per input row, so batching is off for this model")  # fmt: skip
            log.warning("%s: %s", self.name, self.reason)
            for pending in batch:
                pending.outputs = self._run(pending.feeds)
            return
        offset = 0
        for pending in batch:
            end = offset + pending.rows
            pending.outputs = {name: value[offset:end] for name, value in outputs.items()}
            offset = end

    def _alone(self, pending: _Pending) -> Feeds:
        start = time.perf_counter()
        try:
            if self._gate is not None:
                with self._gate():
                    return self._run(pending.feeds)
            return self._run(pending.feeds)
        finally:
            self.timer.queued(0.0)
            self.timer.ran((time.perf_counter() - start) * 1000, 1)


__all__ = ["BatchSupport", "Batcher", "BatchingConfig", "batch_support"]
