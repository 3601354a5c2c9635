//! E2B's control plane, translated: each endpoint the SDKs call becomes the sandgate
//! operation it names, as the caller's principal (`X-API-Key`).
//!
//! | E2B | sandgate |
//! |---|---|
//! | `POST /v2/sandboxes`, `POST /sandboxes` | create (`POST /v1/sandboxes`), waited on until placed |
//! | `GET /sandboxes/{id}` | the sandbox |
//! | `GET /v2/sandboxes`, `GET /sandboxes` | the workspace's sandboxes, by metadata (labels) and state |
//! | `DELETE /sandboxes/{id}` | delete (`sandgate.lifecycle` `delete`) |
//! | `POST /sandboxes/{id}/timeout`, `.../refreshes` | `set_timeout` (`ttl_secs`) |
//! | `POST [/v2]/sandboxes/{id}/connect`, `.../resume` | `resume` (or `start`) when not running, `set_timeout` to extend |
//! | `POST /sandboxes/{id}/pause` | `pause` |
//! | `POST /sandboxes/{id}/snapshots` | a provider snapshot (`sandgate.lifecycle` `snapshot`); `Sandbox.create(<its id>)` restores it |
//! | `GET /sandboxes/{id}/metrics` | one sample of `Provider::usage` (`sandgate.lifecycle` `metrics`) |
//! | `PUT /sandboxes/{id}/network` | 501: a sandbox's egress is fixed when it is created |
//!
//! The create's translation ([`translate`]): `templateID` through `[e2b.templates]` (`base`,
//! unlisted, is the pool's default source; a sandgate snapshot id, `snap-...` or `fsx-...`,
//! restores that snapshot); `metadata` → `labels` (plus `e2b.template`, reserved);
//! `envVars` → `env`; `timeout` (default 300 s, 15 s on the legacy path) → `ttl_secs`;
//! `allow_internet_access: false` and `network.denyOut: ["0.0.0.0/0"]` → egress restricted
//! to `network.allowOut` (domains → `allow_domains`, addresses → `cidrs`, none →
//! `deny_all`). A create that says nothing about egress gets the operator's default allow
//! list (the template's `allow_out`, else the API key's, else `[e2b] allow_out`): sandgate
//! sandboxes reach nothing by default, where E2B's reach everything. What sandgate cannot
//! honour (a deny list other than everything, `autoPause`, MCP, IAM, volumes, ...) is
//! refused with a 400 naming it, never dropped.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::errors::{api_error, api_reply, ApiRefusal};
use super::FacadeState;
use crate::create::Answer;
use crate::e2b::wire::{self, CreatedSandbox, ListedSandbox, NewSandbox, SandboxDetail};
use crate::operations::Principal;
use crate::providers::ops::Lifecycle;
use crate::store::sandboxes::{ListFilter, SandboxRow};

/// The label holding a sandbox's E2B `templateID` (not the caller's to set in `metadata`).
pub const TEMPLATE_LABEL: &str = "e2b.template";
/// The envd version answered: the SDKs gate features on it (0.5.7: octet-stream uploads
/// yes, per-file metadata no, which is what this facade serves).
pub const ENVD_VERSION: &str = "0.5.7";
/// What is answered as `clientID` (the SDKs only require it to be present).
const CLIENT_ID: &str = "sandgate";
/// How long a create is waited on before it is answered.
const CREATE_WAIT: Duration = Duration::from_secs(180);
/// Largest control-plane body.
const MAX_BODY: usize = 1 << 20;

pub fn routes(state: FacadeState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/sandboxes", post(create_legacy).get(list_running))
        .route("/v2/sandboxes", post(create_v2).get(list))
        .route("/sandboxes/{id}", get(detail).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/snapshots", post(create_snapshot))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route(
            "/sandboxes/{id}/network",
            axum::routing::put(update_network),
        )
        .fallback(|| async { api_reply(404, None, "no such E2B endpoint on this sandgate") })
        .method_not_allowed_fallback(|| async {
            api_reply(405, None, "this E2B endpoint does not take this method")
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::map_response(e2b_shape))
        .route_layer(axum::middleware::from_fn(|r, n| {
            super::count("control", r, n)
        }))
        .with_state(state)
}

/// Any error answer not already in E2B's shape (an extractor's rejection: a body over the
/// limit, a path that does not decode) becomes `{code, message}`.
async fn e2b_shape(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "the request body is over the 1 MiB limit",
        s => s.canonical_reason().unwrap_or("the request was refused"),
    };
    api_reply(status.as_u16(), None, message)
}

