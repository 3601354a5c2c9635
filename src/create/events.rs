//! A create's progress as a sequence of events, derived from the durable record (the sandbox
//! row and its attempts), never from the memory of the process driving the create: so a
//! stream works whichever replica drives it, and a client that connects late or reconnects
//! still gets every attempt, in order.
//!
//! Events, in the order of the record:
//! - `state` `{state, at_ms}`: the sandbox's state; the first event of a stream opened on a
//!   create in flight is the current state, later ones are sent when it changes; a stream
//!   opened after the create ended replays its attempts first, then the final state;
//! - `attempt_started` `{id, seq, pool, provider, account, started_ms}` and
//!   `attempt_ended` `{id, seq, pool, state, outcome, error_class, message, instance_id,
//!   duration_ms}`: for attempts ordered by `seq`, each one's start before its end, and an
//!   attempt's end before the next attempt's start (an attempt first seen already finished
//!   yields both, in that order);
//! - `done` `{state, error, placement}`: the last event, once the sandbox is no longer in
//!   flight ([`IN_FLIGHT_STATES`]); `error` is the stored error body (or null).
//!
//! Nothing here carries the egress token: the row's sealed token is never read.
//!
//! Each event's id is the stream's [`Cursor`] after it, encoded as one integer (see
//! [`Cursor::encode`]): ids grow along a stream, and handing the last one back
//! (`Last-Event-ID`) resumes exactly after it, in any process, with no per-stream state kept
//! on the server.

use std::time::Duration;

use serde_json::{json, Value};

use super::Coordinator;
use crate::store::sandboxes::{AttemptRow, SandboxRow, IN_FLIGHT_STATES};
use crate::store::StoreError;

/// How often a stream reads the record again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(150);

/// Known sandbox states; a state's code in an event id is its index here plus one.
const STATES: [&str; 8] = [
    "pending",
    "provisioning",
    "reconciling",
    "running",
    "paused",
    "stopped",
    "failed",
    "deleted",
];
/// The code of a state this build does not know (a newer replica's).
const OTHER_STATE: u8 = 15;

/// Bits of an encoded cursor, lowest first: 4 for the state code, 1 for `done`, 15 for
/// `since_slot`; the attempt slots above them.
const STATE_BITS: u32 = 4;
const DONE_BIT: u64 = 1 << STATE_BITS;
const SINCE_SHIFT: u32 = STATE_BITS + 1;
const SINCE_MAX: u16 = (1 << 15) - 1;
const SLOTS_SHIFT: u32 = SINCE_SHIFT + 15;
/// Slots that still fit above the other fields in 64 bits.
const SLOTS_MAX: u64 = (1 << (64 - SLOTS_SHIFT)) - 1;

/// How far a client has followed a create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    /// Attempt slots delivered (or passed over): attempt `k` (0-based, by `seq`) owns slot
    /// `2k` for its start and `2k + 1` for its end.
    pub slots: u64,
    /// `state` events sent since `slots` last moved; it only makes ids strictly increase.
    pub since_slot: u16,
    /// The code of the last state delivered; 0 before the first `state` event.
    pub state: u8,
    /// Whether `done` was delivered.
    pub done: bool,
}

impl Cursor {
    /// `slots << 20 | since_slot << 5 | done << 4 | state`. Every event moves the cursor
    /// forward in this order (an attempt event raises `slots`, any other raises
    /// `since_slot`), so the ids of one stream increase strictly.
    pub fn encode(self) -> u64 {
        (self.slots.min(SLOTS_MAX) << SLOTS_SHIFT)
            | (u64::from(self.since_slot.min(SINCE_MAX)) << SINCE_SHIFT)
            | if self.done { DONE_BIT } else { 0 }
            | u64::from(self.state)
    }

    /// The cursor an event id stands for; `None` for text no stream sent (not a decimal
    /// number, or an unknown state code).
    pub fn decode(id: &str) -> Option<Cursor> {
        let n: u64 = id.trim().parse().ok()?;
        let state = (n & ((1 << STATE_BITS) - 1)) as u8;
        if state as usize > STATES.len() && state != OTHER_STATE {
            return None;
        }
        Some(Cursor {
            slots: n >> SLOTS_SHIFT,
            since_slot: ((n >> SINCE_SHIFT) as u16) & SINCE_MAX,
            state,
            done: n & DONE_BIT != 0,
        })
    }
}

