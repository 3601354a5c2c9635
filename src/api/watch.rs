//! `GET /v1/sandboxes/{id}/watch?path=&recursive=`: a directory's changes as server-sent
//! events.
//!
//! Everything is decided before the stream starts, so a refusal is a plain HTTP error in
//! the API's shape: 403 `policy_denied` when the `sandgate.action` layer refuses operation
//! `watch` (policy sees `input.file.path` and `input.file.recursive`), 404 for an unknown
//! sandbox or directory, 400 for a bad path (`..`, a NUL byte, not a directory), 409 when
//! the sandbox is not running, 501 `unsupported` when its provider cannot watch (hosted
//! kinds). A 200 means the watch is in place: every change after it is reported.
//!
//! Each event's data is one JSON object: `{"type":"create"|"write"|"remove"|"rename"|
//! "chmod","name":"<path relative to the watched directory>"}`; `{"type":"overflow",
//! "reason"}` where events were lost (a reader that falls behind, the kernel's queue, the
//! limit on watched directories); `{"type":"end"}` last, when the gateway ends the watch
//! (the sandbox stopped or was deleted, the directory was removed). Keep-alive comments
//! flow on a quiet stream. Closing the connection ends the watch.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::json;

use super::auth::ActionCaller;
use super::extract::{Path, Query, QueryParams};
use super::ApiState;
use crate::operations::files::watch_dir;
use crate::providers::ops::WatchEvent;

/// How often a quiet stream sends a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub fn routes() -> Router<ApiState> {
    Router::new().route("/v1/sandboxes/{id}/watch", get(watch))
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

impl QueryParams for WatchQuery {
    const PARAMS: &'static str = "path (required), recursive";
}

/// The JSON of one event (the `data:` of its server-sent event).
pub fn event_json(event: &WatchEvent) -> serde_json::Value {
    match event {
        WatchEvent::Fs { kind, name } => json!({"type": kind.as_str(), "name": name}),
        WatchEvent::Overflow { reason } => json!({"type": "overflow", "reason": reason}),
    }
}

/// Watch a directory of a sandbox (server-sent events; see the module docs).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/watch",
    tag = "files",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("path" = String, Query, description = "The directory to watch (absolute, or relative to the sandbox's home)"),
        ("recursive" = Option<bool>, Query, description = "Watch the directories below it too, including those created later"),
    ),
    responses(
        (status = 200, content_type = "text/event-stream", body = String, description = "Server-sent events; the watch is in place when this answers. Each data is JSON: {\"type\": \"create\"|\"write\"|\"remove\"|\"rename\"|\"chmod\", \"name\": path relative to the watched directory}; {\"type\": \"overflow\", \"reason\"} where events were lost (the reader fell behind, the kernel's queue overflowed, or a new directory was past the sandbox's limit of watched directories); {\"type\": \"end\"} last when the gateway ends the watch (the sandbox stopped or was deleted, or the directory was removed). Keep-alive comments on a quiet stream. Closing the connection ends the watch."),
        (status = 400, description = "invalid_request: a bad path (`..`, NUL, not a directory), or past the sandbox's watch limits"),
        (status = 403, description = "policy_denied (layer sandgate.action, operation watch)"),
        (status = 404, description = "not_found: no such sandbox, or no such directory"),
        (status = 409, description = "sandbox_state: not running"),
        (status = 501, description = "unsupported: the sandbox's provider cannot watch files"),
    ),
    security(("bearer" = []))
)]
pub async fn watch(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path(id): Path<String>,
    Query(q): Query<WatchQuery>,
) -> Response {
    let watch = match watch_dir(&state.ops, &caller, &id, &q.path, q.recursive).await {
        Ok(watch) => watch,
        Err(e) => return e.into_response(),
    };
    let events = futures_util::stream::unfold(Some(watch.events), |rx| async move {
        let mut rx = rx?;
        let event = match rx.recv().await {
            Some(event) => Event::default().data(event_json(&event).to_string()),
            // The gateway ended the watch: say so, then close.
            None => {
                let end = Event::default().data(json!({"type": "end"}).to_string());
                return Some((Ok::<_, Infallible>(end), None));
            }
        };
        Some((Ok(event), Some(rx)))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}