async fn health() -> Response {
    Json(json!({"message": "Health check successful"})).into_response()
}

/// The principal of a valid `X-API-Key`, or E2B's 401.
pub struct Keyed(pub Arc<Principal>);

impl FromRequestParts<FacadeState> for Keyed {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &FacadeState,
    ) -> Result<Self, Self::Rejection> {
        let key = parts.headers.get("x-api-key").map(|v| v.as_bytes());
        match key.and_then(|k| state.keys.authenticate_secret(k)) {
            Some(principal) => Ok(Keyed(principal)),
            None => Err(api_reply(
                401,
                None,
                "Invalid API key, please check your E2B_API_KEY (one of [[e2b.api_keys]])",
            )),
        }
    }
}

fn bad_request(message: impl Into<String>) -> Response {
    invalid(message).into_response()
}

fn invalid(message: impl Into<String>) -> ApiRefusal {
    ApiRefusal::new(400, message)
}

fn not_found(id: &str) -> Response {
    api_reply(
        404,
        None,
        &format!("sandbox \"{id}\" doesn't exist or you don't have access to it"),
    )
}

/// A JSON body, or the default when it is empty (optional bodies).
fn json_or_default<T: serde::de::DeserializeOwned + Default>(
    body: &Bytes,
) -> Result<T, ApiRefusal> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| invalid(format!("Error when parsing request: {e}")))
}

// ---------------------------------------------------------------------------- create

async fn create_v2(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    create(&state, &caller, &headers, &body, 300).await
}

async fn create_legacy(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    create(&state, &caller, &headers, &body, 15).await
}

async fn create(
    state: &FacadeState,
    caller: &Principal,
    headers: &HeaderMap,
    body: &Bytes,
    default_timeout: u64,
) -> Response {
    let new: NewSandbox = match serde_json::from_slice(body) {
        Ok(new) => new,
        Err(e) => return bad_request(format!("Error when parsing request: {e}")),
    };
    let key = headers.get("x-api-key").map(|v| v.as_bytes());
    let allow_out = state.default_allow_out(key);
    let translated = match translate(&new, default_timeout, &state.templates, allow_out) {
        Ok(body) => body,
        Err(refusal) => return refusal.into_response(),
    };
    let key = match headers.get("idempotency-key").map(|v| v.to_str()) {
        None => None,
        Some(Ok(k)) => Some(k.to_string()),
        Some(Err(_)) => return bad_request("Idempotency-Key must be visible ASCII"),
    };
    let coordinator = &state.ops.sandboxes;
    let id = match coordinator.create(caller, translated, key).await {
        Ok(answer) => answer.body()["id"].as_str().unwrap_or_default().to_string(),
        Err(e) => return api_error(&e),
    };
    match coordinator.settle(&id, CREATE_WAIT).await {
        Ok(Answer::Placing(view)) => api_reply(
            504,
            None,
            &format!(
                "sandbox {id} is still {} after {} s; placement continues, `Sandbox.connect` to it later",
                view["state"].as_str().unwrap_or("being placed"),
                CREATE_WAIT.as_secs()
            ),
        ),
        Ok(_) => match state.ops.sandboxes.store().get_sandbox(&id).await {
            Ok(Some(row)) => {
                tracing::info!(sandbox = %id, principal = %caller.principal, "e2b: sandbox created");
                (StatusCode::CREATED, Json(created(state, &row))).into_response()
            }
            _ => not_found(&id),
        },
        Err(e) => api_error(&e),
    }
}

