-- The change feed replicas follow (src/propagation.rs): one row per write that another
-- replica must act on (a sandbox whose egress identity appears or goes, a credential put or
-- deleted). `origin` is the writing replica, which skips its own rows. Rows are pruned
-- after an hour; a replica that was away longer reconciles in full instead.
CREATE TABLE changes (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    kind   TEXT NOT NULL,
    key    TEXT NOT NULL,
    origin TEXT NOT NULL,
    at_ms  INTEGER NOT NULL
);
CREATE INDEX changes_by_time ON changes (at_ms);
