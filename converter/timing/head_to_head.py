"""The search's last word: the best candidates re-timed together before one is chosen.

The main timing phase (converter.search.timing) times every candidate inside the budget and stops the ones that cannot
win; on a loaded 2-core machine one such phase can rank two runtimes either way from run to run (ppocr-cls:
OpenVINO FP32 chosen at 10.07 ms in one run, ONNX Runtime FP32 at 2.59 ms in the bench right after; ORT FP32
chosen an hour earlier). So the finalists (the fastest candidate of each runtime, and any other within
`FINALIST_MARGIN` of the best median, at most `MAX_FINALISTS`) run again, together:

- `ROUNDS` interleaved rounds (up to `MAX_ROUNDS` while the phase has taken under `PHASE_S`), the order rotated
  every round, so no finalist always follows the same one;
- before each block, the previous runtime's worker threads are waited out (converter.timing.latency.settle: ONNX
  Runtime's spin after each run, and an OpenVINO model timed meanwhile ran several times slower), then
  `WARMUP_RUNS` untimed runs; each runtime keeps its own settings, at the profile's first thread count;
- each finalist's figure is the median of its per-round medians.

`decide` (pure, tested with injected timings) keeps the fastest, unless another finalist stays within its
noise: the median over rounds of its time divided by the fastest's in the same round is within `NOISE` of 1
(a paired ratio: a burst of load that slows a whole round cancels out; how many rounds each won is reported,
not used: with bursts longer than a block, a clearly slower finalist still wins some rounds). Among the fastest
and those within its noise, the tie-break prefers, in this order:
FP32 over lower precision (bf16/fp16, then INT8: the output the user exported), ONNX Runtime over OpenVINO and
the others (the runtime every device install has), the smaller model, then the lower median.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from edgefleet.converter.runners import Runner
from edgefleet.converter.timing.latency import runtime_changes, settle
from edgefleet.core.tensors import Dataset

FINALIST_MARGIN = 1.5  # candidates within this factor of the best median in the timing phase re-run
MAX_FINALISTS = 4
ROUNDS = 9
MAX_ROUNDS = 25
PHASE_S = 8.0  # more rounds than ROUNDS only while the phase has taken less than this
WARMUP_RUNS = 1  # untimed runs per block, after the other runtime's threads went quiet (enough: measure.settle)
ROUND_S = 0.3  # per finalist and round: the block's runs (5 to 30) are sized to about this long
NOISE = 0.05  # a median paired ratio within this of 1.0 is a tie
TIE_BREAK = "FP32 over lower precision, then ONNX Runtime over other runtimes, then the smaller model"


@dataclass(frozen=True)
class Finalist:
    """What the tie-break reads of a candidate."""

    name: str
    runtime: str
    precision: str
    size_bytes: int


@dataclass(frozen=True)
class Decision:
    winner: str
    fastest: str
    tied: tuple[str, ...]  # within the fastest's noise (the fastest first)
    why: str


@dataclass
class HeadToHead:
    """What the report shows of the phase: every finalist's figures, and the decision and why."""

    threads: int
    rounds: int
    warmup_runs: int
    finalists: list[dict[str, object]] = field(default_factory=list)
    fastest: str = ""
    within_noise: list[str] = field(default_factory=list)
    chosen: str = ""
    why: str = ""
    tie_break: str = TIE_BREAK
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def precision_rank(precision: str) -> int:
    if precision == "fp32":
        return 0
    return 2 if "int8" in precision else 1


def runtime_rank(runtime: str) -> int:
    return {"onnxruntime": 0, "openvino": 1}.get(runtime, 2)


def finalists(
    medians: Mapping[str, float],
    runtimes: Mapping[str, str],
    margin: float = FINALIST_MARGIN,
    most: int = MAX_FINALISTS,
) -> list[str]:
    """The candidates to re-time, fastest first: each runtime's fastest (the ranking between runtimes is what a
    loaded machine gets wrong), then others within `margin` of the best median, `most` in all."""
    order = sorted(medians, key=lambda n: medians[n])
    leaders: list[str] = []
    for name in order:
        if runtimes.get(name) not in {runtimes.get(n) for n in leaders}:
            leaders.append(name)
    others = [n for n in order if n not in leaders and medians[n] <= medians[order[0]] * margin]
    picked = leaders[:most] + others[: max(0, most - len(leaders))]
    return sorted(picked, key=order.index)


def _key(finalist: Finalist, median: float) -> tuple[int, int, int, float]:
    return (precision_rank(finalist.precision), runtime_rank(finalist.runtime), finalist.size_bytes, median)


def _paired(rounds_ms: Mapping[str, Sequence[float]], name: str, versus: str) -> tuple[float, int, int]:
    """The median over rounds of `name`'s time over `versus`'s in the same round, the rounds `name` was the
    faster one in, and the rounds compared."""
    pairs = [(a, b) for a, b in zip(rounds_ms[name], rounds_ms[versus], strict=False) if a > 0 and b > 0]
    if not pairs:
        return statistics.median(rounds_ms[name]) / statistics.median(rounds_ms[versus]), 0, 0
    return statistics.median(a / b for a, b in pairs), sum(1 for a, b in pairs if a < b), len(pairs)


