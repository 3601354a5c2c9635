//! The Blaxel adapter: sandboxes through Blaxel's control plane (`/v0/sandboxes`) and each
//! sandbox's own API (processes, filesystem), as the official Python SDK `blaxel` 0.4.24
//! speaks them (`blaxel/core/client/api/compute/*`, `blaxel/core/sandbox/default/*`).
//!
//! Contract:
//! - Every control-plane URL derives from the account's `base_url` (default
//!   `https://api.blaxel.ai/v0`, the SDK's fixed production base: the SDK has no setting for
//!   it, so a self-hosted API or a fake is configured here only). The key travels as the SDK
//!   sends it: `X-Blaxel-Authorization: Bearer <key>`, with `X-Blaxel-Workspace:
//!   <options.workspace>` and `Blaxel-Version: 2026-09-22` (without that version the API
//!   answers lists as a bare array and ignores the cursor).
//! - An instance id is the sandbox's `metadata.name`, which sandgate chooses from the attempt
//!   id ([`sandbox_name`]): a create is `POST /sandboxes?createIfNotExist=true`, so a create
//!   sent again for the same attempt answers the sandbox the first one made instead of a
//!   second one. The body carries `metadata.labels` {`sandgate_sandbox`, `sandgate_attempt`},
//!   `spec.runtime` {`image` (the request's image, else `options.image`, else
//!   `blaxel/base-image:latest`), `memory` (MB, `options.memory_mb`, default 4096), `envs`
//!   (`[{name, value}]`: the spec's env plus [`RemoteEgress::env`] for [`CA_PATH`])} and
//!   `spec.region` (`options.region`). Blaxel's create answers once the sandbox is ready
//!   (`DEPLOYED`, the SDK no longer waits); any other non-final status is polled with
//!   `GET /sandboxes/{name}` up to `boot_timeout_secs`; `FAILED`, `TERMINATED`, `DELETING` or
//!   the bound answer `failed_before_running` naming the sandbox (the coordinator deletes it).
//! - The data plane is each sandbox's own origin, its `metadata.url` (read from the create's
//!   answer or a `GET`, kept per sandbox), with the same headers: `POST /process`,
//!   `DELETE /process/{name}/kill`, `GET|PUT|DELETE /filesystem/{path}` (the path appended as
//!   the SDK does, so `/tmp/x` is `/filesystem//tmp/x`). A `metadata.url` that is not an
//!   http(s) origin is refused (the key would be sent to it).
//! - Egress: Blaxel cannot make sandgate's proxy a sandbox's only destination, so this
//!   adapter applies no native controls and its pools are `advisory` (see [`LOCKS_DOWN`] for
//!   why); a sandbox with egress gets the proxy and CA variables and the CA file only. A
//!   create asked to lock down answers `unsupported` and makes nothing.
//! - The CA PEM is written to [`CA_PATH`] with `PUT /filesystem/...` `{content}` (the API
//!   makes missing parents) once the sandbox is deployed; a failure fails the create as
//!   `failed_before_running` with the sandbox's name.
//! - `list_by_tag`: `GET /sandboxes?limit=100&cursor=` (`{data, meta{hasMore, nextCursor}}`;
//!   Blaxel's list has no label filter), filtered here by label; `FAILED`, `DELETING` and
//!   `TERMINATED` sandboxes are not live and are left out. `get`: `GET /sandboxes/{name}`;
//!   404, `DELETING` or `TERMINATED` (kept visible for a while after a delete) is `None`.
//!   `delete`: `DELETE /sandboxes/{name}` then polled until `TERMINATED` or gone (bounded);
//!   404 is success.
//! - Exec: the argv quoted into one shell command line (Blaxel runs `command` through a
//!   shell), `env` and `workingDir` as the API's own fields, a `name` sandgate chooses (the
//!   identifier a kill names), `waitForCompletion: true` and `Accept: text/event-stream`, which
//!   Blaxel answers `application/x-ndjson`: `{type: "stdout"|"stderr", data}` lines in the
//!   order the command wrote them, then `{type: "result", data: "<process JSON>"}` carrying
//!   `exitCode`. An answer that is plain JSON (an API without streaming) is the finished
//!   process with its buffered `stdout`/`stderr`. Cancel and the spec's timeout are
//!   `DELETE /process/{name}/kill`.
//! - Files: read `GET /filesystem/{path}` with `Accept: application/octet-stream` (bytes);
//!   write UTF-8 text as `PUT` `{content}`, other bytes as a multipart `PUT` (`file`,
//!   `permissions`, `path`, as the SDK's `write_binary`); `mkdir` is `PUT {isDirectory: true}`;
//!   list is `GET` of a directory (`{files, subdirectories}`); delete is `DELETE`
//!   (`?recursive=true`). No lifecycle: Blaxel puts an idle sandbox on
//!   standby and wakes it on the next call by itself, so pause/resume/stop/start answer
//!   unsupported.
//! - Failures are classified by one table ([`ERRORS`], applied by [`classify`]).
//!
//! Files: this one holds the account, the control-plane calls and the failure table;
//! `provider` the [`Provider`](crate::providers::Provider) implementation, `exec` commands
//! (the NDJSON stream), `wire` Blaxel's JSON.

