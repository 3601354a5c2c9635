//! The walk: one create driven to its end under its lease. A create resumed after a crash
//! continues from its record: a success recorded just before is finished, attempts left in
//! flight are reconciled first, then the untried candidates are walked in the router's order.

use std::sync::Arc;

use super::{Coordinator, CreateBody, Job, Step, StoredCandidate, StoredPrincipal};
use crate::base::clock::now_ms;
use crate::error::{AttemptSummary, Attempts, Details, Error, Kind};
use crate::store::sandboxes::{AttemptRow, Fence, IN_FLIGHT_STATES};
use crate::store::StoreError;

impl Coordinator {
    pub(super) async fn load_job(&self, id: &str, fence: Fence) -> Result<Option<Job>, StoreError> {
        let Some(row) = self.deps.store.get_sandbox(id).await? else {
            return Ok(None);
        };
        let parse = |what: &str, e: serde_json::Error| StoreError::Open {
            path: format!("sandbox {id}"),
            reason: format!("stored {what} is unreadable: {e}"),
        };
        let principal: StoredPrincipal =
            serde_json::from_str(&row.principal_json).map_err(|e| parse("principal", e))?;
        let mut body: CreateBody =
            serde_json::from_str(&row.request_json).map_err(|e| parse("request", e))?;
        self.open_env(&mut body, id)
            .map_err(|reason| StoreError::Open {
                path: format!("sandbox {id}"),
                reason,
            })?;
        let candidates: Vec<StoredCandidate> =
            serde_json::from_str(&row.candidates_json).map_err(|e| parse("candidates", e))?;
        Ok(Some(Job {
            request: Arc::new(body.request.clone()),
            fence,
            row,
            principal,
            body,
            candidates,
        }))
    }

