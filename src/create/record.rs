//! The placement record: why a sandbox's candidate list is what it is.
//!
//! Written once, when the create is accepted, from the same router evaluation that produced
//! the candidates ([`sandgate_router::route_explained`]), and stored with the sandbox. It
//! answers "why did it land there" after the fact, when the measurements that ranked the
//! pools have moved on, and it survives restarts because it lives in the store.
//!
//! Shape (`GET /v1/sandboxes/{id}` → `placement_record`):
//!
//! ```json
//! {
//!   "recorded_ms": 1764600000000,
//!   "source": "gateway",
//!   "context": {"stats_window_secs": 3600, "existing_sandboxes": 2,
//!               "workspace_order": null, "free_capacity": {"pool-a": 3}},
//!   "explanation": { ... POST /v1/routes:explain's answer at create time ... },
//!   "candidates": ["pool-a", "pool-b"],
//!   "excluded": [{"pool": "pool-c", "reason": "snapshot: ..."}]
//! }
//! ```
//!
//! `explanation` is `POST /v1/routes:explain`'s answer for the same inputs, except that it
//! lists every candidate but at most [`INELIGIBLE_POOLS_KEPT`] of the pools that did not
//! qualify (in configuration order; `explanation.ineligible_omitted` counts the rest), so
//! that recording costs what routing costs on a topology of thousands of pools.
//! `candidates` is the list the failover walk uses: `explanation.order` minus the pools in
//! `excluded` (a snapshot restorable only on some pools narrows it after routing).
//! `existing_sandboxes` counts the placements read for affinity, anti-affinity and spread
//! (only read when the request has such terms).

use serde::Serialize;
use serde_json::Value;

use sandgate_router::{Explanation, Route, RouteContext};

use super::StoredCandidate;
use crate::store::snapshots::{SnapshotRow, FILESYSTEM_EXPORT};

/// Ineligible pools a record explains at most.
pub const INELIGIBLE_POOLS_KEPT: usize = 16;

#[derive(Debug, Serialize)]
pub struct PlacementRecord<'a> {
    recorded_ms: i64,
    source: &'static str,
    context: Context<'a>,
    explanation: &'a Explanation,
    candidates: Vec<&'a str>,
    excluded: Vec<Excluded>,
}

#[derive(Debug, Serialize)]
struct Context<'a> {
    stats_window_secs: u64,
    existing_sandboxes: usize,
    workspace_order: Option<&'a [String]>,
    free_capacity: std::collections::BTreeMap<&'a str, u64>,
}

#[derive(Debug, Serialize)]
struct Excluded {
    pool: String,
    reason: String,
}

impl<'a> PlacementRecord<'a> {
    /// `snapshot` is the create's snapshot and its route; `kept` the candidates that survived
    /// the restorability filter (all of the route's without a snapshot).
    pub fn new(
        recorded_ms: i64,
        ctx: &'a RouteContext,
        stats_window_secs: u64,
        explanation: &'a Explanation,
        snapshot: Option<(&SnapshotRow, &Route)>,
        kept: &'a [StoredCandidate],
    ) -> PlacementRecord<'a> {
        let excluded = snapshot
            .map(|(row, route)| {
                route
                    .candidates
                    .iter()
                    .filter(|c| !kept.iter().any(|k| k.pool == *c.pool))
                    .map(|c| Excluded {
                        pool: c.pool.to_string(),
                        reason: unrestorable_reason(row),
                    })
                    .collect()
            })
            .unwrap_or_default();
        PlacementRecord {
            recorded_ms,
            source: "gateway",
            context: Context {
                stats_window_secs,
                existing_sandboxes: ctx.sandboxes.len(),
                workspace_order: ctx.workspace_order.as_deref(),
                free_capacity: ctx
                    .free_capacity
                    .iter()
                    .map(|(k, v)| (k.as_str(), *v))
                    .collect(),
            },
            explanation,
            candidates: kept.iter().map(|c| c.pool.as_str()).collect(),
            excluded,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "null".into())
    }
}

/// Why a snapshot cannot seed a sandbox on a pool the route ranked.
pub fn unrestorable_reason(snapshot: &SnapshotRow) -> String {
    if snapshot.kind == FILESYSTEM_EXPORT {
        "snapshot: a filesystem export is restored through the files API; this pool does not write files".to_string()
    } else {
        format!(
            "snapshot: a provider snapshot is restored only on pool {} ({}) where it was taken; a filesystem export (POST /v1/sandboxes/{{id}}/snapshot {{\"kind\": \"filesystem\"}}) can continue on another provider",
            snapshot.pool, snapshot.provider
        )
    }
}

/// The stored record as JSON (`null` for sandboxes created before records were kept).
pub fn stored(json: Option<&str>) -> Value {
    json.and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or(Value::Null)
}
