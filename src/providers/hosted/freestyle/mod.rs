//! The Freestyle adapter: VMs through Freestyle's REST API (`/v1/vms`), as the official SDK
//! npm `freestyle-sandboxes` 0.1.46 speaks it (`ApiClient`, `VmsNamespace`, `Vm`,
//! `FileSystem`, `VmSnapshotsNamespace` in its `index.mjs`, the types in `index.d.mts`).
//!
//! Contract:
//! - Every URL derives from the account's `base_url` (default `https://api.freestyle.sh`, the
//!   SDK's default and `FREESTYLE_API_URL`); the key goes in `Authorization: Bearer`, as the
//!   SDK sends `FREESTYLE_API_KEY`.
//! - Freestyle's VMs carry no labels or metadata of any kind (neither the create body nor a
//!   listing has a key/value field), and a create takes no idempotency key. So the tags travel
//!   inside the VM: the create writes [`TAGS_PATH`] (`{sandgate_sandbox, sandgate_attempt}`)
//!   with `additionalFiles`, part of the same request, so a VM made by a create whose answer
//!   was lost carries its tags from its first moment. `list_by_tag` is `GET /v1/vms`
//!   (`{vms: [{id, state, deleted, ...}]}`, no paging, no filter) and reads each VM's tag file (a
//!   few at a time)
//!   (`GET /v1/vms/{id}/files/{path}`) unless this adapter already knows the VM's tags; a VM
//!   without the file is not sandgate's. `get` is `GET /v1/vms/{id}` (404: `None`); its tags
//!   are the ones this adapter knows (Freestyle's answer has none).
//! - Create: `POST /v1/vms` with `additionalFiles` (the tags, [`ENV_PATH`], and the CA at
//!   [`CA_PATH`] when the spec has egress), `persistence` (`options.persistence`, default
//!   `sticky`, Freestyle's own default: its docs say a sticky VM that is not running may be
//!   cleaned up under storage pressure, so a paused VM survives for sure only as
//!   `persistent`, which some plans refuse; an `ephemeral` VM may lose its files on suspend,
//!   which would make pause a delete), `ports: []` (sandgate publishes no port; Freestyle otherwise exposes 3000),
//!   `waitForReadySignal: true`, `idleTimeoutSeconds` (`options.idle_timeout_secs`) and a
//!   source: `snapshotId` from the spec's snapshot, else the request's template (a Freestyle
//!   snapshot id, `sc-...`: the SDK builds its templates into snapshots), else
//!   `options.snapshot_id`, else the account's default image. Then `GET /v1/vms/{id}` is
//!   polled to `running`, bounded by `boot_timeout_secs`; `stopped` or the bound answer
//!   `failed_before_running` naming the VM (the coordinator deletes it).
//! - Environment: Freestyle's VM API has no environment for processes (only per systemd
//!   service), so the spec's env (and [`RemoteEgress::env`] with [`CA_PATH`]) is written to
//!   [`ENV_PATH`] as `export` lines and every exec sources it first.
//! - Egress: Freestyle's VM API offers no outbound network control at all (no field of
//!   `PostV1VmsRequestBody` restricts egress), so this adapter cannot make the gateway a VM's
//!   only destination: pools are `advisory` ([`LOCKS_DOWN`]), a create asked to lock down
//!   answers `unsupported` and makes nothing, and `lockdown` shows nothing.
//! - Exec: `POST /v1/vms/{id}/exec-await` `{command, timeoutMs}` (the argv quoted into one
//!   shell line after `. ENV_PATH`) answers once the command ended: `{stdout, stderr,
//!   statusCode}`. Output is therefore delivered whole (stdout, then stderr, then the exit):
//!   no ordering across the two streams and no cancel. A `statusCode` of `null` after the
//!   spec's timeout is a timed-out command.
//! - Files: read `GET /v1/vms/{id}/files/{path}` (the path one escaped segment, as the SDK's
//!   `encodeURIComponent`) answering `{content, encoding}` (`base64` or `utf8`) or, for a
//!   directory, `{files: [{name, kind}]}` (list); write `PUT` `{content, encoding: "base64"}`.
//!   mkdir and delete run `mkdir [-p]` / `rm -f|-rf` through exec, as the SDK's
//!   `fs.mkdir` / `fs.remove` do.
//! - Lifecycle: pause `POST .../suspend` (polled to `suspended`), resume and start
//!   `POST .../start` (polled to `running`), stop `POST .../stop` (polled to `stopped`).
//!   Snapshot `POST .../snapshot` `{name}` answers `{snapshotId}`, usable as a create's
//!   `snapshotId`; deleted with `DELETE /v1/vms/snapshots/{id}` (404: done). Fork exists in
//!   Freestyle but sandgate has no fork operation.
//! - `delete`: `DELETE /v1/vms/{id}`; 404 is success.
//! - Failures are classified by one table ([`ERRORS`], applied by [`classify`]).
//!
//! Files: this one holds the account, the API calls and the failure table; `provider` the
//! [`Provider`](crate::providers::Provider) implementation, `wire` Freestyle's JSON.

