//! Re-adopting the sandboxes a previous gateway process left running.
//!
//! Contract:
//! - Each sandbox keeps two small files in its directory, beside its root (so nothing inside
//!   the sandbox can reach them; the directory is mode 0700), each replaced atomically (write,
//!   then rename):
//!   * `state.json`, written once the create succeeded: the network namespace's name, the
//!     proxy port, the environment (proxy and CA variables, credential placeholders; never a
//!     secret), the creator's labels, the cgroup directories and what is enforced;
//!   * `life.json`, rewritten on every change of life (create, start, stop, pause, resume):
//!     the status and the init's `unshare` process and PID 1, each as a pid *and its start
//!     time* (`/proc/<pid>/stat` field 22), so a recycled pid is never taken for the init.
//! - [`LocalRuntime::recover`] looks at every directory of `base_dir` the runtime does not
//!   manage and re-adopts the sandbox when all of it is still there: both files, the root,
//!   the network namespace, the cgroups and, unless it was stopped, its init (alive, with the
//!   recorded start time, and in that very network namespace). The proxy listener is bound
//!   again inside the namespace at the recorded port. The sandbox goes on with the same
//!   processes, files, environment and proxy URL; the creator gets the listener back.
//! - Otherwise the remains are removed (processes, cgroups, namespace, directory, as
//!   [`LocalRuntime::purge_orphans`] does) and the sandbox is reported [`Unrecoverable`]
//!   with a stable code: `state_missing` (no state file: its create never finished),
//!   `state_unreadable`, `state_mismatch` (its namespace name does not follow the current
//!   `netns_prefix`), `root_gone`, `netns_gone`, `cgroup_gone`, `init_gone`, `init_mismatch`
//!   (the recorded init is not in the sandbox's namespace), `proxy_port_taken` (something in
//!   the sandbox bound the proxy port while no gateway held it).
//! - What does not survive: exec streams (their output went to the previous process; the
//!   processes an exec left running carry on). The kernel's limit counters do; the creator
//!   rebuilds its limit events from them (one per limit met before the restart).

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    bind_in_netns, cgroup, Enforced, Init, Life, LocalRuntime, LocalboxError, Result, Sandbox,
    SandboxStatus, NAMESPACES,
};

const STATE_FILE: &str = "state.json";
const LIFE_FILE: &str = "life.json";
const VERSION: u32 = 1;

/// A process as the host sees it: its pid and start time, which together name it for the
/// life of the machine (a pid alone may be reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ProcId {
    pub pid: u32,
    /// Clock ticks after boot (`/proc/<pid>/stat` field 22).
    pub start: u64,
}

impl ProcId {
    pub fn of(pid: u32) -> Option<ProcId> {
        let (start, _) = stat(pid)?;
        Some(ProcId { pid, start })
    }

    /// Still running (not a zombie) and still the same process.
    pub fn alive(self) -> bool {
        stat(self.pid).is_some_and(|(start, state)| start == self.start && state != 'Z')
    }
}

