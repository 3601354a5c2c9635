-- Postgres twin of migrations/0008_changes.sql.
-- The change feed replicas follow (src/propagation.rs): one row per write that another
-- replica must act on (a sandbox whose egress identity appears or goes, a credential put or
-- deleted). `origin` is the writing replica, which skips its own rows. Rows are pruned
-- after an hour; a replica that was away longer reconciles in full instead.
CREATE TABLE changes (
    seq    BIGSERIAL PRIMARY KEY,
    kind   TEXT NOT NULL,
    key    TEXT NOT NULL,
    origin TEXT NOT NULL,
    at_ms  BIGINT NOT NULL
);
CREATE INDEX changes_by_time ON changes (at_ms);

-- Every committed change wakes the replicas LISTENing on `sandgate_changes` (NOTIFY is
-- delivered at commit, so a listener never reads a change before it is visible). The
-- payload is only a wake-up: listeners read the rows themselves, so a lost notification
-- costs latency, never a change.
CREATE FUNCTION sandgate_notify_change() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('sandgate_changes', NEW.seq::text);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER changes_notify AFTER INSERT ON changes
    FOR EACH ROW EXECUTE FUNCTION sandgate_notify_change();
