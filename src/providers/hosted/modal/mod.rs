//! The Modal adapter: sandboxes through Modal's gRPC API, as the official SDK `modal` 1.6.4
//! (PyPI) speaks it (its V1 sandbox calls, the SDK's default).
//!
//! Contract:
//! - The control plane is `modal.client.ModalClient` at the account's `base_url` (default
//!   `https://api.modal.com`, the SDK's `MODAL_SERVER_URL`), authenticated by the token id
//!   and secret as the SDK sends them (`x-modal-token-id`, `x-modal-token-secret`); the
//!   account's key is `TOKEN_ID:TOKEN_SECRET`, or the secret alone with `options.token_id`.
//! - Create: the account's app (`AppGetOrCreate`, `options.app_name`, default `sandgate`,
//!   created if missing, looked up once); the environment as an app-owned secret
//!   (`SecretGetOrCreate` `ANONYMOUS_OWNED_BY_APP` with `env_dict`: the spec's env plus
//!   [`RemoteEgress::env`] with [`CA_PATH`], as the SDK does for `env=`); then
//!   `SandboxCreate` with `entrypoint_args = ["sleep", "infinity"]`, the image (`im-…`: the
//!   request's image when it is a Modal image id, a restored snapshot, else
//!   `options.image_id`), `resources` (the request's CPU and memory, else the account's),
//!   `timeout_secs` (`options.timeout_secs`, default and most Modal allows: 86400),
//!   `network_access` and the tags `sandgate_sandbox`/`sandgate_attempt`, with the attempt id
//!   as `x-idempotency-key`. Then `SandboxGetTaskId` is asked (long-polled, bounded by
//!   `boot_timeout_secs`) until the sandbox has a task: a `task_result` instead (the task
//!   ended before running) is `failed_before_running`; no task by the bound is `capacity`
//!   (what the SDK raises, "Insufficient capacity"), both naming the sandbox so the
//!   coordinator terminates it.
//! - Egress ([`network_access`]): with [`RemoteEgress::lock_down`] the create carries
//!   `NetworkAccess{ALLOWLIST}` whose only entry is the gateway: `allowed_cidrs =
//!   ["<ip>/32"]` (or `/128`) for an IP gateway, `allowed_domains = [name]` for a named one
//!   (Modal's domain allow list, the SDK's `outbound_domain_allowlist`). Without lock-down
//!   the network is `OPEN`. The sandbox's `allow_domains` are never added: a native entry
//!   would be a way around the gateway's policy.
//! - The CA PEM is written to [`CA_PATH`] once the task runs (through a command with the
//!   PEM on stdin); a failure fails the create as `failed_before_running`.
//! - get: `SandboxWait` with timeout 0 (no `result` = still running) and `SandboxTagsGet`;
//!   `NOT_FOUND` or a result is `None`. list_by_tag: `SandboxList` with the tags as Modal's
//!   filter (all must match), newest first, paged by `before_timestamp`, refiltered here.
//!   delete: `SandboxTerminate`; `NOT_FOUND` is success.
//! - Commands and files go to the task's command router
//!   (`modal.task_command_router.TaskCommandRouter` at the URL `TaskGetCommandRouterAccess`
//!   answers, with its JWT as `Bearer`, renewed a minute before its `exp` and once on
//!   `UNAUTHENTICATED`): `TaskExecStart` (argv, env, workdir, `timeout_secs`, stdout and
//!   stderr piped), `TaskExecStdioRead` (a server stream per descriptor, each in order),
//!   `TaskExecStdinWrite`, `TaskExecWait` (`code` or `signal`). Modal's router has no call
//!   that kills one command: cancel is not offered (the timeout is the router's). Files are
//!   commands (`cat`; a write is `mkdir -p` + `cat >` with the bytes on stdin), as the SDK's
//!   own filesystem API also runs inside the sandbox.
//! - Snapshot: `SandboxSnapshotFs` (an image id, restored as the create's image);
//!   `ImageDelete` removes it. Modal V1 sandboxes have no pause/resume or stop/start, and
//!   their clock is fixed at create: `extend_lifetime` reports a lifetime beyond it.
//! - Failures are classified by one table ([`CODES`], applied by [`classify`]).
//!
//! Files: this one holds the account, the egress entry and the failure table; `grpc` the
//! tonic calls, `provider` the [`Provider`](crate::providers::Provider) implementation,
//! `exec` the command router, `proto` the schema subset.

mod exec;
pub mod grpc;
pub mod proto;
mod provider;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tonic::Code;

