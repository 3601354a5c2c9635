//! `/v1/sandboxes/{id}/pty`: a terminal session in a sandbox, over a WebSocket.
//!
//! The handshake is an ordinary WebSocket upgrade (RFC 6455: `GET`; `POST` is accepted
//! too) carrying the bearer token. Everything is decided before the upgrade, so a refusal
//! is a plain HTTP error in the API's error shape: 403 `policy_denied` when the
//! `sandgate.action` layer refuses operation `pty` (policy sees the command as
//! `input.exec`, as for an exec), 409 when the sandbox is not running, 501 `unsupported`
//! when its provider has no terminal, 426 `upgrade_required` without the upgrade headers.
//!
//! Query parameters: `argv` (repeatable; default: `bash` when the sandbox has it, else
//! `sh`), `env` (repeatable `NAME=VALUE`), `cwd`, `rows` and `cols` (1 to 1000; default
//! 24x80), `timeout_ms`, `user` (one the sandbox's pool declares, as for an exec).
//!
//! Frames, after the upgrade:
//! - server to client: first a text frame `{"type":"started","exec_id":...}`; then binary
//!   frames with the terminal's output bytes (stdout and stderr merged, as on a terminal);
//!   last a text frame `{"type":"exit","code","signal","reason"}` (as an exec's exit line),
//!   then a close frame. A control frame it cannot parse is answered with a text frame
//!   `{"type":"error","message":...}` and the session goes on.
//! - client to server: binary frames are typed input (`\x03` is Ctrl-C, delivered by the
//!   terminal as `SIGINT` to the foreground job); text frames are controls:
//!   `{"type":"resize","rows":R,"cols":C}`, `{"type":"signal","signal":"INT"}` (to the
//!   foreground process group: HUP, INT, QUIT, KILL, USR1, USR2, TERM, CONT, STOP, TSTP,
//!   WINCH), `{"type":"eof"}` (the terminal's end-of-file character).
//!
//! Closing the socket kills the session's process tree, as does
//! `POST /v1/sandboxes/{id}/exec/{exec_id}/cancel`. Messages are at most 1 MiB.
//!
//! Also here: `POST /v1/sandboxes/{id}/exec/{exec_id}/stdin`, bytes for a running exec
//! started with `"stdin": true` (or a terminal session), operation `stdin`.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::auth::ActionCaller;
use super::body::RawBody;
use super::extract::{Path, Query, QueryParams};
use super::sandbox_ops::{exit_json, Registered, RunningExec};
use super::ApiState;
use crate::error::{Error, Kind};
use crate::operations::authorize::invalid;
use crate::operations::commands::ExecRequest;
use crate::operations::interactive::{authorize_input, start_interactive};
use crate::providers::ops::{ExecEvent, ExecInput, WinSize};
use crate::providers::{InputMode, InteractiveStream};

/// Largest WebSocket message (and frame) a client may send.
const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Largest terminal dimension accepted.
const MAX_DIMENSION: u16 = 1000;
/// What runs when `argv` is not given: bash where the sandbox has it, else sh.
const DEFAULT_SHELL: &str = "command -v bash >/dev/null 2>&1 && exec bash || exec sh";

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/sandboxes/{id}/pty", get(pty).post(pty_post))
        .route("/v1/sandboxes/{id}/exec/{exec_id}/stdin", post(stdin))
}

/// Open a terminal session in a sandbox (WebSocket; see the module docs for the frames).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/pty",
    tag = "sandboxes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("argv" = Option<Vec<String>>, Query, description = "The program and its arguments, repeated (default: bash if present, else sh)"),
        ("env" = Option<Vec<String>>, Query, description = "NAME=VALUE, repeated"),
        ("cwd" = Option<String>, Query, description = "Working directory (default the sandbox's home)"),
        ("rows" = Option<u16>, Query, description = "Terminal rows, 1 to 1000 (default 24)"),
        ("cols" = Option<u16>, Query, description = "Terminal columns, 1 to 1000 (default 80)"),
        ("timeout_ms" = Option<u64>, Query, description = "Kill the session after this many milliseconds"),
        ("user" = Option<String>, Query, description = "Run as this user, one the sandbox's pool declares (default: the pool's default user)"),
    ),
    responses(
        (status = 101, description = "WebSocket. Server: text {\"type\":\"started\",\"exec_id\"}, binary output frames, text {\"type\":\"exit\",\"code\",\"signal\",\"reason\"}, close. Client: binary input frames; text {\"type\":\"resize\",\"rows\",\"cols\"} | {\"type\":\"signal\",\"signal\":\"INT\"} | {\"type\":\"eof\"}. Closing the socket kills the session."),
        (status = 400, description = "invalid_request: details.field names the query parameter"),
        (status = 403, description = "policy_denied (layer sandgate.action, operation pty)"),
        (status = 404, description = "not_found"),
        (status = 409, description = "sandbox_state: not running"),
        (status = 426, description = "upgrade_required: not a WebSocket handshake"),
        (status = 501, description = "unsupported: the sandbox's provider has no terminal"),
    ),
    security(("bearer" = []))
)]
pub async fn pty(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path(id): Path<String>,
    mut request: Request,
) -> Response {
    let Some(accept) = handshake_key(request.headers()) else {
        return upgrade_required();
    };
    let (exec, size) = match parse_query(request.uri().query().unwrap_or("")) {
        Ok(parsed) => parsed,
        Err(e) => return e.into_response(),
    };
    let mode = InputMode::Terminal(size);
    let started = match start_interactive(&state.ops, &caller, &id, exec, mode).await {
        Ok(started) => started,
        Err(e) => return e.into_response(),
    };
    let exec_id = format!("ex-{}", crate::base::ids::random_hex(8));
    let registered = Registered::insert(
        &state.execs,
        exec_id.clone(),
        RunningExec {
            sandbox_id: id.clone(),
            cancel: started.stream.cancel.clone(),
            input: Some(started.input.clone()),
        },
    );
    tracing::info!(sandbox = %id, exec = %exec_id, principal = %caller.principal, "pty session started");
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        // Dropping `started` (if the upgrade fails) kills the session.
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_MESSAGE_BYTES));
        let ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config))
                .await;
        session(ws, started, &exec_id).await;
        drop(registered);
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if let Ok(value) = HeaderValue::from_str(&accept) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, value);
    }
    response
}

