-- The first schema. Times are seconds since the epoch (DOUBLE PRECISION, like the SQLite store's REAL);
-- booleans are 0/1 integers so that both backends run the same SQL.
CREATE TABLE devices (
    device_id TEXT PRIMARY KEY, online INTEGER NOT NULL, state TEXT NOT NULL, profile TEXT,
    groups_json TEXT NOT NULL DEFAULT '[]', labels_json TEXT NOT NULL DEFAULT '{}', agent_version TEXT,
    arch TEXT, os TEXT, hostname TEXT, active_bundle TEXT, active_model TEXT, provider TEXT,
    verified INTEGER NOT NULL DEFAULT 0, last_error TEXT, status_ts DOUBLE PRECISION NOT NULL,
    first_seen DOUBLE PRECISION NOT NULL
);
CREATE TABLE telemetry (
    device_id TEXT NOT NULL, seq BIGINT, ts DOUBLE PRECISION NOT NULL, bundle_id TEXT, provider TEXT,
    window_s DOUBLE PRECISION, requests INTEGER, errors INTEGER, p50_ms DOUBLE PRECISION, p95_ms DOUBLE PRECISION,
    p99_ms DOUBLE PRECISION, latency_count INTEGER, golden_agreement DOUBLE PRECISION,
    golden_max_abs_error DOUBLE PRECISION, cpu_percent DOUBLE PRECISION, rss_mb DOUBLE PRECISION,
    temperature_c DOUBLE PRECISION, received_at DOUBLE PRECISION, UNIQUE (device_id, seq, ts)
);
CREATE INDEX telemetry_device_ts ON telemetry (device_id, ts);
CREATE INDEX telemetry_ts ON telemetry (ts);
CREATE TABLE latest_telemetry (
    device_id TEXT PRIMARY KEY, seq BIGINT, ts DOUBLE PRECISION NOT NULL, bundle_id TEXT, provider TEXT,
    window_s DOUBLE PRECISION, requests INTEGER, errors INTEGER, p50_ms DOUBLE PRECISION, p95_ms DOUBLE PRECISION,
    p99_ms DOUBLE PRECISION, latency_count INTEGER, golden_agreement DOUBLE PRECISION,
    golden_max_abs_error DOUBLE PRECISION, cpu_percent DOUBLE PRECISION, rss_mb DOUBLE PRECISION,
    temperature_c DOUBLE PRECISION, received_at DOUBLE PRECISION
);
CREATE TABLE telemetry_rollup (
    device_id TEXT NOT NULL, bucket DOUBLE PRECISION NOT NULL, bundle_id TEXT NOT NULL, reports INTEGER NOT NULL,
    requests INTEGER NOT NULL, errors INTEGER NOT NULL, p50_sum DOUBLE PRECISION, p50_n INTEGER,
    p95_sum DOUBLE PRECISION, p95_n INTEGER, p95_max DOUBLE PRECISION, golden_sum DOUBLE PRECISION,
    golden_n INTEGER, golden_min DOUBLE PRECISION,
    PRIMARY KEY (device_id, bucket, bundle_id)
);
CREATE INDEX telemetry_rollup_bucket ON telemetry_rollup (bucket);
CREATE TABLE events (
    device_id TEXT NOT NULL, seq BIGINT, ts DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL, bundle_id TEXT,
    detail TEXT NOT NULL, progress DOUBLE PRECISION, received_at DOUBLE PRECISION, UNIQUE (device_id, seq, ts)
);
CREATE INDEX events_device_ts ON events (device_id, ts);
CREATE INDEX events_ts ON events (ts);
CREATE INDEX events_received_at ON events (received_at);
CREATE TABLE groups (
    name TEXT PRIMARY KEY, devices_json TEXT NOT NULL, selector TEXT, priority INTEGER NOT NULL
);
CREATE TABLE deployments (
    scope TEXT NOT NULL, target TEXT NOT NULL, profile TEXT NOT NULL, bundle_id TEXT NOT NULL,
    model_name TEXT NOT NULL, model_version TEXT NOT NULL, rollback INTEGER NOT NULL, source TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (scope, target, profile)
);
CREATE TABLE published (
    device_id TEXT PRIMARY KEY, bundle_id TEXT NOT NULL, rollback INTEGER NOT NULL,
    issued_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE bundles (
    bundle_id TEXT PRIMARY KEY, model_name TEXT NOT NULL, model_version TEXT NOT NULL, profile TEXT NOT NULL,
    size BIGINT NOT NULL, accuracy_budget DOUBLE PRECISION, published_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE rollouts (
    id TEXT PRIMARY KEY, state TEXT NOT NULL, doc TEXT NOT NULL, command TEXT,
    created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at DOUBLE PRECISION NOT NULL);
CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