/// E2B's create as a sandgate create body, or the 400/404 refusing what cannot be honoured.
/// `default_allow_out` (the API key's or `[e2b]`'s) is the egress of a create that names
/// none, unless its template sets its own.
pub fn translate(
    new: &NewSandbox,
    default_timeout: u64,
    templates: &BTreeMap<String, crate::config::E2bTemplate>,
    default_allow_out: &[String],
) -> Result<Value, ApiRefusal> {
    refuse_unsupported(new)?;
    let mut body = json!({});
    let template = templates.get(&new.template_id);
    match template {
        // `Sandbox.create(snapshot_id)`: the id create_snapshot answered.
        None if is_snapshot_id(&new.template_id) => {
            body["snapshot"] = json!(new.template_id);
        }
        Some(t) => {
            if let Some(source) = &t.source {
                body["source"] = json!(source);
            }
            if let Some(provider) = &t.provider {
                body["provider"] = json!(provider);
            }
            if let Some(resources) = &t.resources {
                body["resources"] = json!(resources);
            }
        }
        None if new.template_id == "base" => {}
        None => {
            let known: Vec<&str> = templates.keys().map(String::as_str).collect();
            return Err(ApiRefusal::new(
                404,
                format!(
                    "template '{}' not found: this sandgate serves base{}{} ([e2b.templates])",
                    printable(&new.template_id),
                    if known.is_empty() { "" } else { ", " },
                    known.join(", ")
                ),
            ));
        }
    }
    let timeout = new.timeout.unwrap_or(default_timeout);
    let max = crate::create::body::MAX_TTL_SECS;
    if timeout == 0 || timeout > max {
        return Err(invalid(format!(
            "timeout must be 1 to {max} seconds (sandgate deletes the sandbox when it passes)"
        )));
    }
    body["ttl_secs"] = json!(timeout);
    if new.metadata.contains_key(TEMPLATE_LABEL) {
        return Err(invalid(format!(
            "metadata key {TEMPLATE_LABEL:?} is reserved (sandgate records the templateID there)"
        )));
    }
    let mut labels = new.metadata.clone();
    labels.insert(TEMPLATE_LABEL.into(), new.template_id.clone());
    body["labels"] = json!(labels);
    if !new.env_vars.is_empty() {
        body["env"] = json!(new.env_vars);
    }
    let default = template
        .and_then(|t| t.allow_out.as_deref())
        .unwrap_or(default_allow_out);
    if let Some(network) = egress(new, default)? {
        body["network"] = network;
    }
    Ok(body)
}

