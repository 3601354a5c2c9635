//! What `GET /v1/pools` (and `sandgate pools`) shows: every configured pool with where it is,
//! what it isolates with, how it enforces egress, its capacity, the measurements routing ranks
//! it by, its recent failures, and whether its account passed its last check.
//!
//! The measurements are the routing ones, not a copy: the same in-memory stats window
//! ([`PoolWindow::stats`]) and the same [`PoolStats`] accessors, so what this shows is what
//! the next create would be ranked with.
//!
//! Account checks: each hosted account is checked once (through any one of its pools'
//! adapters, [`Provider::check`]) when the server starts, in the background, and then every
//! `[create] account_check_interval_secs`; the last result is kept in memory only (a restart
//! checks again). Local and simulated accounts have nothing remote to check.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use sandgate_router::{IsolationMode, Pool, PoolStats, ProviderKind};

use super::{now_ms, Coordinator};
use crate::providers::{hosted, Provider};
use crate::store::StoreError;

/// How long one account check may take before it counts as failed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// `GET /v1/pools`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PoolsView {
    /// Every configured pool, in name order.
    pub pools: Vec<PoolView>,
    /// The stats window (`[create] stats_window_secs`) the measurements and
    /// `recent_failures` cover, in seconds.
    pub window_secs: u64,
}

/// One pool.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PoolView {
    pub pool: String,
    /// The provider's name in `[[providers]]`.
    pub provider: String,
    /// The provider's built-in kind (`e2b`, `local`, `simulated`, ...).
    pub provider_kind: String,
    /// The account (`[[accounts]]`) whose credentials the pool's attempts use.
    pub account: String,
    pub geography: Option<String>,
    /// Normalized as routing compares it.
    pub region: Option<String>,
    pub zone: Option<String>,
    /// The complete isolation modes the pool offers (`{"kind": "microvm", ...}`); empty
    /// means unknown, which never satisfies `features.isolation`.
    #[schema(value_type = Vec<Object>)]
    pub isolation: Vec<IsolationMode>,
    /// `native`, `gateway`, `advisory` or `none`.
    pub egress: String,
    /// The pool's labels, as `placement.labels` matches them: the configured ones, and on
    /// the default local pool what sandgate declares of this machine
    /// (`sandgate.unenforced_limits`, `sandgate.users`).
    pub labels: BTreeMap<String, String>,
    /// What the router may place on the pool for: the kind's table, narrowed to what its
    /// adapter does and by the configuration.
    pub capabilities: CapabilitiesView,
    /// The Standby Pool: used only when an order includes `"standby"`.
    pub standby: bool,
    /// Configured capacity; `null` when none is configured (unlimited to routing).
    pub capacity: Option<u64>,
    /// `capacity` minus `live` (never below 0); `null` without a configured capacity.
    pub free_capacity: Option<u64>,
    /// Sandboxes placed on the pool now (running, paused or stopped).
    pub live: u64,
    pub startup_latency_ms: LatencyView,
    pub creation_success: SuccessView,
    /// Attempts on the pool that ended with an error class within the window, by class.
    pub recent_failures: BTreeMap<String, u64>,
    /// The last check of the pool's account (shared by every pool on the account).
    pub account_check: AccountCheck,
    /// The pool's circuit breaker in this process (`closed`, `open`: creates skip the pool,
    /// `half_open`: the next create probes it); see `[create] circuit_failure_threshold`.
    pub circuit: super::circuit::CircuitView,
}

/// A pool's declared capabilities, as the router matches requests against them.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CapabilitiesView {
    /// Portable environments accepted as `source.environment`.
    pub environments: Vec<String>,
    /// Whether `source.image` (an OCI image) and `source.template` are accepted.
    pub image: bool,
    pub template: bool,
    /// When set, only these template names are accepted.
    pub templates: Option<Vec<String>>,
    /// Each boolean feature by its request path without `features.` (`process.execute`,
    /// `filesystem.list`, `pause_resume`, ...).
    pub features: BTreeMap<String, bool>,
}