use super::account::{known_options, positive, OptionError};
use super::lockdown::{gateway_addr, GatewayAddr};
use crate::credentials::Secret;
use crate::providers::RuntimeCapabilities;
use crate::providers::{ErrorClass, OpError, OpErrorKind, ProviderError, RemoteEgress};
use grpc::{GrpcFailure, Meta, Rpc};

/// What this adapter does with Modal: commands streamed (each stream in order), files
/// read and written. No cancel (the router has no kill), no pause/resume.
/// The whole of it: the most this adapter's pools may declare (`[providers.capabilities]`
/// narrows, never widens), and what `capabilities` answers for every sandbox.
pub const CAPABILITIES: RuntimeCapabilities = RuntimeCapabilities {
    process_execute: true,
    process_ordered_output: true,
    filesystem_read: true,
    filesystem_write: true,
    filesystem_mkdir: true,
    ..RuntimeCapabilities::NONE
};

/// Where sandgate's CA goes inside a sandbox (Modal runs commands as `root`).
pub const CA_PATH: &str = "/root/.sandgate/ca.pem";
const OPTIONS: &[&str] = &[
    "token_id",
    "app_name",
    "environment",
    "image_id",
    "cpu",
    "memory_mb",
    "timeout_secs",
    "boot_timeout_secs",
];
/// The longest a Modal sandbox may live (its documented maximum `timeout`).
pub const MAX_TIMEOUT_SECS: u64 = 24 * 3600;
/// A control-plane call's deadline.
const CALL_DEADLINE: Duration = Duration::from_secs(60);

/// A Modal account's settings (`[[accounts]]` with `options`).
#[derive(Debug, Clone)]
pub struct ModalAccount {
    pub base_url: String,
    pub token_id: String,
    pub token_secret: Secret,
    pub app_name: String,
    /// Modal's environment (empty: the workspace's default).
    pub environment: String,
    /// The image a sandbox starts from when the request names no Modal image (`im-…`).
    pub image_id: Option<String>,
    /// CPU cores and memory when the request says none.
    pub cpu: Option<f64>,
    pub memory_mb: Option<u32>,
    /// Modal ends a sandbox after this long (fixed at create).
    pub timeout_secs: u32,
    /// How long a create waits for the sandbox's task.
    pub boot_timeout: Duration,
}

impl ModalAccount {
    /// Options: `token_id` (then the key is the token secret alone), `app_name` (default
    /// `sandgate`), `environment`, `image_id`, `cpu` (cores), `memory_mb`, `timeout_secs`
    /// (default and at most 86400), `boot_timeout_secs` (default 300). Errors name the option.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        key: Secret,
    ) -> Result<ModalAccount, OptionError> {
        known_options("a modal", options, OPTIONS)?;
        let text = |name: &str| -> Result<Option<String>, OptionError> {
            match options.get(name).map(|v| v.trim()) {
                Some("") => Err((format!("options.{name}"), "must not be empty".into())),
                Some(v) => Ok(Some(v.to_string())),
                None => Ok(None),
            }
        };
        let (token_id, token_secret) = tokens(text("token_id")?, key)?;
        let cpu = match options.get("cpu") {
            None => None,
            Some(v) => Some(
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|c| c.is_finite() && *c > 0.0 && *c <= 1024.0)
                    .ok_or((
                        "options.cpu".to_string(),
                        "must be a positive number of cores".to_string(),
                    ))?,
            ),
        };
        let memory_mb = positive(options, "memory_mb", "MiB")?
            .map(|m| {
                u32::try_from(m)
                    .map_err(|_| ("options.memory_mb".to_string(), "is too large".to_string()))
            })
            .transpose()?;
        let timeout = positive(options, "timeout_secs", "seconds")?.unwrap_or(MAX_TIMEOUT_SECS);
        if timeout > MAX_TIMEOUT_SECS {
            return Err((
                "options.timeout_secs".into(),
                format!("modal allows at most {MAX_TIMEOUT_SECS} seconds"),
            ));
        }
        let image_id = text("image_id")?;
        if let Some(image) = image_id.as_deref().filter(|i| !i.starts_with("im-")) {
            return Err((
                "options.image_id".into(),
                format!("must be a Modal image id (im-…), not {image:?}"),
            ));
        }
        Ok(ModalAccount {
            base_url: base_url
                .unwrap_or("https://api.modal.com")
                .trim_end_matches('/')
                .to_string(),
            token_id,
            token_secret,
            app_name: text("app_name")?.unwrap_or_else(|| "sandgate".into()),
            environment: text("environment")?.unwrap_or_default(),
            image_id,
            cpu,
            memory_mb,
            timeout_secs: timeout as u32,
            boot_timeout: Duration::from_secs(
                positive(options, "boot_timeout_secs", "seconds")?.unwrap_or(300),
            ),
        })
    }
}

