"""The agent release the store names per device (`agent_release_targets`, migration 0013), on both backends: set,
replaced, listed and withdrawn."""

from __future__ import annotations

from edgefleet.control.store import AgentReleaseTarget, Store


def test_a_devices_agent_release_is_set_replaced_listed_and_withdrawn(store: Store) -> None:
    assert store.agent_releases() == {}
    first = AgentReleaseTarget("d1", "agent-0.2.0", "0.2.0", source="rollout:r1", updated_at=10.0)
    store.put_agent_release(first)
    store.put_agent_release(AgentReleaseTarget("d2", "agent-0.2.0", "0.2.0", source="rollout:r1", updated_at=11.0))
    back = AgentReleaseTarget("d1", "agent-0.1.5", "0.1.5", "agent-0.1.5", source="rollback:r2", updated_at=12.0)
    store.put_agent_release(back)
    assert store.agent_releases() == {
        "d1": back, "d2": AgentReleaseTarget("d2", "agent-0.2.0", "0.2.0", None, "rollout:r1", 11.0),
    }  # fmt: skip
    assert store.delete_agent_release("d1") == 1
    assert store.delete_agent_release("d1") == 0
    assert list(store.agent_releases()) == ["d2"]
