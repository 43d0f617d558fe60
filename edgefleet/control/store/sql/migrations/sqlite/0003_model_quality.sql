-- Model quality per report (golden per output, field accuracy, drift, shadow), the last drift band / golden verdict
-- per device and subject, the alerts raised on a crossing, and a shadow bundle beside a deployment.
CREATE TABLE IF NOT EXISTS telemetry_quality (
    device_id TEXT NOT NULL, seq INTEGER, ts REAL NOT NULL, bundle_id TEXT, field_accuracy REAL,
    field_samples INTEGER NOT NULL, probe_requests INTEGER NOT NULL, golden_min REAL, golden_failed INTEGER NOT NULL,
    drift_max REAL, shadow_agreement REAL, golden_json TEXT NOT NULL, drift_json TEXT NOT NULL, shadow_json TEXT,
    received_at REAL, UNIQUE (device_id, seq, ts)
);
CREATE INDEX IF NOT EXISTS telemetry_quality_device_ts ON telemetry_quality (device_id, ts);
CREATE INDEX IF NOT EXISTS telemetry_quality_ts ON telemetry_quality (ts);
CREATE TABLE IF NOT EXISTS quality_state (
    device_id TEXT NOT NULL, subject TEXT NOT NULL, state TEXT NOT NULL, ts REAL NOT NULL,
    PRIMARY KEY (device_id, subject)
);
CREATE TABLE IF NOT EXISTS alerts (
    device_id TEXT NOT NULL, ts REAL NOT NULL, kind TEXT NOT NULL, subject TEXT NOT NULL, level TEXT NOT NULL,
    bundle_id TEXT, detail TEXT NOT NULL, received_at REAL
);
CREATE INDEX IF NOT EXISTS alerts_ts ON alerts (ts);
-- (a file made by the interim store that created these columns itself: the runner skips an existing column)
ALTER TABLE deployments ADD COLUMN shadow_bundle_id TEXT;
ALTER TABLE published ADD COLUMN shadow_bundle_id TEXT;
