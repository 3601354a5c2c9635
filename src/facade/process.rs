//! envd's process service (`process.Process`), translated to sandgate's exec.
//!
//! - `Start`: a Connect server stream (`application/connect+json`). The command goes
//!   through `operations::commands::start_command` (the `sandgate.action` layer, operation
//!   `exec`, then the pool's adapter). The stream is the `start` event (the facade's pid),
//!   output as it comes (`data`, base64), then the `end` event (proto3 JSON: no `exitCode`
//!   for 0; `-1` and `signal: killed` for a killed command) and the end-of-stream message.
//!   `Connect-Timeout-Ms` is the command's lifetime: past it the process tree is killed and
//!   the stream ends with `deadline_exceeded`, as envd's does. `Keepalive-Ping-Interval`
//!   (seconds) sends a `keepalive` event whenever the stream has been quiet that long.
//! - A client that goes away leaves its command running (envd's rule, which background
//!   commands rely on): the facade keeps reading it until it exits.
//! - `Connect` attaches to a running command by pid or tag: the `start` event, then its
//!   events from then on. `SendSignal` (`SIGKILL` or `SIGTERM`; sandgate kills the whole
//!   process tree either way) and `Connect` are authorized as `exec` with `input.exec.pid`.
//!   `List` shows the sandbox's running commands.
//! - `pty` in `Start` runs the command on a terminal of that size (operation `pty`; output
//!   as `data.pty`); `stdin: true` gives it a stdin pipe. `SendInput` (operation `stdin`),
//!   `CloseStdin` and `Update` (a terminal's new size, operation `pty`) act on it: see
//!   `input.rs`.
//! - Not offered (`unimplemented`): `StreamInput`.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use super::call::EnvdCall;
use super::errors::rpc_error;
use super::FacadeState;
use crate::e2b::connect::{self, RpcError};
use crate::e2b::envd as events;
use crate::operations::commands::{start_command, ExecRequest};
use crate::operations::interactive::start_interactive;
use crate::providers::ops::{ExecEvent, ExitReason};
use crate::providers::InputMode;

/// Commands started through the facade and still running, by pid.
pub struct Registry {
    next_pid: AtomicU32,
    running: Mutex<HashMap<u32, Arc<Running>>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            // Low pids look like system processes; these are the facade's own numbers.
            next_pid: AtomicU32::new(1000),
            running: Mutex::new(HashMap::new()),
        }
    }
}

pub(super) struct Running {
    sandbox_id: String,
    /// Input of a command started on a terminal or with `stdin`.
    pub(super) input: Option<mpsc::Sender<crate::providers::ops::ExecInput>>,
    /// Started on a terminal: its output travels as `data.pty`.
    pub(super) pty: bool,
    tag: Option<String>,
    /// The `ProcessConfig` as started (environment names only: values may be secrets).
    config: Value,
    cancel: Arc<dyn Fn() + Send + Sync>,
    /// Every stream frame after `start`, for `Connect` subscribers.
    frames: broadcast::Sender<Bytes>,
}

impl Registry {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Running>>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The command a `ProcessSelector` (`{pid}` or `{tag}`) names in sandbox `id`.
    pub(super) fn select(
        &self,
        id: &str,
        selector: &Value,
    ) -> Result<(u32, Arc<Running>), RpcError> {
        let map = self.map();
        let mine = || map.iter().filter(|(_, r)| r.sandbox_id == id);
        if let Some(pid) = integer(&selector["pid"]) {
            return mine()
                .find(|(p, _)| u64::from(**p) == pid)
                .map(|(p, r)| (*p, r.clone()))
                .ok_or_else(|| {
                    RpcError::new("not_found", format!("process with pid {pid} not found"))
                });
        }
        if let Some(tag) = selector["tag"].as_str() {
            return mine()
                .find(|(_, r)| r.tag.as_deref() == Some(tag))
                .map(|(p, r)| (*p, r.clone()))
                .ok_or_else(|| RpcError::new("not_found", "process with this tag not found"));
        }
        Err(RpcError::new(
            "invalid_argument",
            "invalid process selector",
        ))
    }
}

/// A proto3-JSON integer: a number, or a string (how 64-bit values travel).
pub(super) fn integer(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| value.as_str()?.parse().ok())
}

/// A server stream that failed before its first message: Connect still answers 200, with
/// the error in the end-of-stream message.
pub(super) fn stream_failure(e: &RpcError) -> Response {
    stream_response(Body::from(connect::end_stream(Some(e))))
}