mod exec;
mod provider;
#[cfg(test)]
mod tests;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::{Method, RequestBuilder};
use sandgate_router::Source;
use serde_json::{json, Value};

use super::account::{check_base_url, known_options, positive};
use super::errors::{CodeRule, ErrorTable};
use super::http::{absent_ok, path_segment, Auth, HttpFailure, ProviderHttp};
use super::lockdown::create_env;
use super::poll::{self, Pace, Seen, Waited};
use super::tags::tag_object;
use crate::credentials::Secret;
use crate::providers::RuntimeCapabilities;
use crate::providers::{CreateSpec, ErrorClass, OpError, OpErrorKind, ProviderError, RemoteEgress};
use wire::SandboxView;

/// What this adapter does with Blaxel: commands streamed in one ordered NDJSON stream
/// and killed by name, files read, written, listed, deleted and directories made; ports are
/// not published by sandgate and Blaxel has no pause of its own.
/// The whole of it: the most this adapter's pools may declare (`[providers.capabilities]`
/// narrows, never widens), and what `capabilities` answers for every sandbox.
pub const CAPABILITIES: RuntimeCapabilities = RuntimeCapabilities {
    process_execute: true,
    process_ordered_output: true,
    process_cancel: true,
    filesystem_read: true,
    filesystem_write: true,
    filesystem_list: true,
    filesystem_delete: true,
    filesystem_mkdir: true,
    ..RuntimeCapabilities::NONE
};

/// The SDK's production control plane (`settings.base_url` with `BL_ENV` unset).
pub const DEFAULT_BASE_URL: &str = "https://api.blaxel.ai/v0";
/// The API version the SDK sends (`BLAXEL_API_VERSION`).
pub const API_VERSION: &str = "2026-09-22";
/// The SDK's default image and memory (`SandboxInstance.create`).
pub const DEFAULT_IMAGE: &str = "blaxel/base-image:latest";
pub const DEFAULT_MEMORY_MB: u64 = 4096;
/// Where sandgate's CA goes inside a sandbox (the sandbox API writes as root).
pub const CA_PATH: &str = "/etc/sandgate/ca.pem";
/// Why a Blaxel pool is `advisory`, never `gateway`: Blaxel's outbound controls
/// (`spec.network`: `proxy.allowedDomains`/`forbiddenDomains`/`bypass`/`routing`, enforced by
/// Blaxel's own MITM HTTP proxy, and `firewall.rulesets: ["proxy"]`, which restricts egress
/// *to that proxy*) cannot name another proxy as the one destination: there is no address or
/// CIDR allow list, an HTTP client takes one proxy (Blaxel's or sandgate's, not a chain), and
/// private ranges, `169.254.169.254`, `.local` and `.internal` always bypass Blaxel's proxy.
pub const LOCKS_DOWN: bool = false;
const WORKSPACE_HEADER: &str = "X-Blaxel-Workspace";
const VERSION_HEADER: &str = "Blaxel-Version";
const OPTIONS: &[&str] = &[
    "workspace",
    "image",
    "memory_mb",
    "region",
    "boot_timeout_secs",
];
/// How often a deploying or deleting sandbox is looked at.
const POLL_EVERY: Duration = Duration::from_millis(250);
/// How long a delete waits for `TERMINATED` before leaving the rest to Blaxel.
const DELETE_WAIT: Duration = Duration::from_secs(30);
/// Blaxel's limit on a sandbox name (`SANDBOX_NAME_MAX_LENGTH`).
const NAME_MAX: usize = 49;

