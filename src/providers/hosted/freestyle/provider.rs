//! The [`Provider`] implementation for Freestyle: the coordinator's calls (create, get, list
//! by tag, delete) and the sandbox operations (exec, files, suspend/resume/stop/start,
//! snapshots), each mapped onto the API as the module docs of `freestyle` describe.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::wire::{Created, VmList};
use super::{
    lockdown_refusal, op_error, provider_error, Freestyle, CAPABILITIES, CA_PATH, ENV_PATH, ERRORS,
};
use crate::ops::{ExecEvent, ExecSpec, ExecStream, ExitInfo, ExitReason, Lifecycle, SandboxEntry};
use crate::providers::hosted::errors::failed_before_running;
use crate::providers::hosted::http::{absent_ok, path_segment};
use crate::providers::hosted::shell::{command_line, shell_quote};
use crate::providers::hosted::tags::TagFilter;
use crate::providers::{
    BoxFuture, CreateSpec, Instance, InstanceState, OpError, OpErrorKind, Provider, ProviderError,
    RemoteEgress, RuntimeCapabilities, SnapshotInfo,
};

/// How many VMs' tag files a listing reads at once.
const TAG_READS: usize = 8;

impl Provider for Freestyle {
    fn kind(&self) -> &'static str {
        "freestyle"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            if spec.egress.as_ref().is_some_and(|e| e.lock_down) {
                return Err(lockdown_refusal());
            }
            // Tags, environment and CA travel in the create itself (`additionalFiles`).
            let request = self
                .http
                .request(Method::POST, "/v1/vms")
                .timeout(self.account.boot_timeout + Duration::from_secs(30))
                .json(&self.create_body(&spec));
            let response = self
                .http
                .send(request)
                .await
                .map_err(|f| ERRORS.create_error(f))?;
            let created: Created = self
                .http
                .json(response)
                .await
                .map_err(|f| ERRORS.unreadable_create(f))?;
            let id = created.id;
            self.remember(&id, &spec.tags);
            let booted = self
                .await_state(&id, "running", self.account.boot_timeout)
                .await;
            if let Err((failure, message)) = booted {
                let mut error = match failure {
                    Some(f) => {
                        let mut e = provider_error(f);
                        e.instance_id = Some(id.clone());
                        e
                    }
                    None => failed_before_running(&id, message.clone()),
                };
                error.message = format!("freestyle VM did not start: {message}");
                return Err(error);
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
            let Some(view) = self.view(instance_id).await.map_err(provider_error)? else {
                self.forget(instance_id);
                return Ok(None);
            };
            if view.deleted == Some(true) {
                return Ok(None);
            }
            Ok(Some(Instance {
                tags: self
                    .known_tags(&view.id)
                    .unwrap_or_else(|| crate::providers::hosted::tags::tags_of(None)),
                state: view.instance_state(),
                id: view.id,
            }))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            // Freestyle's list has no labels: each VM's tag file says whose it is.
            let filter = TagFilter::new(sandbox_id, attempt_id);
            let build = || self.http.request(Method::GET, "/v1/vms");
            let response = self
                .http
                .send_idempotent(build)
                .await
                .map_err(provider_error)?;
            let list: VmList = self.http.json(response).await.map_err(provider_error)?;
            // A few tag files at a time: an account may hold many VMs.
            let read = list
                .vms
                .into_iter()
                .filter(|v| v.deleted != Some(true))
                .map(|vm| async move { (self.tags_of(&vm.id).await, vm) });
            let tagged: Vec<_> = futures_util::stream::iter(read)
                .buffered(TAG_READS)
                .collect()
                .await;
            Ok(tagged
                .into_iter()
                .filter_map(|(tags, vm)| {
                    let tags = tags.filter(|t| filter.matches(t))?;
                    Some(Instance {
                        state: vm.instance_state(),
                        id: vm.id,
                        tags,
                    })
                })
                .collect())
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let path = Self::vm_path(instance_id, "");
            let result = self
                .http
                .send_idempotent(|| self.http.request(Method::DELETE, &path))
                .await;
            absent_ok(result).map_err(provider_error)?;
            self.forget(instance_id);
            Ok(())
        })
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

    fn ca_path(&self) -> Option<&'static str> {
        Some(CA_PATH)
    }

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            let build = || self.http.request(Method::GET, "/v1/vms");
            let response = self
                .http
                .send_idempotent(build)
                .await
                .map_err(provider_error)?;
            let list: VmList = self.http.json(response).await.map_err(provider_error)?;
            Ok(format!(
                "listed {} VMs at {}",
                list.vms.len(),
                self.http.base_url()
            ))
        })
    }

    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
    ) -> BoxFuture<'a, Result<ExecStream, OpError>> {
        Box::pin(async move {
            let line = format!(
                ". {} 2>/dev/null; {}",
                shell_quote(ENV_PATH),
                command_line(&spec)?
            );
            let (tx, rx) = mpsc::channel(4);
            let done = self.run(instance_id, &line, spec.timeout).await?;
            let exit = match (done.status_code, spec.timeout) {
                (Some(code), _) => ExitInfo {
                    code: Some(code as i32),
                    signal: None,
                    reason: ExitReason::Exited,
                },
                (None, Some(_)) => ExitInfo {
                    code: None,
                    signal: None,
                    reason: ExitReason::TimedOut,
                },
                (None, None) => {
                    return Err(OpError::new(
                        OpErrorKind::Provider,
                        "freestyle answered an exec without a status code",
                    ))
                }
            };
            // The command has ended: its whole output is delivered at once.
            let events = [
                done.stdout
                    .filter(|s| !s.is_empty())
                    .map(|s| ExecEvent::Stdout(Bytes::from(s))),
                done.stderr
                    .filter(|s| !s.is_empty())
                    .map(|s| ExecEvent::Stderr(Bytes::from(s))),
                Some(ExecEvent::Exit(exit)),
            ];
            tokio::spawn(async move {
                for event in events.into_iter().flatten() {
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
            });
            let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(|| {});
            Ok(ExecStream { events: rx, cancel })
        })
    }

    fn read_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, OpError>> {
        Box::pin(async move {
            let view = self.file(instance_id, path).await.map_err(op_error)?;
            view.bytes()
        })
    }

    fn write_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        data: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move { self.put_file(instance_id, path, &data).await })
    }

    fn list_dir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SandboxEntry>, OpError>> {
        Box::pin(async move {
            let view = self.file(instance_id, path).await.map_err(op_error)?;
            view.entries().ok_or_else(|| {
                OpError::new(OpErrorKind::Invalid, format!("{path} is not a directory"))
            })
        })
    }

    fn remove_path<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        recursive: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let flag = if recursive { "-rf" } else { "-f" };
            let line = format!("rm {flag} -- {}", shell_quote(path));
            self.run_ok(instance_id, &line).await
        })
    }

    fn mkdir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        parents: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let flag = if parents { "-p " } else { "" };
            let line = format!("mkdir {flag}-- {}", shell_quote(path));
            self.run_ok(instance_id, &line).await
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
                Lifecycle::Resume | Lifecycle::Start => ("start", "running"),
                Lifecycle::Stop => ("stop", "stopped"),
            };
            let path = Self::vm_path(instance_id, &format!("/{verb}"));
            let mut request = self.http.request(Method::POST, &path);
            if verb == "start" {
                request = request.json(&json!({}));
            }
            self.http.send(request).await.map_err(op_error)?;
            self.await_state(instance_id, target, self.account.boot_timeout)
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
            let request = self
                .http
                .request(Method::POST, &Self::vm_path(instance_id, "/snapshot"))
                .timeout(Duration::from_secs(600))
                .json(&json!({"name": format!("sandgate-{instance_id}")}));
            let response = self.http.send(request).await.map_err(op_error)?;
            let body: Value = self.http.json(response).await.map_err(op_error)?;
            let id = body["snapshotId"].as_str().ok_or_else(|| {
                OpError::new(
                    OpErrorKind::Provider,
                    "freestyle answered a snapshot without a snapshotId",
                )
            })?;
            Ok(SnapshotInfo {
                id: id.to_string(),
                size_bytes: 0,
            })
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let path = format!("/v1/vms/snapshots/{}", path_segment(snapshot_id));
            let result = self
                .http
                .send_idempotent(|| self.http.request(Method::DELETE, &path))
                .await;
            absent_ok(result).map(|_| ()).map_err(op_error)
        })
    }
}
