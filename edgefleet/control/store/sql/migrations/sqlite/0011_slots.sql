-- Several models per device (issue 33): a device runs one model per slot. Desired state (deployments) and what
-- was published are kept per (target, slot); a device's status keeps every slot (slots_json, SlotStatus list);
-- telemetry, quality figures and events carry the slot they are of. Every existing row belongs to slot 'default'
-- (a device that ran one bundle runs it in the default slot). The old single-model columns of `devices`
-- (active_bundle ... last_error) are no longer written; their values move into the default slot here.
ALTER TABLE deployments RENAME TO deployments_single;
CREATE TABLE deployments (
    scope TEXT NOT NULL, target TEXT NOT NULL, profile TEXT NOT NULL, slot TEXT NOT NULL DEFAULT 'default',
    bundle_id TEXT NOT NULL, model_name TEXT NOT NULL, model_version TEXT NOT NULL, rollback INTEGER NOT NULL,
    source TEXT NOT NULL, updated_at REAL NOT NULL, shadow_bundle_id TEXT, remove_slot INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, target, profile, slot)
);
INSERT INTO deployments (scope, target, profile, slot, bundle_id, model_name, model_version, rollback, source,
    updated_at, shadow_bundle_id)
    SELECT scope, target, profile, 'default', bundle_id, model_name, model_version, rollback, source, updated_at,
    shadow_bundle_id FROM deployments_single;
DROP TABLE deployments_single;
ALTER TABLE published RENAME TO published_single;
CREATE TABLE published (
    device_id TEXT NOT NULL, slot TEXT NOT NULL DEFAULT 'default', bundle_id TEXT NOT NULL,
    rollback INTEGER NOT NULL, issued_at REAL NOT NULL, shadow_bundle_id TEXT, remove_slot INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (device_id, slot)
);
INSERT INTO published (device_id, slot, bundle_id, rollback, issued_at, shadow_bundle_id)
    SELECT device_id, 'default', bundle_id, rollback, issued_at, shadow_bundle_id FROM published_single;
DROP TABLE published_single;
ALTER TABLE latest_telemetry RENAME TO latest_telemetry_single;
CREATE TABLE latest_telemetry (
    device_id TEXT NOT NULL, seq INTEGER, ts REAL NOT NULL, bundle_id TEXT, provider TEXT, window_s REAL,
    requests INTEGER, errors INTEGER, p50_ms REAL, p95_ms REAL, p99_ms REAL, latency_count INTEGER,
    golden_agreement REAL, golden_max_abs_error REAL, cpu_percent REAL, rss_mb REAL, temperature_c REAL,
    received_at REAL, slot TEXT NOT NULL DEFAULT 'default', PRIMARY KEY (device_id, slot)
);
INSERT INTO latest_telemetry (device_id, seq, ts, bundle_id, provider, window_s, requests, errors, p50_ms, p95_ms,
    p99_ms, latency_count, golden_agreement, golden_max_abs_error, cpu_percent, rss_mb, temperature_c, received_at)
    SELECT device_id, seq, ts, bundle_id, provider, window_s, requests, errors, p50_ms, p95_ms, p99_ms,
    latency_count, golden_agreement, golden_max_abs_error, cpu_percent, rss_mb, temperature_c, received_at
    FROM latest_telemetry_single;
DROP TABLE latest_telemetry_single;
ALTER TABLE telemetry ADD COLUMN slot TEXT NOT NULL DEFAULT 'default';
ALTER TABLE telemetry_quality ADD COLUMN slot TEXT NOT NULL DEFAULT 'default';
ALTER TABLE events ADD COLUMN slot TEXT;
ALTER TABLE devices ADD COLUMN slots_json TEXT NOT NULL DEFAULT '[]';
UPDATE devices SET slots_json = json_array(json_object('slot', 'default', 'state', state,
    'active_bundle', active_bundle, 'active_model', active_model, 'provider_in_use', provider,
    'verified', json(CASE WHEN verified = 1 THEN 'true' ELSE 'false' END), 'last_error', last_error))
    WHERE active_bundle IS NOT NULL;
