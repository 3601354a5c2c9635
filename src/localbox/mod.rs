//! `localbox`: namespaced sandboxes on this machine whose only way out is sandgate.
//!
//! This is the engine under the `kind = "local"` provider. A sandbox is:
//!
//! * a **network namespace** `<netns_prefix><id>` (visible in `ip netns list`) with only
//!   loopback up: no interface, no route, nothing but what listens on its own
//!   `127.0.0.1`;
//! * a **listener** sandgate owns, bound *inside* that namespace at the address the
//!   proxy URL names (`127.0.0.1:<port>`), returned by [`LocalRuntime::create`] as a
//!   [`tokio::net::TcpListener`] that keeps serving from the gateway's own runtime. A
//!   connection accepted on it can only have come from that sandbox, so the gateway takes
//!   the sandbox identity from the listener, not from a header;
//! * a **root directory** `<base_dir>/<id>/root`, entered with `chroot`: the host's
//!   `/usr`, `/etc` (and `/bin`, `/sbin`, `/lib*` as on the host: symlinks on a merged-usr
//!   system, read-only binds otherwise) plus any configured extra paths, bound read-only,
//!   `nosuid` and `nodev`; a private writable `/home/user` (the working directory) and
//!   `/tmp`; a fresh `/proc` for its PID namespace; a minimal `/dev`; the gateway CA at
//!   `/sandgate/ca.pem`. The root itself is read-only inside the sandbox;
//! * **PID, mount, UTS and IPC namespaces** held by an init process (a reaping shell,
//!   PID 1 of the sandbox) that every exec joins (see `enter`). Mounts exist only in the
//!   sandbox's mount namespace; nothing is mounted on the host besides the netns handle
//!   `ip netns add` creates;
//! * an **unprivileged user** (`uid`/`gid` of [`RuntimeConfig`], default 65534) for every
//!   exec: no capabilities, no supplementary groups, setuid binaries neutralized by
//!   `nosuid`;
//! * a **seccomp filter** on every exec ([`seccomp::REFUSED`]: new namespaces, kernel
//!   modules, tracing, keyring, bpf, mounts, ...; refused with `EPERM`), installed with
//!   `no_new_privs` just before `execve`. The init (a sleep loop of ours that runs nothing
//!   of the workload's) is not filtered: it mounts the sandbox's file system;
//! * **cgroups** under the gateway's own group ([`CgroupMode`]): v1 (`freezer`, `memory`,
//!   `cpu` hierarchies, each when mounted and writable) or v2 (`cgroup.freeze`,
//!   `cgroup.kill`; `memory.max` and `cpu.max` only where the gateway's group delegates
//!   those controllers, e.g. systemd `Delegate=yes`). The freezer serves pause/resume
//!   and killing a whole process tree reliably; each exec (and the init) has its own
//!   leaf group. Limits are applied only when enforceable, [`Enforced`] reports exactly
//!   what is, and asking for one that cannot be enforced is an error.
//!
//! Every process gets an environment built only from: `PATH`, `HOME=/home/user`, the
//! proxy variables (`HTTP_PROXY`, `HTTPS_PROXY`, `http_proxy`, `https_proxy` = the proxy
//! URL given at creation, userinfo included; `NO_PROXY`/`no_proxy` =
//! `localhost,127.0.0.1,::1`), the CA variables ([`CA_ENV_VARS`], when a CA was given),
//! the sandbox's extra variables (for example credential placeholders) and the exec's own
//! variables. Nothing is inherited from the gateway's environment.
//!
//! ## Contract
//! * All operations take the sandbox id given at creation; an unknown id is
//!   [`LocalboxError::NotFound`].
//! * [`LocalRuntime::create`] either returns a running sandbox or cleans up everything it
//!   made. The returned listener belongs to the caller; it stays valid across
//!   stop/start/pause and should be dropped after [`LocalRuntime::delete`].
//! * [`LocalRuntime::exec`] returns as soon as the process started; output streams
//!   through [`ExecHandle`]. Order is exact within stdout and within stderr; between the
//!   two it is the order in which the gateway read them (two pipes carry no common
//!   clock), which is the write order whenever writes are not simultaneous. Dropping the
//!   handle, [`ExecHandle::cancel`], or the timeout kill the exec's whole process tree
//!   (its freezer group). When the command exits, processes it left in the background
//!   keep running until the sandbox is stopped; output is read for a short grace period
//!   after the exit.
//! * File operations work whether the sandbox is running, paused or stopped. Paths are
//!   sandbox paths (absolute, or relative to `/home/user`); a `..` component is refused;
//!   every symlink is resolved inside the root (`openat2` with `RESOLVE_IN_ROOT`), so a
//!   link planted by the sandbox never reaches the host; mutations (write, mkdir,
//!   remove) are confined to `/home/user` and `/tmp`. They see the sandbox's own tree,
//!   not the shared read-only base.
//! * stop keeps files and the listener; start brings a fresh init. pause freezes every
//!   process (needs the freezer, else [`LocalboxError::Unsupported`]). delete kills
//!   everything, removes the cgroups, the network namespace and the directory.
//! * [`LocalRuntime::usage`] reads what a sandbox uses now (CPU, memory, disk) from its
//!   cgroups, `/proc` standing in where they lack a figure (see `usage`).
//! * A snapshot is a tar of `/home/user` and `/tmp`; [`SandboxSpec::from_snapshot`]
//!   restores one into a new sandbox, extracted *inside* that sandbox as its user so a
//!   crafted archive cannot write outside it.
//! * A sandbox is independent of the process that made it: its init is not killed when
//!   that process dies, and `state.json` / `life.json` in its directory record what a
//!   later process needs to re-adopt it ([`LocalRuntime::recover`]; the `recover` module
//!   has the contract). Exec streams are the exception: they end with their process.
//! * Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN, ...): [`LocalRuntime::new`] fails with
//!   [`LocalboxError::Privileges`] naming what is missing. Unprivileged user namespaces
//!   are not used (yet).

mod cgroup;
mod enter;
mod exec;
mod fs;
mod limits;
mod netns;
mod pty;
mod recover;
pub mod seccomp;
mod usage;
mod watch;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::process::Command;

pub use cgroup::CgroupMode;
pub use exec::{ExecCanceller, ExecEvent, ExecHandle, ExecOutput, ExitInfo, ExitReason};
pub use limits::LimitHits;
use netns::bind_in_netns;
pub use netns::ConnectError;
pub use pty::{signal_number, ExecInput, WinSize, ALLOWED_SIGNALS};
pub use recover::{Recovered, Unrecoverable};
pub use usage::Usage;
pub use watch::{FsEventKind, WatchEvent, WatchLimits, Watcher};

/// The variables that carry the path of the gateway CA inside the sandbox.
pub const CA_ENV_VARS: [&str; 7] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "AWS_CA_BUNDLE",
];
/// The proxy variables, all set to the proxy URL.
pub const PROXY_ENV_VARS: [&str; 4] = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"];
/// `NO_PROXY` / `no_proxy` value: loopback only.
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";
/// The namespaces every sandbox process is in.
const NAMESPACES: [&str; 5] = ["net", "pid", "mount", "uts", "ipc"];
/// Where the CA file is placed inside the sandbox.
pub const CA_PATH: &str = "/sandgate/ca.pem";
/// The working directory (and `HOME`) of the sandbox's processes.
pub const HOME_DIR: &str = "/home/user";
const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Host top-level entries making up the `metal/base` environment.
const BASE_ENTRIES: [&str; 8] = [
    "usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32",
];

