//! Steps 4 and 5 (see the module doc of `create`): the running instance is checked against the
//! request, a filesystem export it was created from is written into it, and the first success is
//! kept (its placement recorded under the lease, its egress identity registered, its provider's
//! clock aligned).

use std::sync::Arc;

use serde_json::Value;

use super::{Coordinator, Job, Placement, Step, StoredCandidate};
use crate::base::clock::now_ms;
use crate::providers::{ErrorClass, Provider, ProviderError};
use crate::store::sandboxes::{AttemptRow, IN_FLIGHT_STATES};
use crate::store::StoreError;

impl Coordinator {
    /// (d) runtime check, then (e) keep the first success. Runs once an attempt's instance
    /// is running (created, or adopted by a reconcile): an instance that falls short of the
    /// request, or into which the create's filesystem export cannot be written, is destroyed
    /// and the route advances.
    pub(super) async fn after_running(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        instance_id: &str,
    ) -> Result<Step, StoreError> {
        let adapter = self.deps.providers.for_pool(&cand.pool);
        let rejected = match self
            .runtime_shortfall(job, cand, adapter.as_deref(), instance_id)
            .await
        {
            Some(message) => Some((ErrorClass::RuntimeShortfall, message, "runtime_shortfall")),
            None => self
                .restore_export(job, cand, instance_id)
                .await
                .err()
                .map(|message| {
                    let class = ErrorClass::FailedBeforeRunning;
                    (class, message, "export_not_restored")
                }),
        };
        if let Some((class, message, reason)) = rejected {
            self.end_attempt(job, attempt, "advanced", class, &message, Some(instance_id))
                .await?;
            self.sample(&cand.pool, false, None).await;
            self.destroy(
                &job.row.id,
                &cand.pool,
                &cand.account,
                &attempt.id,
                instance_id,
                reason,
            )
            .await;
            return Ok(Step::Advance);
        }
        self.keep_success(job, cand, attempt, instance_id, adapter)
            .await
    }

    /// (d) The runtime check of a running instance: what it falls short of the request by
    /// (the capabilities its adapter reads, against the request and the pool's baseline), as
    /// the attempt's message; `None` when it serves. Capabilities that cannot be read count
    /// as a shortfall: an instance is kept only when it is known to serve.
    async fn runtime_shortfall(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        adapter: Option<&dyn Provider>,
        instance_id: &str,
    ) -> Option<String> {
        let caps = match adapter {
            Some(a) => a.capabilities(instance_id).await,
            None => Err(ProviderError::new(ErrorClass::Unsupported, "no adapter")),
        };
        let shortfall = match &caps {
            Ok(c) => c.shortfall(&job.request, cand.baseline),
            Err(e) => vec![format!("capabilities could not be read: {e}")],
        };
        (!shortfall.is_empty()).then(|| {
            format!(
                "the running instance falls short of the request: {}",
                shortfall.join(", ")
            )
        })
    }

    /// (e) Keeps the first success, once the instance passed the runtime check: the pool's
    /// success sample, the attempt and the placement recorded under the lease, then the
    /// egress identity and the provider's clock. A sandbox deleted meanwhile is not placed
    /// and its instance is destroyed.
    async fn keep_success(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        instance_id: &str,
        adapter: Option<Arc<dyn Provider>>,
    ) -> Result<Step, StoreError> {
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
