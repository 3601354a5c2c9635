//! The Vercel Sandbox adapter: the REST API the official `@vercel/sandbox` SDK (3.5.0,
//! `dist/api-client/*`) speaks, at `https://vercel.com/api`.
//!
//! Contract:
//! - Every URL derives from the account: `base_url` (default `https://vercel.com/api`, the
//!   SDK's `APIClient` default; the SDK itself has no environment override, only a custom
//!   `fetch`) plus the SDK's paths. The token goes in `Authorization: Bearer`, and every call
//!   carries `?teamId=<options.team_id>` as the SDK's client adds it. The project is
//!   `options.project_id`: `projectId` in the create body and on get/delete, `project` on the
//!   list, as the SDK sends them.
//! - An instance id is the sandbox's `name` (Vercel's identifier since SDK 3); commands and
//!   files go to its current *session* (`/v2/sandboxes/sessions/{sessionId}/...`), looked
//!   up from `GET /v2/sandboxes/{name}` and cached.
//! - Create: `POST /v3/sandboxes` (or `/v2/sandboxes` when the account names a legacy
//!   `runtime`, as the SDK chooses) with `projectId`, `tags` {`sandgate_sandbox`,
//!   `sandgate_attempt`} (2 of the 5 tags Vercel allows; the SDK states no other key/value
//!   rule), `env` (the spec's plus [`RemoteEgress::env`] for [`CA_PATH`]), `timeout` (ms),
//!   `resources.vcpus`, `source: {type: "snapshot", snapshotId}` for a snapshot, else the
//!   account's `image`/`runtime` or the request's image, else Vercel's default image. The
//!   session is polled (`GET /v2/sandboxes/sessions/{id}`) until `running`, for at most
//!   [`START_TIMEOUT`]; `failed`/`aborted`/`stopped` or the timeout is
//!   `failed_before_running` naming the instance (to delete).
//! - Egress: with [`RemoteEgress::lock_down`] the create carries the `networkPolicy` of
//!   [`lockdown`] (one function for both what is sent and what [`Provider::lockdown`]
//!   shows): `{allow: [], subnets: {allow: ["<ip>/32"]}}` when the gateway host is an IP
//!   literal (`/128` for IPv6), `{allow: ["<host>"]}` for a name. An object policy denies
//!   everything it does not allow; the SDK documents `subnets.deny` as taking precedence
//!   over allowed domains *and* CIDRs, so `deny: ["0.0.0.0/0"]` would cut the gateway off
//!   too and is not sent. The sandbox's `allow_domains` are *not* added to `allow`: that
//!   would open a direct path around the gateway's per-request policy and credential
//!   injection. sandgate's CA is written to [`CA_PATH`] (under `/vercel/sandbox`, the
//!   default user's writable working directory) through `fs/write` once the session runs;
//!   a failure there fails the create (`failed_before_running` with the instance id).
//! - `list_by_tag`: `GET /v2/sandboxes?project=&tags=sandgate_sandbox:<id>` (the API filters
//!   on one tag only), every page (`pagination.next` → `cursor`), the attempt filtered here.
//!   `delete`: `DELETE /v2/sandboxes/{name}?projectId=` as the SDK's `Sandbox.delete` (it
//!   stops a running session too); 404 is success.
//! - exec: `POST .../cmd` `{command, args, cwd, env, sudo: false, wait: true, logs: true,
//!   timeout}` answered `application/x-ndjson`: a `{command}` line (its id), `{stream:
//!   "stdout"|"stderr", data}` lines, then the finished `{command: {exitCode}}`; a `{stream:
//!   "error", data: {code, message}}` line ends it without an exit code. Cancelling kills the
//!   command (`POST .../cmd/{id}/kill {signal: 9}`). Output arrives as text (`data` is a
//!   string), so non-UTF-8 output is not byte-exact.
//! - Files: `fs/read {path}` → bytes (404: not found), `fs/write` a gzip tar (entries named
//!   relative to the `x-cwd: /` header, as the SDK's `writeFiles`), `fs/mkdir {path}` (not
//!   recursive; `parents` runs `mkdir -p` as the SDK's recursive mkdir does). Lifecycle:
//!   `stop` (`POST .../stop`), `start` (`GET /v2/sandboxes/{name}?resume=true`, the SDK's
//!   resume); no pause. Snapshot: `POST .../snapshot` (Vercel stops the session when it
//!   snapshots); `DELETE /v2/sandboxes/snapshots/{id}`.
//! - Failures are classified by one table ([`ERRORS`], applied by [`classify`]). Vercel
//!   errors are `{error: {code, message}}`.
//!
//! Files: this one holds the account, the control-plane calls and the failure table;
//! `provider` the [`Provider`](crate::providers::Provider) implementation, `exec` commands
//! (the NDJSON stream), `wire` Vercel's JSON and the tar `fs/write` takes.

