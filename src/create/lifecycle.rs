//! A sandbox after its create: its lifetime (`timeout`), delete (the egress identity revoked
//! at once, the instance deleted or left to the janitor), and the lookups and state changes
//! the API's operations make.

use serde_json::Value;

use super::{internal, Coordinator, Located, Placement};
use crate::base::clock::now_ms;
use crate::error::Error;
use crate::store::sandboxes::AbandonedRow;

impl Coordinator {
    /// Sets a sandbox's lifetime to end `ttl_secs` from now (E2B's `set_timeout`): longer
    /// or shorter than before. `None` when there is no such sandbox that is not deleted.
    pub async fn set_timeout(&self, id: &str, ttl_secs: u64) -> Result<Option<Value>, Error> {
        let now = now_ms();
        let set = self
            .deps
            .store
            .set_sandbox_expiry(id, now + ttl_secs as i64 * 1000, now)
            .await
            .map_err(internal)?;
        if !set {
            return Ok(None);
        }
        if let Some(located) = self.locate(id).await? {
            if let (Some(adapter), Some(placement)) = (&located.adapter, &located.placement) {
                if matches!(located.row.state.as_str(), "running" | "paused") {
                    self.align_lifetime(adapter.as_ref(), &located.row, &placement.instance_id)
                        .await;
                }
            }
        }
        self.view(id).await
    }

    /// Revokes the egress identity at once, marks the sandbox deleted, and deletes its
    /// instance (left to the janitor when the provider does not answer).
    pub async fn delete(&self, id: &str) -> Result<Option<Value>, Error> {
        let Some(row) = self.deps.store.get_sandbox(id).await.map_err(internal)? else {
            return Ok(None);
        };
        self.deps.identities.revoke(id);
        let now = now_ms();
        self.deps
            .store
            .transition_sandbox(
                id,
                &[
                    "pending",
                    "provisioning",
                    "reconciling",
                    "running",
                    "paused",
                    "failed",
                    "stopped",
                ],
                "deleted",
                None,
                None,
                now,
            )
            .await
            .map_err(internal)?;
        if let Some(p) = row
            .placement_json
            .as_deref()
            .and_then(|p| serde_json::from_str::<Placement>(p).ok())
        {
            self.destroy(
                id,
                &p.pool,
                &p.account,
                &format!("{id}-placed"),
                &p.instance_id,
                "deleted",
            )
            .await;
        }
        self.view(id).await
    }

    /// Deletes an instance; when that fails, the janitor keeps trying.
    pub(super) async fn destroy(
        &self,
        sandbox_id: &str,
        pool: &str,
        account: &str,
        attempt_id: &str,
        instance_id: &str,
        reason: &str,
    ) {
        let deleted = match self.deps.providers.for_pool(pool) {
            Some(p) => p.delete(instance_id).await.is_ok(),
            None => false,
        };
        if !deleted {
            let now = now_ms();
            let _ = self
                .deps
                .store
                .record_abandoned(
                    &AbandonedRow {
                        attempt_id: attempt_id.to_string(),
                        sandbox_id: sandbox_id.to_string(),
                        pool: pool.to_string(),
                        account: account.to_string(),
                    },
                    reason,
                    now,
                    now + self.deps.config.abandoned_watch_secs as i64 * 1000,
                )
                .await;
        }
    }

    /// A sandbox with where it runs and the adapter that runs it (for operations on it).
    pub async fn locate(&self, id: &str) -> Result<Option<Located>, Error> {
        let Some(row) = self.deps.store.get_sandbox(id).await.map_err(internal)? else {
            return Ok(None);
        };
        let placement = row
            .placement_json
            .as_deref()
            .and_then(|p| serde_json::from_str::<Placement>(p).ok());
        let adapter = placement
            .as_ref()
            .and_then(|p| self.deps.providers.for_pool(&p.pool));
        Ok(Some(Located {
            row,
            placement,
            adapter,
        }))
    }

    /// Records a lifecycle state change made by the API (`from` guards against races
    /// with delete).
    pub async fn set_state(&self, id: &str, from: &[&str], to: &str) -> Result<bool, Error> {
        self.deps
            .store
            .transition_sandbox(id, from, to, None, None, now_ms())
            .await
            .map_err(internal)
    }
}
