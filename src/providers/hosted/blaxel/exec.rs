//! Blaxel commands: the argv quoted into the `command` Blaxel runs through a shell, started
//! with `POST /process` waiting for completion and streamed back as NDJSON (`{type, data}`
//! lines in the order the command wrote them, then the `result`), and killed by the name
//! sandgate gave it.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::wire::ProcessView;
use super::{op_error, Blaxel};
use crate::ops::{ExecEvent, ExecSpec, ExitInfo, ExitReason};
use crate::providers::hosted::http::{path_segment, ProviderHttp};
use crate::providers::hosted::shell::shell_quote;
use crate::providers::{OpError, OpErrorKind};

/// How long one streamed command may run at most on sandgate's side of the connection.
const STREAM_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The longest NDJSON line kept (a line past it is not Blaxel's and ends the stream).
const MAX_LINE: usize = 16 << 20;

/// The body of `POST /process` for `spec`, named `name`.
pub fn process_body(spec: &ExecSpec, name: &str) -> Result<Value, OpError> {
    if spec.argv.is_empty() || spec.argv[0].is_empty() {
        return Err(OpError::new(
            OpErrorKind::Invalid,
            "argv must name a program",
        ));
    }
    for key in spec.env.keys() {
        let valid = key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                format!("{key:?} is not a valid environment variable name"),
            ));
        }
    }
    let command = spec
        .argv
        .iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ");
    let mut body = json!({
        "name": name,
        "command": command,
        "env": spec.env.iter().collect::<BTreeMap<_, _>>(),
        "waitForCompletion": true,
    });
    if let Some(cwd) = &spec.cwd {
        body["workingDir"] = json!(cwd);
    }
    Ok(body)
}

/// A process name of sandgate's own (the identifier a kill names).
pub fn process_name() -> String {
    let mut bytes = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sandgate-{hex}")
}

impl Blaxel {
    /// Starts the command; its answer (a stream or the finished process).
    pub(super) async fn start_process(
        &self,
        sandbox: &str,
        body: &Value,
    ) -> Result<reqwest::Response, OpError> {
        let request = self
            .data(sandbox, Method::POST, "/process")
            .await?
            .header("Accept", "text/event-stream")
            .timeout(STREAM_TIMEOUT)
            .json(body);
        self.http.send(request).await.map_err(op_error)
    }

    /// The URL a kill of process `name` goes to, with its headers.
    pub(super) async fn kill_request(
        &self,
        sandbox: &str,
        name: &str,
    ) -> Result<reqwest::RequestBuilder, OpError> {
        let path = format!("/process/{}/kill", path_segment(name));
        self.data(sandbox, Method::DELETE, &path).await
    }
}

/// One NDJSON line of a streamed process.
#[derive(Debug, PartialEq)]
pub enum Line {
    Stdout(String),
    Stderr(String),
    Result(ProcessViewLite),
    /// Keep-alives and anything else.
    Other,
}

/// What the `result` line says of the process.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProcessViewLite {
    pub status: String,
    pub exit_code: Option<i64>,
}

/// Reads one NDJSON line. `result`'s `data` is the process as a JSON string (the SDK parses
/// it again); an object is accepted too.
pub fn parse_line(line: &str) -> Line {
    let Ok(value) = serde_json::from_str::<Value>(line.trim()) else {
        return Line::Other;
    };
    let data = &value["data"];
    match value["type"].as_str() {
        Some("stdout") => Line::Stdout(data.as_str().unwrap_or_default().to_string()),
        Some("stderr") => Line::Stderr(data.as_str().unwrap_or_default().to_string()),
        Some("result") => {
            let process: Option<ProcessView> = match data {
                Value::String(text) => serde_json::from_str(text).ok(),
                Value::Object(_) => serde_json::from_value(data.clone()).ok(),
                _ => None,
            };
            let process = process.unwrap_or_default();
            Line::Result(ProcessViewLite {
                status: process.status,
                exit_code: process.exit_code,
            })
        }
        _ => Line::Other,
    }
}

