//! `GET /v1/sandboxes/{id}/events`: a create's progress as server-sent events, so clients can
//! follow it (see [`crate::create::events`] for the events and their order).
//!
//! The stream reads the durable record every [`POLL_INTERVAL`], so it shows a create driven
//! by any replica, and a client that connects late or reconnects (`Last-Event-ID`) still
//! gets every attempt in order. It ends after `done`, or after `[create]
//! event_stream_max_secs` (a stream on a stuck create must not live forever; the client
//! resumes with `Last-Event-ID`). With `?limits=true` the stream goes on after `done` with
//! the `limit_reached` events of the sandbox's instance (a local sandbox's memory, process and
//! disk limits), read from its provider every poll, until the sandbox is deleted or fails. At most `[create] event_streams_max` streams are open at
//! once; beyond it the answer is 429 `rate_limited` with `Retry-After`, because each open
//! stream costs two store reads per poll.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::auth::Caller;
use super::extract::{Path, Query};
use super::ApiState;
use crate::create::events::{next_events, Cursor, ProgressEvent, POLL_INTERVAL};
use crate::create::Coordinator;
use crate::error::{Error, Kind, Retry};

/// How often an idle stream sends a keep-alive comment (so proxies and the client's read
/// timeout do not cut a quiet stream).
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// The open streams of one API router. The limit is read from the coordinator's config
/// on the first request (the router is built before any request, from the same state).
#[derive(Default)]
pub struct StreamSlots(OnceLock<Arc<Semaphore>>);

impl StreamSlots {
    fn take(&self, max: usize) -> Option<OwnedSemaphorePermit> {
        let slots = self
            .0
            .get_or_init(|| Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))));
        slots.clone().try_acquire_owned().ok()
    }
}

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/sandboxes/{id}/events", get(events))
        .layer(Extension(Arc::new(StreamSlots::default())))
}

/// The same answer as `GET /v1/sandboxes/{id}` for an unknown id or another workspace's
/// sandbox, so ids of other workspaces stay private.
fn not_found(id: &str) -> Response {
    Error::new(
        Kind::NotFound,
        "not_found",
        format!("no sandbox {id:?} in your workspace"),
    )
    .into_response()
}

fn rate_limited(max: usize) -> Response {
    Error::new(
        Kind::RateLimited,
        "rate_limited",
        "too many event streams are open on this gateway; retry shortly",
    )
    .limit(max as u64)
    .retry(Retry::After(Duration::from_secs(1)))
    .into_response()
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Also follow the sandbox's `limit_reached` events, after `done`.
    #[serde(default)]
    limits: bool,
}

impl super::extract::QueryParams for EventsQuery {
    const PARAMS: &'static str = "limits (true or false)";
}

/// The cursor `Last-Event-ID` names (none: from the start), and the `seq` of the last
/// `limit_reached` event it names (0 for a progress event's id: `<cursor>` alone; a limit
/// event's is `<cursor>.<seq>`).
fn resume_from(headers: &HeaderMap) -> Result<(Cursor, u64), Error> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok((Cursor::default(), 0));
    };
    let parse = |id: &str| match id.split_once('.') {
        Some((cursor, seq)) => Some((Cursor::decode(cursor)?, seq.parse().ok()?)),
        None => Some((Cursor::decode(id)?, 0)),
    };
    value.to_str().ok().and_then(parse).ok_or_else(|| {
        Error::new(
            Kind::Invalid,
            "invalid_request",
            "Last-Event-ID must be the id of an event this endpoint sent",
        )
        .field("Last-Event-ID")
    })
}

