-- Postgres twin of migrations/0006_placement_records.sql.
-- The placement record: the router's explanation that produced a sandbox's candidate list
-- (every pool's eligibility, unmet requirements, rank keys and measured values at create
-- time), kept with the sandbox so "why did it land there" has an answer after the
-- measurements have moved on. NULL for sandboxes created before this migration.
ALTER TABLE sandboxes ADD COLUMN placement_record_json TEXT;