/// Start time and state letter of a process.
fn stat(pid: u32) -> Option<(u64, char)> {
    if pid == 0 {
        return None;
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold anything, spaces and parentheses included: fields are
    // counted after its last `)`.
    let mut fields = text.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((start, state))
}

/// A sandbox taken over from a previous process.
#[derive(Debug)]
pub struct Recovered {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    /// Bound again inside its network namespace at `127.0.0.1:<proxy_port>`.
    pub listener: tokio::net::TcpListener,
    pub proxy_port: u16,
    pub enforced: Enforced,
    pub status: SandboxStatus,
}

/// A sandbox that could not be re-adopted (its remains are removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unrecoverable {
    pub id: String,
    /// Its labels, when its state file could be read.
    pub labels: BTreeMap<String, String>,
    /// Stable: see the module docs.
    pub code: &'static str,
    pub message: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct StateFile {
    version: u32,
    netns: String,
    proxy_port: u16,
    env: Vec<(String, String)>,
    labels: BTreeMap<String, String>,
    cgroups: cgroup::SandboxCgroups,
    enforced: EnforcedFile,
}

#[derive(Debug, Serialize, Deserialize)]
struct EnforcedFile {
    memory_bytes: Option<u64>,
    cpu_millis: Option<u32>,
    pids: Option<u64>,
    disk_bytes: Option<u64>,
    pausable: bool,
    uid: u32,
    gid: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct LifeFile {
    status: SandboxStatus,
    init: Option<InitFile>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct InitFile {
    unshare: ProcId,
    pid1: ProcId,
}

type Why = (&'static str, String);

impl From<&Enforced> for EnforcedFile {
    fn from(e: &Enforced) -> EnforcedFile {
        EnforcedFile {
            memory_bytes: e.memory_bytes,
            cpu_millis: e.cpu_millis,
            pids: e.pids,
            disk_bytes: e.disk_bytes,
            pausable: e.pausable,
            uid: e.uid,
            gid: e.gid,
        }
    }
}

impl From<&EnforcedFile> for Enforced {
    fn from(e: &EnforcedFile) -> Enforced {
        Enforced {
            namespaces: NAMESPACES.to_vec(),
            memory_bytes: e.memory_bytes,
            cpu_millis: e.cpu_millis,
            pids: e.pids,
            disk_bytes: e.disk_bytes,
            pausable: e.pausable,
            uid: e.uid,
            gid: e.gid,
        }
    }
}

/// Replaces `path` with `bytes` (mode 0600) so a reader never sees half a file.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn life_file(life: &Life) -> LifeFile {
    LifeFile {
        status: life.status,
        init: life.init.as_ref().map(|i| InitFile {
            unshare: i.unshare,
            pid1: i.pid1,
        }),
    }
}

/// Records the sandbox's life for the next process. A failure only costs re-adoption after
/// a restart (the sandbox would be reported `state_unreadable`), so it is logged, not raised.
pub(super) fn persist_life(sandbox: &Sandbox, life: &Life) {
    let written = serde_json::to_vec(&life_file(life))
        .map_err(std::io::Error::other)
        .and_then(|bytes| write_atomic(&sandbox.dir.join(LIFE_FILE), &bytes));
    if let Err(e) = written {
        tracing::warn!(sandbox = %sandbox.id, error = %e, "localbox: cannot record the sandbox's state; it will not survive a gateway restart");
    }
}

impl LocalRuntime {
    /// Writes both state files of a sandbox just created.
    pub(super) async fn persist_new(&self, sandbox: &Sandbox, enforced: &Enforced) -> Result<()> {
        let state = StateFile {
            version: VERSION,
            netns: sandbox.netns.clone(),
            proxy_port: sandbox.proxy_port,
            env: sandbox.env.clone(),
            labels: sandbox.labels.clone(),
            cgroups: sandbox.cgroups.clone(),
            enforced: enforced.into(),
        };
        let life = sandbox.life.lock().await;
        let files = [
            (STATE_FILE, serde_json::to_vec(&state)),
            (LIFE_FILE, serde_json::to_vec(&life_file(&life))),
        ];
        for (name, bytes) in files {
            bytes
                .map_err(std::io::Error::other)
                .and_then(|b| write_atomic(&sandbox.dir.join(name), &b))
                .map_err(|e| LocalboxError::setup("recording the sandbox's state", e))?;
        }
        Ok(())
    }

    /// Makes this runtime leave its sandboxes running when it is dropped (a graceful gateway
    /// stop with `[local] on_shutdown = "keep"`); the next process re-adopts them.
    pub fn keep_running(&self) {
        self.keep.store(true, Ordering::Relaxed);
    }

    /// Re-adopts the sandboxes a previous process left in `base_dir` (see the module docs);
    /// the others' remains are removed. Call it once at startup, before any create.
    pub async fn recover(&self) -> Result<(Vec<Recovered>, Vec<Unrecoverable>)> {
        let (mut adopted, mut lost) = (Vec::new(), Vec::new());
        for id in self.leftover_ids()? {
            let files = read_files(&self.base.join(&id));
            let outcome = match &files {
                Ok((state, life)) => self.readopt(&id, state, life).await,
                Err(why) => Err(why.clone()),
            };
            match outcome {
                Ok(recovered) => adopted.push(recovered),
                Err((code, message)) => {
                    let labels = files.as_ref().ok().map(|(s, _)| s.labels.clone());
                    self.clear(&id, files.ok()).await;
                    lost.push(Unrecoverable {
                        id,
                        labels: labels.unwrap_or_default(),
                        code,
                        message,
                    });
                }
            }
        }
        Ok((adopted, lost))
    }

    /// Removes an unrecoverable sandbox's remains, from what its files say where they can
    /// be read (its init is killed if it still runs: the proxy port case).
    async fn clear(&self, id: &str, files: Option<(StateFile, LifeFile)>) {
        let existing = || cgroup::SandboxCgroups::existing(&self.controllers, id);
        let (cgroups, init) = match files {
            // Only groups named after the sandbox are ever removed, whatever the file says.
            Some((state, life)) if groups_of(&state.cgroups, id) => {
                (state.cgroups, life.init.map(adopted_init))
            }
            Some((_, life)) => (existing(), life.init.map(adopted_init)),
            None => (existing(), None),
        };
        if let Err(e) = self.remove_remains(id, cgroups, init).await {
            tracing::warn!(sandbox = %id, error = %e, "localbox: cannot remove the remains of a sandbox that could not be re-adopted");
        }
    }

    async fn readopt(
        &self,
        id: &str,
        state: &StateFile,
        life: &LifeFile,
    ) -> Result<Recovered, Why> {
        let dir = self.base.join(id);
        check_remains(self, id, state, &dir)?;
        let init = match life.status {
            SandboxStatus::Stopped => None,
            _ => Some(live_init(life, &state.netns)?),
        };
        let listener = bind_in_netns(&state.netns, state.proxy_port)
            .await
            .map_err(|e| {
                (
                    "proxy_port_taken",
                    format!("cannot bind the proxy listener again: {e}"),
                )
            })?;
        let sandbox = Sandbox {
            id: id.to_string(),
            root: dir.join("root"),
            dir,
            netns: state.netns.clone(),
            env: state.env.clone(),
            proxy_port: state.proxy_port,
            labels: state.labels.clone(),
            seq: AtomicU64::new(next_seq(state.cgroups.freezer.as_deref())),
            cgroups: state.cgroups.clone(),
            life: tokio::sync::Mutex::new(Life {
                status: life.status,
                init,
            }),
            stopped: tokio::sync::watch::Sender::new(0),
            watches: Arc::default(),
        };
        self.map().insert(id.to_string(), Arc::new(sandbox));
        Ok(Recovered {
            id: id.to_string(),
            labels: state.labels.clone(),
            listener,
            proxy_port: state.proxy_port,
            enforced: (&state.enforced).into(),
            status: life.status,
        })
    }
}

fn read_files(dir: &Path) -> Result<(StateFile, LifeFile), Why> {
    fn read<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, Why> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err((
                    "state_missing",
                    "no state file: its create never finished".into(),
                ))
            }
            Err(e) => return Err(("state_unreadable", format!("{}: {e}", path.display()))),
        };
        serde_json::from_slice(&bytes)
            .map_err(|e| ("state_unreadable", format!("{}: {e}", path.display())))
    }
    let state: StateFile = read(&dir.join(STATE_FILE))?;
    if state.version != VERSION {
        return Err((
            "state_unreadable",
            format!("state file version {} is not {VERSION}", state.version),
        ));
    }
    Ok((state, read(&dir.join(LIFE_FILE))?))
}

