//! The Northflank adapter: a sandbox is one Northflank **deployment service** (an external
//! image run as one instance), managed through Northflank's REST API as the official JS
//! client `@northflank/js-client` 0.9.5 speaks it (`ApiClient.put.service.deployment`,
//! `get.service`, `list.services`, `delete.service`, `pause.service`, `resume.service`,
//! `get.project`).
//!
//! Contract:
//! - Every URL derives from the account's `base_url` (default `https://api.northflank.com`,
//!   the client's context host) under `/v1/projects/{options.project}` — or
//!   `/v1/teams/{options.team}/projects/{project}` with an organization-scoped token, as the
//!   client builds it when `teamId` is given. The key travels as the client sends it:
//!   `Authorization: Bearer <token>`. Every answer is `{data, pagination?}`; an error is
//!   `{error: {status, message, id?, details?}}`, and the client treats any status but 200
//!   as one (so the API answers 200, never 201 or 204).
//! - An instance id is the service's `id`, which Northflank derives from its `name`; sandgate
//!   chooses the name from the attempt id ([`service_name`]) and creates with `PUT
//!   /services/deployment` ("create or update"), so a create sent again for the same attempt
//!   answers the service the first one made instead of a second one. The body carries `name`,
//!   `description` (the two tags, [`description`]: Northflank's own `tags` must be defined in
//!   the team beforehand, so they cannot carry per-sandbox ids), `billing.deploymentPlan`
//!   (`options.deployment_plan`, default `nf-compute-20`), `deployment` {`instances: 1`,
//!   `external.imagePath` (the request's image, else `options.image`, else `ubuntu:24.04`),
//!   and for the default image `docker` {`configType: customCommand`, `customCommand:
//!   "sleep infinity"`} so the instance keeps running}, `runtimeEnvironment` (the spec's env
//!   plus the proxy and CA variables) and, with egress, `runtimeFiles` {[`CA_PATH`]: {`data`
//!   (base64), `encoding: "utf-8"`}}: the CA is in place when the instance starts, without
//!   any call into it.
//! - The create polls `GET /services/{id}` until `status.deployment.status` is `COMPLETED`
//!   (up to `boot_timeout_secs`); `FAILED` or the bound answer `failed_before_running`
//!   naming the service (the coordinator deletes it).
//! - `get`: `GET /services/{id}` (404: `None`). `list_by_tag`: `GET
//!   /services?per_page=100&cursor=` (`{services}` with `pagination{hasNextPage, cursor}`;
//!   Northflank's list has no filter), filtered here by the tags read back from
//!   `description`. `delete`: `DELETE /services/{id}`; 404 is success.
//! - Lifecycle only. Pause is `POST /services/{id}/pause` (Northflank scales the service to
//!   0 and keeps it); resume is `POST /services/{id}/resume` `{instances: 1}`, then polled
//!   until the deployment is `COMPLETED` again. Northflank's API does offer a command exec
//!   (a WebSocket at `/v1/command-exec/projects/{p}/services/{id}` carrying JSON frames, and
//!   file copy as tar streams over it, the client's `exec` and `fileCopy`); this adapter does
//!   not drive it yet, so exec and files answer `unsupported` and [`CAPABILITIES`] declares
//!   only pause/resume. No snapshot or fork: services have neither.
//! - Egress: Northflank has no outbound controls for a service (its `ipPolicies` and port
//!   `security` rules filter inbound traffic; egress IPs choose a source address, not a
//!   destination), so this adapter applies nothing native and its pools are `advisory` (see
//!   [`LOCKS_DOWN`]); a sandbox with egress gets the proxy and CA variables and the CA file
//!   only. A create asked to lock down answers `unsupported` and makes nothing.
//! - Failures are classified by one table ([`ERRORS`], applied by [`classify`]).
//!
//! Files: this one holds the account, the calls and the failure table; `provider` the
//! [`Provider`](crate::providers::Provider) implementation, `wire` Northflank's JSON.

mod provider;
#[cfg(test)]
mod tests;
mod wire;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::{Method, RequestBuilder};
use sandgate_router::Source;
use serde_json::{json, Value};

