"""Installing bundles like an A/B update: signed desired state, the offer, verify, stage, load, golden set, atomic
commit; the device's state directory and rollback floor; health after commit.

Other rooms use `Installer` (the install worker and its typed commands: `Reconcile`, `Unhealthy`, `Stop`),
`HealthMonitor`, `ServingState` (what the device serves now and its status), and what builds them: `Store` (the
state directory), `DeviceTrust` (the keys this device trusts), `DesiredState` (signed desired documents) and
`InstallContext`. `check_runnable` and `Refused` say whether this device can run a manifest.
"""

from edgefleet.agent.install.commands import Command, Reconcile, Stop, Unhealthy
from edgefleet.agent.install.desired import DesiredRefused, DesiredState
from edgefleet.agent.install.health_monitor import HealthMonitor, HealthPolicy
from edgefleet.agent.install.installer import InstallContext, Refused, check_runnable
from edgefleet.agent.install.serving import Identity, ServingState
from edgefleet.agent.install.store import Store
from edgefleet.agent.install.trust import DeviceTrust
from edgefleet.agent.install.worker import Installer

__all__ = [
    "Command",
    "DesiredRefused",
    "DesiredState",
    "DeviceTrust",
    "HealthMonitor",
    "HealthPolicy",
    "Identity",
    "InstallContext",
    "Installer",
    "Reconcile",
    "Refused",
    "ServingState",
    "Stop",
    "Store",
    "Unhealthy",
    "check_runnable",
]