#[derive(Debug, thiserror::Error)]
pub enum LocalboxError {
    #[error(
        "local sandboxes need root privileges: missing {missing}; run sandgate as root \
         (unprivileged user namespaces: {userns}; localbox does not use them)"
    )]
    Privileges { missing: String, userns: String },
    #[error("local sandboxes need `{0}`, which is not installed (not found in PATH)")]
    MissingTool(String),
    #[error("invalid sandbox id {0:?}: use 1-40 characters [A-Za-z0-9_-], starting with a letter or digit")]
    InvalidId(String),
    #[error("sandbox {0:?} already exists")]
    AlreadyExists(String),
    #[error("no sandbox {0:?}")]
    NotFound(String),
    #[error("sandbox {id:?} is {status:?}; {op} needs it {needed}")]
    State {
        id: String,
        status: SandboxStatus,
        op: &'static str,
        needed: &'static str,
    },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: String },
    #[error("{path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not supported here: {0}")]
    Unsupported(String),
    #[error("{step}: {detail}")]
    Setup { step: String, detail: String },
}

impl LocalboxError {
    fn setup(step: impl Into<String>, detail: impl std::fmt::Display) -> LocalboxError {
        LocalboxError::Setup {
            step: step.into(),
            detail: detail.to_string(),
        }
    }
}

pub type Result<T, E = LocalboxError> = std::result::Result<T, E>;

/// Runtime-wide settings.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Sandboxes live in `<base_dir>/<id>`. Created (mode 0700) if missing.
    pub base_dir: PathBuf,
    /// Network namespaces are named `<netns_prefix><id>`.
    pub netns_prefix: String,
    /// Name of the cgroup (under the gateway's own) holding the sandboxes' groups.
    pub cgroup_name: String,
    /// User and group every exec runs as.
    pub uid: u32,
    pub gid: u32,
    /// Extra host directories bound read-only at the same path (for example a Python
    /// installation outside `/usr`).
    pub extra_ro_binds: Vec<PathBuf>,
    /// Bound on bringing up a sandbox's init.
    pub start_timeout: Duration,
    /// Which cgroup hierarchy to use (default: v1 when its freezer is mounted, else v2).
    pub cgroups: CgroupMode,
    /// The bounds of [`LocalRuntime::watch`].
    pub watch: WatchLimits,
}

impl RuntimeConfig {
    pub fn new(base_dir: impl Into<PathBuf>) -> RuntimeConfig {
        RuntimeConfig {
            base_dir: base_dir.into(),
            netns_prefix: "sg-".to_string(),
            cgroup_name: "sandgate".to_string(),
            uid: 65534,
            gid: 65534,
            extra_ro_binds: Vec::new(),
            start_timeout: Duration::from_secs(20),
            cgroups: CgroupMode::Auto,
            watch: WatchLimits::default(),
        }
    }
}

/// What one sandbox is created with.
#[derive(Debug, Clone, Default)]
pub struct SandboxSpec {
    pub id: String,
    /// `http://[userinfo@]127.0.0.1:<port>`: the value of the proxy variables. The
    /// listener is bound at `127.0.0.1:<port>` inside the sandbox's namespace.
    pub proxy_url: String,
    /// The gateway CA (PEM), placed at [`CA_PATH`] and exported through [`CA_ENV_VARS`].
    pub ca_pem: Option<Vec<u8>>,
    /// Extra variables for every process (for example credential placeholders). They may
    /// not redefine the proxy or CA variables.
    pub env: BTreeMap<String, String>,
    pub limits: Limits,
    /// A file written by [`LocalRuntime::snapshot`] to start from.
    pub from_snapshot: Option<PathBuf>,
    /// The creator's own facts about the sandbox (for example which record it serves),
    /// kept in its state file and handed back by [`LocalRuntime::recover`]. Not secrets.
    pub labels: BTreeMap<String, String>,
}

/// Resource limits; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    /// Thousandths of a CPU (1000 = one full CPU).
    pub cpu_millis: Option<u32>,
    /// Processes and threads alive at once.
    pub pids: Option<u64>,
    /// Size of the file system holding `/home/user` and `/tmp` together.
    pub disk_bytes: Option<u64>,
}

/// What the runtime can enforce on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The hierarchy in use: `Some(1)`, `Some(2)`, or `None` without cgroups.
    pub cgroup_version: Option<u8>,
    /// pause/resume and whole-tree kills through the cgroup freezer.
    pub freezer: bool,
    pub memory_limit: bool,
    pub cpu_limit: bool,
    pub pids_limit: bool,
    /// A size limit on the writable areas (mkfs.ext4 and a loop device that mounts).
    pub disk_limit: bool,
    /// Every exec runs under the seccomp filter ([`seccomp::REFUSED`]).
    pub seccomp: bool,
}

/// What is enforced for one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enforced {
    /// Namespaces of its processes: always `net`, `pid`, `mount`, `uts`, `ipc`.
    pub namespaces: Vec<&'static str>,
    /// The memory limit in force (read back from the kernel), if one was asked for.
    pub memory_bytes: Option<u64>,
    pub cpu_millis: Option<u32>,
    pub pids: Option<u64>,
    pub disk_bytes: Option<u64>,
    /// Whether pause/resume is available (freezer).
    pub pausable: bool,
    pub uid: u32,
    pub gid: u32,
}

/// What [`LocalRuntime::create`] hands back.
#[derive(Debug)]
pub struct Created {
    /// Bound inside the sandbox's network namespace at `127.0.0.1:<port>`.
    pub listener: tokio::net::TcpListener,
    pub proxy_port: u16,
    pub enforced: Enforced,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxStatus {
    Running,
    Paused,
    Stopped,
}

/// One command to run inside a sandbox.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    /// Added to the sandbox's environment; may not redefine proxy or CA variables.
    pub env: BTreeMap<String, String>,
    /// Working directory (sandbox path); default [`HOME_DIR`].
    pub cwd: Option<String>,
    /// Kill the process tree after this long.
    pub timeout: Option<Duration>,
    /// Run on a terminal of this size (a pseudo-terminal, see `pty.rs`); input through
    /// [`ExecHandle::take_input`].
    pub tty: Option<WinSize>,
    /// Without a terminal: stdin is a pipe fed through [`ExecHandle::take_input`] (else
    /// `/dev/null`).
    pub stdin: bool,
    /// Run as this uid and gid instead of [`RuntimeConfig`]'s (the caller checked that the
    /// pool declares them).
    pub user: Option<(u32, u32)>,
}

