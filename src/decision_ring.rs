//! A bounded in-memory ring of the most recent decision records, for `GET /v1/decisions`,
//! `GET /v1/decisions/stream` and `sandgate logs`.
//!
//! Contract:
//! - Bounded twice: at most `[log] decisions_ring` records and `[log] decisions_ring_bytes`
//!   bytes (each record counts its JSON text, its filter fields and a fixed overhead). When a
//!   push passes either bound, the oldest records are evicted; a record larger than the byte
//!   bound alone is not kept at all (counted in `sandgate_decision_ring_dropped_total`).
//!   `decisions_ring = 0` disables the ring.
//! - Each record gets a sequence number, growing by one per record from 1, which is the
//!   cursor of the list and the event id of the stream. Numbers restart with the process.
//!   A reader whose cursor is below a number already evicted is told it missed records.
//! - Records are kept as their serialized JSON line (the exact bytes the decision log
//!   writes), not as a JSON tree, in one byte arena of `decisions_ring_bytes` allocated at
//!   the first push and written in a circle ([`Arena`]); readers get copies.
//! - Who feeds it: with no sink and no export (`[log] decisions = "off"`), the egress proxy
//!   renders its records itself and files them here, on the thread that made them;
//!   otherwise the decision log's writer thread, which renders each record once for every
//!   reader. Policy records always come through the writer.
//! - It is per process: on a deployment split by role, egress decisions are in the ring of
//!   the replica running the proxy. Nothing is persisted in the store.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// Overhead charged per record beyond its bytes: its [`Slot`] in the index, rounded up.
const RECORD_OVERHEAD: usize = 96;

/// The ring's bounds (`[log] decisions_ring`, `[log] decisions_ring_bytes`).
#[derive(Debug, Clone, Copy)]
pub struct RingLimits {
    pub max_records: usize,
    pub max_bytes: usize,
}

/// A record as a reader gets it: a copy of the fields the API filters on and of the
/// record's JSON text.
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
    /// What the record counted against the byte bound while the ring held it.
    #[cfg(test)]
    fn cost(&self) -> usize {
        cost(
            self.sandbox.as_deref(),
            self.workspace.as_deref(),
            self.json.len(),
        )
    }
}

fn cost(sandbox: Option<&str>, workspace: Option<&str>, json: usize) -> usize {
    RECORD_OVERHEAD + sandbox.map_or(0, str::len) + workspace.map_or(0, str::len) + json
}

