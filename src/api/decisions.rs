//! `GET /v1/decisions` and `GET /v1/decisions/stream`: the recent decision records of this
//! process, from its ring ([`crate::decision_ring`]; nothing is kept in the store).
//!
//! Who sees what: an `admin` sees every record (and may filter on any workspace); any
//! other caller sees only records of its own workspace (asking for another workspace is
//! 403 `forbidden`), so records without a workspace (a proxy request that did not identify
//! itself) are for admins only. The records are the decision log's lines as written (secrets
//! redacted as there).
//!
//! The list is newest first; `next_cursor` (when there may be more) is handed back as
//! `cursor` for the next, older page. The stream sends each new matching record as it is
//! made, as an SSE event `decision` whose id is its sequence number; `Last-Event-ID` (or
//! `since`, without one) resumes from the ring. A stream never buffers for its client: it
//! reads the ring at its own pace, and one that falls so far behind that records it has not
//! sent were evicted is ended (reconnecting with `Last-Event-ID` then starts with a `gap`
//! event).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::auth::{Caller, Principal};
use super::extract::{Query, QueryParams};
use super::ApiState;
use crate::decision_ring::{DecisionRing, Filter, Stored};
use crate::error::{Error, Kind, Retry};

/// Records read from the ring per batch by a stream.
const STREAM_BATCH: usize = 64;
const KEEP_ALIVE: Duration = Duration::from_secs(10);
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;
/// Decisions a `decision` filter may name.
const DECISIONS: &[&str] = &["allow", "deny", "error", "would_deny"];

/// The ring and the stream slots the decision endpoints serve from.
#[derive(Clone)]
pub struct Decisions {
    ring: Option<Arc<DecisionRing>>,
    slots: Arc<Semaphore>,
    max_streams: usize,
}

impl Decisions {
    pub fn new(ring: Option<Arc<DecisionRing>>, max_streams: usize) -> Decisions {
        let max_streams = max_streams.min(Semaphore::MAX_PERMITS);
        Decisions {
            ring,
            slots: Arc::new(Semaphore::new(max_streams)),
            max_streams,
        }
    }
}

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/decisions", get(list))
        .route("/v1/decisions/stream", get(stream))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    sandbox: Option<String>,
    workspace: Option<String>,
    layer: Option<String>,
    decision: Option<String>,
    since: Option<String>,
    limit: Option<usize>,
    cursor: Option<u64>,
}

