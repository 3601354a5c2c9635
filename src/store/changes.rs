//! The change feed: writes another replica must act on, in commit order.
//!
//! Replicas keep two things in memory that other replicas' writes change: the egress
//! identities of running sandboxes and the opened credentials. Each such write also appends
//! a row here (`kind`, `key`, the writing replica as `origin`), and every replica follows
//! the feed (`crate::propagation`): it reads the rows after the last one it saw, skips its
//! own, and re-reads the named object's current state (a row says *what* changed, never
//! how, so applying one twice or late is harmless).
//!
//! On Postgres an insert trigger NOTIFYs `sandgate_changes` at commit, so followers wake at
//! once ([`ChangeListener`]); on SQLite (replicas on one host) they poll. A sandbox's change
//! row commits in the same transaction as its state; a credential's is recorded right after
//! its write (best effort: one that fails to record, or a lost notification, is repaired by
//! the followers' periodic full reconcile).

use std::time::Duration;

use sqlx::postgres::PgListener;

use super::{Backend, Store, StoreError, StoreRow};
use crate::base::clock::now_ms;

/// A sandbox whose egress identity may have appeared or gone; key: its id.
pub const SANDBOX: &str = "sandbox";
/// A credential put or deleted; key: [`credential_key`].
pub const CREDENTIAL: &str = "credential";

/// Appends one change: `(kind, key, origin, at_ms)`. Sandbox writes run it inside their own
/// transaction, so the change commits with the state it announces.
pub(crate) const RECORD: &str =
    "INSERT INTO changes (kind, key, origin, at_ms) VALUES ($1, $2, $3, $4)";

/// The Postgres channel the insert trigger notifies (migrations/postgres/0008_changes.sql).
pub const CHANNEL: &str = "sandgate_changes";

/// A credential's key in the feed: `[workspace, name]` as JSON, unambiguous whatever the
/// names contain.
pub fn credential_key(workspace: &str, name: &str) -> String {
    serde_json::json!([workspace, name]).to_string()
}

/// The inverse of [`credential_key`]; `None` for a key it did not write.
pub fn parse_credential_key(key: &str) -> Option<(String, String)> {
    let [workspace, name]: [String; 2] = serde_json::from_str(key).ok()?;
    Some((workspace, name))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeRow {
    pub seq: i64,
    pub kind: String,
    pub key: String,
    pub origin: String,
    pub at_ms: i64,
}

fn from_row(r: &impl StoreRow) -> Result<ChangeRow, sqlx::Error> {
    Ok(ChangeRow {
        seq: r.col("seq")?,
        kind: r.col("kind")?,
        key: r.col("key")?,
        origin: r.col("origin")?,
        at_ms: r.col("at_ms")?,
    })
}

impl Store {
    /// Appends a change as this store's origin. Never fails the caller: its write has
    /// committed already, and a change that is not recorded is found by the reconcile.
    pub(crate) async fn record_change(&self, kind: &str, key: &str) -> Result<(), StoreError> {
        let result = with_pool!(self, pool => sqlx::query(RECORD)
            .bind(kind)
            .bind(key)
            .bind(&*self.origin)
            .bind(now_ms())
            .execute(pool)
            .await
            .map(|r| r.rows_affected()));
        if let Err(e) = result {
            metrics::counter!("sandgate_changes_unrecorded_total").increment(1);
            tracing::warn!(kind, error = %e, "could not record a change for the other replicas; their reconcile will repair it");
        }
        Ok(())
    }

    /// Changes with `after < seq <= upto`, oldest first, at most `limit`: every origin's
    /// (a follower skips its own itself, so that a gap in the numbers always means a row it
    /// has not seen: on Postgres a sequence number is taken at insert and becomes visible
    /// at commit, so two writers can commit out of order).
    pub async fn changes_between(
        &self,
        after: i64,
        upto: i64,
        limit: i64,
    ) -> Result<Vec<ChangeRow>, StoreError> {
        const SQL: &str = "SELECT seq, kind, key, origin, at_ms FROM changes
             WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3";
        Ok(with_pool!(self, pool => sqlx::query(SQL)
            .bind(after)
            .bind(upto)
            .bind(limit)
            .fetch_all(pool)
            .await?
            .iter()
            .map(from_row)
            .collect::<Result<_, _>>()?))
    }

    /// The replica this store writes as.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The newest change's sequence number (0 when there is none): where a starting
    /// replica begins following, after loading the current state.
    pub async fn last_change_seq(&self) -> Result<i64, StoreError> {
        const SQL: &str = "SELECT COALESCE(MAX(seq), 0) AS seq FROM changes";
        Ok(with_pool!(self, pool => sqlx::query(SQL)
            .fetch_one(pool)
            .await?
            .col::<i64>("seq")?))
    }

    /// Deletes changes older than `before_ms`; returns how many.
    pub async fn prune_changes(&self, before_ms: i64) -> Result<u64, StoreError> {
        const SQL: &str = "DELETE FROM changes WHERE at_ms < $1";
        Ok(with_pool!(self, pool => sqlx::query(SQL)
            .bind(before_ms)
            .execute(pool)
            .await?
            .rows_affected()))
    }

    /// A listener woken by every committed change, on Postgres; `None` on SQLite, which has
    /// no notifications (followers poll it).
    pub async fn listen_changes(&self) -> Result<Option<ChangeListener>, StoreError> {
        let Backend::Postgres(pool) = &self.backend else {
            return Ok(None);
        };
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(CHANNEL).await?;
        Ok(Some(ChangeListener(listener)))
    }
}

/// Wake-ups from Postgres `NOTIFY sandgate_changes`.
pub struct ChangeListener(PgListener);

impl ChangeListener {
    /// Waits for the next notification. After a lost connection, sqlx reconnects and
    /// listens again; the notifications sent meanwhile are lost, so this returns (as a
    /// wake-up) and the follower reads the feed, which has them all.
    pub async fn recv(&mut self) -> Result<(), StoreError> {
        match self.0.try_recv().await {
            Ok(Some(_)) => Ok(()),
            // The connection dropped: the next call reconnects. Say so as a wake-up.
            Ok(None) => Ok(()),
            Err(e) => {
                // Do not spin on a database that is down.
                tokio::time::sleep(Duration::from_millis(500)).await;
                Err(e.into())
            }
        }
    }
}
