-- Evidence a rollout weighs a device's reports against (edgefleet/control/rollout/judge/plausibility.py): each
-- published bundle's facts (JSON: its chunks on the wire, its measured latency, its golden score bands), each
-- report's link counters (the agent's bundle bytes received and its monotonic clock), and the health of the
-- control plane's long-running components (the rollout engine: last tick, errors per minute, last error).
CREATE TABLE IF NOT EXISTS bundle_facts (
    bundle_id TEXT PRIMARY KEY, facts TEXT NOT NULL, recorded_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS link_counters (
    device_id TEXT NOT NULL, seq INTEGER, ts REAL NOT NULL, bulk_bytes INTEGER NOT NULL, clock_s REAL NOT NULL,
    received_at REAL NOT NULL, UNIQUE (device_id, seq, ts)
);
CREATE INDEX IF NOT EXISTS link_counters_device_received ON link_counters (device_id, received_at);
CREATE INDEX IF NOT EXISTS link_counters_ts ON link_counters (ts);
CREATE TABLE IF NOT EXISTS component_health (
    component TEXT NOT NULL, holder TEXT NOT NULL, last_tick REAL, errors_per_min INTEGER NOT NULL,
    last_error TEXT NOT NULL, last_error_at REAL, interval_s REAL NOT NULL, updated_at REAL NOT NULL,
    PRIMARY KEY (component, holder)
);