use super::account::{known_options, positive};
use super::errors::{own_message, ErrorTable};
use super::http::{absent_ok, path_segment, Auth, HttpFailure, ProviderHttp};
use super::lockdown::create_env;
use super::poll::{self, Pace, Seen, Waited};
use super::tags::{TAG_ATTEMPT, TAG_SANDBOX};
use crate::credentials::Secret;
use crate::providers::{
    CreateSpec, ErrorClass, OpError, OpErrorKind, ProviderError, RuntimeCapabilities, Tags,
};
use wire::{Envelope, ServiceView};

/// What this adapter does with Northflank: pause and resume (scale to 0 and back). No exec,
/// no files, no ports (see the module docs for why).
/// The whole of it: the most this adapter's pools may declare (`[providers.capabilities]`
/// narrows, never widens), and what `capabilities` answers for every sandbox.
pub const CAPABILITIES: RuntimeCapabilities = RuntimeCapabilities {
    pause_resume: true,
    ..RuntimeCapabilities::NONE
};

/// The client's production host.
pub const DEFAULT_BASE_URL: &str = "https://api.northflank.com";
/// The smallest general-purpose plan in the client's examples.
pub const DEFAULT_PLAN: &str = "nf-compute-20";
pub const DEFAULT_IMAGE: &str = "ubuntu:24.04";
/// What the default image runs, so its one instance stays up (a plain `ubuntu` exits).
pub const DEFAULT_COMMAND: &str = "sleep infinity";
/// Where sandgate's CA goes inside a sandbox (a `runtimeFiles` entry).
pub const CA_PATH: &str = "/etc/sandgate/ca.pem";
/// Why a Northflank pool is `advisory`, never `gateway`: Northflank offers no outbound
/// controls for a service (no egress allow or deny list; `ipPolicies` and port security are
/// inbound rules, egress IPs only pin the source address), so nothing can make sandgate's
/// proxy a sandbox's only destination.
pub const LOCKS_DOWN: bool = false;
const OPTIONS: &[&str] = &[
    "project",
    "team",
    "deployment_plan",
    "image",
    "boot_timeout_secs",
];
/// How often a deploying service is looked at.
const POLL_EVERY: Duration = Duration::from_millis(250);
/// sandgate's bound on a service name, so the id Northflank derives from it is the name.
const NAME_MAX: usize = 39;

/// A Northflank account's settings (`[[accounts]]` with `options`).
#[derive(Debug, Clone)]
pub struct NorthflankAccount {
    pub base_url: String,
    /// The project every sandbox is a service of.
    pub project: String,
    /// The team, for an organization-scoped token (`/v1/teams/{team}/...`).
    pub team: Option<String>,
    pub deployment_plan: String,
    pub image: String,
    /// How long a create (or a resume) waits for `COMPLETED`.
    pub boot_timeout: Duration,
    pub api_key: Secret,
}

impl NorthflankAccount {
    /// Options: `project` (required), `team`, `deployment_plan`, `image`,
    /// `boot_timeout_secs` (default 300). Errors name the option.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        api_key: Secret,
    ) -> Result<NorthflankAccount, (String, String)> {
        known_options("a northflank", options, OPTIONS)?;
        let project = text(options, "project")?.ok_or((
            "options.project".to_string(),
            "a northflank account names the project its sandboxes are services of".to_string(),
        ))?;
        let boot_timeout = positive(options, "boot_timeout_secs", "seconds")?.unwrap_or(300);
        Ok(NorthflankAccount {
            base_url: base_url.unwrap_or(DEFAULT_BASE_URL).to_string(),
            project,
            team: text(options, "team")?,
            deployment_plan: text(options, "deployment_plan")?
                .unwrap_or_else(|| DEFAULT_PLAN.to_string()),
            image: text(options, "image")?.unwrap_or_else(|| DEFAULT_IMAGE.to_string()),
            boot_timeout: Duration::from_secs(boot_timeout),
            api_key,
        })
    }
}

/// A text option: absent is `None`; empty or with control characters is an error.
fn text(
    options: &BTreeMap<String, String>,
    name: &str,
) -> Result<Option<String>, (String, String)> {
    match options.get(name).map(|v| v.trim()) {
        Some("") => Err((format!("options.{name}"), "must not be empty".into())),
        Some(v) if v.chars().any(char::is_control) => Err((
            format!("options.{name}"),
            "must not hold control characters".into(),
        )),
        Some(v) => Ok(Some(v.to_string())),
        None => Ok(None),
    }
}

