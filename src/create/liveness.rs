//! Keeping sandgate's view of placed sandboxes true to their providers.
//!
//! A hosted provider runs a clock of its own (E2B's `timeout`, Vercel's session timeout,
//! Runloop's idle keep-alive, Daytona's auto-stop) and ends an instance when it runs out,
//! whatever sandgate's record says. Contract:
//! - **Aligned clocks.** Once an instance runs, when `POST /v1/sandboxes/{id}/timeout` moves
//!   the lifetime, and on every liveness pass, the adapter's [`Provider::extend_lifetime`] is
//!   given the sandbox's remaining lifetime (or `None`: no lifetime, keep it alive), so the
//!   provider's clock never runs out before sandgate's own expiry (the janitor's delete).
//! - **Noticed endings.** Every `[create] liveness_interval_secs` each running or paused
//!   sandbox's instance is looked up at its provider, and after an operation (exec, files,
//!   lifecycle, snapshot) fails, that sandbox's at once (at most once per
//!   [`SUSPECT_EVERY`]). An instance the provider no longer knows, or reports ended, makes
//!   the sandbox `failed` with the `instance_lost` error (what the provider said, in
//!   `details`), and its egress identity is revoked at once. A lookup that fails proves
//!   nothing and changes nothing.
//! - **Process-local instances.** The simulated and local providers' instances live in the
//!   replica that placed them ([`Provider::process_local`]): another replica checks them only
//!   once that replica has left the replica list (its instances ended with it).
//!
//! [`Provider::extend_lifetime`]: crate::providers::Provider::extend_lifetime
//! [`Provider::process_local`]: crate::providers::Provider::process_local

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Coordinator, Placement};
use crate::base::clock::now_ms;
use crate::error::{Details, Error, Kind};
use crate::providers::{InstanceState, Provider};
use crate::store::sandboxes::SandboxRow;

/// Shortest time between two checks of one sandbox triggered by failed operations, so a
/// client retrying a failing exec in a loop cannot turn it into a flood of provider calls.
pub const SUSPECT_EVERY: Duration = Duration::from_secs(5);