impl ExecRequest {
    pub fn new<I, S>(argv: I) -> ExecRequest
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecRequest {
            argv: argv.into_iter().map(Into::into).collect(),
            ..ExecRequest::default()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One directory entry (symlinks are reported as themselves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    pub name: String,
    pub kind: EntryKind,
    pub size: u64,
    pub mode: u32,
    pub modified_unix: i64,
}

#[derive(Debug)]
struct Tools {
    ip: PathBuf,
    nsenter: PathBuf,
    unshare: PathBuf,
    tar: PathBuf,
    /// For a disk limit; optional, the limit is unavailable without it.
    mkfs: Option<PathBuf>,
}

/// The local sandbox runtime. Share it behind an `Arc`; all methods take `&self`.
///
/// Dropping the runtime deletes every sandbox it manages (processes, cgroups, network
/// namespaces, directories), blocking until done, unless [`LocalRuntime::keep_running`]
/// was called. A sandbox also outlives a process that dies without dropping the runtime
/// (`kill -9`). At the next start, [`LocalRuntime::recover`] re-adopts what is intact and
/// removes the rest (see `recover`); [`LocalRuntime::purge_orphans`] removes everything.
#[derive(Debug)]
pub struct LocalRuntime {
    config: RuntimeConfig,
    base: PathBuf,
    tools: Tools,
    controllers: cgroup::Controllers,
    layout: Vec<BaseEntry>,
    /// The seccomp filter every exec installs; `None` where it is not available.
    filter: Option<Arc<seccomp::Filter>>,
    sandboxes: Mutex<HashMap<String, Arc<Sandbox>>>,
    /// Set by [`LocalRuntime::keep_running`]: dropping the runtime leaves the sandboxes.
    keep: std::sync::atomic::AtomicBool,
}

/// One entry of the `metal/base` layout, the same for every sandbox.
#[derive(Debug)]
enum BaseEntry {
    /// `/<name>` is a symlink on the host (merged /usr); the same link in the root.
    Symlink { name: String, target: PathBuf },
    /// A host directory bound read-only at `target` (a sandbox path).
    Bind {
        source: PathBuf,
        target: Vec<String>,
    },
}

#[derive(Debug)]
struct Sandbox {
    id: String,
    dir: PathBuf,
    root: PathBuf,
    netns: String,
    env: Vec<(String, String)>,
    /// Where the proxy listener is bound inside the namespace (kept for re-adoption).
    proxy_port: u16,
    /// The creator's labels ([`SandboxSpec::labels`]), kept for re-adoption.
    labels: BTreeMap<String, String>,
    cgroups: cgroup::SandboxCgroups,
    seq: AtomicU64,
    life: tokio::sync::Mutex<Life>,
    /// Bumped whenever the sandbox stops (or is deleted): ends its watches.
    stopped: tokio::sync::watch::Sender<u64>,
    /// What its watches hold now.
    watches: Arc<watch::Budget>,
}

#[derive(Debug)]
struct Life {
    status: SandboxStatus,
    init: Option<Init>,
}

#[derive(Debug)]
struct Init {
    /// The `unshare` process (host PID namespace) when it is our child; `None` for an
    /// init re-adopted from a previous gateway process (its parent is gone).
    child: Option<tokio::process::Child>,
    /// The `unshare` process, as seen from the host.
    unshare: recover::ProcId,
    /// PID 1 of the sandbox, as seen from the host.
    pid1: recover::ProcId,
}

impl Drop for LocalRuntime {
    fn drop(&mut self) {
        if self.keep.load(Ordering::Relaxed) {
            // [`LocalRuntime::keep_running`]: the sandboxes outlive this process, to be
            // re-adopted by the next one ([`LocalRuntime::recover`]).
            return;
        }
        let sandboxes: Vec<Arc<Sandbox>> = self.map().drain().map(|(_, s)| s).collect();
        if sandboxes.is_empty() {
            return;
        }
        // Teardown is async (it waits for processes to go); run it on a private runtime in
        // a scoped thread, which works whether or not the caller is inside a runtime.
        let this = &*self;
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                rt.block_on(async {
                    for sandbox in sandboxes {
                        let mut life = sandbox.life.lock().await;
                        if let Err(e) = this.teardown(&sandbox, &mut life).await {
                            tracing::warn!(sandbox = %sandbox.id, error = %e, "localbox: teardown at shutdown failed; the next start purges it");
                        }
                    }
                });
            });
        });
    }
}