mod provider;
#[cfg(test)]
mod tests;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use reqwest::Method;
use sandgate_router::Source;
use serde_json::{json, Value};

use super::account::{known_options, positive};
use super::errors::{CodeRule, ErrorTable};
use super::http::{path_segment, Auth, HttpFailure, ProviderHttp};
use super::lockdown::create_env;
use super::poll::{self, Pace, Seen, Waited};
use super::shell::shell_quote;
use super::tags::tag_object;
use crate::credentials::Secret;
use crate::providers::{
    CreateSpec, ErrorClass, OpError, OpErrorKind, ProviderError, RuntimeCapabilities, Tags,
};
use wire::{ExecView, FileView, VmView};

/// What this adapter does with Freestyle: commands run to their end (no streaming, so no
/// order across stdout and stderr and no cancel), files read, written and listed,
/// directories made and paths removed (through exec, as the SDK does), suspend and resume.
/// The whole of it: the most this adapter's pools may declare (`[providers.capabilities]`
/// narrows, never widens), and what `capabilities` answers for every VM.
pub const CAPABILITIES: RuntimeCapabilities = RuntimeCapabilities {
    process_execute: true,
    filesystem_read: true,
    filesystem_write: true,
    filesystem_list: true,
    filesystem_delete: true,
    filesystem_mkdir: true,
    pause_resume: true,
    ..RuntimeCapabilities::NONE
};

/// Why a Freestyle pool is `advisory`, never `gateway`: the VM API (`freestyle-sandboxes`
/// 0.1.46, `POST /v1/vms`) has no outbound network setting of any kind — no allow list, no
/// firewall, no proxy — so nothing native can make the gateway a VM's only destination.
pub const LOCKS_DOWN: bool = false;
/// The SDK's default API (`ApiClient`).
pub const DEFAULT_BASE_URL: &str = "https://api.freestyle.sh";
/// Where sandgate's CA goes inside a VM (written by the create's `additionalFiles`).
pub const CA_PATH: &str = "/etc/sandgate/ca.pem";
/// The VM's tags (Freestyle has no labels): `{sandgate_sandbox, sandgate_attempt}`.
pub const TAGS_PATH: &str = "/etc/sandgate/tags.json";
/// The environment every exec sources (Freestyle has no process environment of its own).
pub const ENV_PATH: &str = "/etc/sandgate/env.sh";
const OPTIONS: &[&str] = &[
    "snapshot_id",
    "persistence",
    "idle_timeout_secs",
    "boot_timeout_secs",
];
const PERSISTENCE: &[&str] = &["sticky", "persistent", "ephemeral"];
/// How often a booting or transitioning VM is looked at.
const POLL_EVERY: Duration = Duration::from_millis(250);
/// How long an exec without a timeout of its own may take (the HTTP call waits for it).
const EXEC_MAX: Duration = Duration::from_secs(3600);
/// Beyond an exec's own timeout, how long its call may still take to answer.
const EXEC_SLACK: Duration = Duration::from_secs(30);

/// A Freestyle account's settings (`[[accounts]]` with `options`).
#[derive(Debug, Clone)]
pub struct FreestyleAccount {
    pub base_url: String,
    /// The default source: a snapshot id (`sc-...`).
    pub snapshot_id: Option<String>,
    /// `persistence.type`: `sticky` (default), `persistent` or `ephemeral`.
    pub persistence: String,
    /// `idleTimeoutSeconds` (Freestyle's default: 300).
    pub idle_timeout_secs: Option<u64>,
    /// How long a create (or a transition) waits for its state.
    pub boot_timeout: Duration,
    pub api_key: Secret,
}