mod exec;
mod provider;
#[cfg(test)]
mod tests;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::StatusCode;
use reqwest::{Method, RequestBuilder};
use sandgate_router::Source;
use serde_json::{json, Value};

use super::account::{known_options, positive};
use super::errors::{CodeRule, ErrorTable};
use super::http::{path_segment, Auth, HttpFailure, ProviderHttp};
use super::lockdown::{create_env, gateway_addr, GatewayAddr};
use super::poll::{self, Pace, Seen, Waited};
use super::tags::{tag_object, TAG_SANDBOX};
use crate::credentials::Secret;
use crate::providers::RuntimeCapabilities;
use crate::providers::{CreateSpec, ErrorClass, OpError, OpErrorKind, ProviderError, RemoteEgress};
use wire::{tar_gz, ListBody, SandboxAndSession, SandboxBody, SessionOnly};

/// What this adapter does with Vercel: streamed commands it can kill, files read
/// and written, directories made; no pause (stop/start only), no PTY.
/// The whole of it: the most this adapter's pools may declare (`[providers.capabilities]`
/// narrows, never widens), and what `capabilities` answers for every sandbox.
pub const CAPABILITIES: RuntimeCapabilities = RuntimeCapabilities {
    process_execute: true,
    process_ordered_output: true,
    process_cancel: true,
    filesystem_read: true,
    filesystem_write: true,
    filesystem_mkdir: true,
    ..RuntimeCapabilities::NONE
};

/// The SDK's API base.
pub const DEFAULT_BASE_URL: &str = "https://vercel.com/api";
/// Where sandgate's CA goes inside a Vercel sandbox (the default user's working directory,
/// `/vercel/sandbox`, is writable by it).
pub const CA_PATH: &str = "/vercel/sandbox/.sandgate/ca.pem";
/// How long a create waits for its session to run.
pub const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The default sandbox timeout (ms): 45 minutes, the Hobby plan's maximum.
pub const DEFAULT_TIMEOUT_MS: u64 = 45 * 60 * 1000;
const KNOWN_OPTIONS: [&str; 6] = [
    "team_id",
    "project_id",
    "runtime",
    "image",
    "vcpus",
    "timeout_ms",
];

/// What a sandbox starts from when no snapshot is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BaseImage {
    /// Vercel's default image (`POST /v3/sandboxes` without `image`).
    Default,
    /// A container image (`image`, `/v3`).
    Image(String),
    /// A legacy runtime such as `node22` (`runtime`, `/v2`, as the SDK sends it).
    Runtime(String),
}

/// A Vercel account's settings (`[[accounts]]` with `options`).
#[derive(Debug, Clone)]
pub struct VercelAccount {
    pub base_url: String,
    pub team_id: String,
    pub project_id: String,
    pub base: BaseImage,
    pub vcpus: Option<u32>,
    /// The sandbox's timeout at Vercel, in milliseconds.
    pub timeout_ms: u64,
    pub api_key: Secret,
}