impl LocalRuntime {
    /// Checks privileges and tools, probes cgroups and prepares `base_dir`.
    pub fn new(config: RuntimeConfig) -> Result<LocalRuntime> {
        check_privileges()?;
        let mut tools = Tools {
            ip: find_tool("ip")?,
            nsenter: find_tool("nsenter")?,
            unshare: find_tool("unshare")?,
            tar: find_tool("tar")?,
            mkfs: find_tool("mkfs.ext4").ok(),
        };
        for tool in ["bash", "mount", "chroot", "mknod", "sleep"] {
            find_tool(tool)?;
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&config.base_dir)
            .map_err(|e| LocalboxError::setup("creating base_dir", e))?;
        let base = config
            .base_dir
            .canonicalize()
            .map_err(|e| LocalboxError::setup("resolving base_dir", e))?;
        let controllers = cgroup::Controllers::probe(&config.cgroup_name, config.cgroups);
        // Only a disk that was really made and mounted counts as a disk limit here.
        tools.mkfs = tools.mkfs.filter(|mkfs| limits::disk_works(mkfs, &base));
        let layout = base_layout(&config)?;
        let filter = seccomp_filter()?;
        Ok(LocalRuntime {
            config,
            base,
            tools,
            controllers,
            layout,
            filter,
            sandboxes: Mutex::new(HashMap::new()),
            keep: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn capabilities(&self) -> Capabilities {
        let any = self.controllers.freezer.is_some()
            || self.controllers.memory.is_some()
            || self.controllers.cpu.is_some();
        Capabilities {
            cgroup_version: any.then_some(if self.controllers.unified { 2 } else { 1 }),
            freezer: self.controllers.freezer.is_some(),
            memory_limit: self.controllers.memory.is_some(),
            cpu_limit: self.controllers.cpu.is_some(),
            pids_limit: self.controllers.pids.is_some(),
            disk_limit: self.tools.mkfs.is_some(),
            seccomp: self.filter.is_some(),
        }
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// The network namespace name of a sandbox (as in `ip netns list`).
    pub fn netns_name(&self, id: &str) -> String {
        format!("{}{id}", self.config.netns_prefix)
    }

    /// The sandbox's directory on the host (`<base_dir>/<id>`; its root is `root/` in it).
    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.base.join(id)
    }

    /// Ids of the sandboxes this runtime manages.
    pub fn list(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.map().keys().cloned().collect();
        ids.sort();
        ids
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Sandbox>>> {
        self.sandboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, id: &str) -> Result<Arc<Sandbox>> {
        self.map()
            .get(id)
            .cloned()
            .ok_or_else(|| LocalboxError::NotFound(id.to_string()))
    }

    /// Creates and starts a sandbox. On error, everything made so far is removed.
    pub async fn create(&self, spec: SandboxSpec) -> Result<Created> {
        validate_id(&spec.id)?;
        let port = proxy_port(&spec.proxy_url)?;
        let env = self.base_env(&spec)?;
        self.check_limits(&spec)?;
        let dir = self.base.join(&spec.id);
        let netns = self.netns_name(&spec.id);
        let sandbox = {
            // Checked and reserved under one lock: two creates of one id cannot both pass.
            let mut map = self.map();
            if map.contains_key(&spec.id)
                || dir.exists()
                || Path::new("/run/netns").join(&netns).exists()
            {
                return Err(LocalboxError::AlreadyExists(spec.id.clone()));
            }
            let cgroups = cgroup::SandboxCgroups::create(&self.controllers, &spec.id)
                .map_err(|e| LocalboxError::setup("creating cgroups", e))?;
            let sandbox = Arc::new(Sandbox {
                id: spec.id.clone(),
                root: dir.join("root"),
                dir,
                netns,
                env,
                proxy_port: port,
                labels: spec.labels.clone(),
                cgroups,
                seq: AtomicU64::new(0),
                life: tokio::sync::Mutex::new(Life {
                    status: SandboxStatus::Stopped,
                    init: None,
                }),
                stopped: tokio::sync::watch::Sender::new(0),
                watches: Arc::default(),
            });
            map.insert(spec.id.clone(), sandbox.clone());
            sandbox
        };
        let built = match self.build(sandbox.clone(), &spec, port).await {
            Ok(created) => self
                .persist_new(&sandbox, &created.enforced)
                .await
                .map(|()| created),
            Err(e) => Err(e),
        };
        match built {
            Ok(created) => Ok(created),
            Err(e) => {
                if let Err(cleanup) = self.delete(&spec.id).await {
                    tracing::warn!(id = %spec.id, error = %cleanup, "localbox: cleanup after a failed create failed");
                }
                Err(e)
            }
        }
    }

    async fn build(&self, sandbox: Arc<Sandbox>, spec: &SandboxSpec, port: u16) -> Result<Created> {
        self.layout(&sandbox, spec)?;

        run(Command::new(&self.tools.ip).args(["netns", "add", &sandbox.netns]))
            .await
            .map_err(|e| LocalboxError::setup("ip netns add", e))?;
        run(Command::new(&self.tools.ip).args(["-n", &sandbox.netns, "link", "set", "lo", "up"]))
            .await
            .map_err(|e| LocalboxError::setup("bringing up loopback", e))?;

        let mut enforced = Enforced {
            namespaces: NAMESPACES.to_vec(),
            memory_bytes: None,
            cpu_millis: None,
            pids: None,
            disk_bytes: None,
            pausable: sandbox.cgroups.freezer.is_some(),
            uid: self.config.uid,
            gid: self.config.gid,
        };
        self.apply_cgroup_limits(&sandbox, spec, &mut enforced)?;
        if let Some(bytes) = spec.limits.disk_bytes {
            self.limit_disk(&sandbox, bytes).await?;
            enforced.disk_bytes = Some(bytes);
        }

        let listener = bind_in_netns(&sandbox.netns, port).await?;

        {
            let mut life = sandbox.life.lock().await;
            life.init = Some(self.start_init(&sandbox).await?);
            life.status = SandboxStatus::Running;
        }
        if let Some(snapshot) = &spec.from_snapshot {
            self.restore(&sandbox, snapshot).await?;
        }
        Ok(Created {
            listener,
            proxy_port: port,
            enforced,
        })
    }

    /// Builds the root directory (mount points, symlinks, writable areas, CA file).
    fn layout(&self, sandbox: &Sandbox, spec: &SandboxSpec) -> Result<()> {
        let fail = |path: &Path, e: std::io::Error| {
            LocalboxError::setup(format!("preparing {}", path.display()), e)
        };
        let mkdir = |path: &Path, mode: u32| -> Result<()> {
            if !path.is_dir() {
                std::fs::DirBuilder::new()
                    .mode(mode)
                    .create(path)
                    .map_err(|e| fail(path, e))?;
            }
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| fail(path, e))
        };
        let root = &sandbox.root;
        mkdir(&sandbox.dir, 0o700)?;
        mkdir(root, 0o755)?;
        for entry in &self.layout {
            match entry {
                BaseEntry::Symlink { name, target } => {
                    let link = root.join(name);
                    std::os::unix::fs::symlink(target, &link).map_err(|e| fail(&link, e))?;
                }
                BaseEntry::Bind { target, .. } => {
                    let mut path = root.clone();
                    for part in target {
                        path.push(part);
                        mkdir(&path, 0o755)?;
                    }
                }
            }
        }
        for name in ["proc", "dev", "home", "sandgate"] {
            mkdir(&root.join(name), 0o755)?;
        }
        for (area, mode) in [("home/user", 0o755), ("tmp", 0o1777)] {
            let path = root.join(area);
            mkdir(&path, mode)?;
            std::os::unix::fs::chown(&path, Some(self.config.uid), Some(self.config.gid))
                .map_err(|e| fail(&path, e))?;
        }
        if let Some(pem) = &spec.ca_pem {
            let ca = root.join(CA_PATH.trim_start_matches('/'));
            std::fs::write(&ca, pem).map_err(|e| fail(&ca, e))?;
            std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o644))
                .map_err(|e| fail(&ca, e))?;
        }
        Ok(())
    }

    fn base_env(&self, spec: &SandboxSpec) -> Result<Vec<(String, String)>> {
        let mut env = vec![
            ("PATH".to_string(), SANDBOX_PATH.to_string()),
            ("HOME".to_string(), HOME_DIR.to_string()),
        ];
        for (key, value) in &spec.env {
            check_var(key, value)?;
            if managed_var(key) {
                return Err(LocalboxError::Invalid(format!(
                    "environment variable {key} is set by the gateway"
                )));
            }
            env.push((key.clone(), value.clone()));
        }
        for key in PROXY_ENV_VARS {
            env.push((key.to_string(), spec.proxy_url.clone()));
        }
        env.push(("NO_PROXY".to_string(), NO_PROXY.to_string()));
        env.push(("no_proxy".to_string(), NO_PROXY.to_string()));
        if spec.ca_pem.is_some() {
            for key in CA_ENV_VARS {
                env.push((key.to_string(), CA_PATH.to_string()));
            }
        }
        Ok(env)
    }

    /// Starts the sandbox's init: enters the netns, unshares PID/mount/UTS/IPC, mounts
    /// the root (in its own mount namespace only), chroots and waits as a reaper.
    async fn start_init(&self, sandbox: &Sandbox) -> Result<Init> {
        const SCRIPT: &str = r#"set -eu
R=$1; H=$2; shift 2
printf '%s' "$H" > /proc/sys/kernel/hostname
mount --rbind "$R" "$R"
while [ "$#" -gt 0 ]; do
  case "$1" in
    ro) mount --rbind "$2" "$R$3"; mount -o remount,bind,ro,nosuid,nodev "$R$3"; shift 3 ;;
    rw) mount --bind "$R$2" "$R$2"; mount -o remount,bind,nosuid,nodev "$R$2"; shift 2 ;;
    *) echo "bad mount spec: $1" >&2; exit 1 ;;
  esac