/// What the provider says of a placed instance.
enum Seen {
    Live,
    /// Gone, and in what words (for the sandbox's error).
    Lost(&'static str),
    /// The provider could not be asked: nothing is concluded.
    Unknown,
}

impl Coordinator {
    /// Starts the periodic liveness pass (none when `liveness_interval_secs` is 0).
    pub(super) fn spawn_liveness(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let secs = self.deps.config.liveness_interval_secs;
        if secs == 0 {
            return None;
        }
        let this = self.clone();
        Some(tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(secs));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                this.liveness_pass().await;
            }
        }))
    }

    /// One pass over every running or paused sandbox: notice the ones their provider ended,
    /// and extend the others' provider clocks.
    pub async fn liveness_pass(&self) {
        let rows = match self.deps.store.running_sandboxes().await {
            Ok(rows) => rows,
            Err(e) => return tracing::warn!(error = %e, "liveness: cannot list sandboxes"),
        };
        for row in rows.iter().filter(|r| r.state != "stopped") {
            self.check_one(row, true).await;
        }
    }

    /// Called when an operation on sandbox `id` failed at its provider: checks at once (in
    /// the background) whether the provider ended it.
    pub fn suspect_lost(self: &Arc<Self>, id: &str) {
        {
            let mut last = self.suspected.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            last.retain(|_, at| now.duration_since(*at) < SUSPECT_EVERY);
            if last.contains_key(id) || last.len() >= 10_000 {
                return;
            }
            last.insert(id.to_string(), now);
        }
        let this = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            if let Ok(Some(row)) = this.deps.store.get_sandbox(&id).await {
                if matches!(row.state.as_str(), "running" | "paused") {
                    this.check_one(&row, false).await;
                }
            }
        });
    }

    /// Sets the provider's clock of a placed sandbox to its lifetime (see the module doc);
    /// failures are logged: sandgate's own record stays authoritative.
    pub(super) async fn align_lifetime(
        &self,
        adapter: &dyn Provider,
        row: &SandboxRow,
        instance: &str,
    ) {
        let remaining = row
            .expires_ms
            .map(|at| Duration::from_millis(at.saturating_sub(now_ms()).max(0) as u64));
        if let Err(e) = adapter.extend_lifetime(instance, remaining).await {
            tracing::warn!(sandbox = %row.id, instance, error = %e, "could not set the provider's lifetime of the sandbox");
        }
    }

    async fn check_one(&self, row: &SandboxRow, extend: bool) {
        let Some(placement) = row
            .placement_json
            .as_deref()
            .and_then(|p| serde_json::from_str::<Placement>(p).ok())
        else {
            return;
        };
        let Some(adapter) = self.deps.providers.for_pool(&placement.pool) else {
            return;
        };
        if adapter.process_local() && !self.can_see(&placement).await {
            return;
        }
        match seen(adapter.as_ref(), &placement.instance_id).await {
            Seen::Lost(said) => self.mark_lost(row, &placement, said).await,
            Seen::Live if extend && row.state == "running" => {
                self.align_lifetime(adapter.as_ref(), row, &placement.instance_id)
                    .await
            }
            Seen::Live | Seen::Unknown => {}
        }
    }

    /// Whether this replica can judge a process-local instance: it placed it, or the
    /// replica that did is gone (and its instances with it). While that replica lives, only
    /// it can see the instance, so an unknown instance here proves nothing.
    pub(super) async fn can_see(&self, placement: &Placement) -> bool {
        let own = self.deps.store.origin();
        let Some(placed_by) = placement.placed_by.as_deref() else {
            return true;
        };
        if placed_by == own {
            return true;
        }
        let since = now_ms() - crate::replicas::LIVE_FOR.as_millis() as i64;
        match self.deps.store.live_replicas(since).await {
            Ok(live) => !live.iter().any(|r| r.id == placed_by),
            Err(_) => false,
        }
    }

    /// The sandbox becomes `failed` with the reason, and its egress identity is revoked.
    async fn mark_lost(&self, row: &SandboxRow, placement: &Placement, said: &str) {
        let error = Error::new(
            Kind::Gone,
            "instance_lost",
            format!(
                "the provider ended the sandbox's instance ({said}); sandgate did not delete it"
            ),
        )
        .with_details(Details {
            provider: Some(placement.provider.clone()),
            pool: Some(placement.pool.clone()),
            instance_id: Some(placement.instance_id.clone()),
            provider_state: Some(said.to_string()),
            ..Details::default()
        });
        let error_json = error.record().to_stored();
        let changed = self
            .deps
            .store
            .transition_sandbox(
                &row.id,
                &["running", "paused"],
                "failed",
                None,
                Some(&error_json),
                now_ms(),
            )
            .await;
        if matches!(changed, Ok(true)) {
            self.deps.identities.revoke(&row.id);
            metrics::counter!("sandgate_sandboxes_lost_total", "provider" => placement.provider.clone())
                .increment(1);
            tracing::warn!(sandbox = %row.id, pool = %placement.pool, instance = %placement.instance_id, said, "the provider ended the sandbox's instance; marked failed and its egress revoked");
        }
    }
}

async fn seen(adapter: &dyn Provider, instance: &str) -> Seen {
    match adapter.get(instance).await {
        Ok(None) => Seen::Lost("the provider no longer knows the instance"),
        Ok(Some(i)) if i.state == InstanceState::Failed => {
            Seen::Lost("the provider reports the instance stopped or failed")
        }
        Ok(Some(_)) => Seen::Live,
        Err(e) => {
            tracing::debug!(instance, error = %e, "liveness: the provider could not be asked");
            Seen::Unknown
        }
    }
}
