//! Freestyle's JSON (VMs, listings, exec results, files), read leniently, and what a VM's
//! state means to sandgate.

use base64::Engine;
use serde::Deserialize;

use crate::ops::SandboxEntry;
use crate::providers::{InstanceState, OpError, OpErrorKind};

/// `GET /v1/vms/{id}` and one entry of `GET /v1/vms`.
#[derive(Debug, Deserialize)]
pub(super) struct VmView {
    pub(super) id: String,
    /// `starting`, `running`, `suspending`, `suspended` or `stopped`.
    pub(super) state: String,
    #[serde(default)]
    pub(super) deleted: Option<bool>,
}

impl VmView {
    /// A VM that exists is live, whatever its state: a suspended or stopped VM starts again.
    pub(super) fn instance_state(&self) -> InstanceState {
        match self.state.as_str() {
            "starting" => InstanceState::Starting,
            _ => InstanceState::Running,
        }
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct VmList {
    #[serde(default)]
    pub(super) vms: Vec<VmView>,
}

/// `POST /v1/vms` (`{id, domains, consoleUrl, snapshotId}`).
#[derive(Debug, Deserialize)]
pub(super) struct Created {
    pub(super) id: String,
}

/// `POST /v1/vms/{id}/exec-await`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ExecView {
    #[serde(default)]
    pub(super) stdout: Option<String>,
    #[serde(default)]
    pub(super) stderr: Option<String>,
    #[serde(default)]
    pub(super) status_code: Option<i64>,
}

/// `GET /v1/vms/{id}/files/{path}`: a file or a directory.
#[derive(Debug, Deserialize)]
pub(super) struct FileView {
    #[serde(default)]
    pub(super) content: Option<String>,
    #[serde(default)]
    pub(super) encoding: Option<String>,
    #[serde(default)]
    pub(super) files: Option<Vec<DirEntry>>,
}

#[derive(Debug, Deserialize)]
pub(super) struct DirEntry {
    pub(super) name: String,
    pub(super) kind: String,
}

impl FileView {
    /// A file's bytes (`base64` decoded; anything else is text, as the SDK reads it).
    pub(super) fn bytes(&self) -> Result<Vec<u8>, OpError> {
        let Some(content) = &self.content else {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                "the path is a directory",
            ));
        };
        if self.encoding.as_deref() == Some("base64") {
            return base64::engine::general_purpose::STANDARD
                .decode(content)
                .map_err(|e| {
                    OpError::new(
                        OpErrorKind::Provider,
                        format!("freestyle answered a file that is not base64: {e}"),
                    )
                });
        }
        Ok(content.clone().into_bytes())
    }

    /// A directory's entries (Freestyle tells name and kind only).
    pub(super) fn entries(&self) -> Option<Vec<SandboxEntry>> {
        let files = self.files.as_ref()?;
        Some(
            files
                .iter()
                .map(|f| SandboxEntry {
                    name: f.name.clone(),
                    kind: if f.kind == "directory" { "dir" } else { "file" },
                    size: 0,
                    mode: 0,
                    modified_unix: 0,
                })
                .collect(),
        )
    }
}