done
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount -t tmpfs -o nosuid,noexec,mode=0755,size=1m tmpfs "$R/dev"
mknod -m 666 "$R/dev/null" c 1 3
mknod -m 666 "$R/dev/zero" c 1 5
mknod -m 666 "$R/dev/full" c 1 7
mknod -m 666 "$R/dev/random" c 1 8
mknod -m 666 "$R/dev/urandom" c 1 9
mknod -m 666 "$R/dev/tty" c 5 0
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"
ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"
mkdir -m 1777 "$R/dev/shm"
mount -t tmpfs -o nosuid,nodev,mode=1777,size=64m tmpfs "$R/dev/shm"
mount -o remount,bind,ro,nosuid,nodev "$R"
cd "$R"
exec chroot "$R" /bin/bash -c 'echo ready; exec >/dev/null 2>&1 </dev/null; while :; do sleep infinity; done'
"#;
        let freezer = sandbox
            .cgroups
            .freezer_child("init")
            .map_err(|e| LocalboxError::setup("creating the init cgroup", e))?;
        let join = sandbox.cgroups.join_files(freezer.as_deref());
        let mut cmd = Command::new(&self.tools.nsenter);
        cmd.arg(format!("--net=/run/netns/{}", sandbox.netns))
            .arg("--")
            .arg(&self.tools.unshare)
            .args([
                "--pid",
                "--fork",
                "--kill-child",
                "--mount",
                "--uts",
                "--ipc",
            ])
            .args([
                "--propagation",
                "private",
                "--",
                "bash",
                "-c",
                SCRIPT,
                "sandgate-init",
            ])
            .arg(&sandbox.root)
            .arg(format!("sandbox-{}", sandbox.id));
        for entry in &self.layout {
            if let BaseEntry::Bind { source, target } = entry {
                cmd.arg("ro")
                    .arg(source)
                    .arg(format!("/{}", target.join("/")));
            }
        }
        for area in fs::WRITABLE {
            cmd.arg("rw").arg(format!("/{area}"));
        }
        cmd.env_clear()
            .env("PATH", SANDBOX_PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // No kill-on-drop: a sandbox may outlive this process ([`LocalRuntime::keep_running`]);
        // every path that ends a sandbox kills its init explicitly (`kill_all`).
        join_cgroups_before_exec(&mut cmd, join);
        let mut child = cmd
            .spawn()
            .map_err(|e| LocalboxError::setup("starting the sandbox init", e))?;
        let stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let ready = tokio::time::timeout(self.config.start_timeout, async {
            let mut line = String::new();
            if let Some(out) = stdout {
                let mut out = tokio::io::BufReader::new(out);
                let _ = out.read_line(&mut line).await;
            }
            line.trim() == "ready"
        })
        .await
        .unwrap_or(false);
        if !ready {
            let _ = child.start_kill();
            let mut detail = String::new();
            if let Some(err) = stderr.as_mut() {
                let _ =
                    tokio::time::timeout(Duration::from_secs(2), err.read_to_string(&mut detail))
                        .await;
            }
            let _ = child.wait().await;
            return Err(LocalboxError::setup(
                "starting the sandbox init",
                detail.trim(),
            ));
        }
        let vanished =
            || LocalboxError::setup("starting the sandbox init", "init process vanished");
        let unshare = child
            .id()
            .and_then(recover::ProcId::of)
            .ok_or_else(vanished)?;
        let pid1 = child_of(unshare.pid)
            .and_then(recover::ProcId::of)
            .ok_or_else(vanished)?;
        Ok(Init {
            child: Some(child),
            unshare,
            pid1,
        })
    }

    /// Restores a snapshot by extracting it inside the sandbox, as the sandbox user.
    async fn restore(&self, sandbox: &Sandbox, snapshot: &Path) -> Result<()> {
        let staged = sandbox.root.join("sandgate/restore.tar");
        std::fs::copy(snapshot, &staged)
            .map_err(|e| LocalboxError::setup("staging the snapshot", e))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| LocalboxError::setup("staging the snapshot", e))?;
        let request = ExecRequest {
            argv: [
                "tar",
                "-C",
                "/",
                "-xf",
                "/sandgate/restore.tar",
                "--no-same-owner",
            ]
            .map(String::from)
            .to_vec(),
            timeout: Some(Duration::from_secs(600)),
            ..ExecRequest::default()
        };
        let output = self.exec(&sandbox.id, request).await?.collect().await;
        let _ = std::fs::remove_file(&staged);
        if output.code() != Some(0) {
            return Err(LocalboxError::setup(
                "restoring the snapshot",
                String::from_utf8_lossy(&output.stderr).trim(),
            ));
        }
        Ok(())
    }

    /// Runs a command in a running sandbox and streams its output (see the module docs).
    pub async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecHandle> {
        let sandbox = self.get(id)?;
        let (cwd, env) = exec_setting(&sandbox, &request)?;
        let life = sandbox.life.lock().await;
        let init = match (&life.status, &life.init) {
            (SandboxStatus::Running, Some(init)) => init.pid1.pid,
            (status, _) => {
                return Err(LocalboxError::State {
                    id: id.to_string(),
                    status: *status,
                    op: "exec",
                    needed: "running",
                })
            }
        };
        let seq = sandbox.seq.fetch_add(1, Ordering::Relaxed);
        let freezer = sandbox
            .cgroups
            .freezer_child(&format!("x{seq}"))
            .map_err(|e| LocalboxError::setup("creating the exec cgroup", e))?;
        let join = sandbox.cgroups.join_files(freezer.as_deref());
        let remove_group = || {
            if let Some(dir) = &freezer {
                let _ = std::fs::remove_dir(dir);
            }
        };
        let (uid, gid) = request.user.unwrap_or((self.config.uid, self.config.gid));
        let (entry, pidns) = match enter::Entry::open(init, &cwd, uid, gid, self.filter.clone()) {
            Ok(opened) => opened,
            Err(e) => {
                remove_group();
                return Err(LocalboxError::setup("entering the sandbox", e));
            }
        };
        let mut cmd = Command::new(&request.argv[0]);
        cmd.args(&request.argv[1..])
            .env_clear()
            .envs(env)
            .kill_on_drop(true);
        let io = pty::Io::open(request.tty, request.stdin, uid, gid);
        let session = request.tty.is_some();
        let master = match io.and_then(|io| io.configure(&mut cmd)) {
            Ok(master) => master,
            Err(e) => {
                remove_group();
                return Err(LocalboxError::setup("opening the command's terminal", e));
            }
        };
        join_cgroups_before_exec(&mut cmd, join);
        entry.before_exec(&mut cmd);
        let spawned = enter::spawn_in_pid_ns(pidns, cmd).await;
        drop(life);
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                remove_group();
                return not_started(&request.argv[0], e);
            }
        };
        let pgid = child.id().unwrap_or(0);
        master
            .map(pty::Master::new)
            .transpose()
            .and_then(|master| {
                let killer = exec::Killer {
                    freezer,
                    pgid,
                    session,
                };
                exec::drive(child, killer, request.timeout, master)
            })
            .map_err(|e| LocalboxError::setup("starting the exec", e))
    }

    async fn with_files<T, F>(&self, id: &str, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&fs::Confined<'_>) -> Result<T> + Send + 'static,
    {
        let sandbox = self.get(id)?;
        let (uid, gid) = (self.config.uid, self.config.gid);
        tokio::task::spawn_blocking(move || {
            op(&fs::Confined {
                root: &sandbox.root,
                uid,
                gid,
            })
        })
        .await
        .map_err(|e| LocalboxError::setup("file operation", e))?
    }

    /// Reads a whole file.
    pub async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>> {
        let path = path.to_string();
        self.with_files(id, move |f| f.read(&path)).await
    }

    /// Creates or replaces a file (any bytes) under `/home/user` or `/tmp`, owned by the
    /// sandbox user. The parent directory must exist.
    pub async fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<()> {
        let path = path.to_string();
        self.with_files(id, move |f| f.write(&path, &data)).await
    }

    /// Lists a directory, sorted by name.
    pub async fn list_dir(&self, id: &str, path: &str) -> Result<Vec<FileEntry>> {
        let path = path.to_string();
        self.with_files(id, move |f| f.list(&path)).await
    }

    /// Deletes a file, symlink or empty directory; a directory tree with `recursive`.
    pub async fn remove(&self, id: &str, path: &str, recursive: bool) -> Result<()> {
        let path = path.to_string();
        self.with_files(id, move |f| f.remove(&path, recursive))
            .await
    }

    /// Moves a file, symlink or directory to another path.
    pub async fn rename(&self, id: &str, from: &str, to: &str) -> Result<()> {
        let (from, to) = (from.to_string(), to.to_string());
        self.with_files(id, move |f| f.rename(&from, &to)).await
    }

    /// Creates a directory (with its missing parents when `parents`).
    pub async fn mkdir(&self, id: &str, path: &str, parents: bool) -> Result<()> {
        let path = path.to_string();
        self.with_files(id, move |f| f.mkdir(&path, parents)).await
    }

    /// A connection to `port` on the sandbox's own loopback (what it serves there, on
    /// `127.0.0.1`, `::1` or every address), made from inside its network namespace: how
    /// the gateway reaches a sandbox's ports. The sandbox must be running.
    pub async fn connect_port(
        &self,
        id: &str,
        port: u16,
    ) -> std::result::Result<tokio::net::TcpStream, ConnectError> {
        let sandbox = self.get(id)?;
        let status = sandbox.life.lock().await.status;
        if status != SandboxStatus::Running {
            return Err(ConnectError::Setup(LocalboxError::State {
                id: id.to_string(),
                status,
                op: "connecting to a port",
                needed: "running",
            }));
        }
        netns::connect_in_netns(&sandbox.netns, port).await
    }

    /// Watches a directory of a running sandbox (see `watch` for the contract): the watch
    /// is in place when this returns, and ends when the sandbox stops or is deleted.
    pub async fn watch(&self, id: &str, path: &str, recursive: bool) -> Result<Watcher> {
        let sandbox = self.get(id)?;
        let stopped = {
            // Under the life lock: a stop cannot slip between the check and the subscription.
            let life = sandbox.life.lock().await;
            if life.status != SandboxStatus::Running {
                return Err(LocalboxError::State {
                    id: id.to_string(),
                    status: life.status,
                    op: "watch",
                    needed: "running",
                });
            }
            sandbox.stopped.subscribe()
        };
        let (path, limits) = (path.to_string(), self.config.watch);
        let (uid, gid) = (self.config.uid, self.config.gid);
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            // The watch's reader task is spawned on the caller's runtime.
            let _entered = runtime.enter();
            let request = watch::Request {
                confined: fs::Confined {
                    root: &sandbox.root,
                    uid,
                    gid,
                },
                path: &path,
                recursive,
                limits,
                budget: sandbox.watches.clone(),
            };
            watch::start(request, stopped)
        })
        .await
        .map_err(|e| LocalboxError::setup("starting a watch", e))?
    }

    pub async fn status(&self, id: &str) -> Result<SandboxStatus> {
        Ok(self.get(id)?.life.lock().await.status)
    }

    /// Host process ids of everything running for the sandbox (init included).
    pub async fn pids(&self, id: &str) -> Result<Vec<u32>> {
        let sandbox = self.get(id)?;
        let life = sandbox.life.lock().await;
        let mut pids = sandbox.cgroups.pids();
        if let Some(init) = &life.init {
            pids.extend(
                [init.pid1, init.unshare]
                    .into_iter()
                    .filter_map(|p| p.alive().then_some(p.pid)),
            );
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    /// Kills every process; files, network namespace and listener stay.
    pub async fn stop(&self, id: &str) -> Result<()> {
        let sandbox = self.get(id)?;
        let mut life = sandbox.life.lock().await;
        self.kill_all(&sandbox, &mut life).await?;
        recover::persist_life(&sandbox, &life);
        Ok(())
    }

    /// Starts a stopped sandbox again (a fresh init; files as they were).
    pub async fn start(&self, id: &str) -> Result<()> {
        let sandbox = self.get(id)?;
        let mut life = sandbox.life.lock().await;
        if life.status != SandboxStatus::Stopped {
            return Err(LocalboxError::State {
                id: id.to_string(),
                status: life.status,
                op: "start",
                needed: "stopped",
            });
        }
        life.init = Some(self.start_init(&sandbox).await?);
        life.status = SandboxStatus::Running;
        recover::persist_life(&sandbox, &life);
        Ok(())
    }

    /// Freezes every process of the sandbox (cgroup freezer).
    pub async fn pause(&self, id: &str) -> Result<()> {
        self.set_paused(id, true).await
    }

    /// Thaws a paused sandbox.
    pub async fn resume(&self, id: &str) -> Result<()> {
        self.set_paused(id, false).await
    }

    async fn set_paused(&self, id: &str, pause: bool) -> Result<()> {
        let sandbox = self.get(id)?;
        let Some(freezer) = &sandbox.cgroups.freezer else {
            return Err(LocalboxError::Unsupported(
                "pause needs the cgroup freezer (v1 freezer or v2 cgroup.freeze), which is not available".into(),
            ));
        };
        let mut life = sandbox.life.lock().await;
        let (from, to, op) = if pause {
            (SandboxStatus::Running, SandboxStatus::Paused, "pause")
        } else {
            (SandboxStatus::Paused, SandboxStatus::Running, "resume")
        };
        if life.status != from {
            return Err(LocalboxError::State {
                id: id.to_string(),
                status: life.status,
                op,
                needed: if pause { "running" } else { "paused" },
            });
        }
        cgroup::set_frozen(freezer, pause)
            .await
            .map_err(|e| LocalboxError::setup(op, e))?;
        life.status = to;
        recover::persist_life(&sandbox, &life);
        Ok(())
    }

    /// Writes a tar of `/home/user` and `/tmp` to `dest` (a host path outside the
    /// sandbox); a running sandbox is frozen meanwhile for a consistent copy. Returns the
    /// archive size.
    pub async fn snapshot(&self, id: &str, dest: &Path) -> Result<u64> {
        let sandbox = self.get(id)?;
        let life = sandbox.life.lock().await;
        let freeze = match (&sandbox.cgroups.freezer, life.status) {
            (Some(dir), SandboxStatus::Running) => Some(dir.clone()),
            _ => None,
        };
        if let Some(dir) = &freeze {
            cgroup::set_frozen(dir, true)
                .await
                .map_err(|e| LocalboxError::setup("snapshot", e))?;
        }
        let result = run(Command::new(&self.tools.tar)
            .args(["--numeric-owner", "--one-file-system", "-C"])
            .arg(&sandbox.root)
            .arg("-cf")
            .arg(dest)
            .args(["home/user", "tmp"]))
        .await;
        if let Some(dir) = &freeze {
            cgroup::set_frozen(dir, false)
                .await
                .map_err(|e| LocalboxError::setup("snapshot", e))?;
        }
        drop(life);
        result.map_err(|e| LocalboxError::setup("snapshot", e))?;
        std::fs::metadata(dest)
            .map(|m| m.len())
            .map_err(|e| LocalboxError::setup("snapshot", e))
    }

    /// Kills everything and removes the cgroups, the network namespace and the directory.
    pub async fn delete(&self, id: &str) -> Result<()> {
        let sandbox = self.get(id)?;
        let mut life = sandbox.life.lock().await;
        self.teardown(&sandbox, &mut life).await?;
        drop(life);
        self.map().remove(id);
        Ok(())
    }

    /// Removes the sandboxes a previous gateway process left in `base_dir` (after a
    /// crash): kills their processes, removes their cgroups, network namespaces and
    /// directories. Sandboxes this runtime manages are untouched. Call it at startup;
    /// returns the ids removed.
    pub async fn purge_orphans(&self) -> Result<Vec<String>> {
        let mut purged = Vec::new();
        for id in self.leftover_ids()? {
            let cgroups = cgroup::SandboxCgroups::existing(&self.controllers, &id);
            self.remove_remains(&id, cgroups, None).await?;
            purged.push(id);
        }
        Ok(purged)
    }

    /// Ids of the sandbox directories in `base_dir` this runtime does not manage (left by a
    /// previous process), sorted.
    fn leftover_ids(&self) -> Result<Vec<String>> {
        let mut ids: Vec<String> = std::fs::read_dir(&self.base)
            .map_err(|e| LocalboxError::setup("reading base_dir", e))?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|id| validate_id(id).is_ok())
            .collect();
        ids.sort();
        let managed = self.map();
        ids.retain(|id| !managed.contains_key(id));
        Ok(ids)
    }

    /// Removes what a sandbox this runtime does not manage left behind: its processes (the
    /// init, when known, and everything in its cgroups), cgroups, namespace and directory.
    async fn remove_remains(
        &self,
        id: &str,
        cgroups: cgroup::SandboxCgroups,
        init: Option<Init>,
    ) -> Result<()> {
        let dir = self.base.join(id);
        let orphan = Sandbox {
            root: dir.join("root"),
            dir,
            netns: self.netns_name(id),
            env: Vec::new(),
            proxy_port: 0,
            labels: BTreeMap::new(),
            cgroups,
            seq: AtomicU64::new(0),
            life: tokio::sync::Mutex::new(Life {
                status: SandboxStatus::Stopped,
                init,
            }),
            stopped: tokio::sync::watch::Sender::new(0),
            watches: Arc::default(),
            id: id.to_string(),
        };
        let mut life = orphan.life.lock().await;
        self.teardown(&orphan, &mut life).await
    }

    async fn teardown(&self, sandbox: &Sandbox, life: &mut Life) -> Result<()> {
        self.kill_all(sandbox, life).await?;
        let mut removed = sandbox.cgroups.remove();
        for _ in 0..100 {
            if removed.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            removed = sandbox.cgroups.remove();
        }
        removed.map_err(|e| LocalboxError::setup("removing the cgroups", e))?;
        if Path::new("/run/netns").join(&sandbox.netns).exists() {
            run(Command::new(&self.tools.ip).args(["netns", "delete", &sandbox.netns]))
                .await
                .map_err(|e| LocalboxError::setup("ip netns delete", e))?;
        }
        // Only the disk limit's mounts are ever made below the directory on the host;
        // refuse to recurse into it if anything else is (it would be a host directory).
        limits::unmount_below(&sandbox.dir);
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if let Some(line) = mountinfo.lines().find(|l| {
            l.split_whitespace()
                .nth(4)
                .is_some_and(|m| Path::new(m).starts_with(&sandbox.dir))
        }) {
            return Err(LocalboxError::setup(
                "removing the directory",
                format!("a mount remains below it: {line}"),
            ));
        }
        if sandbox.dir.exists() {
            std::fs::remove_dir_all(&sandbox.dir)
                .map_err(|e| LocalboxError::setup("removing the directory", e))?;
        }
        Ok(())
    }

    async fn kill_all(&self, sandbox: &Sandbox, life: &mut Life) -> Result<()> {
        if let Some(freezer) = &sandbox.cgroups.freezer {
            cgroup::kill_group(freezer)
                .await
                .map_err(|e| LocalboxError::setup("killing the sandbox's processes", e))?;
        }
        if let Some(init) = life.init.take() {
            kill_init(init).await;
        }
        for dir in [&sandbox.cgroups.memory, &sandbox.cgroups.cpu]
            .into_iter()
            .flatten()
        {
            cgroup::wait_empty(dir, Duration::from_secs(10))
                .await
                .map_err(|e| LocalboxError::setup("killing the sandbox's processes", e))?;
        }
        life.status = SandboxStatus::Stopped;
        sandbox.stopped.send_modify(|n| *n += 1);
        Ok(())
    }
}

