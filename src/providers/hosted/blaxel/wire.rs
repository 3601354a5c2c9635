//! Blaxel's JSON (sandboxes, listings, processes), read leniently, and what a sandbox's
//! status means to sandgate.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::providers::hosted::tags::tags_of;
use crate::providers::{Instance, InstanceState};

#[derive(Debug, Clone, Deserialize)]
pub(super) struct SandboxView {
    pub(super) metadata: MetadataView,
    #[serde(default)]
    pub(super) status: String,
    /// Infrastructure failures (`fatal` ones moved the sandbox to `FAILED`).
    #[serde(default)]
    pub(super) errors: Vec<Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct MetadataView {
    pub(super) name: String,
    #[serde(default)]
    pub(super) labels: BTreeMap<String, Value>,
    #[serde(default)]
    pub(super) url: Option<String>,
}

impl SandboxView {
    /// The first recorded failure's message, as ` (message)`, or nothing.
    pub(super) fn why(&self) -> String {
        self.errors
            .iter()
            .find_map(|e| e.get("message").and_then(Value::as_str))
            .map(|m| format!(" ({})", m.chars().take(200).collect::<String>()))
            .unwrap_or_default()
    }

    /// A sandbox that no longer exists for sandgate's purposes.
    pub(super) fn gone(&self) -> bool {
        matches!(self.status.as_str(), "DELETING" | "TERMINATED")
    }

    /// A sandbox reconciliation should not count as live.
    pub(super) fn dead(&self) -> bool {
        self.gone() || self.status == "FAILED"
    }
}

/// `GET /sandboxes` with `Blaxel-Version`: `{data, meta}`.
#[derive(Debug, Deserialize)]
pub(super) struct SandboxList {
    #[serde(default)]
    pub(super) data: Vec<SandboxView>,
    #[serde(default)]
    pub(super) meta: PageMeta,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PageMeta {
    #[serde(default)]
    pub(super) has_more: bool,
    #[serde(default)]
    pub(super) next_cursor: Option<String>,
}

/// A process as the sandbox API answers it (`ProcessResponse`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ProcessView {
    #[serde(default)]
    pub(super) status: String,
    #[serde(default)]
    pub(super) exit_code: Option<i64>,
    #[serde(default)]
    pub(super) stdout: Option<String>,
    #[serde(default)]
    pub(super) stderr: Option<String>,
}

pub(super) fn instance_of(view: &SandboxView) -> Instance {
    // Labels are strings on Blaxel; anything else is not one of sandgate's tags.
    let labels: BTreeMap<String, String> = view
        .metadata
        .labels
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect();
    Instance {
        id: view.metadata.name.clone(),
        tags: tags_of(Some(&labels)),
        state: match view.status.as_str() {
            // Blaxel wakes a sandbox on standby by itself: deployed is running.
            "DEPLOYED" => InstanceState::Running,
            "FAILED" | "DELETING" | "TERMINATED" | "DEACTIVATED" | "DEACTIVATING" => {
                InstanceState::Failed
            }
            _ => InstanceState::Starting,
        },
    }
}

/// `GET /filesystem/{dir}` (`Directory`); a file answers without `files`.
#[derive(Debug, Deserialize)]
pub(super) struct DirectoryView {
    pub(super) files: Option<Vec<FileView>>,
    #[serde(default)]
    pub(super) subdirectories: Vec<SubdirView>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct FileView {
    pub(super) name: String,
    #[serde(default)]
    pub(super) size: u64,
    #[serde(default)]
    pub(super) permissions: String,
    #[serde(default)]
    pub(super) last_modified: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct SubdirView {
    pub(super) name: String,
}

impl DirectoryView {
    /// The entries, directories first; `None` when the path is not a directory.
    pub(super) fn entries(self) -> Option<Vec<crate::ops::SandboxEntry>> {
        let files = self.files?;
        let dirs = self
            .subdirectories
            .into_iter()
            .map(|d| crate::ops::SandboxEntry {
                name: d.name,
                kind: "dir",
                size: 0,
                mode: 0,
                modified_unix: 0,
            });
        let files = files.into_iter().map(|f| crate::ops::SandboxEntry {
            name: f.name,
            kind: "file",
            size: f.size,
            // An octal string such as "0644"; anything else is not guessed at.
            mode: u32::from_str_radix(f.permissions.trim(), 8).unwrap_or(0),
            modified_unix: httpdate::parse_http_date(&f.last_modified)
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0),
        });
        Some(dirs.chain(files).collect())
    }
}
