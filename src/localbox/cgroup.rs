//! cgroups for sandboxes: freezing (pause/resume and reliable tree kills), memory and
//! cpu limits. cgroup v1 (`freezer`, `memory`, `cpu` hierarchies) or cgroup v2
//! (`cgroup.freeze`, `cgroup.kill`, `memory.max`, `cpu.max`; the limits only where the
//! gateway's own group delegates those controllers, e.g. systemd `Delegate=yes`).
//!
//! Each controller's sandbox groups are created *under the gateway's own group* of that
//! controller (`<mount>/<own path>/<name>/<sandbox id>`), so any limit the gateway itself
//! runs under still bounds its sandboxes. Every process of a sandbox joins the sandbox's
//! memory and cpu groups; in the freezer hierarchy each exec (and the sandbox's init) gets
//! its own child group so that one exec's whole process tree can be frozen and killed
//! without touching the rest of the sandbox, while freezing the sandbox group freezes all.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Which cgroup hierarchy to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupMode {
    /// v1 when its freezer is mounted, else v2 when usable, else none.
    #[default]
    Auto,
    V1,
    V2,
    /// No cgroups: no pause, no limits; kills by process group and PID namespace.
    Off,
}

/// Where the usable controllers of this process live.
#[derive(Debug, Clone, Default)]
pub(crate) struct Controllers {
    /// `<mount>/<own path>/<name>` for each controller that is usable; under v2 all are
    /// the same directory.
    pub freezer: Option<PathBuf>,
    pub memory: Option<PathBuf>,
    pub cpu: Option<PathBuf>,
    pub pids: Option<PathBuf>,
    pub unified: bool,
}

impl Controllers {
    /// Finds the controllers from `/proc/self/mountinfo` and `/proc/self/cgroup` and
    /// keeps those under which a `name` group can be created.
    pub fn probe(name: &str, mode: CgroupMode) -> Controllers {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        match mode {
            CgroupMode::Off => Controllers::default(),
            CgroupMode::V1 => Self::probe_v1(&mountinfo, &own, name),
            CgroupMode::V2 => Self::probe_v2(&mountinfo, &own, name),
            CgroupMode::Auto => {
                let v1 = Self::probe_v1(&mountinfo, &own, name);
                if v1.freezer.is_some() {
                    return v1;
                }
                let v2 = Self::probe_v2(&mountinfo, &own, name);
                if v2.freezer.is_some() {
                    v2
                } else {
                    v1
                }
            }
        }
    }

    fn probe_v1(mountinfo: &str, own: &str, name: &str) -> Controllers {
        let find = |controller: &str, file: &str| -> Option<PathBuf> {
            let mount = v1_mount(mountinfo, controller)?;
            let path = own_path(own, controller)?;
            let dir = mount.join(path.trim_start_matches('/')).join(name);
            if !dir.is_dir() {
                fs::create_dir(&dir).ok()?;
            }
            dir.join(file).exists().then_some(dir)
        };
        Controllers {
            freezer: find("freezer", "freezer.state"),
            memory: find("memory", "memory.limit_in_bytes"),
            cpu: find("cpu", "cpu.cfs_quota_us"),
            pids: find("pids", "pids.max"),
            unified: false,
        }
    }

    fn probe_v2(mountinfo: &str, own: &str, name: &str) -> Controllers {
        let base = (|| {
            let mount = v2_mount(mountinfo)?;
            let path = own
                .lines()
                .find_map(|l| l.strip_prefix("0::"))?
                .trim()
                .to_string();
            let dir = mount.join(path.trim_start_matches('/')).join(name);
            if !dir.is_dir() {
                fs::create_dir(&dir).ok()?;
            }
            dir.join("cgroup.freeze").exists().then_some(dir)
        })();
        let Some(base) = base else {
            return Controllers::default();
        };
        // Enable what the gateway's own group delegates, for the sandbox groups below.
        let _ = write(&base.join("cgroup.subtree_control"), "+memory");
        let _ = write(&base.join("cgroup.subtree_control"), "+cpu");
        let _ = write(&base.join("cgroup.subtree_control"), "+pids");
        let enabled = fs::read_to_string(base.join("cgroup.subtree_control")).unwrap_or_default();
        let has = |c: &str| enabled.split_whitespace().any(|e| e == c);
        Controllers {
            memory: has("memory").then(|| base.clone()),
            cpu: has("cpu").then(|| base.clone()),
            pids: has("pids").then(|| base.clone()),
            freezer: Some(base),
            unified: true,
        }
    }
}

