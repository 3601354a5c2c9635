//! Attempt and failover on one pool (steps 2 and 3, see the module doc of `create`): the provider
//! create tagged with the sandbox and attempt ids, skipped while the pool's circuit is open,
//! retried with backoff within the provisioning window, and its failure classified: the walk
//! advances to the next ranked pool, the create ends, or an unknown outcome is reconciled first.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{circuit, refusal_reply, Admission, Coordinator, Job, Step, StoredCandidate};
use crate::base::clock::now_ms;
use crate::error::{Details, Error, Kind};
use crate::providers::{CreateSpec, ErrorClass, Instance, Outcome, Provider, ProviderError, Tags};
use crate::store::sandboxes::{AbandonedRow, AttemptEnd, AttemptRow};
use crate::store::StoreError;

impl Coordinator {
    pub(super) async fn start_attempt(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        seq: i64,
        state: &str,
    ) -> Result<AttemptRow, StoreError> {
        let row = AttemptRow {
            id: format!("{}-a{seq}", job.row.id),
            sandbox_id: job.row.id.clone(),
            seq,
            pool: cand.pool.clone(),
            provider: cand.provider.clone(),
            account: cand.account.clone(),
            state: state.into(),
            outcome: None,
            error_class: None,
            message: None,
            instance_id: None,
            started_ms: now_ms(),
            finished_ms: None,
            retries_json: None,
        };
        self.deps.store.insert_attempt(&row, &job.fence).await?;
        Ok(row)
    }

    pub(super) async fn end_attempt(
        &self,
        job: &Job,
        attempt: &AttemptRow,
        state: &str,
        class: ErrorClass,
        message: &str,
        instance_id: Option<&str>,
    ) -> Result<(), StoreError> {
        let outcome = match class.outcome() {
            Outcome::Advance => "advance",
            Outcome::Terminal => "terminal",
            Outcome::Unknown => "unknown",
        };
        self.deps
            .store
            .finish_attempt(
                &attempt.id,
                &AttemptEnd {
                    state,
                    outcome,
                    error_class: Some(class.as_str()),
                    message: Some(message),
                    instance_id,
                    finished_ms: now_ms(),
                },
                &job.fence,
            )
            .await
    }

