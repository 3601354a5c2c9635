//! The CodeSandbox adapter: sandboxes (microVMs) through CodeSandbox's REST API as the
//! official SDK `@codesandbox/sdk` 2.4.2 speaks it (`API` in `dist/esm/index.js`, the
//! generated client `api-clients/client/sdk.gen`): `POST /sandbox/{id}/fork`,
//! `POST /vm/{id}/start|hibernate|shutdown`, `GET /sandbox`, `GET /sandbox/{id}`,
//! `DELETE /vm/{id}`.
//!
//! Contract:
//! - Every URL derives from the account's `base_url` (default `https://api.codesandbox.io`,
//!   the SDK's for `csb_` keys; the SDK reads `CSB_BASE_URL` or `opts.baseUrl`). The key
//!   travels as the SDK sends it: `Authorization: Bearer <key>`. Answers are wrapped as
//!   `{data, errors, success}`; errors are `{errors: [string | object]}`.
//! - Lifecycle only: CodeSandbox runs commands and file operations only inside a VM, through
//!   the per-VM agent the SDK reaches with the `pitcher_url`/`pitcher_token` a start answers
//!   (a WebSocket protocol, or the `pint` REST API at `/api/v1/execs|files` when the start
//!   answers `use_pint`), never through this control-plane API; this adapter does not speak
//!   the agent, so exec and files answer `unsupported` (501) and [`CAPABILITIES`] declares
//!   pause/resume only. The router never places a request with the portable baseline here.
//! - Create is the SDK's `sandboxes.create`: fork the template (the request's `template`,
//!   else `options.template`, else the SDK's universal template `pcz35m`; a create from a
//!   snapshot forks the snapshot) with `title` `sandgate-<sandbox id>`, `tags` (one
//!   `sandgate_sandbox=<id>` and one `sandgate_attempt=<id>`: CodeSandbox tags are plain
//!   strings), `privacy: 2` and `private_preview: true` (nothing published), `path`
//!   `/sandgate`; then start the VM (`POST /vm/{id}/start` with `tier` and
//!   `hibernation_timeout_seconds` from `options`). The fork has no idempotency key: a fork
//!   whose answer is lost is `unknown` and found again by its tags; `Provider::adopt`
//!   starts it. A start that fails names the sandbox (the coordinator deletes it).
//! - Egress: CodeSandbox has no outbound network controls and no way to give a sandbox
//!   environment variables or files at create, so its pools are `advisory` ([`LOCKS_DOWN`])
//!   and nothing of `RemoteEgress` reaches the sandbox; a create asked to lock down
//!   answers `unsupported` and makes nothing.
//! - `get`: `GET /sandbox/{id}` (404: `None`); an existing sandbox is `running` whether its
//!   VM runs or hibernates (CodeSandbox wakes it on `start`). `list_by_tag`:
//!   `GET /sandbox?tags=a,b&page=&page_size=50` (`pagination.next_page`), filtered here
//!   too. `delete`: `DELETE /vm/{id}`; 404 is success.
//! - Lifecycle: `pause` is `hibernate` (memory snapshot), `resume` and `start` are
//!   `start`, `stop` is `shutdown` (files kept). `snapshot` is a fork that is not started,
//!   tagged `sandgate_snapshot=<id>`: its id seeds a later create; deleting it is
//!   `DELETE /vm/{id}`.
//! - Failures are classified by one table ([`ERRORS`], applied by [`classify`]).
//!
//! Files: this one holds the account, the calls and the failure table; `provider` the
//! [`Provider`](crate::providers::Provider) implementation, `wire` CodeSandbox's JSON.

mod provider;
#[cfg(test)]
mod tests;
mod wire;

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use sandgate_router::Source;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::account::{known_options, positive};
use super::errors::ErrorTable;
use super::http::{path_segment, Auth, HttpFailure, ProviderHttp};
use crate::credentials::Secret;
use crate::providers::RuntimeCapabilities;
use crate::providers::{CreateSpec, ErrorClass, OpError, OpErrorKind, ProviderError};
use wire::{Envelope, Forked, Started};

/// What this adapter does with CodeSandbox: pause (hibernate) and resume, nothing inside
/// the VM (see the module docs). The most its pools may declare.
pub const CAPABILITIES: RuntimeCapabilities = RuntimeCapabilities {
    pause_resume: true,
    ..RuntimeCapabilities::NONE
};

