//! Northflank's JSON (a service, a page of services), read leniently, and what a service's
//! status means to sandgate. Every answer is the envelope `{data, pagination?}`.

use serde::Deserialize;

use super::tags_of_description;
use crate::providers::{Instance, InstanceState};

/// `{data: T}`: how every Northflank answer carries its payload.
#[derive(Debug, Deserialize)]
pub(super) struct Envelope<T> {
    pub(super) data: T,
    #[serde(default)]
    pub(super) pagination: Option<Pagination>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Pagination {
    #[serde(default)]
    pub(super) has_next_page: bool,
    #[serde(default)]
    pub(super) cursor: Option<String>,
}

/// A service as `GET /services/{id}`, the create and the list answer it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ServiceView {
    pub(super) id: String,
    #[serde(default)]
    pub(super) description: Option<String>,
    #[serde(default)]
    pub(super) status: Option<StatusView>,
    /// Only `GET /services/{id}` says it; absent elsewhere.
    #[serde(default)]
    pub(super) service_paused: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct StatusView {
    #[serde(default)]
    pub(super) deployment: Option<DeploymentStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct DeploymentStatus {
    /// `PENDING` | `IN_PROGRESS` | `COMPLETED` | `FAILED`.
    #[serde(default)]
    pub(super) status: String,
}

/// `GET /services`: `{services: [...]}`.
#[derive(Debug, Deserialize)]
pub(super) struct ServiceList {
    #[serde(default)]
    pub(super) services: Vec<ServiceView>,
}

impl ServiceView {
    /// The deployment's status (`PENDING` until Northflank reports one).
    pub(super) fn deployment(&self) -> &str {
        self.status
            .as_ref()
            .and_then(|s| s.deployment.as_ref())
            .map(|d| d.status.as_str())
            .unwrap_or("PENDING")
    }

    pub(super) fn failed(&self) -> bool {
        self.deployment() == "FAILED"
    }

    /// Deployed and not paused: the service runs its one instance.
    pub(super) fn running(&self) -> bool {
        self.deployment() == "COMPLETED" && self.service_paused != Some(true)
    }
}

/// The instance a service is, as the coordinator sees it. A paused service is still the
/// sandbox's instance (it resumes), so it is `Running` in that sense.
pub(super) fn instance_of(view: &ServiceView) -> Instance {
    let state = match view.deployment() {
        "FAILED" => InstanceState::Failed,
        "COMPLETED" => InstanceState::Running,
        _ if view.service_paused == Some(true) => InstanceState::Running,
        _ => InstanceState::Starting,
    };
    Instance {
        id: view.id.clone(),
        tags: tags_of_description(view.description.as_deref()),
        state,
    }
}
