"""What a test or benchmark sets up for simulated devices: how their inference behaves (`Behavior`, per bundle
`BundleBehavior`; quality figures in simulate_quality.py) and the signed bundles they install
(`synthetic_bundle`: random bytes, no converter needed)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from edgefleet.core.trust.signing import SigningKey

from support.simulate.quality import QualityBehavior


@dataclass(frozen=True)
class BundleBehavior:
    latency_factor: float = 1.0
    golden_agreement: float = 1.0
    error_rate: float = 0.0
    refuse: str | None = None
    quality: QualityBehavior = field(default_factory=QualityBehavior)


@dataclass(frozen=True)
class Neighbour:
    """Another slot a simulated device runs beside its default one (it never installs anything there): it reports
    the slot in its status (with its latency objective) and a telemetry report of the slot each window, whose p95
    depends on what the default slot runs (`p95_beside`: default slot's bundle id -> p95; else `p95_ms`)."""

    bundle_id: str
    objective_ms: float | None = None
    p95_ms: float = 10.0
    p95_beside: dict[str, float] = field(default_factory=dict)


@dataclass
class Behavior:
    """How simulated inference behaves; `bundles` overrides it per bundle id (a slow or inaccurate build);
    `neighbours`: slots the devices run beside the default one (slot name -> what it runs)."""

    latency_ms: float = 0.25
    requests_per_s: float = 20.0
    error_rate: float = 0.0
    bundles: dict[str, BundleBehavior] = field(default_factory=dict)
    probes_per_s: float = 0.0  # golden-set probes while there is no client traffic (the agent's prober)
    neighbours: dict[str, Neighbour] = field(default_factory=dict)


def synthetic_bundle(
    out_dir: Path,
    key: SigningKey,
    *,
    model_name: str = "sim-model",
    version: str = "1",
    profile: str = "generic-x86-64",
    size_bytes: int = 64 * 1024,
    seed: int = 0,
    accuracy_budget: float = 0.01,
    latency_ms: float = 0.25,
    golden: tuple[int, float] = (1, 1.0),  # the golden set's size and floor (the build's agreement less one input)
    peak_memory_mb: float | None = None,  # the converter's measured peak (Manifest.resources); None: not measured
) -> Path:
    """A signed bundle whose model file is `size_bytes` of random bytes: for simulated devices only (they
    check the transfer, not the model), so benchmarks and tests need no converter."""
    import numpy as np

    from edgefleet.core.bundle.archive import describe_files, pack_bundle
    from edgefleet.core.bundle.manifest import (
        AccuracyReport,
        GoldenSpec,
        LatencyReport,
        Manifest,
        Recipe,
        ResourceNeeds,
        TensorSpec,
    )

    work = out_dir / f"src-{model_name}-{version}-{profile}"
    (work / "model").mkdir(parents=True, exist_ok=True)
    model = work / "model" / "model.onnx"
    model.write_bytes(np.random.default_rng(seed).bytes(size_bytes))
    sources = {"model/model.onnx": model}
    manifest = Manifest(
        bundle_id=f"{model_name}-{version}-{profile}",
        model_name=model_name,
        model_version=version,
        profile=profile,
        format="onnx",
        model_path="model/model.onnx",
        recipe=Recipe(name="fp32", precision="fp32", runtime="onnxruntime"),
        providers=["CPUExecutionProvider"],
        opset={"": 17},
        inputs=[TensorSpec(name="input", dtype="float32", shape=[1, 4])],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=[1, 2])],
        files=describe_files(sources),
        accuracy=AccuracyReport(
            metric="top1", value=0.99, reference=0.99, budget=accuracy_budget, samples=100, passed=True
        ),
        golden=GoldenSpec(count=golden[0], max_abs_error=1e-3, min_agreement=golden[1]),
        latency=LatencyReport(  # what simulated inference takes by default (Behavior.latency_ms)
            median_ms=latency_ms,
            p90_ms=latency_ms * 1.4,
            runtime="onnxruntime",
            provider="CPUExecutionProvider",
            threads=1,
            machine="simulated",
        ),
        source_sha256=hashlib.sha256(model.read_bytes()).hexdigest(),
        resources=None
        if peak_memory_mb is None
        else ResourceNeeds(peak_memory_mb={"onnxruntime/CPUExecutionProvider": peak_memory_mb}, measured_on="sim"),
    )
    path = out_dir / f"{manifest.bundle_id}.bundle"
    pack_bundle(path, manifest, sources, key)
    return path
