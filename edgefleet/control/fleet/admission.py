"""The trust boundary for what devices say: every report is admitted here, once, before anything stores it.

A device is untrusted input to the control plane (one stolen certificate is enough to send anything on that
device's own topics). Ingestion hands each message to `Admission` twice:

1. `budget(device_id, size, now)` before decoding: a message larger than `Limits.max_message_bytes` is refused
   ("oversized"), and each device has a token bucket of messages and one of bytes (`messages_per_s` and
   `bytes_per_s` sustained, `burst_messages` and `burst_bytes` at once). What exceeds them is dropped and
   counted ("over-budget"); the first drop of a device in a minute raises a `device-over-budget` alert. The
   defaults take a device catching up after an outage (its spool re-sends at most 50 reports a second) and
   refuse a flood.
2. `admit(message)` after decoding: identifiers must match the id grammar (bundle ids, group names, profiles,
   hostnames: `core.topics.check_segment`; output, input and error-kind names the name grammar below), lists
   and maps are capped, and free text (event details, last errors, provider notes) is cut to
   `Limits.max_text`. An identifier that breaks its grammar refuses the whole message ("invalid", with the
   reason); over-long text is cut, never refused. What is stored is the admitted copy.
   Numbers: the message types bound every number where it is parsed (finite, in a range that makes sense:
   `edgefleet.core.messages`, MAX_*; a report outside them is counted "out_of_range"). Here, what needs more than
   the message: its timestamp must lie within `Limits.max_future_s` ahead of and `Limits.max_age_s` behind the
   time it was received (a report dated 1e15 would otherwise stay a device's "latest" for ever, and one dated in
   1970 lands in the oldest bucket; a status is only held to the first bound: it is retained, and a last will
   carries the time its connection was made), and its CPU under 100 × the cores its status names. Such a report
   is refused ("out_of_range", `AdmissionError.reason`).

A refused message is acknowledged to the broker and never stored: a device that sends it again is refused
again. Its number is still accounted for in the device's `StoredUpTo` (it will never be stored), so the
device's spool moves on.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

from edgefleet.core.messages import DeviceStatus, Event, GenerationStats, Message, OutputScore, SlotStatus, Telemetry
from edgefleet.core.topics import check_segment

M = TypeVar("M", bound=Message)

# Output, input and drift names (`name[c]` for a channel), error kinds: what ONNX graphs name tensors with.
_NAME = re.compile(r"^[A-Za-z0-9_.:/\-\[\]]{1,128}$")
# A task metric's name (edgefleet.converter.metrics): the name grammar and '@' for a threshold (mask-iou@0.5).
_METRIC = re.compile(r"^[A-Za-z0-9_.:/\-\[\]@]{1,128}$")
CPU_SLACK = 1.05  # psutil's process CPU over a short interval can read a little above 100 × cores


class AdmissionError(ValueError):
    """A message that breaks the boundary's rules; the message names the field, `reason` is the counter's name
    ("invalid": an identifier or a list; "out_of_range": a number)."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 64 * 1024
    messages_per_s: float = 60.0
    burst_messages: int = 3000
    bytes_per_s: float = 512 * 1024
    burst_bytes: int = 16 * 1024 * 1024
    max_text: int = 2000
    max_items: int = 64  # groups, providers, golden scores, error kinds, an output's figures
    max_drift: int = 512  # drift scores per report (inputs and outputs, per channel)
    alert_every_s: float = 60.0
    max_future_s: float = 300.0  # a report dated further ahead of the time received is refused (clock skew)
    max_age_s: float = 7 * 86400.0  # ... and one dated further behind (a spool re-sends at most this old)


@dataclass
class _Bucket:
    messages: float
    bytes: float
    at: float