impl CapabilitiesView {
    fn of(caps: &sandgate_router::Capabilities) -> CapabilitiesView {
        CapabilitiesView {
            environments: caps.environments.clone(),
            image: caps.image,
            template: caps.template,
            templates: caps.templates.clone(),
            features: caps
                .feature_flags()
                .into_iter()
                .map(|(path, on)| (path.trim_start_matches("features.").to_string(), on))
                .collect(),
        }
    }
}

/// Startup latency as routing ranks it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct LatencyView {
    /// Median, in milliseconds, over `samples`; `null` without samples.
    pub median: Option<f64>,
    /// The successful attempts in the window the median is taken over (the newest ones,
    /// at most as many as routing uses).
    pub samples: u64,
}

/// Creation success as routing ranks it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SuccessView {
    /// `successes / attempts`; `null` without attempts.
    pub share: Option<f64>,
    /// Creation attempts on the pool within the window.
    pub attempts: u64,
    /// Of those, the ones that reached a running sandbox.
    pub successes: u64,
}

/// The last check of an account.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct AccountCheck {
    pub status: CheckStatus,
    /// When the last check ended (Unix milliseconds); `null` before any.
    pub checked_ms: Option<i64>,
    /// What the check reached, or why it failed (the provider's message, which adapters
    /// keep free of secrets), or why the account is not checked.
    pub message: Option<String>,
    /// The failure's error class (`authority`, `outage`, ...); `null` unless the provider
    /// answered a failure.
    pub error_class: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    /// The last check's authenticated call succeeded.
    Passed,
    /// The last check failed, or the account cannot work as configured (no API key named).
    Failed,
    /// A hosted account not checked yet (or checks are off).
    NotChecked,
    /// Nothing remote to check (local and simulated accounts, kinds without an adapter).
    NotApplicable,
}

impl AccountCheck {
    fn fixed(status: CheckStatus, message: impl Into<String>) -> AccountCheck {
        AccountCheck {
            status,
            checked_ms: None,
            message: Some(message.into()),
            error_class: None,
        }
    }
}

/// The last check of each hosted account, by account name.
#[derive(Default)]
pub(super) struct AccountChecks(Mutex<HashMap<String, AccountCheck>>);

impl AccountChecks {
    fn get(&self, account: &str) -> Option<AccountCheck> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(account)
            .cloned()
    }

    fn set(&self, account: String, check: AccountCheck) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(account, check);
    }
}

/// How an account is checked.
enum Checkable {
    /// Through this adapter (one of its pools').
    Adapter(Arc<dyn Provider>),
    /// Not at all: its status is known without calling anything.
    Fixed(AccountCheck),
}

impl Coordinator {
    /// Every configured pool with its placement facts, capacity, measurements, recent
    /// failures and account check.
    pub async fn pools(&self) -> Result<PoolsView, StoreError> {
        let window_secs = self.deps.config.stats_window_secs;
        let since = window_start(now_ms(), window_secs);
        let live = self.deps.store.live_counts_by_pool().await?;
        let mut failures = self.deps.store.recent_failures_by_pool(since).await?;
        let mut stats = self.window_stats(since);
        let checks = self.account_check_views();
        let topology = &self.deps.topology;
        let mut pools: Vec<PoolView> = topology
            .pools()
            .iter()
            .map(|pool| {
                let name = pool.name.as_ref();
                let account = topology.accounts()[pool.account].name.to_string();
                let live = live.get(name).copied().unwrap_or(0);
                Parts {
                    stats: stats.remove(name).unwrap_or_default(),
                    recent_failures: failures.remove(name).unwrap_or_default(),
                    account_check: checks.get(&account).cloned().unwrap_or_else(|| {
                        AccountCheck::fixed(CheckStatus::NotChecked, "not checked")
                    }),
                    circuit: self.circuits.view(name),
                    account,
                    live,
                }
                .build(topology, pool)
            })
            .collect();
        pools.sort_by(|a, b| a.pool.cmp(&b.pool));
        Ok(PoolsView { pools, window_secs })
    }

