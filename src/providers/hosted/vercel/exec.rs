//! Vercel commands: `POST .../cmd` with `wait: true` answers an NDJSON stream (the command's
//! id, its output lines, then its exit), read into exec events; a cancel kills the command
//! with `POST .../cmd/{id}/kill`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{op_error, Vercel};
use crate::ops::{ExecEvent, ExecSpec, ExecStream, ExitInfo, ExitReason};
use crate::providers::hosted::http::path_segment;
use crate::providers::{OpError, OpErrorKind};

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
        let command_id = Arc::new(Mutex::new(None::<String>));
        let reader = tokio::spawn(read_events(
            response,
            tx,
            command_id.clone(),
            spec.timeout.map(|t| (sent, t)),
        ));
        let cancelled = Arc::new(tokio::sync::Notify::new());
        tokio::spawn(self.kill_on_cancel(session, command_id, cancelled.clone()));
        let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            reader.abort();
            cancelled.notify_one();
        });
        Ok(ExecStream { events: rx, cancel })
    }
}

impl Vercel {
    /// Once `cancelled` fires, kills the command (`POST .../cmd/{id}/kill {signal: 9}`), if
    /// its id has arrived.
    fn kill_on_cancel(
        &self,
        session: String,
        command_id: Arc<Mutex<Option<String>>>,
        cancelled: Arc<tokio::sync::Notify>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let http = self.http.clone();
        let team = self.team_id.clone();
        async move {
            cancelled.notified().await;
            let Some(id) = command_id.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
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
        }
    }
}

/// Reads the NDJSON stream of a waited command into exec events.
async fn read_events(
    response: reqwest::Response,
    tx: mpsc::Sender<ExecEvent>,
    command_id: Arc<Mutex<Option<String>>>,
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
                    *command_id.lock().unwrap_or_else(|e| e.into_inner()) = Some(id);
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
