//! The [`Provider`] implementation for Northflank: the coordinator's calls (create, get, list
//! by tag, delete, check) and pause/resume, each mapped onto the API as the module docs of
//! `northflank` describe. Exec and files keep the trait's `unsupported` answers.

use reqwest::Method;
use serde_json::Value;

use super::wire::{instance_of, Envelope, ServiceList, ServiceView};
use super::{lockdown_refusal, provider_error, Northflank, CA_PATH, ERRORS};
use crate::ops::Lifecycle;
use crate::providers::hosted::errors::failed_before_running;
use crate::providers::hosted::http::HttpFailure;
use crate::providers::hosted::tags::{self, TagFilter};
use crate::providers::{
    BoxFuture, CreateSpec, Instance, InstanceState, OpError, Provider, ProviderError, RemoteEgress,
    RuntimeCapabilities,
};

impl Provider for Northflank {
    fn kind(&self) -> &'static str {
        "northflank"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            if spec.egress.as_ref().is_some_and(|e| e.lock_down) {
                return Err(lockdown_refusal());
            }
            let body = self.create_body(&spec);
            // "Create or update" by name: sent again for the attempt, the same service.
            let path = self.project_path("/services/deployment");
            let request = self.api(Method::PUT, &path).json(&body);
            let response = self
                .http
                .send(request)
                .await
                .map_err(|f| ERRORS.create_error(f))?;
            let created: Envelope<ServiceView> = self
                .http
                .json(response)
                .await
                .map_err(|f| ERRORS.unreadable_create(f))?;
            let id = created.data.id.clone();
            // The create's answer has no deployment status yet: the first look fetches.
            if let Err((failure, message)) = self.await_running(&id, None).await {
                let mut error = match failure {
                    Some(f) => {
                        let mut e = provider_error(f);
                        e.instance_id = Some(id.clone());
                        e
                    }
                    None => failed_before_running(&id, message.clone()),
                };
                error.message = format!("northflank service did not deploy: {message}");
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
            let view = self.view(instance_id).await.map_err(provider_error)?;
            Ok(view.map(|v| instance_of(&v)))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            // Northflank's list has no filter: every page is read, filtered here.
            let filter = TagFilter::new(sandbox_id, attempt_id);
            tags::list(filter, 200, move |cursor| async move {
                let (services, next) = self.service_page(cursor.as_deref()).await?;
                let live = services
                    .iter()
                    .filter(|s| !s.failed())
                    .map(instance_of)
                    .collect();
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

    fn adopt<'a>(
        &'a self,
        _instance_id: &'a str,
        _egress: Option<&'a RemoteEgress>,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        // The CA went in with the create (`runtimeFiles`): an adopted service has it already.
        Box::pin(async { Ok(()) })
    }

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            let path = self.project_path("");
            self.http
                .send_idempotent(|| self.api(Method::GET, &path))
                .await
                .map_err(provider_error)?;
            Ok(format!(
                "read project {} at {}",
                self.account.project,
                self.http.base_url()
            ))
        })
    }

    fn lifecycle<'a>(
        &'a self,
        instance_id: &'a str,
        operation: Lifecycle,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            match operation {
                Lifecycle::Pause => self.set_paused(instance_id, true).await,
                Lifecycle::Resume => self.set_paused(instance_id, false).await,
                other => Err(OpError::unsupported(self.kind(), other.as_str())),
            }
        })
    }
}

impl Northflank {
    /// One page of `GET /services`, from `cursor`: the services and the next cursor.
    async fn service_page(
        &self,
        cursor: Option<&str>,
    ) -> Result<(Vec<ServiceView>, Option<String>), HttpFailure> {
        let path = self.project_path("/services");
        let build = || {
            let mut query = vec![("per_page", "100".to_string())];
            if let Some(cursor) = cursor {
                query.push(("cursor", cursor.to_string()));
            }
            self.api(Method::GET, &path).query(&query)
        };
        let response = self.http.send_idempotent(build).await?;
        let page: Envelope<ServiceList> = self.http.json(response).await?;
        let next = page
            .pagination
            .filter(|p| p.has_next_page)
            .and_then(|p| p.cursor);
        Ok((page.data.services, next))
    }
}
