//! Changes made through one replica reach every other replica.
//!
//! What each replica holds in memory and another replica's write can change: the egress
//! identities of sandboxes (created, deleted, failed) and the opened credentials (created,
//! rotated, deleted). Everything else is read from the store when it is used: delegations
//! (revocation is seen by the next request on any replica), idempotency keys, attempts. The
//! policy, and with it `data.sandgate.suspended_principals`, reaches replicas as files
//! (see `crate::replicas`).
//!
//! The contract:
//! - every such write appends a row to the store's change feed (`store::changes`);
//! - a [`Follower`] on each replica reads the feed after the last row it saw: at once when
//!   Postgres NOTIFYs `sandgate_changes` (the insert trigger fires at commit), and every
//!   `[store] poll_changes_ms` otherwise (SQLite, or a notification that was lost);
//! - a row names an object, not a new value: the follower re-reads the object and brings
//!   its memory in line (`Coordinator::follow`, `CredentialStore::refresh`), so a row
//!   applied twice, late or out of order does no harm. A deleted sandbox's identity is
//!   revoked, which ends its open tunnels on that replica;
//! - sequence numbers that appear out of order (two Postgres writers commit in the other
//!   order) are remembered as gaps and read again until they show up or [`GAP_WAIT`] passes;
//! - every `[store] reconcile_secs`, the follower compares all it holds with the store
//!   and repairs the difference (the safety net for a change that was never recorded),
//!   and prunes feed rows older than [`RETAIN`].
//!
//! Metrics: `sandgate_changes_applied_total{kind}`, `sandgate_change_delay_seconds` (from
//! the write's timestamp to its application here), `sandgate_reconcile_repaired_total{kind}`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::base::clock::now_ms;
use crate::create::Coordinator;
use crate::credentials::CredentialStore;
use crate::store::changes::{self, ChangeRow};
use crate::store::{Store, StoreError};

/// Rows read per query.
const BATCH: i64 = 500;
/// How long a missing sequence number is waited for before it is taken as a rolled-back
/// insert (which Postgres never fills).
pub const GAP_WAIT: Duration = Duration::from_secs(10);
/// At most this many missing numbers are tracked; a larger jump is left to the reconcile.
const MAX_GAPS: i64 = 10_000;
/// Feed rows older than this are deleted (by any replica's reconcile).
pub const RETAIN: Duration = Duration::from_secs(3600);

/// Where a follower is in the feed.
#[derive(Debug)]
pub struct Cursor {
    last_seq: i64,
    gaps: BTreeMap<i64, Instant>,
}

impl Cursor {
    /// The feed's current end. Taken before the replica loads its state from the store, so
    /// that nothing written between the two is missed.
    pub async fn at_end(store: &Store) -> Result<Cursor, StoreError> {
        Ok(Cursor {
            last_seq: store.last_change_seq().await?,
            gaps: BTreeMap::new(),
        })
    }
}

/// Applies other replicas' changes to this replica's memory.
pub struct Follower {
    pub store: Store,
    pub sandboxes: Arc<Coordinator>,
    pub credentials: Arc<CredentialStore>,
    pub poll: Duration,
    /// `None`: no periodic reconcile.
    pub reconcile: Option<Duration>,
}