def decide(rounds_ms: Mapping[str, Sequence[float]], traits: Mapping[str, Finalist]) -> Decision:
    """The finalist to ship, from each finalist's per-round medians (round i of every finalist ran in the same
    round, so their ratio is paired against the same load).

    The fastest is the one with the lowest median over rounds of its time relative to the round's geometric
    mean (a round's load scales every finalist in it alike), or one that beats it by more than the noise round
    for round (paired); the others are compared with it by paired ratios."""
    medians = {name: statistics.median(values) for name, values in rounds_ms.items() if values}
    if not medians:
        raise ValueError("no finalist has a timed round")
    count = min(len(rounds_ms[n]) for n in medians)
    means = [math.exp(statistics.fmean(math.log(max(rounds_ms[n][i], 1e-9)) for n in medians)) for i in range(count)]
    relative = {n: statistics.median(rounds_ms[n][i] / means[i] for i in range(count)) for n in medians}
    fastest = min(medians, key=lambda n: (relative[n], _key(traits[n], medians[n])))
    for _ in range(len(medians)):  # bounded: paired ratios need not be transitive
        ratios = {n: _paired(rounds_ms, n, fastest)[0] for n in medians if n != fastest}
        challenger = min(ratios, key=lambda n: ratios[n], default=None)
        if challenger is None or ratios[challenger] >= 1 / (1 + NOISE):
            break
        fastest = challenger
    tied, notes = [fastest], []
    for name in sorted(medians, key=lambda n: relative[n]):
        if name == fastest:
            continue
        ratio, won, compared = _paired(rounds_ms, name, fastest)
        notes.append(f"{name} {ratio:.2f}x (the faster one in {won} of {compared} rounds)")
        if ratio <= 1 + NOISE:
            tied.append(name)
    winner = min(tied, key=lambda n: _key(traits[n], medians[n]))
    others = f"; others, by the median of their paired per-round ratios: {', '.join(notes)}" if notes else ""
    bound = f"noise: within {1 + NOISE:.2f}x"
    if len(tied) == 1:
        why = f"fastest head to head ({medians[fastest]:.3g} ms median){others}; none within its {bound}"
    elif winner == fastest:
        why = (
            f"fastest head to head ({medians[fastest]:.3g} ms median){others}; {', '.join(tied[1:])} within its "
            f"{bound}, and the tie-break ({TIE_BREAK}) keeps it"
        )
    else:
        why = (
            f"within the {bound} of the fastest, {fastest} ({medians[fastest]:.3g} ms median){others}: the "
            f"tie-break ({TIE_BREAK}) prefers {winner} ({traits[winner].precision}, {traits[winner].runtime}, "
            f"{traits[winner].size_bytes / 1e3:.0f} KB) over {fastest} ({traits[fastest].precision}, "
            f"{traits[fastest].runtime}, {traits[fastest].size_bytes / 1e3:.0f} KB)"
        )
    return Decision(winner, fastest, tuple(tied), why)


def time_finalists(
    runners: Mapping[str, Runner],
    dataset: Dataset,
    *,
    rounds: int = ROUNDS,
    max_rounds: int = MAX_ROUNDS,
    phase_s: float = PHASE_S,
    warmup: int = WARMUP_RUNS,
    round_s: float = ROUND_S,
    on_round: Callable[[int, int], None] | None = None,
    runtimes: Mapping[str, str] | None = None,
    min_runs: int = 5,
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, int]]:
    """Interleaved rounds (`rounds`, then more up to `max_rounds` while under `phase_s`), rotated, each block after
    the other threads went quiet (where the runtime changes, given `runtimes`) and `warmup` untimed runs.
    Returns, per finalist, every run's ms, each round's median, and its runs per round (about `round_s`)."""
    names = list(runners)
    samples = [dataset.sample(i % len(dataset)) for i in range(30)]
    runs: dict[str, int] = {}
    for name in names:  # an untimed first pass sizes each finalist's blocks
        settle()
        start = time.perf_counter()
        for feeds in samples[:3]:
            runners[name](feeds)
        took = (time.perf_counter() - start) * 1000.0 / 3
        runs[name] = max(min_runs, min(30, math.ceil(round_s * 1000.0 / max(took, 1e-3))))
    every: dict[str, list[float]] = {name: [] for name in names}
    per_round: dict[str, list[float]] = {name: [] for name in names}
    started, index, previous = time.monotonic(), 0, None
    while index < rounds or (index < max_rounds and time.monotonic() - started < phase_s):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            run = runners[name]
            if runtime_changes(runtimes, previous, name):
                settle()
            previous = name
            for feeds in samples[:warmup]:
                run(feeds)
            block = []
            for feeds in samples[: runs[name]]:
                start = time.perf_counter()
                run(feeds)
                block.append((time.perf_counter() - start) * 1000.0)
            every[name] += block
            per_round[name].append(statistics.median(block))
        index += 1
        if on_round is not None:
            on_round(index, max(rounds, index))
    return every, per_round, runs