/// The same session opened with `POST` (for clients that can send the upgrade on it).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/pty",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id; the query parameters are the GET form's")),
    responses(
        (status = 101, description = "WebSocket, as GET /v1/sandboxes/{id}/pty"),
        (status = 403, description = "policy_denied (layer sandgate.action, operation pty)"),
        (status = 426, description = "upgrade_required: not a WebSocket handshake"),
    ),
    security(("bearer" = []))
)]
pub async fn pty_post(
    state: State<ApiState>,
    caller: ActionCaller,
    id: Path<String>,
    request: Request,
) -> Response {
    pty(state, caller, id, request).await
}

/// 426 in the error shape, naming the protocol to upgrade to.
fn upgrade_required() -> Response {
    let e = Error::new(
        Kind::Invalid,
        "upgrade_required",
        "a terminal session is a WebSocket: send an upgrade handshake (version 13)",
    );
    let mut response = e.into_response();
    *response.status_mut() = StatusCode::UPGRADE_REQUIRED;
    response
        .headers_mut()
        .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    response
}

/// The `Sec-WebSocket-Accept` of a valid WebSocket handshake.
fn handshake_key(headers: &HeaderMap) -> Option<String> {
    let has = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    let key = headers.get(header::SEC_WEBSOCKET_KEY);
    let version_ok = headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_some_and(|v| v.as_bytes() == b"13");
    let valid = has(header::UPGRADE, "websocket") && has(header::CONNECTION, "upgrade");
    key.filter(|_| valid && version_ok)
        .map(|key| tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()))
}

/// The command and terminal size of the query (see the module docs).
fn parse_query(query: &str) -> Result<(ExecRequest, WinSize), Error> {
    let mut exec = ExecRequest::default();
    let mut size = WinSize::DEFAULT;
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match key.as_ref() {
            "argv" => exec.argv.push(value.into_owned()),
            "env" => {
                let Some((name, val)) = value.split_once('=') else {
                    return Err(invalid("env", "`env` must be NAME=VALUE"));
                };
                exec.env.insert(name.to_string(), val.to_string());
            }
            "cwd" => exec.cwd = Some(value.into_owned()),
            "user" => exec.user = Some(value.into_owned()),
            "rows" => size.rows = dimension("rows", &value)?,
            "cols" => size.cols = dimension("cols", &value)?,
            "timeout_ms" => {
                let ms = value.parse().map_err(|_| {
                    invalid(
                        "timeout_ms",
                        "`timeout_ms` must be a number of milliseconds",
                    )
                })?;
                exec.timeout_ms = Some(ms);
            }
            other => {
                return Err(invalid(
                    other,
                    "unknown query parameter; use argv, env, cwd, rows, cols, timeout_ms, user",
                ))
            }
        }
    }
    if exec.argv.is_empty() {
        exec.argv = ["/bin/sh", "-c", DEFAULT_SHELL].map(String::from).to_vec();
    }
    // A terminal program needs to know what it talks to; the client may say otherwise.
    exec.env
        .entry("TERM".into())
        .or_insert_with(|| "xterm-256color".into());
    Ok((exec, size))
}

fn dimension(field: &str, value: &str) -> Result<u16, Error> {
    value
        .parse::<u16>()
        .ok()
        .filter(|n| (1..=MAX_DIMENSION).contains(n))
        .ok_or_else(|| {
            invalid(
                field,
                format!("`{field}` must be a number from 1 to {MAX_DIMENSION}"),
            )
        })
}

