"""Bundle transfer over MQTT against a raw publish of the same bytes, through the same Mosquitto.

    python bench/transfer.py [--mb 16] [--rounds 5] [--block-kib 128] [--json out.json]

In one run, interleaved (raw, bundle, raw, bundle, ...), medians:
- raw: the bytes as block-sized QoS 1 messages, a subscriber receiving them all (the broker's bandwidth);
- bundle: `publish_bundle` (retained blocks + signed offer) then a device-side `BlockDownload`
  (windowed subscriptions, per-block sha256, fsync'd writes, whole-file sha256);
- resume: a real agent process killed (SIGKILL) at a random point of each download and restarted: bytes it
  fetched beyond the blocks it lacked (goal: at most one block), restarts without a working model (goal: 0).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the test helpers start Mosquitto and build padded bundles

from edgefleet.agent.config import AgentConfig  # noqa: E402
from edgefleet.agent.transfer import BlockDownload  # noqa: E402
from edgefleet.control.publish import publish_bundle  # noqa: E402
from edgefleet.core.mqtt import Connection  # noqa: E402
from edgefleet.core.signing import SigningKey, TrustedKeys, generate_keypair  # noqa: E402
from edgefleet.core.topics import Topics  # noqa: E402

from brokers import MosquittoBroker  # noqa: E402
from fleet_helpers import DIGITS, AgentProcess, FleetWatcher, deploy_to, padded_bundle  # noqa: E402


def raw_round(host: Connection, device: Connection, data: bytes, block: int, tag: str) -> float:
    chunks = [data[i : i + block] for i in range(0, len(data), block)]
    done = threading.Event()
    received = [0]

    def on_message(topic: str, payload: bytes, retained: bool) -> None:
        received[0] += 1
        if received[0] == len(chunks):
            done.set()

    topic = f"bench/raw/{tag}"
    device.subscribe(topic, on_message)
    time.sleep(0.2)
    start = time.perf_counter()
    infos = [host.publish(topic, chunk, qos=1) for chunk in chunks]
    for info in infos:
        info.wait_for_publish(60)
    if not done.wait(120):
        raise RuntimeError(f"raw: received {received[0]} of {len(chunks)}")
    elapsed = time.perf_counter() - start
    device.unsubscribe(topic)
    return elapsed


def bundle_round(host: Connection, device: Connection, bundle: Path, block: int, work: Path) -> tuple[float, float]:
    topics = Topics()
    start = time.perf_counter()
    _, offer = publish_bundle(host, topics, bundle, block_size=block)
    published = time.perf_counter()
    part = work / f"{offer.bundle_id}-{time.monotonic_ns()}.part"
    BlockDownload(device, topics, offer, part, window=AgentConfig.model_fields["block_window"].default).run()
    fetched = time.perf_counter()
    BlockDownload(device, topics, offer, part).cleanup()
    return published - start, fetched - start


def resume_trials(
    broker: MosquittoBroker, source: Path, keys: tuple[Path, Path], work: Path, block: int, pad: int, trials: int
) -> dict:
    """Kill a real agent with SIGKILL at a random share of each download, restart it, and count the bytes
    it fetched beyond the blocks it lacked, and any restart that came up without a working model."""
    key, trusted = SigningKey.load(keys[0]), TrustedKeys.load([keys[1]])
    host = Connection(broker.url, "bench-resume-host", session_expiry_s=600).start()
    topics = Topics()
    watcher = FleetWatcher(host, topics)
    agent = AgentProcess("bench-resume", work / "bench-resume", broker=broker.url, trust=keys[1]).start()
    rng = random.Random(7)
    refetched, without_model, current = [], 0, None
    try:
        watcher.wait_for("agent online", lambda: watcher.status.get("bench-resume"), timeout=30)
        for trial in range(trials):
            bundle = padded_bundle(source, work, key, trusted, version=str(trial + 10), pad_bytes=pad, seed=trial)
            target = deploy_to(host, topics, bundle, devices=("bench-resume",), block_size=block)
            record = agent.state_dir / "downloads" / f"{target}.part.blocks"
            blocks = -(-bundle.stat().st_size // block)
            goal, deadline = int(rng.uniform(0.05, 0.95) * blocks), time.monotonic() + 60
            while time.monotonic() < deadline and not (record.exists() and sum(record.read_bytes()) >= goal):
                time.sleep(0.002)
            agent.kill9()
            held = sum(record.read_bytes()) if record.exists() else 0
            marker = len(watcher.events)
            agent.start()
            first = watcher.wait_for(
                "restarted",
                lambda: (s := watcher.status.get("bench-resume")) and s.online and s.state != "starting" and s,
            )
            without_model += int(current is not None and first.active_bundle not in (current, target))
            watcher.serving("bench-resume", target, timeout=120)
            event = watcher.wait_for(
                "downloaded",
                lambda since=marker: next((e for e in watcher.events[since:] if e.kind == "downloaded"), None),
            )
            fetched = int(event.detail.split(" bytes")[0])
            refetched.append(max(0, fetched - (bundle.stat().st_size - held * block)))
            current = target
    finally:
        agent.stop()
        host.stop()
    return {
        "trials": trials,
        "refetched_bytes_max": max(refetched),
        "refetched_bytes_median": statistics.median(refetched),
        "devices_without_working_model": without_model,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=16.0, help="bundle size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-kib", type=int, default=128)
    parser.add_argument("--kill-trials", type=int, default=10, help="kill -9 / resume trials")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    block = args.block_kib * 1024
    from edgefleet.converter.build import ConvertRequest, convert
    from edgefleet.core.profiles import get_profile

    with tempfile.TemporaryDirectory(prefix="edgefleet-bench-") as tmp, MosquittoBroker() as broker:
        work = Path(tmp)
        keys = generate_keypair(work / "keys")
        key, trusted = SigningKey.load(keys[0]), TrustedKeys.load([keys[1]])
        (result,) = convert(ConvertRequest(
            model=DIGITS / "digits_cnn.onnx", profiles=[get_profile("intel-x86-vnni")], calib=DIGITS / "calib.npz",
            eval=DIGITS / "eval.npz", out=work / "bundles", key=key, name="digits-cnn", version="1",
        ))  # fmt: skip
        assert result.bundle is not None
        bundle = padded_bundle(Path(result.bundle), work, key, trusted, version="2", pad_bytes=int(args.mb * 2**20))
        data = bundle.read_bytes()
        host = Connection(broker.url, "bench-host").start()
        device = Connection(broker.url, "bench-device").start()
        raw, publish, end_to_end = [], [], []
        for i in range(args.rounds):
            raw.append(raw_round(host, device, data, block, str(i)))
            pub, total = bundle_round(host, device, bundle, block, work)
            publish.append(pub)
            end_to_end.append(total)
        host.stop()
        device.stop()
        resume = resume_trials(broker, Path(result.bundle), keys, work, block, int(args.mb * 2**20), args.kill_trials)
    size_mb = len(data) / 1e6
    raw_mbps, bundle_mbps = size_mb / statistics.median(raw), size_mb / statistics.median(end_to_end)
    fetch_mbps = size_mb / statistics.median([total - pub for pub, total in zip(publish, end_to_end, strict=True)])
    report = {
        "bundle_mb": round(size_mb, 2), "block_kib": args.block_kib, "rounds": args.rounds,
        "raw_publish_mb_s": round(raw_mbps, 1), "bundle_publish_s": round(statistics.median(publish), 3),
        "bundle_end_to_end_mb_s": round(bundle_mbps, 1), "ratio_bundle_vs_raw": round(bundle_mbps / raw_mbps, 3),
        "device_fetch_mb_s": round(fetch_mbps, 1), "ratio_fetch_vs_raw": round(fetch_mbps / raw_mbps, 3),
        "resume": resume,
    }  # fmt: skip
    print(f"{'what':44} {'median':>12}")
    print(f"{'raw publish, same bytes, QoS 1':44} {raw_mbps:>8.1f} MB/s")
    print(f"{'bundle: publish + fetch + verify (end to end)':44} {bundle_mbps:>8.1f} MB/s")
    print(f"{'ratio bundle / raw (goal >= 0.50)':44} {bundle_mbps / raw_mbps:>12.2f}")
    print(f"{'device fetch + verify only (publish is once)':44} {fetch_mbps:>8.1f} MB/s")
    print(f"{'ratio device fetch / raw':44} {fetch_mbps / raw_mbps:>12.2f}")
    print(f"{'resume after kill -9: bytes re-fetched, max':44} {resume['refetched_bytes_max']:>12} (goal <= {block})")
    lost = resume["devices_without_working_model"]
    print(f"{'kill -9 trials without a working model':44} {lost:>12} of {resume['trials']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
