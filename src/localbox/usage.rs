//! A sandbox's resource use now, for E2B's `get_metrics` (`Provider::usage`): read from its
//! cgroups, with `/proc` standing in for what the machine's cgroups do not hold.
//!
//! - **CPU**: the sandbox's CPU time is sampled twice, [`CPU_WINDOW`] apart, and the
//!   difference is the share of its CPUs it used meanwhile. The time comes from cgroup v2's
//!   `cpu.stat` (`usage_usec`, always kept for a group), else the sum of `utime + stime` of
//!   its processes (`/proc/<pid>/stat`; cgroup v1's `cpuacct` is not one of the hierarchies
//!   sandboxes join). Its CPUs are its `cpu.max` / `cpu.cfs_quota_us` limit rounded up, else
//!   the machine's.
//! - **Memory**: `memory.current` / `memory.usage_in_bytes` and the page cache of
//!   `memory.stat` (`file` / `cache`) of its memory group, else the resident size of its
//!   processes (`/proc/<pid>/statm`, no cache figure). The total is its limit, else (or
//!   when the limit is above it) the machine's memory.
//! - **Disk**: the bytes of the files under its `/home/user` and `/tmp` (what a snapshot
//!   keeps), walked without following links and bounded to [`MAX_WALK_ENTRIES`] entries;
//!   the total is the size of the filesystem holding them.
//!
//! Every figure is bounded work: a sandbox with a million files or processes costs the
//! walk's and [`MAX_PIDS`]'s bound, never more.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{cgroup::SandboxCgroups, LocalRuntime, LocalboxError, Result};

/// How long CPU use is sampled over.
pub const CPU_WINDOW: Duration = Duration::from_millis(250);
/// Most directory entries the disk figure walks (beyond them it is a lower bound).
pub const MAX_WALK_ENTRIES: usize = 100_000;
/// Most processes whose `/proc` figures are summed.
pub const MAX_PIDS: usize = 4096;

/// What one sandbox uses now.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Usage {
    /// CPUs the sandbox may use (its limit rounded up, else the machine's).
    pub cpu_count: u32,
    /// Percent of those CPUs used over the sampling window, 0 to 100.
    pub cpu_used_pct: f64,
    pub mem_used_bytes: u64,
    /// Its memory limit, else the machine's memory.
    pub mem_total_bytes: u64,
    /// Page cache charged to it (0 where only `/proc` figures exist).
    pub mem_cache_bytes: u64,
    pub disk_used_bytes: u64,
    pub disk_total_bytes: u64,
}

impl LocalRuntime {
    /// The sandbox's resource use now (takes [`CPU_WINDOW`] to sample its CPU).
    pub async fn usage(&self, id: &str) -> Result<Usage> {
        let sandbox = self.get(id)?;
        let (groups, root) = (Groups::of(&sandbox.cgroups), sandbox.root.clone());
        let probe = groups.clone();
        let first = blocking(move || probe.cpu_usec()).await?;
        tokio::time::sleep(CPU_WINDOW).await;
        blocking(move || {
            let second = groups.cpu_usec();
            let cpu_count = groups.cpu_count();
            let window = CPU_WINDOW.as_micros() as f64 * f64::from(cpu_count.max(1));
            let used = second.saturating_sub(first) as f64;
            let host_memory = host_memory_bytes();
            let (mem_used, mem_cache, limit) = groups.memory();
            let (disk_used, disk_total) = disk(&root);
            Usage {
                cpu_count,
                cpu_used_pct: (used / window * 100.0).clamp(0.0, 100.0),
                mem_used_bytes: mem_used,
                mem_total_bytes: limit
                    .filter(|l| *l > 0 && (host_memory == 0 || *l < host_memory))
                    .unwrap_or(host_memory),
                mem_cache_bytes: mem_cache,
                disk_used_bytes: disk_used,
                disk_total_bytes: disk_total,
            }
        })
        .await
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| LocalboxError::setup("reading the sandbox's usage", e))
}

/// The groups' directories, owned so the reads can run off the async threads.
#[derive(Debug, Clone)]
struct Groups {
    freezer: Option<PathBuf>,
    memory: Option<PathBuf>,
    cpu: Option<PathBuf>,
    unified: bool,
}

impl Groups {
    fn of(c: &SandboxCgroups) -> Groups {
        Groups {
            freezer: c.freezer.clone(),
            memory: c.memory.clone(),
            cpu: c.cpu.clone(),
            unified: c.unified,
        }
    }

    fn pids(&self) -> Vec<u32> {
        let cgroups = SandboxCgroups {
            freezer: self.freezer.clone(),
            memory: self.memory.clone(),
            cpu: self.cpu.clone(),
            pids: None,
            unified: self.unified,
        };
        let mut pids = cgroups.pids();
        pids.truncate(MAX_PIDS);
        pids
    }

    /// The sandbox's CPU time so far, in microseconds.
    fn cpu_usec(&self) -> u64 {
        // v2 keeps usage_usec for every group, cpu controller or not.
        let stat = self
            .freezer
            .as_ref()
            .filter(|_| self.unified)
            .and_then(|dir| fs::read_to_string(dir.join("cpu.stat")).ok());
        if let Some(usec) = stat.as_deref().and_then(|s| stat_value(s, "usage_usec")) {
            return usec;
        }
        let ticks = clock_ticks();
        let total: u64 = self
            .pids()
            .into_iter()
            .filter_map(|pid| fs::read_to_string(format!("/proc/{pid}/stat")).ok())
            .filter_map(|stat| proc_cpu_ticks(&stat))
            .sum();
        total.saturating_mul(1_000_000) / ticks
    }

