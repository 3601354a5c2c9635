//! What the caller measured and knows at routing time. The router never reads clocks or stores.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// Recent measurements for one pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolStats {
    /// Recent startup latencies (creation attempt to running), in milliseconds.
    pub startup_latency_ms: Vec<f64>,
    /// Eligible creation attempts on this pool.
    pub attempts: u64,
    /// Of those, attempts that reached a running sandbox.
    pub successes: u64,
}

impl PoolStats {
    /// Median of the samples; `None` without samples.
    pub fn median_startup_latency_ms(&self) -> Option<f64> {
        // Routing takes a median per eligible pool; keep the usual handful of samples off the heap.
        let mut stack = [0f64; 64];
        let mut heap = Vec::new();
        let finite = self
            .startup_latency_ms
            .iter()
            .copied()
            .filter(|v| v.is_finite());
        let s: &mut [f64] = if self.startup_latency_ms.len() <= stack.len() {
            let mut n = 0;
            for v in finite {
                stack[n] = v;
                n += 1;
            }
            &mut stack[..n]
        } else {
            heap.extend(finite);
            &mut heap
        };
        if s.is_empty() {
            return None;
        }
        let mid = s.len() / 2;
        let (_, hi, _) = s.select_nth_unstable_by(mid, f64::total_cmp);
        let hi = *hi;
        if s.len() % 2 == 1 {
            Some(hi)
        } else {
            let lo = s[..mid].iter().copied().fold(f64::NEG_INFINITY, f64::max);
            Some((lo + hi) / 2.0)
        }
    }

    /// Share of attempts that reached running; `None` without attempts.
    pub fn creation_success(&self) -> Option<f64> {
        (self.attempts > 0).then(|| self.successes.min(self.attempts) as f64 / self.attempts as f64)
    }
}

/// An existing sandbox, for affinity, anti-affinity and spread.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExistingSandbox {
    pub labels: BTreeMap<String, String>,
    /// Provider name (as configured).
    pub provider: String,
    pub region: Option<String>,
    pub zone: Option<String>,
}

/// Band widths for ranking. A width of `0` compares exact values.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Bands {
    /// Price is configured, not measured, so it compares exactly by default.
    pub price: f64,
    pub startup_latency_ms: f64,
    /// As a share (0.05 = five percentage points).
    pub creation_success: f64,
}

impl Default for Bands {
    fn default() -> Self {
        Bands {
            price: 0.0,
            startup_latency_ms: 250.0,
            creation_success: 0.05,
        }
    }
}

/// Everything besides the topology and the request that routing depends on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RouteContext {
    /// Keyed by pool name.
    pub stats: HashMap<String, PoolStats>,
    pub sandboxes: Vec<ExistingSandbox>,
    /// The workspace's Auto order (provider names, may include `"standby"`).
    pub workspace_order: Option<Vec<String>>,
    /// Measured free capacity keyed by pool name; falls back to the pool's configured capacity.
    pub free_capacity: HashMap<String, u64>,
    pub bands: Bands,
}
