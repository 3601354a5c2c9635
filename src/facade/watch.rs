//! envd's directory watching (`filesystem.Filesystem`), on sandgate's `watch` operation
//! (`operations::files::watch_dir`: the `sandgate.action` layer with `input.file.path` and
//! `input.file.recursive`, then the pool's adapter; hosted kinds answer `unimplemented`).
//!
//! - `WatchDir`: a Connect server stream (`application/connect+json`) of `WatchDirResponse`s,
//!   whose `event` is a oneof directly in the message (`{"start": {}}`, unlike a process
//!   stream's `{"event": {...}}`): the `start` event
//!   once the watch is in place, then a `filesystem` event (`{name, type}`, the name
//!   relative to the directory) per change, `keepalive` events in quiet spells when the
//!   client asks (`Keepalive-Ping-Interval`), and the end-of-stream message when the watch
//!   ends (the sandbox stopped or was deleted, the directory was removed). A refusal is the
//!   end-of-stream message's error, before `start`.
//! - `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher` (unary, what the sync SDKs
//!   poll with): the watcher's events wait in its bounded queue (`localbox::watch`) until
//!   `GetWatcherEvents` takes them all; `RemoveWatcher` ends it. A watcher id is good only
//!   for the sandbox it was created on. A watch that ended answers its last events, then
//!   `not_found`, as envd's does for a removed watcher. A watcher nobody polled for
//!   [`ABANDONED_AFTER`] is removed when another is created, so a client that forgets
//!   `RemoveWatcher` does not hold the sandbox's watch slots (`[local.watch] watchers`).
//! - Events lost to a full queue have no envd event type: they are dropped here (the `/v1`
//!   stream reports them as `overflow`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::call::EnvdCall;
use super::errors::rpc_error;
use super::process::{keepalive, stream_failure, stream_request, stream_response};
use super::FacadeState;
use crate::e2b::connect::{self, RpcError};
use crate::e2b::envd;
use crate::operations::files::watch_dir;
use crate::providers::ops::WatchEvent;

/// Most events one `GetWatcherEvents` answers (the rest wait for the next call).
const MAX_EVENTS_PER_POLL: usize = 4096;
/// A watcher not polled for this long is taken for abandoned.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(600);

/// The watchers `CreateWatcher` made, by id.
#[derive(Default)]
pub struct Watchers {
    map: Mutex<HashMap<String, Arc<Polled>>>,
}

struct Polled {
    sandbox_id: String,
    events: tokio::sync::Mutex<mpsc::Receiver<WatchEvent>>,
    /// When it was created or last polled.
    polled_at: Mutex<Instant>,
}

impl Polled {
    fn touch(&self) {
        *self.polled_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// Abandoned, or over with every event taken: nothing more to answer.
    fn spent(&self) -> bool {
        let idle = self
            .polled_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed();
        idle > ABANDONED_AFTER
            || self
                .events
                .try_lock()
                .is_ok_and(|rx| rx.is_closed() && rx.is_empty())
    }
}

impl Watchers {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Polled>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, sandbox_id: &str, request: &Value) -> Result<(String, Arc<Polled>), RpcError> {
        let id = request["watcherId"]
            .as_str()
            .or_else(|| request["watcher_id"].as_str())
            .unwrap_or_default();
        self.map()
            .get(id)
            .filter(|w| w.sandbox_id == sandbox_id)
            .map(|w| (id.to_string(), w.clone()))
            .ok_or_else(|| RpcError::new("not_found", format!("watcher with id {id} not found")))
    }
}

fn path_and_recursive(request: &Value) -> Result<(String, bool), RpcError> {
    let path = match request["path"].as_str() {
        Some(p) if !p.is_empty() => envd::absolute(p),
        _ => return Err(RpcError::new("invalid_argument", "path is required")),
    };
    Ok((path, request["recursive"].as_bool().unwrap_or(false)))
}

async fn start_watch(
    state: &FacadeState,
    call: &EnvdCall,
    request: &Value,
) -> Result<mpsc::Receiver<WatchEvent>, RpcError> {
    let (path, recursive) = path_and_recursive(request)?;
    let watch = watch_dir(&state.ops, &call.principal, &call.row.id, &path, recursive)
        .await
        .map_err(|e| rpc_error(&e))?;
    tracing::info!(sandbox = %call.row.id, principal = %call.principal.principal, recursive, "e2b: watch started");
    Ok(watch.events)
}

/// The `filesystem` event of a watch event (`None`: a loss, which envd cannot say).
fn filesystem(event: &WatchEvent) -> Option<Value> {
    match event {
        WatchEvent::Fs { kind, name } => Some(envd::filesystem_event(*kind, name)),
        WatchEvent::Overflow { reason } => {
            tracing::debug!(%reason, "e2b: watch events lost");
            None
        }
    }
}

