//! The `kind = "local"` provider: each instance is a [`crate::localbox`] sandbox on this
//! machine, whose only way out is a proxy listener sandgate binds inside its network
//! namespace.
//!
//! Contract:
//! - An instance id is `lb-<12 hex>` (a new one per attempt); the sandbox id it serves is
//!   its tag. Its `HTTP_PROXY` is `http://127.0.0.1:<[local] proxy_port>` with no
//!   credentials: the listener serves only that sandbox's egress identity (looked up per
//!   request, so deletion revokes it at once), and a header naming another sandbox changes
//!   nothing.
//! - The sandbox's environment carries the proxy and CA variables (the gateway CA placed
//!   inside it) and the credential placeholders the coordinator passes; never a secret.
//! - Every instance runs under limits ([`super::local_limits`]): memory, cpu, processes
//!   and the size of `/home/user` + `/tmp`, from `[local.defaults]` or the create's
//!   `resources` (`memory_mb`, `cpu`, `disk_gb`) up to `[local.max]` (above it: an invalid
//!   request). A limit this machine cannot enforce is left out, said at start and in
//!   the view's `limits.unenforced`; the default pool declares only enforced resources.
//! - The sandbox's view carries `limits` ([`Provider::limits_view`]): what is enforced,
//!   memory kills, refused forks, a full disk, and a `limit_reached` event for each.
//! - Instances survive a gateway restart ([`crate::localbox`]'s `recover` module says how a
//!   sandbox is recognised from its state files). [`LocalProvider::new`] re-adopts every
//!   instance the previous process left whose init, namespace, cgroups and root are still
//!   there: its listener serves the same sandbox identity (its tag) again, `get` answers it,
//!   and [`Provider::take_readopted`] hands it to the coordinator once, which deletes it
//!   unless a sandbox is placed on it or its create is still in flight (the resumed create
//!   finds it by tag). An instance that cannot be re-adopted has its remains removed, `get`
//!   answers `None`, and [`Provider::readoption_failure`] says why (a stable code from
//!   the `recover` module and a message), which becomes the sandbox's `error`.
//! - A graceful stop leaves the instances running with `[local] on_shutdown = "keep"` (the
//!   default) and deletes them with `"stop"` (see `Server::stop`). A command attached to an
//!   exec stream loses it (a graceful stop ends the command); what it left running goes on.
//! - `usage` (E2B's `get_metrics`) reads the sandbox's cgroups, `/proc` standing in where
//!   they lack a figure ([`LocalRuntime::usage`]).
//! - Snapshots are tar files `<snapshot_dir>/<snap id>.tar`; `create` with a snapshot
//!   restores it inside the new sandbox.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::Deserialize;

use super::local_limits::{self, LocalLimits, Resolved, Watch};
use super::ops::{
    ExecSpec, ExecStream, InputMode, InteractiveStream, Lifecycle, OpError, OpErrorKind,
    SandboxEntry, WatchStream,
};
use super::{
    BoxFuture, CreateSpec, ErrorClass, Instance, InstanceState, Provider, ProviderError,
    RuntimeCapabilities, SnapshotInfo, Tags, Usage,
};
use crate::egress::EgressState;
use crate::localbox::{
    ConnectError, Enforced, ExecHandle, ExecRequest, Limits, LocalRuntime, LocalboxError,
    Recovered, RuntimeConfig, SandboxSpec, Unrecoverable, WatchLimits,
};

/// The labels a local sandbox records its tags under (see [`SandboxSpec::labels`]).
const SANDBOX_LABEL: &str = "sandbox_id";
const ATTEMPT_LABEL: &str = "attempt_id";

