//! envd on the facade's origin: each request names its sandbox ([`super::EnvdTarget`]),
//! proves it may use it with the sandbox's envd token (`X-Access-Token`), and runs as the
//! sandbox's creator through `operations::files` (the `sandgate.action` layer).
//!
//! - A sandbox that does not exist, is not live or is not running answers what E2B's proxy
//!   answers: 502 `{code, message, sandboxId}` (the SDKs read it as "not running"). A port
//!   other than envd's is 502 too: sandgate forwards no other sandbox port.
//! - `GET /health`: 204 while the sandbox runs (no token needed, as with envd).
//! - `GET /files?path=` (`files.read`) answers the bytes; `POST /files?path=` (`files.write`)
//!   takes `multipart/form-data` (`file` parts named by their path; `?path=` wins for a
//!   single part) or a raw body, and answers the `EntryInfo`s written. Relative paths are
//!   from `/home/user`. A `Content-Encoding: gzip` body (the SDKs' `gzip=True`) is
//!   inflated first, bounded like a plain one: past 64 MiB either way is 413.
//! - Connect unary calls (JSON codec): `filesystem.Filesystem/Stat` and `ListDir`
//!   (`files.list`), `MakeDir` (`files.mkdir`; `already_exists` when it does), `Remove`
//!   (`files.delete`, recursive as envd's), `Move` (`files.move`, with
//!   `input.file.destination`), `process.Process/List` and `SendSignal`. Watching
//!   (`WatchDir`, a server stream; `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`;
//!   operation `watch`) is in `watch.rs`.
//!   Anything else is `unimplemented`.

use axum::body::Bytes;
use axum::extract::{
    DefaultBodyLimit, FromRequest, FromRequestParts, Multipart, Query, Request, State,
};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use subtle::ConstantTimeEq;

pub use super::call::EnvdCall;
use super::errors::{message, rpc_error, rpc_reply};
use super::{EnvdTarget, FacadeState};
use crate::e2b::connect::RpcError;
use crate::e2b::envd::{self, ENVD_PORT};
use crate::error::{Error, Kind};
use crate::operations::files::{file_action, move_path, MAX_FILE_BYTES};
use crate::providers::ops::SandboxEntry;
use crate::store::sandboxes::SandboxRow;

/// Most entries one `ListDir` answers (a deep listing of a big tree stops there).
const MAX_LIST_ENTRIES: usize = 10_000;
/// Deepest `ListDir` walk.
const MAX_LIST_DEPTH: u64 = 16;

pub fn routes(state: FacadeState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route(
            "/files",
            get(files_read)
                .post(files_write)
                .layer(DefaultBodyLimit::max(MAX_FILE_BYTES)),
        )
        .route("/process.Process/Start", post(start))
        .route("/process.Process/Connect", post(attach))
        .route("/filesystem.Filesystem/WatchDir", post(watch_dir))
        .route("/{service}/{method}", post(unary))
        .fallback(|| async { (StatusCode::NOT_FOUND, "404 page not found").into_response() })
        .layer(DefaultBodyLimit::max(1 << 20))
        .route_layer(axum::middleware::from_fn(|r, n| super::count("envd", r, n)))
        .with_state(state)
}

/// The sandbox an envd request reaches: running, on envd's port.
pub struct EnvdSandbox(pub SandboxRow);

/// E2B's proxy's answer for a sandbox it cannot reach.
fn proxy_502(id: &str, message: String, port: Option<u16>) -> Response {
    let mut body = json!({"code": 502, "message": message, "sandboxId": id});
    if let Some(port) = port {
        body["port"] = json!(port);
    }
    (StatusCode::BAD_GATEWAY, Json(body)).into_response()
}

fn envd_error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"code": status.as_u16(), "message": message.into()})),
    )
        .into_response()
}

