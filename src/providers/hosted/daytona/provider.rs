//! The [`Provider`] implementation for Daytona: the coordinator's calls (create, get,
//! list by tag, delete, capabilities) and the sandbox operations (exec, files, lifecycle,
//! snapshots), each mapped onto the control plane or the toolbox as the module docs of
//! `daytona` describe.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use http::StatusCode;
use reqwest::Method;
use serde_json::{json, Value};

use super::wire::{resource_shortfall, FileInfoDto, SandboxDto, SnapshotDto};
use super::{
    is_gone, lockdown, op_error, provider_error, Daytona, CA_PATH, DELETE_CONFLICT_WINDOW,
    STATE_PACE,
};
use crate::ops::{ExecSpec, ExecStream, Lifecycle, SandboxEntry};
use crate::providers::hosted::http::{absent_ok, path_segment};
use crate::providers::hosted::poll::{self, Seen, Waited};
use crate::providers::hosted::tags::{self, TagFilter};
use crate::providers::{
    BoxFuture, CreateSpec, ErrorClass, Instance, OpError, OpErrorKind, Provider, ProviderError,
    RemoteEgress, RuntimeCapabilities, SnapshotInfo,
};

impl Provider for Daytona {
    fn kind(&self) -> &'static str {
        "daytona"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(self.create_instance(spec))
    }

    fn lockdown(&self, egress: &RemoteEgress) -> Option<Value> {
        lockdown(egress)
    }

    fn ca_path(&self) -> Option<&'static str> {
        Some(CA_PATH)
    }

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            let build = || self.api(Method::GET, "/sandbox").query(&[("limit", "1")]);
            self.http
                .send_idempotent(build)
                .await
                .map_err(provider_error)?;
            Ok(format!("listed sandboxes at {}", self.http.base_url()))
        })
    }

    fn get<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        Box::pin(async move {
            let detail = self.detail(instance_id).await.map_err(provider_error)?;
            Ok(detail
                .filter(|d| !is_gone(d.state.as_deref()))
                .map(|d| d.instance()))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            // The labels filter is a JSON object (keys in order), as the SDKs send it.
            let filter = TagFilter::new(sandbox_id, attempt_id);
            let wanted: BTreeMap<_, _> = filter.pairs().into_iter().collect();
            let labels = serde_json::to_string(&wanted).unwrap_or_default();
            let labels = &labels;
            tags::list(filter, 100, move |cursor| async move {
                let (page, next) = self.list_page(labels, cursor.as_deref()).await?;
                let live = page
                    .iter()
                    .filter(|s| !is_gone(s.state.as_deref()))
                    .map(SandboxDto::instance)
                    .collect();
                Ok((live, next))
            })
            .await
            .map_err(provider_error)
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let path = format!("/sandbox/{}", path_segment(instance_id));
            let started = Instant::now();
            let mut pause = Duration::from_millis(250);
            let result = loop {
                match self
                    .http
                    .send_idempotent(|| self.api(Method::DELETE, &path))
                    .await
                {
                    Ok(_) => break Ok(()),
                    Err(f) if f.status == Some(StatusCode::NOT_FOUND) => break Ok(()),
                    // A state change is in progress (creating, stopping, ...): wait for it.
                    Err(f)
                        if f.status == Some(StatusCode::CONFLICT)
                            && started.elapsed() + pause < DELETE_CONFLICT_WINDOW =>
                    {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                    Err(f) => break Err(provider_error(f)),
                }
            };
            if result.is_ok() {
                self.toolbox
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(instance_id);
                self.requested
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(instance_id);
            }
            result
        })
    }

    fn capabilities<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<RuntimeCapabilities, ProviderError>> {
        Box::pin(async move {
            let dto = self
                .detail(instance_id)
                .await
                .map_err(provider_error)?
                .ok_or_else(|| {
                    ProviderError::new(
                        ErrorClass::FailedBeforeRunning,
                        format!("daytona does not know sandbox {instance_id}"),
                    )
                })?;
            if dto.state.as_deref() != Some("started") {
                return Err(ProviderError::new(
                    ErrorClass::FailedBeforeRunning,
                    format!(
                        "the Daytona sandbox {instance_id} is {}, not started",
                        dto.state.as_deref().unwrap_or("in no state")
                    ),
                ));
            }
            let requested = self
                .requested
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(instance_id)
                .cloned();
            if let Some(requested) = requested {
                let short = resource_shortfall(&requested, &dto);
                if !short.is_empty() {
                    return Err(ProviderError::new(
                        ErrorClass::RuntimeShortfall,
                        format!(
                            "the Daytona sandbox {instance_id} has less than requested: {}",
                            short.join(", ")
                        ),
                    ));
                }
            }
            // Pause and resume on VM classes only.
            let pausable = matches!(dto.sandbox_class.as_deref(), Some("linux-vm" | "windows"));
            Ok(RuntimeCapabilities {
                pause_resume: pausable,
                ..super::CAPABILITIES
            })
        })
    }

    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
    ) -> BoxFuture<'a, Result<ExecStream, OpError>> {
        Box::pin(self.start_exec(instance_id, spec))
    }

    fn read_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, OpError>> {
        Box::pin(async move {
            let request = self
                .toolbox(instance_id, Method::GET, "/files/download")
                .await?
                .query(&[("path", path)]);
            let response = self.http.send(request).await.map_err(op_error)?;
            self.http.file_bytes(response, path).await
        })
    }

    fn write_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        data: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(self.put_file(instance_id, path, data))
    }

    fn list_dir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SandboxEntry>, OpError>> {
        Box::pin(async move {
            let request = self
                .toolbox(instance_id, Method::GET, "/files")
                .await?
                .query(&[("path", path)]);
            let response = self.http.send(request).await.map_err(op_error)?;
            let entries: Vec<FileInfoDto> = self.http.json(response).await.map_err(op_error)?;
            Ok(entries.into_iter().map(SandboxEntry::from).collect())
        })
    }

    fn remove_path<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        recursive: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let request = self
                .toolbox(instance_id, Method::DELETE, "/files")
                .await?
                .query(&[
                    ("path", path),
                    ("recursive", if recursive { "true" } else { "false" }),
                ]);
            self.http.send(request).await.map_err(op_error)?;
            Ok(())
        })
    }

    fn mkdir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        parents: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            if !parents {
                // Daytona's folder call always creates the parents: check them first.
                if self.file_exists(instance_id, path).await? {
                    return Err(OpError::new(
                        OpErrorKind::Conflict,
                        format!("{path} already exists"),
                    ));
                }
                let trimmed = path.trim_end_matches('/');
                if let Some((parent, _)) = trimmed.rsplit_once('/') {
                    if !parent.is_empty() && !self.file_exists(instance_id, parent).await? {
                        return Err(OpError::new(
                            OpErrorKind::NotFound,
                            format!("the parent directory of {path} does not exist"),
                        ));
                    }
                }
            }
            let request = self
                .toolbox(instance_id, Method::POST, "/files/folder")
                .await?
                .query(&[("path", path), ("mode", "755")]);
            self.http.send(request).await.map_err(op_error)?;
            Ok(())
        })
    }

    fn lifecycle<'a>(
        &'a self,
        instance_id: &'a str,
        operation: Lifecycle,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(self.transition(instance_id, operation))
    }

    fn snapshot<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotInfo, OpError>> {
        Box::pin(async move {
            let name = format!("sandgate-{}", crate::base::ids::random_hex(8));
            let path = format!("/sandbox/{}/snapshot", path_segment(instance_id));
            let request = self.api(Method::POST, &path).json(&json!({"name": name}));
            let response = self.http.send(request).await.map_err(op_error)?;
            let dto: SandboxDto = self.http.json(response).await.map_err(op_error)?;
            let deadline = Instant::now() + self.create_timeout;
            // The sandbox returns to its previous state once its filesystem is captured.
            let settled = [
                "started",
                "stopped",
                "paused",
                "archived",
                "error",
                "build_failed",
            ];
            self.wait_for(instance_id, dto, &settled[..4], deadline)
                .await
                .map_err(|e| e.into_op_error(instance_id, "snapshot"))?;
            let snapshot = self.snapshot_active(&name, deadline).await?;
            Ok(SnapshotInfo {
                id: name,
                size_bytes: snapshot
                    .size
                    .map_or(0, |gb| (gb * 1024.0 * 1024.0 * 1024.0) as u64),
            })
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            // The snapshot is named by its name; Daytona deletes by its own id.
            let path = format!("/snapshots/{}", path_segment(snapshot_id));
            let snapshot: Option<SnapshotDto> = self
                .http
                .read_optional(|| self.api(Method::GET, &path))
                .await
                .map_err(op_error)?;
            let Some(snapshot) = snapshot else {
                return Ok(());
            };
            let path = format!("/snapshots/{}", path_segment(&snapshot.id));
            let result = self
                .http
                .send_idempotent(|| self.api(Method::DELETE, &path))
                .await;
            absent_ok(result).map(|_| ()).map_err(op_error)
        })
    }
}

