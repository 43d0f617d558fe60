"""What a device's figures on a new bundle are judged against: the same model's previous bundle on that device, or,
for another model, that model's own build.

- **The same model** (same name, same source graph; `BundleFacts.model_change` finds no change): the device's
  figures on the bundle it ran before the wave are the baseline (latency, golden, field accuracy). A lower precision
  build planned its own golden drop (each bundle scored against its own FP32 reference): it is allowed that drop up
  to one more `max_golden_drop`, never more, since the planned drop comes from the signed manifest's floor, which a
  build can loosen. A device that ran nothing is held to the bundle's own golden floor.
- **Another model** (another name, or a build from another source graph): nothing the previous model did on the
  device is its baseline. Its latency is its own measurement scaled to the device by the previous bundle's
  device-to-build ratio, widened by both builds' own spread (judge/latency.py, `scale_to_device`), its golden
  figures are held to its own build's floor (signed into its manifest, as on a device that ran nothing), and field
  accuracy waits for its own feedback. Every failure says it is another model and where its baseline came from.
"""

from __future__ import annotations

from edgefleet.control.rollout.judge.bundle_facts import BundleFacts
from edgefleet.control.rollout.judge.evidence import Finding, Metrics, Thresholds
from edgefleet.control.rollout.judge.latency import scale_to_device
from edgefleet.control.rollout.judge.wave import judge_device


def judge_on_basis(
    baseline: Metrics | None, observed: Metrics, facts: BundleFacts | None, previous: BundleFacts | None,
    profile: str | None, t: Thresholds, final: bool = True,
) -> list[Finding]:  # fmt: skip
    """The criteria for one device: `baseline` is its figures on the bundle it ran before (`previous`, the host's
    facts of it, None when the host has none), `facts` the new bundle's, `profile` the device's registry profile."""
    measured = facts.measured_latency(profile) if facts is not None else None
    change = facts.model_change(previous) if facts is not None else ""
    floor = facts.golden_min_agreement if facts is not None else None
    own_floor = f"bundle {facts.bundle_id}'s own build (the golden floor signed into its manifest)" if facts else ""
    if change:
        if floor is not None and t.min_golden_agreement is None:
            t = t.model_copy(update={"min_golden_agreement": floor})
        earlier = previous.measured_latency(profile) if previous is not None else None
        spreads = (
            facts.measured_spread(profile) if facts is not None else 1.0,  # a change is only found with both facts
            previous.measured_spread(profile) if previous is not None else 1.0,
        )
        scaled = scale_to_device(baseline, measured, earlier, t, spreads)
        findings = judge_device(None, observed, t, measured, final, scaled=scaled, floor_from=own_floor)
        return [f.model_copy(update={"detail": f"{change}: {f.detail}"}) if f.ok is False else f for f in findings]
    golden_known = baseline is not None and baseline.golden_agreement is not None
    floor_from = ""
    if floor is not None and not golden_known and t.min_golden_agreement is None:
        t = t.model_copy(update={"min_golden_agreement": floor})  # a first bundle: held to its own golden floor
        floor_from = own_floor
    planned = planned_golden_drop(facts, previous)
    if planned > 0 and t.max_golden_drop is not None and golden_known:
        # Both bundles are scored against their own FP32 reference: an INT8 bundle that agreed 0.984 at build
        # replacing an FP32 one (1.000) falls by 0.016 on a healthy device. The planned drop comes from the signed
        # manifest's golden floor, which a build can loosen (a misconfigured or hostile one): it is allowed up to
        # one more max_golden_drop, never more; a larger planned drop needs the operator's own max_golden_drop.
        t = t.model_copy(update={"max_golden_drop": t.max_golden_drop + min(planned, t.max_golden_drop)})
    return judge_device(baseline, observed, t, measured, final=final, floor_from=floor_from)


def planned_golden_drop(target: BundleFacts | None, previous: BundleFacts | None) -> float:
    """How much less the target's build agreed with its FP32 reference on its golden set than the previous
    bundle's build did with its own (0 when either is unknown or the target agrees as much or more)."""
    new = target.build_agreement() if target is not None else None
    old = previous.build_agreement() if previous is not None else None
    return max(0.0, old - new) if new is not None and old is not None else 0.0


__all__ = ["judge_on_basis", "planned_golden_drop"]