    /// CPUs the sandbox may use: its quota over its period, rounded up; else the machine's.
    fn cpu_count(&self) -> u32 {
        let host = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let quota = self.cpu.as_ref().and_then(|dir| {
            if self.unified {
                let text = fs::read_to_string(dir.join("cpu.max")).ok()?;
                let mut parts = text.split_whitespace();
                let quota: u64 = parts.next()?.parse().ok()?; // "max": no limit
                let period: u64 = parts.next()?.parse().ok()?;
                Some((quota, period))
            } else {
                let quota: i64 = read_number(&dir.join("cpu.cfs_quota_us"))?;
                let period: i64 = read_number(&dir.join("cpu.cfs_period_us"))?;
                (quota > 0 && period > 0).then_some((quota as u64, period as u64))
            }
        });
        match quota {
            Some((quota, period)) if period > 0 => (quota.div_ceil(period) as u32).clamp(1, host),
            _ => host,
        }
    }

    /// Used bytes, page cache bytes, and the limit (`None`: unlimited or unknown).
    fn memory(&self) -> (u64, u64, Option<u64>) {
        if let Some(dir) = &self.memory {
            let (current, max, cache_key) = if self.unified {
                ("memory.current", "memory.max", "file")
            } else {
                ("memory.usage_in_bytes", "memory.limit_in_bytes", "cache")
            };
            if let Some(used) = read_number::<u64>(&dir.join(current)) {
                // v2 writes "max" when unlimited; v1 a huge number, capped by the caller.
                let limit = read_number::<u64>(&dir.join(max));
                let cache = fs::read_to_string(dir.join("memory.stat"))
                    .ok()
                    .and_then(|s| stat_value(&s, cache_key))
                    .unwrap_or(0);
                return (used, cache, limit);
            }
        }
        let page = page_size();
        let resident: u64 = self
            .pids()
            .into_iter()
            .filter_map(|pid| fs::read_to_string(format!("/proc/{pid}/statm")).ok())
            .filter_map(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map(|pages| pages.saturating_mul(page))
            .fold(0u64, u64::saturating_add);
        (resident, 0, None)
    }
}

/// `key value` lines (`cpu.stat`, `memory.stat`): the value of `key`.
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn read_number<T: std::str::FromStr>(path: &Path) -> Option<T> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `utime + stime` of a `/proc/<pid>/stat` line, in clock ticks. The command name (field
/// 2) may hold spaces and parentheses, so fields are counted after its last `)`.
fn proc_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // After ")": state is field 3, so utime (14) and stime (15) are the 12th and 13th.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|t| *t > 0).unwrap_or(100)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
}

/// The machine's memory (`MemTotal`), 0 when unreadable.
fn host_memory_bytes() -> u64 {
    fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib.saturating_mul(1024))
        })
        .unwrap_or(0)
}

/// Bytes of the files under the sandbox's `home/user` and `tmp`, and the size of the
/// filesystem holding them.
fn disk(root: &Path) -> (u64, u64) {
    let total = statvfs_total(root).unwrap_or(0);
    let mut used = 0u64;
    let mut budget = MAX_WALK_ENTRIES;
    for area in ["home/user", "tmp"] {
        walk(&root.join(area), &mut used, &mut budget);
    }
    (used, total)
}

/// Adds the sizes of the regular files under `dir` to `used`, spending one of `budget`
/// per entry; symlinks are never followed and other filesystems never entered.
fn walk(dir: &Path, used: &mut u64, budget: &mut usize) {
    let Ok(top) = fs::symlink_metadata(dir) else {
        return;
    };
    let device = top.dev();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if *budget == 0 {
                return;
            }
            *budget -= 1;
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_file() {
                *used = used.saturating_add(meta.len());
            } else if meta.is_dir() && meta.dev() == device {
                pending.push(entry.path());
            }
        }
    }
}

fn statvfs_total(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` points at writable storage of the
    // right type; statvfs fills it on success.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it initialised `st`.
    let st = unsafe { st.assume_init() };
    // The field types are u64 on 64-bit Linux, narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    Some((st.f_blocks as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_and_cgroup_figures_parse() {
        let stat = "1234 (a (weird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0";
        assert_eq!(proc_cpu_ticks(stat), Some(12));
        assert_eq!(proc_cpu_ticks("garbage"), None);
        let cpu = "usage_usec 4500\nuser_usec 4000\nsystem_usec 500\n";
        assert_eq!(stat_value(cpu, "usage_usec"), Some(4500));
        assert_eq!(stat_value("cache 10\ntotal_cache 20\n", "cache"), Some(10));
        assert_eq!(stat_value("file_mapped 1\n", "file"), None);
    }

    #[test]
    fn the_disk_walk_is_bounded_and_follows_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home/user");
        fs::create_dir_all(home.join("sub")).unwrap();
        fs::write(home.join("a"), vec![0u8; 1000]).unwrap();
        fs::write(home.join("sub/b"), vec![0u8; 24]).unwrap();
        std::os::unix::fs::symlink("/usr", home.join("link")).unwrap();
        let (used, total) = disk(dir.path());
        assert_eq!(used, 1024);
        assert!(total > 0);
        let (mut used, mut budget) = (0, 1);
        walk(&home, &mut used, &mut budget);
        assert!(used <= 1000 && budget == 0);
    }
}