impl QueryParams for ListQuery {
    const PARAMS: &'static str = "sandbox, workspace, layer, decision (allow, deny, error, would_deny), since (30s, 10m, 24h, 7d or RFC 3339), limit (1 to 1000), cursor";
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamQuery {
    sandbox: Option<String>,
    workspace: Option<String>,
    layer: Option<String>,
    decision: Option<String>,
    since: Option<String>,
}

impl QueryParams for StreamQuery {
    const PARAMS: &'static str = "sandbox, workspace, layer, decision (allow, deny, error, would_deny), since (30s, 10m, 24h, 7d or RFC 3339)";
}

fn invalid(field: &str, message: impl Into<String>) -> Error {
    Error::new(Kind::Invalid, "invalid_request", message.into()).field(field)
}

/// `since`: a duration back from now (`90s`, `10m`, `24h`, `7d`) or an RFC 3339 time, as
/// milliseconds since the epoch.
pub fn parse_since(text: &str, now: SystemTime) -> Option<u64> {
    let now_ms = now.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64;
    if let Ok(at) =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
    {
        return u64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok();
    }
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    let back = number.parse::<u64>().ok()?.checked_mul(secs * 1000)?;
    Some(now_ms.saturating_sub(back))
}

/// The filter a caller may read with: its own workspace unless it is an admin.
fn filter_for(
    caller: &Principal,
    sandbox: Option<String>,
    workspace: Option<String>,
    layer: Option<String>,
    decision: Option<String>,
    since: Option<String>,
) -> Result<Filter, Error> {
    use sandgate_router::{check_text, MAX_NAME_BYTES};
    for (field, value) in [("sandbox", &sandbox), ("workspace", &workspace)] {
        if let Some(problem) = value
            .as_deref()
            .and_then(|v| check_text(v, MAX_NAME_BYTES, false))
        {
            return Err(invalid(field, format!("`{field}` {problem}")));
        }
    }
    if layer
        .as_deref()
        .is_some_and(|l| l.parse::<crate::base::Layer>().is_err())
    {
        return Err(invalid("layer", "`layer` must name a policy layer (egress, credential, creation, provider, lifecycle, action)"));
    }
    if decision.as_deref().is_some_and(|d| !DECISIONS.contains(&d)) {
        return Err(invalid(
            "decision",
            format!("`decision` must be one of {}", DECISIONS.join(", ")),
        ));
    }
    let since_ms = match since.as_deref() {
        None => None,
        Some(s) => Some(parse_since(s, SystemTime::now()).ok_or_else(|| {
            invalid(
                "since",
                "`since` must be a duration (30s, 10m, 24h, 7d) or an RFC 3339 time",
            )
        })?),
    };
    let workspace = match (workspace, caller.is_admin()) {
        (w, true) => w,
        (None, false) => Some(caller.workspace.clone()),
        (Some(w), false) if w == caller.workspace => Some(w),
        (Some(w), false) => {
            return Err(Error::new(
                Kind::Forbidden,
                "forbidden",
                format!("this principal may not read decisions of workspace {w:?}"),
            ))
        }
    };
    Ok(Filter {
        sandbox,
        workspace,
        layer,
        decision,
        since_ms,
    })
}

fn ring(state: &ApiState) -> Result<&Arc<DecisionRing>, Error> {
    state.decisions.ring.as_ref().ok_or_else(|| {
        Error::new(
            Kind::Unavailable,
            "decisions_unavailable",
            "this gateway keeps no decision records in memory ([log] decisions_ring = 0)",
        )
    })
}

/// Recent decision records, newest first.
#[utoipa::path(
    get,
    path = "/v1/decisions",
    tag = "decisions",
    params(
        ("sandbox" = Option<String>, Query, description = "Only this sandbox's decisions"),
        ("workspace" = Option<String>, Query, description = "Only this workspace's; a caller that is not an admin sees only its own workspace, and naming another is 403"),
        ("layer" = Option<String>, Query, description = "egress, credential, creation, provider, lifecycle or action"),
        ("decision" = Option<String>, Query, description = "allow, deny (every refusal, evaluation errors included), error or would_deny"),
        ("since" = Option<String>, Query, description = "A duration back from now (30s, 10m, 24h, 7d) or an RFC 3339 time"),
        ("limit" = Option<u32>, Query, description = "Page size, 1 to 1000 (default 100)"),
        ("cursor" = Option<u64>, Query, description = "next_cursor of the previous page: the page after it holds older records"),
    ),
    responses(
        (status = 200, description = "{decisions: [record, ...] newest first, each a decision-log record as written (kind, decision_id, layer, decision, sandbox, workspace, reasons, input, result, timestamp, ...), next_cursor: string or null}. From this process's in-memory ring ([log] decisions_ring, decisions_ring_bytes): older records are gone.", body = Object),
        (status = 400, description = "invalid_request: an unknown, repeated or mistyped parameter, an unknown layer or decision, a since that is neither a duration nor RFC 3339, a limit outside 1 to 1000 (details.field names it)"),
        (status = 401, description = "unauthenticated"),
        (status = 403, description = "forbidden: a workspace other than the caller's, for a caller that is not an admin"),
        (status = 503, description = "decisions_unavailable: [log] decisions_ring = 0"),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Query(q): Query<ListQuery>,
) -> Response {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return invalid(
            "limit",
            format!("`limit` must be between 1 and {MAX_LIMIT}"),
        )
        .into_response();
    }
    let filter = match filter_for(
        &caller,
        q.sandbox,
        q.workspace,
        q.layer,
        q.decision,
        q.since,
    ) {
        Ok(filter) => filter,
        Err(e) => return e.into_response(),
    };
    let ring = match ring(&state) {
        Ok(ring) => ring,
        Err(e) => return e.into_response(),
    };
    let (page, next) = ring.page(&filter, q.cursor, limit);
    // The records are JSON already: the page is spliced, not parsed and written again.
    let mut body = Vec::with_capacity(page.iter().map(|r| r.json.len() + 1).sum::<usize>() + 64);
    body.extend_from_slice(b"{\"decisions\":[");
    for (i, record) in page.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&record.json);
    }
    body.extend_from_slice(b"],\"next_cursor\":");
    match next {
        Some(cursor) => body.extend_from_slice(format!("\"{cursor}\"}}").as_bytes()),
        None => body.extend_from_slice(b"null}"),
    }
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Where a stream starts: after `Last-Event-ID`, else at the ring's start when `since` is
/// given (the filter cuts older records), else at the newest record (only new ones).
fn start_cursor(headers: &HeaderMap, ring: &DecisionRing, filter: &Filter) -> Result<u64, Error> {
    match headers.get("last-event-id") {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| {
                invalid(
                    "Last-Event-ID",
                    "Last-Event-ID must be the id of an event this endpoint sent",
                )
            }),
        None if filter.since_ms.is_some() => Ok(0),
        None => Ok(ring.latest()),
    }
}