/// A Blaxel account's settings (`[[accounts]]` with `options`).
#[derive(Debug, Clone)]
pub struct BlaxelAccount {
    pub base_url: String,
    /// `X-Blaxel-Workspace`.
    pub workspace: String,
    pub image: String,
    pub memory_mb: u64,
    pub region: Option<String>,
    /// How long a create waits for `DEPLOYED`.
    pub boot_timeout: Duration,
    pub api_key: Secret,
}

impl BlaxelAccount {
    /// Options: `workspace` (required), `image`, `memory_mb`, `region`, `boot_timeout_secs`
    /// (default 300). Errors name the option.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        api_key: Secret,
    ) -> Result<BlaxelAccount, (String, String)> {
        known_options("a blaxel", options, OPTIONS)?;
        let text = |name: &str| -> Result<Option<String>, (String, String)> {
            match options.get(name).map(|v| v.trim()) {
                Some("") => Err((format!("options.{name}"), "must not be empty".into())),
                Some(v) if v.chars().any(char::is_control) => Err((
                    format!("options.{name}"),
                    "must not hold control characters".into(),
                )),
                Some(v) => Ok(Some(v.to_string())),
                None => Ok(None),
            }
        };
        let workspace = text("workspace")?.ok_or((
            "options.workspace".to_string(),
            "a blaxel account names its workspace (sent as X-Blaxel-Workspace)".to_string(),
        ))?;
        let boot_timeout = positive(options, "boot_timeout_secs", "seconds")?.unwrap_or(300);
        Ok(BlaxelAccount {
            base_url: base_url.unwrap_or(DEFAULT_BASE_URL).to_string(),
            workspace,
            image: text("image")?.unwrap_or_else(|| DEFAULT_IMAGE.to_string()),
            memory_mb: positive(options, "memory_mb", "megabytes")?.unwrap_or(DEFAULT_MEMORY_MB),
            region: text("region")?,
            boot_timeout: Duration::from_secs(boot_timeout),
            api_key,
        })
    }
}

pub struct Blaxel {
    http: ProviderHttp,
    account: BlaxelAccount,
    /// Each sandbox's data-plane origin (`metadata.url`), by name.
    origins: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for Blaxel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blaxel")
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

/// The sandbox name for an attempt: Blaxel names are lowercase letters, digits and single
/// hyphens, at most 49 characters. sandgate's attempt ids (`sb-<hex>-a<n>`) fit as they are;
/// anything else is folded and suffixed with a digest of the original, so two attempts never
/// share a name.
pub fn sandbox_name(attempt_id: &str) -> String {
    let plain = attempt_id
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let clean = plain
        && !attempt_id.is_empty()
        && !attempt_id.contains("--")
        && !attempt_id.starts_with('-')
        && !attempt_id.ends_with('-');
    let name = format!("sg-{attempt_id}");
    if clean && name.len() <= NAME_MAX {
        return name;
    }
    let mut folded = String::new();
    for c in attempt_id.chars().map(|c| c.to_ascii_lowercase()) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            folded.push(c);
        } else if !folded.is_empty() && !folded.ends_with('-') {
            folded.push('-');
        }
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, attempt_id.as_bytes());
    let hex: String = digest.as_ref()[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // "sg-" + head + "-" + 10 hex digits.
    let keep = NAME_MAX - 3 - 1 - hex.len();
    let head: String = folded.chars().take(keep).collect();
    let head = head.trim_end_matches('-');
    if head.is_empty() {
        format!("sg-{hex}")
    } else {
        format!("sg-{head}-{hex}")
    }
}

