-- Fencing tokens: a lease's term number, bumped when the lease changes hands (a release keeps the row).
ALTER TABLE leases ADD COLUMN token BIGINT NOT NULL DEFAULT 1;
