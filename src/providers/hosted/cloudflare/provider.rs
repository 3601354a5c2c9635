//! The [`Provider`] implementation for Cloudflare: the coordinator's calls (create, get, list
//! by tag, delete, adopt) and the sandbox operations (exec, files) over the bridge's API, as
//! the module docs of `cloudflare` describe.

use std::sync::Arc;

use reqwest::Method;
use serde_json::Value;
use tokio::sync::mpsc;

use super::exec::{exec_body, follow, run, start};
use super::wire::{instance_of, SandboxInfo, SandboxList};
use super::{file_path, lockdown, op_error, provider_error, Cloudflare, CA_DIR, CA_PATH, ERRORS};
use crate::ops::{ExecSpec, ExecStream};
use crate::providers::hosted::errors::failed_before_running;
use crate::providers::hosted::http::{absent_ok, path_segment};
use crate::providers::hosted::lockdown::ca_not_installed;
use crate::providers::hosted::tags::TagFilter;
use crate::providers::{
    BoxFuture, CreateSpec, Instance, InstanceState, OpError, OpErrorKind, Provider, ProviderError,
    RemoteEgress, RuntimeCapabilities,
};

impl Cloudflare {
    async fn install_ca(&self, id: &str, egress: &RemoteEgress) -> Result<(), OpError> {
        let (code, stderr) = run(&self.http, id, &["mkdir", "-p", CA_DIR]).await?;
        if code != Some(0) {
            return Err(OpError::new(
                OpErrorKind::Provider,
                format!("creating {CA_DIR} exited with {code:?}: {}", stderr.trim()),
            ));
        }
        self.put_file(id, CA_PATH, egress.ca_pem.clone().into_bytes())
            .await
    }

    async fn put_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), OpError> {
        let url = file_path(id, path)?;
        let data = bytes::Bytes::from(data);
        // A write of the same bytes is idempotent: retried on transient failures.
        self.http
            .send_idempotent(|| {
                self.http
                    .request(Method::PUT, &url)
                    .header("Content-Type", "application/octet-stream")
                    .body(data.clone())
            })
            .await
            .map_err(op_error)?;
        Ok(())
    }
}

impl Provider for Cloudflare {
    fn kind(&self) -> &'static str {
        "cloudflare"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            let body = self.create_body(&spec);
            let request = self
                .http
                .request(Method::POST, "/v1/sandbox")
                .timeout(self.account.create_timeout)
                .json(&body);
            let response = self
                .http
                .send(request)
                .await
                .map_err(|f| ERRORS.create_error(f))?;
            let created: SandboxInfo = self
                .http
                .json(response)
                .await
                .map_err(|f| ERRORS.unreadable_create(f))?;
            let id = created.id;
            if created.state != "running" {
                return Err(failed_before_running(
                    &id,
                    format!("cloudflare sandbox {id} answered {}", created.state),
                ));
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
            let path = format!("/v1/sandbox/{}", path_segment(instance_id));
            let info: Option<SandboxInfo> = self
                .http
                .read_optional(|| self.http.request(Method::GET, &path))
                .await
                .map_err(provider_error)?;
            Ok(info.map(|i| instance_of(&i)))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            let filter = TagFilter::new(sandbox_id, attempt_id);
            let query: Vec<(&str, String)> = filter
                .pairs()
                .into_iter()
                .map(|(k, v)| ("label", format!("{k}={v}")))
                .collect();
            let response = self
                .http
                .send_idempotent(|| self.http.request(Method::GET, "/v1/sandbox").query(&query))
                .await
                .map_err(provider_error)?;
            let list: SandboxList = self.http.json(response).await.map_err(provider_error)?;
            // The bridge filters by label; filtered again so a bridge that ignored the query
            // cannot hand reconciliation another sandbox's instance.
            Ok(list
                .sandboxes
                .iter()
                .map(instance_of)
                .filter(|i| i.state != InstanceState::Failed && filter.matches(&i.tags))
                .collect())
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let path = format!("/v1/sandbox/{}", path_segment(instance_id));
            let result = self
                .http
                .send_idempotent(|| self.http.request(Method::DELETE, &path))
                .await;
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

    fn adopt<'a>(
        &'a self,
        instance_id: &'a str,
        egress: Option<&'a RemoteEgress>,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let Some(egress) = egress else {
                return Ok(());
            };
            // The CA's directory may not exist yet: the default write would fail.
            self.install_ca(instance_id, egress)
                .await
                .map_err(|e| crate::providers::adoption_failed(&e))
        })
    }

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            // A listing by a label no sandbox carries: authenticated, harmless.
            let build = || {
                self.http
                    .request(Method::GET, "/v1/sandbox")
                    .query(&[("label", "sandgate_check=1")])
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
        Box::pin(async move {
            let body = exec_body(&spec)?;
            let response = start(&self.http, instance_id, &body).await?;
            let (tx, rx) = mpsc::channel(64);
            let task = tokio::spawn(follow(response, spec.timeout, tx));
            // Cancel drops the stream; the bridge's SDK call ends with it or at its timeout.
            let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(move || task.abort());
            Ok(ExecStream { events: rx, cancel })
        })
    }

    fn read_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, OpError>> {
        Box::pin(async move {
            let url = file_path(instance_id, path)?;
            let response = self
                .http
                .send_idempotent(|| self.http.request(Method::GET, &url))
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
        Box::pin(async move { self.put_file(instance_id, path, data).await })
    }
}
