//! The provider interface the creation coordinator drives, and the registry of adapters per
//! pool.
//!
//! Contract for adapters (hosted ones such as E2B or Daytona, the local provider, and the
//! in-process simulated provider):
//! - `create` provisions one instance on the pool's account, tagged with the sandbox id and
//!   the attempt id, and returns once it runs (or fails). A provider that cannot tell whether
//!   its request took effect (a timeout after the request was sent, a dropped connection)
//!   answers [`ErrorClass::Unknown`]; the coordinator then looks for tagged instances with
//!   `list_by_tag` before trying anything else, so no duplicate capacity is created.
//! - `get`, `list_by_tag` and `delete` let the coordinator reconcile and clean up. `delete`
//!   of an absent instance succeeds.
//! - `capabilities` reports what a running instance actually offers; the coordinator compares
//!   it against the request and destroys an instance that falls short.
//! - Every error carries a class ([`ErrorClass`]) that decides what the coordinator does:
//!   advance to the next pool, end the operation, or reconcile.

pub mod export;
pub mod hosted;
pub mod local;
pub mod local_limits;
/// The operation vocabulary adapters speak, at `crate::ops` (below `e2b`, which translates it).
pub use crate::ops;
pub mod simulated;

pub use hosted::cloudflare;
pub use hosted::codesandbox;
pub use hosted::northflank;
pub use hosted::prime;
/// The hosted adapters and their HTTP layer, under [`hosted`], at their old paths.
pub use hosted::{blaxel, daytona, e2b, freestyle, http, runloop, vercel};

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use sandgate_router::Request;

pub use ops::{
    ExecSpec, ExecStream, InputMode, InteractiveStream, OpError, OpErrorKind, SandboxEntry,
    SnapshotInfo, Usage,
};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the coordinator does with a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The pool cannot serve this request now: try the next candidate.
    Advance,
    /// A refusal of authority, policy, billing standing or the request itself: stop.
    Terminal,
    /// The provider may or may not have created an instance: reconcile first.
    Unknown,
}

/// Why an attempt did not produce a running sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    Capacity,
    RateLimit,
    Quota,
    RegionUnavailable,
    Outage,
    ProviderError,
    Unsupported,
    UnboundAccount,
    FailedBeforeRunning,
    RuntimeShortfall,
    Authority,
    Policy,
    Billing,
    InvalidRequest,
    Unknown,
    /// Not tried: the pool's circuit is open after repeated provider failures
    /// (`create::circuit`).
    CircuitOpen,
}

impl ErrorClass {
    pub const ALL: [ErrorClass; 16] = [
        ErrorClass::Capacity,
        ErrorClass::RateLimit,
        ErrorClass::Quota,
        ErrorClass::RegionUnavailable,
        ErrorClass::Outage,
        ErrorClass::ProviderError,
        ErrorClass::Unsupported,
        ErrorClass::UnboundAccount,
        ErrorClass::FailedBeforeRunning,
        ErrorClass::RuntimeShortfall,
        ErrorClass::Authority,
        ErrorClass::Policy,
        ErrorClass::Billing,
        ErrorClass::InvalidRequest,
        ErrorClass::Unknown,
        ErrorClass::CircuitOpen,
    ];

    pub fn outcome(self) -> Outcome {
        use ErrorClass::*;
        match self {
            Capacity | RateLimit | Quota | RegionUnavailable | Outage | ProviderError
            | Unsupported | UnboundAccount | FailedBeforeRunning | RuntimeShortfall
            | CircuitOpen => Outcome::Advance,
            Authority | Policy | Billing | InvalidRequest => Outcome::Terminal,
            Unknown => Outcome::Unknown,
        }
    }

