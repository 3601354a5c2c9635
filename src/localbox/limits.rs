//! A sandbox's limits beyond namespaces: cgroup limits (memory, cpu, processes) and the
//! size of its writable areas, and how often the kernel has held it to them.
//!
//! The writable areas (`/home/user`, `/tmp`) share one ext4 file system of the requested
//! size: a sparse image `<dir>/disk.img` loop-mounted at `<dir>/disk` on the host, whose
//! `home` and `tmp` directories are bound at `root/home/user` and `root/tmp`. Files stay
//! on disk (not in memory, unlike a tmpfs, so filling them never counts as memory), the
//! gateway's file operations see them through the same paths as before, and a full area
//! answers `ENOSPC` inside the sandbox only. These are the only mounts ever made below a
//! sandbox's directory on the host; [`unmount_below`] removes them at teardown.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::process::Command;

use super::{run, Enforced, LocalRuntime, LocalboxError, Result, Sandbox, SandboxSpec};

/// A writable area counts as full with less than this much free, plus 1% of its size:
/// ext4 answers `ENOSPC` with some blocks still free (reserved for its own metadata).
const FULL_BELOW_BYTES: u64 = 1024 * 1024;

/// How often a sandbox met its limits since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitHits {
    /// Processes the kernel killed for exceeding the memory limit.
    pub oom_kills: u64,
    /// Forks refused at the process limit.
    pub pids_refused: u64,
    /// Whether the writable areas are full now (only with a disk limit).
    pub disk_full: bool,
}

impl LocalRuntime {
    /// Checks the limits asked for can be enforced here, before anything is made.
    pub(super) fn check_limits(&self, spec: &SandboxSpec) -> Result<()> {
        let caps = self.capabilities();
        let missing = [
            (spec.limits.memory_bytes.is_some() && !caps.memory_limit, "memory limit: no usable memory controller (cgroup v1 memory, or v2 memory delegated to the gateway)"),
            (spec.limits.cpu_millis.is_some() && !caps.cpu_limit, "cpu limit: no usable cpu controller (cgroup v1 cpu, or v2 cpu delegated to the gateway)"),
            (spec.limits.pids.is_some() && !caps.pids_limit, "process limit: no usable pids controller (cgroup v1 pids, or v2 pids delegated to the gateway)"),
            (spec.limits.disk_bytes.is_some() && !caps.disk_limit, "disk limit: needs mkfs.ext4 and loop devices (/dev/loop-control)"),
        ];
        match missing.iter().find(|(miss, _)| *miss) {
            Some((_, why)) => Err(LocalboxError::Unsupported((*why).into())),
            None => Ok(()),
        }
    }

    /// Applies the cgroup limits of `spec`, each read back from the kernel.
    pub(super) fn apply_cgroup_limits(
        &self,
        sandbox: &Sandbox,
        spec: &SandboxSpec,
        enforced: &mut Enforced,
    ) -> Result<()> {
        let took = |what: &str, result: std::io::Result<bool>| match result {
            Ok(true) => Ok(()),
            Ok(false) => Err(LocalboxError::Unsupported(format!("{what} did not take"))),
            Err(e) => Err(LocalboxError::setup(format!("setting the {what}"), e)),
        };
        let groups = &sandbox.cgroups;
        if let Some(bytes) = spec.limits.memory_bytes {
            took("memory limit", groups.set_memory(bytes))?;
            enforced.memory_bytes = Some(bytes);
        }
        if let Some(millis) = spec.limits.cpu_millis {
            took("cpu limit", groups.set_cpu(millis))?;
            enforced.cpu_millis = Some(millis);
        }
        if let Some(max) = spec.limits.pids {
            took("process limit", groups.set_pids(max))?;
            enforced.pids = Some(max);
        }
        Ok(())
    }