/// The kind of an event (its SSE `event:` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    State,
    AttemptStarted,
    AttemptEnded,
    Done,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::State => "state",
            EventKind::AttemptStarted => "attempt_started",
            EventKind::AttemptEnded => "attempt_ended",
            EventKind::Done => "done",
        }
    }
}

/// One event of a create's progress.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressEvent {
    /// The encoded cursor after this event (its SSE `id:`).
    pub id: u64,
    pub kind: EventKind,
    pub data: Value,
}

fn state_code(state: &str) -> u8 {
    STATES
        .iter()
        .position(|s| *s == state)
        .map_or(OTHER_STATE, |i| i as u8 + 1)
}

/// Whether the create is still being worked on (no `done` yet).
pub fn in_flight(row: &SandboxRow) -> bool {
    IN_FLIGHT_STATES.contains(&row.state.as_str())
}

/// The events `row` and `attempts` show beyond `cursor`, in order, and the cursor after them.
///
/// Read `row` before `attempts` (see [`Coordinator::progress`]): then every attempt that
/// ended before the row's state was written is in `attempts`. While the create is in flight,
/// an attempt that has not ended holds back later attempts' events (the order stays the
/// record's); once the create is over, the end of an attempt that never ended is passed
/// over so that the later attempts and `done` follow.
pub fn next_events(
    row: &SandboxRow,
    attempts: &[AttemptRow],
    cursor: Cursor,
) -> (Vec<ProgressEvent>, Cursor) {
    let mut out = Vec::new();
    let mut cursor = cursor;
    if cursor.done {
        return (out, cursor);
    }
    let code = state_code(&row.state);
    let over = !in_flight(row);
    // A stream opened on a create in flight starts with its current state. One opened after
    // the create ended replays the record as a live stream told it: the attempts first, then
    // the final state, then `done`, so a reader that stops at `state: running` has seen every
    // attempt (the final state first would hide them from it).
    if cursor.state == 0 && !over {
        push_state(&mut out, &mut cursor, row, code);
    }
    let mut sorted: Vec<&AttemptRow> = attempts.iter().collect();
    sorted.sort_by_key(|a| a.seq);
    attempt_events(&mut out, &mut cursor, &sorted, over);
    if cursor.state != code {
        push_state(&mut out, &mut cursor, row, code);
    }
    if over && cursor.slots >= 2 * sorted.len() as u64 {
        cursor.done = true;
        push_other(&mut out, &mut cursor, EventKind::Done, done_data(row));
    }
    (out, cursor)
}

fn attempt_events(
    out: &mut Vec<ProgressEvent>,
    cursor: &mut Cursor,
    attempts: &[&AttemptRow],
    over: bool,
) {
    loop {
        let Some(attempt) = usize::try_from(cursor.slots / 2)
            .ok()
            .and_then(|k| attempts.get(k))
        else {
            return;
        };
        let (kind, data) = if cursor.slots % 2 == 0 {
            (EventKind::AttemptStarted, started_data(attempt))
        } else if attempt.finished_ms.is_some() {
            (EventKind::AttemptEnded, ended_data(attempt))
        } else if over {
            // Never ended (the create was deleted meanwhile, say): nothing more will come.
            cursor.slots += 1;
            cursor.since_slot = 0;
            continue;
        } else {
            return;
        };
        cursor.slots += 1;
        cursor.since_slot = 0;
        out.push(ProgressEvent {
            id: cursor.encode(),
            kind,
            data,
        });
    }
}

fn push_state(out: &mut Vec<ProgressEvent>, cursor: &mut Cursor, row: &SandboxRow, code: u8) {
    cursor.state = code;
    let data = json!({"state": row.state, "at_ms": row.updated_ms});
    push_other(out, cursor, EventKind::State, data);
}

fn push_other(out: &mut Vec<ProgressEvent>, cursor: &mut Cursor, kind: EventKind, data: Value) {
    cursor.since_slot = cursor.since_slot.saturating_add(1).min(SINCE_MAX);
    out.push(ProgressEvent {
        id: cursor.encode(),
        kind,
        data,
    });
}

fn started_data(a: &AttemptRow) -> Value {
    json!({
        "id": a.id, "seq": a.seq, "pool": a.pool, "provider": a.provider,
        "account": a.account, "started_ms": a.started_ms,
    })
}

