-- Agent releases the control plane names in a device's signed desired documents (issue 35, item 3: agent releases
-- rolled out in waves). One row per device: the release its every slot's document carries, and who set it (a
-- rollout, `rollout:ID`). A device without a row is named no release (it keeps the agent it runs).
CREATE TABLE IF NOT EXISTS agent_release_targets (
    device_id TEXT PRIMARY KEY, release_id TEXT NOT NULL, version TEXT NOT NULL, allow_downgrade_to TEXT,
    source TEXT NOT NULL, updated_at REAL NOT NULL
);
