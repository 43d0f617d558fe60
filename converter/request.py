"""What `edgefleet convert` is asked (ConvertRequest) and what it answers per profile (ProfileResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgefleet.converter.passes.custom_ops import Policy
from edgefleet.core.profiles import Profile
from edgefleet.core.trust.signing import SigningKey


@dataclass(frozen=True)
class ConvertRequest:
    model: Path
    profiles: list[Profile]
    calib: Path
    eval: Path
    out: Path
    key: SigningKey
    name: str
    version: str
    max_drop: float | None = None  # overrides every profile's budget when set
    threads: int = 1
    min_sqnr_db: float | None = None  # overrides every profile's SQNR floor when set
    pins: dict[str, str] = field(default_factory=dict)  # inputs declared constant: name → value (JSON number/list)
    fix_dims: dict[str, int] = field(default_factory=dict)  # symbolic dimension name → value
    input_shapes: dict[str, list[int]] = field(default_factory=dict)  # input name → fixed shape
    runtimes: tuple[str, ...] | None = None  # only these runtimes' targets (None = every target)
    cache_dir: Path | None = None  # content-addressed build cache; None = no cache
    report: bool = True  # write <name>-<version>.report.json/.html and plots into out
    custom_ops: Policy = "decompose"  # decompose known custom ops everywhere | host: keep them where loadable | keep
    torch_model: Path | None = None  # CoreML targets: the user's torch model (.pt TorchScript / .pt2 torch.export)
    metric: str | None = None  # a task metric (converter.metrics) or path.py:function; None = chosen from outputs
    min_score: float | None = None  # an absolute bar on the metric instead of a drop below FP32
    # The conversion's wall-time bound, from the start (converter.deadline): builds stop at it, the timing and the
    # bundle get the last 10 s; the first FP32 candidate is always built. None: no bound (the CLI's default: 60 s).
    time_budget_s: float | None = None
    prune: bool = True  # skip building, scoring and timing candidates that cannot win (False: every one, to study)
    # Language models (converter.generative; --calib and --eval are text files). None: the documented defaults
    # (converter/generative/bars.py).
    max_perplexity_ratio: float | None = None  # candidate perplexity ÷ FP32's on held-out text at most this (1.05)
    min_next_token_agreement: float | None = None  # teacher-forced share of FP32's next tokens kept (0.80)
    prompt_tokens: int | None = None  # TTFT is timed for a prompt this long (64)
    output_tokens: int | None = None  # TPOT is timed over generations this long (32)


@dataclass
class ProfileResult:
    profile: str
    bundle: str | None
    bundle_id: str | None
    recipe: str | None
    accuracy: float | None
    reference_accuracy: float
    metric: str
    latency_ms: float | None
    size_bytes: int | None
    candidates: list[dict[str, object]] = field(default_factory=list)
    error: str | None = None
    format: str | None = None
    runtime: str | None = None
    provider: str | None = None
    measured: bool = False
    notes: list[str] = field(default_factory=list)
    passes: list[dict[str, object]] = field(default_factory=list)
    worst_layers: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    farm: dict[str, object] | None = None  # `--measure-on`: the devices that measured the candidates, and when
    head_to_head: dict[str, object] | None = None  # the finalists re-timed together (converter.timing.head_to_head)
    roofline: dict[str, dict[str, object]] = field(default_factory=dict)  # per candidate (converter.roofline)
    limits: dict[str, object] | None = None  # this machine's measured limits the rooflines are set against
    golden: dict[str, object] | None = None  # the bundle's golden figures and the rollout's floor (GoldenHold)
    resources: dict[str, object] | None = None  # the bundle's measured peak memory and FLOPs (ResourceNeeds)
    # Under --time-budget: the budget, the seconds spent when this profile was done, and what the budget cut
    # (converter.deadline.Cut as dicts: what, how), in the order it was cut.
    time_budget: dict[str, object] | None = None


__all__ = ["ConvertRequest", "ProfileResult"]