impl VercelAccount {
    /// Options: `team_id` and `project_id` (required), `runtime` or `image` (not both),
    /// `vcpus`, `timeout_ms` (default 45 min). Errors name the option.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        api_key: Secret,
    ) -> Result<VercelAccount, (String, String)> {
        known_options("a vercel", options, &KNOWN_OPTIONS)?;
        let required = |name: &str| {
            options
                .get(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .ok_or((
                    format!("options.{name}"),
                    format!("a vercel account needs {name}"),
                ))
        };
        let team_id = required("team_id")?;
        let project_id = required("project_id")?;
        let base = match (options.get("runtime"), options.get("image")) {
            (Some(_), Some(_)) => {
                return Err((
                    "options.image".into(),
                    "runtime and image cannot be used together".into(),
                ))
            }
            (Some(r), None) if !r.trim().is_empty() => BaseImage::Runtime(r.trim().into()),
            (None, Some(i)) if !i.trim().is_empty() => BaseImage::Image(i.trim().into()),
            (None, None) => BaseImage::Default,
            (Some(_), None) => {
                return Err(("options.runtime".into(), "must not be empty".into()));
            }
            (None, Some(_)) => return Err(("options.image".into(), "must not be empty".into())),
        };
        let vcpus = match options.get("vcpus") {
            Some(v) => Some(
                v.parse::<u32>()
                    .ok()
                    .filter(|v| (1..=64).contains(v))
                    .ok_or((
                        "options.vcpus".to_string(),
                        "must be a number of vCPUs from 1 to 64".to_string(),
                    ))?,
            ),
            None => None,
        };
        let timeout_ms =
            positive(options, "timeout_ms", "milliseconds")?.unwrap_or(DEFAULT_TIMEOUT_MS);
        Ok(VercelAccount {
            base_url: base_url.unwrap_or(DEFAULT_BASE_URL).to_string(),
            team_id,
            project_id,
            base,
            vcpus,
            timeout_ms,
            api_key,
        })
    }
}

pub struct Vercel {
    http: ProviderHttp,
    team_id: String,
    project_id: String,
    base: BaseImage,
    vcpus: Option<u32>,
    timeout_ms: u64,
    /// Current session ids by sandbox name.
    sessions: Mutex<HashMap<String, String>>,
    /// How often a create polls its session.
    poll: Duration,
}

impl Vercel {
    pub fn new(account: VercelAccount, tls: rustls::ClientConfig) -> Result<Vercel, String> {
        let http = ProviderHttp::new(
            "vercel",
            &account.base_url,
            Auth::Bearer,
            account.api_key,
            tls,
            Duration::from_secs(60),
        )?;
        Ok(Vercel {
            http,
            team_id: account.team_id,
            project_id: account.project_id,
            base: account.base,
            vcpus: account.vcpus,
            timeout_ms: account.timeout_ms,
            sessions: Mutex::new(HashMap::new()),
            poll: Duration::from_millis(250),
        })
    }

