"""The slots a device runs, each with its own parts: one model per slot, made on first use.

A slot (edgefleet/core/topics.py) is the unit of desired state, install, golden check, commit or rollback, health,
drift, shadow and telemetry. `SlotParts` holds one slot's: its view of the state directory, what it serves
(`SlotServing`), its request statistics, its quality monitoring, its install worker and health monitor, each on
threads of its own, so that an install, a failed golden check or a rollback in one slot never touches another
slot's model (tests/integration/agent/test_slots.py). `Slots` makes a slot's parts when a desired document first
names it (or, at start-up, when the state directory holds its committed bundle), and routes requests to a slot.

Threads: a device's cores are shared by its slots. While `threads` (the agent's --threads) is 0, a device running
one slot lets the runtime decide as before; with n slots each slot's model gets cores // n intra-op threads (at
least 1), so two slots on a 2-core device never run more threads than cores. A session's thread count is fixed when
it loads, so when a slot arrives or is removed, every slot whose share changed reloads its model with the new count
(`Repartition`, a hot swap of the same bundle on the slot's own install thread: requests in flight finish on the old
session). The status says the share and why (`Placement`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from dataclasses import dataclass

from edgefleet.agent.api import InferenceTarget
from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.install import (
    DesiredState,
    DeviceServing,
    HealthMonitor,
    HealthPolicy,
    InstallContext,
    Installer,
    MemoryBudget,
    Reconcile,
    Repartition,
    SlotServing,
    Stop,
)
from edgefleet.agent.install.serving import Swap
from edgefleet.agent.quality import FieldAccuracy, Quality, QualityConfig
from edgefleet.agent.telemetry import Reporter, RequestStats
from edgefleet.agent.transfer import LinkPacer

log = logging.getLogger(__name__)


@dataclass
class SlotParts:
    """One slot's parts."""

    name: str
    serving: SlotServing
    stats: RequestStats
    quality: Quality
    installer: Installer
    health: HealthMonitor
    threads: list[threading.Thread] = dataclasses.field(default_factory=list)

    def target(self) -> InferenceTarget:
        return InferenceTarget(self.name, self.serving.model, self.stats, self.quality)


@dataclass(frozen=True)
class SlotSettings:
    """What every slot's parts are built with (the agent's configuration)."""

    threads: int
    quality: QualityConfig
    health: HealthPolicy
    retry_delay_s: float
    rollback_on_failure: bool