/// A sandgate snapshot id (`snap-<hex>` from a provider, `fsx-<hex>` from an export).
fn is_snapshot_id(id: &str) -> bool {
    let hex = id.strip_prefix("snap-").or_else(|| id.strip_prefix("fsx-"));
    hex.is_some_and(|h| (1..=64).contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Fields of E2B's create sandgate has no equivalent for: refused when set, so nothing is
/// silently dropped. Unknown fields pass only when empty (`null`, `false`, `{}`, `[]`).
fn refuse_unsupported(new: &NewSandbox) -> Result<(), ApiRefusal> {
    if new.auto_pause == Some(true) {
        return Err(invalid(
            "autoPause is not supported: sandgate deletes a sandbox when its timeout passes",
        ));
    }
    for (name, value) in &new.other {
        let empty = match value {
            Value::Null | Value::Bool(false) => true,
            Value::Object(o) => o.is_empty(),
            Value::Array(a) => a.is_empty(),
            _ => false,
        };
        if !empty {
            return Err(invalid(format!(
                "{} is not supported by sandgate's E2B API",
                printable(name)
            )));
        }
    }
    Ok(())
}

/// The create's egress rules as sandgate's `network`, or `None` when it sets none. A
/// create that says nothing about egress (no `allowOut`, no `denyOut`, internet access not
/// refused) gets `default` (sandgate has no "everything", so `allow_internet_access: true`
/// gets it too).
fn egress(new: &NewSandbox, default: &[String]) -> Result<Option<Value>, ApiRefusal> {
    let network = new.network.clone().unwrap_or_default();
    let silent = network.allow_out.is_empty()
        && network.deny_out.is_empty()
        && new.allow_internet_access != Some(false);
    for (name, value) in &network.other {
        // Inbound traffic to the sandbox is never public through sandgate.
        let honoured = name == "allowPublicTraffic" && value.is_boolean();
        if !honoured && !value.is_null() {
            return Err(invalid(format!(
                "network.{} is not supported by sandgate's E2B API",
                printable(name)
            )));
        }
    }
    let mut deny_all = new.allow_internet_access == Some(false);
    for entry in &network.deny_out {
        if entry == "0.0.0.0/0" {
            deny_all = true;
        } else {
            return Err(invalid(format!(
                "denyOut entry {:?} cannot be honoured: sandgate enforces allow lists, so denyOut may only be [\"0.0.0.0/0\"] (everything not in allowOut)",
                printable(entry)
            )));
        }
    }
    let (mut domains, mut cidrs) = (Vec::new(), Vec::new());
    let allow_out = if silent && !default.is_empty() {
        deny_all = true;
        default
    } else {
        &network.allow_out[..]
    };
    for entry in allow_out {
        let is_address =
            entry.parse::<std::net::IpAddr>().is_ok() || entry.parse::<ipnet::IpNet>().is_ok();
        if is_address {
            cidrs.push(entry.clone());
        } else {
            domains.push(entry.clone());
        }
    }
    if !deny_all {
        if !domains.is_empty() {
            return Err(invalid(
                "allow out contains domains but deny out is missing 0.0.0.0/0 (ALL_TRAFFIC)",
            ));
        }
        // Addresses allowed where nothing is denied: E2B lets everything out.
        return Ok(None);
    }
    if domains.is_empty() && cidrs.is_empty() {
        return Ok(Some(json!({"deny_all": true})));
    }
    Ok(Some(json!({"allow_domains": domains, "cidrs": cidrs})))
}

/// Caller-sent text in a message: control characters dropped, at most 128 characters.
fn printable(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(128).collect()
}

// -------------------------------------------------------------------------- the views

/// The states E2B can show, from sandgate's: `None` for a sandbox that is gone.
fn e2b_state(state: &str) -> Option<&'static str> {
    match state {
        "pending" | "provisioning" | "reconciling" | "running" => Some("running"),
        "paused" | "stopped" => Some("paused"),
        _ => None,
    }
}

fn labels(row: &SandboxRow) -> BTreeMap<String, String> {
    serde_json::from_str(&row.labels_json).unwrap_or_default()
}

fn listed(row: &SandboxRow) -> ListedSandbox {
    let mut metadata = labels(row);
    let template = metadata
        .remove(TEMPLATE_LABEL)
        .unwrap_or_else(|| "sandgate".into());
    let request: Value = serde_json::from_str(&row.request_json).unwrap_or(Value::Null);
    let resources = &request["resources"];
    let end = row
        .expires_ms
        .unwrap_or(row.created_ms + crate::create::body::MAX_TTL_SECS as i64 * 1000);
    ListedSandbox {
        template_id: template.clone(),
        alias: Some(template),
        sandbox_id: row.id.clone(),
        client_id: CLIENT_ID.into(),
        started_at: rfc3339_ms(row.created_ms),
        end_at: rfc3339_ms(end),
        cpu_count: resources["cpu"].as_f64().map_or(0, |c| c.ceil() as u64),
        memory_mb: resources["memory_mb"].as_u64().unwrap_or(0),
        disk_size_mb: resources["disk_gb"].as_u64().map_or(0, |g| g * 1024),
        envd_version: ENVD_VERSION.into(),
        metadata,
        state: e2b_state(&row.state).unwrap_or("running").into(),
    }
}

fn created(state: &FacadeState, row: &SandboxRow) -> CreatedSandbox {
    let listed = listed(row);
    CreatedSandbox {
        template_id: listed.template_id,
        alias: listed.alias,
        sandbox_id: row.id.clone(),
        client_id: CLIENT_ID.into(),
        envd_version: ENVD_VERSION.into(),
        envd_access_token: Some(state.envd_token(&row.id)),
        domain: Some(state.answered_domain()),
        traffic_access_token: state.traffic_token(&row.id),
    }
}

fn rfc3339_ms(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    crate::base::clock::rfc3339(at)
}

/// The caller's live sandbox `id`, or the answer to give instead.
async fn live_row(
    state: &FacadeState,
    caller: &Principal,
    id: &str,
) -> Result<SandboxRow, Response> {
    match state.ops.sandboxes.store().get_sandbox(id).await {
        Ok(Some(row)) if caller.may_manage(&row.workspace) && e2b_state(&row.state).is_some() => {
            Ok(row)
        }
        Ok(_) => Err(not_found(id)),
        Err(e) => Err(api_error(&crate::create::internal(e))),
    }
}

async fn detail(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    Path(id): Path<String>,
) -> Response {
    let row = match live_row(&state, &caller, &id).await {
        Ok(row) => row,
        Err(answer) => return answer,
    };
    Json(SandboxDetail {
        listed: listed(&row),
        envd_access_token: Some(state.envd_token(&row.id)),
        domain: Some(state.answered_domain()),
        allow_internet_access: confined(&state, &row).then_some(false),
        network: Some(network(&row)),
    })
    .into_response()
}

/// Whether the sandbox's egress is confined to the proxy (its own network namespace, or a
/// hosted pool locked to the gateway): then it reaches its allow list, under the egress
/// policy, and nothing else, so `allowInternetAccess` is `false`. On an `advisory` pool (or
/// one sandgate hands only its proxy address) the sandbox could step around the proxy, so
/// nothing is claimed.
fn confined(state: &FacadeState, row: &SandboxRow) -> bool {
    let placement: Value = row
        .placement_json
        .as_deref()
        .and_then(|p| serde_json::from_str(p).ok())
        .unwrap_or(Value::Null);
    let endpoint = state
        .ops
        .sandboxes
        .endpoint(placement["pool"].as_str(), &row.id);
    matches!(endpoint.enforcement, "namespace" | "gateway")
}

/// The sandbox's egress as E2B's `network`: its allow list (`network.allow_domains` and
/// `cidrs` of the create, whatever set them) and everything else denied.
fn network(row: &SandboxRow) -> wire::SandboxNetwork {
    let request: Value = serde_json::from_str(&row.request_json).unwrap_or(Value::Null);
    let list = |field: &str| -> Vec<String> {
        request["network"][field]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut allow_out = list("allow_domains");
    allow_out.extend(list("cidrs"));
    wire::SandboxNetwork {
        allow_out,
        deny_out: vec!["0.0.0.0/0".into()],
        other: BTreeMap::new(),
    }
}

// ------------------------------------------------------------------------------ lists

/// `GET /v2/sandboxes` as parsed.
struct ListQuery {
    metadata: BTreeMap<String, String>,
    states: Vec<&'static str>,
    limit: usize,
    next: Option<String>,
}

fn parse_list_query(raw: Option<&str>) -> Result<ListQuery, String> {
    let mut q = ListQuery {
        metadata: BTreeMap::new(),
        states: Vec::new(),
        limit: 100,
        next: None,
    };
    for (key, value) in url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        match key.as_ref() {
            "metadata" => q.metadata.extend(wire::parse_metadata_filter(&value)?),
            "state" => {
                for s in value.split(',').filter(|s| !s.is_empty()) {
                    q.states.push(match s {
                        "running" => "running",
                        "paused" => "paused",
                        _ => {
                            return Err(format!(
                                "invalid state {:?}: expected running or paused",
                                printable(s)
                            ))
                        }
                    });
                }
            }
            "limit" => {
                q.limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or("limit must be an integer between 1 and 100")?
            }
            "nextToken" => {
                if sandgate_router::check_text(&value, sandgate_router::MAX_NAME_BYTES, false)
                    .is_some()
                {
                    return Err("invalid next token".into());
                }
                q.next = Some(value.into_owned());
            }
            _ => {}
        }
    }
    if q.states.is_empty() {
        q.states = vec!["running", "paused"];
    }
    Ok(q)
}

/// One page of the caller's workspace's sandboxes matching `q`, oldest first, and the
/// token of the next page when more remain.
async fn page(
    state: &FacadeState,
    caller: &Principal,
    q: &ListQuery,
) -> Result<(Vec<ListedSandbox>, Option<String>), Response> {
    let store = state.ops.sandboxes.store();
    let mut out = Vec::new();
    let mut cursor = q.next.clone();
    // Bounded: a filter matching little cannot make one request scan a whole store.
    for _ in 0..50 {
        let filter = ListFilter {
            workspace: Some(caller.workspace.clone()),
            state: None,
            label: q
                .metadata
                .iter()
                .next()
                .map(|(k, v)| (k.clone(), v.clone())),
            after: cursor.clone(),
            limit: 100,
        };
        let rows = store
            .list_sandboxes(&filter)
            .await
            .map_err(|e| api_error(&crate::create::internal(e)))?;
        let exhausted = rows.len() < 100;
        for row in &rows {
            if out.len() == q.limit {
                return Ok((out, cursor));
            }
            cursor = Some(row.id.clone());
            let labels = labels(row);
            let matches = e2b_state(&row.state).is_some_and(|s| q.states.contains(&s))
                && q.metadata.iter().all(|(k, v)| labels.get(k) == Some(v));
            if matches {
                out.push(listed(row));
            }
        }
        if exhausted {
            return Ok((out, None));
        }
    }
    Ok((out, cursor))
}

async fn list(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = match parse_list_query(raw.as_deref()) {
        Ok(q) => q,
        Err(message) => return bad_request(message),
    };
    match page(&state, &caller, &q).await {
        Ok((items, next)) => {
            let mut response = Json(items).into_response();
            if let Some(next) = next.and_then(|n| n.parse().ok()) {
                response.headers_mut().insert("x-next-token", next);
            }
            response
        }
        Err(answer) => answer,
    }
}

/// The deprecated `GET /sandboxes`: running sandboxes, by metadata, in one answer.
async fn list_running(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    RawQuery(raw): RawQuery,
) -> Response {
    let mut q = match parse_list_query(raw.as_deref()) {
        Ok(q) => q,
        Err(message) => return bad_request(message),
    };
    q.states = vec!["running"];
    let mut all = Vec::new();
    loop {
        match page(&state, &caller, &q).await {
            Ok((items, next)) => {
                all.extend(items);
                match next {
                    Some(next) if all.len() < 10_000 => q.next = Some(next),
                    _ => break,
                }
            }
            Err(answer) => return answer,
        }
    }
    Json(all).into_response()
}

// -------------------------------------------------------------------------- lifecycle

async fn kill(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    Path(id): Path<String>,
) -> Response {
    if let Err(answer) = live_row(&state, &caller, &id).await {
        return answer;
    }
    match crate::operations::delete::delete_sandbox(&state.ops, &caller, &id).await {
        Ok(Some(_)) => StatusCode::NO_CONTENT.into_response(),
        Ok(None) => not_found(&id),
        Err(e) => api_error(&e),
    }
}

async fn set_timeout(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let body: wire::TimeoutBody = match json_or_default(&body) {
        Ok(body) => body,
        Err(answer) => return answer.into_response(),
    };
    let Some(timeout) = body.timeout else {
        return bad_request("timeout is required");
    };
    if let Err(answer) = live_row(&state, &caller, &id).await {
        return answer;
    }
    match crate::operations::lifecycle::set_lifetime(&state.ops, &caller, &id, timeout).await {
        Ok(Some(_)) => StatusCode::NO_CONTENT.into_response(),
        Ok(None) => not_found(&id),
        Err(e) => api_error(&e),
    }
}

/// Extends the sandbox's life to at least `secs` from now (never shortens it).
async fn extend(
    state: &FacadeState,
    caller: &Principal,
    row: &SandboxRow,
    secs: u64,
) -> Result<(), Response> {
    let until = crate::base::clock::now_ms() + secs as i64 * 1000;
    if row.expires_ms.is_some_and(|end| end >= until) {
        return Ok(());
    }
    crate::operations::lifecycle::set_lifetime(&state.ops, caller, &row.id, secs)
        .await
        .map(|_| ())
        .map_err(|e| api_error(&e))
}

async fn refresh(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    #[derive(serde::Deserialize, Default)]
    struct Refresh {
        duration: Option<u64>,
    }
    let body: Refresh = match json_or_default(&body) {
        Ok(body) => body,
        Err(answer) => return answer.into_response(),
    };
    let row = match live_row(&state, &caller, &id).await {
        Ok(row) => row,
        Err(answer) => return answer,
    };
    match extend(&state, &caller, &row, body.duration.unwrap_or(300)).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(answer) => answer,
    }
}