/// Follow a create: its state, each attempt as it starts and ends, then `done`.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/events",
    tag = "sandboxes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event received: the stream resumes right after it (what an EventSource sends on reconnect)"),
        ("limits" = Option<bool>, Query, description = "Also follow the sandbox's limits: after `done` the stream stays open and carries `limit_reached` {type, seq, limit (memory, pids, disk), message, at_ms} each time the sandbox meets a limit its provider enforces (local sandboxes), the ones already met first; their ids are `<done id>.<seq>`. It ends when the sandbox is deleted or fails, or after [create] event_stream_max_secs"),
    ),
    responses(
        (status = 200, content_type = "text/event-stream", body = String, description = "Server-sent events derived from the sandbox's durable record, each with an `id:` that grows along the stream (hand the last one back as Last-Event-ID to resume), and keep-alive comments. Event types (`event:`) and their JSON `data:`: \
`state` {state, at_ms}: the sandbox's state; on a create in flight the first event is the current state, later ones follow each change; a stream opened after the create ended replays every attempt first, then the final state, then done. \
`attempt_started` {id, seq, pool, provider, account, started_ms}: an attempt on a pool began. \
`attempt_ended` {id, seq, pool, state, outcome (success, advance, terminal, unknown), error_class, message, instance_id, duration_ms}: it ended. \
Attempts come ordered by seq, each start before its end; an attempt first seen already finished yields both. \
`done` {state, error (the stored error body, or null), placement (or null)}: the create is over (the sandbox is no longer pending, provisioning or reconciling); the stream ends after it. \
A stream also ends, without `done`, after [create] event_stream_max_secs (default 15 minutes): reconnect with Last-Event-ID. No event carries the egress token."),
        (status = 204, description = "Last-Event-ID is that of the `done` event: nothing more will come"),
        (status = 400, description = "invalid_request: Last-Event-ID is not an id this endpoint sent (details.field = Last-Event-ID)"),
        (status = 401, description = "unauthenticated"),
        (status = 404, description = "not_found: no such sandbox in a workspace the caller manages (the same answer as GET /v1/sandboxes/{id})"),
        (status = 429, description = "rate_limited: [create] event_streams_max streams (default 256) are open; Retry-After says when to try again"),
    ),
    security(("bearer" = []))
)]
pub async fn events(
    State(state): State<ApiState>,
    Extension(slots): Extension<Arc<StreamSlots>>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Response {
    let (cursor, limit_seq) = match resume_from(&headers) {
        Ok(cursor) => cursor,
        Err(refusal) => return refusal.into_response(),
    };
    let (row, attempts) = match state.ops.sandboxes.progress(&id).await {
        Ok(Some(record)) if caller.may_manage(&record.0.workspace) => record,
        Ok(_) => return not_found(&id),
        Err(e) => return crate::create::internal(e).into_response(),
    };
    let (first, cursor) = next_events(&row, &attempts, cursor);
    if first.is_empty() && cursor.done && !query.limits {
        // 204 tells an EventSource to stop reconnecting.
        return StatusCode::NO_CONTENT.into_response();
    }
    let limits = state.ops.sandboxes.event_stream_limits();
    let Some(slot) = slots.take(limits.max_streams) else {
        metrics::counter!("sandgate_event_streams_refused_total").increment(1);
        return rate_limited(limits.max_streams);
    };
    let follow = Follow {
        coordinator: state.ops.sandboxes.clone(),
        id,
        cursor,
        queue: first.into(),
        limits: query.limits.then_some(limit_seq),
        limit_queue: VecDeque::new(),
        deadline: Instant::now()
            .checked_add(limits.max_lifetime)
            .unwrap_or_else(far_future),
        _slot: slot,
    };
    let stream = futures_util::stream::unfold(Some(follow), next_frame);
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response();
    // Reverse proxies (nginx) must pass each event on at once, not buffer the stream.
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// A day from now: the deadline when the configured lifetime does not fit in an `Instant`.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(24 * 3600)
}

/// One open stream: where it is in the record, and the events read but not yet sent.
struct Follow {
    coordinator: Arc<Coordinator>,
    id: String,
    cursor: Cursor,
    queue: VecDeque<ProgressEvent>,
    /// With `?limits=true`: the `seq` of the last `limit_reached` event read.
    limits: Option<u64>,
    /// `limit_reached` events read but not yet sent.
    limit_queue: VecDeque<serde_json::Value>,
    deadline: Instant,
    /// Held for as long as the stream lives (dropped with it when the client goes away).
    _slot: OwnedSemaphorePermit,
}

fn frame(event: &ProgressEvent) -> Event {
    // `Value`'s text is one line (JSON escapes control characters), and the id is digits.
    Event::default()
        .event(event.kind.as_str())
        .id(event.id.to_string())
        .data(event.data.to_string())
}

/// A `limit_reached` event, its id after the `done` event's (limit events follow it).
fn limit_frame(done: Cursor, event: &serde_json::Value) -> Event {
    let seq = event["seq"].as_u64().unwrap_or(0);
    Event::default()
        .event("limit_reached")
        .id(format!("{}.{seq}", done.encode()))
        .data(event.to_string())
}

/// The next frame of the stream; `None` (the end) after `done` (or, following limits, once
/// the sandbox is deleted or failed) or at the deadline.
async fn next_frame(follow: Option<Follow>) -> Option<(Result<Event, Infallible>, Option<Follow>)> {
    let mut follow = follow?;
    loop {
        if let Some(event) = follow.queue.pop_front() {
            let frame = frame(&event);
            let more = !follow.cursor.done || !follow.queue.is_empty() || follow.limits.is_some();
            return Some((Ok(frame), more.then_some(follow)));
        }
        if let Some(event) = follow.limit_queue.pop_front() {
            return Some((Ok(limit_frame(follow.cursor, &event)), Some(follow)));
        }
        if follow.cursor.done && follow.limits.is_none() {
            return None;
        }
        let now = Instant::now();
        if now >= follow.deadline {
            let bye = Event::default()
                .comment("stream lifetime reached; reconnect with Last-Event-ID to follow on");
            return Some((Ok(bye), None));
        }
        tokio::time::sleep_until(follow.deadline.min(now + POLL_INTERVAL)).await;
        if follow.cursor.done {
            if !read_limits(&mut follow).await {
                return None;
            }
            continue;
        }
        match follow.coordinator.progress(&follow.id).await {
            Ok(Some((row, attempts))) => {
                let (events, cursor) = next_events(&row, &attempts, follow.cursor);
                follow.cursor = cursor;
                follow.queue.extend(events);
            }
            // Sandboxes are marked deleted, never removed; nothing more to tell.
            Ok(None) => return None,
            Err(e) => {
                // Try again at the next poll: a busy store must not end every stream.
                tracing::warn!(sandbox = %follow.id, error = %e, "event stream could not read the record");
            }
        }
    }
}

/// Reads the `limit_reached` events after the last one sent into the queue; false once the
/// sandbox can have no more (deleted, failed, gone).
async fn read_limits(follow: &mut Follow) -> bool {
    let after = follow.limits.unwrap_or(0);
    match follow.coordinator.limit_events(&follow.id, after).await {
        Ok(Some(events)) => {
            if let Some(last) = events.last().and_then(|e| e["seq"].as_u64()) {
                follow.limits = Some(last);
            }
            follow.limit_queue.extend(events);
            true
        }
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(sandbox = %follow.id, error = %e, "event stream could not read the sandbox's limits");
            true
        }
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
