"""The build machine's CPU, as the tests see it.

CI machines differ: some have AVX-512 VNNI (this host's profile is then intel-x86-vnni), some do not (then only
generic-x86-64 matches, and the converter builds intel-x86-vnni bundles without timing them). Tests that check
the timed path (latency, head to head, plots) take the profile `as_this_host`, so they run on either;
EDGEFLEET_TEST_CPU_WITHOUT=avx512_vnni,avx_vnni runs the suite here as a CPU without those flags would see
profile matching (in this process: agent subprocesses still see the real CPU).
"""

from __future__ import annotations

import dataclasses
import os
import platform

from edgefleet.core.profiles import HostFacts, MatchRules, Profile, match_reasons


def hide_cpu_flags_from_env() -> None:
    """Drop EDGEFLEET_TEST_CPU_WITHOUT's flags from every HostFacts.probe in this process."""
    hidden = frozenset(f for f in os.environ.get("EDGEFLEET_TEST_CPU_WITHOUT", "").split(",") if f)
    if not hidden:
        return
    probe = HostFacts.probe.__func__  # type: ignore[attr-defined]

    def probe_without(cls: type[HostFacts], watched_files=()) -> HostFacts:  # type: ignore[no-untyped-def]
        facts = probe(cls, watched_files)
        return dataclasses.replace(facts, cpu_flags=facts.cpu_flags - hidden)

    HostFacts.probe = classmethod(probe_without)  # type: ignore[method-assign,assignment]


def matches_this_host(profile: Profile) -> bool:
    return not match_reasons(profile, HostFacts.probe(profile.match.files))


def as_this_host(profile: Profile) -> Profile:
    """`profile` with this host as its hardware: targets, recipes and budget kept, the match rule this host's."""
    return profile.model_copy(update={"match": MatchRules(arch=[platform.machine().lower()])})