@dataclass
class Admission:
    limits: Limits = field(default_factory=Limits)
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _alerted: dict[str, float] = field(default_factory=dict)
    _cores: dict[str, int] = field(default_factory=dict)  # device -> the CPU count its last admitted status named

    def budget(self, device_id: str, size: int, now: float) -> str | None:
        """None when the message may be decoded; else why not ("oversized", "over-budget")."""
        lim = self.limits
        if size > lim.max_message_bytes:
            return "oversized"
        bucket = self._buckets.get(device_id)
        if bucket is None:
            bucket = self._buckets[device_id] = _Bucket(lim.burst_messages, lim.burst_bytes, now)
        elapsed = max(0.0, now - bucket.at)
        bucket.at = now
        bucket.messages = min(lim.burst_messages, bucket.messages + elapsed * lim.messages_per_s)
        bucket.bytes = min(lim.burst_bytes, bucket.bytes + elapsed * lim.bytes_per_s)
        if bucket.messages < 1 or bucket.bytes < size:
            return "over-budget"
        bucket.messages -= 1
        bucket.bytes -= size
        return None

    def alert_due(self, device_id: str, now: float) -> bool:
        """Whether a drop of this device should raise an alert now (the first in `alert_every_s`)."""
        if now - self._alerted.get(device_id, float("-inf")) < self.limits.alert_every_s:
            return False
        self._alerted[device_id] = now
        return True

    def admit(self, message: M, received_at: float | None = None) -> M:
        """The admitted copy of a decoded device message, or AdmissionError. `received_at`: when it arrived (its
        timestamp must lie near it; None skips that check)."""
        ts = getattr(message, "ts", None)
        if received_at is not None and isinstance(ts, float):
            lim = self.limits
            # A status may be old: it is retained, and the last will carries the time its connection was made.
            oldest = float("-inf") if isinstance(message, DeviceStatus) else received_at - lim.max_age_s
            if not oldest <= ts <= received_at + lim.max_future_s:
                raise AdmissionError(
                    f"timestamp {ts!r} is {ts - received_at:+.0f} s from the time received: at most "
                    f"{lim.max_future_s:g} s ahead and {lim.max_age_s:g} s behind are accepted",
                    "out_of_range",
                )
        if isinstance(message, Telemetry):
            return self._telemetry(message)  # type: ignore[return-value]
        if isinstance(message, Event):
            return self._event(message)  # type: ignore[return-value]
        if isinstance(message, DeviceStatus):
            return self._status(message)  # type: ignore[return-value]
        return message

    # --- per message kind
    def _status(self, s: DeviceStatus) -> DeviceStatus:
        lim = self.limits
        _segment("profile", s.profile)
        for kind, values in (("group", s.groups), ("profile", s.accepts_profiles), ("provider", s.providers)):
            _count(kind + "s", values, lim.max_items)
            for value in values:
                _segment(kind, value)
        _count("slots", s.slots, lim.max_items)
        names = [slot.slot for slot in s.slots]
        if len(set(names)) != len(names):
            raise AdmissionError(f"the status names a slot twice ({', '.join(sorted(names))})", "malformed")
        update: dict[str, Any] = {
            "agent_version": _text(s.agent_version, 64),
            "slots": [self._slot(slot) for slot in s.slots],
            "last_error": _text(s.last_error, lim.max_text),
            "desired_stale": _text(s.desired_stale, lim.max_text),
            "agent_update": _text(s.agent_update, lim.max_text),
        }
        if s.hardware is not None:
            _segment("hostname", s.hardware.hostname)
            self._cores[s.device_id] = s.hardware.cpu_count
            update["hardware"] = s.hardware.model_copy(
                update={"arch": _text(s.hardware.arch, 64), "os": _text(s.hardware.os, 128)}
            )
        return s.model_copy(update=update)

    def _slot(self, s: SlotStatus) -> SlotStatus:
        """One slot of a status, bounded as the status's own fields are."""
        lim = self.limits
        _segment("active bundle", s.active_bundle)
        _count("providers not chosen", s.providers_not_chosen, lim.max_items)
        update: dict[str, Any] = {
            "active_model": _text(s.active_model, 256),
            "provider_in_use": _text(s.provider_in_use, 128),
            "provider_summary": _text(s.provider_summary, lim.max_text),
            "providers_not_chosen": {_name("provider", k): _text(v, 500) for k, v in s.providers_not_chosen.items()},
            "last_error": _text(s.last_error, lim.max_text),
            "refused": _text(s.refused, lim.max_text),
        }
        if s.placement is not None:
            _count("providers not chosen", s.placement.not_chosen, lim.max_items)
            update["placement"] = s.placement.model_copy(
                update={
                    "provider": _text(s.placement.provider, 128) or "",
                    "summary": _text(s.placement.summary, lim.max_text) or "",
                    "not_chosen": {_name("provider", k): _text(v, 500) for k, v in s.placement.not_chosen.items()},
                }
            )
        return s.model_copy(update=update)

    def _telemetry(self, t: Telemetry) -> Telemetry:
        lim = self.limits
        cores = self._cores.get(t.device_id)
        if cores is not None and t.cpu_percent > CPU_SLACK * 100.0 * cores:
            raise AdmissionError(
                f"cpu_percent {t.cpu_percent:g} is over 100 × the {cores} cores the device's status names (with "
                f"{CPU_SLACK - 1:.0%} for sampling jitter)",
                "out_of_range",
            )
        _segment("bundle id", t.bundle_id)
        _count("error kinds", t.errors_by_kind, lim.max_items)
        for kind in t.errors_by_kind:
            _name("error kind", kind)
        _count("golden scores", t.golden_scores, lim.max_items)
        _scores(t.golden_scores, lim)
        _count("drift scores", t.drift, lim.max_drift)
        for score in t.drift:
            _name("drift name", score.name)
        update: dict[str, Any] = {"provider": _text(t.provider, 128)}
        if t.golden_task is not None:
            metric = _name("metric", t.golden_task.metric, _METRIC)
            update["golden_task"] = t.golden_task.model_copy(update={"metric": metric})
        if t.generation is not None:
            _generation(t.generation)
        if t.shadow is not None:
            _segment("shadow bundle id", t.shadow.bundle_id)
            _count("shadow outputs", t.shadow.per_output, lim.max_items)
            _scores(t.shadow.per_output, lim)
        return t.model_copy(update=update)

    def _event(self, e: Event) -> Event:
        _segment("bundle id", e.bundle_id)
        return e.model_copy(update={"detail": _text(e.detail, self.limits.max_text)})