impl FromRequestParts<FacadeState> for EnvdSandbox {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &FacadeState) -> Result<Self, Response> {
        let Some(target) = parts.extensions.get::<EnvdTarget>().cloned() else {
            return Err(envd_error(StatusCode::NOT_FOUND, "not an envd request"));
        };
        let id = target.sandbox_id;
        let row = match state.ops.sandboxes.store().get_sandbox(&id).await {
            Ok(Some(row)) => row,
            Ok(None) => {
                return Err(proxy_502(
                    &id,
                    format!("The sandbox {id} was not found"),
                    None,
                ))
            }
            Err(e) => {
                return Err(envd_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    message(&crate::create::internal(e)),
                ))
            }
        };
        match row.state.as_str() {
            "running" => {}
            "paused" | "stopped" => {
                return Err(proxy_502(
                    &id,
                    format!(
                    "The sandbox {id} is paused and was not found running: connect to resume it"
                ),
                    None,
                ))
            }
            _ => {
                return Err(proxy_502(
                    &id,
                    format!("The sandbox {id} was not found"),
                    None,
                ))
            }
        }
        if target.port != ENVD_PORT {
            return Err(proxy_502(
                &id,
                format!("The sandbox {id} is running but port {} is not open (sandgate forwards envd only)", target.port),
                Some(target.port),
            ));
        }
        Ok(EnvdSandbox(row))
    }
}

/// Authenticates an envd call (the struct lives in [`super::call`], shared with
/// [`super::process`]).
impl FromRequestParts<FacadeState> for EnvdCall {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &FacadeState) -> Result<Self, Response> {
        let EnvdSandbox(row) = EnvdSandbox::from_request_parts(parts, state).await?;
        let expected = state.envd_token(&row.id);
        let given = parts
            .headers
            .get("x-access-token")
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if !bool::from(given.ct_eq(expected.as_bytes())) {
            return Err(envd_error(
                StatusCode::UNAUTHORIZED,
                "invalid or missing access token",
            ));
        }
        let Some(principal) = state.creator(&row) else {
            return Err(envd_error(
                StatusCode::UNAUTHORIZED,
                format!(
                    "the principal that created sandbox {} is no longer configured",
                    row.id
                ),
            ));
        };
        Ok(EnvdCall { row, principal })
    }
}

async fn health(_: EnvdSandbox) -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// envd's HTTP error for a sandgate refusal (file endpoints).
fn file_error(e: &Error) -> Response {
    envd_error(crate::reply::status(e.kind), message(e))
}

#[derive(Deserialize)]
struct PathQuery {
    path: Option<String>,
}

async fn files_read(
    State(state): State<FacadeState>,
    call: EnvdCall,
    Query(q): Query<PathQuery>,
) -> Response {
    let Some(path) = q.path.filter(|p| !p.is_empty()) else {
        return envd_error(
            StatusCode::BAD_REQUEST,
            "the path query parameter is required",
        );
    };
    let path = envd::absolute(&path);
    let result = file_action(
        &state.ops,
        &call.principal,
        &call.row.id,
        "files.read",
        &path,
        path.as_str(),
        |a, i, p| a.read_file(i, p),
    )
    .await;
    match result {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => file_error(&e),
    }
}

async fn files_write(State(state): State<FacadeState>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let call = match EnvdCall::from_request_parts(&mut parts, &state).await {
        Ok(call) => call,
        Err(answer) => return answer,
    };
    let path = Query::<PathQuery>::try_from_uri(&parts.uri)
        .ok()
        .and_then(|q| q.0.path)
        .filter(|p| !p.is_empty());
    let encoding = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase());
    let body = match encoding.as_deref() {
        None | Some("" | "identity") => body,
        // The SDKs' `gzip=True` (envd 0.5.7 and later, which this facade answers as).
        Some("gzip" | "x-gzip") => {
            let inflated = match gunzip_body(body).await {
                Ok(inflated) => inflated,
                Err(answer) => return answer,
            };
            parts.headers.remove(header::CONTENT_ENCODING);
            parts.headers.remove(header::CONTENT_LENGTH);
            axum::body::Body::from(inflated)
        }
        Some(other) => {
            return envd_error(
                StatusCode::BAD_REQUEST,
                format!(
                    "Content-Encoding {:?} is not accepted here: gzip or identity",
                    printable(other)
                ),
            )
        }
    };
    let request = Request::from_parts(parts, body);
    let uploads = match uploads(request, path, &state).await {
        Ok(uploads) => uploads,
        Err(answer) => return answer,
    };
    let mut written = Vec::new();
    for (path, data) in uploads {
        let path = envd::absolute(&path);
        // envd creates the missing parent directories of a file it writes.
        let result = file_action(
            &state.ops,
            &call.principal,
            &call.row.id,
            "files.write",
            &path,
            path.as_str(),
            move |a, i, p| {
                Box::pin(async move {
                    match a.write_file(i, p, data.to_vec()).await {
                        Err(e) if e.kind == crate::providers::OpErrorKind::NotFound => {
                            let Some((parent, _)) = envd::split_parent(p) else {
                                return Err(e);
                            };
                            a.mkdir(i, &parent, true).await?;
                            a.write_file(i, p, data.to_vec()).await
                        }
                        other => other,
                    }
                })
            },
        )
        .await;
        if let Err(e) = result {
            return file_error(&e);
        }
        let name = path.rsplit('/').next().unwrap_or_default().to_string();
        written.push(json!({"name": name, "type": "file", "path": path}));
    }
    Json(written).into_response()
}

