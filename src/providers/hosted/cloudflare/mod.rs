//! The Cloudflare Sandbox adapter: sandboxes through sandgate's bridge Worker
//! (`deploy/cloudflare`, whose `src/api.ts` is the contract), since a Cloudflare Sandbox is a
//! Durable Object only a Worker can drive (`@cloudflare/sandbox` 0.12.10).
//!
//! Contract:
//! - Every URL derives from the account's `base_url`, the deployed bridge's URL (required:
//!   there is no public default); the key is the bridge's `SANDGATE_BRIDGE_TOKEN`, sent as
//!   `Authorization: Bearer`.
//! - Create: `POST /v1/sandbox` with `id` [`sandbox_name`] of the attempt id (the Durable
//!   Object's name: a create re-sent after a lost answer lands on the same sandbox, which
//!   the bridge answers 200), `labels` {`sandgate_sandbox`, `sandgate_attempt`}, `env` (the
//!   spec's, plus the proxy and CA variables naming [`CA_PATH`] when the spec has egress) and
//!   `outbound`. The bridge answers once the container ran a first command.
//! - Egress: with `lock_down`, `outbound` is `{enableInternet: false, allowedHosts: [<gateway
//!   host>]}` ([`lockdown`]): the SDK's `Container` controls, applied by the bridge before the
//!   container starts. Cloudflare matches allowed hosts by hostname (no port) on the HTTP
//!   requests it intercepts, so the lock is to the gateway's host; an IPv6 gateway is written
//!   `[addr]`, as a URL's hostname reads. The sandbox's `allow_domains` are not added: a
//!   native allow entry would be a path around the gateway's per-request policy. Without
//!   lock-down the container gets `enableInternet: true` and no list.
//! - The CA PEM is written to [`CA_PATH`] once the sandbox runs (`mkdir -p` through an exec,
//!   then `PUT .../file/...`); a failure fails the create as `failed_before_running` with the
//!   sandbox's id.
//! - `get`: `GET /v1/sandbox/{id}`, 404 is `None`. `list_by_tag`: `GET /v1/sandbox?label=k=v`
//!   (the bridge's own inventory, strongly consistent), filtered again here; `failed` ones
//!   are left out (the bridge destroys a failed create's container). `delete`:
//!   `DELETE /v1/sandbox/{id}`, 204 also when absent (404 is success too).
//! - Exec: the argv is quoted into one POSIX shell line (the shared [`command_line`]), the
//!   spec's env and cwd go as the bridge's `env`/`cwd`, its timeout as `timeoutMs`; the answer
//!   is one SSE stream of `stdout`/`stderr` events in the order written, ended by `exit` or
//!   `error`. Cancel drops the stream (the SDK's timeout is what kills a process: there is no
//!   kill by id in the bridge, so `process_cancel` is not claimed).
//! - Files: `GET|PUT /v1/sandbox/{id}/file/<absolute path without its leading />`, raw bytes.
//! - Failures are classified by one table ([`ERRORS`], applied by [`classify`]).
//!
//! Files: this one holds the account, the failure table and the lock-down; `provider` the
//! [`Provider`](crate::providers::Provider) implementation, `exec` the SSE stream, `wire` the
//! bridge's JSON.

mod exec;
mod provider;
#[cfg(test)]
mod tests;
mod wire;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::account::known_options;
use super::errors::{own_message, CodeRule, ErrorTable};
use super::http::{path_segment, Auth, HttpFailure, ProviderHttp};
use super::lockdown::{gateway_addr, GatewayAddr};
use crate::credentials::Secret;
use crate::providers::RuntimeCapabilities;
use crate::providers::{ErrorClass, OpError, OpErrorKind, ProviderError, RemoteEgress};

/// What this adapter does with the bridge: commands streamed in order as one stream,
/// files read and written. No kill by id (see the module docs), no lifecycle.
/// The whole of it: the most this adapter's pools may declare (`[providers.capabilities]`
/// narrows, never widens), and what `capabilities` answers for every sandbox.
pub const CAPABILITIES: RuntimeCapabilities = RuntimeCapabilities {
    process_execute: true,
    process_ordered_output: true,
    filesystem_read: true,
    filesystem_write: true,
    ..RuntimeCapabilities::NONE
};

