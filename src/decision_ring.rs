//! A bounded in-memory ring of the most recent decision records, for `GET /v1/decisions`,
//! `GET /v1/decisions/stream` and `sandgate logs`.
//!
//! Contract:
//! - Bounded twice: at most `[log] decisions_ring` records and `[log] decisions_ring_bytes`
//!   bytes (each record counts its JSON text, its filter fields and a fixed overhead). When a
//!   push passes either bound, old records are evicted: the oldest of the pushing thread's
//!   shard first (below), then the oldest of another shard that is not locked at that moment
//!   (so threads pushing at once may each leave one record over the bound, until the next
//!   push); a record larger than the byte bound alone is not kept at all (counted in
//!   `sandgate_decision_ring_dropped_total`).
//!   `decisions_ring = 0` disables the ring.
//! - Sharded by the thread that pushes: each thread files its records in its own shard (a
//!   few per core), so the proxy's workers do not share a lock, and free each other's
//!   records only when their own shard has nothing left to evict. A stream's read locks every
//!   shard at once and reads them merged in sequence order; a page reads one at a time. What is kept
//!   is therefore the newest records of each shard: a quiet thread's records may outlive a
//!   busy one's newer records.
//! - Each record gets a sequence number, growing by one per record from 1, which is the
//!   cursor of the list and the event id of the stream. Numbers restart with the process.
//!   A reader whose cursor is below a number already evicted is told it missed records.
//! - Records are kept as their serialized JSON line (the exact bytes the decision log
//!   writes), not as a JSON tree: a ~2 KB record costs ~2 KB, not the tens of small
//!   allocations a `serde_json::Value` would.
//! - Who feeds it: with no sink and no export (`[log] decisions = "off"`), the egress proxy
//!   renders its records itself and files them here, on the thread that made them;
//!   otherwise the decision log's writer thread, which renders each record once for every
//!   reader. Policy records always come through the writer.
//! - It is per process: on a deployment split by role, egress decisions are in the ring of
//!   the replica running the proxy. Nothing is persisted in the store.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
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

/// One shard: the records pushed by the threads assigned to it, in sequence order.
#[derive(Default)]
struct Inner {
    items: VecDeque<Arc<Stored>>,
}

impl Inner {
    fn position(&self, seq: u64) -> usize {
        self.items.partition_point(|r| r.seq < seq)
    }
}

/// Shards: each thread pushes into the one it was assigned (round robin, at its first
/// push), so a proxy worker's records are made, kept and, when evicted, freed on that
/// worker. Why: handing every record to another thread was the ring's largest cost, more
/// than rendering it (measured: keep-alive h1 through one worker, 42.3 µs of proxy CPU a
/// request with records sent to the writer thread, 33.4 µs with the same records built and
/// dropped where they were made, 31.9 µs with no ring), since each one's two dozen
/// allocations were then freed on the other core and came back to the worker cold.
/// (Rendering alone is not what costs: the writer thread was ~5% of the proxy's CPU
/// samples, rendering ~1%.)
fn shard_count() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .saturating_mul(2)
        .clamp(4, 64)
}

fn my_shard(count: usize) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    MINE.with(|n| *n % count)
}

pub struct DecisionRing {
    limits: RingLimits,
    /// `sandgate_decision_ring_bytes`, looked up once (a lookup per record hashed the
    /// name into the registry each time), in the scope the gateway starts in.
    bytes_gauge: metrics::Gauge,
    shards: Box<[Mutex<Inner>]>,
    /// The next sequence number, taken under the lock of the shard the record goes into,
    /// so a reader holding every shard's lock sees every number handed out so far.
    next_seq: AtomicU64,
    /// Records and bytes held, over all shards.
    records: AtomicUsize,
    /// The highest sequence number evicted so far: a reader whose cursor is below it missed
    /// records (shards evict on their own, so the oldest record kept does not tell).
    evicted_max: AtomicU64,
    bytes: AtomicUsize,
    /// The newest sequence number, for streams waiting on the next record; sent only while
    /// someone listens.
    latest: watch::Sender<u64>,
}

impl std::fmt::Debug for DecisionRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionRing")
            .field("limits", &self.limits)
            .finish()
    }
}

/// Every shard, locked in order: what readers see at once.
struct All<'a> {
    shards: Vec<MutexGuard<'a, Inner>>,
}

