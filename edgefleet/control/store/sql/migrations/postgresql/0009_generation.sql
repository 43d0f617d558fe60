-- Generation figures of a report from a device serving a language model (TTFT, TPOT, tokens/s, tokens, streams cut
-- or refused), as JSON, or NULL for reports without them: edgefleet/core/messages.py GenerationStats.
ALTER TABLE telemetry_quality ADD COLUMN generation_json TEXT;
