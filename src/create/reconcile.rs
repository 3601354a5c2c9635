//! Reconciling an attempt whose outcome is unknown (step 3, see the module doc of `create`): the
//! provider is asked for instances tagged with the attempt before anything else is tried. A running
//! one is adopted (it is this attempt's, on this attempt's account); none within the window is
//! abandoned to the janitor's watch and the route advances.

use std::time::{Duration, Instant};

use super::{Coordinator, Job, Step, StoredCandidate};
use crate::base::clock::now_ms;
use crate::providers::{ErrorClass, Instance, InstanceState, Provider, ProviderError};
use crate::store::sandboxes::{AbandonedRow, AttemptRow};
use crate::store::StoreError;

impl Coordinator {
    pub(super) async fn enter_reconciling(
        &self,
        job: &Job,
        attempt: &AttemptRow,
    ) -> Result<(), StoreError> {
        self.deps
            .store
            .set_attempt_state(&attempt.id, "reconciling", &job.fence)
            .await?;
        self.deps
            .store
            .transition_fenced(
                &job.row.id,
                &["pending", "provisioning"],
                "reconciling",
                None,
                None,
                now_ms(),
                &job.fence,
            )
            .await?;
        Ok(())
    }

    /// An unknown outcome: ask the provider for instances tagged with this attempt before
    /// anything else is tried. A running one is adopted (it is this attempt's, on this
    /// attempt's account); none within the window → abandoned (the janitor watches for it)
    /// and the route advances.
    pub(super) async fn reconcile(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
    ) -> Result<Step, StoreError> {
        self.reconcile_after(job, cand, attempt, None).await
    }