/// Mount point of the cgroup2 hierarchy.
fn v2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        Some(PathBuf::from(left.split_whitespace().nth(4)?))
    })
}

/// Mount point of the v1 hierarchy carrying `controller` (super options list it).
fn v1_mount(mountinfo: &str, controller: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split_whitespace();
        if right.next()? != "cgroup" {
            return None;
        }
        let _source = right.next()?;
        let options = right.next()?;
        if !options.split(',').any(|o| o == controller) {
            return None;
        }
        let mount_point = left.split_whitespace().nth(4)?;
        Some(PathBuf::from(mount_point))
    })
}

/// This process's path in the v1 hierarchy carrying `controller`.
fn own_path(proc_cgroup: &str, controller: &str) -> Option<String> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })
}

/// One sandbox's groups.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct SandboxCgroups {
    pub freezer: Option<PathBuf>,
    pub memory: Option<PathBuf>,
    pub cpu: Option<PathBuf>,
    pub pids: Option<PathBuf>,
    /// v2: one group holds everything; processes live only in its leaves.
    pub unified: bool,
}

impl SandboxCgroups {
    pub fn create(controllers: &Controllers, id: &str) -> io::Result<SandboxCgroups> {
        let make = |base: &Option<PathBuf>| -> io::Result<Option<PathBuf>> {
            let Some(base) = base else { return Ok(None) };
            let dir = base.join(id);
            match fs::create_dir(&dir) {
                Ok(()) => Ok(Some(dir)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(Some(dir)),
                Err(e) => Err(e),
            }
        };
        let freezer = make(&controllers.freezer)?;
        let unified = controllers.unified;
        let (memory, cpu, pids) = if unified {
            let same = |c: &Option<PathBuf>| c.as_ref().and(freezer.clone());
            (
                same(&controllers.memory),
                same(&controllers.cpu),
                same(&controllers.pids),
            )
        } else {
            (
                make(&controllers.memory)?,
                make(&controllers.cpu)?,
                make(&controllers.pids)?,
            )
        };
        Ok(SandboxCgroups {
            freezer,
            memory,
            cpu,
            pids,
            unified,
        })
    }

    /// The groups of `id` that exist already (for cleaning up after a crash).
    pub fn existing(controllers: &Controllers, id: &str) -> SandboxCgroups {
        let find =
            |base: &Option<PathBuf>| base.as_ref().map(|b| b.join(id)).filter(|dir| dir.is_dir());
        SandboxCgroups {
            freezer: find(&controllers.freezer),
            memory: find(&controllers.memory),
            cpu: find(&controllers.cpu),
            pids: find(&controllers.pids),
            unified: controllers.unified,
        }
    }

    /// Sets and reads back the memory limit; `Ok(false)` when there is no memory group.
    pub fn set_memory(&self, bytes: u64) -> io::Result<bool> {
        let Some(dir) = &self.memory else {
            return Ok(false);
        };
        if self.unified {
            write(&dir.join("memory.max"), &bytes.to_string())?;
            // Without this a process could spill to swap past the limit.
            let swap = dir.join("memory.swap.max");
            if swap.exists() {
                write(&swap, "0")?;
            }
            let read: u64 = read_trim(&dir.join("memory.max"))?
                .parse()
                .map_err(|_| io::Error::other("unparsable memory.max"))?;
            return Ok(read <= bytes && read + 4096 * 16 > bytes);
        }
        write(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write(&memsw, &bytes.to_string())?;
        }
        let read: u64 = read_trim(&dir.join("memory.limit_in_bytes"))?
            .parse()
            .map_err(|_| io::Error::other("unparsable memory.limit_in_bytes"))?;
        // The kernel rounds down to a page.
        Ok(read <= bytes && read + 4096 * 16 > bytes)
    }

    /// Sets a CFS quota of `millis` thousandths of a CPU per 100 ms period.
    pub fn set_cpu(&self, millis: u32) -> io::Result<bool> {
        let Some(dir) = &self.cpu else {
            return Ok(false);
        };
        let period: u64 = 100_000;
        let quota = (u64::from(millis) * period / 1000).max(1000);
        if self.unified {
            write(&dir.join("cpu.max"), &format!("{quota} {period}"))?;
            return Ok(read_trim(&dir.join("cpu.max"))? == format!("{quota} {period}"));
        }
        write(&dir.join("cpu.cfs_period_us"), &period.to_string())?;
        write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
        Ok(read_trim(&dir.join("cpu.cfs_quota_us"))? == quota.to_string())
    }

    /// Sets and reads back the limit on processes (threads included); `Ok(false)` when
    /// there is no pids group.
    pub fn set_pids(&self, max: u64) -> io::Result<bool> {
        let Some(dir) = &self.pids else {
            return Ok(false);
        };
        write(&dir.join("pids.max"), &max.to_string())?;
        Ok(read_trim(&dir.join("pids.max"))? == max.to_string())
    }

    /// How often the kernel held the sandbox to its limits so far: processes killed for
    /// memory (`oom_kill`) and forks refused at the process limit (`pids.events` `max`).
    pub fn limit_hits(&self) -> (u64, u64) {
        let oom = self.memory.as_ref().map_or(0, |dir| {
            let file = if self.unified {
                "memory.events"
            } else {
                "memory.oom_control"
            };
            counter(&dir.join(file), "oom_kill")
        });
        let forks = self
            .pids
            .as_ref()
            .map_or(0, |dir| counter(&dir.join("pids.events"), "max"));
        (oom, forks)
    }

    /// Creates the freezer child group `name` (an exec or the init) and returns it.
    pub fn freezer_child(&self, name: &str) -> io::Result<Option<PathBuf>> {
        let Some(dir) = &self.freezer else {
            return Ok(None);
        };
        let child = dir.join(name);
        match fs::create_dir(&child) {
            Ok(()) => Ok(Some(child)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(Some(child)),
            Err(e) => Err(e),
        }
    }

    /// The `cgroup.procs` files a new process of this sandbox must join, the freezer one
    /// being `freezer_group` (a child made by [`Self::freezer_child`]).
    pub fn join_files(&self, freezer_group: Option<&Path>) -> Vec<CString> {
        let limits = if self.unified {
            // One hierarchy: the leaf is below the limited group already.
            [None, None, None]
        } else {
            [
                self.memory.as_deref(),
                self.cpu.as_deref(),
                self.pids.as_deref(),
            ]
        };
        [freezer_group, limits[0], limits[1], limits[2]]
            .into_iter()
            .flatten()
            .filter_map(|dir| CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok())
            .collect()
    }

    /// Every process id in the sandbox's groups (freezer tree, else memory/cpu groups).
    pub fn pids(&self) -> Vec<u32> {
        let mut out = Vec::new();
        if let Some(dir) = &self.freezer {
            collect_pids(dir, &mut out);
        } else {
            for dir in [&self.memory, &self.cpu, &self.pids].into_iter().flatten() {
                collect_pids(dir, &mut out);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Removes the groups (children first). Fails while a process remains in them.
    pub fn remove(&self) -> io::Result<()> {
        for dir in [&self.freezer, &self.memory, &self.cpu, &self.pids]
            .into_iter()
            .flatten()
        {
            remove_tree(dir)?;
        }
        Ok(())
    }
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines); 0 when absent.
fn counter(path: &Path, key: &str) -> u64 {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

fn collect_pids(dir: &Path, out: &mut Vec<u32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                collect_pids(&entry.path(), out);
            }
        }
    }
}

fn remove_tree(dir: &Path) -> io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    for entry in fs::read_dir(dir)?.flatten() {
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_tree(&entry.path())?;
        }
    }
    fs::remove_dir(dir)
}

pub(crate) fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

fn read_trim(path: &Path) -> io::Result<String> {
    Ok(fs::read_to_string(path)?.trim().to_string())
}

/// Freezes (or thaws) a group (v1 `freezer.state` or v2 `cgroup.freeze`, whichever the
/// directory has) and waits, bounded, until the kernel reports the state reached. A group
/// whose parent is frozen stays frozen when thawed; that is reported as success since
/// nothing more can be done from here.
pub(crate) async fn set_frozen(dir: &Path, frozen: bool) -> io::Result<()> {
    let v2 = dir.join("cgroup.freeze").exists();
    let (file, want) = match (v2, frozen) {
        (true, true) => ("cgroup.freeze", "1"),
        (true, false) => ("cgroup.freeze", "0"),
        (false, true) => ("freezer.state", "FROZEN"),
        (false, false) => ("freezer.state", "THAWED"),
    };
    write(&dir.join(file), want)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state = if v2 {
            let events = read_trim(&dir.join("cgroup.events"))?;
            let frozen_now = events.lines().any(|l| l.trim() == "frozen 1");
            if frozen_now { "1" } else { "0" }.to_string()
        } else {
            read_trim(&dir.join("freezer.state"))?
        };
        if state == want || (!frozen && parent_freezing(dir)) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(io::Error::other(format!(
                "{} stayed {state} instead of {want}",
                dir.display()
            )));
        }
        if frozen && !v2 {
            // A FREEZING v1 group is retried by writing the state again.
            write(&dir.join(file), want)?;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn parent_freezing(dir: &Path) -> bool {
    if dir.join("cgroup.freeze").exists() {
        return dir
            .parent()
            .is_some_and(|p| read_trim(&p.join("cgroup.freeze")).is_ok_and(|v| v == "1"));
    }
    read_trim(&dir.join("freezer.parent_freezing")).is_ok_and(|v| v == "1")
}

/// Kills every process in a freezer group and its children: freeze (so nothing forks
/// while we kill), SIGKILL each member, thaw (so the kills land). Returns once the group
/// is empty or after a bounded wait.
pub(crate) async fn kill_group(dir: &Path) -> io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    if dir.join("cgroup.kill").exists() {
        // v2: the kernel kills the whole subtree, frozen or not, without races.
        write(&dir.join("cgroup.kill"), "1")?;
        return wait_empty(dir, Duration::from_secs(10)).await;
    }
    if let Err(e) = set_frozen(dir, true).await {
        // Still kill: a task stuck in the kernel may delay freezing, not the kill.
        tracing::warn!(error = %e, "localbox: freezing before a kill did not complete");
    }
    let mut pids = Vec::new();
    collect_pids(dir, &mut pids);
    for pid in &pids {
        signal(*pid, libc::SIGKILL);
    }
    set_frozen(dir, false).await?;
    if parent_freezing(dir) {
        // The sandbox is paused: the kills land when it is resumed.
        return Ok(());
    }
    wait_empty(dir, Duration::from_secs(10)).await
}

/// Waits until no process is left in a group or its children.
pub(crate) async fn wait_empty(dir: &Path, limit: Duration) -> io::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let mut pids = Vec::new();
        collect_pids(dir, &mut pids);
        if pids.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(io::Error::other(format!(
                "processes {pids:?} still in {}",
                dir.display()
            )));
        }
        for pid in &pids {
            signal(*pid, libc::SIGKILL);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) fn signal(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid <= 1 {
        return;
    }
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_v1_mounts_and_own_paths() {
        let mountinfo = "30 25 0:26 / /sys/fs/cgroup/freezer rw,relatime shared:12 - cgroup cgroup rw,freezer\n\
                         31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                         32 25 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            v1_mount(mountinfo, "freezer"),
            Some(PathBuf::from("/sys/fs/cgroup/freezer"))
        );
        assert_eq!(
            v1_mount(mountinfo, "cpu"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(v1_mount(mountinfo, "memory"), None);
        let own = "6:freezer:/\n4:memory:/a/b\n1:cpu,cpuacct:/c\n0::/\n";
        assert_eq!(own_path(own, "memory").as_deref(), Some("/a/b"));
        assert_eq!(own_path(own, "cpu").as_deref(), Some("/c"));
        assert_eq!(own_path(own, "pids"), None);
    }
}