/// The token id and secret: `options.token_id` with the key as the secret, or the key as
/// `TOKEN_ID:TOKEN_SECRET`. Errors never show the key.
fn tokens(token_id: Option<String>, key: Secret) -> Result<(String, Secret), OptionError> {
    if let Some(id) = token_id {
        return Ok((id, key));
    }
    match key.expose().split_once(':') {
        Some((id, secret)) if !id.trim().is_empty() && !secret.trim().is_empty() => {
            Ok((id.trim().to_string(), Secret::new(secret.trim())))
        }
        _ => Err((
            "options.token_id".into(),
            "a modal key is TOKEN_ID:TOKEN_SECRET (as `modal token new` prints them), or set \
             options.token_id and keep the secret alone in the key"
                .into(),
        )),
    }
}

/// The `network_access` this adapter sends for `egress`: the gateway as the only allowed
/// destination when it locks down, else open.
pub fn network_access(egress: Option<&RemoteEgress>) -> proto::NetworkAccess {
    let Some(egress) = egress.filter(|e| e.lock_down) else {
        return proto::NetworkAccess {
            network_access_type: proto::NetworkAccessType::Open as i32,
            ..Default::default()
        };
    };
    let mut access = proto::NetworkAccess {
        network_access_type: proto::NetworkAccessType::Allowlist as i32,
        ..Default::default()
    };
    match gateway_addr(&egress.gateway_host) {
        GatewayAddr::V4(ip) => access.allowed_cidrs.push(format!("{ip}/32")),
        GatewayAddr::V6(ip) => access.allowed_cidrs.push(format!("{ip}/128")),
        GatewayAddr::Name(name) => access.allowed_domains.push(name.to_string()),
    }
    access
}

/// The native lock-down this adapter applies for `egress`, in Modal's field names as sent
/// (`None` for an advisory pool).
pub fn lockdown(egress: &RemoteEgress) -> Option<serde_json::Value> {
    if !egress.lock_down {
        return None;
    }
    let access = network_access(Some(egress));
    Some(serde_json::json!({
        "network_access": {
            "network_access_type": "ALLOWLIST",
            "allowed_cidrs": access.allowed_cidrs,
            "allowed_domains": access.allowed_domains,
        }
    }))
}

/// Modal's answers (gRPC status codes), as the coordinator's error classes.
///
/// | answer | class |
/// | --- | --- |
/// | never reached (connect failed) | `outage` |
/// | reached, no answer (`DEADLINE_EXCEEDED`, `CANCELLED`, `UNKNOWN`: tonic's code for a connection that broke mid-call) | `unknown` |
/// | `RESOURCE_EXHAUSTED` with an `RPCRetryPolicy` | `rate_limit` (its wait kept) |
/// | `RESOURCE_EXHAUSTED` without | `capacity` |
/// | `INVALID_ARGUMENT`, `OUT_OF_RANGE`, `FAILED_PRECONDITION` | `invalid_request` |
/// | `UNAUTHENTICATED`, `PERMISSION_DENIED` | `unbound_account` |
/// | `NOT_FOUND` (the app's image or a snapshot not on this account), `UNIMPLEMENTED` | `unsupported` |
/// | `UNAVAILABLE` | `outage` |
/// | `ABORTED`, `ALREADY_EXISTS`, `INTERNAL`, `DATA_LOSS` | `provider_error` |
/// | a task that ends before running | `failed_before_running` |
/// | no task within `boot_timeout_secs` | `capacity` |
pub static CODES: &[(Code, ErrorClass)] = &[
    (Code::InvalidArgument, ErrorClass::InvalidRequest),
    (Code::OutOfRange, ErrorClass::InvalidRequest),
    (Code::FailedPrecondition, ErrorClass::InvalidRequest),
    (Code::Unauthenticated, ErrorClass::UnboundAccount),
    (Code::PermissionDenied, ErrorClass::UnboundAccount),
    (Code::NotFound, ErrorClass::Unsupported),
    (Code::Unimplemented, ErrorClass::Unsupported),
    (Code::Unavailable, ErrorClass::Outage),
    (Code::DeadlineExceeded, ErrorClass::Unknown),
    (Code::Cancelled, ErrorClass::Unknown),
    (Code::Unknown, ErrorClass::Unknown),
];