pub struct LocalProvider {
    runtime: Arc<LocalRuntime>,
    egress: Arc<EgressState>,
    ca_pem: Vec<u8>,
    proxy_port: u16,
    snapshot_dir: PathBuf,
    defaults: Resolved,
    max: Resolved,
    /// Who an exec may run as ([`LocalConfig::all_users`]).
    users: BTreeMap<String, LocalUser>,
    instances: Mutex<HashMap<String, LocalInstance>>,
    /// Re-adopted at start, not yet handed to the coordinator.
    readopted: Mutex<Vec<Instance>>,
    /// Instances of the previous process that could not be re-adopted, by id.
    unrecoverable: HashMap<String, Unrecoverable>,
    /// Whether the ports gateway serves this process's sandboxes' ports (its listener is
    /// up): what the instances declare as `public_ports`.
    public_ports: bool,
}

struct LocalInstance {
    tags: Tags,
    listener: tokio::task::JoinHandle<()>,
    limits: Watch,
    watcher: tokio::task::JoinHandle<()>,
}

impl Drop for LocalInstance {
    fn drop(&mut self) {
        self.listener.abort();
        self.watcher.abort();
    }
}

impl std::fmt::Debug for LocalProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalProvider")
            .field("proxy_port", &self.proxy_port)
            .finish_non_exhaustive()
    }
}

/// The runtime settings `[local]` describes.
pub fn runtime_config(config: &LocalConfig) -> RuntimeConfig {
    let mut rc = RuntimeConfig::new(&config.dir);
    rc.netns_prefix = config.netns_prefix.clone();
    rc.cgroup_name = config.cgroup.clone();
    rc.uid = config.uid;
    rc.gid = config.gid;
    rc.extra_ro_binds = config.extra_ro_binds.clone();
    rc.watch = WatchLimits {
        dirs: config.watch.dirs,
        watchers: config.watch.watchers,
        queue: config.watch.queue.max(1),
    };
    rc
}

impl LocalProvider {
    /// Takes over the runtime and re-adopts the sandboxes a previous process left running
    /// (the others' remains are removed).
    pub async fn new(
        runtime: Arc<LocalRuntime>,
        egress: Arc<EgressState>,
        ca_pem: Vec<u8>,
        config: &LocalConfig,
    ) -> Result<LocalProvider, LocalboxError> {
        let (recovered, lost) = runtime.recover().await?;
        let mut provider = LocalProvider::build(runtime, egress, ca_pem, config)?;
        for sandbox in recovered {
            provider.readopt(sandbox).await;
        }
        for failure in lost {
            tracing::warn!(instance = %failure.id, sandbox = failure.labels.get(SANDBOX_LABEL).map(String::as_str).unwrap_or("-"), code = failure.code, reason = %failure.message, "a local sandbox of the previous run could not be re-adopted; its remains were removed");
            provider.unrecoverable.insert(failure.id.clone(), failure);
        }
        Ok(provider)
    }

    fn build(
        runtime: Arc<LocalRuntime>,
        egress: Arc<EgressState>,
        ca_pem: Vec<u8>,
        config: &LocalConfig,
    ) -> Result<LocalProvider, LocalboxError> {
        std::fs::create_dir_all(&config.snapshot_dir).map_err(|e| LocalboxError::Setup {
            step: format!("creating {}", config.snapshot_dir.display()),
            detail: e.to_string(),
        })?;
        let caps = runtime.capabilities();
        if !caps.seccomp {
            tracing::warn!(
                arch = std::env::consts::ARCH,
                "local sandboxes run WITHOUT the seccomp filter: no system call list for this \
                 architecture or no seccomp in this kernel; the local pool declares it"
            );
        }
        let unenforced = local_limits::unenforced(&caps);
        let unenforced: Vec<_> = unenforced.into_iter().filter(|u| *u != "seccomp").collect();
        if !unenforced.is_empty() {
            tracing::warn!(
                unenforced = ?unenforced,
                "local sandboxes run WITHOUT these limits: this machine cannot enforce them \
                 (cgroup controllers not delegated to sandgate, or no mkfs.ext4/loop devices \
                 for disk); the local pool declares them in its labels"
            );
        }
        Ok(LocalProvider {
            runtime,
            egress,
            ca_pem,
            proxy_port: config.proxy_port,
            snapshot_dir: config.snapshot_dir.clone(),
            defaults: config.limits().0,
            max: config.limits().1,
            users: config.all_users(),
            instances: Mutex::new(HashMap::new()),
            readopted: Mutex::new(Vec::new()),
            unrecoverable: HashMap::new(),
            public_ports: false,
        })
    }