    /// Worth retrying on the same pool within its provisioning window.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorClass::RateLimit | ErrorClass::ProviderError)
    }

    pub fn as_str(self) -> &'static str {
        use ErrorClass::*;
        match self {
            Capacity => "capacity",
            RateLimit => "rate_limit",
            Quota => "quota",
            RegionUnavailable => "region_unavailable",
            Outage => "outage",
            ProviderError => "provider_error",
            Unsupported => "unsupported",
            UnboundAccount => "unbound_account",
            FailedBeforeRunning => "failed_before_running",
            RuntimeShortfall => "runtime_shortfall",
            Authority => "authority",
            Policy => "policy",
            Billing => "billing",
            InvalidRequest => "invalid_request",
            Unknown => "unknown",
            CircuitOpen => "circuit_open",
        }
    }

    pub fn from_name(name: &str) -> Option<ErrorClass> {
        ErrorClass::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

/// A provider failure. `message` is the provider's explanation with secrets removed;
/// `instance_id` names an instance the failed call left behind (to delete).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", class.as_str())]
pub struct ProviderError {
    pub class: ErrorClass,
    pub message: String,
    pub instance_id: Option<String>,
    /// How long the provider asked to wait before trying again (`Retry-After`).
    pub retry_after: Option<std::time::Duration>,
    /// The answer to a create does not prove that nothing was created (a 5xx after the
    /// request reached the provider): the coordinator looks for the attempt's tagged
    /// instance before the route advances, whatever the class (see `Coordinator::classify`).
    pub maybe_created: bool,
}

/// An adopted instance whose CA could not be installed: it cannot serve its sandbox, so the
/// coordinator deletes it and advances the route.
pub(crate) fn adoption_failed(e: &dyn std::fmt::Display) -> ProviderError {
    ProviderError::new(
        ErrorClass::FailedBeforeRunning,
        format!("the adopted instance's CA could not be installed: {e}"),
    )
}

impl ProviderError {
    pub fn new(class: ErrorClass, message: impl Into<String>) -> ProviderError {
        ProviderError {
            class,
            message: message.into(),
            instance_id: None,
            retry_after: None,
            maybe_created: false,
        }
    }
}

/// The tags every instance carries, so a lost create can be found again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tags {
    pub sandbox_id: String,
    pub attempt_id: String,
}

/// One create call.
#[derive(Debug, Clone)]
pub struct CreateSpec {
    pub tags: Tags,
    pub pool: String,
    /// The pool's own account: an attempt never uses another account's authority.
    pub account: String,
    pub request: Arc<Request>,
    /// Extra environment for the sandbox's processes: one placeholder variable per bound
    /// credential (never a secret).
    pub env: std::collections::BTreeMap<String, String>,
    /// A snapshot (taken by this pool's provider) to restore into the new instance.
    pub snapshot: Option<String>,
    /// How a hosted sandbox reaches sandgate, for pools whose provider runs elsewhere
    /// (`None` for the local and simulated providers).
    pub egress: Option<RemoteEgress>,
}

/// What a hosted sandbox needs to use the gateway: its proxy URL (its own identity in the
/// userinfo), the gateway's address (the one destination its lock-down allows) and the CA
/// to trust. None of it is a credential's secret.
#[derive(Clone)]
pub struct RemoteEgress {
    /// `https://<sandbox-id>:<token>@<public host>:<port>` (or `http://`).
    pub proxy_url: String,
    /// The host of `[proxy] public_url` (a name or an IP literal, without brackets).
    pub gateway_host: String,
    pub gateway_port: u16,
    /// sandgate's CA certificate (PEM).
    pub ca_pem: String,
    /// The pool enforces egress through the gateway (`egress = "gateway"`): the adapter sets
    /// the provider's native controls so the gateway is the only destination. `false` for an
    /// `advisory` pool: the proxy variables and the CA only, which the sandbox may ignore.
    pub lock_down: bool,
}

impl std::fmt::Debug for RemoteEgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteEgress")
            .field("gateway_host", &self.gateway_host)
            .field("gateway_port", &self.gateway_port)
            .field("lock_down", &self.lock_down)
            .finish_non_exhaustive()
    }
}

