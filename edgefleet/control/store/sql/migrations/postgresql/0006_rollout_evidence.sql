-- Evidence a rollout weighs a device's reports against (edgefleet/control/rollout/judge/plausibility.py): each
-- published bundle's facts (JSON: its chunks on the wire, its measured latency, its golden score bands), each
-- report's link counters (the agent's bundle bytes received and its monotonic clock), and the health of the
-- control plane's long-running components (the rollout engine: last tick, errors per minute, last error).
CREATE TABLE bundle_facts (
    bundle_id TEXT PRIMARY KEY, facts TEXT NOT NULL, recorded_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE link_counters (
    device_id TEXT NOT NULL, seq BIGINT, ts DOUBLE PRECISION NOT NULL, bulk_bytes BIGINT NOT NULL,
    clock_s DOUBLE PRECISION NOT NULL, received_at DOUBLE PRECISION NOT NULL, UNIQUE (device_id, seq, ts)
);
CREATE INDEX link_counters_device_received ON link_counters (device_id, received_at);
CREATE INDEX link_counters_ts ON link_counters (ts);
CREATE TABLE component_health (
    component TEXT NOT NULL, holder TEXT NOT NULL, last_tick DOUBLE PRECISION, errors_per_min INTEGER NOT NULL,
    last_error TEXT NOT NULL, last_error_at DOUBLE PRECISION, interval_s DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (component, holder)
);