    /// Serves a sandbox the previous process left running, under the tags it recorded; one
    /// without them (not made by this provider) is deleted.
    async fn readopt(&mut self, sandbox: Recovered) {
        let tags = match (
            sandbox.labels.get(SANDBOX_LABEL),
            sandbox.labels.get(ATTEMPT_LABEL),
        ) {
            (Some(s), Some(a)) => Tags {
                sandbox_id: s.clone(),
                attempt_id: a.clone(),
            },
            _ => {
                let _ = self.runtime.delete(&sandbox.id).await;
                let message = "its state file carries no sandbox tags".to_string();
                self.unrecoverable.insert(
                    sandbox.id.clone(),
                    Unrecoverable {
                        id: sandbox.id,
                        labels: sandbox.labels,
                        code: "state_mismatch",
                        message,
                    },
                );
                return;
            }
        };
        tracing::info!(sandbox = %tags.sandbox_id, instance = %sandbox.id, status = ?sandbox.status, "re-adopted a local sandbox of the previous run");
        self.serve_instance(&sandbox.id, &tags, sandbox.listener, sandbox.enforced);
        self.readopted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Instance {
                id: sandbox.id,
                tags,
                state: InstanceState::Running,
            });
    }

    /// Serves the instance's egress on its listener (as its sandbox, whatever a request
    /// says), watches its limits and records it.
    fn serve_instance(
        &self,
        instance_id: &str,
        tags: &Tags,
        listener: tokio::net::TcpListener,
        enforced: Enforced,
    ) {
        let sandbox_id: Arc<str> = Arc::from(tags.sandbox_id.as_str());
        let listener = tokio::spawn(crate::egress::serve_for(
            listener,
            self.egress.clone(),
            sandbox_id,
        ));
        let (limits, watcher) = local_limits::watch(
            self.runtime.clone(),
            instance_id.to_string(),
            tags.sandbox_id.clone(),
            enforced,
        );
        self.map().insert(
            instance_id.to_string(),
            LocalInstance {
                tags: tags.clone(),
                listener,
                limits,
                watcher,
            },
        );
    }

    /// Declares whether the ports gateway serves (see `crate::ports`): the instances'
    /// `public_ports` capability.
    pub fn with_public_ports(mut self, serving: bool) -> LocalProvider {
        self.public_ports = serving;
        self
    }

    pub fn runtime(&self) -> &Arc<LocalRuntime> {
        &self.runtime
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, LocalInstance>> {
        self.instances.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn snapshot_path(&self, id: &str) -> Result<PathBuf, OpError> {
        let ok = id.len() == 21
            && id.starts_with("snap-")
            && id[5..].bytes().all(|b| b.is_ascii_hexdigit());
        if !ok {
            return Err(OpError::new(
                OpErrorKind::NotFound,
                format!("no snapshot {id:?}"),
            ));
        }
        Ok(self.snapshot_dir.join(format!("{id}.tar")))
    }

    /// The uid and gid of a declared user (`None`: the default user's, the runtime's own);
    /// an undeclared one is refused naming those that are.
    /// The runtime's request for an exec (its user checked against the pool's).
    fn exec_request(&self, spec: ExecSpec) -> Result<ExecRequest, OpError> {
        Ok(ExecRequest {
            user: self.user_ids(spec.user.as_deref())?,
            argv: spec.argv,
            env: spec.env,
            cwd: spec.cwd,
            timeout: spec.timeout,
            ..ExecRequest::default()
        })
    }

    fn user_ids(&self, user: Option<&str>) -> Result<Option<(u32, u32)>, OpError> {
        let Some(name) = user else {
            return Ok(None);
        };
        match self.users.get(name) {
            Some(u) => Ok(Some((u.uid, u.gid))),
            None => Err(OpError::new(
                OpErrorKind::Invalid,
                format!(
                    "user {name:?} is not declared by this local pool; it declares: {} \
                     ([local.users] in the gateway's configuration)",
                    self.users.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )),
        }
    }

    async fn do_create(&self, spec: CreateSpec) -> Result<Instance, ProviderError> {
        let instance_id = format!("lb-{}", crate::base::ids::random_hex(6));
        let limits: Limits = local_limits::limits_for(
            &self.defaults,
            &self.max,
            &spec.request.resources,
            &self.runtime.capabilities(),
        )
        .map_err(|m| ProviderError::new(ErrorClass::InvalidRequest, m))?;
        let from_snapshot = match &spec.snapshot {
            Some(id) => {
                let path = self
                    .snapshot_path(id)
                    .map_err(|e| ProviderError::new(ErrorClass::InvalidRequest, e.message))?;
                if !path.exists() {
                    return Err(ProviderError::new(
                        ErrorClass::InvalidRequest,
                        format!("snapshot {id} does not exist on this provider"),
                    ));
                }
                Some(path)
            }
            None => None,
        };
        let created = self
            .runtime
            .create(SandboxSpec {
                id: instance_id.clone(),
                proxy_url: format!("http://127.0.0.1:{}", self.proxy_port),
                ca_pem: Some(self.ca_pem.clone()),
                env: spec.env.clone(),
                limits,
                from_snapshot,
                labels: [
                    (SANDBOX_LABEL, &spec.tags.sandbox_id),
                    (ATTEMPT_LABEL, &spec.tags.attempt_id),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            })
            .await
            .map_err(|e| {
                let class = match &e {
                    LocalboxError::Invalid(_) | LocalboxError::InvalidId(_) => {
                        ErrorClass::InvalidRequest
                    }
                    LocalboxError::Unsupported(_)
                    | LocalboxError::Privileges { .. }
                    | LocalboxError::MissingTool(_) => ErrorClass::Unsupported,
                    _ => ErrorClass::FailedBeforeRunning,
                };
                ProviderError::new(class, e.to_string())
            })?;
        tracing::info!(
            sandbox = %spec.tags.sandbox_id,
            instance = %instance_id,
            netns = %self.runtime.netns_name(&instance_id),
            enforced = ?created.enforced,
            "local sandbox running"
        );
        self.serve_instance(&instance_id, &spec.tags, created.listener, created.enforced);
        Ok(Instance {
            id: instance_id,
            tags: spec.tags,
            state: InstanceState::Running,
        })
    }
}

impl Provider for LocalProvider {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn process_local(&self) -> bool {
        true
    }

    fn take_readopted(&self) -> Vec<Instance> {
        std::mem::take(&mut *self.readopted.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn readoption_failure(&self, instance_id: &str) -> Option<(&'static str, String)> {
        let failure = self.unrecoverable.get(instance_id)?;
        Some((failure.code, failure.message.clone()))
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(self.do_create(spec))
    }

    fn get<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        Box::pin(async move {
            let tags = self.map().get(instance_id).map(|i| i.tags.clone());
            Ok(tags.map(|tags| Instance {
                id: instance_id.to_string(),
                tags,
                state: InstanceState::Running,
            }))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            Ok(self
                .map()
                .iter()
                .filter(|(_, i)| i.tags.sandbox_id == sandbox_id)
                .filter(|(_, i)| attempt_id.is_none_or(|a| a == i.tags.attempt_id))
                .map(|(id, i)| Instance {
                    id: id.clone(),
                    tags: i.tags.clone(),
                    state: InstanceState::Running,
                })
                .collect())
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            match self.runtime.delete(instance_id).await {
                Ok(()) | Err(LocalboxError::NotFound(_)) => {}
                Err(e) => return Err(ProviderError::new(ErrorClass::ProviderError, e.to_string())),
            }
            // Dropping the instance stops its listener.
            self.map().remove(instance_id);
            Ok(())
        })
    }

    fn limits_view(&self, instance_id: &str) -> Option<serde_json::Value> {
        Some(local_limits::view(&self.map().get(instance_id)?.limits))
    }

    fn capabilities<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<RuntimeCapabilities, ProviderError>> {
        Box::pin(async move {
            if !self.map().contains_key(instance_id) {
                return Err(ProviderError::new(
                    ErrorClass::Unknown,
                    format!("no local instance {instance_id}"),
                ));
            }
            Ok(RuntimeCapabilities {
                public_ports: self.public_ports,
                pause_resume: self.runtime.capabilities().freezer,
                pty: true,
                ..RuntimeCapabilities::FULL
            })
        })
    }

    fn connect_port<'a>(
        &'a self,
        instance_id: &'a str,
        port: u16,
    ) -> BoxFuture<'a, Result<Option<tokio::net::TcpStream>, OpError>> {
        Box::pin(async move {
            self.ports()?;
            match self.runtime.connect_port(instance_id, port).await {
                Ok(stream) => Ok(Some(stream)),
                Err(ConnectError::Refused(_)) => Ok(None),
                Err(ConnectError::Setup(e)) => Err(e.into()),
            }
        })
    }

    fn ports(&self) -> Result<(), OpError> {
        match self.public_ports {
            true => Ok(()),
            false => Err(OpError::unsupported(
                self.kind(),
                "ports here: the ports gateway is not serving ([ports] enabled = false, or its listener could not be bound)",
            )),
        }
    }

    fn exec_user(&self, user: &str) -> Result<(), OpError> {
        self.user_ids(Some(user)).map(|_| ())
    }

    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
    ) -> BoxFuture<'a, Result<ExecStream, OpError>> {
        Box::pin(async move {
            let handle = self
                .runtime
                .exec(instance_id, self.exec_request(spec)?)
                .await?;
            Ok(exec_stream(handle))
        })
    }

    fn exec_interactive<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
        mode: InputMode,
    ) -> BoxFuture<'a, Result<InteractiveStream, OpError>> {
        Box::pin(async move {
            let mut request = self.exec_request(spec)?;
            match mode {
                InputMode::Terminal(size) => request.tty = Some(size),
                InputMode::Stdin => request.stdin = true,
            }
            let mut handle = self.runtime.exec(instance_id, request).await?;
            // A command that could not start has no input; its stream says why.
            let input = handle
                .take_input()
                .unwrap_or_else(|| tokio::sync::mpsc::channel(1).0);
            Ok(InteractiveStream {
                stream: exec_stream(handle),
                input,
            })
        })
    }

    fn watch<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        recursive: bool,
    ) -> BoxFuture<'a, Result<WatchStream, OpError>> {
        Box::pin(async move {
            let watcher = self.runtime.watch(instance_id, path, recursive).await?;
            Ok(WatchStream {
                events: watcher.into_receiver(),
            })
        })
    }

    fn read_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, OpError>> {
        Box::pin(async move { Ok(self.runtime.read_file(instance_id, path).await?) })
    }

    fn write_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        data: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move { Ok(self.runtime.write_file(instance_id, path, data).await?) })
    }

    fn list_dir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SandboxEntry>, OpError>> {
        Box::pin(async move {
            let entries = self.runtime.list_dir(instance_id, path).await?;
            Ok(entries.into_iter().map(SandboxEntry::from).collect())
        })
    }

    fn remove_path<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        recursive: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move { Ok(self.runtime.remove(instance_id, path, recursive).await?) })
    }

    fn mkdir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        parents: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move { Ok(self.runtime.mkdir(instance_id, path, parents).await?) })
    }

    fn rename<'a>(
        &'a self,
        instance_id: &'a str,
        from: &'a str,
        to: &'a str,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move { Ok(self.runtime.rename(instance_id, from, to).await?) })
    }

    fn lifecycle<'a>(
        &'a self,
        instance_id: &'a str,
        operation: Lifecycle,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            match operation {
                Lifecycle::Stop => self.runtime.stop(instance_id).await?,
                Lifecycle::Start => self.runtime.start(instance_id).await?,
                Lifecycle::Pause => self.runtime.pause(instance_id).await?,
                Lifecycle::Resume => self.runtime.resume(instance_id).await?,
            }
            Ok(())
        })
    }

    fn usage<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<Usage, OpError>> {
        Box::pin(async move { Ok(self.runtime.usage(instance_id).await?) })
    }

    fn snapshot<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotInfo, OpError>> {
        Box::pin(async move {
            let id = format!("snap-{}", crate::base::ids::random_hex(8));
            let path = self.snapshot_path(&id)?;
            match self.runtime.snapshot(instance_id, &path).await {
                Ok(size_bytes) => Ok(SnapshotInfo { id, size_bytes }),
                Err(e) => {
                    let _ = std::fs::remove_file(&path);
                    Err(e.into())
                }
            }
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let path = self.snapshot_path(snapshot_id)?;
            match std::fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(OpError::new(
                    OpErrorKind::Provider,
                    format!("removing snapshot {snapshot_id}: {e}"),
                )),
            }
        })
    }
}