impl FreestyleAccount {
    /// Options: `snapshot_id`, `persistence`, `idle_timeout_secs`, `boot_timeout_secs`
    /// (default 300). Errors name the option.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        api_key: Secret,
    ) -> Result<FreestyleAccount, (String, String)> {
        known_options("a freestyle", options, OPTIONS)?;
        let snapshot_id = match options.get("snapshot_id").map(|v| v.trim()) {
            Some("") => return Err(("options.snapshot_id".into(), "must not be empty".into())),
            other => other.map(str::to_string),
        };
        let persistence = options
            .get("persistence")
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_else(|| "sticky".into());
        if !PERSISTENCE.contains(&persistence.as_str()) {
            return Err((
                "options.persistence".into(),
                format!("must be one of {}", PERSISTENCE.join(", ")),
            ));
        }
        let boot = positive(options, "boot_timeout_secs", "seconds")?.unwrap_or(300);
        Ok(FreestyleAccount {
            base_url: base_url.unwrap_or(DEFAULT_BASE_URL).to_string(),
            snapshot_id,
            persistence,
            idle_timeout_secs: positive(options, "idle_timeout_secs", "seconds")?,
            boot_timeout: Duration::from_secs(boot),
            api_key,
        })
    }
}

pub struct Freestyle {
    http: ProviderHttp,
    account: FreestyleAccount,
    /// The tags of VMs this adapter made or read (Freestyle's answers carry none).
    known: Mutex<HashMap<String, Tags>>,
}

impl std::fmt::Debug for Freestyle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Freestyle")
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

/// Freestyle's error code: `code` (what the SDK's `errorFromJSON` reads), else `error` (the
/// OpenAPI shape of some answers, `{error, message}`).
fn error_code(failure: &HttpFailure) -> Option<&str> {
    failure.field("code").or_else(|| failure.field("error"))
}

/// The failure's message with Freestyle's code when it is one (`SCREAMING_SNAKE_CASE`).
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