/// `filesystem.Filesystem/WatchDir`.
pub async fn watch_dir_stream(
    state: &FacadeState,
    call: EnvdCall,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match stream_request(&headers, &body) {
        Ok(request) => request,
        Err(answer) => return *answer,
    };
    let events = match start_watch(state, &call, &request).await {
        Ok(events) => events,
        Err(e) => return stream_failure(&e),
    };
    let every = keepalive(&headers);
    let first = connect::message(&json!({"start": {}}));
    let stream = futures_util::stream::unfold(
        (Some(first), Some(events)),
        move |(first, events)| async move {
            if let Some(first) = first {
                return Some((Ok::<_, std::convert::Infallible>(first), (None, events)));
            }
            let mut events = events?;
            loop {
                let next = match every {
                    Some(every) => tokio::time::timeout(every, events.recv()).await,
                    None => Ok(events.recv().await),
                };
                let frame = match next {
                    Err(_) => connect::message(&json!({"keepalive": {}})),
                    Ok(Some(event)) => match filesystem(&event) {
                        Some(fs) => connect::message(&json!({"filesystem": fs})),
                        None => continue,
                    },
                    // The watch is over: end the stream.
                    Ok(None) => return Some((Ok(connect::end_stream(None)), (None, None))),
                };
                return Some((Ok(frame), (None, Some(events))));
            }
        },
    );
    stream_response(Body::from_stream(stream))
}

/// `filesystem.Filesystem/CreateWatcher`.
pub async fn create(
    state: &FacadeState,
    call: &EnvdCall,
    request: &Value,
) -> Result<Value, RpcError> {
    let events = start_watch(state, call, request).await?;
    let id = crate::base::ids::random_hex(12);
    let polled = Arc::new(Polled {
        sandbox_id: call.row.id.clone(),
        events: tokio::sync::Mutex::new(events),
        polled_at: Mutex::new(Instant::now()),
    });
    let mut map = state.watchers.map();
    // Watchers whose watch ended and whose events were all taken, and those nobody polls,
    // go (dropping one ends its watch), so abandoned ones do not pile up.
    map.retain(|_, w| !w.spent());
    map.insert(id.clone(), polled);
    Ok(json!({"watcherId": id}))
}

/// `filesystem.Filesystem/GetWatcherEvents`: every event waiting, oldest first.
pub async fn events(
    state: &FacadeState,
    call: &EnvdCall,
    request: &Value,
) -> Result<Value, RpcError> {
    let (id, polled) = state.watchers.get(&call.row.id, request)?;
    polled.touch();
    let mut rx = match tokio::time::timeout(Duration::from_secs(5), polled.events.lock()).await {
        Ok(rx) => rx,
        Err(_) => return Err(RpcError::new("unavailable", "the watcher is busy")),
    };
    let mut out = Vec::new();
    let mut ended = false;
    while out.len() < MAX_EVENTS_PER_POLL {
        match rx.try_recv() {
            Ok(event) => out.extend(filesystem(&event)),
            Err(mpsc::error::TryRecvError::Empty) => break,
            Err(mpsc::error::TryRecvError::Disconnected) => {
                ended = true;
                break;
            }
        }
    }
    if ended {
        // Its last events are answered now; the next call finds no watcher.
        state.watchers.map().remove(&id);
    }
    Ok(json!({"events": out}))
}

/// `filesystem.Filesystem/RemoveWatcher`: ends the watch.
pub fn remove(state: &FacadeState, call: &EnvdCall, request: &Value) -> Result<Value, RpcError> {
    let (id, _) = state.watchers.get(&call.row.id, request)?;
    state.watchers.map().remove(&id);
    Ok(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polled(rx: mpsc::Receiver<WatchEvent>, polled_at: Instant) -> Polled {
        Polled {
            sandbox_id: "sb-1".into(),
            events: tokio::sync::Mutex::new(rx),
            polled_at: Mutex::new(polled_at),
        }
    }

    #[test]
    fn a_watcher_is_spent_when_over_and_drained_or_abandoned() {
        let (tx, rx) = mpsc::channel(4);
        let live = polled(rx, Instant::now());
        assert!(!live.spent());
        tx.try_send(WatchEvent::Overflow { reason: "x".into() })
            .unwrap();
        drop(tx);
        assert!(!live.spent(), "its last event is still to be answered");
        live.events.try_lock().unwrap().try_recv().unwrap();
        assert!(live.spent());

        let (_tx, rx) = mpsc::channel(4);
        let long_ago = Instant::now().checked_sub(ABANDONED_AFTER + Duration::from_secs(1));
        if let Some(long_ago) = long_ago {
            let idle = polled(rx, long_ago);
            assert!(idle.spent());
            idle.touch();
            assert!(!idle.spent());
        }
    }
}