/// Stands in for the local provider when this machine cannot run it (not root, no
/// `ip`): every create fails with the reason, naming what is missing.
#[derive(Debug)]
pub struct UnavailableLocal {
    pub reason: String,
}

impl Provider for UnavailableLocal {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn process_local(&self) -> bool {
        true
    }
    fn create(&self, _spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            Err(ProviderError::new(
                ErrorClass::Unsupported,
                format!(
                    "the local provider is unavailable on this machine: {}",
                    self.reason
                ),
            ))
        })
    }
    fn get<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        Box::pin(async { Ok(None) })
    }
    fn list_by_tag<'a>(
        &'a self,
        _: &'a str,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn delete<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async { Ok(()) })
    }
    fn capabilities<'a>(
        &'a self,
        _: &'a str,
    ) -> BoxFuture<'a, Result<RuntimeCapabilities, ProviderError>> {
        Box::pin(async { Ok(RuntimeCapabilities::NONE) })
    }
}

/// `[local]`: settings of the local provider (every pool whose provider kind is `local`).
/// With no `[[providers]]`, `[[accounts]]` and `[[pools]]` at all, sandgate runs one local
/// pool named `local` (provider `local`, account `local`): the embedded default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalConfig {
    /// Directory holding each sandbox's directory (its root file system). Created mode 0700.
    pub dir: PathBuf,
    /// Directory holding snapshots (tar files), outside `dir`.
    pub snapshot_dir: PathBuf,
    /// Port of the proxy listener inside each sandbox's network namespace; the sandbox's
    /// `HTTP_PROXY` is `http://127.0.0.1:<proxy_port>`.
    pub proxy_port: u16,
    /// User and group the sandbox's processes run as: its default user, named `user`.
    pub uid: u32,
    pub gid: u32,
    /// `[local.users]`: the other users an exec may ask for by name, e.g.
    /// `root = { uid = 0, gid = 0 }` (none by default). A sandbox stays in its namespaces,
    /// chroot, cgroups and seccomp filter whoever it runs as, but uid 0 there is the host's
    /// root: declare it only for workloads you would trust with it.
    pub users: BTreeMap<String, LocalUser>,
    /// Extra host directories bound read-only into every sandbox at the same path.
    pub extra_ro_binds: Vec<PathBuf>,
    /// Network namespaces are named `<netns_prefix><instance id>` (see `ip netns list`).
    pub netns_prefix: String,
    /// Name of the cgroup (under sandgate's own) holding the sandboxes' cgroups.
    pub cgroup: String,
    /// Capacity of the default `local` pool (ignored when pools are configured).
    pub capacity: u64,
    /// `[local.defaults]`: the limits every sandbox gets unless its create asks otherwise.
    pub defaults: LocalLimits,
    /// `[local.max]`: the most a create's `resources` may ask for.
    pub max: LocalLimits,
    /// What a graceful stop (SIGTERM, Ctrl-C) does to the running local sandboxes.
    pub on_shutdown: OnShutdown,
    /// `[local.watch]`: the bounds of directory watching.
    pub watch: LocalWatch,
}