impl Follower {
    /// Follows the feed from `cursor` until the task is aborted.
    pub fn spawn(self, mut cursor: Cursor) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut listener = match self.store.listen_changes().await {
                Ok(listener) => listener,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot LISTEN for changes; polling only");
                    None
                }
            };
            let mut poll = tokio::time::interval(self.poll);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let every = self.reconcile.unwrap_or(Duration::from_secs(86_400 * 365));
            let mut reconcile =
                tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tokio::select! {
                    woke = wake(&mut listener) => {
                        if let Err(e) = woke {
                            tracing::warn!(error = %e, "change notifications interrupted");
                        }
                    }
                    _ = poll.tick() => {}
                    _ = reconcile.tick(), if self.reconcile.is_some() => self.reconcile().await,
                }
                if let Err(e) = self.catch_up(&mut cursor).await {
                    tracing::warn!(error = %e, "could not read the change feed");
                }
            }
        })
    }

    /// Applies every unseen row of other origins; returns how many it applied.
    pub async fn catch_up(&self, cursor: &mut Cursor) -> Result<usize, StoreError> {
        let mut applied = 0;
        loop {
            let rows = self
                .store
                .changes_between(cursor.last_seq, i64::MAX, BATCH)
                .await?;
            for row in &rows {
                note_gaps(cursor, row.seq);
                // Advanced only once applied: a row that failed is read again next time.
                applied += self.apply(row).await?;
                cursor.last_seq = row.seq;
            }
            if (rows.len() as i64) < BATCH {
                break;
            }
        }
        applied += self.fill_gaps(cursor).await?;
        Ok(applied)
    }

    /// Reads the missing numbers again: a late commit shows up as one of them.
    async fn fill_gaps(&self, cursor: &mut Cursor) -> Result<usize, StoreError> {
        cursor.gaps.retain(|_, seen| seen.elapsed() < GAP_WAIT);
        let Some((&first, _)) = cursor.gaps.first_key_value() else {
            return Ok(0);
        };
        let rows = self
            .store
            .changes_between(first - 1, cursor.last_seq, MAX_GAPS)
            .await?;
        let mut applied = 0;
        for row in rows {
            if cursor.gaps.remove(&row.seq).is_some() {
                applied += self.apply(&row).await?;
            }
        }
        Ok(applied)
    }

    /// One row: its object re-read and brought in line. Own rows are skipped (this replica
    /// applied them when it wrote them). Returns 1 when it was another replica's.
    async fn apply(&self, row: &ChangeRow) -> Result<usize, StoreError> {
        if row.origin == self.store.origin() {
            return Ok(0);
        }
        match row.kind.as_str() {
            changes::SANDBOX => {
                self.sandboxes.follow(&row.key).await?;
            }
            changes::CREDENTIAL => {
                let Some((workspace, name)) = changes::parse_credential_key(&row.key) else {
                    return Ok(0);
                };
                if let Err(e) = self.credentials.refresh(&workspace, &name).await {
                    // An unreadable row (e.g. sealed under another key) must not stop the
                    // feed; the credential stays as this replica had it.
                    tracing::warn!(workspace, credential = name, error = %e, "could not apply a credential change");
                }
            }
            // A kind a newer replica writes: not this version's concern.
            _ => return Ok(0),
        }
        metrics::counter!("sandgate_changes_applied_total", "kind" => kind_label(&row.kind))
            .increment(1);
        let delay_ms = (now_ms() - row.at_ms).max(0);
        metrics::histogram!("sandgate_change_delay_seconds").record(delay_ms as f64 / 1000.0);
        Ok(1)
    }

    /// Everything held against the store, and old feed rows pruned.
    pub async fn reconcile(&self) {
        match self.sandboxes.reconcile_identities().await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(repaired = n, "reconcile: sandbox identities repaired");
                metrics::counter!("sandgate_reconcile_repaired_total", "kind" => "sandbox")
                    .increment(n as u64);
            }
            Err(e) => tracing::warn!(error = %e, "reconcile of sandbox identities failed"),
        }
        match self.credentials.reconcile().await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(repaired = n, "reconcile: credentials repaired");
                metrics::counter!("sandgate_reconcile_repaired_total", "kind" => "credential")
                    .increment(n as u64);
            }
            Err(e) => tracing::warn!(error = %e, "reconcile of credentials failed"),
        }
        let before = now_ms() - RETAIN.as_millis() as i64;
        if let Err(e) = self.store.prune_changes(before).await {
            tracing::warn!(error = %e, "could not prune the change feed");
        }
    }
}

/// Waits for a notification, or forever without a listener (SQLite: the poll wakes it).
async fn wake(listener: &mut Option<changes::ChangeListener>) -> Result<(), StoreError> {
    match listener {
        Some(listener) => listener.recv().await,
        None => std::future::pending().await,
    }
}

/// Numbers skipped between the last row and `seq` are remembered as gaps.
fn note_gaps(cursor: &mut Cursor, seq: i64) {
    let missing = seq - cursor.last_seq - 1;
    if missing <= 0 || missing > MAX_GAPS || cursor.last_seq == 0 {
        // Nothing missing; a jump too large to track (the reconcile covers it); or the
        // first read of an empty feed, which may start anywhere.
        return;
    }
    let now = Instant::now();
    for missing in cursor.last_seq + 1..seq {
        cursor.gaps.insert(missing, now);
    }
    while cursor.gaps.len() as i64 > MAX_GAPS {
        cursor.gaps.pop_first();
    }
}

/// Metric labels come from a fixed set, never from stored text.
fn kind_label(kind: &str) -> &'static str {
    match kind {
        changes::SANDBOX => changes::SANDBOX,
        changes::CREDENTIAL => changes::CREDENTIAL,
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(last_seq: i64) -> Cursor {
        Cursor {
            last_seq,
            gaps: BTreeMap::new(),
        }
    }

    #[test]
    fn skipped_numbers_become_gaps_and_large_jumps_do_not() {
        let mut c = cursor(5);
        note_gaps(&mut c, 6);
        assert!(c.gaps.is_empty());
        c.last_seq = 6;
        note_gaps(&mut c, 9);
        assert_eq!(c.gaps.keys().copied().collect::<Vec<_>>(), [7, 8]);
        let mut c = cursor(1);
        note_gaps(&mut c, 1 + MAX_GAPS + 2);
        assert!(c.gaps.is_empty(), "left to the reconcile");
    }
}