impl RemoteEgress {
    /// The proxy variables (both cases), `NO_PROXY` for loopback, and the CA variables
    /// pointing at `ca_path` inside the sandbox.
    pub fn env(&self, ca_path: &str) -> std::collections::BTreeMap<String, String> {
        let mut env = std::collections::BTreeMap::new();
        for var in crate::localbox::PROXY_ENV_VARS {
            env.insert(var.to_string(), self.proxy_url.clone());
        }
        env.insert("NO_PROXY".into(), crate::localbox::NO_PROXY.into());
        env.insert("no_proxy".into(), crate::localbox::NO_PROXY.into());
        for var in crate::localbox::CA_ENV_VARS {
            env.insert(var.to_string(), ca_path.to_string());
        }
        env
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    Starting,
    Running,
    Failed,
}

/// What a provisioned instance actually offers (discovered, not declared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeCapabilities {
    pub process_execute: bool,
    pub process_ordered_output: bool,
    pub process_cancel: bool,
    pub filesystem_read: bool,
    pub filesystem_write: bool,
    pub filesystem_list: bool,
    pub filesystem_delete: bool,
    pub filesystem_append: bool,
    pub filesystem_mkdir: bool,
    pub public_ports: bool,
    pub pause_resume: bool,
    pub pty: bool,
}

impl RuntimeCapabilities {
    pub const FULL: RuntimeCapabilities = RuntimeCapabilities {
        process_execute: true,
        process_ordered_output: true,
        process_cancel: true,
        filesystem_read: true,
        filesystem_write: true,
        filesystem_list: true,
        filesystem_delete: true,
        filesystem_append: true,
        filesystem_mkdir: true,
        public_ports: true,
        pause_resume: true,
        pty: false,
    };
    pub const NONE: RuntimeCapabilities = RuntimeCapabilities {
        process_execute: false,
        process_ordered_output: false,
        process_cancel: false,
        filesystem_read: false,
        filesystem_write: false,
        filesystem_list: false,
        filesystem_delete: false,
        filesystem_append: false,
        filesystem_mkdir: false,
        public_ports: false,
        pause_resume: false,
        pty: false,
    };

