"""The latency criterion, noise-aware: a wave fails on latency only when the samples in hand show, with
confidence, that the new bundle is slower than the limit; A/A noise on a sub-millisecond model does not.

What a device reports is a summary of its latency window (p50, p95 and the samples behind them; a quiet device's
window holds its golden-set probes, agent/quality/probe.py). A p95 over 24 samples is the second slowest of them,
and the first inferences after an install are slow (cold caches): comparing such a figure with a baseline p95 over
thousands of samples is comparing noise. So each figure is taken with its sampling uncertainty:

- the device's own drift on its unchanged previous bundle (how far its p50 moved between the baseline's reports,
  windows of at least `DRIFT_MIN_SAMPLES`) is added to both limits: a floor derived from the measured jitter, so
  a device whose latency swings between load regimes by itself is not failed for swinging again;
- the window's spread gives the scale of its log-latency, σ = ln(p95 / p50) / 1.645 (at least `SIGMA_FLOOR`);
- a sample quantile q_p over n samples has a standard error, in log terms, of σ·√(p(1-p)/n)/φ(z_p): 2.11·σ/√n for
  the p95, 1.25·σ/√n for the p50; the baseline's and the new bundle's errors add;
- **fails**: the lower confidence bound (one-sided, `latency_confidence`) of the new p95 is above factor × the
  baseline p95 + slack, or that of the new p50 above factor × the baseline p50 + slack (the whole distribution
  moved: a bundle truly 2× slower fails on its centre long before its tail is certain). The tail counts only over
  `MIN_TAIL_SAMPLES` samples on both sides: below that a p95 is one of the few slowest samples, which a burst of
  load elsewhere on the device decides;
- a verdict of "slower" is given only once the wave's observe window has ended (`final`): before that a breach
  is pending ("over the limit so far"), so a burst that passes does not roll a wave back;
- **passes**: neither, and the upper bound of the p95 ratio is at most factor² (the data rule out a gross
  slowdown); **pending** otherwise: the wave waits for more samples, and at its deadline "no data for latency".

The baseline is the device's own previous bundle (its probes or traffic, measured just before the wave). Where
there is none (a first install, or a previous bundle with too few samples), it is the bundle's own measurement for
the device's profile: the farm's devices of that profile (`farm_factor` × factor allowed) or the build
(`build_factor` × factor: another machine, maybe a proxy), judged on the centre alone — a point measurement has
no tail to compare with. Those measurements are back-to-back runs; a quiet device's probe, one every 0.5 s, also
wakes the runtime's threads (0.26 ms more than a back-to-back run for the digits CNN here, 0.29 ms against 0.024
ms), so `quiet_call_ms` is added to that limit: without it a 0.02 ms model failed its first rollout on a loaded
machine (p50 0.303 ms against 10 × 1.5 × 0.018 ms).

**Another model** (another name, or another source graph than the bundle the device runs: `BundleFacts.model_change`)
is never held to the previous model's speed: the device's figures on the previous bundle tell how this device runs
compared with the build, not how fast the new model is. So the new bundle's own measurement (farm, else build) is
scaled to the device by the previous bundle's device-to-build ratio, each bundle measured the same way
(`scale_to_device`): expected = the previous p50 on this device × new build ÷ previous build. A device's p50 also
holds a fixed part no build measures (a quiet device's call, up to `quiet_call_ms`), which does not scale: for a
new model faster at build than the previous one, that part is kept whole (expected = previous p50 × s + c × (1 - s),
s the build ratio, c the fixed part), the most the device's figures allow. The expectation is never below the new
model's own measurement: where the previous model ran faster on the device than at its build, that ratio does not
carry to another model (measured on the corpus, `tests/e2e/test_rollout_corpus_agents.py`: ppocr-cls ran at 0.39x its
build on an agent where basic-pitch then ran at about 1.2x its own, and was rolled back on a limit of 105 ms against
its own build's 178 ms), so the new model is held to its own figure there. The p50 is judged against factor × that
expectation, noise-aware as above (the previous bundle's window and the new one's); the tail is not (another
model's tail has its own shape). A model really 2× slower on the device than its build fails as it would against its
own previous version. Each build's timing carries the load of its machine at that moment, and a busy machine's
timings spread (ddddocr-old timed 27.5 ms, p90 118 ms, beside other work, and a device ran it at 61.0 ms): the
expectation is widened by the product of both builds' spreads (p90 over median, recorded at publish), and its floor
is the new model's own p90. A quiet build (spreads near 1) keeps the limit tight; a noisy one loosens it, and the
finding names the spreads. With no usable previous window, or no build figure for either bundle, the new bundle is
judged against its own measurement alone (`build_factor`/`farm_factor`), as on a device that ran nothing.

Every failure names the figure, where its baseline came from and the flag that changes the outcome.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Literal

from pydantic import BaseModel, ConfigDict

from edgefleet.control.rollout.judge.evidence import Finding, Metrics, Thresholds

SIGMA_FLOOR = 0.02  # a window whose p95 equals its p50 still varies a little
MIN_TAIL_SAMPLES = 100  # a p95 with at least 5 samples above it
_K95 = math.sqrt(0.95 * 0.05) / 0.10314  # √(p(1-p)) / φ(1.645)
_K50 = math.sqrt(0.25) / 0.39894  # √(p(1-p)) / φ(0)

Source = Literal["farm", "build"]
Measured = tuple[float, Source, str]
FACTOR_HINT = "to allow it: --max-latency-factor (or --latency-slack-ms)"


class Scaled(BaseModel):
    """Another model's own measurement scaled to one device by the previous bundle's device-to-build ratio."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    expected_ms: float
    build_ms: float
    previous_build_ms: float
    previous_device_ms: float
    fixed_ms: float
    where: str
    previous: Metrics
    own_floor: bool = False  # the scaled figure fell below the new model's own measurement, which was kept instead
    spreads: tuple[float, float] = (1.0, 1.0)  # each build's p90 over its median: the new bundle's, the previous's

    @property
    def describe(self) -> str:
        fixed = f" with its {self.fixed_ms:.3f} ms fixed part kept whole" if self.fixed_ms else ""
        new, old = self.spreads
        widened = (
            f", widened × {new * old:.2f} by the builds' own spread (p90 over median: {new:.2f} for the new "
            f"model's, {old:.2f} for the previous's)"
            if new * old > 1
            else ""
        )
        scaled = (
            f"the new model's own {self.build_ms:.3f} ms ({self.where}) scaled to this device by its previous "
            f"bundle {self.previous.bundle_id} ({self.previous_device_ms:.3f} ms here against "
            f"{self.previous_build_ms:.3f} ms measured the same way){fixed}{widened}"
        )
        if self.own_floor:
            own = "measurement" if new <= 1 else f"measurement at its p90 ({self.build_ms * new:.3f} ms)"
            return (
                f"{scaled} comes below the new model's own {own}, which is kept: {self.expected_ms:.3f} ms "
                "(another model running faster here than at its build says nothing of this one's speed)"
            )
        return f"{scaled}: {self.expected_ms:.3f} ms"


