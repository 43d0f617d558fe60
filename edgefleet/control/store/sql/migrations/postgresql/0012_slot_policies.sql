-- How devices schedule each slot (issue 33, item 5): a slot's class (real-time, interactive, batch) and a real-time
-- slot's p95 latency objective, per (scope, target, slot), resolved like deployments (device > highest-priority
-- group > fleet) but kept apart from them, so a rollout of a new bundle keeps the slot's class and a new class
-- publishes no new bundle. `published` remembers the class and objective last signed, so a change is re-published.
CREATE TABLE IF NOT EXISTS slot_policies (
    scope TEXT NOT NULL, target TEXT NOT NULL, slot TEXT NOT NULL, slot_class TEXT NOT NULL,
    latency_objective_ms DOUBLE PRECISION, updated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (scope, target, slot)
);
ALTER TABLE published ADD COLUMN IF NOT EXISTS slot_class TEXT NOT NULL DEFAULT 'interactive',
    ADD COLUMN IF NOT EXISTS latency_objective_ms DOUBLE PRECISION;
