//! The [`Provider`] implementation for Blaxel: the coordinator's calls (create, get, list by
//! tag, delete) and the sandbox operations (exec, files), each mapped onto the API as the
//! module docs of `blaxel` describe.

use std::sync::{Arc, Mutex};

use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::exec::{follow, process_body, process_name, send_kill};
use super::wire::{instance_of, DirectoryView, SandboxList, SandboxView};
use super::{filesystem_path, lockdown_refusal, op_error, provider_error, Blaxel, CA_PATH, ERRORS};
use crate::ops::{ExecSpec, ExecStream, SandboxEntry};
use crate::providers::hosted::errors::failed_before_running;
use crate::providers::hosted::http::HttpFailure;
use crate::providers::hosted::lockdown::ca_not_installed;
use crate::providers::hosted::tags::{self, TagFilter};
use crate::providers::{
    BoxFuture, CreateSpec, Instance, InstanceState, OpError, Provider, ProviderError, RemoteEgress,
    RuntimeCapabilities,
};

impl Provider for Blaxel {
    fn kind(&self) -> &'static str {
        "blaxel"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            if spec.egress.as_ref().is_some_and(|e| e.lock_down) {
                return Err(lockdown_refusal());
            }
            let body = self.create_body(&spec);
            // The name is the attempt's: sent again, the create answers the same sandbox.
            let request = self
                .api(Method::POST, "/sandboxes")
                .query(&[("createIfNotExist", "true")])
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
            self.remember(&created);
            let name = created.metadata.name.clone();
            if let Err((failure, message)) = self.await_deployed(&name, created).await {
                let mut error = match failure {
                    Some(f) => {
                        let mut e = provider_error(f);
                        e.instance_id = Some(name.clone());
                        e
                    }
                    None => failed_before_running(&name, message.clone()),
                };
                error.message = format!("blaxel sandbox did not deploy: {message}");
                return Err(error);
            }
            if let Some(egress) = &spec.egress {
                if let Err(e) = self.install_ca(&name, egress).await {
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
            let view = self.view(instance_id).await.map_err(provider_error)?;
            Ok(view.filter(|v| !v.gone()).map(|v| instance_of(&v)))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            // Blaxel's list has no label filter: every page is read, filtered here.
            let filter = TagFilter::new(sandbox_id, attempt_id);
            tags::list(filter, 200, move |cursor| async move {
                let page = self.sandbox_page(cursor.as_deref()).await?;
                let live = page
                    .data
                    .iter()
                    .filter(|s| !s.dead())
                    .map(instance_of)
                    .collect();
                let next = page.meta.next_cursor.filter(|_| page.meta.has_more);
                Ok((live, next))
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

    fn lockdown(&self, _egress: &RemoteEgress) -> Option<Value> {
        // Nothing native is applied (see `LOCKS_DOWN`).
        None
    }

    fn ca_path(&self) -> Option<&'static str> {
        Some(CA_PATH)
    }

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            self.http
                .send_idempotent(|| self.api(Method::GET, "/sandboxes").query(&[("limit", "1")]))
                .await
                .map_err(provider_error)?;
            Ok(format!(
                "listed sandboxes of workspace {} at {}",
                self.account.workspace,
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
            let name = process_name();
            let body = process_body(&spec, &name)?;
            let response = self.start_process(instance_id, &body).await?;
            let kill = self.kill_request(instance_id, &name).await?;
            let (tx, rx) = mpsc::channel(64);
            let cancel_kill = Mutex::new(kill.try_clone());
            let task = tokio::spawn(follow(self.http.clone(), response, kill, spec.timeout, tx));
            let http = self.http.clone();
            let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                task.abort();
                // Once: the first cancel takes the prepared kill.
                let Some(kill) = cancel_kill.lock().unwrap_or_else(|e| e.into_inner()).take()
                else {
                    return;
                };
                let http = http.clone();
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move { send_kill(&http, kill).await });
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
            let url = format!(
                "{}{}",
                self.origin(instance_id).await?,
                filesystem_path(path)?
            );
            let build = || {
                self.with_headers(self.http.request_url(Method::GET, &url))
                    .header("Accept", "application/octet-stream")
            };
            let response = self.http.send_idempotent(build).await.map_err(op_error)?;
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
                    // Bytes as the SDK's `write_binary` sends them.
                    let file_name = path.rsplit('/').next().unwrap_or("file").to_string();
                    let form = reqwest::multipart::Form::new()
                        .part(
                            "file",
                            reqwest::multipart::Part::bytes(e.into_bytes())
                                .file_name(file_name)
                                .mime_str("application/octet-stream")
                                .map_err(|e| {
                                    OpError::new(
                                        crate::providers::OpErrorKind::Provider,
                                        e.to_string(),
                                    )
                                })?,
                        )
                        .text("permissions", "0644")
                        .text("path", path.to_string());
                    let request = self
                        .data(instance_id, Method::PUT, &filesystem_path(path)?)
                        .await?
                        .multipart(form);
                    self.http.send(request).await.map_err(op_error)?;
                    Ok(())
                }
            }
        })
    }

    fn list_dir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SandboxEntry>, OpError>> {
        Box::pin(async move {
            let url = format!(
                "{}{}",
                self.origin(instance_id).await?,
                filesystem_path(path)?
            );
            let build = || self.with_headers(self.http.request_url(Method::GET, &url));
            let response = self.http.send_idempotent(build).await.map_err(op_error)?;
            let listing: DirectoryView = self.http.json(response).await.map_err(op_error)?;
            listing.entries().ok_or_else(|| {
                OpError::new(
                    crate::providers::OpErrorKind::Invalid,
                    format!("{path} is not a directory"),
                )
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
            let mut request = self
                .data(instance_id, Method::DELETE, &filesystem_path(path)?)
                .await?;
            if recursive {
                request = request.query(&[("recursive", "true")]);
            }
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
        // Blaxel makes missing parents whatever is asked: `parents: false` cannot be kept.
        let _ = parents;
        Box::pin(async move {
            let request = self
                .data(instance_id, Method::PUT, &filesystem_path(path)?)
                .await?
                .json(&json!({"isDirectory": true, "permissions": "0755"}));
            self.http.send(request).await.map_err(op_error)?;
            Ok(())
        })
    }
}

impl Blaxel {
    /// One page of `GET /sandboxes`, from `cursor`.
    async fn sandbox_page(&self, cursor: Option<&str>) -> Result<SandboxList, HttpFailure> {
        let build = || {
            let mut query = vec![("limit", "100".to_string())];
            if let Some(cursor) = cursor {
                query.push(("cursor", cursor.to_string()));
            }
            self.api(Method::GET, "/sandboxes").query(&query)
        };
        let response = self.http.send_idempotent(build).await?;
        let page: SandboxList = self.http.json(response).await?;
        for sandbox in &page.data {
            self.remember(sandbox);
        }
        Ok(page)
    }
}
