"""A device that committed a bundle always says so, even when it dies between the commit and the event.

The control plane dates an install by the device's "committed" event (control/rollout/engine.py), and
operators and tests wait for it; a kill -9 after the state commit but before the event reached the disk
spool used to lose it for good: the restarted agent served the bundle and never announced it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgefleet.agent.install.commit_notice import announce_commits
from edgefleet.agent.install.store import CommitNotice, Store
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.topics import Topics

from support.fleet import AgentProcess, FleetWatcher, deploy_to

# Loaded into the agent process as a backend plugin ($EDGEFLEET_BACKENDS, imported before any install): the
# first "committed" event to reach the spool kills the process instead, the crash point under test. The
# marker file makes it fire once, so the restarted agent runs unharmed.
CRASH_PLUGIN = """
import json, os, signal
from pathlib import Path
from edgefleet.agent.telemetry import Spool

_put = Spool.put
_MARK = Path(os.environ["EDGEFLEET_TEST_CRASH_MARK"])

def put(self, topic, build):
    def crash_first(seq):
        payload = build(seq)
        if topic.endswith("/events") and json.loads(payload).get("kind") == "committed" and not _MARK.exists():
            _MARK.write_text("crashed before spooling the committed event")
            os.kill(os.getpid(), signal.SIGKILL)
        return payload
    return _put(self, topic, crash_first)

Spool.put = put
"""


def _staged(store: Store, bundle_id: str) -> None:
    store.staging_dir(bundle_id).mkdir(parents=True)


def test_the_event_a_commit_owes_is_written_with_the_commit_and_kept_until_spooled(tmp_path: Path) -> None:
    store = Store(tmp_path)
    _staged(store, "m-1")
    store.commit("m-1", "m", "1")
    state = tmp_path / "slots" / "default" / "state.json"
    assert "unannounced" not in json.loads(state.read_text())  # older agents still read it
    _staged(store, "m-2")
    notice = CommitNotice(bundle_id="m-2", detail="now serving on CPU (was m-1)", ts=123.0)
    store.commit("m-2", "m", "2", notice=notice)
    # A crash here: a fresh store (the restarted agent) still owes the event, whatever else changed state since.
    store = Store(tmp_path)
    store.remember_refusal("m-9@1")
    store.commit("m-1", "m", "1", raise_floor=False)  # a local rollback
    assert store.load_state().unannounced == [notice]
    emitted: list[CommitNotice] = []
    assert announce_commits(store, lambda n: False) == 0  # a full disk: the event stays owed
    assert store.load_state().unannounced == [notice]
    assert announce_commits(store, lambda n: emitted.append(n) is None) == 1
    assert emitted == [notice] and store.load_state().unannounced == []
    assert announce_commits(store, lambda n: emitted.append(n) is None) == 0 and emitted == [notice]


@pytest.mark.slow
def test_a_kill_between_the_commit_and_its_event_still_announces_the_commit_after_restart(
    tmp_path: Path, host: Connection, topics: Topics, watcher: FleetWatcher, demo_bundles: dict[str, Path],
    start_agent: Callable[..., AgentProcess],
) -> None:  # fmt: skip
    plugin, mark = tmp_path / "crash_at_commit_event.py", tmp_path / "crashed"
    plugin.write_text(CRASH_PLUGIN)
    agent = start_agent("dev-durable", env={"EDGEFLEET_BACKENDS": str(plugin), "EDGEFLEET_TEST_CRASH_MARK": str(mark)})
    target = deploy_to(host, topics, demo_bundles["intel-x86-vnni"], devices=("dev-durable",))
    assert agent.proc is not None
    agent.proc.wait(60)
    assert mark.exists(), f"the agent died elsewhere than the crash point:\n{agent.log()[-3000:]}"
    assert Store(agent.state_dir).load_state().committed == target  # the kill came after the state commit
    assert not any(e.kind == "committed" for e in watcher.events if e.device_id == "dev-durable")
    restarted_at = time.time()
    agent.start()
    watcher.serving("dev-durable", target, timeout=60)
    event = watcher.event("dev-durable", "committed", bundle_id=target, timeout=20)
    assert event.ts < restarted_at, "the event carries the time of the commit, not of the restart"
    assert Store(agent.state_dir).load_state().unannounced == []