/// What a new record is filed under.
#[derive(Debug, Clone, Copy, Default)]
pub struct Meta<'a> {
    pub sandbox: Option<&'a str>,
    pub workspace: Option<&'a str>,
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
    fn matches(&self, r: &Meta<'_>, at_ms: u64) -> bool {
        let same = |want: &Option<String>, have: Option<&str>| {
            want.as_deref().is_none_or(|w| have == Some(w))
        };
        same(&self.sandbox, r.sandbox)
            && same(&self.workspace, r.workspace)
            && same(&self.layer, Some(r.layer))
            && self
                .decision
                .as_deref()
                .is_none_or(|d| d == r.decision || (d == "deny" && r.decision == "error"))
            && self.since_ms.is_none_or(|s| at_ms >= s)
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

/// One kept record: where its bytes are in the arena (sandbox, workspace, then the JSON
/// line, back to back) and what it is filed under.
#[derive(Debug)]
struct Slot {
    seq: u64,
    at_ms: u64,
    /// The arena position of its first byte (positions only grow; the offset is the
    /// position modulo the arena's length).
    at: u64,
    sandbox: Option<u32>,
    workspace: Option<u32>,
    json: u32,
    layer: &'static str,
    decision: &'static str,
}

impl Slot {
    /// What it counts against the byte bound (as [`cost`] counted it when pushed).
    fn cost(&self) -> usize {
        RECORD_OVERHEAD
            + (self.sandbox.unwrap_or(0) + self.workspace.unwrap_or(0) + self.json) as usize
    }
}

/// The records' bytes, written in a circle. A record is never split at the end: one that
/// does not fit before it starts again at the beginning (the gap counts as used until
/// the records before it go).
///
/// Why one arena and not an allocation per record: the proxy's workers file their records
/// themselves (see the module docs), and a line allocated per request among a tunnel's own
/// allocations stayed behind when the tunnel closed: live ring lines scattered over the
/// workers' allocator pages kept those pages from going back (10,000 tunnels that carried a
/// request each left RSS +13.8 to +20.6 MiB over its level before they opened, and h2
/// tunnels +18.6 to +26.6 MiB, from run to run; +17.0 and +17.0 MiB with the arena, its
/// own 4 MiB included). The arena is allocated once, zeroed by the
/// allocator (so its pages are resident only once written), and never freed or moved
/// while the process runs; pushing a record is a copy into it.
struct Arena {
    bytes: Box<[u8]>,
    /// The position the next record's first byte would be written at.
    end: u64,
}

impl Arena {
    fn new(len: usize) -> Arena {
        Arena {
            bytes: vec![0u8; len].into_boxed_slice(),
            end: 0,
        }
    }

    fn size(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Where a record of `len` bytes goes: at the end, or at the beginning when it would
    /// run past the arena's last byte.
    fn place(&self, len: u64) -> u64 {
        let offset = self.end % self.size();
        if offset + len > self.size() {
            self.end + (self.size() - offset)
        } else {
            self.end
        }
    }

    fn write(&mut self, at: u64, parts: [&[u8]; 3]) {
        let mut offset = (at % self.size()) as usize;
        for part in parts {
            self.bytes[offset..offset + part.len()].copy_from_slice(part);
            offset += part.len();
        }
        self.end = at + parts.iter().map(|p| p.len() as u64).sum::<u64>();
    }

    /// The sandbox, workspace and JSON of `slot`.
    fn read(&self, slot: &Slot) -> (Option<&str>, Option<&str>, &[u8]) {
        let start = (slot.at % self.size()) as usize;
        let sandbox_end = start + slot.sandbox.unwrap_or(0) as usize;
        let workspace_end = sandbox_end + slot.workspace.unwrap_or(0) as usize;
        // Written from `&str`s by `push`, so never invalid; an empty name if it were.
        let text = |range: std::ops::Range<usize>| {
            std::str::from_utf8(&self.bytes[range]).unwrap_or_default()
        };
        (
            slot.sandbox.map(|_| text(start..sandbox_end)),
            slot.workspace.map(|_| text(sandbox_end..workspace_end)),
            &self.bytes[workspace_end..workspace_end + slot.json as usize],
        )
    }
}

struct Inner {
    /// Allocated at the first push.
    arena: Option<Arena>,
    slots: VecDeque<Slot>,
    next_seq: u64,
    /// Bytes counted against the byte bound ([`cost`] of every slot).
    bytes: usize,
    /// The highest sequence number evicted so far: a reader whose cursor is below it
    /// missed records.
    evicted_max: u64,
}

impl Inner {
    fn position(&self, seq: u64) -> usize {
        self.slots.partition_point(|r| r.seq < seq)
    }

    fn meta<'a>(&'a self, slot: &'a Slot) -> Meta<'a> {
        let (sandbox, workspace, _) = self.arena().read(slot);
        Meta {
            sandbox,
            workspace,
            layer: slot.layer,
            decision: slot.decision,
        }
    }

    fn arena(&self) -> &Arena {
        // A slot exists only once a push has allocated the arena.
        self.arena
            .as_ref()
            .expect("the arena of a ring holding records")
    }

    /// A reader's copy of `slot`.
    fn copy(&self, slot: &Slot) -> Arc<Stored> {
        let (sandbox, workspace, json) = self.arena().read(slot);
        Arc::new(Stored {
            seq: slot.seq,
            at_ms: slot.at_ms,
            sandbox: sandbox.map(Box::from),
            workspace: workspace.map(Box::from),
            layer: slot.layer,
            decision: slot.decision,
            json: Box::from(json),
        })
    }

    fn evict(&mut self) {
        if let Some(old) = self.slots.pop_front() {
            self.bytes -= old.cost();
            self.evicted_max = old.seq;
        }
    }

    /// Whether a record placed at arena position `at`, `len` long, would overwrite a kept one.
    fn overlaps(&self, at: u64, len: u64) -> bool {
        self.slots
            .front()
            .is_some_and(|oldest| at + len - oldest.at > self.arena().size())
    }
}

pub struct DecisionRing {
    limits: RingLimits,
    /// `sandgate_decision_ring_bytes`, looked up once (a lookup per record hashed the
    /// name into the registry each time), in the scope the gateway starts in.
    bytes_gauge: metrics::Gauge,
    /// One lock: a push holds it for a copy of a line (a few hundred nanoseconds), which
    /// the proxy's workers do not wait on measurably.
    inner: Mutex<Inner>,
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
                arena: None,
                slots: VecDeque::new(),
                next_seq: 1,
                bytes: 0,
                evicted_max: 0,
            }),
            latest: watch::channel(0).0,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps one record (its JSON line without the newline) under `meta` and the next
    /// sequence number, evicting the oldest records until both bounds hold and its bytes
    /// fit in the arena.
    pub fn push(&self, meta: Meta<'_>, json: &[u8]) {
        let cost = cost(meta.sandbox, meta.workspace, json.len());
        // Lengths are kept as u32: a record that long is over any sensible bound anyway.
        if cost > self.limits.max_bytes || cost > u32::MAX as usize {
            metrics::counter!("sandgate_decision_ring_dropped_total").increment(1);
            return;
        }
        let len32 = |s: &str| s.len() as u32;
        let len = (cost - RECORD_OVERHEAD) as u64;
        let seq = {
            let mut inner = self.lock();
            let at = inner
                .arena
                .get_or_insert_with(|| Arena::new(self.limits.max_bytes))
                .place(len);
            while inner.slots.len() >= self.limits.max_records
                || inner.bytes + cost > self.limits.max_bytes
                || inner.overlaps(at, len)
            {
                inner.evict();
            }
            if let Some(arena) = inner.arena.as_mut() {
                let sandbox = meta.sandbox.unwrap_or_default().as_bytes();
                let workspace = meta.workspace.unwrap_or_default().as_bytes();
                arena.write(at, [sandbox, workspace, json]);
            }
            let seq = inner.next_seq;
            inner.next_seq += 1;
            inner.slots.push_back(Slot {
                seq,
                at_ms: now_ms(),
                at,
                sandbox: meta.sandbox.map(len32),
                workspace: meta.workspace.map(len32),
                json: json.len() as u32,
                layer: meta.layer,
                decision: meta.decision,
            });
            inner.bytes += cost;
            self.bytes_gauge.set(inner.bytes as f64);
            seq
        };
        if self.latest.receiver_count() > 0 {
            self.latest.send_replace(seq);
        }
    }

    /// (records, bytes) held now.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.slots.len(), inner.bytes)
    }

    /// The newest sequence number (0 before the first record).
    pub fn latest(&self) -> u64 {
        self.lock().next_seq - 1
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
        let end = inner.position(before.unwrap_or(u64::MAX));
        let mut found = Vec::new();
        let mut more = false;
        for slot in inner.slots.range(..end).rev() {
            if !filter.matches(&inner.meta(slot), slot.at_ms) {
                continue;
            }
            if found.len() == limit {
                // Another match below: the page goes on.
                more = true;
                break;
            }
            found.push(inner.copy(slot));
        }
        let next = found.last().map(|r| r.seq).filter(|_| more);
        (found, next)
    }

    /// Up to `max` matching records after sequence number `cursor`, oldest first. Cursor 0
    /// reads from the oldest kept record and never reports a miss.
    pub fn after(&self, filter: &Filter, cursor: u64, max: usize) -> After {
        let inner = self.lock();
        let newest = inner.next_seq - 1;
        // A cursor past the newest record is from an earlier process: read on from now.
        let cursor = cursor.min(newest);
        let missed = cursor > 0 && cursor < inner.evicted_max;
        let from = inner.position(cursor.saturating_add(1));
        let mut records = Vec::new();
        let mut last = cursor.max(inner.slots.front().map_or(newest, |s| s.seq - 1));
        let mut rest = inner.slots.range(from..).peekable();
        while records.len() < max {
            let Some(slot) = rest.next() else { break };
            last = slot.seq;
            if filter.matches(&inner.meta(slot), slot.at_ms) {
                records.push(inner.copy(slot));
            }
        }
        if rest.peek().is_none() {
            last = newest;
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