pub(super) fn stream_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        "application/connect+json".parse().expect("a header value"),
    );
    response
}

pub(super) fn is_connect_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| {
            t.to_ascii_lowercase()
                .starts_with("application/connect+json")
        })
}

/// A server-stream call's one request message, or the answer that ends the call: 415 for
/// another codec, a failed stream for a malformed envelope.
pub(super) fn stream_request(headers: &HeaderMap, body: &Bytes) -> Result<Value, Box<Response>> {
    if !is_connect_json(headers) {
        return Err(Box::new(unsupported_media()));
    }
    connect::single_message(body).map_err(|e| Box::new(stream_failure(&e)))
}

pub(super) fn unsupported_media() -> Response {
    (
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "envd speaks the Connect protocol with the JSON codec (application/connect+json) here",
    )
        .into_response()
}

/// The user an envd call runs as: the SDKs name it as `Authorization: Basic base64("NAME:")`.
/// E2B's default user `user` (which older envd versions make the SDKs send on every call)
/// is the pool's default user, so it is `None`; another name must be one the sandbox's pool
/// declares, which the exec checks.
fn envd_user(headers: &HeaderMap) -> Result<Option<String>, RpcError> {
    use base64::Engine as _;
    let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let bad = || {
        RpcError::new(
            "invalid_argument",
            "Authorization must be Basic base64(\"USER:\")",
        )
    };
    let encoded = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Basic "))
        .ok_or_else(bad)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| bad())?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
    let name = decoded.split(':').next().unwrap_or_default();
    Ok(match name {
        "" | crate::providers::local::DEFAULT_USER => None,
        other => Some(other.to_string()),
    })
}

/// What a `StartRequest` asks for, as a sandgate exec.
fn exec_body(
    request: &Value,
    headers: &HeaderMap,
) -> Result<(ExecRequest, Value, Option<String>), RpcError> {
    let process = &request["process"];
    let cmd = process["cmd"].as_str().unwrap_or_default();
    if cmd.is_empty() {
        return Err(RpcError::new("invalid_argument", "process.cmd is required"));
    }
    let strings = |v: &Value| -> Result<Vec<String>, RpcError> {
        match v {
            Value::Null => Ok(Vec::new()),
            Value::Array(items) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| RpcError::new("invalid_argument", "process.args must be strings")),
            _ => Err(RpcError::new(
                "invalid_argument",
                "process.args must be a list",
            )),
        }
    };
    let args = strings(&process["args"])?;
    let envs: BTreeMap<String, String> = match &process["envs"] {
        Value::Null => BTreeMap::new(),
        v => serde_json::from_value(v.clone()).map_err(|_| {
            RpcError::new("invalid_argument", "process.envs must map names to strings")
        })?,
    };
    let cwd = process["cwd"].as_str().map(str::to_string);
    let timeout_ms = headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0);
    let tag = request["tag"].as_str().map(str::to_string);
    let user = envd_user(headers)?;
    let config = json!({"cmd": cmd, "args": args, "envs": envs.keys().map(|k| (k.clone(), "")).collect::<BTreeMap<_, _>>(), "cwd": cwd});
    let mut argv = vec![cmd.to_string()];
    argv.extend(args);
    Ok((
        ExecRequest {
            argv,
            env: envs,
            cwd,
            timeout_ms,
            user,
        },
        config,
        tag,
    ))
}

/// `process.Process/Start`.
pub async fn start(
    state: &FacadeState,
    call: EnvdCall,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match stream_request(&headers, &body) {
        Ok(request) => request,
        Err(answer) => return *answer,
    };
    let (exec, config, tag) = match exec_body(&request, &headers) {
        Ok(parts) => parts,
        Err(e) => return stream_failure(&e),
    };
    let id = call.row.id.clone();
    let mode = match super::input::input_mode(&request) {
        Ok(mode) => mode,
        Err(e) => return stream_failure(&e),
    };
    let started = match mode {
        Some(mode) => start_interactive(&state.ops, &call.principal, &id, exec, mode)
            .await
            .map(|s| (s.stream, Some(s.input))),
        None => start_command(&state.ops, &call.principal, &id, exec)
            .await
            .map(|s| (s, None)),
    };
    let (stream, input) = match started {
        Ok(started) => started,
        Err(e) => return stream_failure(&rpc_error(&e)),
    };
    let pty = matches!(mode, Some(InputMode::Terminal(_)));
    let pid = state.processes.next_pid.fetch_add(1, Ordering::Relaxed);
    let (frames, _) = broadcast::channel(256);
    let running = Arc::new(Running {
        sandbox_id: id.clone(),
        input,
        pty,
        tag,
        config,
        cancel: stream.cancel.clone(),
        frames,
    });
    state.processes.map().insert(pid, running.clone());
    tracing::info!(sandbox = %id, pid, principal = %call.principal.principal, "e2b: command started");
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(pump(
        stream.events,
        tx,
        running,
        state.processes.clone(),
        pid,
    ));
    serve_stream(pid, rx, keepalive(&headers))
}

