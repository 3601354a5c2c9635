//! A bounded in-memory ring of the most recent decision records, for `GET /v1/decisions`,
//! `GET /v1/decisions/stream` and `sandgate logs`.
//!
//! Contract:
//! - Bounded twice: at most `[log] decisions_ring` records and `[log] decisions_ring_bytes`
//!   bytes (each record counts its JSON text, its filter fields and a fixed overhead). When a
//!   push would pass either bound the oldest records are evicted; a record larger than the
//!   byte bound alone is not kept at all (counted in
//!   `sandgate_decision_ring_dropped_total`). `decisions_ring = 0` disables the ring.
//! - Records are kept as their serialized JSON line (the exact bytes the decision log
//!   writes), not as a JSON tree: a ~2 KB record costs ~2 KB, not the tens of small
//!   allocations a `serde_json::Value` would.
//! - Each record gets a sequence number, growing by one per record from 1, which is the
//!   cursor of the list and the event id of the stream. Numbers restart with the process.
//! - The ring is fed by the decision log's writer thread (off the request path) whether or
//!   not the log has a sink, so it works with `[log] decisions = "off"`.
//! - It is per process: on a deployment split by role, egress decisions are in the ring of
//!   the replica running the proxy. Nothing is persisted in the store.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// Overhead charged per record beyond its bytes: the `Stored` struct, its `Arc` and the
/// ring's slot, rounded up.
const RECORD_OVERHEAD: usize = 128;

/// The ring's bounds (`[log] decisions_ring`, `[log] decisions_ring_bytes`).
#[derive(Debug, Clone, Copy)]
pub struct RingLimits {
    pub max_records: usize,
    pub max_bytes: usize,
}

/// One kept record: the fields the API filters on, and the record's JSON text.
#[derive(Debug)]
pub struct Stored {
    pub seq: u64,
    /// When the record entered the ring (milliseconds since the epoch): what `since` reads.
    pub at_ms: u64,
    pub sandbox: Option<Box<str>>,
    pub workspace: Option<Box<str>>,
    pub layer: &'static str,
    /// `allow`, `deny`, `error` (an evaluation error, which denies) or another outcome a
    /// layer records.
    pub decision: &'static str,
    pub json: Box<[u8]>,
}

impl Stored {
    fn cost(&self) -> usize {
        RECORD_OVERHEAD
            + self.json.len()
            + self.sandbox.as_deref().map_or(0, str::len)
            + self.workspace.as_deref().map_or(0, str::len)
    }
}

/// What a new record is filed under.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    pub sandbox: Option<String>,
    pub workspace: Option<String>,
    pub layer: &'static str,
    pub decision: &'static str,
}

/// Which records a reader wants; `None` matches anything.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub sandbox: Option<String>,
    pub workspace: Option<String>,
    pub layer: Option<String>,
    /// `deny` matches every refusal (`deny` and `error`); any other value matches exactly.
    pub decision: Option<String>,
    /// Only records at or after this time (milliseconds since the epoch).
    pub since_ms: Option<u64>,
}

impl Filter {
    pub fn matches(&self, r: &Stored) -> bool {
        let same = |want: &Option<String>, have: Option<&str>| {
            want.as_deref().is_none_or(|w| have == Some(w))
        };
        same(&self.sandbox, r.sandbox.as_deref())
            && same(&self.workspace, r.workspace.as_deref())
            && same(&self.layer, Some(r.layer))
            && self
                .decision
                .as_deref()
                .is_none_or(|d| d == r.decision || (d == "deny" && r.decision == "error"))
            && self.since_ms.is_none_or(|s| r.at_ms >= s)
    }
}

/// What [`DecisionRing::after`] found past a cursor.
#[derive(Debug)]
pub struct After {
    pub records: Vec<Arc<Stored>>,
    /// Records after the cursor were evicted before they were read: the reader missed them.
    pub missed: bool,
    /// The cursor to read on from.
    pub cursor: u64,
}

#[derive(Default)]
struct Inner {
    items: VecDeque<Arc<Stored>>,
    bytes: usize,
    next_seq: u64,
}

pub struct DecisionRing {
    limits: RingLimits,
    /// `sandgate_decision_ring_bytes`, looked up once (a lookup per record hashed the
    /// name into the registry each time), in the scope the gateway starts in.
    bytes_gauge: metrics::Gauge,
    inner: Mutex<Inner>,
    /// The newest sequence number, for streams waiting on the next record.
    latest: watch::Sender<u64>,
}

