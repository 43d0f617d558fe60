"""Starting the measuring worker while a bundle is still downloading, when its selection will need one.

A selection needs a worker when no decision is cached for the bundle on this device and more than one of its
providers can load its format (selection.py). `prestart` answers that from the signed manifest alone, before the
files are there, and starts the worker with those providers' runtimes imported (selection_process.py), so that
the bundle's first answer does not wait for the worker's start. Nothing here loads a model or imports a runtime
into the agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from edgefleet.agent.runtime import backends
from edgefleet.agent.runtime.backends import Availability
from edgefleet.agent.runtime.selection import process as selection_process
from edgefleet.agent.runtime.selection.cache import DecisionCache, decision_key
from edgefleet.agent.runtime.selection.policy import Policy
from edgefleet.core.bundle.manifest import Manifest


def misfits(providers: Sequence[str], manifest: Manifest) -> dict[str, Availability]:
    """The providers whose runtime can never load this bundle (its format, its custom operators), with why:
    decided from the backends' declarations, without probing a runtime."""
    custom = tuple(op.key for op in manifest.custom_ops)
    found = {p: backends.misfit(p, manifest.format, custom_ops=custom) for p in providers}
    return {p: why for p, why in found.items() if why is not None}


def worker_candidates(manifest: Manifest, threads: int, policy: Policy, cache_dir: Path | None) -> list[str]:
    """The providers a cold selection of `manifest` would hand to a measuring worker; empty when it would not
    start one (a cached decision, measuring in the agent's process, fewer than two candidates)."""
    if not policy.measure_in_worker:
        return []
    key, _ = decision_key(manifest, threads, policy)
    entry = DecisionCache(cache_dir).get(key) if cache_dir is not None else {}
    if isinstance(entry.get("provider"), str):
        return []  # a cached decision loads the winner alone
    poisoned = entry.get("poisoned", {})
    allowed = [p for p in dict.fromkeys(manifest.providers) if p not in policy.exclude and p not in poisoned]
    unfit = misfits(allowed, manifest)
    fresh = [p for p in allowed if p not in unfit]
    return fresh if len(fresh) > 1 else []


def prestart(manifest: Manifest, threads: int, policy: Policy | None, cache_dir: Path | None) -> bool:
    """Start the worker the selection of `manifest` will need, if it will need one. Never raises."""
    try:
        providers = worker_candidates(manifest, threads, policy or Policy(), cache_dir)
        if providers:
            selection_process.prestart(providers)
    except Exception:  # a prestart is an optimisation: the selection starts its own worker
        return False
    return bool(providers)
