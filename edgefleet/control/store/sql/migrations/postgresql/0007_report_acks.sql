-- Per device, the highest sequence number up to which every report (telemetry or event) is stored, and the
-- numbers its `reports-dropped` events said will never come (edgefleet/core/messages.py StoredUpTo): what the
-- control plane acknowledges on the device's `stored` topic, so its spool can drop them.
CREATE TABLE report_acks (
    device_id TEXT PRIMARY KEY, up_to BIGINT NOT NULL, lost_through BIGINT NOT NULL DEFAULT 0,
    updated_at DOUBLE PRECISION NOT NULL
);