/// A control frame's input, or why it is not one.
pub(super) fn control(text: &str) -> Result<ExecInput, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|_| "a control frame is a JSON object".to_string())?;
    match value["type"].as_str() {
        Some("resize") => {
            let dim = |k: &str| {
                value[k]
                    .as_u64()
                    .and_then(|n| u16::try_from(n).ok())
                    .filter(|n| (1..=MAX_DIMENSION).contains(n))
                    .ok_or_else(|| {
                        format!("resize: `{k}` must be a number from 1 to {MAX_DIMENSION}")
                    })
            };
            Ok(ExecInput::Resize(WinSize {
                rows: dim("rows")?,
                cols: dim("cols")?,
            }))
        }
        Some("signal") => value["signal"]
            .as_str()
            .and_then(crate::localbox::signal_number)
            .map(ExecInput::Signal)
            .ok_or_else(|| {
                "signal: `signal` must be one of HUP, INT, QUIT, KILL, USR1, USR2, TERM, CONT, \
                 STOP, TSTP, WINCH"
                    .to_string()
            }),
        Some("eof") => Ok(ExecInput::Eof),
        _ => Err("`type` must be resize, signal or eof".to_string()),
    }
}

/// Relays a session until its command exits (exit frame, then close) or the client goes
/// (then dropping the stream kills the command).
async fn session<S>(ws: WebSocketStream<S>, started: InteractiveStream, exec_id: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let InteractiveStream { mut stream, input } = started;
    let (mut sink, mut source) = ws.split();
    // Input runs on its own task: a command that does not read its terminal must not stop
    // its output from being relayed (nor the client's close from being seen).
    let (errors_tx, mut errors) = mpsc::channel::<String>(8);
    let (gone_tx, mut gone) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::spawn(async move {
        while let Some(Ok(message)) = source.next().await {
            let item = match message {
                Message::Binary(bytes) => ExecInput::Data(bytes),
                Message::Text(text) => match control(text.as_str()) {
                    Ok(item) => item,
                    Err(message) => {
                        let _ = errors_tx.try_send(message);
                        continue;
                    }
                },
                Message::Close(_) => break,
                _ => continue,
            };
            if input.send(item).await.is_err() {
                // The command is gone; its exit frame is on its way.
                continue;
            }
        }
        let _ = gone_tx.send(());
    });
    let text = |v: Value| Message::Text(v.to_string().into());
    if sink
        .send(text(json!({"type": "started", "exec_id": exec_id})))
        .await
        .is_ok()
    {
        loop {
            let message = tokio::select! {
                event = stream.events.recv() => match event {
                    Some(ExecEvent::Stdout(b) | ExecEvent::Stderr(b)) => Message::Binary(b),
                    Some(ExecEvent::Exit(exit)) => {
                        let _ = sink.send(text(exit_json(&exit))).await;
                        let _ = sink.close().await;
                        break;
                    }
                    None => break,
                },
                Some(message) = errors.recv() => text(json!({"type": "error", "message": message})),
                _ = &mut gone => break,
            };
            if sink.send(message).await.is_err() {
                break;
            }
        }
    }
    reader.abort();
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdinQuery {
    #[serde(default)]
    eof: bool,
}

impl QueryParams for StdinQuery {
    const PARAMS: &'static str = "eof";
}

/// Send bytes to a running command's stdin: the request body, in order with earlier sends;
/// `eof=true` then closes its stdin (on a terminal: types the end-of-file character).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/exec/{exec_id}/stdin",
    tag = "sandboxes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("exec_id" = String, Path, description = "From the exec's `started` line (an exec started with `\"stdin\": true`, or a terminal session)"),
        ("eof" = Option<bool>, Query, description = "Close stdin after these bytes"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 202, description = "Queued for the command: {exec_id, bytes, eof}"),
        (status = 403, description = "policy_denied (layer sandgate.action, operation stdin)"),
        (status = 404, description = "not_found: no such running exec"),
        (status = 409, description = "sandbox_state: the exec takes no input (started without `stdin`), or it has ended"),
    ),
    security(("bearer" = []))
)]
pub async fn stdin(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path((id, exec_id)): Path<(String, String)>,
    Query(q): Query<StdinQuery>,
    RawBody(bytes): RawBody,
) -> Response {
    let detail = crate::operations::OperationDetail::ExecId(&exec_id);
    if let Err(e) = authorize_input(&state.ops, &caller, &id, detail).await {
        return e.into_response();
    }
    let input = state
        .execs
        .map()
        .get(&exec_id)
        .filter(|r| r.sandbox_id == id)
        .map(|r| r.input.clone());
    let conflict = |message: String| Error::new(Kind::Conflict, "sandbox_state", message);
    let input = match input {
        None => {
            return Error::new(
                Kind::NotFound,
                "not_found",
                format!("no running exec {exec_id:?} in sandbox {id}"),
            )
            .into_response()
        }
        Some(None) => {
            return conflict(format!(
                "exec {exec_id} takes no input: start it with \"stdin\": true"
            ))
            .into_response()
        }
        Some(Some(input)) => input,
    };
    let n = bytes.len();
    let mut sent = n == 0 || input.send(ExecInput::Data(bytes)).await.is_ok();
    if sent && q.eof {
        sent = input.send(ExecInput::Eof).await.is_ok();
    }
    if !sent {
        return conflict(format!("exec {exec_id} has ended")).into_response();
    }
    (
        StatusCode::ACCEPTED,
        axum::Json(json!({"exec_id": exec_id, "bytes": n, "eof": q.eof})),
    )
        .into_response()
}