/// Kills a sandbox's init (its PID namespace goes with it) and waits, bounded, until it is
/// gone. A process is signalled only while it is still the one recorded (same start time),
/// so a re-adopted init whose pid was reused is never confused with a stranger.
async fn kill_init(mut init: Init) {
    for proc in [init.pid1, init.unshare] {
        if proc.alive() {
            cgroup::signal(proc.pid, libc::SIGKILL);
        }
    }
    // Polled rather than awaited: at shutdown this runs on a private runtime, where the
    // child's wait registration (made on the gateway's runtime) never fires.
    for _ in 0..1000 {
        let gone = match init.child.as_mut() {
            Some(child) => {
                let _ = child.start_kill();
                !matches!(child.try_wait(), Ok(None))
            }
            None => !init.pid1.alive() && !init.unshare.alive(),
        };
        if gone {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `metal/base` layout: host `/usr`, `/etc`, `/bin`, `/sbin`, `/lib*` (symlinks kept
/// as symlinks) and the configured extra read-only directories.
fn base_layout(config: &RuntimeConfig) -> Result<Vec<BaseEntry>> {
    let mut out = Vec::new();
    for name in BASE_ENTRIES {
        let host = Path::new("/").join(name);
        let Ok(meta) = std::fs::symlink_metadata(&host) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&host)
                .map_err(|e| LocalboxError::setup(format!("reading {}", host.display()), e))?;
            out.push(BaseEntry::Symlink {
                name: name.to_string(),
                target,
            });
        } else if meta.is_dir() {
            out.push(BaseEntry::Bind {
                source: host,
                target: vec![name.to_string()],
            });
        }
    }
    for extra in &config.extra_ro_binds {
        let text = extra.to_string_lossy();
        let target = fs::components(&text)
            .ok()
            .filter(|parts| extra.is_absolute() && !parts.is_empty() && extra.is_dir());
        let Some(target) = target else {
            return Err(LocalboxError::Invalid(format!(
                "extra_ro_binds: {} must be an existing absolute directory, without `..`",
                extra.display()
            )));
        };
        out.push(BaseEntry::Bind {
            source: extra.clone(),
            target,
        });
    }
    Ok(out)
}

/// An exec's working directory and environment, checked.
fn exec_setting(
    sandbox: &Sandbox,
    request: &ExecRequest,
) -> Result<(String, BTreeMap<String, String>)> {
    if request.argv.is_empty() || request.argv[0].is_empty() {
        return Err(LocalboxError::Invalid("argv must not be empty".into()));
    }
    if request.argv.iter().any(|a| a.contains('\0')) {
        return Err(LocalboxError::Invalid("argv contains a NUL byte".into()));
    }
    let cwd = match &request.cwd {
        Some(cwd) => format!("/{}", fs::components(cwd)?.join("/")),
        None => HOME_DIR.to_string(),
    };
    let mut env: BTreeMap<String, String> = sandbox.env.iter().cloned().collect();
    for (key, value) in &request.env {
        check_var(key, value)?;
        if managed_var(key) {
            return Err(LocalboxError::Invalid(format!(
                "environment variable {key} is set by the gateway"
            )));
        }
        env.insert(key.clone(), value.clone());
    }
    Ok((cwd, env))
}

/// The filter where this build and kernel can install one; a list that does not compile
/// is a bug, not a missing feature, and stops the runtime.
fn seccomp_filter() -> Result<Option<Arc<seccomp::Filter>>> {
    if !seccomp::supported() {
        return Ok(None);
    }
    seccomp::Filter::new()
        .map(|f| Some(Arc::new(f)))
        .map_err(|e| LocalboxError::setup("compiling the seccomp filter", e))
}

/// A command that could not be started answers as a shell would (127 when it does not
/// exist, 126 when it cannot be executed); any other failure is the runtime's.
fn not_started(program: &str, e: std::io::Error) -> Result<ExecHandle> {
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => 127,
        std::io::ErrorKind::PermissionDenied => 126,
        _ => return Err(LocalboxError::setup("starting the exec", e)),
    };
    Ok(exec::failed(code, format!("sandgate: {program}: {e}\n")))
}

/// Sets up a pre-exec hook that moves the child into the given `cgroup.procs` files.
fn join_cgroups_before_exec(cmd: &mut Command, files: Vec<std::ffi::CString>) {
    // SAFETY: the hook only calls async-signal-safe functions (open, write, close) on
    // data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            for file in &files {
                let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if written != 1 {
                    return Err(err);
                }
            }
            Ok(())
        });
    }
}

