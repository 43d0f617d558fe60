-- Model quality per report (golden per output, field accuracy, drift, shadow), the last drift band / golden verdict
-- per device and subject, the alerts raised on a crossing, and a shadow bundle beside a deployment.
CREATE TABLE telemetry_quality (
    device_id TEXT NOT NULL, seq BIGINT, ts DOUBLE PRECISION NOT NULL, bundle_id TEXT,
    field_accuracy DOUBLE PRECISION, field_samples INTEGER NOT NULL, probe_requests INTEGER NOT NULL,
    golden_min DOUBLE PRECISION, golden_failed INTEGER NOT NULL, drift_max DOUBLE PRECISION,
    shadow_agreement DOUBLE PRECISION, golden_json TEXT NOT NULL, drift_json TEXT NOT NULL, shadow_json TEXT,
    received_at DOUBLE PRECISION, UNIQUE (device_id, seq, ts)
);
CREATE INDEX telemetry_quality_device_ts ON telemetry_quality (device_id, ts);
CREATE INDEX telemetry_quality_ts ON telemetry_quality (ts);
CREATE TABLE quality_state (
    device_id TEXT NOT NULL, subject TEXT NOT NULL, state TEXT NOT NULL, ts DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (device_id, subject)
);
CREATE TABLE alerts (
    id BIGSERIAL PRIMARY KEY, device_id TEXT NOT NULL, ts DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL,
    subject TEXT NOT NULL, level TEXT NOT NULL, bundle_id TEXT, detail TEXT NOT NULL, received_at DOUBLE PRECISION
);
CREATE INDEX alerts_ts ON alerts (ts);
ALTER TABLE deployments ADD COLUMN shadow_bundle_id TEXT;
ALTER TABLE published ADD COLUMN shadow_bundle_id TEXT;
