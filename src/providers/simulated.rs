//! `kind = "simulated"`: an in-process provider for tests and demos. It is never configured by
//! default; a pool uses it only when its provider's kind is `simulated`, with settings under
//! `[simulated.<pool>]`:
//!
//! ```toml
//! [simulated.sim-a]
//! latency_ms = { min = 20, max = 80 }   # startup latency, uniform
//! capacity = 10                         # live instances at most (0 = unlimited)
//! faults = { capacity = 0.1, timeout_after_send = 0.05 }   # per-call probabilities
//! script = ["rate_limit", "ok"]         # the first calls' outcomes, in order; then `faults`
//! timeout_ms = 50          # timeout_after_send: the call hangs this long, then "unknown"
//! appear_after_ms = 200    # timeout_after_send: the instance becomes visible this late
//! state_file = "data/sim-a.json"  # keep the inventory across gateway restarts
//! ```
//!
//! Faults: `ok`, `capacity`, `rate_limit`, `quota`, `region_unavailable`, `outage`,
//! `provider_error`, `unsupported`, `unbound_account`, `billing`, `invalid_request` (answered
//! at once, no instance), `timeout_after_send` (an instance is created, the call times out
//! with an unknown outcome, the instance appears after `appear_after_ms`),
//! `fail_before_running` (an instance is created and fails while starting), and
//! `runtime_shortfall` (the instance runs but reports no process or filesystem capability).
//!
//! The inventory of instances is inspectable ([`SimulatedProvider::live_instances`], or the
//! `state_file` JSON) so tests can check that no duplicate capacity was created. With a
//! `state_file` the provider behaves like a remote one that outlives the gateway: instances
//! created before a crash are still there (and finish starting) after a restart.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::base::clock::now_ms;

use super::{
    BoxFuture, CreateSpec, ErrorClass, Instance, InstanceState, Provider, ProviderError,
    RuntimeCapabilities, Tags,
};

/// Fault names accepted in `faults` and `script`.
pub const FAULTS: &[&str] = &[
    "ok",
    "capacity",
    "rate_limit",
    "quota",
    "region_unavailable",
    "outage",
    "provider_error",
    "unsupported",
    "unbound_account",
    "billing",
    "invalid_request",
    "timeout_after_send",
    "fail_before_running",
    "runtime_shortfall",
];

#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LatencyConfig {
    /// Shortest startup latency, in milliseconds.
    pub min: u64,
    /// Longest startup latency, in milliseconds (uniform between `min` and `max`).
    pub max: u64,
}

/// `[simulated.<pool>]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimulatedPoolConfig {
    /// Startup latency distribution (uniform), in milliseconds; default instant.
    pub latency_ms: LatencyConfig,
    /// Live instances the pool holds at most; `0` is unlimited.
    pub capacity: u64,
    /// Per-call probability of each fault (0.0 to 1.0), drawn after the script is used up.
    pub faults: BTreeMap<String, f64>,
    /// Outcomes of the first create calls, in order; afterwards `faults` apply.
    pub script: Vec<String>,
    /// How long a `timeout_after_send` call hangs before reporting an unknown outcome.
    pub timeout_ms: u64,
    /// How long after the call a `timeout_after_send` instance becomes visible.
    pub appear_after_ms: u64,
    /// A JSON file keeping the inventory across restarts (absent: in memory only).
    pub state_file: Option<PathBuf>,
}

impl Default for SimulatedPoolConfig {
    fn default() -> Self {
        SimulatedPoolConfig {
            latency_ms: LatencyConfig::default(),
            capacity: 0,
            faults: BTreeMap::new(),
            script: Vec::new(),
            timeout_ms: 50,
            appear_after_ms: 0,
            state_file: None,
        }
    }
}

