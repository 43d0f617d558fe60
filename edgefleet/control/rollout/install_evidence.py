"""What the host holds about one device's install of a rollout's bundle, read from the store for the evidence
criterion (judge/plausibility.py): the bundle's facts from the publish history, when the host deployed it and when
the device's "committed" arrived (the host's clock), the device's link counters around the install, and the
bytes the bundle needs given the bundles the store records it committing before (the bundle itself among them when
a rollout of it is retried after a rollback: the device keeps its previous bundles) and the published bundle it
said it ran when the wave began.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from edgefleet.control.rollout.judge.bundle_facts import BundleFacts
from edgefleet.control.rollout.judge.plausibility import GoldenReport, InstallEvidence, LinkSample
from edgefleet.control.rollout.plan import DeviceProgress
from edgefleet.control.store import QualityPoint, Store, TelemetryPoint

LINK_LOOKBACK_S = 3600.0  # the last report before a deployment is looked for this far back


class EvidenceReader:
    """Reads evidence for the engine; bundle facts are read once per bundle (they never change)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._facts: dict[str, BundleFacts | None] = {}

    def facts(self, bundle_id: str | None) -> BundleFacts | None:
        if bundle_id is None:
            return None
        if bundle_id not in self._facts:
            text = self.store.bundle_facts(bundle_id)
            try:
                self._facts[bundle_id] = BundleFacts.model_validate_json(text) if text else None
            except ValidationError:  # written by another version: as if there were none
                self._facts[bundle_id] = None
        return self._facts[bundle_id]

    def install(self, progress: DeviceProgress) -> InstallEvidence:
        device_id, target = progress.device_id, progress.target_bundle
        deployed = progress.deployed_at or 0.0
        committed_at = None
        held: list[BundleFacts] = []
        for bundle_id, received_at in self.store.commits(device_id):
            if bundle_id == target and received_at >= deployed - 1.0:
                committed_at = received_at if committed_at is None else committed_at
            elif received_at < deployed:  # committed before this wave: the target too, when a rollout is retried
                facts = self.facts(bundle_id)
                if facts is not None:
                    held.append(facts)
        reported = progress.reported_bundle
        if reported is not None and reported != target and all(h.bundle_id != reported for h in held):
            # What it said it ran before the wave, when the store published that bundle: a device that committed it
            # before the store kept its events (an agent older than the control plane) holds its chunks. This
            # claim only lowers the bound to the delta from a bundle the store really published.
            facts = self.facts(reported)
            if facts is not None:
                held.append(facts)
        samples = self.store.link_samples(device_id, deployed - LINK_LOOKBACK_S)
        before = [s for s in samples if s.received_at < deployed]
        after = [s for s in samples if committed_at is not None and s.received_at >= committed_at]
        facts = self.facts(target)
        return InstallEvidence(
            deployed_at=deployed,
            committed_at=committed_at,
            link_before=LinkSample(before[-1].bulk_bytes, before[-1].clock_s, before[-1].received_at)
            if before
            else None,
            # the latest: a report sent during the download may be stored after the commit (ingestion batches);
            # the counters only grow, so the latest shows at least what the install fetched
            link_after=LinkSample(after[-1].bulk_bytes, after[-1].clock_s, after[-1].received_at) if after else None,
            needed_bytes=facts.needed_bytes(held) if facts is not None else 0,
            already_ran=progress.already_ran,
        )


def golden_reports(points: Sequence[TelemetryPoint], quality: Sequence[QualityPoint]) -> list[GoldenReport]:
    """Each report's golden figures (per-output scores with the legacy lowest agreement), oldest first."""
    scores = {(q.seq, q.ts): q.golden for q in quality}
    return [
        GoldenReport(scores.get((p.seq, p.ts), ()), p.golden_agreement)
        for p in sorted(points, key=lambda p: p.ts)
        if p.golden_agreement is not None or scores.get((p.seq, p.ts))
    ]


__all__ = ["EvidenceReader", "golden_reports"]
