"""Threads partitioned across slots (agent/daemon/slots.py): with `--threads 0`, one slot leaves the count to the
runtime as before, and several share the cores (cores // slots each, at least one), so a 2-core device running two
models never runs more intra-op threads than cores; the slot's placement says why. Built from the agent's real parts
(store, trust, signed desired state) with no broker: nothing here publishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefleet.agent.daemon.slots import Slots, SlotSettings
from edgefleet.agent.install import (
    DesiredState,
    DeviceServing,
    DeviceTrust,
    HealthPolicy,
    Identity,
    InstallContext,
    MemoryBudget,
    Repartition,
    Store,
)
from edgefleet.agent.quality import FieldAccuracy, QualityConfig
from edgefleet.agent.runtime import RuntimeOptions
from edgefleet.agent.telemetry import Reporter, Spool
from edgefleet.agent.transfer import LinkPacer
from edgefleet.control.credentials import keyring
from edgefleet.control.desired.signing import device_target, sign_desired
from edgefleet.core.messages import Desired
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import TrustedKeys


def slots_of(tmp_path: Path, threads: int, cores: int, wanted: list[str]) -> Slots:
    keyring.init(tmp_path / "keys")
    keys = keyring.HostKeys(tmp_path / "keys")
    store = Store(tmp_path / "state")
    trust = DeviceTrust(TrustedKeys.load([keys.root_public()]), store)
    desired = DesiredState("d1", [], trust, store)
    for slot in wanted:
        document = Desired(slot=slot, bundle_id=f"{slot}-1", model_name=slot, model_version="1", profile="p")
        desired.on_message("device", None, slot, sign_desired(keys, document, device_target("d1")).encode())
    reporter = Reporter(None, Topics(), "d1", Spool(tmp_path / "outbox.sqlite"))  # type: ignore[arg-type]
    device = DeviceServing(Identity("d1", "p", ("p",), ()), reporter, desired, lambda _s: None)
    context = InstallContext(None, Topics(), store, trust, "p", RuntimeOptions(threads), 16, 1.0, 0, 1 << 30)  # type: ignore[arg-type]
    settings = SlotSettings(threads, QualityConfig(), HealthPolicy(30, 0.5, 20), 10.0, True)
    return Slots(
        settings=settings, context=context, desired=desired, device=device, reporter=reporter, link=LinkPacer(None),
        budget=MemoryBudget(1000), field=FieldAccuracy(), on_swap=lambda *_: None, cores=cores,
    )  # fmt: skip


def test_one_slot_leaves_the_threads_to_the_runtime(tmp_path: Path) -> None:
    parts = slots_of(tmp_path, threads=0, cores=2, wanted=["default"]).ensure("default")
    assert parts.serving.threads == 0 and parts.installer.context.runtime.threads == 0


@pytest.mark.parametrize(("cores", "wanted", "share"), [(2, 2, 1), (2, 3, 1), (8, 3, 2), (16, 2, 8)])
def test_several_slots_share_the_cores(tmp_path: Path, cores: int, wanted: int, share: int) -> None:
    names = [f"s{i}" for i in range(wanted)]
    slots = slots_of(tmp_path, threads=0, cores=cores, wanted=names)
    for name in names:
        parts = slots.ensure(name)
        assert parts.installer.context.runtime.threads == share and parts.serving.threads == share
        assert parts.serving.placement_why == f"{share} of {cores} cores: {wanted} slots share them"
        assert parts.installer.context.store.slot == name  # and each its own view of the state directory
    assert share * wanted <= max(cores, wanted)  # never more threads than cores (one each at least)


def test_the_agents_threads_option_wins(tmp_path: Path) -> None:
    parts = slots_of(tmp_path, threads=1, cores=8, wanted=["a", "b"]).ensure("a")
    assert parts.serving.threads == 1 and "--threads" in parts.serving.placement_why


def test_a_slot_that_arrives_takes_its_share_from_the_slots_already_there(tmp_path: Path) -> None:
    slots = slots_of(tmp_path, threads=0, cores=2, wanted=["a"])
    first = slots.ensure("a")
    assert first.installer.context.runtime.threads == 0, "alone: the runtime's default"
    slots.repartition()
    assert first.installer._commands.empty(), "nothing changed: nothing to reload"

    slots.ensure("b")  # a second slot's desired state arrived
    slots.repartition()
    command = first.installer._commands.get_nowait()
    assert command == Repartition(1, "1 of 2 cores: 2 slots share them")
    first.installer._repartition(command)  # on its install thread; it serves nothing yet, so nothing reloads
    assert first.installer.context.runtime.threads == 1 and first.serving.threads == 1
    assert first.serving.placement_why == "1 of 2 cores: 2 slots share them"
    slots.repartition()
    assert first.installer._commands.empty() and slots.ensure("b").installer._commands.empty()

    slots.ensure("c")  # a third: still 1 thread each on 2 cores, and the placement says why
    slots.repartition()
    command = first.installer._commands.get_nowait()
    first.installer._repartition(command)
    assert first.installer.context.runtime.threads == 1 and first.serving.placement_why.startswith("1 of 2 cores: 3")