pub use super::shell::command_line;

/// Where sandgate's CA goes inside a sandbox (the SDK's image runs as root, home `/root`;
/// `/workspace` is the SDK's working directory, which a user's files may replace).
pub const CA_PATH: &str = "/etc/sandgate/ca.pem";
const CA_DIR: &str = "/etc/sandgate";
const OPTIONS: &[&str] = &["sleep_after_secs", "create_timeout_secs"];

/// A Cloudflare account's settings: the bridge it speaks to.
#[derive(Debug, Clone)]
pub struct CloudflareAccount {
    /// The bridge Worker's URL.
    pub base_url: String,
    /// `sleepAfterSeconds`: how long an idle container runs before it sleeps (the SDK's
    /// default when unset). A sleeping sandbox wakes on its next request.
    pub sleep_after_secs: Option<u64>,
    /// How long a create may take (the bridge answers once the container ran).
    pub create_timeout: Duration,
    pub api_key: Secret,
}

impl CloudflareAccount {
    /// `base_url` is required; options `sleep_after_secs` (1..=86400) and
    /// `create_timeout_secs` (default 180). Errors name the field.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        api_key: Secret,
    ) -> Result<CloudflareAccount, (String, String)> {
        known_options("a cloudflare", options, OPTIONS)?;
        let base_url = base_url.ok_or((
            "base_url".to_string(),
            "a cloudflare account needs base_url: the URL of its bridge Worker \
             (deploy/cloudflare)"
                .to_string(),
        ))?;
        let secs = |name: &str, max: u64| -> Result<Option<u64>, (String, String)> {
            match options.get(name) {
                Some(v) => v
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|v| (1..=max).contains(v))
                    .map(Some)
                    .ok_or((
                        format!("options.{name}"),
                        format!("must be a number of seconds from 1 to {max}"),
                    )),
                None => Ok(None),
            }
        };
        Ok(CloudflareAccount {
            base_url: base_url.to_string(),
            sleep_after_secs: secs("sleep_after_secs", 86_400)?,
            create_timeout: Duration::from_secs(secs("create_timeout_secs", 3600)?.unwrap_or(180)),
            api_key,
        })
    }
}

pub struct Cloudflare {
    http: ProviderHttp,
    account: CloudflareAccount,
}

impl std::fmt::Debug for Cloudflare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cloudflare")
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

/// The bridge's `outbound` for a sandbox locked to the gateway: no internet, the gateway's
/// host the one allowed host (as Cloudflare reads a request's hostname).
pub fn outbound_locked(egress: &RemoteEgress) -> Value {
    let host = match gateway_addr(&egress.gateway_host) {
        GatewayAddr::Name(name) => name.to_ascii_lowercase(),
        GatewayAddr::V4(ip) => ip.to_string(),
        GatewayAddr::V6(ip) => format!("[{ip}]"),
    };
    json!({"enableInternet": false, "allowedHosts": [host]})
}

/// The native lock-down this adapter applies for `egress` (`None` for an advisory pool).
pub fn lockdown(egress: &RemoteEgress) -> Option<Value> {
    egress.lock_down.then(|| outbound_locked(egress))
}

/// The `outbound` a create sends.
fn outbound(egress: Option<&RemoteEgress>) -> Value {
    match egress.and_then(lockdown) {
        Some(locked) => locked,
        None => json!({"enableInternet": true, "allowedHosts": []}),
    }
}

/// The bridge's name for the sandbox of an attempt: `[a-z0-9][a-z0-9-]{0,62}` (a Durable
/// Object name a preview URL can carry). An attempt id that does not fit as it is becomes a
/// digest of it, so two attempts never share a name.
pub fn sandbox_name(attempt_id: &str) -> String {
    let fits = !attempt_id.is_empty()
        && attempt_id.len() <= 60
        && attempt_id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if fits {
        return format!("sg-{attempt_id}");
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, attempt_id.as_bytes());
    let hex: String = digest.as_ref()[..20]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sg-{hex}")
}

