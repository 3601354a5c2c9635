//! The limits of local sandboxes: `[local.defaults]` (what every sandbox gets),
//! `[local.max]` (how far a create's `resources` may raise them), what this machine can
//! enforce, and a watch per sandbox that turns the kernel's counters (memory kills, refused
//! forks, a full disk) into events on the sandbox.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::localbox::{Capabilities, Enforced, LimitHits, Limits, LocalRuntime};

/// How often a sandbox's counters are read.
const WATCH_INTERVAL: Duration = Duration::from_millis(200);
/// Events kept per sandbox (the oldest go first).
const MAX_EVENTS: usize = 64;

/// `[local.defaults]` and `[local.max]`: memory, cpu, processes and the size of the
/// writable areas. A field left out takes the built-in value ([`LocalLimits::DEFAULTS`],
/// [`LocalLimits::MAX`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalLimits {
    pub memory_mb: Option<u64>,
    /// Cores (fractions allowed).
    pub cpu: Option<f64>,
    /// Processes and threads alive at once.
    pub pids: Option<u64>,
    /// `/home/user` and `/tmp` together.
    pub disk_mb: Option<u64>,
}

/// Limits with every figure known.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resolved {
    pub memory_mb: u64,
    pub cpu: f64,
    pub pids: u64,
    pub disk_mb: u64,
}

impl LocalLimits {
    pub const DEFAULTS: Resolved = Resolved {
        memory_mb: 1024,
        cpu: 1.0,
        pids: 512,
        disk_mb: 2048,
    };
    pub const MAX: Resolved = Resolved {
        memory_mb: 8192,
        cpu: 4.0,
        pids: 4096,
        disk_mb: 20480,
    };

    pub fn resolve(&self, fallback: Resolved) -> Resolved {
        Resolved {
            memory_mb: self.memory_mb.unwrap_or(fallback.memory_mb),
            cpu: self.cpu.unwrap_or(fallback.cpu),
            pids: self.pids.unwrap_or(fallback.pids),
            disk_mb: self.disk_mb.unwrap_or(fallback.disk_mb),
        }
    }
}

impl Resolved {
    /// `(field, value)` pairs, for checks and messages.
    fn figures(&self) -> [(&'static str, f64); 4] {
        [
            ("memory_mb", self.memory_mb as f64),
            ("cpu", self.cpu),
            ("pids", self.pids as f64),
            ("disk_mb", self.disk_mb as f64),
        ]
    }

    /// Why `self` (the defaults) is not within `max`, if it is not.
    pub fn exceeds(&self, max: &Resolved) -> Option<String> {
        let over = self
            .figures()
            .into_iter()
            .zip(max.figures())
            .find(|((_, v), (_, m))| v > m || *v <= 0.0)?;
        let ((field, value), (_, max)) = over;
        Some(format!(
            "defaults.{field} = {value} must be above 0 and at most max.{field} = {max}"
        ))
    }
}

/// The limits a create gets: its `resources` where given (each at most `max`), the
/// defaults otherwise, keeping only what this machine enforces (the rest is declared at
/// start, see [`unenforced`]). The error names the resource above its maximum.
pub fn limits_for(
    defaults: &Resolved,
    max: &Resolved,
    resources: &sandgate_router::Resources,
    caps: &Capabilities,
) -> Result<Limits, String> {
    let memory_mb = resources.memory_mb.unwrap_or(defaults.memory_mb);
    let cpu = resources.cpu.unwrap_or(defaults.cpu);
    let disk_mb = resources.disk_gb.map_or(defaults.disk_mb, |gb| gb * 1024);
    let pids = resources.pids.unwrap_or(defaults.pids);
    let above = [
        ("memory_mb", memory_mb as f64, max.memory_mb as f64),
        ("cpu", cpu, max.cpu),
        ("disk_mb", disk_mb as f64, max.disk_mb as f64),
        ("pids", pids as f64, max.pids as f64),
    ];
    if let Some((field, value, max)) = above.into_iter().find(|(_, v, m)| v > m) {
        return Err(format!(
            "resources: {field} = {value} is above this gateway's [local.max] {field} = {max}"
        ));
    }
    Ok(Limits {
        memory_bytes: caps.memory_limit.then_some(memory_mb * 1024 * 1024),
        cpu_millis: caps
            .cpu_limit
            .then(|| (cpu * 1000.0).round().max(1.0) as u32),
        pids: caps.pids_limit.then_some(pids),
        disk_bytes: caps.disk_limit.then_some(disk_mb * 1024 * 1024),
    })
}

/// The limits this machine cannot enforce, by name (`memory`, `cpu`, `pids`, `disk`, and
/// `seccomp` for the system call filter).
pub fn unenforced(caps: &Capabilities) -> Vec<&'static str> {
    [
        ("memory", caps.memory_limit),
        ("cpu", caps.cpu_limit),
        ("pids", caps.pids_limit),
        ("disk", caps.disk_limit),
        ("seccomp", caps.seccomp),
    ]
    .into_iter()
    .filter(|(_, ok)| !ok)
    .map(|(name, _)| name)
    .collect()
}

/// What one sandbox runs under and what it met.
#[derive(Debug)]
pub struct Watched {
    enforced: Enforced,
    unenforced: Vec<&'static str>,
    hits: LimitHits,
    events: Vec<Value>,
    /// Events recorded so far, kept or not: the `seq` of the last one.
    recorded: u64,
}

pub type Watch = Arc<Mutex<Watched>>;

fn lock(watch: &Watch) -> std::sync::MutexGuard<'_, Watched> {
    watch.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts watching an instance's counters; the task ends when aborted or when the runtime