fn ended_data(a: &AttemptRow) -> Value {
    json!({
        "id": a.id, "seq": a.seq, "pool": a.pool, "state": a.state, "outcome": a.outcome,
        "error_class": a.error_class, "message": a.message, "instance_id": a.instance_id,
        "duration_ms": a.finished_ms.map(|f| f.saturating_sub(a.started_ms)),
    })
}

fn stored_json(text: Option<&str>) -> Value {
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(Value::Null)
}

fn done_data(row: &SandboxRow) -> Value {
    json!({
        "state": row.state,
        "error": stored_json(row.error_json.as_deref()),
        "placement": stored_json(row.placement_json.as_deref()),
    })
}

/// Limits of the event streams (`[create] event_streams_max`, `event_stream_max_secs`).
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    pub max_streams: usize,
    pub max_lifetime: Duration,
}

impl Coordinator {
    /// The sandbox and its attempts as an event stream reads them on each poll: the row
    /// first, then the attempts, so that the attempts are at least as new as the row (an
    /// attempt's end is written before, or with, the state it leads to).
    pub async fn progress(
        &self,
        id: &str,
    ) -> Result<Option<(SandboxRow, Vec<AttemptRow>)>, StoreError> {
        let Some(row) = self.deps.store.get_sandbox(id).await? else {
            return Ok(None);
        };
        let attempts = self.deps.store.list_attempts(id).await?;
        Ok(Some((row, attempts)))
    }

