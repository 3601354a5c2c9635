//! The bridge's JSON (`deploy/cloudflare/src/api.ts`: `SandboxInfo`, `ListSandboxesResponse`,
//! `ExecStreamEvent`), read leniently, and what a sandbox's state means to sandgate.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::providers::hosted::tags::tags_of;
use crate::providers::{Instance, InstanceState};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SandboxInfo {
    pub(super) id: String,
    pub(super) state: String,
    #[serde(default)]
    pub(super) labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct SandboxList {
    #[serde(default)]
    pub(super) sandboxes: Vec<SandboxInfo>,
}

pub(super) fn instance_of(info: &SandboxInfo) -> Instance {
    Instance {
        id: info.id.clone(),
        tags: tags_of(Some(&info.labels)),
        state: state_of(&info.state),
    }
}

/// A sandbox that went to sleep (`stopped`) wakes on its next request: it is live.
pub(super) fn state_of(state: &str) -> InstanceState {
    match state {
        "running" | "stopped" => InstanceState::Running,
        "failed" => InstanceState::Failed,
        _ => InstanceState::Starting,
    }
}

/// One exec event (`ExecStreamEvent`).
#[derive(Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub(super) enum StreamEvent {
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    #[serde(rename_all = "camelCase")]
    Exit {
        exit_code: i64,
    },
    Error {
        message: String,
    },
}