/// Runs a host command to completion; the error carries its stderr.
async fn run(cmd: &mut Command) -> std::io::Result<()> {
    let output = cmd
        .env_clear()
        .env("PATH", SANDBOX_PATH)
        .stdin(Stdio::null())
        .output()
        .await?;
    if output.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// The (first) child of a process, from `/proc/<pid>/task/<pid>/children`, else a scan.
fn child_of(pid: u32) -> Option<u32> {
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
        if let Some(child) = text.split_whitespace().find_map(|c| c.parse().ok()) {
            return Some(child);
        }
    }
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let candidate: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{candidate}/stat")).ok()?;
            let after = stat.rsplit_once(')')?.1;
            let ppid: u32 = after.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == pid).then_some(candidate)
        })
}

fn validate_id(id: &str) -> Result<()> {
    let ok = (1..=40).contains(&id.len())
        && id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(LocalboxError::InvalidId(id.to_string()))
    }
}

/// The port of `http://[userinfo@]127.0.0.1:<port>[/]` (`localhost` accepted too).
fn proxy_port(url: &str) -> Result<u16> {
    let bad = |why: &str| LocalboxError::Invalid(format!("proxy_url {url:?}: {why}"));
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("must start with http://"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    if rest.len() > authority.len() + 1
        || (rest.len() == authority.len() + 1 && !rest.ends_with('/'))
    {
        return Err(bad("must not carry a path"));
    }
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = hostport
        .rsplit_once(':')
        .ok_or_else(|| bad("must name a port"))?;
    if host != "127.0.0.1" && host != "localhost" {
        return Err(bad(
            "the host must be 127.0.0.1 (the listener is inside the sandbox)",
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(bad("invalid port")),
    }
}

fn managed_var(key: &str) -> bool {
    PROXY_ENV_VARS.contains(&key)
        || CA_ENV_VARS.contains(&key)
        || key == "NO_PROXY"
        || key == "no_proxy"
}

fn check_var(key: &str, value: &str) -> Result<()> {
    let valid = !key.is_empty()
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(LocalboxError::Invalid(format!(
            "invalid environment variable name {key:?}"
        )));
    }
    if value.contains('\0') {
        return Err(LocalboxError::Invalid(format!(
            "environment variable {key} contains a NUL byte"
        )));
    }
    Ok(())
}

fn find_tool(name: &str) -> Result<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(SANDBOX_PATH.split(':'))
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| LocalboxError::MissingTool(name.to_string()))
}

