//! The [`Provider`] implementation for Prime Intellect: the coordinator's calls (create,
//! get, list by tag, delete, adopt) and the sandbox operations (exec, files, checkpoints as
//! snapshots), each mapped
//! onto the API as the module docs of `prime` describe.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;

use super::wire::{filter_labels, instance_of, live, CheckpointView, SandboxList, SandboxView};
use super::{lockdown, op_error, provider_error, Prime, CA_PATH, ERRORS};
use crate::ops::{ExecSpec, ExecStream};
use crate::providers::hosted::errors::failed_before_running;
use crate::providers::hosted::http::{absent_ok, path_segment, HttpFailure};
use crate::providers::hosted::lockdown::ca_not_installed;
use crate::providers::hosted::poll::{self, Pace, Seen, Waited};
use crate::providers::hosted::tags::{self, TagFilter};
use crate::providers::{
    BoxFuture, CreateSpec, Instance, InstanceState, OpError, OpErrorKind, Provider, ProviderError,
    RemoteEgress, RuntimeCapabilities, SnapshotInfo, LIFETIME_MARGIN,
};

impl Provider for Prime {
    fn kind(&self) -> &'static str {
        "prime-intellect"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            let body = self.create_body(&spec)?;
            // The attempt id is the body's idempotency_key: a create re-sent after a lost
            // answer is the same sandbox.
            let request = self
                .http
                .request(Method::POST, "/api/v1/sandbox")
                .json(&body);
            let response = self
                .http
                .send(request)
                .await
                .map_err(|f| ERRORS.create_error(f))?;
            let created: SandboxView = self
                .http
                .json(response)
                .await
                .map_err(|f| ERRORS.unreadable_create(f))?;
            let id = created.id.clone();
            if let Some(auth) = created.gateway_auth {
                self.remember_auth(&id, auth);
            }
            if let Err((failure, message)) = self.await_running(&id).await {
                let mut error = match failure {
                    Some(f) => {
                        let mut e = provider_error(f);
                        e.instance_id = Some(id.clone());
                        e
                    }
                    None => failed_before_running(&id, message.clone()),
                };
                error.message = format!("prime-intellect sandbox did not start: {message}");
                return Err(error);
            }
            if let Some(egress) = &spec.egress {
                if let Err(e) = self.install_ca(&id, egress).await {
                    return Err(ca_not_installed(&id, "sandbox", e));
                }
            }
            Ok(Instance {
                id,
                tags: spec.tags,
                state: InstanceState::Running,
            })
        })
    }

    fn get<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        Box::pin(async move {
            let view = self.view(instance_id).await.map_err(provider_error)?;
            // Prime keeps ended sandboxes visible: they are gone to sandgate.
            Ok(view.filter(|v| live(&v.status)).map(|v| instance_of(&v)))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            let filter = TagFilter::new(sandbox_id, attempt_id);
            let labels = filter_labels(&filter);
            let labels = &labels;
            tags::list(filter, 100, move |page| async move {
                let number: u64 = page.as_deref().and_then(|p| p.parse().ok()).unwrap_or(1);
                let list = self.sandbox_page(labels, number).await?;
                let found = list
                    .sandboxes
                    .iter()
                    .filter(|s| live(&s.status))
                    .map(instance_of)
                    .collect();
                Ok((found, list.has_next.then(|| (number + 1).to_string())))
            })
            .await
            .map_err(provider_error)
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move { self.remove(instance_id).await })
    }

    fn capabilities<'a>(
        &'a self,
        _instance_id: &'a str,
    ) -> BoxFuture<'a, Result<RuntimeCapabilities, ProviderError>> {
        Box::pin(async { Ok(super::CAPABILITIES) })
    }

    fn lockdown(&self, egress: &RemoteEgress) -> Option<Value> {
        lockdown(egress)
    }

    fn ca_path(&self) -> Option<&'static str> {
        Some(CA_PATH)
    }

    fn adopt<'a>(
        &'a self,
        instance_id: &'a str,
        egress: Option<&'a RemoteEgress>,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let Some(egress) = egress else {
                return Ok(());
            };
            // An adopted sandbox may still be booting; the CA's directory is made first.
            self.await_running(instance_id)
                .await
                .map_err(|(_, m)| failed_before_running(instance_id, m))?;
            self.install_ca(instance_id, egress)
                .await
                .map_err(|e| crate::providers::adoption_failed(&e))
        })
    }

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            let build = || {
                self.http
                    .request(Method::GET, "/api/v1/sandbox")
                    .query(&[("page", "1"), ("per_page", "1")])
            };
            self.http
                .send_idempotent(build)
                .await
                .map_err(provider_error)?;
            Ok(format!("listed sandboxes at {}", self.http.base_url()))
        })
    }

    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
    ) -> BoxFuture<'a, Result<ExecStream, OpError>> {
        Box::pin(self.exec_stream(instance_id, spec))
    }

    fn read_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, OpError>> {
        Box::pin(self.download(instance_id, path))
    }

    fn snapshot<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotInfo, OpError>> {
        Box::pin(self.checkpoint(instance_id))
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let path = format!("/api/v1/sandbox/checkpoints/{}", path_segment(snapshot_id));
            let result = self
                .http
                .send_idempotent(|| self.http.request(Method::DELETE, &path))
                .await;
            absent_ok(result).map(|_| ()).map_err(op_error)
        })
    }

    /// Prime's clock is fixed at create (`timeout_minutes`; its API has no way to extend it):
    /// a lifetime that outlasts it is reported, so the operator raises the account's
    /// `timeout_minutes`, instead of the sandbox vanishing unannounced.
    fn extend_lifetime<'a>(
        &'a self,
        instance_id: &'a str,
        remaining: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let Some(remaining) = remaining else {
                return Ok(());
            };
            let view = self.view(instance_id).await.map_err(op_error)?;
            let Some(left) = view.and_then(|v| v.time_left()) else {
                return Ok(());
            };
            if remaining + LIFETIME_MARGIN <= left {
                return Ok(());
            }
            Err(OpError::new(
                OpErrorKind::Unsupported,
                format!(
                    "prime-intellect ends this sandbox in {}s (its timeout_minutes, fixed at \
                     create) and cannot extend it; the sandbox's lifetime asks for {}s",
                    left.as_secs(),
                    remaining.as_secs()
                ),
            ))
        })
    }

    fn write_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        data: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(self.upload(instance_id, path, data))
    }
}