/// Blaxel's error code: `code` of a create error (`{code, message, status_code}`), or
/// `error.code` of the edge's envelope (`{error: {code, message, status}}`). The generic
/// control-plane error's `code` is the HTTP status as a number and names nothing.
fn error_code(failure: &HttpFailure) -> Option<&str> {
    let body = failure.body.as_ref()?;
    body.get("code")
        .and_then(Value::as_str)
        .or_else(|| body.get("error")?.get("code")?.as_str())
}

/// The failure's message (already redacted by the HTTP layer) with Blaxel's code, when it is
/// one of the identifiers Blaxel uses (`UPPER_SNAKE`); other text of the body is not repeated,
/// since only the failure's own message went through redaction.
fn describe(failure: &HttpFailure) -> String {
    let code = error_code(failure).filter(|c| {
        !c.is_empty()
            && c.len() <= 64
            && c.chars()
                .all(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit() || ch == '_')
    });
    match code {
        Some(code) => format!("{} ({code})", failure.message),
        None => failure.message.clone(),
    }
}

/// Blaxel's answers, as the coordinator's error classes (codes first, then statuses).
///
/// | answer | class |
/// | --- | --- |
/// | never reached (connect failed) | `outage` |
/// | reached, no answer (timeout, dropped) | `unknown` (reconciled by label) |
/// | `QUOTA_EXCEEDED`, `USAGE_LIMIT_EXCEEDED` | `quota` (Blaxel documents no capacity code apart from a workspace's quota) |
/// | `RATE_LIMIT_EXCEEDED`, `WORKSPACE_RATE_LIMIT_EXCEEDED`, 429 | `rate_limit` (`Retry-After` kept) |
/// | `UNAUTHORIZED`, `UNAUTHORIZED_WORKSPACE`, `TOKEN_REVOKED`, `AUTHENTICATION_*` (but `_UNAVAILABLE`), `FORBIDDEN`, `WORKSPACE_REQUIRED`, `WORKSPACE_NOT_FOUND`, 401, 403 | `unbound_account` |
/// | `AUTHENTICATION_UNAVAILABLE`, `SERVICE_UNAVAILABLE`, `ROUTING_UNAVAILABLE`, `WORKLOAD_UNAVAILABLE`, 502, 503 | `outage` |
/// | `INVALID_IMAGE`, `IMAGE_NOT_FOUND`, `UNSUPPORTED_GENERATION`, 404 | `unsupported` |
/// | `INVALID_REGION`, `REGION_MISMATCH` | `region_unavailable` |
/// | `VALIDATION_FAILED`, `VALIDATION_ERROR`, `INVALID_INPUT`, `INVALID_PORTS`, `BAD_REQUEST`, 400, 422 | `invalid_request` |
/// | `CREATION_TIMEOUT`, `DEPLOYMENT_FAILED` | `failed_before_running` (Blaxel cancelled and released it) |
/// | 408, 504 | `unknown` (the create may have gone through) |
/// | 409 (`SANDBOX_DELETION_IN_PROGRESS`, …), other 5xx | `provider_error` |
///
/// A create refused with a quota, rate-limit, auth, validation, image, region or
/// `AUTHENTICATION_UNAVAILABLE` code made nothing (the SDK retries the last one as "answered
/// before anything is created"); `CREATION_TIMEOUT` is documented as cancelled and released.
pub static ERRORS: ErrorTable = ErrorTable {
    code: error_code,
    codes: &[
        CodeRule::any("QUOTA_EXCEEDED", ErrorClass::Quota),
        CodeRule::any("USAGE_LIMIT_EXCEEDED", ErrorClass::Quota),
        CodeRule::any("RATE_LIMIT_EXCEEDED", ErrorClass::RateLimit),
        CodeRule::any("WORKSPACE_RATE_LIMIT_EXCEEDED", ErrorClass::RateLimit),
        CodeRule::any("UNAUTHORIZED", ErrorClass::UnboundAccount),
        CodeRule::any("UNAUTHORIZED_WORKSPACE", ErrorClass::UnboundAccount),
        CodeRule::any("TOKEN_REVOKED", ErrorClass::UnboundAccount),
        CodeRule::any("AUTHENTICATION_REQUIRED", ErrorClass::UnboundAccount),
        CodeRule::any("AUTHENTICATION_FAILED", ErrorClass::UnboundAccount),
        CodeRule::any("FORBIDDEN", ErrorClass::UnboundAccount),
        CodeRule::any("WORKSPACE_REQUIRED", ErrorClass::UnboundAccount),
        CodeRule::any("WORKSPACE_NOT_FOUND", ErrorClass::UnboundAccount),
        CodeRule::any("AUTHENTICATION_UNAVAILABLE", ErrorClass::Outage),
        CodeRule::any("SERVICE_UNAVAILABLE", ErrorClass::Outage),
        CodeRule::any("ROUTING_UNAVAILABLE", ErrorClass::Outage),
        CodeRule::any("WORKLOAD_UNAVAILABLE", ErrorClass::Outage),
        CodeRule::any("INVALID_IMAGE", ErrorClass::Unsupported),
        CodeRule::any("IMAGE_NOT_FOUND", ErrorClass::Unsupported),
        CodeRule::any("UNSUPPORTED_GENERATION", ErrorClass::Unsupported),
        CodeRule::any("INVALID_REGION", ErrorClass::RegionUnavailable),
        CodeRule::any("REGION_MISMATCH", ErrorClass::RegionUnavailable),
        CodeRule::any("VALIDATION_FAILED", ErrorClass::InvalidRequest),
        CodeRule::any("VALIDATION_ERROR", ErrorClass::InvalidRequest),
        CodeRule::any("INVALID_INPUT", ErrorClass::InvalidRequest),
        CodeRule::any("INVALID_PORTS", ErrorClass::InvalidRequest),
        CodeRule::any("BAD_REQUEST", ErrorClass::InvalidRequest),
        CodeRule::any("CREATION_TIMEOUT", ErrorClass::FailedBeforeRunning),
        CodeRule::any("DEPLOYMENT_FAILED", ErrorClass::FailedBeforeRunning),
    ],
    no_instance: &[
        "QUOTA_EXCEEDED",
        "USAGE_LIMIT_EXCEEDED",
        "RATE_LIMIT_EXCEEDED",
        "WORKSPACE_RATE_LIMIT_EXCEEDED",
        "AUTHENTICATION_UNAVAILABLE",
        "CREATION_TIMEOUT",
    ],
    message: None,
    statuses: &[
        (400, ErrorClass::InvalidRequest),
        (422, ErrorClass::InvalidRequest),
        (401, ErrorClass::UnboundAccount),
        (403, ErrorClass::UnboundAccount),
        (404, ErrorClass::Unsupported),
        (408, ErrorClass::Unknown),
        (409, ErrorClass::ProviderError),
        (429, ErrorClass::RateLimit),
        (502, ErrorClass::Outage),
        (503, ErrorClass::Outage),
        (504, ErrorClass::Unknown),
    ],
    op_kinds: &[
        (404, OpErrorKind::NotFound),
        (400, OpErrorKind::Invalid),
        (422, OpErrorKind::Invalid),
        (409, OpErrorKind::Conflict),
    ],
    describe,
};