    /// [`Coordinator::reconcile`]. `answered`: the provider answered the create with this
    /// failure (which may have made the instance): it is not still being made, so one
    /// listing decides (an instance starting is waited for); one listed later is the
    /// janitor's. Without it (no answer) the provider is asked for the reconcile window.
    pub(super) async fn reconcile_after(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        answered: Option<&ProviderError>,
    ) -> Result<Step, StoreError> {
        let (class, why) = match answered {
            Some(e) => (
                e.class,
                format!(
                    "{}; no instance tagged with the attempt was listed after it; the janitor watches for a late one",
                    e.message
                ),
            ),
            None => (
                ErrorClass::Unknown,
                "no instance found within the reconcile window".to_string(),
            ),
        };
        self.deps
            .store
            .set_attempt_state(&attempt.id, "reconciling", &job.fence)
            .await?;
        let Some(adapter) = self.deps.providers.for_pool(&cand.pool) else {
            self.abandon(job, cand, attempt, class, "no adapter to reconcile with")
                .await?;
            return Ok(Step::Advance);
        };
        let window = match answered {
            Some(_) => 0,
            None => self.deps.config.reconcile_window_ms as i64,
        };
        let mut deadline = Instant::now() + Duration::from_millis(window as u64);
        // Paced by the configured window even when one listing decides (`answered`): an
        // instance still starting is polled no faster than an unknown outcome is.
        let paced = self.deps.config.reconcile_window_ms as i64;
        let interval = Duration::from_millis((paced / 20).clamp(10, 250) as u64);
        loop {
            match adapter.list_by_tag(&job.row.id, Some(&attempt.id)).await {
                Ok(found) => {
                    if let Some(running) = found.iter().find(|i| i.state == InstanceState::Running)
                    {
                        return self
                            .adopt_running(
                                job,
                                cand,
                                attempt,
                                adapter.as_ref(),
                                &found,
                                &running.id,
                            )
                            .await;
                    }
                    if !found.is_empty() && found.iter().all(|i| i.state == InstanceState::Failed) {
                        return self
                            .reconciled_failed(job, cand, attempt, adapter.as_ref(), &found)
                            .await;
                    }
                    if found.iter().any(|i| i.state == InstanceState::Starting) {
                        // It exists and is starting: wait for it within the provisioning window.
                        // The attempt may have started on another replica: its window
                        // is what remains of it by the stored start, timed here from now.
                        let ends_ms =
                            attempt.started_ms + self.deps.config.provisioning_window_ms as i64;
                        let left = Duration::from_millis((ends_ms - now_ms()).max(0) as u64);
                        deadline = deadline.max(Instant::now() + left);
                    }
                }
                Err(e) => {
                    tracing::warn!(sandbox = %job.row.id, pool = %cand.pool, error = %e, "reconciliation query failed; retrying");
                }
            }
            if Instant::now() >= deadline {
                self.abandon(job, cand, attempt, class, &why).await?;
                return Ok(Step::Advance);
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// Runs when a reconcile listing shows the attempt's instance running: the other
    /// instances tagged with the attempt are deleted (an attempt keeps one), and the running
    /// one is adopted and goes through the runtime check. One that cannot be adopted is
    /// destroyed and the route advances.
    async fn adopt_running(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        adapter: &dyn Provider,
        found: &[Instance],
        running: &str,
    ) -> Result<Step, StoreError> {
        for extra in found.iter().filter(|i| i.id != running) {
            let _ = adapter.delete(&extra.id).await;
        }
        // Its create did not finish it (e.g. the CA of a locked-down sandbox
        // is written after the provider made it): finish it now.
        let egress = self.remote_egress(job, cand);
        let adopted = match &egress {
            Ok(egress) => adapter.adopt(running, egress.as_ref()).await,
            Err(e) => Err(e.clone()),
        };
        if let Err(e) = adopted {
            self.end_attempt(job, attempt, "advanced", e.class, &e.message, Some(running))
                .await?;
            self.sample(&cand.pool, false, None).await;
            self.destroy(
                &job.row.id,
                &cand.pool,
                &cand.account,
                &attempt.id,
                running,
                "not_adopted",
            )
            .await;
            return Ok(Step::Advance);
        }
        self.after_running(job, cand, attempt, running).await
    }

    /// Runs when every instance a reconcile listing shows for the attempt has failed: they
    /// are deleted, the attempt ends `failed_before_running` and the route advances.
    async fn reconciled_failed(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        adapter: &dyn Provider,
        found: &[Instance],
    ) -> Result<Step, StoreError> {
        for i in found {
            let _ = adapter.delete(&i.id).await;
        }
        self.end_attempt(
            job,
            attempt,
            "advanced",
            ErrorClass::FailedBeforeRunning,
            "the reconciled instance failed before running",
            Some(&found[0].id),
        )
        .await?;
        self.sample(&cand.pool, false, None).await;
        Ok(Step::Advance)
    }

    /// Runs when a reconcile ends without an instance to adopt: the attempt ends
    /// `abandoned` (under the lease), the janitor watches it for a late instance against its
    /// own account, and the sandbox goes back to `provisioning` for the next pool.
    pub(super) async fn abandon(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        class: ErrorClass,
        why: &str,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        // The attempt ends first, under the lease: a coordinator that lost the create must
        // not set a watch that would delete an instance its successor adopted.
        self.end_attempt(job, attempt, "abandoned", class, why, None)
            .await?;
        self.deps
            .store
            .record_abandoned(
                &AbandonedRow {
                    attempt_id: attempt.id.clone(),
                    sandbox_id: job.row.id.clone(),
                    pool: cand.pool.clone(),
                    account: cand.account.clone(),
                },
                if class == ErrorClass::Unknown {
                    "unknown_outcome"
                } else {
                    "maybe_created"
                },
                now,
                now + self.deps.config.abandoned_watch_secs as i64 * 1000,
            )
            .await?;
        self.sample(&cand.pool, false, None).await;
        self.deps
            .store
            .transition_fenced(
                &job.row.id,
                &["reconciling"],
                "provisioning",
                None,
                None,
                now,
                &job.fence,
            )
            .await?;
        Ok(())
    }
}