    /// Each capability under the path a request asks for it by (`features.…`), in the
    /// order of the router's `Capabilities::feature_flags`.
    pub fn flags(&self) -> [(&'static str, bool); 12] {
        [
            ("features.process.execute", self.process_execute),
            (
                "features.process.ordered_output",
                self.process_ordered_output,
            ),
            ("features.process.cancel", self.process_cancel),
            ("features.filesystem.read", self.filesystem_read),
            ("features.filesystem.write", self.filesystem_write),
            ("features.filesystem.list", self.filesystem_list),
            ("features.filesystem.delete", self.filesystem_delete),
            ("features.filesystem.append", self.filesystem_append),
            ("features.filesystem.mkdir", self.filesystem_mkdir),
            ("features.public_ports", self.public_ports),
            ("features.pause_resume", self.pause_resume),
            ("features.pty", self.pty),
        ]
    }

    /// The request's runtime requirements this instance does not meet, as field paths.
    /// `baseline` adds process execution and file read/write unless the request opts out.
    pub fn shortfall(&self, request: &Request, baseline: bool) -> Vec<String> {
        let f = &request.features;
        let need = |v: Option<bool>, base: bool| v.unwrap_or(base && baseline);
        let checks = [
            (
                "features.process.execute",
                need(f.process.execute, true),
                self.process_execute,
            ),
            (
                "features.process.ordered_output",
                need(f.process.ordered_output, false),
                self.process_ordered_output,
            ),
            (
                "features.process.cancel",
                need(f.process.cancel, false),
                self.process_cancel,
            ),
            (
                "features.filesystem.read",
                need(f.filesystem.read, true),
                self.filesystem_read,
            ),
            (
                "features.filesystem.write",
                need(f.filesystem.write, true),
                self.filesystem_write,
            ),
            (
                "features.filesystem.list",
                need(f.filesystem.list, false),
                self.filesystem_list,
            ),
            (
                "features.filesystem.delete",
                need(f.filesystem.delete, false),
                self.filesystem_delete,
            ),
            (
                "features.filesystem.append",
                need(f.filesystem.append, false),
                self.filesystem_append,
            ),
            (
                "features.filesystem.mkdir",
                need(f.filesystem.mkdir, false),
                self.filesystem_mkdir,
            ),
            (
                "features.public_ports",
                need(f.public_ports, false),
                self.public_ports,
            ),
            (
                "features.pause_resume",
                need(f.pause_resume, false),
                self.pause_resume,
            ),
            ("features.pty", need(f.pty, false), self.pty),
        ];
        checks
            .into_iter()
            .filter(|(_, needed, has)| *needed && !*has)
            .map(|(path, _, _)| path.to_string())
            .collect()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Instance {
    pub id: String,
    pub tags: Tags,
    pub state: InstanceState,
}

/// A sandbox provider adapter. Object safe; futures are boxed so adapters can be stored as
/// `Arc<dyn Provider>`.
pub trait Provider: Send + Sync + 'static {
    /// The provider kind, e.g. `simulated`, `e2b`.
    fn kind(&self) -> &'static str;
    /// Provisions one tagged instance and waits until it runs.
    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>>;
    /// The instance, or `None` when the provider does not know it (deleted or never created).
    fn get<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>>;
    /// Instances tagged with this sandbox id (and attempt id, when given), for reconciliation
    /// and cleanup.
    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>>;
    /// Deletes an instance; deleting an absent one succeeds.
    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// The limits an instance runs under and how often it met them (`limits` on the
    /// sandbox's view), for providers that enforce limits themselves; `None` otherwise.
    fn limits_view(&self, instance_id: &str) -> Option<serde_json::Value> {
        let _ = instance_id;
        None
    }
    /// What a running instance actually offers.
    fn capabilities<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<RuntimeCapabilities, ProviderError>>;

    /// Instances this adapter took over at start from a previous gateway process (the
    /// local provider re-adopts the sandboxes that outlived it), each returned once: the
    /// coordinator deletes those no sandbox claims (see `Coordinator::restore`). Default: none.
    fn take_readopted(&self) -> Vec<Instance> {
        Vec::new()
    }
    /// Why an instance of a previous gateway process could not be taken over, as a stable
    /// code and a message, when this adapter knows (the local provider); `None` otherwise.
    fn readoption_failure(&self, instance_id: &str) -> Option<(&'static str, String)> {
        let _ = instance_id;
        None
    }

    /// Whether only the process that created an instance can see it (the simulated and
    /// local providers keep their instances in the replica's memory or as its children).
    /// Then another replica's `get` answering `None` proves nothing about the instance, and
    /// the liveness pass leaves it to the replica that placed it while that one is alive.
    fn process_local(&self) -> bool {
        false
    }

    /// The provider's native egress settings this adapter applies for `egress` (its own
    /// field names, as sent), shown on the sandbox as its lock-down. `None`: nothing native.
    fn lockdown(&self, egress: &RemoteEgress) -> Option<serde_json::Value> {
        let _ = egress;
        None
    }
    /// Where this adapter installs sandgate's CA inside a hosted sandbox.
    fn ca_path(&self) -> Option<&'static str> {
        None
    }
    /// Finishes an instance the coordinator adopts after reconciling by tag (its create was
    /// not answered, or answered a failure): what `create` does once the provider has made
    /// the instance, such as installing sandgate's CA for `egress`. The instance carries the
    /// create's own settings (lock-down included) already. Default: with `egress`, writes
    /// the CA to [`Provider::ca_path`] with [`Provider::write_file`]; an adapter whose
    /// install takes more steps overrides this.
    fn adopt<'a>(
        &'a self,
        instance_id: &'a str,
        egress: Option<&'a RemoteEgress>,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let (Some(egress), Some(path)) = (egress, self.ca_path()) else {
                return Ok(());
            };
            let ca = egress.ca_pem.clone().into_bytes();
            self.write_file(instance_id, path, ca)
                .await
                .map_err(|e| adoption_failed(&e))
        })
    }
    /// One harmless authenticated call (`sandgate provider check`): what it reached, or why
    /// the account's base URL or credentials do not work.
    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async {
            Err(ProviderError::new(
                ErrorClass::Unsupported,
                format!("{} has no remote account to check", self.kind()),
            ))
        })
    }

    /// Whether calling an exec's canceller ends the command at the provider. A hosted
    /// adapter's table says (one without `process_cancel` can only stop following the
    /// output, so a cancel must be refused rather than answered as done); the providers
    /// that run their own processes always can.
    fn cancels_commands(&self) -> bool {
        sandgate_router::ProviderKind::from_name(self.kind())
            .and_then(hosted::ceiling)
            .is_none_or(|caps| caps.process_cancel)
    }

    /// Whether a command may run as `user` (a valid user name): `Ok` for a user the
    /// provider's pool declares. The default refuses every choice, `unsupported`: the
    /// hosted adapters run commands as their provider's own user and cannot pick another,
    /// and a `user` they dropped silently would run the command as someone else.
    fn exec_user(&self, user: &str) -> Result<(), OpError> {
        let _ = user;
        Err(OpError::new(
            OpErrorKind::Unsupported,
            format!(
                "provider kind {:?} runs commands as its own user: `user` cannot be chosen",
                self.kind()
            ),
        ))
    }

    /// Whether the ports gateway can reach this provider's sandboxes' ports
    /// ([`Provider::connect_port`]): `Ok` only for a provider whose sandboxes run beside a
    /// gateway that serves ports. The default refuses, `unsupported` (501 naming `ports`).
    fn ports(&self) -> Result<(), OpError> {
        Err(OpError::unsupported(self.kind(), "ports"))
    }

    // Operations on a running instance. An adapter implements those its provider offers;
    // the rest answer `unsupported`, which the API reports as 501 naming the operation.

    /// Starts a command and streams its output (see [`ExecStream`]).
    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
    ) -> BoxFuture<'a, Result<ExecStream, OpError>> {
        let _ = (instance_id, spec);
        Box::pin(async { Err(OpError::unsupported(self.kind(), "exec")) })
    }
    /// Starts a command that takes input while it runs: on a terminal, or with a stdin
    /// pipe. Adapters whose provider offers neither answer `unsupported` (501), naming
    /// `pty` or `exec.stdin`.
    fn exec_interactive<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
        mode: InputMode,
    ) -> BoxFuture<'a, Result<InteractiveStream, OpError>> {
        let _ = (instance_id, spec);
        Box::pin(async move { Err(OpError::unsupported(self.kind(), mode.operation())) })
    }
    /// A connection to `port` on the instance's own loopback, for the ports gateway
    /// (`https://{port}-{sandbox}.{domain}`, see `crate::ports`); `None` when nothing
    /// listens there. Only a provider whose sandboxes run beside the gateway can reach
    /// inside them; the rest answer `unsupported` (501 naming `ports`).
    fn connect_port<'a>(
        &'a self,
        instance_id: &'a str,
        port: u16,
    ) -> BoxFuture<'a, Result<Option<tokio::net::TcpStream>, OpError>> {
        let _ = (instance_id, port);
        Box::pin(async { Err(OpError::unsupported(self.kind(), "ports")) })
    }
    fn read_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, OpError>> {
        let _ = (instance_id, path);
        Box::pin(async { Err(OpError::unsupported(self.kind(), "files.read")) })
    }
    fn write_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        data: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        let _ = (instance_id, path, data);
        Box::pin(async { Err(OpError::unsupported(self.kind(), "files.write")) })
    }
    fn list_dir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SandboxEntry>, OpError>> {
        let _ = (instance_id, path);
        Box::pin(async { Err(OpError::unsupported(self.kind(), "files.list")) })
    }
    fn remove_path<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        recursive: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        let _ = (instance_id, path, recursive);
        Box::pin(async { Err(OpError::unsupported(self.kind(), "files.delete")) })
    }
    fn mkdir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        parents: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        let _ = (instance_id, path, parents);
        Box::pin(async { Err(OpError::unsupported(self.kind(), "files.mkdir")) })
    }
    /// Watches a directory for changes (operation `watch`; see [`ops::WatchStream`]). The
    /// watch is in place when this answers.
    fn watch<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        recursive: bool,
    ) -> BoxFuture<'a, Result<ops::WatchStream, OpError>> {
        let _ = (instance_id, path, recursive);
        Box::pin(async { Err(OpError::unsupported(self.kind(), "watch")) })
    }
    /// Moves a file or directory (`files.move`).
    fn rename<'a>(
        &'a self,
        instance_id: &'a str,
        from: &'a str,
        to: &'a str,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        let _ = (instance_id, from, to);
        Box::pin(async { Err(OpError::unsupported(self.kind(), "files.move")) })
    }
    /// `stop`, `start`, `pause` or `resume`.
    fn lifecycle<'a>(
        &'a self,
        instance_id: &'a str,
        operation: ops::Lifecycle,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        let _ = instance_id;
        Box::pin(async move { Err(OpError::unsupported(self.kind(), operation.as_str())) })
    }
    /// Exports the instance's files; the returned id can seed a new instance of this
    /// provider ([`CreateSpec::snapshot`]).
    fn snapshot<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotInfo, OpError>> {
        let _ = instance_id;
        Box::pin(async { Err(OpError::unsupported(self.kind(), "snapshot")) })
    }
    /// What the instance uses now: CPU, memory and disk (E2B's `get_metrics`). Providers
    /// that cannot tell answer `unsupported`, which the API reports as 501.
    fn usage<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<Usage, OpError>> {
        let _ = instance_id;
        Box::pin(async { Err(OpError::unsupported(self.kind(), "metrics")) })
    }
    /// Removes a snapshot this provider took (absent: success).
    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> BoxFuture<'a, Result<(), OpError>> {
        let _ = snapshot_id;
        Box::pin(async { Ok(()) })
    }
    /// Aligns the provider's own clock for the instance with the sandbox's lifetime, so a
    /// provider never ends a sandbox sandgate still serves: the instance is kept at least
    /// `remaining` from now (the sandbox's lifetime; the adapter adds a margin so sandgate's
    /// own expiry, which deletes it cleanly, comes first), or, for a sandbox without a lifetime
    /// (`None`), for the adapter's keep-alive window. sandgate calls it once the instance runs,
    /// when the lifetime moves, and on every liveness pass (see `create::liveness`).
    /// Default: nothing to do, for providers without a clock of their own.
    fn extend_lifetime<'a>(
        &'a self,
        instance_id: &'a str,
        remaining: Option<std::time::Duration>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        let _ = (instance_id, remaining);
        Box::pin(async { Ok(()) })
    }
}

