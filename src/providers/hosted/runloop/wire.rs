//! Runloop's JSON (devboxes, listings, network policies, executions), read leniently, and
//! what a devbox's status means to sandgate.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::providers::hosted::tags::tags_of;
use crate::providers::{Instance, InstanceState};

#[derive(Debug, Deserialize)]
pub(super) struct DevboxView {
    pub(super) id: String,
    pub(super) status: String,
    #[serde(default)]
    pub(super) metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) failure_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct DevboxList {
    #[serde(default)]
    pub(super) devboxes: Vec<DevboxView>,
    #[serde(default)]
    pub(super) has_more: bool,
}

#[derive(Debug, Deserialize)]
pub(super) struct PolicyList {
    #[serde(default)]
    pub(super) network_policies: Vec<Value>,
    #[serde(default)]
    pub(super) has_more: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct ExecutionView {
    pub(super) execution_id: String,
    pub(super) status: String,
    #[serde(default)]
    pub(super) exit_status: Option<i64>,
    #[serde(default)]
    pub(super) stdout: Option<String>,
    #[serde(default)]
    pub(super) stderr: Option<String>,
}

pub(super) fn instance_of(view: &DevboxView) -> Instance {
    Instance {
        id: view.id.clone(),
        tags: tags_of(Some(&view.metadata)),
        state: match view.status.as_str() {
            // Suspended devboxes exist and can resume: live.
            "running" | "suspending" | "suspended" | "resuming" => InstanceState::Running,
            "failure" | "shutdown" => InstanceState::Failed,
            _ => InstanceState::Starting,
        },
    }
}