/// The SDK's API for `csb_` keys (`getInferredBaseUrl`).
pub const DEFAULT_BASE_URL: &str = "https://api.codesandbox.io";
/// The SDK's default template, its "universal" image (`getDefaultTemplateTag`).
pub const DEFAULT_TEMPLATE: &str = "pcz35m";
/// Why a CodeSandbox pool is `advisory`, never `gateway`: CodeSandbox's API has no outbound
/// network setting at all (neither the fork nor the VM start takes one), and a sandbox cannot
/// even be given the proxy variables at create.
pub const LOCKS_DOWN: bool = false;
/// The VM tiers a start accepts (`VmStartRequest.tier`).
pub const TIERS: &[&str] = &[
    "Pico", "Nano", "Micro", "Small", "Medium", "Large", "XLarge",
];
/// The tag a snapshot (an unstarted fork) carries, with its source sandbox.
pub const TAG_SNAPSHOT: &str = "sandgate_snapshot";
const OPTIONS: &[&str] = &["template", "tier", "hibernation_timeout_secs"];
/// CodeSandbox's bound on `hibernation_timeout_seconds` (24 h).
const HIBERNATION_MAX: u64 = 86_400;
/// The collection sandgate's sandboxes are kept in (`path`).
const COLLECTION: &str = "/sandgate";

/// A CodeSandbox account's settings (`[[accounts]]` with `options`).
#[derive(Debug, Clone)]
pub struct CodesandboxAccount {
    pub base_url: String,
    /// The template (sandbox id or tag) a create without one forks.
    pub template: String,
    /// The VM tier a start asks for (CodeSandbox's workspace default when unset).
    pub tier: Option<String>,
    /// Inactivity before CodeSandbox hibernates the VM (its default, 300 s, when unset).
    pub hibernation_timeout_secs: Option<u64>,
    pub api_key: Secret,
}

impl CodesandboxAccount {
    /// Options: `template`, `tier` (one of [`TIERS`]), `hibernation_timeout_secs`
    /// (1..=86400). Errors name the option.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        api_key: Secret,
    ) -> Result<CodesandboxAccount, (String, String)> {
        known_options("a codesandbox", options, OPTIONS)?;
        let template = match options.get("template").map(|v| v.trim()) {
            None => DEFAULT_TEMPLATE.to_string(),
            Some(t) if valid_id(t) => t.to_string(),
            Some(_) => {
                return Err((
                    "options.template".into(),
                    "must be a sandbox id or template tag (letters, digits, - and _)".into(),
                ))
            }
        };
        let tier = match options.get("tier").map(|v| v.trim()) {
            None => None,
            Some(t) if TIERS.contains(&t) => Some(t.to_string()),
            Some(_) => {
                return Err((
                    "options.tier".into(),
                    format!("must be one of {}", TIERS.join(", ")),
                ))
            }
        };
        let hibernation = positive(options, "hibernation_timeout_secs", "seconds")?;
        if hibernation.is_some_and(|s| s > HIBERNATION_MAX) {
            return Err((
                "options.hibernation_timeout_secs".into(),
                format!("must be at most {HIBERNATION_MAX} seconds (24 hours)"),
            ));
        }
        Ok(CodesandboxAccount {
            base_url: base_url.unwrap_or(DEFAULT_BASE_URL).to_string(),
            template,
            tier,
            hibernation_timeout_secs: hibernation,
            api_key,
        })
    }
}

/// A template or sandbox id as CodeSandbox spells them (short ids, tags such as `pcz35m`).
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

pub struct Codesandbox {
    http: ProviderHttp,
    account: CodesandboxAccount,
}

impl std::fmt::Debug for Codesandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codesandbox")
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

/// The first entry of CodeSandbox's `errors` (what the SDK shows), when it is a string.
fn first_error(failure: &HttpFailure) -> Option<&str> {
    failure.body.as_ref()?.get("errors")?.get(0)?.as_str()
}

/// The failure's message with CodeSandbox's first error, cut short. That text is the
/// provider's own prose about the request (never the key: the HTTP layer redacts the
/// message, and CodeSandbox does not echo credentials).
fn describe(failure: &HttpFailure) -> String {
    match first_error(failure) {
        Some(said) if !failure.message.contains(said) => {
            let said: String = said.chars().take(200).collect();
            format!("{}: {said}", failure.message)
        }
        _ => failure.message.clone(),
    }
}

