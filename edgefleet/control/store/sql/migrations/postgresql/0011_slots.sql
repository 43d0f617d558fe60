-- Several models per device (issue 33): a device runs one model per slot. Desired state (deployments) and what
-- was published are kept per (target, slot); a device's status keeps every slot (slots_json, SlotStatus list);
-- telemetry, quality figures and events carry the slot they are of. Every existing row belongs to slot 'default'
-- (a device that ran one bundle runs it in the default slot). The old single-model columns of `devices`
-- (active_bundle ... last_error) are no longer written; their values move into the default slot here.
ALTER TABLE deployments ADD COLUMN IF NOT EXISTS slot TEXT NOT NULL DEFAULT 'default',
    ADD COLUMN IF NOT EXISTS remove_slot INTEGER NOT NULL DEFAULT 0;
ALTER TABLE deployments DROP CONSTRAINT deployments_pkey, ADD PRIMARY KEY (scope, target, profile, slot);
ALTER TABLE published ADD COLUMN IF NOT EXISTS slot TEXT NOT NULL DEFAULT 'default',
    ADD COLUMN IF NOT EXISTS remove_slot INTEGER NOT NULL DEFAULT 0;
ALTER TABLE published DROP CONSTRAINT published_pkey, ADD PRIMARY KEY (device_id, slot);
ALTER TABLE latest_telemetry ADD COLUMN IF NOT EXISTS slot TEXT NOT NULL DEFAULT 'default';
ALTER TABLE latest_telemetry DROP CONSTRAINT latest_telemetry_pkey, ADD PRIMARY KEY (device_id, slot);
ALTER TABLE telemetry ADD COLUMN IF NOT EXISTS slot TEXT NOT NULL DEFAULT 'default';
ALTER TABLE telemetry_quality ADD COLUMN IF NOT EXISTS slot TEXT NOT NULL DEFAULT 'default';
ALTER TABLE events ADD COLUMN IF NOT EXISTS slot TEXT;
ALTER TABLE devices ADD COLUMN IF NOT EXISTS slots_json TEXT NOT NULL DEFAULT '[]';
UPDATE devices SET slots_json = json_build_array(json_build_object('slot', 'default', 'state', state,
    'active_bundle', active_bundle, 'active_model', active_model, 'provider_in_use', provider,
    'verified', verified = 1, 'last_error', last_error))::text
    WHERE active_bundle IS NOT NULL;
