//! The [`Provider`] implementation for Vercel: the coordinator's calls (create, get, list
//! by tag, delete) and the sandbox operations (exec, files, lifetime, lifecycle,
//! snapshots), each mapped onto the API as the module docs of `vercel` describe.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use super::wire::{instance, SandboxAndSession, SessionOnly};
use super::{lockdown, op_error, provider_error, Vercel, CA_PATH, ERRORS};
use crate::ops::{ExecEvent, ExecSpec, ExecStream, Lifecycle};
use crate::providers::hosted::errors::failed_before_running;
use crate::providers::hosted::http::{absent_ok, path_segment};
use crate::providers::hosted::lockdown::ca_not_installed;
use crate::providers::hosted::tags::{self, TagFilter};
use crate::providers::{
    BoxFuture, CreateSpec, Instance, InstanceState, OpError, OpErrorKind, Provider, ProviderError,
    RemoteEgress, RuntimeCapabilities, SnapshotInfo, LIFETIME_MARGIN,
};

impl Provider for Vercel {
    fn kind(&self) -> &'static str {
        "vercel"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            let (endpoint, body) = self.create_body(&spec);
            let request = self.request(Method::POST, endpoint).json(&body);
            let response = self
                .http
                .send(request)
                .await
                .map_err(|f| ERRORS.create_error(f))?;
            let created: SandboxAndSession = self
                .http
                .json(response)
                .await
                .map_err(|f| ERRORS.unreadable_create(f))?;
            let name = created.sandbox.name.clone();
            let (session, status) = match &created.session {
                Some(s) => (s.id.clone(), s.status.clone()),
                None => (
                    created.sandbox.current_session_id.clone(),
                    created.sandbox.status.clone(),
                ),
            };
            let failed = |message| failed_before_running(&name, message);
            if session.is_empty() {
                return Err(failed(format!(
                    "Vercel answered sandbox {name} without a session"
                )));
            }
            self.remember(&name, &session);
            self.wait_running(&session, &status).await.map_err(failed)?;
            if let Some(egress) = &spec.egress {
                if let Err(e) = self
                    .put_file(&name, CA_PATH, egress.ca_pem.clone().into_bytes())
                    .await
                {
                    return Err(ca_not_installed(&name, "sandbox", e));
                }
            }
            Ok(Instance {
                id: name,
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
            let sandbox = self
                .sandbox(instance_id, false)
                .await
                .map_err(provider_error)?;
            Ok(sandbox.as_ref().map(instance))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            // Vercel filters on the sandbox's tag only; the attempt is filtered here. A bound
            // on pages, should a cursor never end.
            let filter = TagFilter::new(sandbox_id, attempt_id);
            tags::list(filter, 1000, move |cursor| async move {
                let page = self.list_page(sandbox_id, cursor.as_deref()).await?;
                let next = page.pagination.and_then(|p| p.next);
                Ok((page.sandboxes.iter().map(instance).collect(), next))
            })
            .await
            .map_err(provider_error)
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let path = format!("/v2/sandboxes/{}", path_segment(instance_id));
            let result = self
                .http
                .send_idempotent(|| {
                    self.request(Method::DELETE, &path)
                        .query(&[("projectId", self.project_id.as_str())])
                })
                .await;
            self.forget(instance_id);
            absent_ok(result).map(|_| ()).map_err(provider_error)
        })
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

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            let build = || {
                self.request(Method::GET, "/v2/sandboxes")
                    .query(&[("project", self.project_id.as_str()), ("limit", "1")])
            };
            self.http
                .send_idempotent(build)
                .await
                .map_err(provider_error)?;
            Ok(format!(
                "listed the sandboxes of project {} at {}",
                self.project_id,
                self.http.base_url()
            ))
        })
    }

    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
    ) -> BoxFuture<'a, Result<ExecStream, OpError>> {
        Box::pin(async move { self.start(instance_id, spec).await })
    }

    fn read_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, OpError>> {
        Box::pin(async move {
            let session = self.session_of(instance_id).await?;
            let request = self
                .request(Method::POST, &Self::session_path(&session, "/fs/read"))
                .json(&json!({"path": path}));
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
        Box::pin(async move { self.put_file(instance_id, path, data).await })
    }

    fn mkdir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        parents: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            if parents {
                let spec = ExecSpec {
                    argv: vec!["mkdir".into(), "-p".into(), "--".into(), path.into()],
                    ..ExecSpec::default()
                };
                let mut stream = self.start(instance_id, spec).await?;
                let mut stderr = Vec::new();
                while let Some(event) = stream.events.recv().await {
                    match event {
                        ExecEvent::Stderr(b) => stderr.extend_from_slice(&b),
                        ExecEvent::Stdout(_) => {}
                        ExecEvent::Exit(info) if info.code == Some(0) => return Ok(()),
                        ExecEvent::Exit(_) => {
                            return Err(OpError::new(
                                OpErrorKind::Invalid,
                                format!(
                                    "mkdir -p {path}: {}",
                                    String::from_utf8_lossy(&stderr).trim()
                                ),
                            ))
                        }
                    }
                }
                return Err(OpError::new(
                    OpErrorKind::Provider,
                    format!("mkdir -p {path}: the command stream ended early"),
                ));
            }
            let session = self.session_of(instance_id).await?;
            let request = self
                .request(Method::POST, &Self::session_path(&session, "/fs/mkdir"))
                .json(&json!({"path": path}));
            self.http.send(request).await.map_err(op_error)?;
            Ok(())
        })
    }

    /// Vercel's session timeout only grows (`extend-timeout` adds a duration): it is extended
    /// to the sandbox's remaining lifetime plus the margin, or, for a sandbox without one, to
    /// the account's `timeout_ms` from now once less than half of that is left. A shorter
    /// lifetime leaves Vercel's later deadline: sandgate's own expiry deletes the sandbox.
    fn extend_lifetime<'a>(
        &'a self,
        instance_id: &'a str,
        remaining: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let session = self.session_of(instance_id).await?;
            let path = Self::session_path(&session, "");
            let response = self
                .http
                .send_idempotent(|| self.request(Method::GET, &path))
                .await
                .map_err(op_error)?;
            let body: SessionOnly = self.http.json(response).await.map_err(op_error)?;
            let Some(deadline) = body.session.deadline_ms() else {
                return Ok(());
            };
            let now = crate::base::clock::now_ms();
            let wanted = match remaining {
                Some(r) => now + (r + LIFETIME_MARGIN).as_millis() as i64,
                None if deadline - now >= self.timeout_ms as i64 / 2 => return Ok(()),
                None => now + self.timeout_ms as i64,
            };
            if wanted <= deadline {
                return Ok(());
            }
            let request = self
                .request(
                    Method::POST,
                    &Self::session_path(&session, "/extend-timeout"),
                )
                .json(&json!({"duration": wanted - deadline}));
            self.http.send(request).await.map_err(op_error)?;
            Ok(())
        })
    }

    fn lifecycle<'a>(
        &'a self,
        instance_id: &'a str,
        operation: Lifecycle,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            match operation {
                Lifecycle::Stop => {
                    let session = self.session_of(instance_id).await?;
                    let request =
                        self.request(Method::POST, &Self::session_path(&session, "/stop"));
                    self.http.send(request).await.map_err(op_error)?;
                    Ok(())
                }
                Lifecycle::Start => {
                    self.forget(instance_id);
                    self.sandbox(instance_id, true)
                        .await
                        .map_err(op_error)?
                        .ok_or_else(|| {
                            OpError::new(
                                OpErrorKind::NotFound,
                                format!("no Vercel sandbox {instance_id}"),
                            )
                        })?;
                    Ok(())
                }
                Lifecycle::Pause | Lifecycle::Resume => {
                    Err(OpError::unsupported("vercel", operation.as_str()))
                }
            }
        })
    }

    fn snapshot<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotInfo, OpError>> {
        Box::pin(async move {
            let session = self.session_of(instance_id).await?;
            let request = self.request(Method::POST, &Self::session_path(&session, "/snapshot"));
            let response = self.http.send(request).await.map_err(op_error)?;
            let body: Value = self.http.json(response).await.map_err(op_error)?;
            let id = body["snapshot"]["id"].as_str().ok_or_else(|| {
                OpError::new(
                    OpErrorKind::Provider,
                    "vercel answered a snapshot without snapshot.id",
                )
            })?;
            Ok(SnapshotInfo {
                id: id.to_string(),
                size_bytes: body["snapshot"]["sizeBytes"].as_u64().unwrap_or(0),
            })
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let path = format!("/v2/sandboxes/snapshots/{}", path_segment(snapshot_id));
            let result = self
                .http
                .send_idempotent(|| self.request(Method::DELETE, &path))
                .await;
            absent_ok(result).map(|_| ()).map_err(op_error)
        })
    }
}