/// Reads the command until it exits, whoever is listening: frames go to the starting
/// client while it stays, and to every `Connect` subscriber.
async fn pump(
    mut events: mpsc::Receiver<ExecEvent>,
    tx: mpsc::Sender<Bytes>,
    running: Arc<Running>,
    registry: Arc<Registry>,
    pid: u32,
) {
    let mut primary = Some(tx);
    while let Some(event) = events.recv().await {
        let exit = matches!(event, ExecEvent::Exit(_));
        if exit {
            // Gone from the table before anyone hears its end: a client that kills or
            // connects to the pid after reading the end frame is told it is not found,
            // rather than racing this task to the removal.
            registry.map().remove(&pid);
        }
        for frame in frames_of(event, running.pty) {
            let _ = running.frames.send(frame.clone());
            if let Some(tx) = &primary {
                if tx.send(frame).await.is_err() {
                    primary = None;
                }
            }
        }
        if exit {
            return;
        }
    }
    registry.map().remove(&pid);
}

/// The stream frames of one exec event.
fn frames_of(event: ExecEvent, pty: bool) -> Vec<Bytes> {
    match event {
        ExecEvent::Stdout(b) if pty => vec![connect::message(&events::pty_event(&b))],
        ExecEvent::Stdout(b) => vec![connect::message(&events::data_event(true, &b))],
        ExecEvent::Stderr(b) => vec![connect::message(&events::data_event(false, &b))],
        ExecEvent::Exit(info) if info.reason == ExitReason::TimedOut => {
            vec![connect::end_stream(Some(&RpcError::new(
                "deadline_exceeded",
                "context deadline exceeded: the command ran past Connect-Timeout-Ms and was killed",
            )))]
        }
        ExecEvent::Exit(info) => vec![
            connect::message(&events::end_event(&info)),
            connect::end_stream(None),
        ],
    }
}

pub(super) fn keepalive(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| (1..=3600).contains(s))
        .map(Duration::from_secs)
}

/// The response: `start`, then the frames from `rx` (keepalives in the quiet spells) until
/// the end-of-stream message.
fn serve_stream(pid: u32, rx: mpsc::Receiver<Bytes>, keepalive: Option<Duration>) -> Response {
    let first = connect::message(&events::start_event(pid));
    let stream =
        futures_util::stream::unfold((Some(first), Some(rx)), move |(first, rx)| async move {
            if let Some(first) = first {
                return Some((Ok::<_, Infallible>(first), (None, rx)));
            }
            let mut rx = rx?;
            let next = match keepalive {
                Some(every) => match tokio::time::timeout(every, rx.recv()).await {
                    Ok(frame) => frame,
                    Err(_) => Some(connect::message(&events::keepalive_event())),
                },
                None => rx.recv().await,
            };
            let frame = next?;
            let ended = frame.first().is_some_and(|f| f & connect::END_STREAM != 0);
            Some((Ok(frame), (None, (!ended).then_some(rx))))
        });
    stream_response(Body::from_stream(stream))
}

/// `process.Process/Connect`: attach to a running command.
pub async fn attach(
    state: &FacadeState,
    call: EnvdCall,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match stream_request(&headers, &body) {
        Ok(request) => request,
        Err(answer) => return *answer,
    };
    let (pid, running) = match state.processes.select(&call.row.id, &request["process"]) {
        Ok(found) => found,
        Err(e) => return stream_failure(&e),
    };
    if let Err(e) = authorize_pid(state, &call, pid).await {
        return stream_failure(&e);
    }
    let mut subscription = running.frames.subscribe();
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            match subscription.recv().await {
                Ok(frame) => {
                    if tx.send(frame).await.is_err() {
                        return;
                    }
                }
                // Fell behind: the frames it missed are gone; keep following.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                // The command ended before this subscriber heard its end.
                Err(broadcast::error::RecvError::Closed) => {
                    let _ = tx.send(connect::end_stream(None)).await;
                    return;
                }
            }
        }
    });
    serve_stream(pid, rx, keepalive(&headers))
}