impl std::fmt::Debug for DecisionRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionRing")
            .field("limits", &self.limits)
            .finish()
    }
}

impl DecisionRing {
    /// `None` when the ring is disabled (`max_records` or `max_bytes` is 0).
    pub fn new(limits: RingLimits) -> Option<Arc<DecisionRing>> {
        if limits.max_records == 0 || limits.max_bytes == 0 {
            return None;
        }
        Some(Arc::new(DecisionRing {
            limits,
            bytes_gauge: metrics::gauge!("sandgate_decision_ring_bytes"),
            inner: Mutex::new(Inner {
                next_seq: 1,
                ..Inner::default()
            }),
            latest: watch::channel(0).0,
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps one record (its JSON line without the newline), evicting the oldest as needed.
    /// Keeps `json` (which should be allocated to its length: the ring counts its length,
    /// the allocator the block) under `meta`.
    pub fn push(&self, meta: Meta, json: Box<[u8]>) {
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut stored = Stored {
            seq: 0,
            at_ms,
            sandbox: meta.sandbox.map(String::into_boxed_str),
            workspace: meta.workspace.map(String::into_boxed_str),
            layer: meta.layer,
            decision: meta.decision,
            json,
        };
        let cost = stored.cost();
        if cost > self.limits.max_bytes {
            metrics::counter!("sandgate_decision_ring_dropped_total").increment(1);
            return;
        }
        let seq = {
            let mut inner = self.lock();
            while inner.items.len() >= self.limits.max_records
                || inner.bytes + cost > self.limits.max_bytes
            {
                let Some(old) = inner.items.pop_front() else {
                    break;
                };
                inner.bytes -= old.cost();
            }
            stored.seq = inner.next_seq;
            inner.next_seq += 1;
            inner.bytes += cost;
            inner.items.push_back(Arc::new(stored));
            self.bytes_gauge.set(inner.bytes as f64);
            inner.next_seq - 1
        };
        self.latest.send_replace(seq);
    }

    /// (records, bytes) held now.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.items.len(), inner.bytes)
    }

    /// The newest sequence number (0 before the first record).
    pub fn latest(&self) -> u64 {
        *self.latest.borrow()
    }

    /// A receiver that changes whenever a record is pushed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    /// One page, newest first: up to `limit` matching records with a sequence number below
    /// `before` (all when `None`), and the cursor of the next page when there may be more.
    pub fn page(
        &self,
        filter: &Filter,
        before: Option<u64>,
        limit: usize,
    ) -> (Vec<Arc<Stored>>, Option<u64>) {
        let inner = self.lock();
        let end = before.map_or(inner.items.len(), |b| {
            inner.items.partition_point(|r| r.seq < b)
        });
        let mut page = Vec::with_capacity(limit.min(256));
        for record in inner.items.range(..end).rev() {
            if page.len() == limit {
                let next = page.last().map(|r: &Arc<Stored>| r.seq);
                return (page, next);
            }
            if filter.matches(record) {
                page.push(record.clone());
            }
        }
        (page, None)
    }

    /// Up to `max` matching records after sequence number `cursor`, oldest first. Cursor 0
    /// reads from the oldest kept record and never reports a miss.
    pub fn after(&self, filter: &Filter, cursor: u64, max: usize) -> After {
        let inner = self.lock();
        // A cursor past the newest record is from an earlier process: read on from now.
        let cursor = cursor.min(inner.next_seq - 1);
        let oldest = inner.items.front().map_or(inner.next_seq, |r| r.seq);
        let missed = cursor > 0 && cursor.saturating_add(1) < oldest;
        let start = inner.items.partition_point(|r| r.seq <= cursor);
        let mut records = Vec::new();
        let mut last = cursor.max(oldest.saturating_sub(1));
        for record in inner.items.range(start..) {
            if records.len() == max {
                break;
            }
            last = record.seq;
            if filter.matches(record) {
                records.push(record.clone());
            }
        }
        if start == inner.items.len() {
            last = last.max(inner.next_seq - 1);
        }
        After {
            records,
            missed,
            cursor: last,
        }
    }
}

#[cfg(test)]
#[path = "decision_ring_tests.rs"]
mod tests;