/// `[local.watch]`: what watching a sandbox's directories may hold (`localbox::watch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalWatch {
    /// Directories watched at once per sandbox (all its watches together).
    pub dirs: usize,
    /// Watches open at once per sandbox.
    pub watchers: usize,
    /// Events waiting for a reader that falls behind, per watch; past it they are dropped
    /// and the reader is told (`overflow`).
    pub queue: usize,
}

impl Default for LocalWatch {
    fn default() -> Self {
        let limits = WatchLimits::default();
        LocalWatch {
            dirs: limits.dirs,
            watchers: limits.watchers,
            queue: limits.queue,
        }
    }
}

/// `[local] on_shutdown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnShutdown {
    /// Leave them running; the next start re-adopts them.
    #[default]
    Keep,
    /// Delete them (processes, files, namespaces, cgroups).
    Stop,
}

/// One declared user of `[local.users]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalUser {
    pub uid: u32,
    pub gid: u32,
}

/// The name of a local sandbox's default user (`[local] uid`/`gid`).
pub const DEFAULT_USER: &str = "user";

impl LocalConfig {
    /// Every user an exec may run as, by name: [`DEFAULT_USER`] and `[local.users]`.
    pub fn all_users(&self) -> BTreeMap<String, LocalUser> {
        let mut users = self.users.clone();
        let default = LocalUser {
            uid: self.uid,
            gid: self.gid,
        };
        users.insert(DEFAULT_USER.to_string(), default);
        users
    }