    pub fn event_stream_limits(&self) -> StreamLimits {
        StreamLimits {
            max_streams: self.deps.config.event_streams_max,
            max_lifetime: Duration::from_secs(self.deps.config.event_stream_max_secs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: &str) -> SandboxRow {
        SandboxRow {
            id: "sb-1".into(),
            workspace: "ws".into(),
            principal_json: "{}".into(),
            state: state.into(),
            request_json: "{}".into(),
            labels_json: "{}".into(),
            candidates_json: "[]".into(),
            placement_json: None,
            placement_record_json: None,
            error_json: None,
            token_sealed: b"sealed-token-bytes".to_vec(),
            created_ms: 1000,
            updated_ms: 1000,
            expires_ms: None,
        }
    }

    fn attempt(seq: i64, pool: &str, end: Option<(&str, &str, Option<&str>)>) -> AttemptRow {
        AttemptRow {
            id: format!("sb-1-a{seq}"),
            sandbox_id: "sb-1".into(),
            seq,
            pool: pool.into(),
            provider: "sim".into(),
            account: format!("acct-{pool}"),
            state: end.map_or("in_flight", |e| e.0).into(),
            outcome: end.map(|e| e.1.to_string()),
            error_class: end.and_then(|e| e.2.map(str::to_string)),
            message: end.and_then(|e| e.2.map(|c| format!("simulated {c}"))),
            instance_id: None,
            started_ms: 1000 + seq * 100,
            finished_ms: end.map(|_| 1050 + seq * 100),
            retries_json: None,
        }
    }

    fn kinds(events: &[ProgressEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e.kind {
                EventKind::State => format!("state:{}", e.data["state"].as_str().unwrap_or("")),
                EventKind::AttemptStarted => format!("started:{}", e.data["seq"]),
                EventKind::AttemptEnded => format!("ended:{}", e.data["seq"]),
                EventKind::Done => format!("done:{}", e.data["state"].as_str().unwrap_or("")),
            })
            .collect()
    }

    fn increasing(events: &[ProgressEvent], after: u64) -> bool {
        let mut last = after;
        events.iter().all(|e| {
            let ok = e.id > last;
            last = e.id;
            ok
        })
    }

    /// Polls the record through a sequence of snapshots, as a live stream would.
    fn follow(snapshots: &[(SandboxRow, Vec<AttemptRow>)]) -> Vec<ProgressEvent> {
        let mut cursor = Cursor::default();
        let mut all = Vec::new();
        for (row, attempts) in snapshots {
            let (events, next) = next_events(row, attempts, cursor);
            cursor = next;
            all.extend(events);
        }
        all
    }

    fn failover_snapshots() -> Vec<(SandboxRow, Vec<AttemptRow>)> {
        let a1 = attempt(1, "a", Some(("advanced", "advance", Some("capacity"))));
        let a2 = attempt(2, "b", Some(("advanced", "advance", Some("outage"))));
        let mut running = row("running");
        running.placement_json = Some(r#"{"pool":"c","instance_id":"i-1"}"#.into());
        running.updated_ms = 2000;
        vec![
            (row("pending"), vec![]),
            (row("provisioning"), vec![attempt(1, "a", None)]),
            (row("provisioning"), vec![a1.clone(), attempt(2, "b", None)]),
            (row("provisioning"), vec![a1.clone(), a2.clone()]),
            (
                row("provisioning"),
                vec![a1.clone(), a2.clone(), attempt(3, "c", None)],
            ),
            (
                running,
                vec![
                    a1,
                    a2,
                    attempt(3, "c", Some(("succeeded", "success", None))),
                ],
            ),
        ]
    }

    #[test]
    fn a_live_failover_is_told_in_the_order_of_the_record() {
        let events = follow(&failover_snapshots());
        assert_eq!(
            kinds(&events),
            [
                "state:pending",
                "started:1",
                "state:provisioning",
                "ended:1",
                "started:2",
                "ended:2",
                "started:3",
                "ended:3",
                "state:running",
                "done:running",
            ]
        );
        assert!(increasing(&events, 0), "{events:?}");
        let done = &events[events.len() - 1].data;
        assert_eq!(done["placement"]["pool"], "c");
        assert_eq!(done["error"], Value::Null);
        assert_eq!(events[3].data["error_class"], "capacity");
        assert_eq!(events[3].data["duration_ms"], 50);
        assert_eq!(events[1].data["account"], "acct-a");
    }

    #[test]
    fn a_late_client_gets_every_attempt_then_the_final_state_then_done() {
        let snapshots = failover_snapshots();
        let (row, attempts) = &snapshots[snapshots.len() - 1];
        let (events, cursor) = next_events(row, attempts, Cursor::default());
        assert_eq!(
            kinds(&events),
            [
                "started:1",
                "ended:1",
                "started:2",
                "ended:2",
                "started:3",
                "ended:3",
                "state:running",
                "done:running",
            ]
        );
        // Resumed from any event of the replay: exactly the rest.
        for (i, event) in events.iter().enumerate() {
            let cursor = Cursor::decode(&event.id.to_string()).expect("own id");
            let (rest, _) = next_events(row, attempts, cursor);
            assert_eq!(rest, events[i + 1..].to_vec(), "resumed after {i}");
        }
        assert!(increasing(&events, 0));
        assert!(cursor.done);
        // Nothing more, ever.
        assert!(next_events(row, attempts, cursor).0.is_empty());
    }

    /// The live stream cut after `cut` events, then resumed from the last id against the
    /// snapshot that was current then and the ones after it.
    fn reconnect_after(
        snapshots: &[(SandboxRow, Vec<AttemptRow>)],
        cut: usize,
    ) -> Vec<ProgressEvent> {
        let mut cursor = Cursor::default();
        let mut got: Vec<ProgressEvent> = Vec::new();
        for (i, (row, attempts)) in snapshots.iter().enumerate() {
            let (events, next) = next_events(row, attempts, cursor);
            cursor = next;
            for e in events {
                if got.len() == cut {
                    // Disconnected: resume from the last id, from this snapshot on.
                    let mut resumed = Cursor::decode(&got[cut - 1].id.to_string()).expect("own id");
                    for (row, attempts) in &snapshots[i..] {
                        let (events, next) = next_events(row, attempts, resumed);
                        resumed = next;
                        got.extend(events);
                    }
                    return got;
                }
                got.push(e);
            }
        }
        got
    }

    #[test]
    fn resuming_from_any_id_yields_exactly_the_rest() {
        let snapshots = failover_snapshots();
        let full = follow(&snapshots);
        for cut in 1..full.len() {
            assert_eq!(reconnect_after(&snapshots, cut), full, "cut after {cut}");
        }
        // Resumed once the create is over: the attempts after the id, the final state, done.
        let (row, attempts) = &snapshots[snapshots.len() - 1];
        for (i, event) in full.iter().enumerate() {
            let cursor = Cursor::decode(&event.id.to_string()).expect("own id decodes");
            let (rest, _) = next_events(row, attempts, cursor);
            assert!(increasing(&rest, event.id), "after {i}");
            let mut want: Vec<String> = kinds(&full[i + 1..])
                .into_iter()
                .filter(|k| !k.starts_with("state:"))
                .collect();
            if i + 2 < full.len() {
                want.insert(want.len() - 1, "state:running".into());
            }
            assert_eq!(kinds(&rest), want, "resumed after event {i}");
        }
    }

    #[test]
    fn a_state_change_without_an_attempt_event_is_sent_and_ids_still_grow() {
        let unknown = attempt(1, "a", None);
        let mut abandoned = attempt(1, "a", Some(("abandoned", "unknown", Some("unknown"))));
        abandoned.message = Some("no instance found within the reconcile window".into());
        let events = follow(&[
            (row("provisioning"), vec![unknown.clone()]),
            (row("reconciling"), vec![unknown.clone()]),
            (row("provisioning"), vec![abandoned.clone()]),
            (row("reconciling"), vec![abandoned.clone()]),
            (row("provisioning"), vec![abandoned.clone()]),
        ]);
        assert_eq!(
            kinds(&events),
            [
                "state:provisioning",
                "started:1",
                "state:reconciling",
                "ended:1",
                "state:provisioning",
                "state:reconciling",
                "state:provisioning",
            ]
        );
        assert!(increasing(&events, 0), "{events:?}");
    }

    #[test]
    fn a_failed_create_ends_with_its_stored_error() {
        let mut failed = row("failed");
        failed.error_json =
            Some(r#"{"error":{"code":"creation_failed","message":"every candidate"}}"#.into());
        let attempts = vec![attempt(
            1,
            "a",
            Some(("advanced", "advance", Some("capacity"))),
        )];
        let (events, _) = next_events(&failed, &attempts, Cursor::default());
        let done = events.last().expect("events");
        assert_eq!(done.kind, EventKind::Done);
        assert_eq!(done.data["state"], "failed");
        assert_eq!(done.data["error"]["error"]["code"], "creation_failed");
        assert_eq!(done.data["placement"], Value::Null);
    }

    #[test]
    fn an_attempt_that_never_ended_holds_later_ones_back_until_the_create_is_over() {
        let attempts = vec![
            attempt(1, "a", None),
            attempt(2, "b", Some(("advanced", "advance", Some("capacity")))),
        ];
        let (events, cursor) = next_events(&row("provisioning"), &attempts, Cursor::default());
        assert_eq!(kinds(&events), ["state:provisioning", "started:1"]);
        let (rest, _) = next_events(&row("deleted"), &attempts, cursor);
        assert_eq!(
            kinds(&rest),
            ["started:2", "ended:2", "state:deleted", "done:deleted"]
        );
        assert!(increasing(&rest, cursor.encode()));
    }

    #[test]
    fn attempts_are_ordered_by_seq_whatever_order_they_are_given_in() {
        let attempts = vec![
            attempt(2, "b", None),
            attempt(1, "a", Some(("advanced", "advance", Some("capacity")))),
        ];
        let (events, _) = next_events(&row("provisioning"), &attempts, Cursor::default());
        assert_eq!(
            kinds(&events),
            ["state:provisioning", "started:1", "ended:1", "started:2"]
        );
    }

    #[test]
    fn no_event_carries_the_token_or_the_request() {
        let mut failed = row("failed");
        failed.request_json = r#"{"labels":{"secret-request":"x"}}"#.into();
        failed.error_json = Some(r#"{"error":{"code":"creation_failed"}}"#.into());
        let (events, _) = next_events(&failed, &[attempt(1, "a", None)], Cursor::default());
        for e in &events {
            let text = e.data.to_string();
            assert!(!text.contains("sealed-token-bytes") && !text.contains("secret-request"));
        }
    }

    #[test]
    fn cursors_round_trip_and_foreign_ids_are_refused() {
        let c = Cursor {
            slots: 7,
            since_slot: 3,
            state: state_code("reconciling"),
            done: false,
        };
        assert_eq!(Cursor::decode(&c.encode().to_string()), Some(c));
        let done = Cursor {
            done: true,
            state: state_code("failed"),
            ..c
        };
        assert_eq!(Cursor::decode(&done.encode().to_string()), Some(done));
        let other = Cursor {
            state: state_code("hibernating"),
            ..c
        };
        assert_eq!(other.state, OTHER_STATE);
        assert_eq!(Cursor::decode(&other.encode().to_string()), Some(other));
        for bad in ["", "x", "-1", "1.5", "12", "18446744073709551616", "9 9"] {
            assert_eq!(Cursor::decode(bad), None, "{bad:?}");
        }
        // Any number that decodes is safe to resume from, however large.
        let huge = Cursor::decode(&(u64::MAX - 15 + 8).to_string()).expect("decodes");
        let (events, _) = next_events(&row("provisioning"), &[attempt(1, "a", None)], huge);
        assert!(events.iter().all(|e| e.kind != EventKind::AttemptStarted));
    }
}