/// The service name for an attempt: lowercase letters, digits and single hyphens, at most
/// [`NAME_MAX`]. sandgate's short attempt ids fit as they are (`sg-<attempt>`); anything else
/// is folded and suffixed with a digest of the original, so two attempts never share a name.
pub fn service_name(attempt_id: &str) -> String {
    let name = format!("sg-{attempt_id}");
    let clean = !attempt_id.is_empty()
        && attempt_id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !attempt_id.contains("--")
        && !attempt_id.ends_with('-');
    if clean && !attempt_id.starts_with('-') && name.len() <= NAME_MAX {
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
    let hex = hex::encode(&digest.as_ref()[..5]);
    // "sg-" + head + "-" + 10 hex digits.
    let keep = NAME_MAX - 3 - 1 - hex.len();
    let head: String = folded.chars().take(keep).collect();
    match head.trim_end_matches('-') {
        "" => format!("sg-{hex}"),
        head => format!("sg-{head}-{hex}"),
    }
}

/// The service `description` that carries a create's tags: `sandgate_sandbox=<id>
/// sandgate_attempt=<id>` (sandgate's ids hold no spaces or `=`).
pub fn description(tags: &Tags) -> String {
    format!(
        "{TAG_SANDBOX}={} {TAG_ATTEMPT}={}",
        tags.sandbox_id, tags.attempt_id
    )
}

/// The tags a `description` carries (empty when one is missing: not sandgate's service).
pub fn tags_of_description(text: Option<&str>) -> Tags {
    let mut tags = Tags {
        sandbox_id: String::new(),
        attempt_id: String::new(),
    };
    for word in text.unwrap_or_default().split_whitespace() {
        match word.split_once('=') {
            Some((TAG_SANDBOX, v)) => tags.sandbox_id = v.to_string(),
            Some((TAG_ATTEMPT, v)) => tags.attempt_id = v.to_string(),
            _ => {}
        }
    }
    tags
}

/// Northflank's answers, as the coordinator's error classes. Neither the client nor the API
/// reference lists error codes (`error.id` is an opaque identifier, not an enum), so the
/// table is by status.
///
/// | answer | class |
/// | --- | --- |
/// | never reached (connect failed) | `outage` |
/// | reached, no answer (timeout, dropped) | `unknown` (reconciled by tag) |
/// | 429 | `rate_limit` (`Retry-After` kept) |
/// | 401, 403 | `unbound_account` |
/// | 402 | `billing` (the team's plan or payment) |
/// | 404 | `unsupported` (the project or plan is unknown to this account) |
/// | 400, 422 | `invalid_request` |
/// | 409 | `provider_error` (the name is held by a service being deleted) |
/// | 408, 504 | `unknown` (the create may have gone through) |
/// | 502, 503 | `outage` |
/// | other 5xx | `provider_error` |
///
/// A 4xx made nothing; a 5xx may have ([`HttpFailure::may_have_created`]).
pub static ERRORS: ErrorTable = ErrorTable {
    code: super::errors::no_code,
    codes: &[],
    no_instance: &[],
    message: None,
    statuses: &[
        (400, ErrorClass::InvalidRequest),
        (422, ErrorClass::InvalidRequest),
        (401, ErrorClass::UnboundAccount),
        (402, ErrorClass::Billing),
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
    describe: own_message,
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

/// Why a create that must lock down cannot be made on Northflank.
pub fn lockdown_refusal() -> ProviderError {
    ProviderError::new(
        ErrorClass::Unsupported,
        "northflank has no outbound controls for a service, so the gateway cannot be made a \
         sandbox's only destination: northflank pools are advisory",
    )
}

pub struct Northflank {
    http: ProviderHttp,
    account: NorthflankAccount,
}

impl std::fmt::Debug for Northflank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Northflank")
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

impl Northflank {
    pub fn new(
        account: NorthflankAccount,
        tls: rustls::ClientConfig,
    ) -> Result<Northflank, String> {
        let http = ProviderHttp::new(
            "northflank",
            &account.base_url,
            Auth::Bearer,
            account.api_key.clone(),
            tls,
            Duration::from_secs(120),
        )?;
        Ok(Northflank { http, account })
    }

    /// `/v1/[teams/{team}/]projects/{project}` + `tail`.
    fn project_path(&self, tail: &str) -> String {
        let team = match &self.account.team {
            Some(team) => format!("/teams/{}", path_segment(team)),
            None => String::new(),
        };
        format!(
            "/v1{team}/projects/{}{tail}",
            path_segment(&self.account.project)
        )
    }

    fn service_path(&self, id: &str, tail: &str) -> String {
        self.project_path(&format!("/services/{}{tail}", path_segment(id)))
    }

    fn api(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, path)
    }

    /// The body of `PUT /services/deployment`.
    fn create_body(&self, spec: &CreateSpec) -> Value {
        let (image, default_image) = match &spec.request.source {
            Some(Source::Image(image)) => (image.clone(), false),
            _ => (self.account.image.clone(), true),
        };
        let mut deployment = json!({"instances": 1, "external": {"imagePath": image}});
        if default_image {
            deployment["docker"] =
                json!({"configType": "customCommand", "customCommand": DEFAULT_COMMAND});
        }
        let mut body = json!({
            "name": service_name(&spec.tags.attempt_id),
            "description": description(&spec.tags),
            "billing": {"deploymentPlan": self.account.deployment_plan},
            "deployment": deployment,
            "runtimeEnvironment": create_env(spec, CA_PATH),
        });
        if let Some(egress) = &spec.egress {
            let data = base64::engine::general_purpose::STANDARD.encode(&egress.ca_pem);
            body["runtimeFiles"] = json!({CA_PATH: {"data": data, "encoding": "utf-8"}});
        }
        body
    }

    async fn view(&self, id: &str) -> Result<Option<ServiceView>, HttpFailure> {
        let path = self.service_path(id, "");
        let answer: Option<Envelope<ServiceView>> = self
            .http
            .read_optional(|| self.api(Method::GET, &path))
            .await?;
        Ok(answer.map(|a| a.data))
    }

    /// Polls the service until it runs; a failure or the bound is an error message.
    async fn await_running(
        &self,
        id: &str,
        first: Option<ServiceView>,
    ) -> Result<(), (Option<HttpFailure>, String)> {
        let fetch = move || async move {
            match self.view(id).await {
                Ok(Some(view)) => Ok(view),
                Ok(None) => Err((None, format!("northflank no longer knows service {id}"))),
                Err(f) => {
                    let m = f.message.clone();
                    Err((Some(f), m))
                }
            }
        };
        let judge = |view: ServiceView| {
            if view.running() {
                Seen::Ready(())
            } else if view.failed() {
                Seen::Stop((None, format!("service {id}'s deployment FAILED")))
            } else {
                Seen::Waiting(view.deployment().to_string())
            }
        };
        let deadline = Instant::now() + self.account.boot_timeout;
        poll::until(deadline, Pace::every(POLL_EVERY), first, judge, fetch)
            .await
            .map_err(|waited| match waited {
                Waited::Stopped(e) => e,
                Waited::TimedOut(status) => (
                    None,
                    format!(
                        "service {id}'s deployment was still {status} after {}s",
                        self.account.boot_timeout.as_secs()
                    ),
                ),
            })
    }

    /// `DELETE /services/{id}`; absent is done.
    async fn remove(&self, id: &str) -> Result<(), ProviderError> {
        let path = self.service_path(id, "");
        let result = self
            .http
            .send_idempotent(|| self.api(Method::DELETE, &path))
            .await;
        absent_ok(result).map_err(provider_error)?;
        Ok(())
    }

    /// `POST /services/{id}/pause`, or `/resume` `{instances: 1}` and the wait for it to run.
    async fn set_paused(&self, id: &str, pause: bool) -> Result<(), OpError> {
        let path = self.service_path(id, if pause { "/pause" } else { "/resume" });
        let request = match pause {
            true => self.api(Method::POST, &path),
            false => self.api(Method::POST, &path).json(&json!({"instances": 1})),
        };
        self.http.send(request).await.map_err(op_error)?;
        if pause {
            return Ok(());
        }
        self.await_running(id, None)
            .await
            .map_err(|(f, m)| match f {
                Some(f) => op_error(f),
                None => OpError::new(OpErrorKind::Provider, format!("northflank: {m}")),
            })
    }
}