/// The root, the namespace and the cgroups are where the state file says.
fn check_remains(rt: &LocalRuntime, id: &str, state: &StateFile, dir: &Path) -> Result<(), Why> {
    if state.netns != rt.netns_name(id) {
        return Err((
            "state_mismatch",
            format!(
                "its network namespace {} does not follow netns_prefix {:?}",
                state.netns, rt.config.netns_prefix
            ),
        ));
    }
    if !dir.join("root").is_dir() {
        return Err(("root_gone", "its root directory is gone".into()));
    }
    if !Path::new("/run/netns").join(&state.netns).exists() {
        return Err((
            "netns_gone",
            format!("its network namespace {} is gone", state.netns),
        ));
    }
    let groups = &state.cgroups;
    for group in [&groups.freezer, &groups.memory, &groups.cpu, &groups.pids]
        .into_iter()
        .flatten()
    {
        if !group.is_dir() || !groups_of(groups, id) {
            return Err((
                "cgroup_gone",
                format!("its cgroup {} is gone", group.display()),
            ));
        }
    }
    Ok(())
}

/// Every recorded group is named after the sandbox (as `SandboxCgroups::create` names them).
fn groups_of(groups: &cgroup::SandboxCgroups, id: &str) -> bool {
    [&groups.freezer, &groups.memory, &groups.cpu, &groups.pids]
        .into_iter()
        .flatten()
        .all(|g| g.file_name().and_then(|n| n.to_str()) == Some(id))
}