/// CodeSandbox's answers, as the coordinator's error classes. CodeSandbox sends no error
/// codes (its `errors` are prose), so the table is by status, as the SDK's
/// `handleResponse` reads them.
///
/// | answer | class |
/// | --- | --- |
/// | never reached (connect failed) | `outage` |
/// | reached, no answer (timeout, dropped) | `unknown` (reconciled by tag) |
/// | 400, 422 | `invalid_request` |
/// | 401, 403 (the SDK: "Unauthorized") | `unbound_account` |
/// | 402 | `billing` |
/// | 404 (a template or sandbox CodeSandbox does not know) | `unsupported` |
/// | 408, 504 | `unknown` (the fork may have gone through) |
/// | 409 | `provider_error` |
/// | 429 (the SDK's `RateLimitError`) | `rate_limit` (`Retry-After` kept) |
/// | 502 (the SDK: "Bad gateway") | `outage` |
/// | 503 (the SDK: "overloaded ... try again in a moment") | `capacity` |
/// | other 5xx | `provider_error` |
pub static ERRORS: ErrorTable = ErrorTable {
    code: super::errors::no_code,
    codes: &[],
    no_instance: &[],
    message: None,
    statuses: &[
        (400, ErrorClass::InvalidRequest),
        (422, ErrorClass::InvalidRequest),
        (401, ErrorClass::UnboundAccount),
        (403, ErrorClass::UnboundAccount),
        (402, ErrorClass::Billing),
        (404, ErrorClass::Unsupported),
        (408, ErrorClass::Unknown),
        (409, ErrorClass::ProviderError),
        (429, ErrorClass::RateLimit),
        (502, ErrorClass::Outage),
        (503, ErrorClass::Capacity),
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

/// Why a create that must lock down cannot be made on CodeSandbox.
pub fn lockdown_refusal() -> ProviderError {
    ProviderError::new(
        ErrorClass::Unsupported,
        "codesandbox has no outbound network controls: codesandbox pools are advisory",
    )
}

/// The tags of a create: one `key=value` string per sandgate tag.
pub fn tag_strings(tags: &crate::providers::Tags) -> Vec<String> {
    super::tags::TagFilter::new(&tags.sandbox_id, Some(&tags.attempt_id))
        .pairs()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

impl Codesandbox {
    pub fn new(
        account: CodesandboxAccount,
        tls: rustls::ClientConfig,
    ) -> Result<Codesandbox, String> {
        let http = ProviderHttp::new(
            "codesandbox",
            &account.base_url,
            Auth::Bearer,
            account.api_key.clone(),
            tls,
            Duration::from_secs(120),
        )?;
        Ok(Codesandbox { http, account })
    }

    /// What a create forks: the snapshot, the request's template, or the account's.
    fn source(&self, spec: &CreateSpec) -> Result<String, ProviderError> {
        let wanted = match (&spec.snapshot, &spec.request.source) {
            (Some(snapshot), _) => snapshot.clone(),
            (None, Some(Source::Template(t))) => t.clone(),
            (None, Some(Source::Image(_))) => {
                return Err(ProviderError::new(
                    ErrorClass::Unsupported,
                    "codesandbox starts from templates, not OCI images",
                ))
            }
            // A portable environment is the universal template the account names.
            (None, Some(Source::Environment(_)) | None) => self.account.template.clone(),
        };
        if valid_id(&wanted) {
            Ok(wanted)
        } else {
            Err(ProviderError::new(
                ErrorClass::InvalidRequest,
                format!("{wanted:?} is not a codesandbox template or sandbox id"),
            ))
        }
    }

    /// The body of `POST /sandbox/{template}/fork` for a create.
    fn fork_body(spec: &CreateSpec) -> Value {
        json!({
            "title": format!("sandgate-{}", spec.tags.sandbox_id),
            "tags": tag_strings(&spec.tags),
            "privacy": 2,
            "private_preview": true,
            "path": COLLECTION,
        })
    }

    /// The body of `POST /vm/{id}/start`.
    fn start_body(&self) -> Value {
        let mut body = json!({});
        if let Some(tier) = &self.account.tier {
            body["tier"] = json!(tier);
        }
        if let Some(secs) = self.account.hibernation_timeout_secs {
            body["hibernation_timeout_seconds"] = json!(secs);
        }
        body
    }

    /// `POST /sandbox/{from}/fork`: the new sandbox's id.
    async fn fork(&self, from: &str, body: &Value) -> Result<String, HttpFailure> {
        let path = format!("/sandbox/{}/fork", path_segment(from));
        let response = self
            .http
            .send(self.http.request(Method::POST, &path).json(body))
            .await?;
        let forked: Forked = self.data(response).await?;
        Ok(forked.id)
    }

    /// `POST /vm/{id}/start`: how the VM came up (`RUNNING`, `RESUME`, `CLEAN`, `FORK`).
    async fn start(&self, id: &str) -> Result<String, HttpFailure> {
        let path = format!("/vm/{}/start", path_segment(id));
        let body = self.start_body();
        let response = self
            .http
            .send(self.http.request(Method::POST, &path).json(&body))
            .await?;
        let started: Started = self.data(response).await?;
        Ok(started.bootup_type)
    }

    /// `POST /vm/{id}/{verb}` with an empty body (hibernate, shutdown).
    async fn vm_call(&self, id: &str, verb: &str) -> Result<(), HttpFailure> {
        let path = format!("/vm/{}/{verb}", path_segment(id));
        // Hibernate and shutdown are idempotent (the SDK retries them too).
        self.http
            .send_idempotent(|| self.http.request(Method::POST, &path).json(&json!({})))
            .await?;
        Ok(())
    }

    /// The `data` of a `{data, errors, success}` answer.
    async fn data<T: DeserializeOwned>(
        &self,
        response: reqwest::Response,
    ) -> Result<T, HttpFailure> {
        let envelope: Envelope<T> = self.http.json(response).await?;
        envelope.data.ok_or_else(|| HttpFailure {
            status: None,
            body: None,
            retry_after: None,
            sent: true,
            timed_out: false,
            message: "codesandbox answered without data".into(),
        })
    }
}