/// A gzip upload's body, inflated. Both sides are bounded by [`MAX_FILE_BYTES`]: a larger
/// compressed body, or one that inflates past it (a gzip bomb), is 413 and nothing is
/// written; inflating stops one byte past the bound, so memory holds at most the compressed
/// body and that much inflated, never what the bomb would expand to. A body that is not
/// gzip is 400.
async fn gunzip_body(body: axum::body::Body) -> Result<Bytes, Response> {
    let compressed = axum::body::to_bytes(body, MAX_FILE_BYTES)
        .await
        .map_err(|e| {
            if over_limit(&e) {
                too_large("the compressed upload")
            } else {
                envd_error(StatusCode::BAD_REQUEST, format!("reading the upload: {e}"))
            }
        })?;
    let inflated = tokio::task::spawn_blocking(move || gunzip(&compressed, MAX_FILE_BYTES))
        .await
        .map_err(|e| envd_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    match inflated {
        Ok(Some(data)) => Ok(Bytes::from(data)),
        Ok(None) => Err(too_large("the decompressed upload")),
        Err(e) => Err(envd_error(
            StatusCode::BAD_REQUEST,
            format!("the upload is not valid gzip: {e}"),
        )),
    }
}

fn too_large(what: &str) -> Response {
    envd_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "{what} is over the {} MiB file limit; nothing was written",
            MAX_FILE_BYTES >> 20
        ),
    )
}

/// Whether a body error is the length limit's.
fn over_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// Inflates gzip `data` (one member or several, as RFC 1952 allows), reading at most one
/// byte past `limit`: `Ok(None)` when the result would be larger than `limit`.
fn gunzip(data: &[u8], limit: usize) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(data)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)?;
    Ok((out.len() <= limit).then_some(out))
}

/// The files of an upload: each multipart `file` part (named by its filename, or `path`
/// for a single part), or the raw body for `path`.
async fn uploads(
    request: Request,
    path: Option<String>,
    state: &FacadeState,
) -> Result<Vec<(String, Bytes)>, Response> {
    let multipart = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.to_ascii_lowercase().starts_with("multipart/form-data"));
    let bad = |m: String| envd_error(StatusCode::BAD_REQUEST, m);
    if !multipart {
        let Some(path) = path else {
            return Err(bad(
                "the path query parameter is required for a raw upload".into()
            ));
        };
        let body = Bytes::from_request(request, state)
            .await
            .map_err(|e| envd_error(e.status(), e.body_text()))?;
        return Ok(vec![(path, body)]);
    }
    let mut form = Multipart::from_request(request, state)
        .await
        .map_err(|e| bad(e.body_text()))?;
    let mut files = Vec::new();
    while let Some(field) = form.next_field().await.map_err(|e| bad(e.body_text()))? {
        if field.name() != Some("file") {
            continue;
        }
        let name = field.file_name().map(str::to_string);
        let data = field.bytes().await.map_err(|e| bad(e.body_text()))?;
        files.push((name, data));
    }
    match (files.len(), path) {
        (0, _) => Err(bad("no file in the upload".into())),
        (1, Some(path)) => Ok(vec![(path, files.remove(0).1)]),
        _ => files
            .into_iter()
            .map(|(name, data)| Some((name.filter(|n| !n.is_empty())?, data)))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("a file part without a filename".into())),
    }
}

async fn start(
    State(state): State<FacadeState>,
    call: EnvdCall,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    super::process::start(&state, call, headers, body).await
}