impl Prime {
    /// `POST /api/v1/sandbox/{id}/checkpoints`, then polled until `DURABLE` (only a durable
    /// checkpoint can be restored); `FAILED` or `DELETING` is a provider failure.
    async fn checkpoint(&self, id: &str) -> Result<SnapshotInfo, OpError> {
        let path = format!("/api/v1/sandbox/{}/checkpoints", path_segment(id));
        let request = self.http.request(Method::POST, &path);
        let response = self.http.send(request).await.map_err(op_error)?;
        let first: CheckpointView = self.http.json(response).await.map_err(op_error)?;
        let path = format!("/api/v1/sandbox/checkpoints/{}", path_segment(&first.id));
        let fetch = || async {
            let build = || self.http.request(Method::GET, &path);
            match self.http.send_idempotent(build).await {
                Ok(response) => self.http.json(response).await.map_err(op_error),
                Err(f) => Err(op_error(f)),
            }
        };
        let judge = |c: CheckpointView| match c.state.as_str() {
            "DURABLE" => Seen::Ready(c),
            "FAILED" | "DELETING" => Seen::Stop(OpError::new(
                OpErrorKind::Provider,
                format!(
                    "prime-intellect checkpoint {} became {}: {}",
                    c.id,
                    c.state,
                    c.error.unwrap_or_default()
                ),
            )),
            other => Seen::Waiting(other.to_string()),
        };
        let deadline = Instant::now() + self.account.boot_timeout;
        let pace = Pace::growing(Duration::from_millis(200), Duration::from_secs(2));
        let done = poll::until(deadline, pace, Some(first), judge, fetch)
            .await
            .map_err(|waited| match waited {
                Waited::Stopped(e) => e,
                Waited::TimedOut(state) => OpError::new(
                    OpErrorKind::Provider,
                    format!("prime-intellect checkpoint was still {state}"),
                ),
            })?;
        Ok(SnapshotInfo {
            id: done.id,
            size_bytes: done.occupied_bytes.or(done.stored_bytes).unwrap_or(0),
        })
    }

    /// One page of `GET /api/v1/sandbox` with the filter's labels, live sandboxes only.
    async fn sandbox_page(&self, labels: &[String], page: u64) -> Result<SandboxList, HttpFailure> {
        let build = || {
            let mut query = vec![
                ("page", page.to_string()),
                ("per_page", "100".to_string()),
                ("is_active", "true".to_string()),
            ];
            if let Some(team) = &self.account.team_id {
                query.push(("team_id", team.clone()));
            }
            for label in labels {
                query.push(("labels", label.clone()));
            }
            self.http
                .request(Method::GET, "/api/v1/sandbox")
                .query(&query)
        };
        let response = self.http.send_idempotent(build).await?;
        self.http.json(response).await
    }
}