async fn authorize_pid(state: &FacadeState, call: &EnvdCall, pid: u32) -> Result<(), RpcError> {
    crate::operations::commands::authorize_running_command(
        &state.ops,
        &call.principal,
        &call.row.id,
        crate::operations::OperationDetail::ExecPid(pid),
    )
    .await
    .map_err(|e| rpc_error(&e))
}

/// `process.Process/SendSignal`.
pub async fn send_signal(
    state: &FacadeState,
    call: &EnvdCall,
    body: &Value,
) -> Result<Value, RpcError> {
    match body["signal"].as_str() {
        Some("SIGNAL_SIGKILL" | "SIGNAL_SIGTERM") => {}
        _ if matches!(body["signal"].as_i64(), Some(9 | 15)) => {}
        _ => {
            return Err(RpcError::new(
                "invalid_argument",
                "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM",
            ))
        }
    }
    let selected = state.processes.select(&call.row.id, &body["process"]);
    // A kill is a cancel: refused (`unimplemented`) where the provider cannot kill a command,
    // rather than answered as done while the command goes on there. Authorized before the
    // lookup, so a kind whose commands end before their first event (a buffered exec) says
    // it cannot cancel rather than that the process is gone.
    let pid_hint = match &selected {
        Ok((pid, _)) => *pid,
        Err(_) => integer(&body["process"]["pid"])
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0),
    };
    crate::operations::commands::authorize_cancel(
        &state.ops,
        &call.principal,
        &call.row.id,
        crate::operations::OperationDetail::ExecPid(pid_hint),
    )
    .await
    .map_err(|e| rpc_error(&e))?;
    let (pid, running) = selected?;
    (running.cancel)();
    tracing::info!(sandbox = %call.row.id, pid, principal = %call.principal.principal, "e2b: command killed");
    Ok(json!({}))
}

/// `process.Process/List`.
pub fn list(state: &FacadeState, call: &EnvdCall) -> Value {
    let map = state.processes.map();
    let processes: Vec<Value> = map
        .iter()
        .filter(|(_, r)| r.sandbox_id == call.row.id)
        .map(|(pid, r)| {
            let mut p = json!({"pid": pid, "config": r.config});
            if let Some(tag) = &r.tag {
                p["tag"] = json!(tag);
            }
            p
        })
        .collect();
    json!({"processes": processes})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_request_becomes_an_exec() {
        let mut headers = HeaderMap::new();
        headers.insert("connect-timeout-ms", "1500".parse().unwrap());
        let request = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "secret"}, "cwd": "/tmp"}, "tag": "t"});
        let (_, config, tag) = exec_body(&request, &headers).unwrap();
        assert_eq!(config["envs"], json!({"A": ""}), "values are not kept");
        assert_eq!(tag.as_deref(), Some("t"));
        // ExecBody has no Debug (its env values may be secrets): compare codes only.
        let code = |request: Value| match exec_body(&request, &headers) {
            Ok(_) => "ok",
            Err(e) => e.code,
        };
        // A terminal is asked for beside the command (see `input.rs`), not refused here.
        assert_eq!(
            code(json!({"process": {"cmd": "x"}, "pty": {"size": {}}})),
            "ok"
        );
        assert_eq!(code(json!({"process": {}})), "invalid_argument");
        assert_eq!(
            code(json!({"process": {"cmd": "x", "args": [1]}})),
            "invalid_argument"
        );
    }

    #[test]
    fn a_timed_out_command_ends_the_stream_with_deadline_exceeded() {
        let exit = crate::providers::ops::ExitInfo {
            code: None,
            signal: Some(9),
            reason: ExitReason::TimedOut,
        };
        let frames = frames_of(ExecEvent::Exit(exit), false);
        assert_eq!(frames.len(), 1);
        // A terminal's output is `data.pty`, a command's `data.stdout`.
        let data = |pty: bool| {
            let frame = &frames_of(ExecEvent::Stdout("hi".into()), pty)[0];
            serde_json::from_slice::<Value>(&frame[5..]).unwrap()["event"]["data"].clone()
        };
        assert_eq!(data(true), json!({"pty": "aGk="}));
        assert_eq!(data(false), json!({"stdout": "aGk="}));
        assert_eq!(frames[0][0], connect::END_STREAM);
        let body: Value = serde_json::from_slice(&frames[0][5..]).unwrap();
        assert_eq!(body["error"]["code"], "deadline_exceeded");
    }
}