/// [`ERRORS`] applied to one failure.
pub fn classify(failure: &HttpFailure) -> ErrorClass {
    ERRORS.classify(failure)
}

fn provider_error(failure: HttpFailure) -> ProviderError {
    ERRORS.provider_error(failure)
}

fn op_error(failure: HttpFailure) -> OpError {
    ERRORS.op_error(failure)
}

/// Why a create that must lock down cannot be made on Blaxel.
pub fn lockdown_refusal() -> ProviderError {
    ProviderError::new(
        ErrorClass::Unsupported,
        "blaxel cannot make the gateway a sandbox's only destination (its network controls \
         are a domain allow list on Blaxel's own proxy): blaxel pools are advisory",
    )
}

impl Blaxel {
    pub fn new(account: BlaxelAccount, tls: rustls::ClientConfig) -> Result<Blaxel, String> {
        let http = ProviderHttp::new(
            "blaxel",
            &account.base_url,
            Auth::NamedBearer("X-Blaxel-Authorization"),
            account.api_key.clone(),
            tls,
            Duration::from_secs(120),
        )?;
        Ok(Blaxel {
            http,
            account,
            origins: Mutex::new(HashMap::new()),
        })
    }

    /// A control-plane request with the workspace and API version headers.
    fn api(&self, method: Method, path: &str) -> RequestBuilder {
        self.with_headers(self.http.request(method, path))
    }