/// Where the bridge's error code is: `{"error": {"code": ...}}`.
fn bridge_code(failure: &HttpFailure) -> Option<&str> {
    failure.body.as_ref()?.get("error")?.get("code")?.as_str()
}

/// The bridge's answers, as the coordinator's error classes.
///
/// | answer | class |
/// | --- | --- |
/// | never reached (connect failed) | `outage` |
/// | reached, no answer (timeout, dropped) | `unknown` |
/// | `capacity` (503: the SDK's `ContainerUnavailableError`) | `capacity` |
/// | `rate_limited` (429) | `rate_limit` (`Retry-After` kept) |
/// | `conflict` (409: the name exists with other labels) | `provider_error` |
/// | `invalid_request` (400) | `invalid_request` |
/// | `unauthorized` (401), 403 | `unbound_account` |
/// | 404 (no such route: `base_url` is not a bridge) | `unsupported` |
/// | 502, 503 without a code (Cloudflare's edge) | `outage` |
/// | 504 | `unknown` (the create may have gone through) |
/// | `internal` (500), other 5xx | `provider_error` |
///
/// A `capacity` answer proves no container runs: the bridge destroys a create it could not
/// place before answering.
pub static ERRORS: ErrorTable = ErrorTable {
    code: bridge_code,
    codes: &[
        CodeRule::any("capacity", ErrorClass::Capacity),
        CodeRule::any("rate_limited", ErrorClass::RateLimit),
        CodeRule::any("conflict", ErrorClass::ProviderError),
        CodeRule::any("invalid_request", ErrorClass::InvalidRequest),
        CodeRule::any("unauthorized", ErrorClass::UnboundAccount),
    ],
    no_instance: &["capacity"],
    message: None,
    statuses: &[
        (400, ErrorClass::InvalidRequest),
        (401, ErrorClass::UnboundAccount),
        (403, ErrorClass::UnboundAccount),
        (404, ErrorClass::Unsupported),
        (429, ErrorClass::RateLimit),
        (502, ErrorClass::Outage),
        (503, ErrorClass::Outage),
        (504, ErrorClass::Unknown),
    ],
    op_kinds: &[
        (404, OpErrorKind::NotFound),
        (400, OpErrorKind::Invalid),
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

/// `/v1/sandbox/{id}/file/<path>`: the absolute path without its leading `/`, each segment
/// percent-encoded. A relative path or one with `..` is refused here, as the bridge would.
fn file_path(id: &str, path: &str) -> Result<String, OpError> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(OpError::new(
            OpErrorKind::Invalid,
            format!("{path:?}: cloudflare file paths must be absolute"),
        ));
    };
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    if segments.is_empty() || segments.contains(&"..") {
        return Err(OpError::new(
            OpErrorKind::Invalid,
            format!("{path:?} does not name a file"),
        ));
    }
    let encoded: Vec<String> = segments.iter().map(|s| path_segment(s)).collect();
    Ok(format!(
        "/v1/sandbox/{}/file/{}",
        path_segment(id),
        encoded.join("/")
    ))
}

impl Cloudflare {
    pub fn new(
        account: CloudflareAccount,
        tls: rustls::ClientConfig,
    ) -> Result<Cloudflare, String> {
        let http = ProviderHttp::new(
            "cloudflare",
            &account.base_url,
            Auth::Bearer,
            account.api_key.clone(),
            tls,
            Duration::from_secs(60),
        )?;
        Ok(Cloudflare { http, account })
    }

    /// The body of `POST /v1/sandbox`.
    fn create_body(&self, spec: &crate::providers::CreateSpec) -> Value {
        let mut body = json!({
            "id": sandbox_name(&spec.tags.attempt_id),
            "labels": super::tags::tag_object(&spec.tags),
            "env": super::lockdown::create_env(spec, CA_PATH),
            "outbound": outbound(spec.egress.as_ref()),
        });
        if let Some(secs) = self.account.sleep_after_secs {
            body["sleepAfterSeconds"] = json!(secs);
        }
        body
    }
}