    /// One candidate pool, when the walk reaches it: (a) admit, (b) attempt (with retries),
    /// (c) classify; a running instance then goes through the runtime check.
    pub(super) async fn try_pool(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        seq: i64,
    ) -> Result<Step, StoreError> {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "sandbox.attempt",
            sandbox_id = %job.row.id,
            pool = %cand.pool,
            provider = %cand.provider,
            seq,
            outcome = tracing::field::Empty,
        );
        let step = self
            .try_pool_inner(job, cand, seq)
            .instrument(span.clone())
            .await;
        let outcome = match &step {
            Ok(Step::Placed) => "placed",
            Ok(Step::Advance) => "advanced",
            Ok(Step::End(_)) => "failed",
            Err(_) => "store_error",
        };
        span.record("outcome", outcome);
        step
    }

    async fn try_pool_inner(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        seq: i64,
    ) -> Result<Step, StoreError> {
        // (a) admit, for this pool, now.
        let adapter = match self.admit_or_record(job, cand, seq).await? {
            Ok(adapter) => adapter,
            Err(step) => return Ok(step),
        };
        // (b) attempt.
        if self.skip_open_circuit(job, cand, seq).await? {
            return Ok(Step::Advance);
        }
        let attempt = self.begin_attempt(job, cand, seq).await?;
        let (result, maybe_created) = self
            .create_with_retries(job, cand, adapter.as_ref(), &attempt)
            .await?;
        // (c) classify.
        match result {
            Ok(instance) => {
                if maybe_created {
                    self.drop_duplicates(job, cand, &attempt, &instance.id)
                        .await;
                }
                self.after_running(job, cand, &attempt, &instance.id).await
            }
            Err(mut e) => {
                e.maybe_created |= maybe_created;
                self.classify(job, cand, &attempt, e).await
            }
        }
    }

    /// (a) Admits the pool ([`Coordinator::admit`]) and records a pool that is not admitted
    /// as an attempt that never reached the provider: a skip advances the walk, a refusal
    /// ends the create. `Ok(adapter)` when the pool may be attempted.
    async fn admit_or_record(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        seq: i64,
    ) -> Result<Result<Arc<dyn Provider>, Step>, StoreError> {
        match self.admit(job, cand, seq) {
            Admission::Attempt(adapter) => Ok(Ok(adapter)),
            Admission::Skip { class, message } => {
                let attempt = self.start_attempt(job, cand, seq, "advanced").await?;
                self.end_attempt(job, &attempt, "advanced", class, &message, None)
                    .await?;
                Ok(Err(Step::Advance))
            }
            Admission::Refused {
                class,
                layer,
                reasons,
            } => {
                let attempt = self.start_attempt(job, cand, seq, "ended").await?;
                let message = format!("refused by layer {layer}: {}", reasons.join("; "));
                self.end_attempt(job, &attempt, "ended", class, &message, None)
                    .await?;
                Ok(Err(Step::End(refusal_reply(
                    class, layer, &cand.pool, reasons,
                ))))
            }
        }
    }

    /// (b) Before anything is sent: a pool whose provider keeps failing is skipped at once
    /// (its circuit is open), recorded as an advanced `circuit_open` attempt, so nothing is
    /// sent to a provider that is down. Returns whether it was skipped.
    async fn skip_open_circuit(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        seq: i64,
    ) -> Result<bool, StoreError> {
        let circuit::Permit::Open(why) = self.circuits.permit(&cand.pool) else {
            return Ok(false);
        };
        let attempt = self.start_attempt(job, cand, seq, "advanced").await?;
        self.end_attempt(
            job,
            &attempt,
            "advanced",
            ErrorClass::CircuitOpen,
            &why,
            None,
        )
        .await?;
        Ok(true)
    }

    /// (b) Records the attempt `in_flight` (under the lease) before the provider is called:
    /// a coordinator that dies during the call leaves it for its successor to reconcile.
    async fn begin_attempt(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        seq: i64,
    ) -> Result<AttemptRow, StoreError> {
        let attempt = AttemptRow {
            id: format!("{}-a{seq}", job.row.id),
            sandbox_id: job.row.id.clone(),
            seq,
            pool: cand.pool.clone(),
            provider: cand.provider.clone(),
            account: cand.account.clone(),
            state: "in_flight".into(),
            outcome: None,
            error_class: None,
            message: None,
            instance_id: None,
            started_ms: now_ms(),
            finished_ms: None,
            retries_json: None,
        };
        self.deps
            .store
            .start_attempt(&attempt, now_ms(), &job.fence)
            .await?;
        Ok(attempt)
    }

    /// (b) The provider create of a recorded attempt, retried on the same pool while its
    /// failures are retryable and a retry fits (see [`Coordinator::retry_wait`]); every call's
    /// answer feeds the pool's circuit. Returns the last answer, and whether any failed call
    /// may have made an instance anyway (kept across retries: a retry that succeeds must not
    /// leave that one behind).
    async fn create_with_retries(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        adapter: &dyn Provider,
        attempt: &AttemptRow,
    ) -> Result<(Result<Instance, ProviderError>, bool), StoreError> {
        // The attempt starts now, here: its window is timed on the monotonic clock.
        let deadline =
            Instant::now() + Duration::from_millis(self.deps.config.provisioning_window_ms);
        // A provider snapshot seeds the instance; a filesystem export is written after.
        let seed = self
            .snapshot_of(job)
            .await
            .filter(|s| s.kind == crate::store::snapshots::PROVIDER_SNAPSHOT)
            .map(|s| s.id);
        let mut backoff = self.retry_backoff();
        let mut retries: Vec<Value> = Vec::new();
        let mut maybe_created = false;
        loop {
            let spec = match self.create_spec(job, cand, attempt, seed.clone()) {
                Ok(spec) => spec,
                Err(e) => return Ok((Err(e), maybe_created)),
            };
            let answer = adapter.create(spec).await;
            self.circuits.record(
                &cand.pool,
                match &answer {
                    Err(e) if circuit::counts(e.class) => Some((e.class, e.message.as_str())),
                    _ => None,
                },
            );
            let mut e = match answer {
                Ok(instance) => return Ok((Ok(instance), maybe_created)),
                Err(e) => e,
            };
            maybe_created |= e.maybe_created;
            if !e.class.retryable() {
                return Ok((Err(e), maybe_created));
            }
            match self.retry_wait(&cand.pool, &e, backoff.next(), deadline) {
                Ok(wait) => {
                    self.record_retry(job, cand, attempt, &mut retries, &e, wait)
                        .await?;
                    tokio::time::sleep(wait).await;
                }
                Err(why) => {
                    e.message = format!("{}; {why}", e.message);
                    return Ok((Err(e), maybe_created));
                }
            }
        }
    }

    /// What the provider is asked to create for the attempt, built again for each call:
    /// fails (never creates an open sandbox) when its egress lock-down cannot be made.
    fn create_spec(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        seed: Option<String>,
    ) -> Result<CreateSpec, ProviderError> {
        let egress = self.remote_egress(job, cand)?;
        Ok(CreateSpec {
            tags: Tags {
                sandbox_id: job.row.id.clone(),
                attempt_id: attempt.id.clone(),
            },
            pool: cand.pool.clone(),
            account: cand.account.clone(),
            request: job.request.clone(),
            env: self.placeholder_env(&job.row.id, &job.row.workspace, &job.body),
            snapshot: seed,
            egress,
        })
    }

    /// Runs before each retry's pause: the retry is logged, added to the attempt's stored
    /// `retries` (under the lease, so the view shows why the attempt is taking longer) and
    /// counted by class.
    async fn record_retry(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        retries: &mut Vec<Value>,
        e: &ProviderError,
        wait: Duration,
    ) -> Result<(), StoreError> {
        tracing::info!(sandbox = %job.row.id, pool = %cand.pool, class = e.class.as_str(), wait_ms = wait.as_millis() as u64, "retrying on the same pool");
        retries.push(json!({
            "at_ms": now_ms(),
            "error_class": e.class.as_str(),
            "message": e.message,
            "wait_ms": wait.as_millis() as u64,
        }));
        self.deps
            .store
            .set_attempt_retries(
                &attempt.id,
                &Value::from(retries.clone()).to_string(),
                &job.fence,
            )
            .await?;
        metrics::counter!("sandgate_create_retries_total", "class" => e.class.as_str())
            .increment(1);
        Ok(())
    }

    /// The pauses between retries of one attempt: exponential from `retry_backoff_ms` up to
    /// `retry_backoff_max_ms`, with jitter (so concurrent creates do not retry in step), at
    /// most `retry_max` of them.
    pub(super) fn retry_backoff(&self) -> impl Iterator<Item = Duration> {
        use backon::BackoffBuilder as _;
        let c = &self.deps.config;
        let max = Duration::from_millis(c.retry_backoff_max_ms);
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(c.retry_backoff_ms))
            .with_max_delay(Duration::from_millis(c.retry_backoff_max_ms))
            .with_max_times(c.retry_max as usize)
            .with_jitter()
            .build()
            // The jitter adds up to the pause again: the maximum stays a maximum.
            .map(move |pause| pause.min(max))
    }

    /// How long to wait before retrying `error` on `pool` (the backoff's next pause, or the
    /// provider's `Retry-After` when longer), or why not to retry: no retry left, the pool's
    /// circuit opened, or the wait would end past the provisioning window.
    pub(super) fn retry_wait(
        &self,
        pool: &str,
        error: &ProviderError,
        next: Option<Duration>,
        deadline: Instant,
    ) -> Result<Duration, String> {
        let Some(pause) = next else {
            return Err(format!(
                "not retried: all {} retries were used",
                self.deps.config.retry_max
            ));
        };
        if !self.circuits.closed(pool) {
            return Err("not retried: the pool's circuit opened".into());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if let Some(asked) = error.retry_after.filter(|a| *a >= left) {
            // Waiting would hold the create past the window: the next pool may serve now.
            return Err(format!(
                "not retried: Retry-After {} s ends past the provisioning window ({} ms left)",
                asked.as_secs(),
                left.as_millis()
            ));
        }
        let wait = pause.max(error.retry_after.unwrap_or_default());
        if wait >= left {
            return Err(format!(
                "not retried: the next retry (in {} ms) would end past the provisioning window",
                wait.as_millis()
            ));
        }
        Ok(wait)
    }

    /// After a retry succeeded where an earlier call may have made an instance too: deletes
    /// any other instance tagged with the attempt (providers that honour the attempt's
    /// idempotency key answer the same instance, and nothing is deleted). When the provider
    /// cannot be asked now, the janitor watches the attempt (never touching the placed one).
    pub(super) async fn drop_duplicates(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        kept: &str,
    ) {
        let Some(adapter) = self.deps.providers.for_pool(&cand.pool) else {
            return;
        };
        match adapter.list_by_tag(&job.row.id, Some(&attempt.id)).await {
            Ok(found) => {
                for extra in found.iter().filter(|i| i.id != kept) {
                    tracing::warn!(sandbox = %job.row.id, pool = %cand.pool, instance = %extra.id, "deleting a duplicate an earlier failed create call made");
                    if adapter.delete(&extra.id).await.is_err() {
                        self.watch_attempt(job, cand, attempt, "duplicate_of_retry")
                            .await;
                    }
                }
            }
            Err(_) => {
                self.watch_attempt(job, cand, attempt, "duplicate_of_retry")
                    .await
            }
        }
    }

    /// Has the janitor watch the attempt for instances (against its own account).
    pub(super) async fn watch_attempt(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        reason: &str,
    ) {
        let now = now_ms();
        let _ = self
            .deps
            .store
            .record_abandoned(
                &AbandonedRow {
                    attempt_id: attempt.id.clone(),
                    sandbox_id: job.row.id.clone(),
                    pool: cand.pool.clone(),
                    account: cand.account.clone(),
                },
                reason,
                now,
                now + self.deps.config.abandoned_watch_secs as i64 * 1000,
            )
            .await;
    }

    pub(super) async fn classify(
        &self,
        job: &Job,
        cand: &StoredCandidate,
        attempt: &AttemptRow,
        e: ProviderError,
    ) -> Result<Step, StoreError> {
        match e.class.outcome() {
            // The provider answered a failure that does not prove nothing was made (a 5xx
            // after the request reached it): look for the attempt's instance before the route
            // advances, so no duplicate live capacity is created.
            Outcome::Advance if e.maybe_created && e.instance_id.is_none() => {
                self.enter_reconciling(job, attempt).await?;
                self.reconcile_after(job, cand, attempt, Some(&e)).await
            }
            Outcome::Advance => {
                self.end_attempt(
                    job,
                    attempt,
                    "advanced",
                    e.class,
                    &e.message,
                    e.instance_id.as_deref(),
                )
                .await?;
                self.sample(&cand.pool, false, None).await;
                if let Some(instance) = &e.instance_id {
                    self.destroy(
                        &job.row.id,
                        &cand.pool,
                        &cand.account,
                        &attempt.id,
                        instance,
                        e.class.as_str(),
                    )
                    .await;
                }
                Ok(Step::Advance)
            }
            Outcome::Terminal => {
                self.end_attempt(job, attempt, "ended", e.class, &e.message, None)
                    .await?;
                let (kind, code) = match e.class {
                    ErrorClass::Billing => (Kind::Refused, "billing_refused"),
                    ErrorClass::InvalidRequest => (Kind::Unprocessable, "invalid_request"),
                    ErrorClass::Authority => (Kind::Refused, "forbidden"),
                    _ => (Kind::Refused, "policy_denied"),
                };
                let message = format!("pool {} refused the create: {}", cand.pool, e.message);
                Ok(Step::End(Error::new(kind, code, message).with_details(
                    Details {
                        pool: Some(cand.pool.clone()),
                        error_class: Some(e.class.as_str().into()),
                        ..Details::default()
                    },
                )))
            }
            Outcome::Unknown => {
                self.enter_reconciling(job, attempt).await?;
                self.reconcile(job, cand, attempt).await
            }
        }
    }
}