    /// Runs (or resumes) one create to its end.
    pub async fn drive(self: &Arc<Self>, id: &str) {
        if !self
            .active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string())
        {
            return;
        }
        let result = loop {
            let result = self.drive_inner(id).await;
            // This coordinator's own janitor claimed the create while this walk held it (the
            // process was paused or starved past the lease): the claim's `drive` found the
            // walk active and left it to it, and the new epoch fenced the walk. Nobody else
            // will drive it (the heartbeat keeps renewing a lease this coordinator holds), so
            // the walk continues from the record under the new epoch.
            if matches!(result, Err(StoreError::Fenced { .. })) && self.holds_lease(id).await {
                tracing::info!(
                    sandbox = id,
                    "this coordinator claimed its own create again; continuing under the new lease"
                );
                continue;
            }
            break result;
        };
        self.active
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        match result {
            Ok(()) => {}
            // Another coordinator took the create over (this one was paused or cut off
            // past its lease): it continues from the record; this walk only stops.
            Err(StoreError::Fenced { .. }) => {
                metrics::counter!("sandgate_create_fenced_total").increment(1);
                tracing::warn!(
                    sandbox = id,
                    "lost the create's lease to another coordinator; stopping this walk"
                );
            }
            Err(e) => {
                // Release the lease (the heartbeat would otherwise keep it alive) so the
                // janitor resumes the create shortly; attempts left in flight are
                // reconciled first. Only a lease still this coordinator's is released.
                tracing::error!(sandbox = id, error = %e, "create coordinator stopped; it will be resumed");
                if let Ok(Some(fence)) = self.deps.store.lease_fence(id).await {
                    if fence.owner == self.owner {
                        let _ = self
                            .deps
                            .store
                            .release_lease(id, now_ms() + 1000, &fence)
                            .await;
                    }
                }
            }
        }
    }

    /// Whether this coordinator holds the create's lease now (an unreadable lease: no).
    async fn holds_lease(&self, id: &str) -> bool {
        matches!(self.deps.store.lease_fence(id).await, Ok(Some(f)) if f.owner == self.owner)
    }

    /// [`Coordinator::drive`]: the walk itself, under the create's lease. A create resumed
    /// after a crash continues from its record (see the module doc).
    async fn drive_inner(self: &Arc<Self>, id: &str) -> Result<(), StoreError> {
        // Only a create whose lease this coordinator holds is driven, under that lease's
        // epoch (a create inserted here, or claimed by this janitor).
        let Some(fence) = self
            .deps
            .store
            .lease_fence(id)
            .await?
            .filter(|f| f.owner == self.owner)
        else {
            return Ok(());
        };
        let Some(job) = self.load_job(id, fence).await? else {
            return Ok(());
        };
        if !IN_FLIGHT_STATES.contains(&job.row.state.as_str()) {
            return Ok(());
        }
        let attempts = self.deps.store.list_attempts(id).await?;
        let mut seq = attempts.iter().map(|a| a.seq).max().unwrap_or(0);
        if self.finish_recorded_success(&job, &attempts).await? {
            return Ok(());
        }
        // Attempts left in flight by a dead coordinator have an unknown outcome: reconcile
        // each before anything else is tried.
        for a in attempts
            .iter()
            .filter(|a| a.state == "in_flight" || a.state == "reconciling")
        {
            let cand = job.candidates.iter().find(|c| c.pool == a.pool).cloned();
            let Some(cand) = cand else { continue };
            match self.reconcile(&job, &cand, a).await? {
                Step::Placed => return Ok(()),
                Step::End(e) => return self.fail(&job, e).await,
                Step::Advance => {}
            }
        }
        let tried: Vec<&str> = attempts.iter().map(|a| a.pool.as_str()).collect();
        let mut first = true;
        for cand in job
            .candidates
            .iter()
            .filter(|c| !tried.contains(&c.pool.as_str()))
        {
            if !first {
                let still = self.deps.store.get_sandbox(id).await?;
                if !still.is_some_and(|r| IN_FLIGHT_STATES.contains(&r.state.as_str())) {
                    return Ok(()); // deleted meanwhile
                }
            }
            first = false;
            seq += 1;
            match self.try_pool(&job, cand, seq).await? {
                Step::Placed => return Ok(()),
                Step::Advance => continue,
                Step::End(e) => return self.fail(&job, e).await,
            }
        }
        self.fail_exhausted(&job).await
    }

    /// Runs first when a create is resumed: a success recorded just before a crash is
    /// finished (placed under this lease) instead of being tried again. Returns whether it
    /// was.
    async fn finish_recorded_success(
        &self,
        job: &Job,
        attempts: &[AttemptRow],
    ) -> Result<bool, StoreError> {
        let Some(done) = attempts.iter().find(|a| a.state == "succeeded") else {
            return Ok(false);
        };
        let Some(instance) = &done.instance_id else {
            return Ok(false);
        };
        let Some(cand) = job.candidates.iter().find(|c| c.pool == done.pool).cloned() else {
            return Ok(false);
        };
        self.place(job, &cand, done, instance).await?;
        Ok(true)
    }

    /// Runs when the walk ran out of candidates: the create fails with `creation_failed`,
    /// one summary line per attempt (read again: the walk's last attempts are in the store).
    async fn fail_exhausted(&self, job: &Job) -> Result<(), StoreError> {
        let attempts = self.deps.store.list_attempts(&job.row.id).await?;
        let summary = attempts
            .iter()
            .map(|a| AttemptSummary {
                pool: a.pool.clone(),
                provider: a.provider.clone(),
                account: a.account.clone(),
                error_class: a.error_class.clone(),
            })
            .collect();
        let message = format!(
            "every candidate pool was tried and none could place the sandbox ({} attempt(s))",
            attempts.len()
        );
        let error =
            Error::new(Kind::Unavailable, "creation_failed", message).with_details(Details {
                attempts: Some(Attempts::Summary(summary)),
                ..Details::default()
            });
        self.fail(job, error).await
    }

    pub(super) async fn fail(&self, job: &Job, error: Error) -> Result<(), StoreError> {
        let error_json = error.record().to_stored();
        self.deps
            .store
            .transition_fenced(
                &job.row.id,
                &IN_FLIGHT_STATES,
                "failed",
                None,
                Some(&error_json),
                now_ms(),
                &job.fence,
            )
            .await?;
        metrics::counter!("sandgate_sandbox_create_failures_total", "code" => error.code)
            .increment(1);
        Ok(())
    }
}
