"""`edgefleet inspect MODEL_DIR` for a language model: what it is (family, parameters, layers, context, tokenizer)
and, per profile, the candidates a conversion would build and why any precision has none. Reads JSON and headers
only; nothing is built or run."""

from __future__ import annotations

from pathlib import Path

from edgefleet.converter.generative.candidates import HostView, plan_target
from edgefleet.converter.generative.source import load_decoder
from edgefleet.core.profiles import HostFacts, Profile

__all__ = ["inspect_decoder"]


def inspect_decoder(path: Path, profiles: list[Profile]) -> dict[str, object]:
    source = load_decoder(path)
    facts = HostFacts.probe(())
    host = HostView(frozenset(), cpu_bf16=bool(facts.cpu_flags & {"avx512_bf16", "amx_bf16"}))
    verdicts = []
    for profile in profiles:
        targets = []
        for target in profile.generation:
            plan = plan_target(target, source, host)
            targets.append({
                "runtime": target.runtime,
                "format": target.format,
                "candidates": {c.name: c.description for c in plan.candidates},
                "not_built": {s.name: s.reason for s in plan.skipped},
            })  # fmt: skip
        verdicts.append({"profile": profile.name, "targets": targets or "no generation runtime in this profile"})
    return {**source.describe(), "profiles": verdicts}