def scale_to_device(
    previous: Metrics | None, measured: Measured | None, previous_measured: Measured | None, t: Thresholds,
    spreads: tuple[float, float] = (1.0, 1.0),
) -> Scaled | None:  # fmt: skip
    """`measured` (the new bundle's own median for the device's profile) scaled to the device by the previous
    bundle's p50 there over its own median, both measured the same way (farm or build); None when any is lacking.
    `spreads`: each build's p90 over its median (`BundleFacts.measured_spread`), the new bundle's and the previous's.
    Two medians timed at different moments of a busy machine make a ratio only as good as their spreads, so the
    expectation is widened by their product, and its floor is the new model's own figure at its p90: builds whose
    timings spread little (near 1) change it little, a loaded build machine's keep its load out of the verdict."""
    if previous is None or not usable(previous, t) or previous.p50_ms is None or previous.p50_ms <= 0:
        return None
    if measured is None or previous_measured is None or measured[1] != previous_measured[1]:
        return None
    new, old = measured[0], previous_measured[0]
    if new <= 0 or old <= 0:
        return None
    ratio, device = new / old, previous.p50_ms
    fixed = min(t.quiet_call_ms, device) if ratio < 1 else 0.0
    spread_new, spread_old = (max(1.0, s) for s in spreads)
    expected = (device * ratio + fixed * (1 - ratio)) * spread_new * spread_old
    own = new * spread_new
    return Scaled(
        expected_ms=max(expected, own), build_ms=new, previous_build_ms=old, previous_device_ms=device,
        fixed_ms=fixed, where=measured[2], previous=previous, own_floor=expected < own,
        spreads=(spread_new, spread_old),
    )  # fmt: skip


def sigma(m: Metrics) -> float:
    """The scale of the window's log-latency, from its own p50 and p95."""
    if m.p50_ms is None or m.p95_ms is None or m.p50_ms <= 0 or m.p95_ms <= m.p50_ms:
        return SIGMA_FLOOR
    return max(SIGMA_FLOOR, math.log(m.p95_ms / m.p50_ms) / 1.645)


def samples(m: Metrics) -> int:
    """The latency samples behind the window's figures (an older record without them: the requests served)."""
    return max(1, m.latency_samples or m.volume)


def _se(m: Metrics, k: float) -> float:
    return k * sigma(m) / math.sqrt(samples(m))


def _z(confidence: float) -> float:
    """The one-sided normal quantile of `confidence`."""
    return NormalDist().inv_cdf(confidence)


