"""Model-quality monitoring on the device, wired to serving in one place: field accuracy on every path,
drift over a sliding window, a shadow bundle and probe traffic, and what of it goes into telemetry.

The daemon calls: `bind` when the served model changes, `served_mqtt` after an MQTT answer (the HTTP service
calls `field.remember` itself), `feedback` for an MQTT feedback message, `reconcile_shadow` on the install
worker, and `telemetry_fields` when it reports.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from edgefleet.agent.quality.drift import DriftConfig, DriftMonitor, load_reference
from edgefleet.agent.quality.feedback import FeedbackError, FieldAccuracy
from edgefleet.agent.quality.probe import ProbeConfig, Prober
from edgefleet.agent.quality.shadow import ShadowConfig, ShadowRunner
from edgefleet.agent.runtime import LoadedModel
from edgefleet.agent.telemetry import RequestStats
from edgefleet.agent.transfer import TransferError
from edgefleet.core.errors import BrokerError, EdgefleetError
from edgefleet.core.messages import Desired, InferFeedback, InferRequest, decode
from edgefleet.core.quality.golden import checks_for

log = logging.getLogger(__name__)


class QualityConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    drift_window: int = Field(default=512, ge=16, description="live requests in the drift window")
    drift_min_samples: int = Field(default=128, ge=1, description="requests before drift is reported")
    drift_moderate: float = Field(default=0.1, gt=0, description="PSI from which drift is moderate")
    drift_threshold: float = Field(default=0.25, gt=0, description="PSI above which the band is drift")
    drift_cpu_budget: float = Field(default=0.02, gt=0, le=1, description="share of a core drift binning may use")
    drift_queue: int = Field(default=32, ge=1, description="requests waiting to be binned; beyond it they are skipped")
    shadow_share: float = Field(default=0.1, ge=0, le=1, description="share of live requests mirrored to a shadow")
    shadow_cpu_budget: float = Field(default=0.25, gt=0, le=8, description="cores the shadow may use on average")
    probe_rate: float = Field(default=2.0, ge=0, description="probe requests per second at most while quiet (0: off)")
    probe_min_live: int = Field(default=10, ge=1, description="live requests per probe_idle_s below which it probes")
    probe_idle_s: float = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _bands(self) -> QualityConfig:
        if self.drift_moderate >= self.drift_threshold:
            raise ValueError(f"drift bands: moderate {self.drift_moderate} must be below {self.drift_threshold}")
        if self.drift_min_samples > self.drift_window:
            raise ValueError("drift_min_samples cannot exceed drift_window")
        return self

    def drift(self) -> DriftConfig:
        return DriftConfig(
            window=self.drift_window, min_samples=self.drift_min_samples,
            bands=(self.drift_moderate, self.drift_threshold), cpu_budget=self.drift_cpu_budget,
            queue=self.drift_queue, batch=min(16, self.drift_queue),
        )  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model quality (drift, shadow, probes)")
    group.add_argument("--drift-window", type=int, default=512, help="live requests in the drift window")
    group.add_argument("--drift-min-samples", type=int, default=128, help="requests before drift is reported")
    group.add_argument("--drift-bands", default="0.1,0.25", help="PSI bands: MODERATE,DRIFT")
    group.add_argument("--drift-cpu", type=float, default=0.02, help="share of a core drift binning may use")
    group.add_argument("--drift-queue", type=int, default=32, help="requests waiting to be binned (more: skipped)")
    group.add_argument("--shadow-share", type=float, default=0.1, help="share of requests mirrored to a shadow")
    group.add_argument("--shadow-cpu", type=float, default=0.25, help="cores a shadow may use on average")
    group.add_argument("--probe-rate", type=float, default=2.0, help="probe requests/s while quiet (0: off)")
    group.add_argument("--probe-min-live", type=int, default=10, help="live requests per 10 s that count as busy")


def config_from(args: argparse.Namespace) -> QualityConfig:
    moderate, _, drift = str(args.drift_bands).partition(",")
    return QualityConfig(
        drift_window=args.drift_window, drift_min_samples=args.drift_min_samples,
        drift_moderate=float(moderate), drift_threshold=float(drift or 0.25), drift_cpu_budget=args.drift_cpu,
        drift_queue=args.drift_queue, shadow_share=args.shadow_share,
        shadow_cpu_budget=args.shadow_cpu, probe_rate=args.probe_rate, probe_min_live=args.probe_min_live,
    )  # fmt: skip


@dataclass(frozen=True)
class ShadowProblem:
    bundle_id: str
    detail: str
    transient: bool


class Quality:
    def __init__(
        self,
        config: QualityConfig,
        stats: RequestStats,
        model: Callable[[], LoadedModel | None],
        field: FieldAccuracy | None = None,
        generation_stats: RequestStats | None = None,
    ) -> None:
        """One slot's quality: `model()` is what the slot serves, `stats` its request statistics. `field`: the
        field-accuracy record the device's slots share (keyed by model name); each slot observes its own model's
        requests in it. `generation_stats`: where a generative model's figures are kept (the generations' own, which
        its telemetry and health read); its probes go there too."""
        self.config, self._stats, self._model = config, stats, model
        self._generation_stats = generation_stats if generation_stats is not stats else None
        self.field = field or FieldAccuracy()
        self.field.observe(self._observed)
        others = self.field.class_output
        self.field.class_output = lambda name: self._class_output(name) or others(name)
        self.drift: DriftMonitor | None = None
        self._drift_bundle: str | None = None
        self.shadow: ShadowRunner | None = None
        self._shadow_model: LoadedModel | None = None
        self._refused_shadows: set[str] = set()
        probing = ProbeConfig(config.probe_rate, config.probe_min_live, config.probe_idle_s)
        self.prober = Prober(model, stats, probing, generation_stats=generation_stats)

    def start(self) -> None:
        self.prober.start()

    def stop(self) -> None:
        self.prober.stop()
        if self.drift is not None:
            self.drift.close()
        self._stop_shadow()

    # --- the served model
    def bind(self, model: LoadedModel | None) -> None:
        """A new served model: a fresh drift window against its bundle's reference statistics."""
        old, self.drift = self.drift, None
        if old is not None:
            old.close()
        self._drift_bundle = None
        if model is None:
            return
        if self.shadow is not None and model.generative is None:
            self.shadow.rebase({c.output: c for c in checks_for(model.golden, model.manifest.golden)})
        reference = load_reference(model.bundle_dir, model.manifest.drift_reference)
        if reference is not None:
            self.drift = DriftMonitor(reference, self.config.drift())
            self._drift_bundle = model.bundle_id

    def _class_output(self, model_name: str) -> str | None:
        model = self._model()
        if model is None or model.manifest.model_name != model_name:
            return None
        for check in model.manifest.golden.outputs:
            if check.rule in ("class-agreement", "position-agreement"):
                return check.output
        return None

    def _observed(
        self, name: str, bundle_id: str | None, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]
    ) -> None:
        model = self._model()
        if model is None or model.manifest.model_name != name:
            return  # another slot's request
        drift = self.drift
        if drift is not None and bundle_id == self._drift_bundle:
            drift.observe(inputs, outputs)
        shadow = self.shadow
        if shadow is not None:
            shadow.offer(inputs, outputs)

    # --- MQTT request/response
    def served_mqtt(
        self, model: LoadedModel, request: InferRequest, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
    ) -> None:
        self.field.remember(
            model.manifest.model_name, outputs, bundle_id=model.bundle_id, inputs=inputs,
            request_id=f"{request.client_id}/{request.request_id}",
        )  # fmt: skip

    def feedback(self, payload: bytes) -> bool:
        """An InferFeedback message; MessageError or FeedbackError when it cannot be scored."""
        message = decode(InferFeedback, payload)
        return self.field.feedback(None, f"{message.client_id}/{message.request_id}", message.labels)

    # --- shadow
    def reconcile_shadow(
        self, desired: Desired | None, served: LoadedModel | None, install: Callable[[str], LoadedModel]
    ) -> ShadowProblem | None:
        """Run the shadow the desired state names (installed through `install`, never committed), or none."""
        wanted = desired.shadow_bundle_id if desired is not None else None
        if served is None or wanted == served.bundle_id or wanted in self._refused_shadows:
            wanted = None
        current = self._shadow_model.bundle_id if self._shadow_model is not None else None
        if wanted == current:
            return None
        self._stop_shadow()
        if wanted is None or served is None:
            return None
        if served.generative is not None:
            self._refused_shadows.add(wanted)
            return ShadowProblem(wanted, "shadow bundles are not run beside a generative model", transient=False)
        try:
            model = install(wanted)
        except (TransferError, BrokerError) as err:
            return ShadowProblem(wanted, f"shadow bundle not installed yet: {err}", transient=True)
        except EdgefleetError as err:
            self._refused_shadows.add(wanted)
            return ShadowProblem(wanted, f"shadow bundle refused: {err}", transient=False)
        checks = {c.output: c for c in checks_for(served.golden, served.manifest.golden)}
        self._shadow_model = model
        self.shadow = ShadowRunner(
            wanted, model.run, checks, ShadowConfig(self.config.shadow_share, self.config.shadow_cpu_budget)
        )
        log.info(
            "shadow %s runs beside %s on %.0f%% of requests", wanted, served.bundle_id, 100 * self.config.shadow_share
        )
        return None

    def _stop_shadow(self) -> None:
        shadow, model = self.shadow, self._shadow_model
        self.shadow, self._shadow_model = None, None
        if shadow is not None:
            shadow.close()
        if model is not None:
            model.close()

    # --- telemetry
    def _generation_probes(self, model: LoadedModel | None) -> int:
        """A generative model's probes are counted with the generations (`generation_stats`), taken by its slot."""
        if model is None or model.generative is None or self._generation_stats is None:
            return 0
        return self._generation_stats.take_probes()

    def telemetry_fields(self, model: LoadedModel | None) -> dict[str, object]:
        golden = model.last_golden if model is not None else None
        field = self.field.score(bundle_id=model.bundle_id) if model is not None else self.field.score()
        return {
            "golden_scores": list(golden.scores) if golden is not None else [],
            "golden_task": golden.task if golden is not None else None,
            "drift": self.drift.scores() if self.drift is not None else [],
            "shadow": self.shadow.report() if self.shadow is not None else None,
            "probe_requests": self._stats.take_probes() + self._generation_probes(model),
            "field_accuracy": field.accuracy,
            "field_samples": field.samples,
        }


__all__ = ["FeedbackError", "Quality", "QualityConfig", "ShadowProblem", "add_arguments", "config_from"]
