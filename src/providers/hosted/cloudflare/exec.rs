//! Cloudflare commands: one `POST /v1/sandbox/{id}/exec` whose answer is the whole run as
//! server-sent events (`deploy/cloudflare/src/api.ts`, `ExecStreamEvent`), read into sandgate's
//! exec events in the order the bridge sent them.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::wire::StreamEvent;
use super::{command_line, op_error};
use crate::ops::{ExecEvent, ExecSpec, ExitInfo, ExitReason};
use crate::providers::hosted::http::{path_segment, ProviderHttp};
use crate::providers::{OpError, OpErrorKind};

/// The bridge's `ExecRequest` for `spec`: the argv as one shell line; env, cwd and the
/// timeout in the bridge's own fields (the SDK applies them).
pub(super) fn exec_body(spec: &ExecSpec) -> Result<Value, OpError> {
    let plain = ExecSpec {
        argv: spec.argv.clone(),
        ..ExecSpec::default()
    };
    // Checks the env names as the shell line would, though the bridge sets them itself.
    command_line(&ExecSpec {
        argv: spec.argv.clone(),
        env: spec.env.clone(),
        ..ExecSpec::default()
    })?;
    let mut body = json!({"command": command_line(&plain)?});
    if !spec.env.is_empty() {
        body["env"] = json!(spec.env);
    }
    if let Some(cwd) = &spec.cwd {
        body["cwd"] = json!(cwd);
    }
    if let Some(limit) = spec.timeout {
        body["timeoutMs"] = json!(limit.as_millis().min(u128::from(u32::MAX)) as u64);
    }
    Ok(body)
}

/// Opens the exec stream (a refusal is the operation's error).
pub(super) async fn start(
    http: &ProviderHttp,
    id: &str,
    body: &Value,
) -> Result<reqwest::Response, OpError> {
    let url = format!("/v1/sandbox/{}/exec", path_segment(id));
    let request = http
        .request(Method::POST, &url)
        .header("Accept", "text/event-stream")
        // The stream lasts as long as the command; the spec's timeout is enforced by `follow`.
        .timeout(Duration::from_secs(24 * 3600))
        .json(body);
    http.send(request).await.map_err(op_error)
}

/// The first complete SSE event in `buffer` (its text) and the bytes after it.
pub(super) fn split_event(buffer: &[u8]) -> Option<(String, Vec<u8>)> {
    let mut i = 0;
    while i < buffer.len() {
        if buffer[i] == b'\n' {
            let rest = &buffer[i + 1..];
            let skip = if rest.starts_with(b"\n") {
                Some(1)
            } else if rest.starts_with(b"\r\n") {
                Some(2)
            } else {
                None
            };
            if let Some(skip) = skip {
                let text = String::from_utf8_lossy(&buffer[..i]).into_owned();
                return Some((text, buffer[i + 1 + skip..].to_vec()));
            }
        }
        i += 1;
    }
    None
}

/// The `data:` lines of one SSE event, joined, read as the bridge's event (`None` when the
/// event has no data or is not one of the bridge's).
pub(super) fn event_of(text: &str) -> Option<StreamEvent> {
    let data: Vec<&str> = text
        .lines()
        .filter_map(|line| line.trim_end_matches('\r').strip_prefix("data:"))
        .map(|v| v.strip_prefix(' ').unwrap_or(v))
        .collect();
    if data.is_empty() {
        return None;
    }
    serde_json::from_str(&data.join("\n")).ok()
}

/// How reading the stream ended.
enum End {
    Exit(ExitInfo),
    /// The receiver went away.
    Closed,
}

/// Reads the stream to its `exit` or `error` event; a stream that ends without one (the
/// connection dropped) or an `error` event ends the command with no exit code.
async fn read(response: reqwest::Response, tx: &mpsc::Sender<ExecEvent>) -> End {
    let lost = ExitInfo {
        code: None,
        signal: None,
        reason: ExitReason::Exited,
    };
    let mut body = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let Some(Ok(chunk)) = body.next().await else {
            return End::Exit(lost);
        };
        buffer.extend_from_slice(&chunk);
        while let Some((text, rest)) = split_event(&buffer) {
            buffer = rest;
            let event = match event_of(&text) {
                Some(StreamEvent::Stdout { data }) => ExecEvent::Stdout(Bytes::from(data)),
                Some(StreamEvent::Stderr { data }) => ExecEvent::Stderr(Bytes::from(data)),
                Some(StreamEvent::Exit { exit_code }) => {
                    let code = i32::try_from(exit_code).ok();
                    // A shell reports a command killed by signal N as 128 + N.
                    let signal = code.filter(|c| (129..=159).contains(c)).map(|c| c - 128);
                    return End::Exit(ExitInfo {
                        code,
                        signal,
                        reason: ExitReason::Exited,
                    });
                }
                Some(StreamEvent::Error { message }) => {
                    tracing::warn!(error = %message, "cloudflare: the bridge ended a command with an error");
                    return End::Exit(lost);
                }
                None => continue,
            };
            if tx.send(event).await.is_err() {
                return End::Closed;
            }
        }
    }
}

/// Drives one command: the stream to its end, or the spec's timeout (which drops the stream
/// and reports the command timed out).
pub(super) async fn follow(
    response: reqwest::Response,
    timeout: Option<Duration>,
    tx: mpsc::Sender<ExecEvent>,
) {
    let limit = async {
        match timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let end = tokio::select! {
        end = read(response, &tx) => end,
        _ = limit => End::Exit(ExitInfo { code: None, signal: Some(9), reason: ExitReason::TimedOut }),
    };
    if let End::Exit(info) = end {
        let _ = tx.send(ExecEvent::Exit(info)).await;
    }
}

/// Runs a command to its end: its exit code and stderr.
pub(super) async fn run(
    http: &ProviderHttp,
    id: &str,
    argv: &[&str],
) -> Result<(Option<i32>, String), OpError> {
    let spec = ExecSpec {
        argv: argv.iter().map(|a| a.to_string()).collect(),
        timeout: Some(Duration::from_secs(60)),
        ..ExecSpec::default()
    };
    let response = start(http, id, &exec_body(&spec)?).await?;
    let (tx, mut rx) = mpsc::channel(16);
    let task = tokio::spawn(follow(response, spec.timeout, tx));
    let mut stderr = Vec::new();
    let mut code = None;
    while let Some(event) = rx.recv().await {
        match event {
            ExecEvent::Stderr(b) => stderr.extend_from_slice(&b),
            ExecEvent::Stdout(_) => {}
            ExecEvent::Exit(info) => code = info.code,
        }
    }
    task.await
        .map_err(|e| OpError::new(OpErrorKind::Provider, format!("cloudflare exec: {e}")))?;
    Ok((code, String::from_utf8_lossy(&stderr).into_owned()))
}
