//! The measured routing context: everything routing depends on besides the topology and
//! the request (per-pool latency and success in the stats window, existing placements for
//! affinity and spread, free capacity, the workspace's Auto order, the `[create]` bands).
//!
//! One assembly for both consumers, so "why did it land there" has one answer: the
//! coordinator (creates and `POST /v1/routes:explain`) takes the per-pool stats from its
//! in-memory window, which it fills from the same samples it writes to the store; `sandgate
//! route explain` without `--url` rebuilds that window from the store's samples
//! ([`Inputs::from_store`]). Both then go through [`Inputs::assemble`] and [`stats`].

use std::collections::{BTreeMap, HashMap};

use sandgate_router::{Bands, ExistingSandbox, PoolStats, Request, RouteContext, Topology};

use super::Placement;
use crate::config::CreateConfig;
use crate::store::{Store, StoreError};

/// What the context is read from.
pub struct Inputs<'a> {
    pub store: &'a Store,
    pub topology: &'a Topology,
    pub config: &'a CreateConfig,
}

/// What [`Inputs::from_store`] read, for the CLI to say which source it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreReading {
    /// Samples inside the stats window.
    pub samples: usize,
    /// Placements read for affinity, anti-affinity and spread.
    pub sandboxes: usize,
}

/// The `[create]` band widths (price is configured, so it compares exactly).
pub fn bands(config: &CreateConfig) -> Bands {
    Bands {
        price: 0.0,
        startup_latency_ms: config.startup_latency_band_ms,
        creation_success: config.creation_success_band,
    }
}

/// The per-pool stats of `windows`, dropping samples older than `since` (ms).
pub(crate) fn stats(
    windows: &mut HashMap<String, PoolWindow>,
    since: i64,
) -> HashMap<String, PoolStats> {
    windows
        .iter_mut()
        .map(|(pool, w)| (pool.clone(), w.stats(since, LATENCY_SAMPLES)))
        .collect()
}

impl Inputs<'_> {
    /// The context from the store alone: the stats window rebuilt from the recorded samples
    /// (what the coordinator's window holds, since it records every sample it keeps).
    pub async fn from_store(
        &self,
        request: Option<&Request>,
        workspace: Option<&str>,
    ) -> Result<(RouteContext, StoreReading), StoreError> {
        let since = crate::base::clock::now_ms() - self.config.stats_window_secs as i64 * 1000;
        let rows = self.store.samples_since(since).await?;
        let samples = rows.len();
        let mut windows: HashMap<String, PoolWindow> = HashMap::new();
        for (pool, at, success, latency) in rows {
            windows.entry(pool).or_default().push(at, success, latency);
        }
        let ctx = self
            .assemble(stats(&mut windows, since), request, workspace)
            .await?;
        let sandboxes = ctx.sandboxes.len();
        Ok((ctx, StoreReading { samples, sandboxes }))
    }

    /// The context around already computed per-pool `stats`. Existing placements are read
    /// only when the request (or no request: everything) compares against them.
    pub async fn assemble(
        &self,
        stats: HashMap<String, PoolStats>,
        request: Option<&Request>,
        workspace: Option<&str>,
    ) -> Result<RouteContext, StoreError> {
        let needs_placements = request.is_none_or(|r| {
            let t = &r.routing;
            !t.spread.is_empty()
                || !t.sandbox_affinity.required.is_empty()
                || !t.sandbox_affinity.preferred.is_empty()
                || !t.sandbox_anti_affinity.required.is_empty()
                || !t.sandbox_anti_affinity.preferred.is_empty()
        });
        let sandboxes = if needs_placements {
            self.existing_sandboxes().await?
        } else {
            Vec::new()
        };
        Ok(RouteContext {
            stats,
            sandboxes,
            workspace_order: workspace.and_then(|w| self.config.workspace_order.get(w).cloned()),
            free_capacity: self.free_capacity().await?,
            bands: bands(self.config),
        })
    }

    async fn existing_sandboxes(&self) -> Result<Vec<ExistingSandbox>, StoreError> {
        let mut sandboxes = Vec::new();
        for (labels, placement) in self.store.live_placements().await? {
            let (Ok(labels), Ok(p)) = (
                serde_json::from_str::<BTreeMap<String, String>>(&labels),
                serde_json::from_str::<Placement>(&placement),
            ) else {
                continue;
            };
            sandboxes.push(ExistingSandbox {
                labels,
                provider: p.provider,
                region: p.region,
                zone: p.zone,
            });
        }
        Ok(sandboxes)
    }

    /// Free capacity = configured capacity minus the sandboxes living on the pool now.
    async fn free_capacity(&self) -> Result<HashMap<String, u64>, StoreError> {
        let live = self.store.live_counts_by_pool().await?;
        Ok(self
            .topology
            .pools()
            .iter()
            .filter_map(|pool| {
                let capacity = pool.capacity?;
                let used = live.get(pool.name.as_ref()).copied().unwrap_or(0);
                Some((pool.name.to_string(), capacity.saturating_sub(used)))
            })
            .collect())
    }
}

/// Latency samples per pool the router takes its median over.
pub(crate) const LATENCY_SAMPLES: usize = 64;
/// Samples kept per pool at most, whatever the window.
const MAX_SAMPLES_PER_POOL: usize = 100_000;

/// One pool's samples in the stats window, with a running success count.
#[derive(Default)]
pub(crate) struct PoolWindow {
    samples: std::collections::VecDeque<(i64, bool, Option<f64>)>,
    successes: u64,
}

impl PoolWindow {
    pub(crate) fn push(&mut self, at: i64, success: bool, latency: Option<f64>) {
        self.samples.push_back((at, success, latency));
        self.successes += success as u64;
        if self.samples.len() > MAX_SAMPLES_PER_POOL {
            self.pop();
        }
    }

    fn pop(&mut self) {
        if let Some((_, success, _)) = self.samples.pop_front() {
            self.successes -= success as u64;
        }
    }

    pub(crate) fn stats(&mut self, since: i64, latencies: usize) -> PoolStats {
        while self.samples.front().is_some_and(|s| s.0 < since) {
            self.pop();
        }
        let startup_latency_ms = self
            .samples
            .iter()
            .rev()
            .filter(|s| s.1)
            .filter_map(|s| s.2)
            .take(latencies)
            .collect();
        PoolStats {
            startup_latency_ms,
            attempts: self.samples.len() as u64,
            successes: self.successes,
        }
    }
}
