"""Installing bundles like an A/B update: signed desired state, the offer, verify, stage, load, golden set, atomic
commit; the device's state directory and rollback floor; health after commit.

Other rooms use `Installer` (the install worker and its typed commands: `Reconcile`, `Unhealthy`, `Repartition`,
`Stop`), `HealthMonitor`, `DeviceServing` / `SlotServing` (what each slot serves now and the device's status),
`MemoryBudget` (memory admission across slots), `migrate_single_model` (a single-model state dir becomes slot
"default"), and what builds them: `Store` (the
state directory), `DeviceTrust` (the keys this device trusts), `DesiredState` (signed desired documents) and
`InstallContext`. `check_runnable` and `Refused` say whether this device can run a manifest.
"""

from edgefleet.agent.install.admission import MemoryBudget, OverBudget
from edgefleet.agent.install.commands import Command, Reconcile, Repartition, Stop, Unhealthy
from edgefleet.agent.install.desired import DesiredRefused, DesiredState
from edgefleet.agent.install.health_monitor import HealthMonitor, HealthPolicy
from edgefleet.agent.install.installer import InstallContext, Refused, check_runnable
from edgefleet.agent.install.migration import migrate_single_model
from edgefleet.agent.install.serving import DeviceServing, Identity, SlotServing
from edgefleet.agent.install.store import Store
from edgefleet.agent.install.trust import DeviceTrust
from edgefleet.agent.install.worker import Installer

__all__ = [
    "Command",
    "DesiredRefused",
    "DesiredState",
    "DeviceServing",
    "DeviceTrust",
    "HealthMonitor",
    "HealthPolicy",
    "Identity",
    "InstallContext",
    "Installer",
    "MemoryBudget",
    "OverBudget",
    "Reconcile",
    "Refused",
    "Repartition",
    "SlotServing",
    "Stop",
    "Store",
    "Unhealthy",
    "check_runnable",
    "migrate_single_model",
]
