"""What the device serves now and what it says about itself: each slot's model, state, last error and refusal, the
device's own state and error, and the retained status built from them.

A device runs one model per slot (edgefleet/core/topics.py). `SlotServing` is one slot: written by that slot's
install worker alone (agent/install/worker.py: installs, commits, rollbacks, removal, start-up restore), read by every
other part. A change of its model calls `on_swap(slot, model, previous)`, which the supervisor wires to the hot swap
(the local API, the slot's request statistics, its quality monitoring). `DeviceServing` holds the slots and builds
the device's status: `state` is serving when any slot serves, else downloading or installing while a slot does,
else idle; a change of it calls `on_state` (systemd's status line). Every change republishes the status.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from edgefleet import __version__
from edgefleet.agent.install.desired import DesiredState
from edgefleet.agent.runtime import LoadedModel, hardware, native_code, usable_providers
from edgefleet.agent.telemetry import Reporter
from edgefleet.core.messages import DeviceState, DeviceStatus, Placement, SlotStatus

Swap = Callable[[str, LoadedModel | None, LoadedModel | None], None]  # (slot, new model or None, previous)


@dataclass(frozen=True)
class Identity:
    """Who this device is, as its status says: fixed for the life of the process."""

    device_id: str
    profile: str
    accepts_profiles: tuple[str, ...]
    groups: tuple[str, ...]
    profile_detection: tuple[str, ...] = ()  # why detection chose the profile (empty when --profile named it)


class SlotServing:
    """One slot: its model in force, state, last error and refusal (the slot's install worker writes them)."""

    def __init__(self, slot: str, device: DeviceServing, on_swap: Swap) -> None:
        self.slot, self.device, self._on_swap = slot, device, on_swap
        self._lock = threading.Lock()
        self._model: LoadedModel | None = None
        self._state: DeviceState = "starting"
        self._last_error: str | None = None
        self._refused: str | None = None
        self.memory_mb: float | None = None  # measured when the model loaded (agent/install/admission.py)
        self.threads = 0  # the intra-op threads its model was given (0: the runtime's)
        self.placement_why = ""

    @property
    def identity(self) -> Identity:
        return self.device.identity

    @property
    def model(self) -> LoadedModel | None:
        return self._model

    @property
    def state(self) -> DeviceState:
        return self._state

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def refused(self) -> str | None:
        return self._refused

    # --- changes (the slot's install worker)
    def serve(self, model: LoadedModel) -> LoadedModel | None:
        """Serve `model` in this slot from now on (the hot swap); returns the model it replaced."""
        with self._lock:
            previous, self._model = self._model, model
        self._on_swap(self.slot, model, previous)
        return previous

    def unload(self) -> LoadedModel | None:
        """Serve nothing in this slot (a signed removal); the model it served drains, then closes."""
        with self._lock:
            previous, self._model = self._model, None
            self.memory_mb = None
        if previous is not None:
            self._on_swap(self.slot, None, previous)
        return previous

    def set_state(self, state: DeviceState) -> None:
        """A new slot state; the device's state and status follow."""
        with self._lock:
            self._state = state
        self.device.slot_changed()

    def set_error(self, error: str | None, *, publish: bool = True) -> None:
        """The slot's last error (None: cleared)."""
        with self._lock:
            self._last_error = error
        if publish:
            self.publish_status()

    def set_refused(self, reason: str | None, *, publish: bool = True) -> None:
        """Why the slot's desired bundle is not run (over the memory budget); None: not refused."""
        with self._lock:
            self._refused = reason
        if publish:
            self.publish_status()

    def publish_status(
        self, *, online: bool = True, state: DeviceState | None = None, wait: float | None = None
    ) -> None:
        self.device.publish_status(online=online, state=state, wait=wait)

    # --- the status (any thread)
    def status(self) -> SlotStatus:
        with self._lock:
            model, state, error, refused = self._model, self._state, self._last_error, self._refused
            memory = self.memory_mb
        desired = self.device.desired.effective(self.slot)
        placement = None
        if model is not None:
            why = model.choice.summary + (f"; {self.placement_why}" if self.placement_why else "")
            placement = Placement(
                provider=model.provider, threads=self.threads, summary=why, not_chosen=dict(model.choice.reasons)
            )
        return SlotStatus(
            slot=self.slot,
            state=state,
            active_bundle=model.bundle_id if model else None,
            active_model=f"{model.manifest.model_name}@{model.manifest.model_version}" if model else None,
            provider_in_use=model.provider if model else None,
            provider_summary=model.choice.summary if model else None,
            providers_not_chosen=dict(model.choice.reasons) if model else {},
            verified=bool(model and model.last_golden and model.last_golden.passed),
            last_error=error,
            slot_class=desired.slot_class if desired else "interactive",
            latency_objective_ms=desired.latency_objective_ms if desired else None,
            memory_mb=round(memory, 1) if memory is not None and model is not None else None,
            placement=placement,
            refused=refused,
        )


class DeviceServing:
    """The device: its slots (by name), its own state and error, and the retained status of them all."""

    def __init__(
        self,
        identity: Identity,
        reporter: Reporter,
        desired: DesiredState,
        on_state: Callable[[DeviceState], object],
        memory_free_mb: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.identity, self._reporter, self.desired = identity, reporter, desired
        self._on_state, self._memory_free_mb = on_state, memory_free_mb
        self._lock = threading.Lock()
        self._slots: dict[str, SlotServing] = {}
        self._state: DeviceState = "starting"
        self._last_error: str | None = None
        self.agent_update: Callable[[], str | None] = lambda: None  # the agent's own update (agent/release/)

    def add(self, slot: str, on_swap: Swap) -> SlotServing:
        """The slot named `slot` (made on first use)."""
        with self._lock:
            found = self._slots.get(slot)
            if found is None:
                found = self._slots[slot] = SlotServing(slot, self, on_swap)
            return found

    def drop(self, slot: str) -> None:
        """A removed slot leaves the status."""
        with self._lock:
            self._slots.pop(slot, None)
        self.slot_changed()

    def slots(self) -> dict[str, SlotServing]:
        with self._lock:
            return dict(self._slots)

    def models(self) -> dict[str, LoadedModel]:
        """slot -> the model it serves (serving slots only)."""
        return {name: s.model for name, s in self.slots().items() if s.model is not None}

    @property
    def state(self) -> DeviceState:
        return self._state

    @property
    def last_error(self) -> str | None:
        return self._last_error

    def slot_changed(self) -> None:
        """A slot's state changed: the device's follows (`on_state` when it changes), and the status."""
        states = {s.state for s in self.slots().values()}
        if "serving" in states:
            state: DeviceState = "serving"
        elif "downloading" in states or "installing" in states:
            state = "installing" if "installing" in states else "downloading"
        elif states - {"starting"} or self._state != "starting":
            state = "idle"
        else:
            state = "starting"
        with self._lock:
            changed, self._state = state != self._state, state
        if changed:
            self._on_state(state)
        self.publish_status()

    def set_started(self) -> None:
        """Start-up restore is over: a device with no slot serving is idle."""
        with self._lock:
            if self._state == "starting":
                self._state = "idle"
        self.slot_changed()

    def set_error(self, error: str | None, *, publish: bool = True) -> None:
        """The device's own last error (a slot's is on the slot)."""
        with self._lock:
            self._last_error = error
        if publish:
            self.publish_status()

    def status(self, *, online: bool = True, state: DeviceState | None = None) -> DeviceStatus:
        identity, slots = self.identity, self.slots()
        models = [s.model for s in slots.values() if s.model is not None]
        return DeviceStatus(
            device_id=identity.device_id,
            online=online,
            state=state or self._state,
            agent_version=__version__,
            profile=identity.profile,
            accepts_profiles=list(identity.accepts_profiles),
            profile_detection=list(identity.profile_detection),
            groups=list(identity.groups),
            hardware=hardware(),
            providers=usable_providers(models[0] if models else None),
            slots=[slots[name].status() for name in sorted(slots) if not self._removed(slots[name])],
            last_error=self._last_error,
            memory_free_mb=self._memory_free_mb(),
            desired_stale=self.desired.stale_any(),
            native_code=native_code.loads(),
            agent_update=self.agent_update(),
        )

    def _removed(self, slot: SlotServing) -> bool:
        """A slot removed by a signed decision, serving nothing: it is no longer the device's."""
        desired = self.desired.effective(slot.slot)
        return slot.model is None and desired is not None and desired.remove

    def publish_status(
        self, *, online: bool = True, state: DeviceState | None = None, wait: float | None = None
    ) -> None:
        self._reporter.publish_status(self.status(online=online, state=state), wait=wait)


__all__ = ["DeviceServing", "Identity", "SlotServing", "Swap"]