/// `connect`: 201 after resuming a paused (or stopped) sandbox, 200 when it was running;
/// `timeout` extends its life, never shortens it.
async fn connect(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let body: wire::TimeoutBody = match json_or_default(&body) {
        Ok(body) => body,
        Err(answer) => return answer.into_response(),
    };
    wake(&state, &caller, &id, body.timeout, true).await
}

/// The deprecated `resume`: paused sandboxes only (409 for a running one).
async fn resume(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let body: wire::TimeoutBody = match json_or_default(&body) {
        Ok(body) => body,
        Err(answer) => return answer.into_response(),
    };
    wake(&state, &caller, &id, body.timeout, false).await
}

async fn wake(
    state: &FacadeState,
    caller: &Principal,
    id: &str,
    timeout: Option<u64>,
    running_ok: bool,
) -> Response {
    let row = match live_row(state, caller, id).await {
        Ok(row) => row,
        Err(answer) => return answer,
    };
    let op = match row.state.as_str() {
        "paused" => Some(Lifecycle::Resume),
        "stopped" => Some(Lifecycle::Start),
        _ if running_ok => None,
        _ => {
            return api_reply(
                409,
                None,
                &format!("Sandbox {id} can't be resumed, it's already running"),
            )
        }
    };
    let status = match op {
        Some(op) => match crate::operations::lifecycle::lifecycle(&state.ops, caller, id, op).await
        {
            Ok(_) => StatusCode::CREATED,
            Err(e) => return api_error(&e),
        },
        None => StatusCode::OK,
    };
    if let Some(secs) = timeout {
        if let Err(answer) = extend(state, caller, &row, secs).await {
            return answer;
        }
    }
    match state.ops.sandboxes.store().get_sandbox(id).await {
        Ok(Some(row)) => (status, Json(created(state, &row))).into_response(),
        _ => not_found(id),
    }
}

