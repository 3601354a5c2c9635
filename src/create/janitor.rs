//! The background work of a coordinator: the lease heartbeat, the janitor (creates whose
//! lease expired resumed, late instances of abandoned attempts deleted, ended lifetimes
//! expired) and the start-up restore of running sandboxes' identities.

use std::sync::Arc;
use std::time::Duration;

use super::{Coordinator, Placement};
use crate::base::clock::now_ms;
use crate::error::{Details, Error, Kind};
use crate::store::sandboxes::{AbandonedRow, SandboxRow, IN_FLIGHT_STATES};
use crate::store::StoreError;

impl Coordinator {
    /// Starts the lease heartbeat and the janitor; the janitor's first pass runs at once so
    /// creates left by a crashed process are resumed as soon as their lease expires.
    pub fn spawn_background(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        let this = self.clone();
        tasks.push(tokio::spawn(async move {
            let every = Duration::from_millis((this.deps.config.lease_ttl_ms / 3).max(30));
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = this
                    .deps
                    .store
                    .renew_leases(&this.owner, this.lease_expiry())
                    .await
                {
                    tracing::warn!(error = %e, "could not renew create leases");
                }
            }
        }));
        let this = self.clone();
        tasks.push(tokio::spawn(async move {
            let every = Duration::from_millis(this.deps.config.janitor_interval_ms);
            loop {
                this.janitor_pass().await;
                tokio::time::sleep(every).await;
            }
        }));
        tasks.extend(self.spawn_account_checks());
        tasks.extend(self.spawn_liveness());
        tasks
    }

    /// One janitor pass: resume creates whose lease expired, delete late instances of
    /// abandoned attempts, drop expired idempotency keys and old samples.
    pub async fn janitor_pass(self: &Arc<Self>) {
        let now = now_ms();
        self.resume_expired_creates(now).await;
        match self.deps.store.watched_abandoned(now).await {
            Ok(rows) => {
                for row in rows {
                    self.check_abandoned(&row, now).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "janitor: cannot list abandoned attempts"),
        }
        self.expire_sandboxes(now).await;
        let _ = self.deps.store.purge_idempotency_keys(now).await;
        let _ = self
            .deps
            .store
            .delete_samples_before(now - self.deps.config.stats_window_secs as i64 * 1000)
            .await;
    }

    /// First in each janitor pass: claims the creates whose lease expired (their coordinator
    /// died or was cut off) and drives each again from its record, under this coordinator.
    async fn resume_expired_creates(self: &Arc<Self>, now: i64) {
        match self
            .deps
            .store
            .claim_expired_creates(&self.owner, now, self.lease_expiry())
            .await
        {
            Ok(ids) => {
                for id in ids {
                    tracing::info!(sandbox = %id, "resuming an in-flight create whose lease expired");
                    let this = self.clone();
                    tokio::spawn(async move { this.drive(&id).await });
                }
            }
            Err(e) => tracing::warn!(error = %e, "janitor: cannot claim expired creates"),
        }
    }

    /// Each janitor pass, for each abandoned attempt due a check: asks its provider (against
    /// the attempt's own account) for instances tagged with it and deletes every one that
    /// showed up late, never the instance a sandbox is placed on. An attempt id ending in
    /// `-placed` watches the sandbox's placed instance (its delete failed), by sandbox tag.
    async fn check_abandoned(&self, row: &AbandonedRow, now: i64) {
        let Some(adapter) = self.deps.providers.for_pool(&row.pool) else {
            return;
        };
        let attempt = (!row.attempt_id.ends_with("-placed")).then_some(row.attempt_id.as_str());
        let listed = adapter.list_by_tag(&row.sandbox_id, attempt).await;
        // Backs off per attempt, whatever the answer: an instance that has not
        // appeared is ever less likely to, and a failing provider is not hammered.
        let _ = self
            .deps
            .store
            .abandoned_checked(
                &row.attempt_id,
                now,
                self.deps.config.janitor_interval_ms as i64,
                self.deps.config.abandoned_check_max_secs as i64 * 1000,
            )
            .await;
        let Ok(found) = listed else {
            return;
        };
        // Never touch the instance a sandbox is placed on.
        let placed = self
            .deps
            .store
            .get_sandbox(&row.sandbox_id)
            .await
            .ok()
            .flatten()
            .filter(|s| s.state != "deleted")
            .and_then(|s| s.placement_json)
            .and_then(|p| serde_json::from_str::<Placement>(&p).ok())
            .map(|p| p.instance_id);
        let mut n = 0;
        for instance in found {
            if Some(&instance.id) == placed.as_ref() {
                continue;
            }
            if adapter.delete(&instance.id).await.is_ok() {
                tracing::info!(sandbox = %row.sandbox_id, pool = %row.pool, account = %row.account, instance = %instance.id, "janitor deleted a late instance");
                n += 1;
            }
        }
        if n > 0 {
            let _ = self
                .deps
                .store
                .count_abandoned_deleted(&row.attempt_id, n)
                .await;
            metrics::counter!("sandgate_janitor_deleted_instances_total").increment(n);
        }
    }

    /// Deletes the sandboxes whose lifetime has ended. Every replica's janitor may find the
    /// same one; deleting it twice is harmless.
    pub(super) async fn expire_sandboxes(&self, now: i64) {
        let ids = match self.deps.store.expired_sandboxes(now, 100).await {
            Ok(ids) => ids,
            Err(e) => return tracing::warn!(error = %e, "janitor: cannot list expired sandboxes"),
        };
        for id in ids {
            tracing::info!(sandbox = %id, "the sandbox's lifetime ended; deleting it");
            match self.delete(&id).await {
                Ok(_) => metrics::counter!("sandgate_sandboxes_expired_total").increment(1),
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e.message, "cannot delete an expired sandbox")
                }
            }
        }
    }

    /// At start-up: register the identities of running sandboxes again. With
    /// `reconcile_instances` (the control plane), a sandbox whose provider positively says its
    /// instance is gone is marked failed first (with the provider's reason when it could not
    /// re-adopt the instance of a previous process), and the instances adapters re-adopted
    /// that no sandbox claims are deleted; a proxy replica only serves identities and leaves
    /// the judgement to the control plane (it may not even reach the providers).
    pub async fn restore(&self, reconcile_instances: bool) -> Result<usize, StoreError> {
        let since = now_ms() - self.deps.config.stats_window_secs as i64 * 1000;
        let rows = self.deps.store.samples_since(since).await?;
        {
            let mut windows = self.samples.lock().unwrap_or_else(|e| e.into_inner());
            for (pool, at, success, latency) in rows {
                windows.entry(pool).or_default().push(at, success, latency);
            }
        }
        let rows = self.deps.store.running_sandboxes().await?;
        let mut restored = 0;
        for row in &rows {
            if reconcile_instances && self.instance_lost(row).await {
                self.fail_lost(row).await?;
                continue;
            }
            self.register_identity(row).await;
            restored += 1;
        }
        if reconcile_instances {
            self.release_unclaimed(&rows).await;
        }
        Ok(restored)
    }

    /// Marks a sandbox whose instance is gone `failed`, saying why.
    async fn fail_lost(&self, row: &SandboxRow) -> Result<(), StoreError> {
        let placement = placement_of(row);
        let why = placement.as_ref().and_then(|p| {
            let adapter = self.deps.providers.for_pool(&p.pool)?;
            adapter.readoption_failure(&p.instance_id)
        });
        let error = lost_error(placement.as_ref(), why.clone());
        let error_json = error.record().to_stored();
        self.deps
            .store
            .transition_sandbox(
                &row.id,
                &["running", "paused", "stopped"],
                "failed",
                None,
                Some(&error_json),
                now_ms(),
            )
            .await?;
        let provider = placement.map(|p| p.provider).unwrap_or_default();
        metrics::counter!("sandgate_sandboxes_lost_total", "provider" => provider).increment(1);
        let code = why.as_ref().map_or("-", |(code, _)| *code);
        tracing::warn!(sandbox = %row.id, code, reason = %error.message, "sandbox instance lost at start-up; marked failed");
        Ok(())
    }

    /// Deletes the instances adapters re-adopted from a previous process that no sandbox is
    /// placed on, unless their sandbox's create is still in flight (its resumed create finds
    /// the instance by tag and adopts it, or the abandoned-attempt watch deletes it).
    async fn release_unclaimed(&self, rows: &[SandboxRow]) {
        let placed: std::collections::HashSet<String> = rows
            .iter()
            .filter_map(placement_of)
            .map(|p| p.instance_id)
            .collect();
        for adapter in self.deps.providers.adapters() {
            for instance in adapter.take_readopted() {
                if placed.contains(&instance.id) || self.in_flight(&instance.tags.sandbox_id).await
                {
                    continue;
                }
                match adapter.delete(&instance.id).await {
                    Ok(()) => {
                        tracing::info!(sandbox = %instance.tags.sandbox_id, instance = %instance.id, "deleted a re-adopted instance no sandbox claims")
                    }
                    Err(e) => {
                        tracing::warn!(instance = %instance.id, error = %e, "cannot delete a re-adopted instance no sandbox claims")
                    }
                }
            }
        }
    }

    async fn in_flight(&self, sandbox_id: &str) -> bool {
        let row = self.deps.store.get_sandbox(sandbox_id).await;
        // A store error proves nothing: keep the instance.
        row.map_or(true, |row| {
            row.is_some_and(|r| IN_FLIGHT_STATES.contains(&r.state.as_str()))
        })
    }

    /// Whether the provider positively says the placed instance is gone (an error or no
    /// adapter proves nothing: the sandbox is kept).
    pub(super) async fn instance_lost(&self, row: &SandboxRow) -> bool {
        let Some(placement) = placement_of(row) else {
            return false;
        };
        let Some(adapter) = self.deps.providers.for_pool(&placement.pool) else {
            return false;
        };
        let id = &placement.instance_id;
        // Another live replica's process-local instance is invisible here: not ours to judge
        // (unless this process found its remains and could not take them over).
        if adapter.process_local()
            && adapter.readoption_failure(id).is_none()
            && !self.can_see(&placement).await
        {
            return false;
        }
        matches!(adapter.get(id).await, Ok(None))
    }
}

fn placement_of(row: &SandboxRow) -> Option<Placement> {
    serde_json::from_str(row.placement_json.as_deref()?).ok()
}

/// The `instance_lost` error of a sandbox found gone at start-up: with the adapter's stable
/// code (in `details.provider_state`) and message when it could not re-adopt the instance.
fn lost_error(placement: Option<&Placement>, why: Option<(&'static str, String)>) -> Error {
    let message = match &why {
        Some((_, message)) => format!(
            "the sandbox's instance could not be taken over after the gateway restarted: {message}"
        ),
        None => "the sandbox's instance no longer exists at its provider (for a local sandbox: \
                 the gateway was stopped with [local] on_shutdown = \"stop\", or the machine \
                 restarted)"
            .to_string(),
    };
    Error::new(Kind::Gone, "instance_lost", message).with_details(Details {
        provider: placement.map(|p| p.provider.clone()),
        pool: placement.map(|p| p.pool.clone()),
        instance_id: placement.map(|p| p.instance_id.clone()),
        provider_state: why.map(|(code, _)| code.to_string()),
        ..Details::default()
    })
}