def _segment(kind: str, value: str | None) -> None:
    if value is None:
        return
    try:
        check_segment(kind, value)
    except ValueError as err:
        raise AdmissionError(str(err)[:300]) from err


def _name(kind: str, value: str, grammar: re.Pattern[str] = _NAME) -> str:
    if not grammar.match(value):
        shown = value[:40].encode("unicode_escape").decode("ascii")
        also = ", '@'" if grammar is _METRIC else ""
        raise AdmissionError(
            f"invalid {kind} {shown!r}: use 1-128 letters, digits, '_', '.', ':', '/', '-', '[', ']'{also}"
        )
    return value


def _count(kind: str, values: object, most: int) -> None:
    if len(values) > most:  # type: ignore[arg-type]
        raise AdmissionError(f"{len(values)} {kind}: at most {most}")  # type: ignore[arg-type]


def _scores(scores: list[OutputScore], lim: Limits) -> None:
    for score in scores:
        _name("output name", score.output)
        _count(f"figures of output {score.output}", score.detail, lim.max_items)
        for key in score.detail:
            _name("figure", key)


MAX_FIGURE = 1e9  # no token figure (ms, tokens/s) a device reports is larger


def _generation(g: GenerationStats) -> None:
    """Token figures are numbers a chart and a guardrail read: finite, not negative, under MAX_FIGURE."""
    figures = {"tokens per second": g.tokens_per_s}
    for name, summary in (("ttft", g.ttft), ("tpot", g.tpot)):
        if summary is not None:
            figures |= {f"{name} p50": summary.p50_ms, f"{name} p95": summary.p95_ms, f"{name} p99": summary.p99_ms}
    for name, value in figures.items():
        if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_FIGURE):
            raise AdmissionError(
                f"generation {name} {value!r}: a finite figure in [0, {MAX_FIGURE:g}] is expected", "out_of_range"
            )


def _text(value: str | None, most: int) -> str | None:
    """Free text, cut to `most` characters (shown through `safe_text` wherever it is displayed)."""
    if value is None or len(value) <= most:
        return value
    return value[: most - 1] + "…"


__all__ = ["Admission", "AdmissionError", "Limits"]