/// Follow decisions as they are made.
#[utoipa::path(
    get,
    path = "/v1/decisions/stream",
    tag = "decisions",
    params(
        ("sandbox" = Option<String>, Query, description = "As GET /v1/decisions"),
        ("workspace" = Option<String>, Query, description = "As GET /v1/decisions"),
        ("layer" = Option<String>, Query, description = "As GET /v1/decisions"),
        ("decision" = Option<String>, Query, description = "As GET /v1/decisions"),
        ("since" = Option<String>, Query, description = "Without Last-Event-ID: first send the kept records since then, oldest first"),
        ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event received: the stream resumes right after it from the ring"),
    ),
    responses(
        (status = 200, content_type = "text/event-stream", body = String, description = "Server-sent events, oldest first: `decision` events whose data is one decision-log record (as in GET /v1/decisions) and whose id is its sequence number; a `gap` event {missed: true} when resuming after records that were already evicted from the ring; keep-alive comments. A client too slow to keep up with the ring is disconnected (a comment says so); it may reconnect with Last-Event-ID."),
        (status = 400, description = "invalid_request: as GET /v1/decisions, or a Last-Event-ID that is not an event id"),
        (status = 401, description = "unauthenticated"),
        (status = 403, description = "forbidden: another workspace, for a caller that is not an admin"),
        (status = 429, description = "rate_limited: [log] decisions_streams_max streams are open (default 32)"),
        (status = 503, description = "decisions_unavailable: [log] decisions_ring = 0"),
    ),
    security(("bearer" = []))
)]
pub async fn stream(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    Query(q): Query<StreamQuery>,
    headers: HeaderMap,
) -> Response {
    let opened = filter_for(
        &caller,
        q.sandbox,
        q.workspace,
        q.layer,
        q.decision,
        q.since,
    )
    .and_then(|filter| Ok((ring(&state)?.clone(), filter)))
    .and_then(|(ring, filter)| Ok((start_cursor(&headers, &ring, &filter)?, ring, filter)));
    let (cursor, ring, filter) = match opened {
        Ok(opened) => opened,
        Err(e) => return e.into_response(),
    };
    let Ok(slot) = state.decisions.slots.clone().try_acquire_owned() else {
        metrics::counter!("sandgate_decision_streams_refused_total").increment(1);
        return Error::new(
            Kind::RateLimited,
            "rate_limited",
            "too many decision streams are open on this gateway; retry shortly",
        )
        .limit(state.decisions.max_streams as u64)
        .retry(Retry::After(Duration::from_secs(1)))
        .into_response();
    };
    let follow = Follow {
        changed: ring.subscribe(),
        ring,
        filter,
        cursor,
        queue: VecDeque::new(),
        resumed: false,
        _slot: slot,
    };
    let stream = futures_util::stream::unfold(Some(follow), next_frame);
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response();
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// One open stream: where it is in the ring and the batch read but not yet sent (at most
/// [`STREAM_BATCH`] records, shared with the ring, never copied).
struct Follow {
    ring: Arc<DecisionRing>,
    changed: watch::Receiver<u64>,
    filter: Filter,
    cursor: u64,
    queue: VecDeque<Arc<Stored>>,
    /// Whether the first read (the resume) is done: a gap after it means this client fell
    /// behind, and it is dropped.
    resumed: bool,
    _slot: OwnedSemaphorePermit,
}

fn frame(record: &Stored) -> Event {
    // A record is one line of JSON (serde_json escapes control characters).
    Event::default()
        .event("decision")
        .id(record.seq.to_string())
        .data(String::from_utf8_lossy(&record.json))
}

async fn next_frame(follow: Option<Follow>) -> Option<(Result<Event, Infallible>, Option<Follow>)> {
    let mut follow = follow?;
    loop {
        if let Some(record) = follow.queue.pop_front() {
            return Some((Ok(frame(&record)), Some(follow)));
        }
        // Marked seen before reading, so a record pushed after the read still wakes us.
        follow.changed.borrow_and_update();
        let read = follow
            .ring
            .after(&follow.filter, follow.cursor, STREAM_BATCH);
        follow.cursor = read.cursor;
        follow.queue.extend(read.records);
        let resumed = std::mem::replace(&mut follow.resumed, true);
        if read.missed && resumed {
            metrics::counter!("sandgate_decision_streams_dropped_total").increment(1);
            let bye = Event::default()
                .comment("this client fell behind the decision ring; reconnect with Last-Event-ID");
            return Some((Ok(bye), None));
        }
        if read.missed {
            let gap = Event::default().event("gap").data("{\"missed\":true}");
            return Some((Ok(gap), Some(follow)));
        }
        if follow.queue.is_empty() && follow.changed.changed().await.is_err() {
            return None;
        }
    }
}