impl Daytona {
    /// Polls `GET /snapshots/{name}` until Daytona has built the snapshot.
    async fn snapshot_active(&self, name: &str, deadline: Instant) -> Result<SnapshotDto, OpError> {
        let path = &format!("/snapshots/{}", path_segment(name));
        let fetch = move || async move {
            let response = self
                .http
                .send_idempotent(|| self.api(Method::GET, path))
                .await
                .map_err(op_error)?;
            self.http
                .json::<SnapshotDto>(response)
                .await
                .map_err(op_error)
        };
        let judge = |snapshot: SnapshotDto| match snapshot.state.as_deref() {
            Some("active") => Seen::Ready(snapshot),
            Some(state @ ("error" | "build_failed")) => Seen::Stop(OpError::new(
                OpErrorKind::Provider,
                format!(
                    "daytona: snapshot {name} is {state}: {}",
                    snapshot.error_reason.as_deref().unwrap_or_default()
                ),
            )),
            state => Seen::Waiting(state.unwrap_or_default().to_string()),
        };
        poll::until(deadline, STATE_PACE, None, judge, fetch)
            .await
            .map_err(|waited| match waited {
                Waited::Stopped(e) => e,
                Waited::TimedOut(_) => OpError::new(
                    OpErrorKind::Provider,
                    format!("daytona: snapshot {name} did not become active in time"),
                ),
            })
    }
}
