//! Vercel commands: `POST .../cmd` with `wait: true` answers an NDJSON stream (the command's
//! id, its output lines, then its exit), read into exec events; a cancel kills the command
//! with `POST .../cmd/{id}/kill`, waiting for that id when the cancel comes first.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use super::{op_error, Vercel};
use crate::ops::{ExecEvent, ExecSpec, ExecStream, ExitInfo, ExitReason};
use crate::providers::hosted::http::path_segment;
use crate::providers::{OpError, OpErrorKind};

/// How long a cancel waits for the command's id before giving up on killing it.
const ID_WAIT: Duration = Duration::from_secs(10);

impl Vercel {
    /// `POST .../cmd` with `wait: true`: the command's NDJSON stream as an [`ExecStream`].
    pub(super) async fn start(&self, name: &str, spec: ExecSpec) -> Result<ExecStream, OpError> {
        let Some((program, args)) = spec.argv.split_first() else {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                "argv must name a program",
            ));
        };
        let session = self.session_of(name).await?;
        let mut body = json!({
            "command": program,
            "args": args,
            "env": spec.env,
            "sudo": false,
            "wait": true,
            "logs": true,
        });
        if let Some(cwd) = &spec.cwd {
            body["cwd"] = json!(cwd);
        }
        let mut request = self
            .request(Method::POST, &Self::session_path(&session, "/cmd"))
            .json(&body);
        if let Some(timeout) = spec.timeout {
            body["timeout"] = json!(timeout.as_millis() as u64);
            request = self
                .request(Method::POST, &Self::session_path(&session, "/cmd"))
                .json(&body)
                .timeout(timeout + Duration::from_secs(10));
        } else {
            // Commands may run for long: the stream has no whole-request timeout.
            request = request.timeout(Duration::from_secs(24 * 3600));
        }
        // The command's clock starts before the request is sent: Vercel's starts when it is
        // received, so a stream that ends at Vercel's timeout is always past ours too (taken
        // after the answer's headers, a slow answer made a timed-out command look exited).
        let sent = Instant::now();
        let response = self.http.send(request).await.map_err(op_error)?;
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if !content_type.starts_with("application/x-ndjson") {
            return Err(OpError::new(
                OpErrorKind::Provider,
                format!("vercel answered a command with {content_type:?}, not an NDJSON stream"),
            ));
        }
        let (tx, rx) = mpsc::channel(64);
        let (id_tx, id_rx) = watch::channel(None::<String>);
        let reader = tokio::spawn(read_events(
            response,
            tx,
            id_tx,
            spec.timeout.map(|t| (sent, t)),
        ));
        let cancelled = Arc::new(tokio::sync::Notify::new());
        let killing = self.kill_on_cancel(session, id_rx, cancelled.clone(), reader.abort_handle());
        tokio::spawn(killing);
        let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(move || cancelled.notify_one());
        Ok(ExecStream { events: rx, cancel })
    }
}

impl Vercel {
    /// Once `cancelled` fires, kills the command (`POST .../cmd/{id}/kill {signal: 9}`), then
    /// stops reading its stream. The command runs at Vercel before its id (the stream's
    /// first line) is read here, so a cancel that comes first waits for the id, up to
    /// [`ID_WAIT`]: stopping the reader at once would lose the id and leave the command
    /// running. A stream that ends first needs no kill.
    fn kill_on_cancel(
        &self,
        session: String,
        mut command_id: watch::Receiver<Option<String>>,
        cancelled: Arc<tokio::sync::Notify>,
        reader: tokio::task::AbortHandle,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let http = self.http.clone();
        let team = self.team_id.clone();
        async move {
            cancelled.notified().await;
            let id = match tokio::time::timeout(ID_WAIT, command_id.wait_for(Option::is_some)).await
            {
                Ok(Ok(id)) => id.clone(),
                _ => None,
            };
            let Some(id) = id else {
                reader.abort();
                return;
            };
            let path = format!(
                "/v2/sandboxes/sessions/{}/cmd/{}/kill",
                path_segment(&session),
                path_segment(&id)
            );
            let request = http
                .request(Method::POST, &path)
                .query(&[("teamId", team.as_str())])
                .json(&json!({"signal": 9}));
            if let Err(e) = http.send(request).await {
                tracing::warn!(command = %id, error = %e.message, "vercel: killing a cancelled command failed");
            }
            reader.abort();
        }
    }
}

/// Reads the NDJSON stream of a waited command into exec events.
async fn read_events(
    response: reqwest::Response,
    tx: mpsc::Sender<ExecEvent>,
    command_id: watch::Sender<Option<String>>,
    timed: Option<(Instant, Duration)>,
) {
    let mut body = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    let mut seen_command = false;
    let exit = loop {
        let Some(chunk) = body.next().await else {
            break None;
        };
        let Ok(chunk) = chunk else {
            break None;
        };
        buffer.extend_from_slice(&chunk);
        let mut done = None;
        while let Some(at) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=at).collect();
            match parse_line(&line, &mut seen_command) {
                Line::Command(id) => {
                    command_id.send_replace(Some(id));
                }
                Line::Output(event) => {
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
                Line::Finished(code) => {
                    done = Some(Some(code));
                    break;
                }
                Line::Error => {
                    done = Some(None);
                    break;
                }
                Line::Skip => {}
            }
        }
        if let Some(done) = done {
            break done;
        }
    };
    let timed_out = timed.is_some_and(|(started, limit)| started.elapsed() >= limit);
    let info = match exit {
        Some(code) if !(timed_out && code != 0) => ExitInfo {
            code: Some(code),
            signal: None,
            reason: ExitReason::Exited,
        },
        _ if timed_out => ExitInfo {
            code: None,
            signal: Some(9),
            reason: ExitReason::TimedOut,
        },
        _ => ExitInfo {
            code: None,
            signal: None,
            reason: ExitReason::Exited,
        },
    };
    let _ = tx.send(ExecEvent::Exit(info)).await;
}

pub(super) enum Line {
    /// The first `{command}` line: the command's id.
    Command(String),
    Output(ExecEvent),
    /// The finished `{command}` line: its exit code.
    Finished(i32),
    /// `{stream: "error"}`: the stream ended without an exit (the sandbox stopped).
    Error,
    Skip,
}

pub(super) fn parse_line(line: &[u8], seen_command: &mut bool) -> Line {
    let Ok(value) = serde_json::from_slice::<Value>(line) else {
        return Line::Skip;
    };
    if let Some(command) = value.get("command").filter(|c| c.is_object()) {
        let code = command.get("exitCode").and_then(Value::as_i64);
        if !*seen_command && code.is_none() {
            *seen_command = true;
            return Line::Command(command["id"].as_str().unwrap_or_default().to_string());
        }
        *seen_command = true;
        return Line::Finished(code.unwrap_or(0) as i32);
    }
    match value.get("stream").and_then(Value::as_str) {
        Some("stdout") => Line::Output(ExecEvent::Stdout(Bytes::from(
            value["data"].as_str().unwrap_or_default().to_string(),
        ))),
        Some("stderr") => Line::Output(ExecEvent::Stderr(Bytes::from(
            value["data"].as_str().unwrap_or_default().to_string(),
        ))),
        Some("error") => Line::Error,
        _ => Line::Skip,
    }
}
