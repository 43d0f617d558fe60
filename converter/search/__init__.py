"""The recipe search for one profile: plan the candidates, build and gate each, time them, choose.

A conversion loads its inputs once into a frozen `SearchRequest` and works in a `Workspace` (work directory,
build cache, deadline, progress, what was already built); `search` runs the stages for one profile and returns
a `ProfileSearch`, which the bundle and the report read. `choose_on_devices` chooses again by what devices
measured (`--measure-on`, a `Farm`).
"""

from edgefleet.converter.search.cache import BuildCache
from edgefleet.converter.search.choose import Candidate, Choice, choose
from edgefleet.converter.search.driver import search
from edgefleet.converter.search.farm_choice import Farm, WriteCandidate, choose_on_devices, latency_report
from edgefleet.converter.search.gate import Budget, MetricPlan, Score, gate, plan_metric, score
from edgefleet.converter.search.plan import TargetStatus, bf16_native
from edgefleet.converter.search.request import Progress, SearchRequest, Workspace
from edgefleet.converter.search.result import ProfileSearch, accuracy_report, search_report
from edgefleet.converter.search.types import Built, Spec

__all__ = [
    "Budget",
    "BuildCache",
    "Built",
    "Candidate",
    "Choice",
    "Farm",
    "MetricPlan",
    "ProfileSearch",
    "Progress",
    "Score",
    "SearchRequest",
    "Spec",
    "TargetStatus",
    "Workspace",
    "WriteCandidate",
    "accuracy_report",
    "bf16_native",
    "choose",
    "choose_on_devices",
    "gate",
    "latency_report",
    "plan_metric",
    "score",
    "search",
    "search_report",
]