/// The recorded init, still running and still in the sandbox's network namespace.
fn live_init(life: &LifeFile, netns: &str) -> Result<Init, Why> {
    let Some(recorded) = life.init else {
        return Err(("init_gone", "no init was recorded".into()));
    };
    if !recorded.pid1.alive() {
        return Err((
            "init_gone",
            format!(
                "its init process (pid {}) is no longer running; every process of the sandbox \
                 ended with it",
                recorded.pid1.pid
            ),
        ));
    }
    let ns = |path: &Path| std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok();
    let own = ns(&Path::new("/run/netns").join(netns));
    let init = ns(Path::new(&format!("/proc/{}/ns/net", recorded.pid1.pid)));
    if own.is_none() || own != init {
        return Err((
            "init_mismatch",
            format!(
                "the process recorded as its init (pid {}) is not in its network namespace",
                recorded.pid1.pid
            ),
        ));
    }
    Ok(adopted_init(recorded))
}

fn adopted_init(recorded: InitFile) -> Init {
    Init {
        child: None,
        unshare: recorded.unshare,
        pid1: recorded.pid1,
    }
}

/// The next exec number: past every exec group the previous process made, so a new exec
/// never shares a freezer group (and so its kills) with a process an old one left running.
fn next_seq(freezer: Option<&Path>) -> u64 {
    let Some(entries) = freezer.and_then(|dir| std::fs::read_dir(dir).ok()) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix('x')?
                .parse::<u64>()
                .ok()
        })
        .map(|n| n + 1)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_named_by_pid_and_start_time() {
        let me = ProcId::of(std::process::id()).unwrap();
        assert!(me.alive());
        let recycled = ProcId {
            start: me.start + 1,
            ..me
        };
        assert!(!recycled.alive(), "same pid, another start time");
        assert!(ProcId::of(0).is_none());
    }

    #[test]
    fn exec_numbers_continue_after_the_previous_process() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(next_seq(Some(dir.path())), 0);
        for name in ["init", "x0", "x7", "x3", "xjunk"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        assert_eq!(next_seq(Some(dir.path())), 8);
        assert_eq!(next_seq(None), 0);
    }

    #[test]
    fn missing_or_foreign_state_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_files(dir.path()).unwrap_err().0, "state_missing");
        std::fs::write(dir.path().join(STATE_FILE), b"{\"version\": 1").unwrap();
        assert_eq!(read_files(dir.path()).unwrap_err().0, "state_unreadable");
    }
}