/// The exit of a finished process.
fn exit_of(status: &str, code: Option<i64>) -> ExitInfo {
    let code = code.map(|c| c as i32);
    // A shell reports a command killed by signal N as 128 + N.
    let signal = code
        .filter(|c| (129..=159).contains(c))
        .map(|c| c - 128)
        .or_else(|| (status == "killed").then_some(9));
    ExitInfo {
        code,
        signal,
        reason: ExitReason::Exited,
    }
}

/// How following a command ended.
enum Followed {
    Exit(ExitInfo),
    /// The caller went away.
    Closed,
}

/// Follows one started command to its end: the NDJSON stream (or the finished process, from
/// an API that does not stream), the spec's timeout, or the caller going away; the last two
/// kill it.
pub(super) async fn follow(
    http: ProviderHttp,
    response: reqwest::Response,
    kill: reqwest::RequestBuilder,
    timeout: Option<Duration>,
    tx: mpsc::Sender<ExecEvent>,
) {
    let limit = async {
        match timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let outcome = tokio::select! {
        followed = read_answer(response, &tx) => Some(followed),
        _ = limit => None,
        _ = tx.closed() => Some(Followed::Closed),
    };
    match outcome {
        Some(Followed::Exit(exit)) => {
            let _ = tx.send(ExecEvent::Exit(exit)).await;
        }
        Some(Followed::Closed) => send_kill(&http, kill).await,
        None => {
            send_kill(&http, kill).await;
            let _ = tx
                .send(ExecEvent::Exit(ExitInfo {
                    code: None,
                    signal: Some(9),
                    reason: ExitReason::TimedOut,
                }))
                .await;
        }
    }
}

pub(super) async fn send_kill(http: &ProviderHttp, kill: reqwest::RequestBuilder) {
    if let Err(e) = http.send(kill).await {
        tracing::warn!(error = %e.message, "blaxel: killing a command failed");
    }
}

async fn read_answer(response: reqwest::Response, tx: &mpsc::Sender<ExecEvent>) -> Followed {
    let streamed = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/x-ndjson"));
    if !streamed {
        return read_finished(response, tx).await;
    }
    let mut body = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    let mut result: Option<ProcessViewLite> = None;
    let mut ended = false;
    while !ended {
        match body.next().await {
            Some(Ok(chunk)) => buffer.extend_from_slice(&chunk),
            // A dropped stream: what was read stands, without an exit code.
            Some(Err(_)) | None => ended = true,
        }
        while let Some(at) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=at).collect();
            let event = match parse_line(&String::from_utf8_lossy(&line)) {
                Line::Stdout(text) => ExecEvent::Stdout(Bytes::from(text)),
                Line::Stderr(text) => ExecEvent::Stderr(Bytes::from(text)),
                Line::Result(process) => {
                    result = Some(process);
                    continue;
                }
                Line::Other => continue,
            };
            if tx.send(event).await.is_err() {
                return Followed::Closed;
            }
        }
        if buffer.len() > MAX_LINE {
            break;
        }
    }
    if !buffer.is_empty() {
        if let Line::Result(process) = parse_line(&String::from_utf8_lossy(&buffer)) {
            result = Some(process);
        }
    }
    Followed::Exit(match result {
        Some(p) => exit_of(&p.status, p.exit_code),
        None => {
            tracing::warn!("blaxel: a command's stream ended without its result");
            ExitInfo {
                code: None,
                signal: None,
                reason: ExitReason::Exited,
            }
        }
    })
}

/// A finished process answered as JSON: its buffered output, then its exit.
async fn read_finished(response: reqwest::Response, tx: &mpsc::Sender<ExecEvent>) -> Followed {
    let process: ProcessView = match response.json().await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "blaxel: a finished command's answer is not its process");
            ProcessView::default()
        }
    };
    for (text, stdout) in [(&process.stdout, true), (&process.stderr, false)] {
        let Some(text) = text.as_ref().filter(|t| !t.is_empty()) else {
            continue;
        };
        let bytes = Bytes::from(text.clone());
        let event = if stdout {
            ExecEvent::Stdout(bytes)
        } else {
            ExecEvent::Stderr(bytes)
        };
        if tx.send(event).await.is_err() {
            return Followed::Closed;
        }
    }
    Followed::Exit(exit_of(&process.status, process.exit_code))
}