impl SimulatedPoolConfig {
    /// Returns the offending field and a message.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.latency_ms.max < self.latency_ms.min {
            return Err(("latency_ms.max".into(), "must be >= latency_ms.min".into()));
        }
        for (name, rate) in &self.faults {
            if !FAULTS.contains(&name.as_str()) {
                return Err((
                    format!("faults.{name}"),
                    format!("unknown fault; expected one of {}", FAULTS.join(", ")),
                ));
            }
            if !(0.0..=1.0).contains(rate) {
                return Err((format!("faults.{name}"), "must be between 0 and 1".into()));
            }
        }
        for (i, name) in self.script.iter().enumerate() {
            if !FAULTS.contains(&name.as_str()) {
                return Err((
                    format!("script[{i}]"),
                    format!(
                        "unknown fault {name:?}; expected one of {}",
                        FAULTS.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("simulated pool {pool}: state file {path}: {reason}")]
pub struct SimulatedError {
    pool: String,
    path: String,
    reason: String,
}

/// One instance in the simulated inventory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimInstance {
    pub id: String,
    pub pool: String,
    pub sandbox_id: String,
    pub attempt_id: String,
    pub created_ms: i64,
    /// Before this the provider does not show the instance (a create that timed out).
    pub visible_ms: i64,
    /// From this time on the instance runs.
    pub ready_ms: i64,
    pub failed: bool,
    pub shortfall: bool,
}

impl SimInstance {
    fn state(&self, now: i64) -> InstanceState {
        if self.failed {
            InstanceState::Failed
        } else if now >= self.ready_ms {
            InstanceState::Running
        } else {
            InstanceState::Starting
        }
    }
    fn view(&self, now: i64) -> Instance {
        Instance {
            id: self.id.clone(),
            tags: Tags {
                sandbox_id: self.sandbox_id.clone(),
                attempt_id: self.attempt_id.clone(),
            },
            state: self.state(now),
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Inventory {
    next_id: u64,
    instances: BTreeMap<String, SimInstance>,
    deleted: Vec<String>,
}

pub struct SimulatedProvider {
    pool: String,
    config: SimulatedPoolConfig,
    inventory: Mutex<Inventory>,
    calls: AtomicU64,
}

impl std::fmt::Debug for SimulatedProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedProvider")
            .field("pool", &self.pool)
            .finish()
    }
}

fn random_unit() -> f64 {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 8];
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

impl SimulatedProvider {
    pub fn new(pool: &str, config: SimulatedPoolConfig) -> Result<Self, SimulatedError> {
        let mut inventory = Inventory::default();
        if let Some(path) = &config.state_file {
            match std::fs::read(path) {
                Ok(bytes) => {
                    inventory = serde_json::from_slice(&bytes).map_err(|e| SimulatedError {
                        pool: pool.into(),
                        path: path.display().to_string(),
                        reason: e.to_string(),
                    })?
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(SimulatedError {
                        pool: pool.into(),
                        path: path.display().to_string(),
                        reason: e.to_string(),
                    })
                }
            }
        }
        Ok(SimulatedProvider {
            pool: pool.to_string(),
            config,
            inventory: Mutex::new(inventory),
            calls: AtomicU64::new(0),
        })
    }

    /// Every instance that exists at the provider and has not failed or been deleted,
    /// including instances not visible yet.
    pub fn live_instances(&self) -> Vec<SimInstance> {
        let inv = self.inventory.lock().unwrap_or_else(|e| e.into_inner());
        inv.instances
            .values()
            .filter(|i| !i.failed)
            .cloned()
            .collect()
    }

    /// Ids of deleted instances, in deletion order.
    pub fn deleted(&self) -> Vec<String> {
        let inv = self.inventory.lock().unwrap_or_else(|e| e.into_inner());
        inv.deleted.clone()
    }

    /// Create calls received.
    pub fn create_calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    fn persist(&self, inv: &Inventory) {
        if let Some(path) = &self.config.state_file {
            let tmp = path.with_extension("tmp");
            let bytes = serde_json::to_vec_pretty(inv).unwrap_or_default();
            if std::fs::write(&tmp, bytes)
                .and_then(|_| std::fs::rename(&tmp, path))
                .is_err()
            {
                tracing::warn!(pool = %self.pool, "simulated provider could not save its inventory");
            }
        }
    }

    fn pick_fault(&self, call: u64) -> String {
        if let Some(f) = self.config.script.get(call as usize) {
            return f.clone();
        }
        for (name, rate) in &self.config.faults {
            if *rate > 0.0 && random_unit() < *rate {
                return name.clone();
            }
        }
        "ok".into()
    }

    fn latency(&self) -> u64 {
        let LatencyConfig { min, max } = self.config.latency_ms;
        if max <= min {
            return min;
        }
        min + (random_unit() * (max - min + 1) as f64) as u64
    }

    fn add_instance(
        &self,
        spec: &CreateSpec,
        visible_ms: i64,
        ready_ms: i64,
        shortfall: bool,
    ) -> String {
        let mut inv = self.inventory.lock().unwrap_or_else(|e| e.into_inner());
        inv.next_id += 1;
        let id = format!("sim-{}-{}", self.pool, inv.next_id);
        inv.instances.insert(
            id.clone(),
            SimInstance {
                id: id.clone(),
                pool: self.pool.clone(),
                sandbox_id: spec.tags.sandbox_id.clone(),
                attempt_id: spec.tags.attempt_id.clone(),
                created_ms: now_ms(),
                visible_ms,
                ready_ms,
                failed: false,
                shortfall,
            },
        );
        self.persist(&inv);
        id
    }

    async fn do_create(&self, spec: CreateSpec) -> Result<Instance, ProviderError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        let fault = self.pick_fault(call);
        let immediate = |class: ErrorClass| {
            Err(ProviderError::new(
                class,
                format!("simulated {} on pool {}", class.as_str(), self.pool),
            ))
        };
        if self.config.capacity > 0 {
            let live = {
                let inv = self.inventory.lock().unwrap_or_else(|e| e.into_inner());
                inv.instances.values().filter(|i| !i.failed).count() as u64
            };
            if live >= self.config.capacity {
                return immediate(ErrorClass::Capacity);
            }
        }
        let latency = self.latency();
        let now = now_ms();
        match fault.as_str() {
            "ok" | "runtime_shortfall" => {
                let id = self.add_instance(
                    &spec,
                    now,
                    now + latency as i64,
                    fault == "runtime_shortfall",
                );
                tokio::time::sleep(Duration::from_millis(latency)).await;
                let inv = self.inventory.lock().unwrap_or_else(|e| e.into_inner());
                match inv.instances.get(&id) {
                    Some(i) => Ok(i.view(now_ms().max(i.ready_ms))),
                    None => Err(ProviderError::new(
                        ErrorClass::FailedBeforeRunning,
                        "instance was deleted while starting",
                    )),
                }
            }
            "fail_before_running" => {
                let id = self.add_instance(&spec, now, i64::MAX, false);
                tokio::time::sleep(Duration::from_millis(latency)).await;
                let mut inv = self.inventory.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(i) = inv.instances.get_mut(&id) {
                    i.failed = true;
                }
                self.persist(&inv);
                Err(ProviderError {
                    class: ErrorClass::FailedBeforeRunning,
                    message: format!(
                        "simulated instance on pool {} failed while starting",
                        self.pool
                    ),
                    instance_id: Some(id),
                    retry_after: None,
                    maybe_created: false,
                })
            }
            "timeout_after_send" => {
                let visible = now + self.config.appear_after_ms as i64;
                self.add_instance(&spec, visible, visible + latency as i64, false);
                tokio::time::sleep(Duration::from_millis(self.config.timeout_ms)).await;
                Err(ProviderError::new(
                    ErrorClass::Unknown,
                    format!(
                        "simulated timeout after the create request was sent to pool {}",
                        self.pool
                    ),
                ))
            }
            other => immediate(ErrorClass::from_name(other).unwrap_or(ErrorClass::ProviderError)),
        }
    }
}

impl Provider for SimulatedProvider {
    fn kind(&self) -> &'static str {
        "simulated"
    }

    fn process_local(&self) -> bool {
        true
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(self.do_create(spec))
    }

    fn get<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        Box::pin(async move {
            let now = now_ms();
            let inv = self.inventory.lock().unwrap_or_else(|e| e.into_inner());
            Ok(inv
                .instances
                .get(instance_id)
                .filter(|i| now >= i.visible_ms)
                .map(|i| i.view(now)))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            let now = now_ms();
            let inv = self.inventory.lock().unwrap_or_else(|e| e.into_inner());
            Ok(inv
                .instances
                .values()
                .filter(|i| now >= i.visible_ms && i.sandbox_id == sandbox_id)
                .filter(|i| attempt_id.is_none_or(|a| a == i.attempt_id))
                .map(|i| i.view(now))
                .collect())
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let mut inv = self.inventory.lock().unwrap_or_else(|e| e.into_inner());
            if inv.instances.remove(instance_id).is_some() {
                inv.deleted.push(instance_id.to_string());
                self.persist(&inv);
            }
            Ok(())
        })
    }

    fn capabilities<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<RuntimeCapabilities, ProviderError>> {
        Box::pin(async move {
            let inv = self.inventory.lock().unwrap_or_else(|e| e.into_inner());
            match inv.instances.get(instance_id) {
                Some(i) if i.shortfall => Ok(RuntimeCapabilities::NONE),
                Some(_) => Ok(RuntimeCapabilities::FULL),
                None => Err(ProviderError::new(
                    ErrorClass::ProviderError,
                    format!("no instance {instance_id}"),
                )),
            }
        })
    }
}

/// Counts of live instances per sandbox id (a count above one is duplicate capacity).
pub fn per_sandbox(instances: &[SimInstance]) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for i in instances {
        *out.entry(i.sandbox_id.clone()).or_insert(0) += 1;
    }
    out
}