/// Freestyle's answers, as the coordinator's error classes (codes from the SDK's
/// `FREESTYLE_ERROR_CODE_MAP`, then statuses).
///
/// | answer | class |
/// | --- | --- |
/// | never reached (connect failed) | `outage` |
/// | reached, no answer (timeout, dropped) | `unknown` (reconciled by the tag file) |
/// | `VM_LIMIT_EXCEEDED`, `TOTAL_VM_LIMIT_EXCEEDED`, `SNAPSHOT_LIMIT_EXCEEDED` (403) | `quota` (the plan's VM count; Freestyle documents no capacity signal) |
/// | 429 | `rate_limit` (`Retry-After` kept; no code of its own in the SDK) |
/// | `UNAUTHORIZED`, `FORBIDDEN`, `VM_ACCESS_DENIED`, 401, other 403 | `unbound_account` |
/// | `PERSISTENT_VMS_NOT_ALLOWED` | `unsupported` (the plan refuses `persistence = "persistent"`) |
/// | `SNAPSHOT_NOT_FOUND`, `INVALID_SNAPSHOT_ID`, `NO_DEFAULT_SNAPSHOT_AVAILABLE`, 404 | `unsupported` (the source is not on this account) |
/// | `CREATE_VM_BAD_REQUEST`, `BAD_REQUEST`, `INVALID_REQUEST`, `VALIDATION_ERROR`, 400, 422 | `invalid_request` |
/// | `VM_START_TIMEOUT` (504), 408, other 504 | `unknown` (the VM may exist) |
/// | `UNAVAILABLE`, `SERVICE_UNAVAILABLE`, 502, 503 | `outage` |
/// | `VM_IS_SUSPENDING` (409), `VM_SETUP_FAILED`, `INTERNAL_ERROR`, other 5xx | `provider_error` |
pub static ERRORS: ErrorTable = ErrorTable {
    code: error_code,
    codes: &[
        CodeRule::any("VM_LIMIT_EXCEEDED", ErrorClass::Quota),
        CodeRule::any("TOTAL_VM_LIMIT_EXCEEDED", ErrorClass::Quota),
        CodeRule::any("SNAPSHOT_LIMIT_EXCEEDED", ErrorClass::Quota),
        CodeRule::any("UNAUTHORIZED", ErrorClass::UnboundAccount),
        CodeRule::any("FORBIDDEN", ErrorClass::UnboundAccount),
        CodeRule::any("VM_ACCESS_DENIED", ErrorClass::UnboundAccount),
        CodeRule::any("PERSISTENT_VMS_NOT_ALLOWED", ErrorClass::Unsupported),
        CodeRule::any("SNAPSHOT_NOT_FOUND", ErrorClass::Unsupported),
        CodeRule::any("INVALID_SNAPSHOT_ID", ErrorClass::Unsupported),
        CodeRule::any("NO_DEFAULT_SNAPSHOT_AVAILABLE", ErrorClass::Unsupported),
        CodeRule::any("CREATE_VM_BAD_REQUEST", ErrorClass::InvalidRequest),
        CodeRule::any("BAD_REQUEST", ErrorClass::InvalidRequest),
        CodeRule::any("INVALID_REQUEST", ErrorClass::InvalidRequest),
        CodeRule::any("VALIDATION_ERROR", ErrorClass::InvalidRequest),
        CodeRule::any("VM_START_TIMEOUT", ErrorClass::Unknown),
        CodeRule::any("UNAVAILABLE", ErrorClass::Outage),
        CodeRule::any("SERVICE_UNAVAILABLE", ErrorClass::Outage),
    ],
    no_instance: &[],
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
        (410, OpErrorKind::NotFound),
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

/// A create asked to lock down: Freestyle cannot (see [`LOCKS_DOWN`]); nothing is made.
fn lockdown_refusal() -> ProviderError {
    ProviderError::new(
        ErrorClass::Unsupported,
        "freestyle VMs have no outbound network controls: a pool of kind freestyle is \
         advisory and cannot lock a VM to the gateway",
    )
}

/// `ENV_PATH`'s content: one `export K='v'` line per variable (names that are not shell
/// names are left out: `sh` could not set them).
pub fn env_script(env: &BTreeMap<String, String>) -> String {
    let mut script = String::from("# sandgate: the sandbox's environment\n");
    for (key, value) in env {
        let name_ok = key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if name_ok {
            script.push_str(&format!("export {key}={}\n", shell_quote(value)));
        }
    }
    script
}

/// A text file for `additionalFiles`.
fn file_entry(content: &str) -> Value {
    json!({"content": content, "encoding": "utf-8"})
}

impl Freestyle {
    pub fn new(account: FreestyleAccount, tls: rustls::ClientConfig) -> Result<Freestyle, String> {
        let http = ProviderHttp::new(
            "freestyle",
            &account.base_url,
            Auth::Bearer,
            account.api_key.clone(),
            tls,
            Duration::from_secs(60),
        )?;
        Ok(Freestyle {
            http,
            account,
            known: Mutex::new(HashMap::new()),
        })
    }

    /// The body of `POST /v1/vms`.
    fn create_body(&self, spec: &CreateSpec) -> Value {
        let mut files = serde_json::Map::new();
        files.insert(
            TAGS_PATH.into(),
            file_entry(&tag_object(&spec.tags).to_string()),
        );
        files.insert(
            ENV_PATH.into(),
            file_entry(&env_script(&create_env(spec, CA_PATH))),
        );
        if let Some(egress) = &spec.egress {
            files.insert(CA_PATH.into(), file_entry(&egress.ca_pem));
        }
        let mut body = json!({
            "additionalFiles": files,
            "persistence": {"type": self.account.persistence},
            "ports": [],
            "waitForReadySignal": true,
        });
        if let Some(secs) = self.account.idle_timeout_secs {
            body["idleTimeoutSeconds"] = json!(secs);
        }
        let template = match &spec.request.source {
            Some(Source::Template(t)) => Some(t.clone()),
            _ => None,
        };
        let source = spec
            .snapshot
            .clone()
            .or(template)
            .or_else(|| self.account.snapshot_id.clone());
        if let Some(snapshot) = source {
            body["snapshotId"] = json!(snapshot);
        }
        body
    }

    fn vm_path(id: &str, rest: &str) -> String {
        format!("/v1/vms/{}{rest}", path_segment(id))
    }

    async fn view(&self, id: &str) -> Result<Option<VmView>, HttpFailure> {
        let path = Self::vm_path(id, "");
        self.http
            .read_optional(|| self.http.request(Method::GET, &path))
            .await
    }

    /// Polls the VM until it is in `target`; `stopped` (when not the target) or absence is
    /// an error.
    async fn await_state(
        &self,
        id: &str,
        target: &str,
        timeout: Duration,
    ) -> Result<(), (Option<HttpFailure>, String)> {
        let fetch = move || async move {
            match self.view(id).await {
                Ok(Some(view)) => Ok(view),
                Ok(None) => Err((None, format!("freestyle no longer knows VM {id}"))),
                Err(f) => {
                    let m = f.message.clone();
                    Err((Some(f), m))
                }
            }
        };
        let judge = |view: VmView| {
            if view.state == target {
                Seen::Ready(())
            } else if view.state == "stopped" {
                Seen::Stop((None, format!("VM {id} stopped instead of {target}")))
            } else {
                Seen::Waiting(view.state)
            }
        };
        let deadline = Instant::now() + timeout;
        poll::until(deadline, Pace::every(POLL_EVERY), None, judge, fetch)
            .await
            .map_err(|waited| match waited {
                Waited::Stopped(e) => e,
                Waited::TimedOut(state) => (
                    None,
                    format!("VM {id} was still {state} after {}s", timeout.as_secs()),
                ),
            })
    }

    /// `exec-await` of one shell command line: the finished command.
    async fn run(
        &self,
        id: &str,
        command: &str,
        timeout: Option<Duration>,
    ) -> Result<ExecView, OpError> {
        let mut body = json!({"command": command, "terminal": null, "timeoutMs": null});
        if let Some(t) = timeout {
            body["timeoutMs"] = json!(t.as_millis() as u64);
        }
        let wait = timeout.map_or(EXEC_MAX, |t| t + EXEC_SLACK);
        let request = self
            .http
            .request(Method::POST, &Self::vm_path(id, "/exec-await"))
            .timeout(wait)
            .json(&body);
        let response = self.http.send(request).await.map_err(op_error)?;
        self.http.json(response).await.map_err(op_error)
    }

    /// A shell command that must succeed (mkdir, rm): a non-zero status is the error.
    async fn run_ok(&self, id: &str, command: &str) -> Result<(), OpError> {
        let done = self.run(id, command, None).await?;
        match done.status_code {
            Some(0) => Ok(()),
            status => Err(OpError::new(
                OpErrorKind::Invalid,
                format!(
                    "`{command}` exited with {status:?}: {}",
                    done.stderr.unwrap_or_default().trim()
                ),
            )),
        }
    }

    /// `GET /v1/vms/{id}/files/{path}`: a file's content or a directory's entries.
    async fn file(&self, id: &str, path: &str) -> Result<FileView, HttpFailure> {
        let url = Self::vm_path(id, &format!("/files/{}", path_segment(path)));
        let response = self
            .http
            .send_idempotent(|| self.http.request(Method::GET, &url))
            .await?;
        self.http.json(response).await
    }

    async fn put_file(&self, id: &str, path: &str, data: &[u8]) -> Result<(), OpError> {
        let url = Self::vm_path(id, &format!("/files/{}", path_segment(path)));
        let body = json!({
            "content": base64::engine::general_purpose::STANDARD.encode(data),
            "encoding": "base64",
        });
        self.http
            .send_idempotent(|| self.http.request(Method::PUT, &url).json(&body))
            .await
            .map_err(op_error)?;
        Ok(())
    }

    /// The tags a VM carries: known here, else read from its tag file (`None`: not
    /// sandgate's, or unreadable now).
    async fn tags_of(&self, id: &str) -> Option<Tags> {
        if let Some(tags) = self.known_tags(id) {
            return Some(tags);
        }
        let content = match self.file(id, TAGS_PATH).await {
            Ok(view) => view.bytes().ok()?,
            Err(f) => {
                tracing::debug!(vm = %id, error = %f.message, "freestyle: no tag file read");
                return None;
            }
        };
        let map: BTreeMap<String, String> = serde_json::from_slice(&content).ok()?;
        let tags = super::tags::tags_of(Some(&map));
        self.remember(id, &tags);
        Some(tags)
    }

    fn known_tags(&self, id: &str) -> Option<Tags> {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    fn remember(&self, id: &str, tags: &Tags) {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), tags.clone());
    }

    fn forget(&self, id: &str) {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
}