async fn watch_dir(
    State(state): State<FacadeState>,
    call: EnvdCall,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    super::watch::watch_dir_stream(&state, call, headers, body).await
}

async fn attach(
    State(state): State<FacadeState>,
    call: EnvdCall,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    super::process::attach(&state, call, headers, body).await
}

/// Connect unary calls, JSON codec only (what the SDKs use).
async fn unary(
    State(state): State<FacadeState>,
    axum::extract::Path((service, method)): axum::extract::Path<(String, String)>,
    call: EnvdCall,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.to_ascii_lowercase().starts_with("application/json"));
    if !json {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "envd speaks the Connect JSON codec here",
        )
            .into_response();
    }
    let request: Value = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            return rpc_reply(&RpcError::new(
                "invalid_argument",
                format!("unmarshal request: {e}"),
            ))
        }
    };
    let result = match (service.as_str(), method.as_str()) {
        ("filesystem.Filesystem", "Stat") => stat(&state, &call, &request).await,
        ("filesystem.Filesystem", "ListDir") => list_dir(&state, &call, &request).await,
        ("filesystem.Filesystem", "MakeDir") => make_dir(&state, &call, &request).await,
        ("filesystem.Filesystem", "Remove") => remove(&state, &call, &request).await,
        ("filesystem.Filesystem", "Move") => move_entry(&state, &call, &request).await,
        ("filesystem.Filesystem", "CreateWatcher") => {
            super::watch::create(&state, &call, &request).await
        }
        ("filesystem.Filesystem", "GetWatcherEvents") => {
            super::watch::events(&state, &call, &request).await
        }
        ("filesystem.Filesystem", "RemoveWatcher") => super::watch::remove(&state, &call, &request),
        ("process.Process", "List") => Ok(super::process::list(&state, &call)),
        ("process.Process", "SendSignal") => {
            super::process::send_signal(&state, &call, &request).await
        }
        ("process.Process", "SendInput") => super::input::send(&state, &call, &request).await,
        ("process.Process", "CloseStdin") => super::input::close(&state, &call, &request).await,
        ("process.Process", "Update") => super::input::update(&state, &call, &request).await,
        _ => Err(RpcError::new(
            "unimplemented",
            format!(
                "{}/{} is not offered by sandgate's E2B API",
                printable(&service),
                printable(&method)
            ),
        )),
    };
    match result {
        Ok(answer) => Json(answer).into_response(),
        Err(e) => rpc_reply(&e),
    }
}

fn printable(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(128).collect()
}

fn path_of(request: &Value) -> Result<String, RpcError> {
    match request["path"].as_str() {
        Some(p) if !p.is_empty() => Ok(envd::absolute(p)),
        _ => Err(RpcError::new("invalid_argument", "path is required")),
    }
}

/// The entry at `path` (listing its parent), under operation `operation`.
async fn find(
    state: &FacadeState,
    call: &EnvdCall,
    operation: &'static str,
    path: &str,
) -> Result<Option<Value>, RpcError> {
    let Some((parent, name)) = envd::split_parent(path) else {
        return Ok(Some(envd::dir_info("/")));
    };
    // Policy sees the directory listed to find the entry.
    let listed = file_action(
        &state.ops,
        &call.principal,
        &call.row.id,
        operation,
        &parent,
        parent.as_str(),
        |a, i, p| a.list_dir(i, p),
    )
    .await;
    match listed {
        Ok(entries) => Ok(entries
            .iter()
            .find(|e| e.name == name)
            .map(|e| envd::entry_info(&parent, e))),
        // The parent is missing, so the entry is (the sandbox was found running just
        // before: `EnvdCall`).
        Err(e) if e.kind == Kind::NotFound => Ok(None),
        Err(e) => Err(rpc_error(&e)),
    }
}

async fn stat(state: &FacadeState, call: &EnvdCall, request: &Value) -> Result<Value, RpcError> {
    let path = path_of(request)?;
    match find(state, call, "files.list", &path).await? {
        Some(entry) => Ok(json!({"entry": entry})),
        None => Err(RpcError::new(
            "not_found",
            format!("file not found: {path}"),
        )),
    }
}