def usable(m: Metrics | None, t: Thresholds) -> bool:
    """A window with enough requests and a p95 and p50 to judge latency on."""
    return m is not None and m.p95_ms is not None and m.volume >= t.min_requests


def judge_latency(
    baseline: Metrics | None, observed: Metrics, t: Thresholds, measured: Measured | None = None,
    final: bool = True, scaled: Scaled | None = None,
) -> Finding | None:  # fmt: skip
    """The latency finding for one device. `measured`: the bundle's own median for the device's profile, where it
    was measured ("farm" or "build") and a description, used when the device has no usable baseline. `final`:
    the observe window has ended, so a breach is a failure (before: pending). `scaled`: another model's own
    measurement scaled to the device (then `baseline` must be None: the previous model's speed is not this one's)."""
    finding = _judge(baseline, observed, t, measured, scaled)
    if finding is not None and finding.ok is False and not final:
        return finding.model_copy(
            update={"ok": None, "pending": True, "detail": f"not judged: over the limit so far: {finding.detail}; "
                    "judged when the observe window ends"}
        )  # fmt: skip
    return finding


def _judge(
    baseline: Metrics | None, observed: Metrics, t: Thresholds, measured: Measured | None, scaled: Scaled | None
) -> Finding | None:
    factor = t.max_latency_factor
    if factor is None:
        return None
    if not usable(observed, t):
        detail = f"not judged: {observed.volume} requests served on the new bundle, {t.min_requests} needed"
        if observed.volume >= t.min_requests:
            detail = "not judged: the device's latency window still holds mostly the previous bundle's requests"
        return Finding(criterion="latency", ok=None, pending=True, detail=detail)
    z = _z(t.latency_confidence)
    if scaled is not None:
        return _against_scaled(observed, t, factor, z, scaled)
    if usable(baseline, t) and baseline is not None:
        return _against_baseline(baseline, observed, t, factor, z)
    if measured is not None:
        return _against_measurement(observed, t, factor, z, measured)
    why = "the device ran no bundle before the wave" if baseline is None else (
        f"{baseline.volume} requests on the previous bundle, {t.min_requests} needed"
    )  # fmt: skip
    return Finding(
        criterion="latency", ok=None, pending=True,
        detail=f"not judged: no baseline p95 ({why}) and the bundle carries no latency measurement for its profile",
    )  # fmt: skip


def _against_baseline(baseline: Metrics, observed: Metrics, t: Thresholds, factor: float, z: float) -> Finding:
    assert baseline.p95_ms is not None and observed.p95_ms is not None
    se95 = math.hypot(_se(baseline, _K95), _se(observed, _K95))
    se50 = math.hypot(_se(baseline, _K50), _se(observed, _K50))
    low95, high95 = observed.p95_ms * math.exp(-z * se95), observed.p95_ms * math.exp(z * se95)
    drift = baseline.p50_drift_ms  # what the device's own latency moved by on the unchanged bundle
    limit95 = factor * baseline.p95_ms + t.latency_slack_ms + drift
    centre = observed.p50_ms is not None and baseline.p50_ms is not None  # older agents: the tail alone
    low50 = observed.p50_ms * math.exp(-z * se50) if observed.p50_ms is not None else 0.0
    limit50 = factor * baseline.p50_ms + t.latency_slack_ms + drift if baseline.p50_ms is not None else math.inf
    count = f"{samples(observed)} samples against {samples(baseline)}"
    tail = min(samples(observed), samples(baseline)) >= MIN_TAIL_SAMPLES
    if tail and low95 > limit95:
        return Finding(
            criterion="latency", ok=False,
            detail=f"p95 {observed.p95_ms:.3f} ms (at least {low95:.3f} ms at {t.latency_confidence:.0%} "
            f"confidence, {count}) exceeds {_limit(factor, baseline.p95_ms, t, drift, limit95)}; "
            f"{_device_source(baseline)}; {FACTOR_HINT}",
        )  # fmt: skip
    if centre and low50 > limit50:
        return Finding(
            criterion="latency", ok=False,
            detail=f"p50 {observed.p50_ms:.3f} ms (at least {low50:.3f} ms at {t.latency_confidence:.0%} "
            f"confidence, {count}) exceeds {_limit(factor, baseline.p50_ms, t, drift, limit50, 'p50 ')}; "
            f"p95 {observed.p95_ms:.3f} ms; {_device_source(baseline)}; {FACTOR_HINT}",
        )  # fmt: skip
    if high95 > factor * factor * baseline.p95_ms + t.latency_slack_ms + drift:
        return Finding(
            criterion="latency", ok=None, pending=True,
            detail=f"not judged: p95 {observed.p95_ms:.3f} ms against baseline {baseline.p95_ms:.3f} ms is still "
            f"within the noise of {count} (up to {high95:.3f} ms at {t.latency_confidence:.0%} confidence)",
        )  # fmt: skip
    if not tail:
        return Finding(
            criterion="latency", ok=True,
            detail=f"p50 {observed.p50_ms or 0:.3f} ms within "
            f"{_limit(factor, baseline.p50_ms, t, drift, limit50, 'p50 ')} and p95 {observed.p95_ms:.3f} ms within "
            f"its noise ({count}; the p95 alone counts over {MIN_TAIL_SAMPLES})",
        )  # fmt: skip
    return Finding(
        criterion="latency", ok=True,
        detail=f"p95 {observed.p95_ms:.3f} ms within {_limit(factor, baseline.p95_ms, t, drift, limit95)} ({count})",
    )  # fmt: skip


