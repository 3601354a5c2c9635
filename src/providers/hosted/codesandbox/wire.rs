//! CodeSandbox's JSON (the `{data, errors, success}` envelope, sandboxes, forks, starts), read
//! leniently, and what a sandbox means to sandgate.

use serde::Deserialize;

use crate::providers::hosted::tags::tags_of;
use crate::providers::{Instance, InstanceState};

/// Every answer: `{data, errors, success}`.
#[derive(Debug, Deserialize)]
pub(super) struct Envelope<T> {
    pub(super) data: Option<T>,
}

/// `POST /sandbox/{id}/fork`'s `data`.
#[derive(Debug, Deserialize)]
pub(super) struct Forked {
    pub(super) id: String,
}

/// `POST /vm/{id}/start`'s `data` (the pitcher URL and token are not kept: this adapter
/// does not speak the VM's agent).
#[derive(Debug, Deserialize)]
pub(super) struct Started {
    #[serde(default)]
    pub(super) bootup_type: String,
}

/// A sandbox (`GET /sandbox/{id}`, `GET /sandbox`).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct SandboxView {
    pub(super) id: String,
    #[serde(default)]
    pub(super) tags: Vec<String>,
}

/// `GET /sandbox`'s `data`.
#[derive(Debug, Deserialize)]
pub(super) struct SandboxPage {
    #[serde(default)]
    pub(super) sandboxes: Vec<SandboxView>,
    #[serde(default)]
    pub(super) pagination: Pagination,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Pagination {
    #[serde(default)]
    pub(super) next_page: Option<u64>,
}

pub(super) fn instance_of(view: &SandboxView) -> Instance {
    // Tags are plain strings; sandgate's are `key=value`, anything else is not one of them.
    let map = view
        .tags
        .iter()
        .filter_map(|t| t.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Instance {
        id: view.id.clone(),
        tags: tags_of(Some(&map)),
        // A sandbox exists until deleted; a hibernated VM wakes on `start`.
        state: InstanceState::Running,
    }
}
