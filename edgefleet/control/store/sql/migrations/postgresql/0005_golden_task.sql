-- The task rule's metric and score on the golden set, as the device's golden check applied it (JSON, or NULL for
-- reports that predate it): edgefleet/core/messages.py GoldenTask.
ALTER TABLE telemetry_quality ADD COLUMN golden_task_json TEXT;
