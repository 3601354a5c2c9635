//! Steps 4 and 5 (see [`super`]): the running instance is checked against the request, a
//! filesystem export it was created from is written into it, and the first success is kept
//! (its placement recorded under the lease, its egress identity registered, its provider's
//! clock aligned).

use serde_json::Value;

use super::{Coordinator, Job, Placement, Step, StoredCandidate};
use crate::base::clock::now_ms;
use crate::providers::{ErrorClass, ProviderError};
use crate::store::sandboxes::{AttemptRow, IN_FLIGHT_STATES};
use crate::store::StoreError;

impl Coordinator {
    /// (d) runtime check, then (e) keep the first success.
    pub(super) async fn after_running(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        instance_id: &str,
    ) -> Result<Step, StoreError> {
        let adapter = self.deps.providers.for_pool(&cand.pool);
        let caps = match &adapter {
            Some(a) => a.capabilities(instance_id).await,
            None => Err(ProviderError::new(ErrorClass::Unsupported, "no adapter")),
        };
        let shortfall = match &caps {
            Ok(c) => c.shortfall(&job.request, cand.baseline),
            Err(e) => vec![format!("capabilities could not be read: {e}")],
        };
        if !shortfall.is_empty() {
            let message = format!(
                "the running instance falls short of the request: {}",
                shortfall.join(", ")
            );
            self.end_attempt(
                job,
                attempt,
                "advanced",
                ErrorClass::RuntimeShortfall,
                &message,
                Some(instance_id),
            )
            .await?;
            self.sample(&cand.pool, false, None).await;
            self.destroy(
                &job.row.id,
                &cand.pool,
                &cand.account,
                &attempt.id,
                instance_id,
                "runtime_shortfall",
            )
            .await;
            return Ok(Step::Advance);
        }
        if let Err(message) = self.restore_export(job, cand, instance_id).await {
            self.end_attempt(
                job,
                attempt,
                "advanced",
                ErrorClass::FailedBeforeRunning,
                &message,
                Some(instance_id),
            )
            .await?;
            self.sample(&cand.pool, false, None).await;
            self.destroy(
                &job.row.id,
                &cand.pool,
                &cand.account,
                &attempt.id,
                instance_id,
                "export_not_restored",
            )
            .await;
            return Ok(Step::Advance);
        }
        let lockdown = self.lockdown(job, cand);
        let now = now_ms();
        let latency = (now - attempt.started_ms) as f64;
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(cand.pool.clone())
            .or_default()
            .push(now, true, Some(latency));
        let placed = self
            .deps
            .store
            .succeed_and_place(&crate::store::sandboxes::Success {
                attempt_id: &attempt.id,
                sandbox_id: &job.row.id,
                instance_id,
                pool: &cand.pool,
                latency_ms: latency,
                placement_json: &self.placement_json(cand, instance_id, lockdown),
                now_ms: now,
                fence: &job.fence,
            })
            .await?;
        if placed {
            self.register_identity(&job.row).await;
            if let Some(adapter) = &adapter {
                self.align_lifetime(adapter.as_ref(), &job.row, instance_id)
                    .await;
            }
        } else {
            // Deleted while it was being created: the instance must not outlive it.
            self.destroy(
                &job.row.id,
                &cand.pool,
                &cand.account,
                &attempt.id,
                instance_id,
                "deleted_while_creating",
            )
            .await;
        }
        Ok(Step::Placed)
    }

    pub(super) async fn place(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        instance_id: &str,
    ) -> Result<(), StoreError> {
        let placement_json = self.placement_json(cand, instance_id, self.lockdown(job, cand));
        let placed = self
            .deps
            .store
            .transition_fenced(
                &job.row.id,
                &IN_FLIGHT_STATES,
                "running",
                Some(&placement_json),
                None,
                now_ms(),
                &job.fence,
            )
            .await?;
        if !placed {
            // Deleted while it was being created: the instance must not outlive it.
            self.destroy(
                &job.row.id,
                &cand.pool,
                &cand.account,
                &attempt.id,
                instance_id,
                "deleted_while_creating",
            )
            .await;
            return Ok(());
        }
        self.register_identity(&job.row).await;
        Ok(())
    }

    /// The placement record of `instance_id` on `cand`'s pool, placed by this replica.
    pub(super) fn placement_json(
        &self,
        cand: &StoredCandidate,
        instance_id: &str,
        lockdown: Option<Value>,
    ) -> String {
        let origin = self.deps.store.origin();
        serde_json::to_string(&Placement {
            pool: cand.pool.clone(),
            provider: cand.provider.clone(),
            account: cand.account.clone(),
            region: cand.region.clone(),
            zone: cand.zone.clone(),
            instance_id: instance_id.to_string(),
            lockdown,
            placed_by: (!origin.is_empty()).then(|| origin.to_string()),
        })
        .unwrap_or_default()
    }
}
