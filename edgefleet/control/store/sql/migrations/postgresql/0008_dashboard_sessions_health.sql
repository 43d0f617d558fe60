-- Dashboard login sessions held by the server (edgefleet/control/store/operator.py): the cookie carries an opaque
-- id whose sha256 is the key here, never the token; a session ends at its expiry, at logout (revoked_at), or when
-- its token is revoked or re-issued (token_hash no longer matches a live token).
CREATE TABLE dashboard_sessions (
    id_hash TEXT PRIMARY KEY, token_hash TEXT NOT NULL, csrf TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL, revoked_at DOUBLE PRECISION
);
CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at);
-- Each control-plane instance's loops (0006's component_health, edgefleet/control/store/health.py): whether the
-- loop is active in that instance (the rollout engine and its syncs run on the lease holder only), and since when.
ALTER TABLE component_health ADD COLUMN active INTEGER NOT NULL DEFAULT 1;
ALTER TABLE component_health ADD COLUMN active_since DOUBLE PRECISION;