async fn pause(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    Path(id): Path<String>,
) -> Response {
    let row = match live_row(&state, &caller, &id).await {
        Ok(row) => row,
        Err(answer) => return answer,
    };
    if row.state == "paused" {
        return api_reply(409, None, &format!("Sandbox \"{id}\" is already paused"));
    }
    match crate::operations::lifecycle::lifecycle(&state.ops, &caller, &id, Lifecycle::Pause).await
    {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => api_error(&e),
    }
}

// -------------------------------------------------------------- snapshots, metrics, network

/// `create_snapshot`: a provider snapshot (files; sandgate's snapshots keep no memory), so
/// `memory: true` (the SDK's `mode="full"`) and a `name` are refused rather than dropped.
async fn create_snapshot(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    #[derive(serde::Deserialize, Default)]
    struct SnapshotRequest {
        name: Option<String>,
        memory: Option<bool>,
    }
    let body: SnapshotRequest = match json_or_default(&body) {
        Ok(body) => body,
        Err(answer) => return answer.into_response(),
    };
    if body.name.is_some_and(|n| !n.is_empty()) {
        return bad_request(
            "snapshot names are not supported by sandgate's E2B API: use the snapshotID answered",
        );
    }
    if body.memory == Some(true) {
        return bad_request(
            "memory snapshots are not supported: sandgate's snapshots keep the filesystem (mode=\"filesystem\")",
        );
    }
    if let Err(answer) = live_row(&state, &caller, &id).await {
        return answer;
    }
    let request = crate::operations::snapshots::SnapshotRequest::default();
    match crate::operations::snapshots::take_snapshot(&state.ops, &caller, &id, &request).await {
        Ok(view) => {
            let snapshot_id = view.snapshot.id.as_str();
            tracing::info!(sandbox = %id, snapshot = %snapshot_id, principal = %caller.principal, "e2b: snapshot taken");
            (
                StatusCode::CREATED,
                Json(json!({"snapshotID": snapshot_id, "names": []})),
            )
                .into_response()
        }
        Err(e) => api_error(&e),
    }
}

