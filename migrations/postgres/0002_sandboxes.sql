-- Postgres twin of migrations/0002_sandboxes.sql. Integers are BIGINT (the store reads
-- them as i64 on both backends), floats DOUBLE PRECISION, blobs BYTEA, and the JSON
-- documents stay TEXT so they are returned exactly as written.
-- Sandbox creation: sandboxes, their attempts, idempotency keys, per-pool samples for routing,
-- and instances of abandoned attempts that the janitor must delete if they appear.
-- Times are Unix milliseconds.
CREATE TABLE sandboxes (
    id              TEXT PRIMARY KEY,
    workspace       TEXT NOT NULL,
    principal_json  TEXT NOT NULL,
    state           TEXT NOT NULL,
    -- The create body as accepted (it holds no secrets: credentials are named, not sent).
    request_json    TEXT NOT NULL,
    labels_json     TEXT NOT NULL,
    -- The ordered candidate pools routing produced: [{pool, provider, account, region, zone}].
    candidates_json TEXT NOT NULL,
    -- {pool, provider, account, region, zone, instance_id} once running.
    placement_json  TEXT,
    -- {code, message, details} once failed.
    error_json      TEXT,
    -- The egress proxy token, sealed with the master key (AES-256-GCM).
    token_sealed    BYTEA NOT NULL,
    -- The coordinator that owns an in-flight create and until when.
    lease_owner     TEXT,
    lease_expires_ms BIGINT NOT NULL DEFAULT 0,
    created_ms      BIGINT NOT NULL,
    updated_ms      BIGINT NOT NULL
);
CREATE INDEX sandboxes_by_workspace ON sandboxes (workspace, created_ms, id);
CREATE INDEX sandboxes_by_state ON sandboxes (state, lease_expires_ms);

CREATE TABLE attempts (
    id           TEXT PRIMARY KEY,
    sandbox_id   TEXT NOT NULL,
    seq          BIGINT NOT NULL,
    pool         TEXT NOT NULL,
    provider     TEXT NOT NULL,
    account      TEXT NOT NULL,
    -- in_flight | reconciling | succeeded | advanced | ended | abandoned
    state        TEXT NOT NULL,
    -- success | advance | terminal | unknown
    outcome      TEXT,
    error_class  TEXT,
    message      TEXT,
    instance_id  TEXT,
    started_ms   BIGINT NOT NULL,
    finished_ms  BIGINT,
    UNIQUE (sandbox_id, seq)
);

-- One holder per (workspace, key): the primary key is what makes two concurrent identical
-- creates have one winner (see Store::insert_sandbox).
CREATE TABLE idempotency_keys (
    workspace   TEXT NOT NULL,
    key         TEXT NOT NULL,
    body_hash   TEXT NOT NULL,
    sandbox_id  TEXT NOT NULL,
    expires_ms  BIGINT NOT NULL,
    PRIMARY KEY (workspace, key)
);

CREATE TABLE pool_samples (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pool        TEXT NOT NULL,
    at_ms       BIGINT NOT NULL,
    -- 1 or 0, as in SQLite.
    success     BIGINT NOT NULL,
    latency_ms  DOUBLE PRECISION
);
CREATE INDEX pool_samples_by_time ON pool_samples (at_ms);

-- An attempt whose instance may exist (or appear late) and must be deleted, tracked against
-- the attempt's own pool and account.
CREATE TABLE abandoned_instances (
    attempt_id   TEXT PRIMARY KEY,
    sandbox_id   TEXT NOT NULL,
    pool         TEXT NOT NULL,
    account      TEXT NOT NULL,
    reason       TEXT NOT NULL,
    recorded_ms  BIGINT NOT NULL,
    watch_until_ms BIGINT NOT NULL,
    deleted_instances BIGINT NOT NULL DEFAULT 0
);