    /// `[local.users]` is valid: portable names, none of them the default user's.
    pub fn check_users(&self) -> Result<(), (String, String)> {
        for name in self.users.keys() {
            let key = format!("local.users.{name}");
            if name == DEFAULT_USER {
                let why = "`user` is the default user: set [local] uid and gid instead";
                return Err((key, why.into()));
            }
            if !crate::ops::user_name(name) {
                let why = "a user name is 1 to 32 of a-z, 0-9, '_' and '-', starting with a \
                           letter or '_'";
                return Err((key, why.into()));
            }
        }
        Ok(())
    }

    /// `[local.defaults]` and `[local.max]` with the built-in values filled in.
    pub fn limits(&self) -> (Resolved, Resolved) {
        (
            self.defaults.resolve(LocalLimits::DEFAULTS),
            self.max.resolve(LocalLimits::MAX),
        )
    }
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            dir: PathBuf::from("data/sandboxes"),
            snapshot_dir: PathBuf::from("data/snapshots"),
            proxy_port: 3128,
            uid: 65534,
            gid: 65534,
            users: BTreeMap::new(),
            extra_ro_binds: Vec::new(),
            netns_prefix: "sg-".into(),
            cgroup: "sandgate".into(),
            capacity: 16,
            defaults: LocalLimits::default(),
            max: LocalLimits::default(),
            on_shutdown: OnShutdown::Keep,
            watch: LocalWatch::default(),
        }
    }
}

fn exec_stream(handle: ExecHandle) -> ExecStream {
    let (events, canceller) = handle.into_parts();
    ExecStream {
        events,
        cancel: Arc::new(move || canceller.cancel()),
    }
}