/// Capabilities the runtime uses, by bit number.
const NEEDED_CAPS: [(u32, &str); 9] = [
    (21, "CAP_SYS_ADMIN"),
    (12, "CAP_NET_ADMIN"),
    (18, "CAP_SYS_CHROOT"),
    (27, "CAP_MKNOD"),
    (6, "CAP_SETGID"),
    (7, "CAP_SETUID"),
    (0, "CAP_CHOWN"),
    (5, "CAP_KILL"),
    (19, "CAP_SYS_PTRACE"),
];

fn check_privileges() -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    let missing = missing_caps(effective);
    if missing.is_empty() {
        return Ok(());
    }
    Err(LocalboxError::Privileges {
        missing: missing.join(", "),
        userns: userns_status(),
    })
}

fn missing_caps(effective: u64) -> Vec<&'static str> {
    NEEDED_CAPS
        .iter()
        .filter(|(bit, _)| effective & (1u64 << bit) == 0)
        .map(|(_, name)| *name)
        .collect()
}

fn userns_status() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        return "unavailable (user.max_user_namespaces = 0)".into();
    }
    if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        return "unavailable (kernel.unprivileged_userns_clone = 0)".into();
    }
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        return "restricted by AppArmor (kernel.apparmor_restrict_unprivileged_userns = 1)".into();
    }
    "available".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls() {
        assert_eq!(proxy_port("http://127.0.0.1:3128").unwrap(), 3128);
        assert_eq!(proxy_port("http://sb1:tok@127.0.0.1:8080/").unwrap(), 8080);
        assert_eq!(proxy_port("http://a:b%40c@localhost:9").unwrap(), 9);
        assert!(proxy_port("https://127.0.0.1:1").is_err());
        assert!(proxy_port("http://10.0.0.1:3128").is_err());
        assert!(proxy_port("http://127.0.0.1").is_err());
        assert!(proxy_port("http://127.0.0.1:0").is_err());
        assert!(proxy_port("http://127.0.0.1:1/x").is_err());
    }

    #[test]
    fn missing_capabilities_are_named() {
        assert!(missing_caps(u64::MAX).is_empty());
        let missing = missing_caps(!(1 << 21) & !(1 << 12));
        assert_eq!(missing, ["CAP_SYS_ADMIN", "CAP_NET_ADMIN"]);
        let error = LocalboxError::Privileges {
            missing: missing.join(", "),
            userns: "unavailable (user.max_user_namespaces = 0)".into(),
        };
        let text = error.to_string();
        assert!(
            text.contains("missing CAP_SYS_ADMIN, CAP_NET_ADMIN"),
            "{text}"
        );
        assert!(text.contains("run sandgate as root"), "{text}");
        assert!(text.contains("user namespaces: unavailable"), "{text}");
    }

    #[test]
    fn ids_and_vars() {
        assert!(validate_id("sb-1_a").is_ok());
        assert!(validate_id("").is_err());
        assert!(validate_id("-x").is_err());
        assert!(validate_id("a/b").is_err());
        assert!(validate_id(&"a".repeat(41)).is_err());
        assert!(check_var("TOKEN_1", "x").is_ok());
        assert!(check_var("1X", "x").is_err());
        assert!(check_var("A=B", "x").is_err());
        assert!(check_var("A", "x\0").is_err());
        assert!(managed_var("https_proxy") && managed_var("PIP_CERT") && !managed_var("PATH"));
    }
}
