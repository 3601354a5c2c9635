//! The [`Provider`] implementation for Runloop: the coordinator's calls (create, get, list
//! by tag, delete, adopt) and the sandbox operations (exec, files, keep-alive, suspend and
//! resume, disk snapshots), each mapped onto the API as the module docs of `runloop`
//! describe.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::exec::{follow, kill};
use super::wire::{instance_of, DevboxList, DevboxView};
use super::{
    command_line, lockdown, op_error, provider_error, request_id, Runloop, CA_PATH, ERRORS,
    REQUEST_ID,
};
use crate::ops::{ExecSpec, ExecStream, Lifecycle};
use crate::providers::hosted::errors::failed_before_running;
use crate::providers::hosted::http::{absent_ok, path_segment, HttpFailure};
use crate::providers::hosted::lockdown::ca_not_installed;
use crate::providers::hosted::tags::{self, TagFilter};
use crate::providers::{
    BoxFuture, CreateSpec, Instance, InstanceState, OpError, OpErrorKind, Provider, ProviderError,
    RemoteEgress, RuntimeCapabilities, SnapshotInfo,
};

impl Provider for Runloop {
    fn kind(&self) -> &'static str {
        "runloop"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            let mut body = self.create_body(&spec);
            if let Some(egress) = spec.egress.as_ref().filter(|e| e.lock_down) {
                let policy = self.policy_for(egress).await?;
                body["launch_parameters"]["network_policy_id"] = json!(policy);
            }
            // The attempt id as the idempotency key: a create re-sent after a lost answer is
            // the same devbox.
            let request = self
                .http
                .request(Method::POST, "/v1/devboxes")
                .header(REQUEST_ID, &spec.tags.attempt_id)
                .json(&body);
            let response = self
                .http
                .send(request)
                .await
                .map_err(|f| ERRORS.create_error(f))?;
            let created: DevboxView = self
                .http
                .json(response)
                .await
                .map_err(|f| ERRORS.unreadable_create(f))?;
            let id = created.id;
            if let Err((failure, message)) = self
                .await_status(&id, "running", self.account.boot_timeout)
                .await
            {
                let mut error = match failure {
                    Some(f) => {
                        let mut e = provider_error(f);
                        e.instance_id = Some(id.clone());
                        e
                    }
                    None => failed_before_running(&id, message.clone()),
                };
                error.message = format!("runloop devbox did not start: {message}");
                return Err(error);
            }
            if let Some(egress) = &spec.egress {
                if let Err(e) = self.install_ca(&id, egress).await {
                    return Err(ca_not_installed(&id, "devbox", e));
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
            Ok(view
                .filter(|v| v.status != "shutdown")
                .map(|v| instance_of(&v)))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            // Runloop's list has no metadata filter: every page is read, filtered here.
            let filter = TagFilter::new(sandbox_id, attempt_id);
            tags::list(filter, 200, move |after| async move {
                let page = self.devbox_page(after.as_deref()).await?;
                let live = page
                    .devboxes
                    .iter()
                    .filter(|d| d.status != "shutdown" && d.status != "failure")
                    .map(instance_of)
                    .collect();
                // The next page starts after the last devbox of this one.
                let next = page
                    .devboxes
                    .last()
                    .filter(|_| page.has_more)
                    .map(|d| d.id.clone());
                Ok((live, next))
            })
            .await
            .map_err(provider_error)
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move { self.shutdown(instance_id).await })
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
            // Runloop's file write does not make the directory: the trait's default would
            // fail on a fresh devbox.
            self.install_ca(instance_id, egress)
                .await
                .map_err(|e| crate::providers::adoption_failed(&e))
        })
    }

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            let build = || {
                self.http
                    .request(Method::GET, "/v1/devboxes")
                    .query(&[("limit", "1"), ("include_total_count", "false")])
            };
            self.http
                .send_idempotent(build)
                .await
                .map_err(provider_error)?;
            Ok(format!("listed devboxes at {}", self.http.base_url()))
        })
    }

    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
    ) -> BoxFuture<'a, Result<ExecStream, OpError>> {
        Box::pin(async move {
            let command = command_line(&spec)?;
            let started = self.start_execution(instance_id, &command).await?;
            let (tx, rx) = mpsc::channel(64);
            let task = tokio::spawn(follow(
                self.http.clone(),
                instance_id.to_string(),
                started.execution_id.clone(),
                spec.timeout,
                tx,
            ));
            let http = self.http.clone();
            let devbox = instance_id.to_string();
            let execution = started.execution_id;
            let once = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                task.abort();
                if once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let (http, devbox, execution) = (http.clone(), devbox.clone(), execution.clone());
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move { kill(&http, &devbox, &execution).await });
                }
            });
            Ok(ExecStream { events: rx, cancel })
        })
    }

    fn read_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, OpError>> {
        Box::pin(async move {
            let url = format!("/v1/devboxes/{}/download_file", path_segment(instance_id));
            let body = json!({"path": path});
            let response = self
                .http
                .send_idempotent(|| self.http.request(Method::POST, &url).json(&body))
                .await
                .map_err(op_error)?;
            self.http.file_bytes(response, path).await
        })
    }

    fn write_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        data: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            match String::from_utf8(data) {
                Ok(text) => self.write_text(instance_id, path, &text).await,
                Err(e) => {
                    let data = e.into_bytes();
                    let url = format!("/v1/devboxes/{}/upload_file", path_segment(instance_id));
                    let file_name = path.rsplit('/').next().unwrap_or("file").to_string();
                    let form = reqwest::multipart::Form::new()
                        .text("path", path.to_string())
                        .part(
                            "file",
                            reqwest::multipart::Part::bytes(data).file_name(file_name),
                        );
                    let request = self
                        .http
                        .request(Method::POST, &url)
                        .header(REQUEST_ID, request_id())
                        .multipart(form);
                    self.http.send(request).await.map_err(op_error)?;
                    Ok(())
                }
            }
        })
    }

    /// Runloop's clock is an idle timer (`keep_alive_time_seconds` at launch): a keep-alive
    /// resets it, and the liveness pass sends one far more often than any idle time, so a
    /// devbox sandgate serves is never shut down for idleness, with or without a lifetime.
    fn extend_lifetime<'a>(
        &'a self,
        instance_id: &'a str,
        remaining: Option<std::time::Duration>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        let _ = remaining;
        Box::pin(async move {
            let path = format!("/v1/devboxes/{}/keep_alive", path_segment(instance_id));
            let rid = request_id();
            self.http
                .send_idempotent(|| {
                    self.http
                        .request(Method::POST, &path)
                        .header(REQUEST_ID, &rid)
                })
                .await
                .map_err(op_error)?;
            Ok(())
        })
    }

    fn lifecycle<'a>(
        &'a self,
        instance_id: &'a str,
        operation: Lifecycle,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let (verb, target) = match operation {
                Lifecycle::Pause => ("suspend", "suspended"),
                Lifecycle::Resume => ("resume", "running"),
                Lifecycle::Stop | Lifecycle::Start => {
                    return Err(OpError::unsupported("runloop", operation.as_str()))
                }
            };
            let url = format!("/v1/devboxes/{}/{verb}", path_segment(instance_id));
            let request = self
                .http
                .request(Method::POST, &url)
                .header(REQUEST_ID, request_id());
            self.http.send(request).await.map_err(op_error)?;
            self.await_status(instance_id, target, self.account.boot_timeout)
                .await
                .map_err(|(f, message)| match f {
                    Some(f) => op_error(f),
                    None => OpError::new(OpErrorKind::Provider, message),
                })
        })
    }

    fn snapshot<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotInfo, OpError>> {
        Box::pin(async move {
            let url = format!("/v1/devboxes/{}/snapshot_disk", path_segment(instance_id));
            let request = self
                .http
                .request(Method::POST, &url)
                .header(REQUEST_ID, request_id())
                .timeout(Duration::from_secs(600))
                .json(&json!({"name": format!("sandgate-{instance_id}")}));
            let response = self.http.send(request).await.map_err(op_error)?;
            let body: Value = self.http.json(response).await.map_err(op_error)?;
            let id = body["id"].as_str().ok_or_else(|| {
                OpError::new(
                    OpErrorKind::Provider,
                    "runloop answered a snapshot without an id",
                )
            })?;
            Ok(SnapshotInfo {
                id: id.to_string(),
                size_bytes: body["size_bytes"].as_u64().unwrap_or(0),
            })
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let url = format!(
                "/v1/devboxes/disk_snapshots/{}/delete",
                path_segment(snapshot_id)
            );
            let rid = request_id();
            let result = self
                .http
                .send_idempotent(|| {
                    self.http
                        .request(Method::POST, &url)
                        .header(REQUEST_ID, &rid)
                })
                .await;
            absent_ok(result).map(|_| ()).map_err(op_error)
        })
    }
}

impl Runloop {
    /// One page of `GET /v1/devboxes`, after the devbox `after`.
    async fn devbox_page(&self, after: Option<&str>) -> Result<DevboxList, HttpFailure> {
        let build = || {
            let mut query = vec![
                ("limit", "100".to_string()),
                ("include_total_count", "false".to_string()),
            ];
            if let Some(after) = after {
                query.push(("starting_after", after.to_string()));
            }
            self.http.request(Method::GET, "/v1/devboxes").query(&query)
        };
        let response = self.http.send_idempotent(build).await?;
        self.http.json(response).await
    }
}
