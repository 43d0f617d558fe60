"""A profile's search, stage by stage: plan (the profile's targets and the declared recipes, in build order),
prepare (the shared FP32 graph pipeline per target), build (each recipe and its retries, judged by the gate),
time (interleaved rounds, then the finalists head to head), choose (the fastest inside the budget). Each stage
takes what the ones before it returned; the result is what the manifest and the report read."""

from __future__ import annotations

import logging

from edgefleet.converter import deadline
from edgefleet.converter.search.attempts import build_all
from edgefleet.converter.search.choose import choose
from edgefleet.converter.search.gate import Budget
from edgefleet.converter.search.plan import Recipe, plan, target_label
from edgefleet.converter.search.prepare import prepare
from edgefleet.converter.search.request import SearchRequest, Workspace
from edgefleet.converter.search.result import ProfileSearch, candidate_of
from edgefleet.converter.search.timing import final_round, time_candidates
from edgefleet.converter.search.types import Prepared
from edgefleet.core.profiles import HostFacts, Profile

log = logging.getLogger(__name__)
__all__ = ["search"]


def search(
    request: SearchRequest,
    ws: Workspace,
    profile: Profile,
    budget: Budget,
    facts: HostFacts,
    providers: frozenset[str],
    prune: bool = True,
) -> ProfileSearch:
    """`prune`: drop candidates this host's timing says cannot win (off when devices measure the candidates)."""
    threads = list(profile.threads) or [request.threads]
    notes: list[str] = list(request.warnings)
    planned = plan(request, profile, facts, providers)
    prepared: dict[tuple[int, str], Prepared] = {}
    sources = {(r.target.index, r.source) for r in planned.recipes}
    # Under --time-budget the graph of the first FP32 recipe is always prepared (a conversion has a float bundle);
    # another graph, only while time is left, and it stops at the deadline.
    first_fp32 = next(((r.target.index, r.source) for r in planned.recipes if r.precision == "fp32"), None)
    failed: set[tuple[int, str]] = set()
    for target in planned.targets:  # the plan's notes and the pipeline's, target by target
        notes.extend(target.notes)
        if target.skipped:
            continue
        label = target_label(target.target)
        for source in ("model", "as-quantized", "dequantized", "fused"):
            if (target.index, source) not in sources:
                continue
            opset, static = profile.opset, target.target.static_shapes
            key = (target.index, source)
            exempt = key == first_fp32 or (first_fp32 in failed and not prepared)
            if not exempt and ws.spent():
                notes.append(f"{label}: the {source} graph not prepared: the time budget is spent")
                deadline.cut(f"{label} ({source})", "not prepared: the time budget was spent; its recipes not tried")
                continue
            with deadline.until(None if exempt else ws.build_deadline, ws.budget_s or 0.0):
                done = prepare(request, ws, opset.min, opset.max, static, budget, target.decompose, source)
            if done.model is None:
                failed.add(key)
                notes.append(f"{label}: {done.error}")
                if "the time budget" in (done.error or ""):
                    deadline.cut(f"{label} ({source})", "stopped at the deadline: its recipes not tried")
                continue
            notes.extend(f"{label}: {n}" for n in done.notes if f"{label}: {n}" not in notes)
            prepared[(target.index, source)] = done
    recipes: list[tuple[Recipe, Prepared]] = [
        (r, prepared[(r.target.index, r.source)]) for r in planned.recipes if (r.target.index, r.source) in prepared
    ]
    builds = build_all(request, ws, profile, budget, recipes, threads[0], prune)
    notes.extend(builds.notes)
    timing = time_candidates(request, ws, profile.name, builds.attempts, threads, prune)
    candidates = [candidate_of(a, timing.latencies, timing.failed.get(a.built.spec.name)) for a in builds.attempts]
    choice = choose(
        candidates,
        reference=request.ref_value,
        max_drop=budget.allowed_drop(request.plan.name, request.ref_value),
        size_limit_bytes=int(profile.size_limit_mb * 1e6),
    )
    final = final_round(request, ws, profile.name, choice, timing)  # the best re-timed together decide
    errors = timing.failed | final.pruned
    return ProfileSearch(
        profile=profile,
        budget=budget,
        metric=request.plan.name,
        metric_description=request.plan.description,
        reference=request.ref_value,
        notes=notes + final.notes,
        attempts=builds.attempts,
        latencies=final.latencies,
        candidates=[candidate_of(a, final.latencies, errors.get(a.built.spec.name)) for a in builds.attempts],
        choice=final.choice,
        layer_reports=builds.layer_reports,
        threads=threads,
        by_threads=final.by_threads,
        prune=prune,
        stopped=timing.stopped,
        head_to_head=final.head_to_head,
    )
