//! The [`Provider`] implementation for CodeSandbox: the coordinator's calls (create, get, list
//! by tag, delete, adopt) and the lifecycle (hibernate, start, shutdown, fork as snapshot),
//! each mapped onto the API as the module docs of `codesandbox` describe. Exec and files
//! keep the trait's `unsupported` answers.

use reqwest::Method;
use serde_json::{json, Value};

use super::wire::{instance_of, SandboxPage, SandboxView};
use super::{
    lockdown_refusal, op_error, provider_error, Codesandbox, CAPABILITIES, ERRORS, TAG_SNAPSHOT,
};
use crate::ops::{Lifecycle, SnapshotInfo};
use crate::providers::hosted::errors::left_behind;
use crate::providers::hosted::http::{absent_ok, path_segment, HttpFailure};
use crate::providers::hosted::tags::{self, TagFilter};
use crate::providers::{
    BoxFuture, CreateSpec, ErrorClass, Instance, InstanceState, OpError, Provider, ProviderError,
    RemoteEgress, RuntimeCapabilities,
};

impl Provider for Codesandbox {
    fn kind(&self) -> &'static str {
        "codesandbox"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            if spec.egress.as_ref().is_some_and(|e| e.lock_down) {
                return Err(lockdown_refusal());
            }
            let from = self.source(&spec)?;
            let id = self
                .fork(&from, &Self::fork_body(&spec))
                .await
                .map_err(|f| ERRORS.create_error(f))?;
            self.start(&id).await.map_err(|f| start_failed(&id, f))?;
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
            let path = format!("/sandbox/{}", path_segment(instance_id));
            let response = absent_ok(
                self.http
                    .send_idempotent(|| self.http.request(Method::GET, &path))
                    .await,
            )
            .map_err(provider_error)?;
            let Some(response) = response else {
                return Ok(None);
            };
            let view: SandboxView = self.data(response).await.map_err(provider_error)?;
            Ok(Some(instance_of(&view)))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            let filter = TagFilter::new(sandbox_id, attempt_id);
            let wanted: Vec<String> = filter
                .pairs()
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let wanted = wanted.join(",");
            let wanted = &wanted;
            tags::list(filter, 200, move |cursor| async move {
                let page = self.sandbox_page(wanted, cursor.as_deref()).await?;
                let found = page.sandboxes.iter().map(instance_of).collect();
                Ok((found, page.pagination.next_page.map(|n| n.to_string())))
            })
            .await
            .map_err(provider_error)
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move { self.remove(instance_id).await.map_err(provider_error) })
    }

    fn capabilities<'a>(
        &'a self,
        _instance_id: &'a str,
    ) -> BoxFuture<'a, Result<RuntimeCapabilities, ProviderError>> {
        Box::pin(async { Ok(CAPABILITIES) })
    }

    fn lockdown(&self, _egress: &RemoteEgress) -> Option<Value> {
        // Nothing native exists to apply (see `LOCKS_DOWN`).
        None
    }

    fn adopt<'a>(
        &'a self,
        instance_id: &'a str,
        _egress: Option<&'a RemoteEgress>,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        // A fork whose answer was lost was never started: start it as the create would have.
        Box::pin(async move {
            self.start(instance_id)
                .await
                .map(|_| ())
                .map_err(|f| start_failed(instance_id, f))
        })
    }

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            self.http
                .send_idempotent(|| {
                    self.http
                        .request(Method::GET, "/sandbox")
                        .query(&[("page_size", "1")])
                })
                .await
                .map_err(provider_error)?;
            Ok(format!("listed sandboxes at {}", self.http.base_url()))
        })
    }

    fn lifecycle<'a>(
        &'a self,
        instance_id: &'a str,
        operation: Lifecycle,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let result = match operation {
                Lifecycle::Pause => self.vm_call(instance_id, "hibernate").await,
                Lifecycle::Stop => self.vm_call(instance_id, "shutdown").await,
                // Resuming a hibernated VM and booting a shut-down one are the same call.
                Lifecycle::Resume | Lifecycle::Start => self.start(instance_id).await.map(|_| ()),
            };
            result.map_err(op_error)
        })
    }

    fn snapshot<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotInfo, OpError>> {
        Box::pin(async move {
            let body = json!({
                "title": format!("sandgate snapshot of {instance_id}"),
                "tags": [format!("{TAG_SNAPSHOT}={instance_id}")],
                "privacy": 2,
                "private_preview": true,
                "path": "/sandgate/snapshots",
            });
            let id = self.fork(instance_id, &body).await.map_err(op_error)?;
            // CodeSandbox does not report a sandbox's size.
            Ok(SnapshotInfo { id, size_bytes: 0 })
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move { self.remove(snapshot_id).await.map_err(op_error) })
    }
}

/// A start that failed after its fork: the sandbox exists, so the error names it for
/// deletion. A refusal keeps its class (capacity, rate limit: another attempt may do
/// better); anything else is `failed_before_running`.
fn start_failed(id: &str, failure: HttpFailure) -> ProviderError {
    let error = provider_error(failure);
    let class = match error.class {
        ErrorClass::ProviderError | ErrorClass::Unknown => ErrorClass::FailedBeforeRunning,
        other => other,
    };
    let mut out = left_behind(
        id,
        class,
        format!("codesandbox sandbox {id} did not start: {}", error.message),
    );
    out.retry_after = error.retry_after;
    out
}

impl Codesandbox {
    /// One page of `GET /sandbox?tags=...` from page `cursor` (the first when `None`).
    async fn sandbox_page(
        &self,
        tags: &str,
        cursor: Option<&str>,
    ) -> Result<SandboxPage, HttpFailure> {
        let page = cursor.unwrap_or("1").to_string();
        let build = || {
            self.http.request(Method::GET, "/sandbox").query(&[
                ("tags", tags),
                ("page", page.as_str()),
                ("page_size", "50"),
            ])
        };
        let response = self.http.send_idempotent(build).await?;
        self.data(response).await
    }

    /// `DELETE /vm/{id}`; an absent sandbox is deleted already.
    async fn remove(&self, id: &str) -> Result<(), HttpFailure> {
        let path = format!("/vm/{}", path_segment(id));
        absent_ok(
            self.http
                .send_idempotent(|| self.http.request(Method::DELETE, &path))
                .await,
        )
        .map(|_| ())
    }
}
