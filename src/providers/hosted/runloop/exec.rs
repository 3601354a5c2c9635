//! Runloop commands: the argv quoted into one POSIX shell line, started with
//! `execute_async`, its stdout and stderr followed through the SSE endpoints (resumed by
//! byte offset), its exit from the `wait_for_status` long poll, and its kill.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::StatusCode;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::wire::ExecutionView;
use super::{op_error, request_id, EXEC_LONG_POLL_SECS, REQUEST_ID, STREAM_GRACE};
use crate::ops::{ExecEvent, ExitInfo, ExitReason};
use crate::providers::hosted::http::{path_segment, ProviderHttp};
use crate::providers::OpError;

/// Long-polls `wait_for_status` until the execution is `completed` (408: poll again).
pub(super) async fn wait_completed(
    http: &ProviderHttp,
    devbox: &str,
    execution: &str,
) -> Result<ExecutionView, OpError> {
    let url = format!(
        "/v1/devboxes/{}/executions/{}/wait_for_status",
        path_segment(devbox),
        path_segment(execution)
    );
    let body = json!({"statuses": ["completed"], "timeout_seconds": EXEC_LONG_POLL_SECS});
    let mut transient = 0;
    loop {
        let request = http
            .request(Method::POST, &url)
            .timeout(Duration::from_secs(EXEC_LONG_POLL_SECS + 10))
            .json(&body);
        match http.send(request).await {
            Ok(response) => {
                let view: ExecutionView = http.json(response).await.map_err(op_error)?;
                if view.status == "completed" {
                    return Ok(view);
                }
            }
            Err(f) if f.status == Some(StatusCode::REQUEST_TIMEOUT) => {}
            Err(f)
                if transient < 5
                    && (f.status.is_none()
                        || f.status == Some(StatusCode::TOO_MANY_REQUESTS)
                        || f.status.is_some_and(|s| s.is_server_error())) =>
            {
                transient += 1;
                let wait = f
                    .retry_after
                    .unwrap_or(Duration::from_millis(300 * transient));
                tokio::time::sleep(wait.min(Duration::from_secs(10))).await;
            }
            Err(f) => return Err(op_error(f)),
        }
    }
}

/// Which of an execution's outputs a stream carries.
#[derive(Clone, Copy)]
pub(super) enum Fd {
    Stdout,
    Stderr,
}

/// How one output stream ended.
pub(super) enum StreamEnd {
    /// It ended (the command is done and its output sent).
    Done,
    /// It could not be opened: the execution's buffered output stands in.
    Unavailable,
    /// The receiver went away.
    Closed,
}