/// `get_metrics`: one sample, now (sandgate keeps no history, so `start`/`end` do not
/// select among past samples).
async fn metrics(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    Path(id): Path<String>,
) -> Response {
    if let Err(answer) = live_row(&state, &caller, &id).await {
        return answer;
    }
    match crate::operations::usage::usage(&state.ops, &caller, &id).await {
        Ok(u) => {
            let now = crate::base::clock::now_ms();
            Json(json!([{
                "timestamp": rfc3339_ms(now),
                "timestampUnix": now / 1000,
                "cpuCount": u.cpu_count,
                "cpuUsedPct": u.cpu_used_pct,
                "memUsed": u.mem_used_bytes,
                "memTotal": u.mem_total_bytes,
                "memCache": u.mem_cache_bytes,
                "diskUsed": u.disk_used_bytes,
                "diskTotal": u.disk_total_bytes,
            }]))
            .into_response()
        }
        Err(e) => api_error(&e),
    }
}

/// `update_network`: refused with 501 (the SDK raises it as a `SandboxException` with
/// `status_code` 501, not as "sandbox not found"). A sandbox's egress is judged by the
/// creation policy when it is created and fixed from then on; changing it live would step
/// around that judgement. Create a new sandbox with the network it needs.
async fn update_network(
    State(state): State<FacadeState>,
    Keyed(caller): Keyed,
    Path(id): Path<String>,
) -> Response {
    if let Err(answer) = live_row(&state, &caller, &id).await {
        return answer;
    }
    api_reply(
        501,
        None,
        "unsupported: updating a sandbox's network is not supported by sandgate: its egress is fixed when it is created (where the creation policy judges it); create a sandbox with the network it needs",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(body: Value) -> NewSandbox {
        serde_json::from_value(body).unwrap()
    }

    fn status(r: Result<Value, ApiRefusal>) -> u16 {
        r.err().map(|r| r.status).unwrap_or(0)
    }

    #[test]
    fn a_create_translates_field_by_field() {
        let body = translate(
            &new(json!({
                "templateID": "base", "timeout": 60, "metadata": {"team": "a"},
                "envVars": {"K": "v"}, "secure": true, "autoPause": false,
                "network": {"allowOut": ["api.test", "10.0.0.1"], "denyOut": ["0.0.0.0/0"]}
            })),
            300,
            &BTreeMap::new(),
            &[],
        )
        .unwrap();
        assert_eq!(body["ttl_secs"], 60);
        assert_eq!(body["labels"], json!({"team": "a", "e2b.template": "base"}));
        assert_eq!(body["env"], json!({"K": "v"}));
        assert_eq!(
            body["network"],
            json!({"allow_domains": ["api.test"], "cidrs": ["10.0.0.1"]})
        );
        let closed = translate(
            &new(json!({"templateID": "base", "allow_internet_access": false})),
            300,
            &BTreeMap::new(),
            &[],
        )
        .unwrap();
        assert_eq!(closed["network"], json!({"deny_all": true}));
        assert_eq!(closed["ttl_secs"], 300);
    }

    #[test]
    fn a_create_silent_on_egress_gets_the_operators_default() {
        let default = ["pypi.org".to_string(), "10.1.0.0/16".to_string()];
        let mut templates = BTreeMap::new();
        templates.insert(
            "closed".to_string(),
            crate::config::E2bTemplate {
                allow_out: Some(vec![]),
                ..Default::default()
            },
        );
        templates.insert(
            "npm".to_string(),
            crate::config::E2bTemplate {
                allow_out: Some(vec!["registry.npmjs.org".into()]),
                ..Default::default()
            },
        );
        let network = |body: Value| {
            translate(&new(body), 300, &templates, &default).unwrap()["network"].clone()
        };
        let pypi = json!({"allow_domains": ["pypi.org"], "cidrs": ["10.1.0.0/16"]});
        assert_eq!(network(json!({"templateID": "base"})), pypi);
        assert_eq!(
            network(json!({"templateID": "base", "allow_internet_access": true})),
            pypi
        );
        assert_eq!(
            network(json!({"templateID": "npm"})),
            json!({"allow_domains": ["registry.npmjs.org"], "cidrs": []})
        );
        // A template's `[]` is its own default: nothing, whatever the key's.
        assert_eq!(network(json!({"templateID": "closed"})), Value::Null);
        // What the create says wins.
        assert_eq!(
            network(json!({"templateID": "base", "allow_internet_access": false})),
            json!({"deny_all": true})
        );
        assert_eq!(
            network(
                json!({"templateID": "npm", "network": {"allowOut": ["a.test"], "denyOut": ["0.0.0.0/0"]}})
            ),
            json!({"allow_domains": ["a.test"], "cidrs": []})
        );
        let restore = translate(
            &new(json!({"templateID": "snap-0123456789ab"})),
            300,
            &templates,
            &[],
        )
        .unwrap();
        assert_eq!(restore["snapshot"], "snap-0123456789ab");
        assert_eq!(restore["labels"]["e2b.template"], "snap-0123456789ab");
        assert!(!is_snapshot_id("snap-../x") && !is_snapshot_id("snap-"));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_never_dropped() {
        let t = BTreeMap::new();
        for body in [
            json!({"templateID": "base", "network": {"denyOut": ["10.0.0.0/8"]}}),
            json!({"templateID": "base", "network": {"allowOut": ["a.test"]}}),
            json!({"templateID": "base", "autoPause": true}),
            json!({"templateID": "base", "mcp": {"github": {}}}),
            json!({"templateID": "base", "network": {"maskRequestHost": "x"}}),
            json!({"templateID": "base", "timeout": 0}),
            json!({"templateID": "base", "metadata": {"e2b.template": "x"}}),
        ] {
            assert_eq!(
                status(translate(&new(body.clone()), 300, &t, &[])),
                400,
                "{body}"
            );
        }
        assert_eq!(
            status(translate(
                &new(json!({"templateID": "python"})),
                300,
                &t,
                &[]
            )),
            404
        );
        let mut templates = BTreeMap::new();
        templates.insert(
            "python".to_string(),
            crate::config::E2bTemplate {
                provider: Some("local".into()),
                ..Default::default()
            },
        );
        let body = translate(&new(json!({"templateID": "python"})), 300, &templates, &[]).unwrap();
        assert_eq!(body["provider"], "local");
    }

    #[test]
    fn list_queries_are_parsed_as_e2b_does() {
        let q =
            parse_list_query(Some("metadata=a%3Db&state=running&limit=5&nextToken=sb-1")).unwrap();
        assert_eq!(q.metadata["a"], "b");
        assert_eq!(q.states, ["running"]);
        assert_eq!((q.limit, q.next.as_deref()), (5, Some("sb-1")));
        assert!(parse_list_query(Some("limit=0")).is_err());
        assert!(parse_list_query(Some("state=dead")).is_err());
        assert_eq!(
            parse_list_query(None).unwrap().states,
            ["running", "paused"]
        );
    }
}