/// Codes of a failed sandbox operation, as its kind; any other is `Provider`.
static OP_KINDS: &[(Code, OpErrorKind)] = &[
    (Code::NotFound, OpErrorKind::NotFound),
    (Code::InvalidArgument, OpErrorKind::Invalid),
    (Code::OutOfRange, OpErrorKind::Invalid),
    (Code::FailedPrecondition, OpErrorKind::Conflict),
    (Code::AlreadyExists, OpErrorKind::Conflict),
    (Code::Aborted, OpErrorKind::Conflict),
    (Code::Unimplemented, OpErrorKind::Unsupported),
];

/// [`CODES`] applied to one failure.
pub fn classify(failure: &GrpcFailure) -> ErrorClass {
    let Some(code) = failure.code else {
        return ErrorClass::Outage;
    };
    if code == Code::ResourceExhausted {
        return match failure.retry_after {
            Some(_) => ErrorClass::RateLimit,
            None => ErrorClass::Capacity,
        };
    }
    CODES
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, class)| *class)
        .unwrap_or(ErrorClass::ProviderError)
}

fn provider_error(failure: GrpcFailure) -> ProviderError {
    let mut error = ProviderError::new(classify(&failure), failure.message.clone());
    error.retry_after = failure.retry_after;
    error
}

/// A failed `SandboxCreate`: marked `maybe_created` when it reached Modal and was not a
/// refusal (a refusal's status proves nothing was made).
fn create_error(failure: GrpcFailure) -> ProviderError {
    let refused = matches!(
        failure.code,
        Some(
            Code::ResourceExhausted
                | Code::InvalidArgument
                | Code::OutOfRange
                | Code::FailedPrecondition
                | Code::Unauthenticated
                | Code::PermissionDenied
                | Code::NotFound
                | Code::Unimplemented
        )
    );
    let maybe_created = failure.sent && !refused;
    let mut error = provider_error(failure);
    error.maybe_created = maybe_created;
    error
}

fn op_error(failure: GrpcFailure) -> OpError {
    let kind = failure
        .code
        .and_then(|code| OP_KINDS.iter().find(|(c, _)| *c == code))
        .map(|(_, kind)| *kind)
        .unwrap_or(OpErrorKind::Provider);
    OpError::new(kind, failure.message)
}

/// A task's command router: its client and when to ask for a fresh token.
#[derive(Clone)]
struct Router {
    task_id: String,
    rpc: Rpc,
    renew_at: std::time::Instant,
}

pub struct Modal {
    control: Rpc,
    account: ModalAccount,
    tls: rustls::ClientConfig,
    /// The account's app id, looked up once.
    app_id: tokio::sync::OnceCell<String>,
    /// Command routers by sandbox id.
    routers: Mutex<HashMap<String, Router>>,
}

impl std::fmt::Debug for Modal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Modal")
            .field("base_url", &self.account.base_url)
            .field("app_name", &self.account.app_name)
            .finish_non_exhaustive()
    }
}

impl Modal {
    pub fn new(account: ModalAccount, tls: rustls::ClientConfig) -> Result<Modal, String> {
        let meta = Meta::tokens(&account.token_id, &account.token_secret)?;
        Ok(Modal {
            control: Rpc::new(&account.base_url, &tls, meta)?,
            account,
            tls,
            app_id: tokio::sync::OnceCell::new(),
            routers: Mutex::new(HashMap::new()),
        })
    }

    /// A control-plane call with the default deadline.
    async fn call<Q, R>(&self, path: &'static str, request: Q) -> Result<R, GrpcFailure>
    where
        Q: prost::Message + Clone + Send + Sync + 'static,
        R: prost::Message + Default + Send + Sync + 'static,
    {
        self.control.unary(path, request, None, CALL_DEADLINE).await
    }

    /// The account's app (created when missing), looked up once.
    async fn app_id(&self) -> Result<&str, GrpcFailure> {
        self.app_id
            .get_or_try_init(|| async {
                let request = proto::AppGetOrCreateRequest {
                    app_name: self.account.app_name.clone(),
                    environment_name: self.account.environment.clone(),
                    object_creation_type: proto::ObjectCreationType::CreateIfMissing as i32,
                };
                let answer: proto::AppGetOrCreateResponse =
                    self.call(proto::client::APP_GET_OR_CREATE, request).await?;
                Ok(answer.app_id)
            })
            .await
            .map(String::as_str)
    }
}