/// Reads one SSE output stream to its end, resuming dropped or timed-out streams from the
/// bytes already received.
pub(super) async fn pump(
    http: ProviderHttp,
    devbox: String,
    execution: String,
    fd: Fd,
    tx: mpsc::Sender<ExecEvent>,
) -> StreamEnd {
    let name = match fd {
        Fd::Stdout => "stream_stdout_updates",
        Fd::Stderr => "stream_stderr_updates",
    };
    let url = format!(
        "/v1/devboxes/{}/executions/{}/{name}",
        path_segment(&devbox),
        path_segment(&execution)
    );
    let mut received: u64 = 0;
    let mut opened = false;
    for _attempt in 0..50 {
        let request = http
            .request(Method::GET, &url)
            .header("Accept", "text/event-stream")
            .query(&[("offset", received.to_string())])
            .timeout(Duration::from_secs(24 * 3600));
        let response = match http.send(request).await {
            Ok(r) => r,
            Err(f) if f.status.is_some_and(|s| s.is_client_error()) && !opened => {
                return StreamEnd::Unavailable
            }
            Err(_) => {
                if !opened {
                    return StreamEnd::Unavailable;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        opened = true;
        match read_connection(response, fd, &mut received, &tx).await {
            Read::Ended(end) => return end,
            Read::Resume => {}
        }
    }
    StreamEnd::Done
}

/// How one connection to an output stream ended.
enum Read {
    Ended(StreamEnd),
    /// Dropped, or Runloop's 408 on a long stream: connect again from the offset.
    Resume,
}

/// Reads one connection of an SSE output stream into exec events, counting the bytes
/// delivered in `received` (the offset a resumed stream starts from).
async fn read_connection(
    response: reqwest::Response,
    fd: Fd,
    received: &mut u64,
    tx: &mpsc::Sender<ExecEvent>,
) -> Read {
    let mut body = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let Some(chunk) = body.next().await else {
            return Read::Ended(StreamEnd::Done);
        };
        let Ok(chunk) = chunk else {
            return Read::Resume;
        };
        buffer.extend_from_slice(&chunk);
        while let Some((event, rest)) = split_event(&buffer) {
            buffer = rest;
            let (kind, data) = parse_event(&event);
            if kind.as_deref() == Some("error") {
                return match error_code(&data) {
                    Some(408) => Read::Resume,
                    _ => Read::Ended(StreamEnd::Done),
                };
            }
            let Some(output) = output_of(&data) else {
                continue;
            };
            *received += output.len() as u64;
            let bytes = Bytes::from(output);
            let event = match fd {
                Fd::Stdout => ExecEvent::Stdout(bytes),
                Fd::Stderr => ExecEvent::Stderr(bytes),
            };
            if tx.send(event).await.is_err() {
                return Read::Ended(StreamEnd::Closed);
            }
        }
    }
}

/// The `code` of an SSE `error` event (a number, or a number as a string).
fn error_code(data: &str) -> Option<i64> {
    let v = serde_json::from_str::<Value>(data).ok()?;
    v["code"]
        .as_i64()
        .or_else(|| v["code"].as_str()?.parse().ok())
}

/// The non-empty `output` of an update event.
fn output_of(data: &str) -> Option<String> {
    let update = serde_json::from_str::<Value>(data).ok()?;
    let output = update["output"].as_str()?;
    (!output.is_empty()).then(|| output.to_string())
}

/// The first complete SSE event in `buffer` and what follows it.
pub(super) fn split_event(buffer: &[u8]) -> Option<(String, Vec<u8>)> {
    let text = buffer;
    for i in 0..text.len() {
        if text[i] == b'\n' {
            if text.get(i + 1) == Some(&b'\n') {
                return Some((
                    String::from_utf8_lossy(&text[..i]).into_owned(),
                    text[i + 2..].to_vec(),
                ));
            }
            if text.get(i + 1) == Some(&b'\r') && text.get(i + 2) == Some(&b'\n') {
                return Some((
                    String::from_utf8_lossy(&text[..i]).into_owned(),
                    text[i + 3..].to_vec(),
                ));
            }
        }
    }
    None
}

/// An SSE event's `event:` name and its `data:` lines joined.
pub(super) fn parse_event(event: &str) -> (Option<String>, String) {
    let mut kind = None;
    let mut data: Vec<&str> = Vec::new();
    for line in event.lines() {
        let line = line.trim_end_matches('\r');
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => kind = Some(value.to_string()),
            "data" => data.push(value),
            _ => {}
        }
    }
    (kind, data.join("\n"))
}

pub(super) async fn kill(http: &ProviderHttp, devbox: &str, execution: &str) {
    let url = format!(
        "/v1/devboxes/{}/executions/{}/kill",
        path_segment(devbox),
        path_segment(execution)
    );
    let request = http
        .request(Method::POST, &url)
        .header(REQUEST_ID, request_id())
        .json(&json!({"kill_process_group": true}));
    if let Err(e) = http.send(request).await {
        tracing::warn!(devbox = %devbox, error = %e.message, "runloop: killing a command failed");
    }
}

pub(super) enum Waited {
    Done(Result<ExecutionView, OpError>),
    TimedOut,
    Dropped,
}

/// Drives one execution: both output streams, the completion, the timeout; a caller that
/// drops the stream kills the command.
pub(super) async fn follow(
    http: ProviderHttp,
    devbox: String,
    execution: String,
    timeout: Option<Duration>,
    tx: mpsc::Sender<ExecEvent>,
) {
    let out = tokio::spawn(pump(
        http.clone(),
        devbox.clone(),
        execution.clone(),
        Fd::Stdout,
        tx.clone(),
    ));
    let err = tokio::spawn(pump(
        http.clone(),
        devbox.clone(),
        execution.clone(),
        Fd::Stderr,
        tx.clone(),
    ));
    let waited = wait_for(&http, &devbox, &execution, timeout, &tx).await;
    let view = match waited {
        Waited::TimedOut | Waited::Dropped => {
            kill(&http, &devbox, &execution).await;
            out.abort();
            err.abort();
            if matches!(waited, Waited::TimedOut) {
                let _ = tx
                    .send(ExecEvent::Exit(ExitInfo {
                        code: None,
                        signal: Some(9),
                        reason: ExitReason::TimedOut,
                    }))
                    .await;
            }
            return;
        }
        Waited::Done(Err(e)) => {
            tracing::warn!(devbox = %devbox, error = %e, "runloop: following a command failed");
            out.abort();
            err.abort();
            let _ = tx
                .send(ExecEvent::Exit(ExitInfo {
                    code: None,
                    signal: None,
                    reason: ExitReason::Exited,
                }))
                .await;
            return;
        }
        Waited::Done(Ok(view)) => view,
    };
    if !drain([(out, Fd::Stdout), (err, Fd::Stderr)], &view, &tx).await {
        return;
    }
    let code = view.exit_status.map(|c| c as i32);
    // A shell reports a command killed by signal N as 128 + N.
    let signal = code.filter(|c| (129..=159).contains(c)).map(|c| c - 128);
    let _ = tx
        .send(ExecEvent::Exit(ExitInfo {
            code,
            signal,
            reason: ExitReason::Exited,
        }))
        .await;
}

/// The command's end, its timeout, or the caller going away (which kills it).
async fn wait_for(
    http: &ProviderHttp,
    devbox: &str,
    execution: &str,
    timeout: Option<Duration>,
    tx: &mpsc::Sender<ExecEvent>,
) -> Waited {
    let completed = wait_completed(http, devbox, execution);
    let limit = async {
        match timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = completed => Waited::Done(result),
        _ = limit => Waited::TimedOut,
        _ = tx.closed() => Waited::Dropped,
    }
}

/// Lets a finished command's streams deliver what is left (for [`STREAM_GRACE`]); a stream
/// that could not be opened falls back to the execution's buffered output. False when the
/// caller has gone.
async fn drain(
    streams: [(tokio::task::JoinHandle<StreamEnd>, Fd); 2],
    view: &ExecutionView,
    tx: &mpsc::Sender<ExecEvent>,
) -> bool {
    for (task, fd) in streams {
        let abort = task.abort_handle();
        let end = match tokio::time::timeout(STREAM_GRACE, task).await {
            Ok(Ok(end)) => end,
            Ok(Err(_)) => StreamEnd::Unavailable,
            Err(_) => {
                abort.abort();
                StreamEnd::Done
            }
        };
        match end {
            StreamEnd::Closed => return false,
            StreamEnd::Done => {}
            StreamEnd::Unavailable => {
                let text = match fd {
                    Fd::Stdout => view.stdout.clone(),
                    Fd::Stderr => view.stderr.clone(),
                }
                .unwrap_or_default();
                if !text.is_empty() {
                    let bytes = Bytes::from(text);
                    let event = match fd {
                        Fd::Stdout => ExecEvent::Stdout(bytes),
                        Fd::Stderr => ExecEvent::Stderr(bytes),
                    };
                    if tx.send(event).await.is_err() {
                        return false;
                    }
                }
            }
        }
    }
    true
}