def _device_source(baseline: Metrics) -> str:
    return f"baseline: the same model's previous bundle {baseline.bundle_id} on this device"


def _against_scaled(observed: Metrics, t: Thresholds, factor: float, z: float, scaled: Scaled) -> Finding:
    assert observed.p95_ms is not None
    centre = observed.p50_ms if observed.p50_ms is not None else observed.p95_ms
    se50 = math.hypot(_se(scaled.previous, _K50), _se(observed, _K50))
    low50, high50 = centre * math.exp(-z * se50), centre * math.exp(z * se50)
    drift = scaled.previous.p50_drift_ms * max(1.0, scaled.build_ms / scaled.previous_build_ms)
    limit = factor * scaled.expected_ms + t.latency_slack_ms + drift
    extra = _added((("slack", t.latency_slack_ms), ("its drift", drift)))
    head = (
        f"p50 {centre:.3f} ms (p95 {observed.p95_ms:.3f} ms, {samples(observed)} samples) of another model "
        f"against {factor:g} × {scaled.expected_ms:.3f} ms{extra} = {limit:.3f} ms; baseline: {scaled.describe}"
    )
    if low50 > limit:
        return Finding(
            criterion="latency", ok=False,
            detail=f"{head}: at least {low50:.3f} ms at {t.latency_confidence:.0%} confidence, over the limit; "
            f"{FACTOR_HINT}",
        )  # fmt: skip
    if high50 > factor * limit:
        return Finding(criterion="latency", ok=None, pending=True, detail=f"not judged: {head}: still within the noise")
    return Finding(criterion="latency", ok=True, detail=f"{head}: within")


def _added(terms: tuple[tuple[str, float], ...]) -> str:
    """ " + slack 1.000 ms + its drift 0.200 ms": the non-zero terms a limit adds, for a finding's text."""
    return "".join(f" + {name} {value:.3f} ms" for name, value in terms if value)


def _limit(factor: float, base: float | None, t: Thresholds, drift: float, limit: float, what: str = "") -> str:
    extra = _added((("slack", t.latency_slack_ms), ("its drift", drift)))
    return f"{factor:g} × baseline {what}{base or 0:.3f} ms{extra} = {limit:.3f} ms"


def _against_measurement(observed: Metrics, t: Thresholds, factor: float, z: float, measured: Measured) -> Finding:
    assert observed.p95_ms is not None
    median, source, where = measured
    centre = observed.p50_ms if observed.p50_ms is not None else observed.p95_ms  # older agents: the p95 bounds it
    allowance = t.farm_factor if source == "farm" else t.build_factor
    extra = t.latency_slack_ms + t.quiet_call_ms
    limit = factor * allowance * median + extra
    se50 = _se(observed, _K50)
    low50, high50 = centre * math.exp(-z * se50), centre * math.exp(z * se50)
    head = (
        f"p50 {centre:.3f} ms (p95 {observed.p95_ms:.3f} ms, {samples(observed)} samples; no baseline "
        f"on the device) against the bundle's {median:.3f} ms measured by {where}"
    )
    if low50 > limit:
        return Finding(
            criterion="latency", ok=False,
            detail=f"{head}: exceeds {_allowed(factor, allowance, median, t, limit)}; baseline: the bundle's own "
            f"measurement, no figure of this device; {FACTOR_HINT}",
        )  # fmt: skip
    if high50 > factor * limit:
        return Finding(
            criterion="latency", ok=None, pending=True, detail=f"not judged: {head}: still within the noise"
        )  # fmt: skip
    within = f"within {_allowed(factor, allowance, median, t, limit)}"
    return Finding(criterion="latency", ok=True, detail=f"{head}: {within}")


def _allowed(factor: float, allowance: float, median: float, t: Thresholds, limit: float) -> str:
    extra = _added((("a quiet device's call", t.quiet_call_ms), ("slack", t.latency_slack_ms)))
    return f"{factor:g} × {allowance:g} × {median:.3f}{extra} = {limit:.3f} ms"


__all__ = ["SIGMA_FLOOR", "Measured", "Scaled", "judge_latency", "scale_to_device", "sigma", "usable"]
