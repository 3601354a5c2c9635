//! Replicas of one deployment and the policy each serves.
//!
//! Policies reach replicas as files (`[policy] dir`, e.g. a mounted Kubernetes ConfigMap),
//! and each replica reloads them on its own (`[policy] reload_interval_ms`). During a
//! rollout, or when a mount lags, replicas can serve different policies; that must be
//! visible, not guessed. Every replica therefore writes a heartbeat to the shared store
//! every [`HEARTBEAT`]: its id, role, policy generation and the generation's content
//! digest (`PolicyReport::digest`). `GET /v1/policies` on any replica lists the live ones
//! (seen within [`LIVE_FOR`]) and says whether they agree: they do exactly when every live
//! replica serves the same digest (generation counters are local, so they may differ).
//!
//! Metrics (per replica): `sandgate_policy_generation` (gauge) and
//! `sandgate_policy_info{digest}` = 1, so an alert can compare digests across replicas.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::base::clock::now_ms;
use crate::policy::PolicyEngine;
use crate::store::replicas::ReplicaRow;
use crate::store::{Store, StoreError};

/// How often a replica refreshes its heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// A replica not seen for this long is gone.
pub const LIVE_FOR: Duration = Duration::from_secs(20);

/// This process, as the other replicas see it.
#[derive(Debug, Clone)]
pub struct Replica {
    /// `$HOSTNAME` (a Kubernetes pod's name) when set, plus a random suffix: unique even when
    /// two processes share a host name.
    pub id: String,
    pub role: crate::config::Role,
    pub started_ms: i64,
}

impl Replica {
    pub fn new(role: crate::config::Role) -> Replica {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty() && h.len() <= 64 && h.chars().all(|c| c.is_ascii_graphic()))
            .unwrap_or_else(|| "sandgate".into());
        Replica {
            id: format!("{host}-{}", crate::base::ids::random_hex(4)),
            role,
            started_ms: now_ms(),
        }
    }

    fn row(&self, policy: &PolicyEngine) -> ReplicaRow {
        let status = policy.status();
        ReplicaRow {
            id: self.id.clone(),
            role: self.role.as_str().into(),
            policy_generation: status.generation as i64,
            policy_digest: status.digest,
            started_ms: self.started_ms,
            seen_ms: now_ms(),
        }
    }

    /// One heartbeat now (also at start, so a new replica is listed at once).
    pub async fn beat(&self, store: &Store, policy: &PolicyEngine) -> Result<(), StoreError> {
        let row = self.row(policy);
        metrics::gauge!("sandgate_policy_generation").set(row.policy_generation as f64);
        metrics::gauge!("sandgate_policy_info", "digest" => row.policy_digest.clone()).set(1.0);
        store.upsert_replica(&row).await
    }

    /// Heartbeats every [`HEARTBEAT`] until the task is aborted.
    pub fn spawn_heartbeat(
        self: &Arc<Self>,
        store: Store,
        policy: Arc<PolicyEngine>,
    ) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(HEARTBEAT);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_digest = String::new();
            loop {
                tick.tick().await;
                let digest = policy.status().digest;
                if digest != last_digest && !last_digest.is_empty() {
                    // The old digest's info series would otherwise report 1 forever.
                    metrics::gauge!("sandgate_policy_info", "digest" => last_digest.clone())
                        .set(0.0);
                }
                last_digest = digest;
                if let Err(e) = this.beat(&store, &policy).await {
                    tracing::warn!(error = %e, "could not record this replica's heartbeat");
                }
            }
        })
    }

    /// `{replica, replicas: [...], replicas_agree, disagreement}` for `GET /v1/policies`.
    pub async fn view(&self, store: &Store, policy: &PolicyEngine) -> Result<Value, StoreError> {
        // This replica's own row is fresh even between heartbeats (a reload just happened).
        self.beat(store, policy).await?;
        let since = now_ms() - LIVE_FOR.as_millis() as i64;
        let rows = store.live_replicas(since).await?;
        let mut digests: Vec<&str> = rows.iter().map(|r| r.policy_digest.as_str()).collect();
        digests.sort_unstable();
        digests.dedup();
        let listed: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "id": r.id, "role": r.role, "policy_generation": r.policy_generation,
                    "policy_digest": r.policy_digest, "started_ms": r.started_ms,
                    "seen_ms": r.seen_ms, "this": r.id == self.id,
                })
            })
            .collect();
        let disagreement = (digests.len() > 1).then(|| {
            format!(
                "{} live replicas serve {} different policies (by digest); they converge when every replica has reloaded the same files",
                rows.len(),
                digests.len()
            )
        });
        Ok(json!({
            "replica": self.id,
            "replicas": listed,
            "replicas_agree": digests.len() <= 1,
            "disagreement": disagreement,
        }))
    }

    /// Leaves the registry (on a graceful stop, see `Server::stop`).
    pub async fn leave(&self, store: &Store) -> Result<(), StoreError> {
        store.remove_replica(&self.id).await
    }
}