    fn with_headers(&self, builder: RequestBuilder) -> RequestBuilder {
        builder
            .header(WORKSPACE_HEADER, &self.account.workspace)
            .header(VERSION_HEADER, API_VERSION)
    }

    /// The body of `POST /sandboxes`.
    fn create_body(&self, spec: &CreateSpec) -> Value {
        let image = match &spec.request.source {
            Some(Source::Image(image)) => image.clone(),
            _ => self.account.image.clone(),
        };
        let envs: Vec<Value> = create_env(spec, CA_PATH)
            .into_iter()
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect();
        let mut body = json!({
            "metadata": {
                "name": sandbox_name(&spec.tags.attempt_id),
                "labels": tag_object(&spec.tags),
            },
            "spec": {
                "runtime": {
                    "image": image,
                    "memory": self.account.memory_mb,
                    "envs": envs,
                },
            },
        });
        if let Some(region) = &self.account.region {
            body["spec"]["region"] = json!(region);
        }
        body
    }

    async fn view(&self, name: &str) -> Result<Option<SandboxView>, HttpFailure> {
        let path = format!("/sandboxes/{}", path_segment(name));
        let view: Option<SandboxView> = self
            .http
            .read_optional(|| self.api(Method::GET, &path))
            .await?;
        if let Some(v) = &view {
            self.remember(v);
        }
        Ok(view)
    }

    /// Keeps a sandbox's data-plane origin, when it names a usable one.
    fn remember(&self, view: &SandboxView) {
        if let Some(url) = view.metadata.url.as_deref() {
            if check_base_url(url).is_ok() {
                self.origins
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(view.metadata.name.clone(), url.trim_end_matches('/').into());
            }
        }
    }

