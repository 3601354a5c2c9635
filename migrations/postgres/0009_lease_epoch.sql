-- Postgres twin of migrations/0009_lease_epoch.sql.
-- Fencing tokens for create leases: every takeover of an in-flight create (a claim after
-- the lease expired) increments the epoch, and every write the create's walk makes is
-- conditional on the owner and epoch it was started with, so a coordinator that lost its
-- lease (paused, partitioned) cannot write after another took over.
ALTER TABLE sandboxes ADD COLUMN lease_epoch BIGINT NOT NULL DEFAULT 0;