    /// One check of every hosted account, concurrently; each result replaces the last.
    pub async fn check_accounts(&self) {
        let targets: Vec<(String, Arc<dyn Provider>)> = self
            .checkable_accounts()
            .into_iter()
            .filter_map(|(account, how)| match how {
                Checkable::Adapter(adapter) => Some((account, adapter)),
                Checkable::Fixed(_) => None,
            })
            .collect();
        let checks = targets.iter().map(|(account, adapter)| async move {
            let check = check_one(adapter.as_ref()).await;
            match check.status {
                CheckStatus::Passed => tracing::debug!(account, "account check passed"),
                _ => tracing::warn!(
                    account,
                    class = check.error_class.as_deref().unwrap_or("-"),
                    message = check.message.as_deref().unwrap_or(""),
                    "account check failed"
                ),
            }
            (account.clone(), check)
        });
        for (account, check) in futures_util::future::join_all(checks).await {
            self.account_checks.set(account, check);
        }
    }

    /// The account check loop: at once, then every `[create] account_check_interval_secs`.
    /// `None` when checks are off or there is no hosted account to check.
    pub(super) fn spawn_account_checks(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let secs = self.deps.config.account_check_interval_secs;
        let any = self
            .checkable_accounts()
            .values()
            .any(|how| matches!(how, Checkable::Adapter(_)));
        if secs == 0 || !any {
            return None;
        }
        let this = self.clone();
        Some(tokio::spawn(async move {
            let every = Duration::from_secs(secs);
            loop {
                this.check_accounts().await;
                tokio::time::sleep(every).await;
            }
        }))
    }

    /// The routing stats of every pool with samples since `since` (ms): what routing ranks
    /// by (`route_context_for`) and what `GET /v1/pools` shows.
    pub(super) fn window_stats(&self, since: i64) -> HashMap<String, PoolStats> {
        let mut windows = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        super::context::stats(&mut windows, since)
    }

    /// Each pool's account's current check, by account name.
    fn account_check_views(&self) -> HashMap<String, AccountCheck> {
        let off = self.deps.config.account_check_interval_secs == 0;
        self.checkable_accounts()
            .into_iter()
            .map(|(account, how)| {
                let check = match how {
                    Checkable::Fixed(check) => check,
                    Checkable::Adapter(_) => {
                        self.account_checks.get(&account).unwrap_or_else(|| {
                            let why = if off {
                                "account checks are off ([create] account_check_interval_secs = 0)"
                            } else {
                                "the first check has not finished yet"
                            };
                            AccountCheck::fixed(CheckStatus::NotChecked, why)
                        })
                    }
                };
                (account, check)
            })
            .collect()
    }

    /// Every account with a pool, once, and how it is checked.
    fn checkable_accounts(&self) -> BTreeMap<String, Checkable> {
        let topology = &self.deps.topology;
        let mut out = BTreeMap::new();
        for pool in topology.pools() {
            let account = &topology.accounts()[pool.account];
            if out.contains_key(account.name.as_ref()) {
                continue;
            }
            let kind = topology.providers()[account.provider].kind;
            let how = match kind {
                ProviderKind::Local | ProviderKind::Simulated => {
                    Checkable::Fixed(AccountCheck::fixed(
                        CheckStatus::NotApplicable,
                        format!("{} has no remote account to check", kind.as_str()),
                    ))
                }
                _ if !hosted::has_adapter(kind) => Checkable::Fixed(AccountCheck::fixed(
                    CheckStatus::NotApplicable,
                    format!(
                        "this build has no {} adapter; its pools' attempts advance as unsupported",
                        kind.as_str()
                    ),
                )),
                _ if !account.bound => Checkable::Fixed(AccountCheck::fixed(
                    CheckStatus::Failed,
                    "no API key is named (api_key_env, api_key_file or credential); its pools' attempts advance as unbound_account",
                )),
                // Any pool of the account will do: they share the account's one adapter.
                _ => match self.account_adapter(pool.account) {
                    Some(adapter) => Checkable::Adapter(adapter),
                    None => Checkable::Fixed(AccountCheck::fixed(
                        CheckStatus::NotChecked,
                        "no adapter was built for this account",
                    )),
                },
            };
            out.insert(account.name.to_string(), how);
        }
        out
    }