/// no longer knows the instance.
pub fn watch(
    runtime: Arc<LocalRuntime>,
    instance_id: String,
    sandbox_id: String,
    enforced: Enforced,
) -> (Watch, tokio::task::JoinHandle<()>) {
    let unenforced = unenforced(&runtime.capabilities());
    let watched: Watch = Arc::new(Mutex::new(Watched {
        enforced,
        unenforced,
        hits: LimitHits::default(),
        events: Vec::new(),
        recorded: 0,
    }));
    let state = watched.clone();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(WATCH_INTERVAL);
        loop {
            tick.tick().await;
            let Ok(now) = runtime.limit_hits(&instance_id) else {
                return;
            };
            record(&mut lock(&state), now, &sandbox_id);
        }
    });
    (watched, task)
}

/// Adds an event for each counter that moved since the last reading.
fn record(watched: &mut Watched, now: LimitHits, sandbox_id: &str) {
    let before = watched.hits;
    let moved = [
        (
            now.oom_kills > before.oom_kills,
            "memory",
            format!(
                "out of memory: the kernel killed a process at the memory limit ({} kills so far)",
                now.oom_kills
            ),
        ),
        (
            now.pids_refused > before.pids_refused,
            "pids",
            format!(
                "process limit reached: forks refused ({} so far)",
                now.pids_refused
            ),
        ),
        (
            now.disk_full && !before.disk_full,
            "disk",
            "disk full: /home/user and /tmp reached their size limit".to_string(),
        ),
    ];
    for (_, limit, message) in moved.into_iter().filter(|(m, _, _)| *m) {
        tracing::warn!(sandbox = %sandbox_id, limit, %message, "local sandbox reached a limit");
        if watched.events.len() >= MAX_EVENTS {
            watched.events.remove(0);
        }
        watched.recorded += 1;
        watched.events.push(json!({
            "type": "limit_reached",
            "seq": watched.recorded,
            "limit": limit,
            "message": message,
            "at_ms": crate::base::clock::now_ms(),
        }));
    }
    watched.hits = now;
}

/// The `limits` field of the sandbox's view.
pub fn view(watch: &Watch) -> Value {
    let w = lock(watch);
    let e = &w.enforced;
    json!({
        "enforced": {
            "memory_mb": e.memory_bytes.map(|b| b / (1024 * 1024)),
            "cpu": e.cpu_millis.map(|m| f64::from(m) / 1000.0),
            "pids": e.pids,
            "disk_mb": e.disk_bytes.map(|b| b / (1024 * 1024)),
            "seccomp": !w.unenforced.contains(&"seccomp"),
        },
        "unenforced": w.unenforced,
        "oom_kills": w.hits.oom_kills,
        "pids_refused": w.hits.pids_refused,
        "disk_full": w.hits.disk_full,
        "events": w.events,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(all: bool) -> Capabilities {
        Capabilities {
            cgroup_version: Some(2),
            freezer: true,
            memory_limit: all,
            cpu_limit: true,
            pids_limit: all,
            disk_limit: all,
            seccomp: all,
        }
    }

    #[test]
    fn defaults_apply_requests_raise_them_up_to_the_maximum_and_no_further() {
        let (d, m) = (LocalLimits::DEFAULTS, LocalLimits::MAX);
        let none = sandgate_router::Resources::default();
        let limits = limits_for(&d, &m, &none, &caps(true)).unwrap();
        assert_eq!(limits.memory_bytes, Some(1024 << 20));
        assert_eq!(limits.cpu_millis, Some(1000));
        assert_eq!(limits.pids, Some(512));
        assert_eq!(limits.disk_bytes, Some(2048 << 20));
        let raised = sandgate_router::Resources {
            memory_mb: Some(4096),
            disk_gb: Some(10),
            pids: Some(64),
            ..Default::default()
        };
        let limits = limits_for(&d, &m, &raised, &caps(true)).unwrap();
        assert_eq!(limits.memory_bytes, Some(4096 << 20));
        assert_eq!(limits.disk_bytes, Some(10 << 30));
        assert_eq!(limits.pids, Some(64));
        let too_many = sandgate_router::Resources {
            pids: Some(5000),
            ..Default::default()
        };
        let err = limits_for(&d, &m, &too_many, &caps(true)).unwrap_err();
        assert!(err.contains("pids = 5000 is above"), "{err}");
        let above = sandgate_router::Resources {
            cpu: Some(8.0),
            ..Default::default()
        };
        let err = limits_for(&d, &m, &above, &caps(true)).unwrap_err();
        assert!(
            err.contains("cpu = 8 is above") && err.contains("[local.max]"),
            "{err}"
        );
    }

    #[test]
    fn what_cannot_be_enforced_is_left_out_and_named() {
        let none = sandgate_router::Resources::default();
        let (d, m) = (LocalLimits::DEFAULTS, LocalLimits::MAX);
        let limits = limits_for(&d, &m, &none, &caps(false)).unwrap();
        assert_eq!(
            (limits.memory_bytes, limits.pids, limits.disk_bytes),
            (None, None, None)
        );
        assert_eq!(
            unenforced(&caps(false)),
            ["memory", "pids", "disk", "seccomp"]
        );
        assert!(unenforced(&caps(true)).is_empty());
    }

    #[test]
    fn defaults_above_the_maximum_are_refused_by_name() {
        let defaults = LocalLimits {
            pids: Some(10_000),
            ..LocalLimits::default()
        }
        .resolve(LocalLimits::DEFAULTS);
        let why = defaults.exceeds(&LocalLimits::MAX).unwrap();
        assert!(why.contains("defaults.pids = 10000"), "{why}");
        assert!(LocalLimits::DEFAULTS.exceeds(&LocalLimits::MAX).is_none());
    }
}
