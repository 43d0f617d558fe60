"""What the device serves now and what it says about itself: the model in force, the device state, the last error,
and the retained status built from them.

Written by the install worker alone (agent/install/worker.py: installs, commits, rollbacks, start-up restore before
the other threads run), read by every other part. A change of the served model calls `on_swap`, which the
supervisor wires to the hot swap (the local API, the request statistics, quality monitoring); a change of state
calls `on_state` (systemd's status line) and republishes the status.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from edgefleet import __version__
from edgefleet.agent.install.desired import DesiredState
from edgefleet.agent.runtime import LoadedModel, hardware, native_code, usable_providers
from edgefleet.agent.telemetry import Reporter
from edgefleet.core.messages import DeviceState, DeviceStatus


@dataclass(frozen=True)
class Identity:
    """Who this device is, as its status says: fixed for the life of the process."""

    device_id: str
    profile: str
    accepts_profiles: tuple[str, ...]
    groups: tuple[str, ...]
    profile_detection: tuple[str, ...] = ()  # why detection chose the profile (empty when --profile named it)


class ServingState:
    def __init__(
        self,
        identity: Identity,
        reporter: Reporter,
        desired: DesiredState,
        on_swap: Callable[[LoadedModel, LoadedModel | None], None],
        on_state: Callable[[DeviceState], object],
    ) -> None:
        self.identity, self._reporter, self._desired = identity, reporter, desired
        self._on_swap, self._on_state = on_swap, on_state
        self._lock = threading.Lock()  # one consistent (model, state, error) for a status built meanwhile
        self._model: LoadedModel | None = None
        self._state: DeviceState = "starting"
        self._last_error: str | None = None

    @property
    def model(self) -> LoadedModel | None:
        return self._model

    @property
    def state(self) -> DeviceState:
        return self._state

    @property
    def last_error(self) -> str | None:
        return self._last_error

    # --- changes (the install worker)
    def serve(self, model: LoadedModel) -> LoadedModel | None:
        """Serve `model` from now on (the hot swap); returns the model it replaced."""
        with self._lock:
            previous, self._model = self._model, model
        self._on_swap(model, previous)
        return previous

    def set_state(self, state: DeviceState) -> None:
        """A new device state; the status follows."""
        with self._lock:
            self._state = state
        self._on_state(state)
        self.publish_status()

    def set_error(self, error: str | None, *, publish: bool = True) -> None:
        """The last error the status reports (None: cleared)."""
        with self._lock:
            self._last_error = error
        if publish:
            self.publish_status()

    # --- the status (any thread)
    def status(self, *, online: bool = True, state: DeviceState | None = None) -> DeviceStatus:
        with self._lock:
            model, current, last_error = self._model, self._state, self._last_error
        identity = self.identity
        return DeviceStatus(
            device_id=identity.device_id,
            online=online,
            state=state or current,
            agent_version=__version__,
            profile=identity.profile,
            accepts_profiles=list(identity.accepts_profiles),
            profile_detection=list(identity.profile_detection),
            groups=list(identity.groups),
            hardware=hardware(),
            providers=usable_providers(model),
            active_bundle=model.bundle_id if model else None,
            active_model=f"{model.manifest.model_name}@{model.manifest.model_version}" if model else None,
            provider_in_use=model.provider if model else None,
            provider_summary=model.choice.summary if model else None,
            providers_not_chosen=dict(model.choice.reasons) if model else {},
            verified=bool(model and model.last_golden and model.last_golden.passed),
            last_error=last_error,
            desired_stale=self._desired.stale(),
            native_code=native_code.loads(),
        )

    def publish_status(
        self, *, online: bool = True, state: DeviceState | None = None, wait: float | None = None
    ) -> None:
        self._reporter.publish_status(self.status(online=online, state=state), wait=wait)


__all__ = ["Identity", "ServingState"]