    /// The sandbox's data-plane origin: remembered, else read from Blaxel.
    async fn origin(&self, name: &str) -> Result<String, OpError> {
        if let Some(url) = self
            .origins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Ok(url.clone());
        }
        match self.view(name).await.map_err(op_error)? {
            None => Err(OpError::new(
                OpErrorKind::NotFound,
                format!("blaxel does not know sandbox {name}"),
            )),
            Some(view) => match view.metadata.url.as_deref() {
                Some(url) if check_base_url(url).is_ok() => {
                    Ok(url.trim_end_matches('/').to_string())
                }
                _ => Err(OpError::new(
                    OpErrorKind::Provider,
                    format!("blaxel sandbox {name} has no usable metadata.url"),
                )),
            },
        }
    }

    /// A data-plane request to the sandbox's own API (`path` starts with `/`).
    async fn data(
        &self,
        name: &str,
        method: Method,
        path: &str,
    ) -> Result<RequestBuilder, OpError> {
        let origin = self.origin(name).await?;
        Ok(self.with_headers(self.http.request_url(method, &format!("{origin}{path}"))))
    }

    /// Polls the sandbox until `DEPLOYED`; a final state or the bound is an error message.
    async fn await_deployed(
        &self,
        name: &str,
        first: SandboxView,
    ) -> Result<(), (Option<HttpFailure>, String)> {
        let fetch = move || async move {
            match self.view(name).await {
                Ok(Some(view)) => Ok(view),
                Ok(None) => Err((None, format!("blaxel no longer knows sandbox {name}"))),
                Err(f) => {
                    let m = f.message.clone();
                    Err((Some(f), m))
                }
            }
        };
        let judge = |view: SandboxView| match view.status.as_str() {
            "DEPLOYED" => Seen::Ready(()),
            "FAILED" | "TERMINATED" | "DELETING" | "DEACTIVATED" | "DEACTIVATING" => Seen::Stop((
                None,
                format!("sandbox {name} became {}{}", view.status, view.why()),
            )),
            other => Seen::Waiting(other.to_string()),
        };
        let deadline = Instant::now() + self.account.boot_timeout;
        poll::until(deadline, Pace::every(POLL_EVERY), Some(first), judge, fetch)
            .await
            .map_err(|waited| match waited {
                Waited::Stopped(e) => e,
                Waited::TimedOut(status) => (
                    None,
                    format!(
                        "sandbox {name} was still {status} after {}s",
                        self.account.boot_timeout.as_secs()
                    ),
                ),
            })
    }

    /// Writes UTF-8 text with `PUT /filesystem/{path}` `{content}` (parents are made).
    async fn write_text(&self, name: &str, path: &str, text: &str) -> Result<(), OpError> {
        let request = self
            .data(name, Method::PUT, &filesystem_path(path)?)
            .await?
            .json(&json!({"content": text}));
        self.http.send(request).await.map_err(op_error)?;
        Ok(())
    }

    async fn install_ca(&self, name: &str, egress: &RemoteEgress) -> Result<(), OpError> {
        self.write_text(name, CA_PATH, &egress.ca_pem).await
    }

    /// `DELETE /sandboxes/{name}`, then waits (bounded) for `TERMINATED` or absence.
    async fn remove(&self, name: &str) -> Result<(), ProviderError> {
        let path = format!("/sandboxes/{}", path_segment(name));
        let result = self
            .http
            .send_idempotent(|| self.api(Method::DELETE, &path))
            .await;
        match absent_ok(result) {
            Ok(None) => {
                self.forget(name);
                return Ok(());
            }
            Ok(Some(_)) => {}
            // A deletion already under way is this one's outcome too.
            Err(f) if error_code(&f) == Some("SANDBOX_DELETION_IN_PROGRESS") => {}
            Err(f) => return Err(provider_error(f)),
        }
        self.forget(name);
        let deadline = Instant::now() + DELETE_WAIT;
        loop {
            match self.view(name).await.map_err(provider_error)? {
                None => break,
                Some(v) if v.status == "TERMINATED" => break,
                Some(_) if Instant::now() >= deadline => {
                    // Blaxel accepted the deletion; it finishes it on its own.
                    tracing::warn!(sandbox = %name, "blaxel: the sandbox is still deleting");
                    break;
                }
                Some(_) => tokio::time::sleep(POLL_EVERY).await,
            }
        }
        self.forget(name);
        Ok(())
    }

    fn forget(&self, name: &str) {
        self.origins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }
}

/// `/filesystem/` + the path as the SDK appends it (each segment escaped, `/` kept, so an
/// absolute path makes `//`). A `..` segment is refused: URL parsers resolve it (escaped or
/// not), which would move the call out of `/filesystem` to another of the sandbox's endpoints.
pub fn filesystem_path(path: &str) -> Result<String, OpError> {
    let mut escaped: Vec<String> = Vec::new();
    for segment in path.split('/') {
        match segment {
            ".." => {
                return Err(OpError::new(
                    OpErrorKind::Invalid,
                    format!("{path:?}: a path with \"..\" is not sent to blaxel"),
                ))
            }
            "" => escaped.push(String::new()),
            "." => {}
            other => escaped.push(path_segment(other)),
        }
    }
    Ok(format!("/filesystem/{}", escaped.join("/")))
}