    /// Puts the writable areas on a file system of `bytes` (see the module docs).
    pub(super) async fn limit_disk(&self, sandbox: &Sandbox, bytes: u64) -> Result<()> {
        let Some(mkfs) = &self.tools.mkfs else {
            return Err(LocalboxError::Unsupported(
                "disk limit: no mkfs.ext4".into(),
            ));
        };
        let fail = |step: &str, e: std::io::Error| LocalboxError::setup(step.to_string(), e);
        let image = sandbox.dir.join("disk.img");
        let disk = sandbox.dir.join("disk");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(bytes))
            .map_err(|e| fail("creating the disk image", e))?;
        // No reserved blocks: the whole size is the sandbox's.
        run(Command::new(mkfs).args(["-q", "-F", "-m", "0"]).arg(&image))
            .await
            .map_err(|e| fail("formatting the disk image", e))?;
        mkdir(&disk, 0o700).map_err(|e| fail("creating the disk mount point", e))?;
        run(Command::new("mount")
            .args(["-o", "loop,nosuid,nodev"])
            .arg(&image)
            .arg(&disk))
        .await
        .map_err(|e| fail("mounting the disk image", e))?;
        for (area, target, mode) in [("home", "home/user", 0o755), ("tmp", "tmp", 0o1777)] {
            let source = disk.join(area);
            mkdir(&source, mode).map_err(|e| fail("preparing the disk", e))?;
            std::fs::set_permissions(&source, std::fs::Permissions::from_mode(mode))
                .map_err(|e| fail("preparing the disk", e))?;
            std::os::unix::fs::chown(&source, Some(self.config.uid), Some(self.config.gid))
                .map_err(|e| fail("preparing the disk", e))?;
            run(Command::new("mount")
                .arg("--bind")
                .arg(&source)
                .arg(sandbox.root.join(target)))
            .await
            .map_err(|e| fail("binding the disk", e))?;
        }
        Ok(())
    }

    /// How often the sandbox met its limits (see [`LimitHits`]).
    pub fn limit_hits(&self, id: &str) -> Result<LimitHits> {
        let sandbox = self.get(id)?;
        let (oom_kills, pids_refused) = sandbox.cgroups.limit_hits();
        let disk = sandbox.dir.join("disk");
        let disk_full = is_mount_point(&disk)
            && space(&disk).is_some_and(|(free, total)| free < FULL_BELOW_BYTES + total / 100);
        Ok(LimitHits {
            oom_kills,
            pids_refused,
            disk_full,
        })
    }
}

/// Whether a small disk image can be formatted and loop-mounted in `base` (tried once at
/// start, so a machine without loop devices declares the disk limit unenforced instead of
/// failing every create).
pub(super) fn disk_works(mkfs: &Path, base: &Path) -> bool {
    if !Path::new("/dev/loop-control").exists() {
        return false;
    }
    let (image, mount) = (base.join(".disk-probe.img"), base.join(".disk-probe"));
    let ok = (|| {
        std::fs::File::create(&image).ok()?.set_len(4 << 20).ok()?;
        mkdir(&mount, 0o700).ok()?;
        let quiet = |cmd: &mut std::process::Command| {
            cmd.env("PATH", super::SANDBOX_PATH)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let formatted = quiet(
            std::process::Command::new(mkfs)
                .args(["-q", "-F"])
                .arg(&image),
        );
        let mounted = formatted
            && quiet(
                std::process::Command::new("mount")
                    .args(["-o", "loop"])
                    .arg(&image)
                    .arg(&mount),
            );
        if mounted {
            unmount(&mount);
        }
        mounted.then_some(())
    })()
    .is_some();
    let _ = std::fs::remove_file(&image);
    let _ = std::fs::remove_dir(&mount);
    ok
}

fn mkdir(path: &Path, mode: u32) -> std::io::Result<()> {
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// (available, total) bytes of the file system at `path`.
fn space(path: &Path) -> Option<(u64, u64)> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a valid out-pointer for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let unit = st.f_frsize as u64;
    Some((st.f_bavail as u64 * unit, st.f_blocks as u64 * unit))
}

/// Mount points at or below `dir` on the host, deepest first.
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(dir))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    found.dedup();
    found
}

fn is_mount_point(path: &Path) -> bool {
    mounts_below(path).iter().any(|m| m == path)
}

/// Detaches the mounts [`LocalRuntime::limit_disk`] made below a sandbox's directory;
/// the loop device goes with the last of them. Only the disk image and the two binds of
/// its areas are unmounted: anything else below the directory is left for the caller to
/// refuse.
pub(super) fn unmount_below(dir: &Path) {
    let ours = [
        dir.join("root/home/user"),
        dir.join("root/tmp"),
        dir.join("disk"),
    ];
    for mount in mounts_below(dir).into_iter().filter(|m| ours.contains(m)) {
        unmount(&mount);
    }
}

fn unmount(mount: &Path) {
    let Ok(c) = std::ffi::CString::new(mount.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: a valid C string; MNT_DETACH has no memory-safety preconditions.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(mount = %mount.display(), error = %e, "localbox: unmounting a sandbox's disk failed");
    }
}