/// What an adapter adds to a sandbox's remaining lifetime when it sets the provider's clock:
/// sandgate's janitor deletes an expired sandbox (events, identity, record) and must come first.
pub const LIFETIME_MARGIN: std::time::Duration = std::time::Duration::from_secs(120);

/// Why the configured adapters could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Simulated(#[from] simulated::SimulatedError),
    #[error(transparent)]
    Account(#[from] hosted::AccountError),
}

/// Adapters by pool name. A pool without an adapter (a hosted provider this build has no
/// adapter for) cannot serve: its attempts advance as `unsupported`.
#[derive(Default)]
pub struct ProviderRegistry {
    by_pool: HashMap<String, Arc<dyn Provider>>,
    simulated: HashMap<String, Arc<simulated::SimulatedProvider>>,
}

impl std::fmt::Debug for ProviderRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderRegistry")
            .field("pools", &self.by_pool.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl ProviderRegistry {
    /// Builds the adapters for the configured pools.
    /// Every pool whose provider kind is `simulated` gets a simulated adapter (settings from
    /// `[simulated.<pool>]`, else instant and unlimited). A pool of a hosted kind with an
    /// adapter in this build gets its account's (see [`hosted`]); `tls` is the trust its
    /// HTTP client uses. Local pools are added by the server, which owns the runtime.
    pub fn from_config(
        simulated: &BTreeMap<String, simulated::SimulatedPoolConfig>,
        accounts: &[sandgate_router::AccountConfig],
        topology: &sandgate_router::Topology,
        tls: &rustls::ClientConfig,
    ) -> Result<ProviderRegistry, RegistryError> {
        let mut registry = ProviderRegistry::default();
        let mut by_account: HashMap<String, Option<Arc<dyn Provider>>> = HashMap::new();
        for pool in topology.pools() {
            let kind = topology.providers()[pool.provider].kind;
            if kind == sandgate_router::ProviderKind::Simulated {
                let sim = simulated
                    .get(pool.name.as_ref())
                    .cloned()
                    .unwrap_or_default();
                let provider = Arc::new(simulated::SimulatedProvider::new(&pool.name, sim)?);
                registry
                    .by_pool
                    .insert(pool.name.to_string(), provider.clone());
                registry.simulated.insert(pool.name.to_string(), provider);
                continue;
            }
            let account = &topology.accounts()[pool.account];
            let Some(raw) = accounts.iter().find(|a| *a.name == *account.name) else {
                continue;
            };
            let adapter = match by_account.get(&raw.name) {
                Some(adapter) => adapter.clone(),
                None => {
                    let adapter = hosted::build(kind, raw, tls)?;
                    by_account.insert(raw.name.clone(), adapter.clone());
                    adapter
                }
            };
            if let Some(adapter) = adapter {
                registry.by_pool.insert(pool.name.to_string(), adapter);
            }
        }
        Ok(registry)
    }

    pub fn insert(&mut self, pool: &str, provider: Arc<dyn Provider>) {
        self.by_pool.insert(pool.to_string(), provider);
    }

    pub fn for_pool(&self, pool: &str) -> Option<Arc<dyn Provider>> {
        self.by_pool.get(pool).cloned()
    }

    /// Every adapter once (pools may share one).
    pub fn adapters(&self) -> Vec<Arc<dyn Provider>> {
        let mut out: Vec<Arc<dyn Provider>> = Vec::new();
        for adapter in self.by_pool.values() {
            let ptr = Arc::as_ptr(adapter) as *const ();
            if !out.iter().any(|a| Arc::as_ptr(a) as *const () == ptr) {
                out.push(adapter.clone());
            }
        }
        out
    }

    /// The simulated provider of a pool, for tests and demos to inspect its inventory.
    pub fn simulated(&self, pool: &str) -> Option<Arc<simulated::SimulatedProvider>> {
        self.simulated.get(pool).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_provider_that_cannot_tell_its_usage_answers_unsupported() {
        // The API answers this 501 `unsupported`, which the E2B SDK raises with status 501.
        let sim = simulated::SimulatedProvider::new("p", Default::default()).unwrap();
        let e = sim.usage("i-1").await.unwrap_err();
        assert_eq!(
            (e.kind, e.code()),
            (OpErrorKind::Unsupported, "unsupported")
        );
        assert!(e.message.contains("metrics"), "{}", e.message);
    }

    #[tokio::test]
    async fn a_provider_without_terminals_or_stdin_answers_unsupported_naming_which() {
        // Only adapters that run their own processes (local) offer these; the rest are 501.
        let sim = simulated::SimulatedProvider::new("p", Default::default()).unwrap();
        let size = ops::WinSize::DEFAULT;
        for (mode, named) in [
            (InputMode::Terminal(size), "pty"),
            (InputMode::Stdin, "exec.stdin"),
        ] {
            let spec = ExecSpec::default();
            let Err(e) = sim.exec_interactive("i-1", spec, mode).await else {
                panic!("the simulated provider started an interactive command");
            };
            assert_eq!(e.kind, OpErrorKind::Unsupported);
            assert!(e.message.ends_with(named), "{}", e.message);
        }
    }

    #[tokio::test]
    async fn a_provider_whose_sandboxes_are_elsewhere_serves_no_ports() {
        // Only the local provider's sandboxes run beside the ports gateway; the API answers
        // the rest 501 `unsupported` naming `ports`.
        let sim = simulated::SimulatedProvider::new("p", Default::default()).unwrap();
        let e = sim.ports().unwrap_err();
        assert_eq!(
            (e.kind, e.code()),
            (OpErrorKind::Unsupported, "unsupported")
        );
        assert!(e.message.ends_with("ports"), "{}", e.message);
        let Err(e) = sim.connect_port("i-1", 8000).await else {
            panic!("the simulated provider reached a port");
        };
        assert_eq!(e.kind, OpErrorKind::Unsupported);
    }
}