async fn list_dir(
    state: &FacadeState,
    call: &EnvdCall,
    request: &Value,
) -> Result<Value, RpcError> {
    let path = path_of(request)?;
    let depth = request["depth"]
        .as_u64()
        .or_else(|| request["depth"].as_str()?.parse().ok())
        .filter(|d| *d > 0)
        .unwrap_or(1)
        .min(MAX_LIST_DEPTH);
    let mut out = Vec::new();
    let mut pending = vec![(path.clone(), 1)];
    while let Some((dir, level)) = pending.pop() {
        let listed = file_action(
            &state.ops,
            &call.principal,
            &call.row.id,
            "files.list",
            &dir,
            dir.as_str(),
            |a, i, p| a.list_dir(i, p),
        )
        .await;
        let entries: Vec<SandboxEntry> = match listed {
            Ok(entries) => entries,
            // Only the directory asked for must exist; one vanishing mid-walk is skipped.
            Err(e) if dir != path && e.kind == Kind::NotFound => continue,
            Err(e) => return Err(rpc_error(&e)),
        };
        for entry in &entries {
            if out.len() >= MAX_LIST_ENTRIES {
                return Ok(json!({"entries": out}));
            }
            let info = envd::entry_info(&dir, entry);
            if entry.kind == "dir" && level < depth {
                pending.push((
                    info["path"].as_str().unwrap_or_default().to_string(),
                    level + 1,
                ));
            }
            out.push(info);
        }
    }
    Ok(json!({"entries": out}))
}

async fn make_dir(
    state: &FacadeState,
    call: &EnvdCall,
    request: &Value,
) -> Result<Value, RpcError> {
    let path = path_of(request)?;
    if find(state, call, "files.mkdir", &path).await?.is_some() {
        return Err(RpcError::new(
            "already_exists",
            format!("directory already exists: {path}"),
        ));
    }
    // envd's MakeDir creates the missing parents too.
    file_action(
        &state.ops,
        &call.principal,
        &call.row.id,
        "files.mkdir",
        &path,
        path.as_str(),
        |a, i, p| a.mkdir(i, p, true),
    )
    .await
    .map_err(|e| rpc_error(&e))?;
    Ok(json!({"entry": envd::dir_info(&path)}))
}

async fn remove(state: &FacadeState, call: &EnvdCall, request: &Value) -> Result<Value, RpcError> {
    let path = path_of(request)?;
    file_action(
        &state.ops,
        &call.principal,
        &call.row.id,
        "files.delete",
        &path,
        path.as_str(),
        |a, i, p| a.remove_path(i, p, true),
    )
    .await
    .map_err(|e| rpc_error(&e))?;
    Ok(json!({}))
}

async fn move_entry(
    state: &FacadeState,
    call: &EnvdCall,
    request: &Value,
) -> Result<Value, RpcError> {
    let (from, to) = match (request["source"].as_str(), request["destination"].as_str()) {
        (Some(f), Some(t)) if !f.is_empty() && !t.is_empty() => {
            (envd::absolute(f), envd::absolute(t))
        }
        _ => {
            return Err(RpcError::new(
                "invalid_argument",
                "source and destination are required",
            ))
        }
    };
    move_path(&state.ops, &call.principal, &call.row.id, &from, &to)
        .await
        .map_err(|e| rpc_error(&e))?;
    match find(state, call, "files.list", &to).await? {
        Some(entry) => Ok(json!({"entry": entry})),
        None => Err(RpcError::new(
            "not_found",
            format!("{to} is gone after the move"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn gzip_uploads_inflate_within_the_limit_only() {
        let text = b"hello gzip\n".repeat(100);
        assert_eq!(gunzip(&gzip(&text), 4096).unwrap().unwrap(), text);
        // Two members, as RFC 1952 allows: both are inflated.
        let mut two = gzip(b"a");
        two.extend(gzip(b"b"));
        assert_eq!(gunzip(&two, 16).unwrap().unwrap(), b"ab");
        // Exactly the limit passes; one byte more is refused without inflating the rest.
        assert_eq!(
            gunzip(&gzip(&[0; 1024]), 1024).unwrap().unwrap().len(),
            1024
        );
        let bomb = gzip(&vec![0; 8 << 20]);
        assert!(bomb.len() < 64 << 10);
        assert_eq!(gunzip(&bomb, 1 << 20).unwrap(), None);
        assert!(gunzip(b"not gzip at all", 1024).is_err());
    }
}