impl All<'_> {
    /// (shard, index) of the records at or after `from`, in sequence order, merged lazily
    /// (readers stop early; the shards stay locked while they read).
    fn merged(&self, from: u64) -> impl Iterator<Item = (usize, usize)> + '_ {
        let mut at: Vec<usize> = self.shards.iter().map(|s| s.position(from)).collect();
        std::iter::from_fn(move || {
            let i = (0..self.shards.len())
                .filter(|&i| at[i] < self.shards[i].items.len())
                .min_by_key(|&i| self.shards[i].items[at[i]].seq)?;
            at[i] += 1;
            Some((i, at[i] - 1))
        })
    }

    fn slot(&self, (shard, at): (usize, usize)) -> &Arc<Stored> {
        &self.shards[shard].items[at]
    }

    fn oldest(&self) -> Option<u64> {
        self.shards
            .iter()
            .filter_map(|s| s.items.front().map(|r| r.seq))
            .min()
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
            shards: (0..shard_count()).map(|_| Mutex::default()).collect(),
            next_seq: AtomicU64::new(1),
            records: AtomicUsize::new(0),
            evicted_max: AtomicU64::new(0),
            bytes: AtomicUsize::new(0),
            latest: watch::channel(0).0,
        }))
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Inner> {
        self.shards[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_all(&self) -> All<'_> {
        All {
            shards: (0..self.shards.len()).map(|i| self.lock(i)).collect(),
        }
    }

    /// Keeps one record (its JSON line without the newline) under `meta`, in this thread's
    /// shard and under the next sequence number, then evicts until both bounds hold again:
    /// this shard's oldest records first (freed by the thread that made them), then, when
    /// this shard has nothing else, the oldest of another shard it can lock without
    /// waiting. `json` should be allocated to its length: the ring counts its length, the
    /// allocator the block.
    pub fn push(&self, meta: Meta, json: Box<[u8]>) {
        let mut stored = Stored {
            seq: 0,
            at_ms: now_ms(),
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
        let mine = my_shard(self.shards.len());
        let seq = {
            let mut inner = self.lock(mine);
            let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
            stored.seq = seq;
            inner.items.push_back(Arc::new(stored));
            self.records.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(cost, Ordering::Relaxed);
            while self.over() && inner.items.len() > 1 {
                self.evict(&mut inner);
            }
            seq
        };
        while self.over() && self.evict_elsewhere(mine) {}
        self.bytes_gauge
            .set(self.bytes.load(Ordering::Relaxed) as f64);
        if self.latest.receiver_count() > 0 {
            self.latest.send_replace(seq);
        }
    }

    fn over(&self) -> bool {
        self.records.load(Ordering::Relaxed) > self.limits.max_records
            || self.bytes.load(Ordering::Relaxed) > self.limits.max_bytes
    }

    fn evict(&self, inner: &mut Inner) -> bool {
        let Some(old) = inner.items.pop_front() else {
            return false;
        };
        self.records.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_sub(old.cost(), Ordering::Relaxed);
        self.evicted_max.fetch_max(old.seq, Ordering::Relaxed);
        true
    }

    /// Evicts the oldest record of the other shards that are free to lock; false when
    /// there was none.
    fn evict_elsewhere(&self, mine: usize) -> bool {
        let mut oldest: Option<(u64, MutexGuard<'_, Inner>)> = None;
        for (i, shard) in self.shards.iter().enumerate() {
            if i == mine {
                continue;
            }
            let Ok(inner) = shard.try_lock() else {
                continue;
            };
            let Some(seq) = inner.items.front().map(|r| r.seq) else {
                continue;
            };
            if oldest.as_ref().is_none_or(|(o, _)| seq < *o) {
                oldest = Some((seq, inner));
            }
        }
        match oldest {
            Some((_, mut inner)) => self.evict(&mut inner),
            None => false,
        }
    }

    /// (records, bytes) held now.
    pub fn usage(&self) -> (usize, usize) {
        let _all = self.lock_all();
        (
            self.records.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }

    /// The newest sequence number (0 before the first record).
    pub fn latest(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed) - 1
    }

    /// A receiver that changes whenever a record is pushed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    /// One page, newest first: up to `limit` matching records with a sequence number below
    /// `before` (all when `None`), and the cursor of the next page when there may be more.
    /// Shards are read one at a time, so a page never holds up the proxy's pushes for
    /// longer than one shard takes to read; it is a view of each shard when it was read.
    pub fn page(
        &self,
        filter: &Filter,
        before: Option<u64>,
        limit: usize,
    ) -> (Vec<Arc<Stored>>, Option<u64>) {
        let before = before.unwrap_or(u64::MAX);
        let mut found = Vec::new();
        let mut more = false;
        for shard in 0..self.shards.len() {
            let inner = self.lock(shard);
            let end = inner.position(before);
            let mut taken = 0;
            for record in inner.items.range(..end).rev() {
                if taken == limit {
                    // Another record below: the page may go on.
                    more = true;
                    break;
                }
                if filter.matches(record) {
                    found.push(record.clone());
                    taken += 1;
                }
            }
        }
        found.sort_unstable_by_key(|r| std::cmp::Reverse(r.seq));
        more |= found.len() > limit;
        found.truncate(limit);
        let next = found.last().map(|r| r.seq).filter(|_| more);
        (found, next)
    }

    /// Up to `max` matching records after sequence number `cursor`, oldest first. Cursor 0
    /// reads from the oldest kept record and never reports a miss.
    pub fn after(&self, filter: &Filter, cursor: u64, max: usize) -> After {
        let all = self.lock_all();
        let next_seq = self.next_seq.load(Ordering::Relaxed);
        // A cursor past the newest record is from an earlier process: read on from now.
        let cursor = cursor.min(next_seq - 1);
        let oldest = all.oldest().unwrap_or(next_seq);
        let missed = cursor > 0 && cursor < self.evicted_max.load(Ordering::Relaxed);
        let mut order = all.merged(cursor.saturating_add(1)).peekable();
        let mut records = Vec::new();
        let mut last = cursor.max(oldest.saturating_sub(1));
        while records.len() < max {
            let Some(at) = order.next() else { break };
            let record = all.slot(at);
            last = record.seq;
            if filter.matches(record) {
                records.push(record.clone());
            }
        }
        if order.peek().is_none() {
            last = last.max(next_seq - 1);
        }
        After {
            records,
            missed,
            cursor: last,
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
#[path = "decision_ring_tests.rs"]
mod tests;
