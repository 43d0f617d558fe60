"""What a conversion learns of each candidate (built, judged, timed), as the choice, the bundle and the report read
it."""

from __future__ import annotations

from dataclasses import dataclass

from edgefleet.converter.generative.builders import Artifact
from edgefleet.converter.generative.candidates import CandidateSpec
from edgefleet.converter.generative.judge import Scores
from edgefleet.converter.generative.timing import TokenTimes
from edgefleet.core.bundle.generation import BandwidthLimit

__all__ = ["CandidateRecord"]


@dataclass(frozen=True)
class CandidateRecord:
    spec: CandidateSpec
    artifact: Artifact
    scores: Scores | None = None  # None: not judged (its build or run failed: `error`)
    times: TokenTimes | None = None  # None: not timed here
    weights_bytes: int = 0  # read per output token
    limit: BandwidthLimit | None = None
    error: str | None = None  # the build or a run failed

    @property
    def name(self) -> str:
        return self.spec.name

    def as_dict(self, refused: str | None, chosen: bool) -> dict[str, object]:
        """One row of ProfileResult.candidates (JSON-ready)."""
        scores, times, limit = self.scores, self.times, self.limit
        return {
            "name": self.name,
            "runtime": self.spec.runtime,
            "provider": self.spec.provider,
            "precision": self.spec.precision,
            "description": self.spec.description,
            "runtime_config": dict(self.spec.runtime_config),
            "perplexity": scores.perplexity if scores else None,
            "perplexity_ratio": scores.perplexity_ratio if scores else None,
            "next_token_agreement": scores.agreement if scores else None,
            "accuracy": scores.agreement if scores else None,
            "ttft_ms": times.ttft_ms if times else None,
            "tpot_ms": times.tpot_ms if times else None,
            "tpot_p90_ms": times.tpot_p90_ms if times else None,
            "latency_ms": times.tpot_ms if times else None,
            "tokens_per_s": 1000.0 / times.tpot_ms if times else None,
            "size_bytes": self.artifact.size_bytes,
            "weights_bytes_per_token": self.weights_bytes or None,
            "limit_tokens_per_s": limit.limit_tokens_per_s if limit else None,
            "limit_pct": round(100 * limit.share, 1) if limit else None,
            "build_s": round(self.artifact.seconds, 2),
            "measured": times is not None,
            "chosen": chosen,
            "rejected": refused,
        }