    /// An authenticated request carrying `teamId`.
    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, path)
            .query(&[("teamId", self.team_id.as_str())])
    }

    /// The create endpoint and body.
    fn create_body(&self, spec: &CreateSpec) -> (&'static str, Value) {
        let mut body = json!({
            "projectId": self.project_id,
            "ports": [],
            "timeout": self.timeout_ms,
            "tags": tag_object(&spec.tags),
        });
        if let Some(vcpus) = self.vcpus {
            body["resources"] = json!({"vcpus": vcpus});
        }
        let mut endpoint = "/v3/sandboxes";
        if let Some(snapshot) = &spec.snapshot {
            body["source"] = json!({"type": "snapshot", "snapshotId": snapshot});
        } else {
            match (&self.base, &spec.request.source) {
                (_, Some(Source::Image(image))) => body["image"] = json!(image),
                (BaseImage::Image(image), _) => body["image"] = json!(image),
                (BaseImage::Runtime(runtime), _) => {
                    body["runtime"] = json!(runtime);
                    endpoint = "/v2/sandboxes";
                }
                (BaseImage::Default, _) => {}
            }
        }
        if let Some(policy) = spec.egress.as_ref().and_then(lockdown) {
            body["networkPolicy"] = policy;
        }
        body["env"] = json!(create_env(spec, CA_PATH));
        (endpoint, body)
    }

    fn remember(&self, name: &str, session: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), session.to_string());
    }

    fn forget(&self, name: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    /// `GET /v2/sandboxes/{name}` (`None`: absent).
    async fn sandbox(&self, name: &str, resume: bool) -> Result<Option<SandboxBody>, HttpFailure> {
        let path = format!("/v2/sandboxes/{}", path_segment(name));
        let build = || {
            let request = self
                .request(Method::GET, &path)
                .query(&[("projectId", self.project_id.as_str())]);
            if resume {
                request.query(&[("resume", "true")])
            } else {
                request
            }
        };
        let result = if resume {
            self.http.send(build()).await
        } else {
            self.http.send_idempotent(build).await
        };
        match result {
            Ok(response) => {
                let body: SandboxAndSession = self.http.json(response).await?;
                let session = body
                    .session
                    .as_ref()
                    .map(|s| s.id.clone())
                    .unwrap_or_else(|| body.sandbox.current_session_id.clone());
                if !session.is_empty() {
                    self.remember(&body.sandbox.name, &session);
                }
                Ok(Some(body.sandbox))
            }
            Err(f) if f.status == Some(StatusCode::NOT_FOUND) => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// The current session of sandbox `name`.
    async fn session_of(&self, name: &str) -> Result<String, OpError> {
        if let Some(id) = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Ok(id.clone());
        }
        let sandbox = self
            .sandbox(name, false)
            .await
            .map_err(op_error)?
            .ok_or_else(|| {
                OpError::new(OpErrorKind::NotFound, format!("no Vercel sandbox {name}"))
            })?;
        Ok(sandbox.current_session_id)
    }

    fn session_path(session: &str, rest: &str) -> String {
        format!("/v2/sandboxes/sessions/{}{rest}", path_segment(session))
    }

    /// Polls the session until it runs, for at most [`START_TIMEOUT`].
    async fn wait_running(&self, session: &str, first: &str) -> Result<(), String> {
        let path = &Self::session_path(session, "");
        let judge = |status: String| match status.as_str() {
            "running" => Seen::Ready(()),
            "failed" | "aborted" | "stopped" | "stopping" => {
                Seen::Stop(format!("the Vercel session {session} is {status}"))
            }
            _ => Seen::Waiting(status),
        };
        let fetch = move || async move {
            let response = self
                .http
                .send_idempotent(|| self.request(Method::GET, path))
                .await
                .map_err(|f| f.message)?;
            let body: SessionOnly = self.http.json(response).await.map_err(|f| f.message)?;
            Ok(body.session.status)
        };
        let deadline = Instant::now() + START_TIMEOUT;
        let first = Some(first.to_string());
        poll::until(deadline, Pace::every(self.poll), first, judge, fetch)
            .await
            .map_err(|waited| match waited {
                Waited::Stopped(message) => message,
                Waited::TimedOut(status) => format!(
                    "the Vercel session {session} was still {status} after {}s",
                    START_TIMEOUT.as_secs()
                ),
            })
    }

    async fn put_file(&self, name: &str, path: &str, data: Vec<u8>) -> Result<(), OpError> {
        let session = self.session_of(name).await?;
        let body = tar_gz(path, &data)?;
        let request = self
            .request(Method::POST, &Self::session_path(&session, "/fs/write"))
            .header("content-type", "application/gzip")
            .header("x-cwd", "/")
            .body(body);
        self.http.send(request).await.map_err(op_error)?;
        Ok(())
    }

    async fn list_page(
        &self,
        sandbox_id: &str,
        cursor: Option<&str>,
    ) -> Result<ListBody, HttpFailure> {
        let tag = format!("{TAG_SANDBOX}:{sandbox_id}");
        let build = || {
            let mut query = vec![
                ("project", self.project_id.as_str()),
                ("limit", "100"),
                ("tags", tag.as_str()),
            ];
            if let Some(cursor) = cursor {
                query.push(("cursor", cursor));
            }
            self.request(Method::GET, "/v2/sandboxes").query(&query)
        };
        let response = self.http.send_idempotent(build).await?;
        self.http.json(response).await
    }
}

/// The `networkPolicy` of a create locked to the gateway (see the module docs), `None` for
/// an advisory pool.
pub fn lockdown(egress: &RemoteEgress) -> Option<Value> {
    if !egress.lock_down {
        return None;
    }
    Some(match gateway_addr(&egress.gateway_host) {
        GatewayAddr::V4(ip) => json!({"allow": [], "subnets": {"allow": [format!("{ip}/32")]}}),
        GatewayAddr::V6(ip) => json!({"allow": [], "subnets": {"allow": [format!("{ip}/128")]}}),
        GatewayAddr::Name(host) => json!({"allow": [host]}),
    })
}

/// Vercel's `error.code`.
fn error_code(failure: &HttpFailure) -> Option<&str> {
    failure.body.as_ref()?.get("error")?.get("code")?.as_str()
}

/// Vercel's answers, as the coordinator's error classes.
///
/// | answer | class |
/// | --- | --- |
/// | no connection made | `outage` |
/// | sent, then no answer (timeout, dropped) | `unknown` |
/// | 400, 422 | `invalid_request` |
/// | 401, 403 | `unbound_account` |
/// | 402 | `billing` |
/// | 404 (project, snapshot or image not on this account) | `unsupported` |
/// | 410 `snapshot_not_found` | `unsupported` |
/// | 409, 410, other 4xx | `provider_error` |
/// | 429 (`Retry-After` kept) | `rate_limit` |
/// | 500, 502, 503 | `outage` |
/// | 504 (the create may have gone through) | `unknown` |
///
/// The SDK and Vercel's CLI name no capacity or quota error code; none is guessed here.
pub static ERRORS: ErrorTable = ErrorTable {
    code: error_code,
    codes: &[CodeRule::with(
        410,
        "snapshot_not_found",
        ErrorClass::Unsupported,
    )],
    no_instance: &[],
    message: None,
    statuses: &[
        (400, ErrorClass::InvalidRequest),
        (422, ErrorClass::InvalidRequest),
        (401, ErrorClass::UnboundAccount),
        (403, ErrorClass::UnboundAccount),
        (402, ErrorClass::Billing),
        (404, ErrorClass::Unsupported),
        (429, ErrorClass::RateLimit),
        (500, ErrorClass::Outage),
        (502, ErrorClass::Outage),
        (503, ErrorClass::Outage),
        (504, ErrorClass::Unknown),
    ],
    op_kinds: &[
        (404, OpErrorKind::NotFound),
        (400, OpErrorKind::Invalid),
        // 410 `sandbox_stopped`, 422 `sandbox_stopping` / `sandbox_snapshotting`.
        (409, OpErrorKind::Conflict),
        (410, OpErrorKind::Conflict),
        (422, OpErrorKind::Conflict),
    ],
    describe: message,
};

/// [`ERRORS`] applied to one failure.
pub fn classify(failure: &HttpFailure) -> ErrorClass {
    ERRORS.classify(failure)
}

/// The failure's message with Vercel's own `error.message`.
fn message(failure: &HttpFailure) -> String {
    let said = failure
        .body
        .as_ref()
        .and_then(|b| b.get("error"))
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str);
    match said {
        Some(said) if !failure.message.contains(said) => {
            let said: String = said.chars().take(300).collect();
            format!("{}: {said}", failure.message)
        }
        _ => failure.message.clone(),
    }
}

fn provider_error(failure: HttpFailure) -> ProviderError {
    ERRORS.provider_error(failure)
}

fn op_error(failure: HttpFailure) -> OpError {
    ERRORS.op_error(failure)
}