class Slots:
    def __init__(
        self,
        *,
        settings: SlotSettings,
        context: InstallContext,
        desired: DesiredState,
        device: DeviceServing,
        reporter: Reporter,
        link: LinkPacer,
        budget: MemoryBudget,
        field: FieldAccuracy,
        on_swap: Swap,
        generation_stats: RequestStats | None = None,
        cores: int | None = None,
    ) -> None:
        self.settings, self.context, self.desired, self.device = settings, context, desired, device
        self.reporter, self.link, self.budget, self.field, self._on_swap = reporter, link, budget, field, on_swap
        self.generation_stats = generation_stats  # the generations' (agent/api/generation accounts them)
        self.cores = cores or os.cpu_count() or 1
        self._lock = threading.RLock()
        self._slots: dict[str, SlotParts] = {}
        self._stop: threading.Event | None = None  # set once started: new slots start their threads at once

    # --- the slots
    def all(self) -> dict[str, SlotParts]:
        with self._lock:
            return dict(self._slots)

    def get(self, name: str) -> SlotParts | None:
        return self._slots.get(name)

    def ensure(self, name: str) -> SlotParts:
        """Slot `name`'s parts (made, and started if the agent runs, on first use)."""
        with self._lock:
            parts = self._slots.get(name)
            if parts is not None:
                return parts
            parts = self._slots[name] = self._build(name)
            if self._stop is not None:
                self._start(parts, self._stop)
            return parts

    def _build(self, name: str) -> SlotParts:
        settings = self.settings
        threads, why = self._share(name)
        serving = self.device.add(name, self._on_swap)
        serving.threads, serving.placement_why = threads, why
        stats = RequestStats()
        quality = Quality(settings.quality, stats, lambda: serving.model, self.field, self.generation_stats)
        context = dataclasses.replace(
            self.context,
            store=self.context.store.for_slot(name),
            runtime=dataclasses.replace(self.context.runtime, threads=threads),
        )
        reporter = self.reporter.for_slot(name)
        installer = Installer(
            context=context, desired=self.desired, serving=serving, reporter=reporter, quality=quality, link=self.link,
            retry_delay_s=settings.retry_delay_s, rollback_on_failure=settings.rollback_on_failure, budget=self.budget,
        )  # fmt: skip
        health = HealthMonitor(serving, stats, reporter, installer.put, settings.health, self.generation_stats)
        return SlotParts(name, serving, stats, quality, installer, health)

    def _share(self, name: str) -> tuple[int, str]:
        """The intra-op threads slot `name`'s model gets, and why."""
        if self.settings.threads:
            return self.settings.threads, f"{self.settings.threads} threads (--threads)"
        named = {name, *self._slots, *self.desired.slots(), *self.context.store.slots()}
        live = [s for s in named if not ((d := self.desired.effective(s)) is not None and d.remove)]
        if len(live) <= 1:
            return 0, ""
        share = max(1, self.cores // len(live))
        return share, f"{share} of {self.cores} cores: {len(live)} slots share them"

    # --- lifecycle
    def restore(self) -> None:
        """At start-up, before the threads run: every slot with a committed bundle serves it again."""
        for name in sorted({*self.context.store.slots(), *self.desired.slots()}):
            self.ensure(name).installer.restore()
        self.device.set_started()

    def start(self, stop: threading.Event) -> None:
        with self._lock:
            self._stop = stop
            for parts in self._slots.values():
                self._start(parts, stop)

    def _start(self, parts: SlotParts, stop: threading.Event) -> None:
        parts.threads = [
            threading.Thread(target=parts.installer.run, name=f"install-{parts.name}", daemon=True),
            threading.Thread(target=parts.health.run, args=(stop,), name=f"health-{parts.name}", daemon=True),
        ]
        for thread in parts.threads:
            thread.start()
        parts.quality.start()

    def threads(self) -> list[threading.Thread]:
        return [t for parts in self.all().values() for t in parts.threads]

    def stop(self) -> None:
        for parts in self.all().values():
            parts.installer.put(Stop())
            parts.quality.stop()

    def reconcile(self) -> None:
        """Every slot brings itself to its desired state (a new document, a reconnect, memory freed)."""
        for name in self.desired.slots():
            self.ensure(name)
        self.repartition()
        for parts in self.all().values():
            parts.installer.put(Reconcile())

    def repartition(self) -> None:
        """Each slot's share of the cores again (a slot arrived or was removed): a slot whose share changed loads
        with the new count from now on and reloads what it serves, on its own install thread (`Repartition`)."""
        for name, parts in self.all().items():
            threads, why = self._share(name)
            if (threads, why) != (parts.installer.context.runtime.threads, parts.serving.placement_why):
                parts.installer.put(Repartition(threads, why))

    # --- routing requests
    def route(self, slot: str | None) -> InferenceTarget:
        """The slot a request names (its name or its model's), or the only one; RequestError otherwise."""
        slots = {n: p for n, p in self.all().items() if p.serving.model is not None or n == slot}
        if slot is None:
            if len(slots) == 1:
                return next(iter(slots.values())).target()
            names = ", ".join(sorted(slots)) or "none"
            if not slots:
                raise RequestError(404, "not-found", "no model installed")
            raise RequestError(404, "not-found", f"this device serves several slots ({names}): name one (slot)")
        parts = slots.get(slot) or next(
            (p for p in slots.values() if p.serving.model is not None and p.serving.model.manifest.model_name == slot),
            None,
        )
        if parts is None:
            names = ", ".join(sorted(slots)) or "none"
            raise RequestError(404, "not-found", f"no slot {slot!r} on this device (slots: {names})")
        return parts.target()

    def repository(self) -> list[tuple[str, str | None, str, str]]:
        """(slot, model name, state, reason) of the slots that serve nothing now (the repository index)."""
        found = []
        for name, parts in sorted(self.all().items()):
            serving = parts.serving
            if serving.model is not None:
                continue
            desired = self.desired.effective(name)
            if desired is not None and desired.remove:
                continue
            model = desired.model_name if desired is not None else None
            if serving.refused:
                found.append((name, model, "UNAVAILABLE", serving.refused))
            elif serving.state in ("downloading", "installing"):
                doing = f"{serving.state} {desired.bundle_id if desired else ''}".strip()
                found.append((name, model, "LOADING", doing))
            elif serving.last_error:
                found.append((name, model, "UNAVAILABLE", serving.last_error))
        return found


__all__ = ["SlotParts", "SlotSettings", "Slots"]