    fn account_adapter(&self, account: usize) -> Option<Arc<dyn Provider>> {
        self.deps
            .topology
            .pools()
            .iter()
            .filter(|p| p.account == account)
            .find_map(|p| self.deps.providers.for_pool(&p.name))
    }
}

/// A pool's live figures, completed into its view by [`Parts::build`].
struct Parts {
    stats: PoolStats,
    recent_failures: BTreeMap<String, u64>,
    account_check: AccountCheck,
    circuit: super::circuit::CircuitView,
    account: String,
    live: u64,
}

impl Parts {
    fn build(self, topology: &sandgate_router::Topology, pool: &Pool) -> PoolView {
        let provider = &topology.providers()[pool.provider];
        PoolView {
            pool: pool.name.to_string(),
            provider: provider.name.to_string(),
            provider_kind: provider.kind.as_str().to_string(),
            account: self.account,
            geography: pool.geography.clone(),
            region: pool.region.as_deref().map(str::to_string),
            zone: pool.zone.as_deref().map(str::to_string),
            isolation: pool.capabilities.isolation.clone(),
            egress: pool.capabilities.egress.as_str().to_string(),
            labels: pool.labels.clone(),
            capabilities: CapabilitiesView::of(&pool.capabilities),
            standby: pool.standby,
            capacity: pool.capacity,
            // The same rule as routing's free capacity (`route_context_for`).
            free_capacity: pool.capacity.map(|c| c.saturating_sub(self.live)),
            live: self.live,
            startup_latency_ms: LatencyView {
                median: self.stats.median_startup_latency_ms(),
                samples: self.stats.startup_latency_ms.len() as u64,
            },
            creation_success: SuccessView {
                share: self.stats.creation_success(),
                attempts: self.stats.attempts,
                successes: self.stats.successes,
            },
            recent_failures: self.recent_failures,
            account_check: self.account_check,
            circuit: self.circuit,
        }
    }
}

/// One account check, bounded by [`CHECK_TIMEOUT`].
async fn check_one(adapter: &dyn Provider) -> AccountCheck {
    let outcome = tokio::time::timeout(CHECK_TIMEOUT, adapter.check()).await;
    let checked_ms = Some(now_ms());
    let (status, message, error_class) = match outcome {
        Ok(Ok(what)) => (CheckStatus::Passed, what, None),
        Ok(Err(e)) => (
            CheckStatus::Failed,
            e.message,
            Some(e.class.as_str().to_string()),
        ),
        Err(_) => (
            CheckStatus::Failed,
            format!(
                "the provider did not answer within {} s",
                CHECK_TIMEOUT.as_secs()
            ),
            None,
        ),
    };
    AccountCheck {
        status,
        checked_ms,
        message: Some(message),
        error_class,
    }
}

/// The start of a window of `secs` ending at `now` (saturating: any configured window is
/// valid input).
fn window_start(now: i64, secs: u64) -> i64 {
    let ms = i64::try_from(secs).unwrap_or(i64::MAX).saturating_mul(1000);
    now.saturating_sub(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_start_saturates() {
        assert_eq!(window_start(10_000, 3), 7_000);
        assert_eq!(window_start(10_000, u64::MAX), 10_000 - i64::MAX);
        assert_eq!(window_start(i64::MIN, 1), i64::MIN);
        assert_eq!(window_start(0, 0), 0);
    }

    #[test]
    fn check_status_serializes_as_the_documented_names() {
        let names: Vec<String> = [
            CheckStatus::Passed,
            CheckStatus::Failed,
            CheckStatus::NotChecked,
            CheckStatus::NotApplicable,
        ]
        .iter()
        .map(|s| {
            serde_json::to_value(s)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
        assert_eq!(names, ["passed", "failed", "not_checked", "not_applicable"]);
    }
}
